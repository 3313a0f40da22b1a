/*
 * Saving a checkpoint (docs/checkpoints.md "Commit protocol"), the protocol: the ranks agree
 * after each phase; every rank writes its shard into a temporary directory and rank 0 commits
 * it only when every rank succeeded, or every rank stages a copy and a writer does the same in
 * the background (ckpt_async.c). The steps on disk are ckpt_files.c's.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"
#include "obs/testpoint.h"
#include "zs/time.h"
#include "zs/version.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static zs_status_t zd_ckpt_tag(const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req, char *tag,
                               char *err, size_t errlen)
{
    if (req->tag != NULL && req->tag[0] != '\0') {
        snprintf(tag, ZS_CKPT_TAG_MAX, "%s", req->tag);
        return zs_ckpt_tag_check(req->tag, err, errlen);
    }
    snprintf(tag, ZS_CKPT_TAG_MAX, "global_step%" PRIu64, sh->step);
    return ZS_OK;
}

static void zd_ckpt_save_out(const zd_ckpt_shard_t *sh, const char *dir, const char *tag,
                             bool has_state, zd_ckpt_out_t *out)
{
    zs_ckpt_pathf(out->path, sizeof(out->path), "%s/%s", dir, tag);
    zs_ckpt_pathf(out->tag, sizeof(out->tag), "%s", tag);
    out->step = sh->step;
    out->loss_scale = sh->scaler.cur_scale;
    out->saved_world = sh->world;
    out->has_trainer_state = has_state;
}

/* This rank's file, written before the save replies: from the shard itself on the CPU, from a
 * host copy of it on the GPU. */
static zs_status_t zd_ckpt_write_synced(const zd_ckpt_shard_t *sh, const zs_dir_t *tmp,
                                        uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                                        size_t errlen)
{
    size_t n = (size_t)sh->layout->shard_numel;
    float *stage;
    zs_status_t st;

    if (zd_backend_device(sh->be) < 0) {
        return zd_ckpt_write_rank(sh, NULL, sh->step, tmp, bytes_p, xxh3_p, err, errlen);
    }
    stage = malloc((3 * n + 1) * sizeof(float));
    if (stage == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                       "checkpoint save: no host memory to copy %zu bytes of device shard state",
                       3 * n * sizeof(float));
    }
    st = zd_ckpt_stage_copy(sh, stage);
    if (st != ZS_OK) {
        st = zs_errf(err, errlen, st, "checkpoint save: %s", zd_backend_error(sh->be));
    } else {
        st = zd_ckpt_write_rank(sh, stage, sh->step, tmp, bytes_p, xxh3_p, err, errlen);
    }
    free(stage);
    return st;
}

/* The synchronous save from phase 2 on: every rank writes, rank 0 commits. */
static zs_status_t zd_ckpt_save_synced(const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                       const zs_dir_t *dir, const char *tag, const zs_dir_t *tmp,
                                       char *err, size_t errlen)
{
    zs_ckpt_file_t *files = calloc(sh->world, sizeof(*files));
    uint64_t bytes = 0, xxh3 = 0;
    zd_ckpt_state_sums_t sums;
    zs_status_t st =
        files != NULL ? ZS_OK : zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");

    if (st == ZS_OK) {
        st = zd_ckpt_write_synced(sh, tmp, &bytes, &xxh3, err, errlen);
    }
    memset(&sums, 0, sizeof(sums));
    if (st == ZS_OK && sh->rank == 0) {
        st = zd_ckpt_write_state(tmp, req->trainer_state, req->trainer_state_len, &sums, err,
                                 errlen);
    }
    zd_test_pause("ckpt", sh->job_id, sh->step);
    st = zd_ckpt_agree(sh, st, "checkpoint save (writing the shards)", err, errlen);
    if (st == ZS_OK) {
        st = zd_ckpt_gather_sums(sh, bytes, xxh3, files, err, errlen);
    }
    if (st == ZS_OK && sh->rank == 0) {
        zs_ckpt_manifest_t m;
        memset(&m, 0, sizeof(m));
        st = zd_ckpt_manifest_head(sh, tag, &m);
        if (st == ZS_OK) {
            st = zd_ckpt_manifest_finish(&m, tmp, files, &sums, err, errlen);
        } else {
            st = zs_errf(err, errlen, st, "out of memory for the manifest");
        }
        zd_ckpt_manifest_release(&m);
        zd_test_pause("ckpt", sh->job_id, sh->step);
        if (st == ZS_OK) {
            st = zd_ckpt_commit(sh->job_id, sh->step, req->latest_onward, dir, tag, tmp, err,
                                errlen);
        }
        if (st == ZS_OK) {
            zd_ckpt_prune(dir, sh->job_id, tag, req->keep_last);
        }
    }
    free(files);
    return zd_ckpt_agree(sh, st, "checkpoint save (committing)", err, errlen);
}

/* Every rank saves under rank 0's tag: one of its own (DeepSpeed's tutorial tags a save with
 * the rank's loss) would send its file where rank 0 never looks. Every rank learns rank 0's tag
 * and directory (dir0, ZD_CKPT_DIR_MAX + 1 bytes, for messages), and the ranks agree. */
static zs_status_t zd_ckpt_same_tag(const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                    const char *tag, char *dir0, char *err, size_t errlen)
{
    const char *what = "checkpoint save (agreeing on the tag)";
    char tag0[ZS_CKPT_TAG_MAX], why[ZS_MSG_MAX] = "";
    zs_status_t st = zd_ckpt_share_text(sh, 0, 0, tag, ZS_CKPT_TAG_MAX - 1, NULL, tag0,
                                        sizeof(tag0), why, sizeof(why));

    if (st == ZS_OK) {
        st = zd_ckpt_share_text(sh, 0, 0, req->dir != NULL ? req->dir : "", ZD_CKPT_DIR_MAX, NULL,
                                dir0, ZD_CKPT_DIR_MAX + 1, why, sizeof(why));
    }
    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "%s: %s", what, why);
    }
    if (strcmp(tag0, tag) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_INVALID,
                     "the ranks save under different tags: rank 0 '%s', rank %u '%s'; zerod "
                     "commits a checkpoint under one tag, so every rank must pass the same one "
                     "(DeepSpeed's checkpoint.tag_validation Warn or Ignore cannot let them "
                     "differ here)",
                     tag0, sh->rank, tag);
    }
    return zd_ckpt_agree(sh, st, what, err, errlen);
}

/* A rank that does not find the temporary directory rank 0 has just made: its directory is not
 * rank 0's (another path, or the same path on a host that does not share it). */
static zs_status_t zd_ckpt_not_shared(const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                      const char *dir0, const char *tname, char *err, size_t errlen)
{
    const char *mine = req->dir != NULL ? req->dir : "";
    const char *fix = "every rank must save into one directory that every rank's host shares "
                      "(node-local checkpoint directories are not supported)";

    if (strcmp(mine, dir0) != 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "rank %u saves into %s, rank 0 into %s, and they are not one directory "
                       "(rank %u's has no %s, which rank 0 has just made in its own): %s",
                       sh->rank, mine, dir0, sh->rank, tname, fix);
    }
    return zs_errf(err, errlen, ZS_ERR_INVALID,
                   "rank %u's %s is not the directory rank 0 saves into at that path (it has no "
                   "%s, which rank 0 has just made there): rank %u's host does not share rank 0's "
                   "filesystem there; %s",
                   sh->rank, mine, tname, sh->rank, fix);
}

/* Every rank opens dir, agrees on the tag, and opens the temporary directory rank 0 made
 * there for this save (its name in tname, ZD_CKPT_TMP_NAME_MAX bytes). */
static zs_status_t zd_ckpt_save_dirs(const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                     zs_dir_t *dir, char *tag, zs_dir_t *tmp, char *tname,
                                     char *err, size_t errlen)
{
    char *dir0 = malloc(ZD_CKPT_DIR_MAX + 1);
    zs_status_t st = dir0 != NULL ? ZS_OK : zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");

    if (st == ZS_OK) {
        st = zd_ckpt_open_dir(req, ZS_MAY_READ | ZS_MAY_WRITE | ZS_MAY_EXEC, dir, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_tag(sh, req, tag, err, errlen);
    }
    st = zd_ckpt_agree(sh, st, "checkpoint save (opening the directory)", err, errlen);
    if (st == ZS_OK) {
        st = zd_ckpt_same_tag(sh, req, tag, dir0, err, errlen);
    }
    if (st == ZS_OK) {
        if (sh->rank == 0) {
            st = zd_ckpt_prepare(dir, tag, tmp, err, errlen);
        }
        st = zd_ckpt_agree(sh, st, "checkpoint save (preparing the directory)", err, errlen);
    }
    zd_ckpt_tmp_name(st == ZS_OK ? tag : "", tname, ZD_CKPT_TMP_NAME_MAX);
    if (st == ZS_OK) { /* rank 0 made it: every rank writes into it */
        if (sh->rank != 0) {
            st = zs_dir_sub(dir, tname, ZS_MAY_WRITE | ZS_MAY_EXEC, tmp, err, errlen);
            if (st == ZS_ERR_NOT_FOUND) {
                st = zd_ckpt_not_shared(sh, req, dir0, tname, err, errlen);
            }
        }
        st = zd_ckpt_agree(sh, st, "checkpoint save (opening the directory)", err, errlen);
    }
    free(dir0);
    return st;
}

static zs_status_t zd_ckpt_save_run(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh,
                                    const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                                    size_t errlen)
{
    char tag[ZS_CKPT_TAG_MAX], tname[ZD_CKPT_TMP_NAME_MAX];
    zs_dir_t dir = ZS_DIR_INIT, tmp = ZS_DIR_INIT;
    bool has_state = sh->rank == 0 && req->trainer_state != NULL;
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st;

    zd_ckpt_settle(ck); /* a save still writing finishes first */
    if (sh->coll == NULL) {
        return zs_errf(err, errlen, ZS_ERR_PEER_LOST, "checkpoint save: the mesh is down");
    }
    st = zd_ckpt_number(ck, sh, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    st = zd_ckpt_save_dirs(sh, req, &dir, tag, &tmp, tname, err, errlen);
    if (st != ZS_OK) {
        goto out;
    }
    zd_test_pause("ckpt", sh->job_id, sh->step);
    if (req->async) { /* a staging copy on every rank, written in the background */
        st = zd_ckpt_async_start(ck, sh, req, tag, &dir, &tmp, err, errlen);
        st = zd_ckpt_agree(sh, st, "checkpoint save (staging a copy)", err, errlen);
        if (st == ZS_OK) {
            zd_ckpt_async_release(ck); /* every rank staged: the writers go */
            zd_ckpt_save_out(sh, req->dir, tag, has_state, out);
            zs_info(ZS_SUB_ENGINE, "checkpoint %s staged at step %" PRIu64 " in %.3f s; writing",
                    out->path, sh->step, (double)(zs_time_now_ns() - t0) * 1e-9);
            goto out;
        }
        zd_ckpt_async_cancel(ck); /* nothing written yet: the synchronous way, on every rank */
        if (st == ZS_ERR_PEER_LOST) {
            goto out;
        }
        zs_warn(ZS_SUB_ENGINE, "checkpoint: no staging copy (%s); writing it before replying", err);
    }
    st = zd_ckpt_save_synced(sh, req, &dir, tag, &tmp, err, errlen);
    if (st != ZS_OK && sh->rank == 0) { /* every rank is past its writes: what they left goes */
        char why[ZS_MSG_MAX];
        (void)zs_ckpt_remove(&dir, tname, why, sizeof(why));
    }
    if (st == ZS_OK) {
        zd_ckpt_save_out(sh, req->dir, tag, has_state, out);
        zs_info(ZS_SUB_ENGINE, "checkpoint %s saved at step %" PRIu64 " (%.3f s)", out->path,
                sh->step, (double)(zs_time_now_ns() - t0) * 1e-9);
    }
out:
    zs_dir_close(&tmp);
    zs_dir_close(&dir);
    return st;
}

/* A save, a span of the step trace (obs/trace.h) whatever its outcome. */
zs_status_t zd_ckpt_save(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                         zd_ckpt_out_t *out, char *err, size_t errlen)
{
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st = zd_ckpt_save_run(ck, sh, req, out, err, errlen);

    zd_trace_span(sh->trace, ZD_TRACE_CHECKPOINT, sh->step, t0, zs_time_now_ns(),
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    return st;
}
