/*
 * Asynchronous checkpoint saves (docs/checkpoints.md): the runner thread copies this rank's
 * shard (master, m, v) into a staging buffer and replies; a writer thread writes the copy and
 * reports how it went to every rank at once over the mesh's heartbeat endpoints (mesh/heartbeat.h);
 * rank 0's writer waits for every rank's report (or the first failure), then writes the manifest
 * and commits by rename, exactly as a synchronous save does. The writer touches nothing of the job
 * that changes (the layout, names and id are fixed while the job lives), and the job does not go
 * before its writer is done.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"
#include "mesh/heartbeat.h"
#include "obs/testpoint.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long rank 0's writer waits for the other ranks' reports after its own file. */
#define ZD_CKPT_ASYNC_WAIT_NS (300ull * 1000000000ull)

struct zd_ckpt_async {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool go;            /* under lock */
    atomic_bool cancel; /* the save is called off (before go), or the job ends */
    zd_ckpt_shard_t sh; /* its names, layout and identity: fixed while the job lives (the job
                         * settles this writer before it frees or changes them) */
    zd_heartbeat_t *hb; /* the ranks' reports go over the mesh's heartbeat (world > 1) */
    float *stage;       /* master, m, v: 3 x shard_numel (mmap'd) */
    size_t stage_bytes;
    bool keep;   /* checkpoint_staging_keep: the copy's memory goes back to the job, not away */
    bool onward; /* zd_ckpt_req_t.latest_onward */
    void *state; /* rank 0: the trainer's bytes */
    size_t state_len;
    bool has_state;
    zs_ckpt_manifest_t head; /* rank 0: the manifest as of the save */
    zs_cred_t cred;          /* whose rights dir and tmp use (the requester's) */
    bool has_cred;
    zs_dir_t dir, tmp; /* the checkpoint directory and the save's temporary one */
    char tag[ZS_CKPT_TAG_MAX];
    uint32_t rank, world, keep_last;
    uint64_t step, seq, t0;
    zs_status_t result; /* the writer's, read after the join */
    char err[ZS_MSG_MAX];
};

/* Rank 0: every rank's report (files: their sizes and checksums), or the first failure. */
static zs_status_t zd_ckpt_async_gather(zd_ckpt_async_t *a, const zd_ckpt_report_t *mine,
                                        zs_ckpt_file_t *files, char *err, size_t errlen)
{
    zd_ckpt_report_t *reps = calloc(a->world, sizeof(*reps));
    uint32_t failed = 0;
    zs_status_t st;

    if (reps == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    if (a->world == 1) {
        reps[0] = *mine;
        st = ZS_OK;
    } else {
        st = zd_heartbeat_await_reports(a->hb, a->seq, true,
                                        zs_deadline_in_ns(ZD_CKPT_ASYNC_WAIT_NS), &a->cancel, reps,
                                        &failed, err, errlen);
    }
    if (st == ZS_ERR_ABORTED) {
        st = zs_errf(err, errlen, reps[failed].status != 0 ? reps[failed].status : ZS_ERR_IO,
                     "rank %u could not write its shard: %s", failed, reps[failed].why);
    } else if (st != ZS_OK) {
        char why[ZS_MSG_MAX];
        zs_ckpt_pathf(why, sizeof(why), "%s", err);
        st = zs_errf(err, errlen, st, "waiting for the other ranks' shards in %s: %s", a->tmp.shown,
                     why);
    }
    for (uint32_t r = 0; st == ZS_OK && r < a->world; r++) {
        zs_ckpt_rank_file(r, files[r].name, sizeof(files[r].name));
        files[r].rank = (int32_t)r;
        files[r].bytes = reps[r].bytes;
        files[r].xxh3 = reps[r].xxh3;
    }
    free(reps);
    return st;
}

/* Rank 0 after a failure: the others are done writing (or gone) before what they left goes. */
static void zd_ckpt_async_settle(zd_ckpt_async_t *a)
{
    char why[ZS_MSG_MAX];

    if (a->world > 1) {
        zd_ckpt_report_t *reps = calloc(a->world, sizeof(*reps));
        uint32_t failed;
        if (reps != NULL) {
            (void)zd_heartbeat_await_reports(a->hb, a->seq, false,
                                             zs_deadline_in_ns(ZD_CKPT_ASYNC_WAIT_NS), &a->cancel,
                                             reps, &failed, why, sizeof(why));
        }
        free(reps);
    }
    char name[ZD_CKPT_TMP_NAME_MAX];

    zd_ckpt_tmp_name(a->tag, name, sizeof(name));
    (void)zs_ckpt_remove(&a->dir, name, why, sizeof(why));
}

/* Rank 0, its own file written: every rank's, then the manifest and the commit. */
static zs_status_t zd_ckpt_async_commit(zd_ckpt_async_t *a, const zd_ckpt_report_t *mine, char *err,
                                        size_t errlen)
{
    zs_ckpt_file_t *files = calloc(a->world, sizeof(*files));
    zd_ckpt_state_sums_t sums;
    zs_status_t st =
        files != NULL ? ZS_OK : zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");

    if (st == ZS_OK) {
        st = zd_ckpt_write_state(&a->tmp, a->has_state ? a->state : NULL, a->state_len, &sums, err,
                                 errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_async_gather(a, mine, files, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_manifest_finish(&a->head, &a->tmp, files, &sums, err, errlen);
    }
    zd_test_pause("ckpt", a->sh.job_id, a->step);
    if (st == ZS_OK) {
        st =
            zd_ckpt_commit(a->sh.job_id, a->step, a->onward, &a->dir, a->tag, &a->tmp, err, errlen);
    }
    if (st == ZS_OK) {
        zd_ckpt_prune(&a->dir, a->sh.job_id, a->tag, a->keep_last);
    } else {
        zd_ckpt_async_settle(a);
    }
    free(files);
    return st;
}

static void *zd_ckpt_async_main(void *arg)
{
    zd_ckpt_async_t *a = arg;
    zd_ckpt_report_t mine;
    char err[ZS_MSG_MAX] = "";
    zs_status_t st;

    pthread_mutex_lock(&a->lock);
    while (!a->go && !atomic_load(&a->cancel)) {
        pthread_cond_wait(&a->cond, &a->lock);
    }
    if (!a->go) { /* cancelled before any rank wrote */
        pthread_mutex_unlock(&a->lock);
        return NULL;
    }
    pthread_mutex_unlock(&a->lock);
    memset(&mine, 0, sizeof(mine));
    mine.seq = a->seq;
    st = zd_ckpt_write_rank(&a->sh, a->stage, a->step, &a->tmp, &mine.bytes, &mine.xxh3, err,
                            sizeof(err));
    if (!a->keep) { /* the copy is on disk: its memory goes back at once */
        munmap(a->stage, a->stage_bytes);
        a->stage = NULL;
    }
    mine.status = st;
    zs_ckpt_pathf(mine.why, sizeof(mine.why), "%s", st != ZS_OK ? err : "");
    zd_heartbeat_report(a->hb, &mine); /* every rank hears at once, failure or not */
    if (a->rank == 0 && st != ZS_OK) {
        zd_ckpt_async_settle(a);
    } else if (a->rank == 0) {
        st = zd_ckpt_async_commit(a, &mine, err, sizeof(err));
    }
    a->result = st;
    zs_ckpt_pathf(a->err, sizeof(a->err), "%s", err);
    if (st != ZS_OK) {
        zs_error(ZS_SUB_ENGINE, "checkpoint %s/%s of step %" PRIu64 " failed: %s", a->dir.shown,
                 a->tag, a->step, err);
    } else {
        zs_info(ZS_SUB_ENGINE,
                "checkpoint %s/%s of step %" PRIu64 " %s (%.3f s, %" PRIu64 " bytes)", a->dir.shown,
                a->tag, a->step, a->rank == 0 ? "committed" : "written",
                (double)(zs_time_now_ns() - a->t0) * 1e-9, mine.bytes);
    }
    return NULL;
}

static void zd_ckpt_async_free(zd_ckpt_async_t *a)
{
    if (a->stage != NULL) {
        munmap(a->stage, a->stage_bytes);
    }
    free(a->state);
    zd_ckpt_manifest_release(&a->head);
    zs_dir_close(&a->dir);
    zs_dir_close(&a->tmp);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
    free(a);
}

/* The staging copy of this rank's shard. */
static zs_status_t zd_ckpt_async_stage(zd_ckpt_async_t *a, zd_ckpt_t *ck, const zd_ckpt_shard_t *sh)
{
    size_t n = (size_t)sh->layout->shard_numel;

    a->stage_bytes = (3 * n + 1) * sizeof(float);
    if (ck->stage != NULL) { /* kept from the last save: mapped and touched already */
        a->stage = ck->stage;
        ck->stage = NULL;
    } else {
        void *p =
            mmap(NULL, a->stage_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return ZS_ERR_NO_MEMORY;
        }
        (void)madvise(p, a->stage_bytes, MADV_HUGEPAGE); /* fewer faults while copying */
        a->stage = p;
    }
    return zd_ckpt_stage_copy(sh, a->stage);
}

/* A writer for save `ck->seq` of this shard, holding nothing yet. */
static zd_ckpt_async_t *zd_ckpt_async_new(const zd_ckpt_t *ck, const zd_ckpt_shard_t *sh,
                                          const zd_ckpt_req_t *req, const char *tag)
{
    zd_ckpt_async_t *a = calloc(1, sizeof(*a));

    if (a == NULL) {
        return NULL;
    }
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    atomic_init(&a->cancel, false);
    a->sh = *sh;
    a->hb = zd_mesh_heartbeat(sh->mesh);
    a->rank = sh->rank;
    a->world = sh->world;
    a->step = sh->step;
    a->seq = ck->seq;
    a->keep_last = req->keep_last;
    a->keep = req->keep_staging;
    a->onward = req->latest_onward;
    a->t0 = zs_time_now_ns();
    a->dir = a->tmp = (zs_dir_t)ZS_DIR_INIT;
    zs_ckpt_pathf(a->tag, sizeof(a->tag), "%s", tag);
    if (req->cred != NULL) { /* the request goes when the save replies: its cred is copied */
        a->cred = *req->cred;
        a->has_cred = true;
    }
    return a;
}

/* Rank 0's part of the save that the writer finishes: the manifest's head and a copy of the
 * trainer's state (the request goes when the save replies). */
static zs_status_t zd_ckpt_async_head(zd_ckpt_async_t *a, const zd_ckpt_shard_t *sh,
                                      const zd_ckpt_req_t *req, const char *tag, char *err,
                                      size_t errlen)
{
    zs_status_t st = zd_ckpt_manifest_head(sh, tag, &a->head);

    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "cannot describe the checkpoint's files: out of memory");
    }
    a->has_state = req->trainer_state != NULL;
    if (a->has_state) {
        a->state = malloc(req->trainer_state_len ? req->trainer_state_len : 1);
        if (a->state == NULL) {
            return zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                           "a copy of the trainer's state (%zu bytes) does not fit in memory",
                           req->trainer_state_len);
        }
        memcpy(a->state, req->trainer_state, req->trainer_state_len);
        a->state_len = req->trainer_state_len;
    }
    return ZS_OK;
}

zs_status_t zd_ckpt_async_start(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                const char *tag, const zs_dir_t *dir, const zs_dir_t *tmp,
                                char *err, size_t errlen)
{
    zd_ckpt_async_t *a = zd_ckpt_async_new(ck, sh, req, tag);
    zs_status_t st;

    if (a == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    st = zs_dir_dup(dir, &a->dir, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_dup(tmp, &a->tmp, err, errlen);
    }
    a->dir.cred = a->tmp.cred = a->has_cred ? &a->cred : NULL;
    if (st == ZS_OK && a->world > 1 && a->hb == NULL) {
        st = zs_errf(err, errlen, ZS_ERR_PEER_LOST, "the mesh is down");
    }
    if (st == ZS_OK) {
        st = zd_ckpt_async_stage(a, ck, sh);
        if (st != ZS_OK) {
            st = zs_errf(err, errlen, st, "a staging copy of %llu elements: %s",
                         (unsigned long long)(3 * sh->layout->shard_numel),
                         st == ZS_ERR_NO_MEMORY ? "does not fit in memory" : zs_status_string(st));
        }
    }
    if (st == ZS_OK && sh->rank == 0) {
        st = zd_ckpt_async_head(a, sh, req, tag, err, errlen);
    }
    if (st == ZS_OK && zs_thread_start(&a->thread, false, zd_ckpt_async_main, a) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "cannot start the checkpoint writer thread");
    }
    if (st != ZS_OK) {
        zd_ckpt_async_free(a);
        return st;
    }
    ck->async = a;
    return ZS_OK;
}

static void zd_ckpt_async_set(zd_ckpt_async_t *a, bool go)
{
    pthread_mutex_lock(&a->lock);
    if (go) {
        a->go = true;
    } else {
        atomic_store(&a->cancel, true);
    }
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

void zd_ckpt_async_release(zd_ckpt_t *ck)
{
    if (ck->async != NULL) {
        zd_ckpt_async_set(ck->async, true);
    }
}

zs_status_t zd_ckpt_async_join(zd_ckpt_t *ck, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zd_ckpt_async_t *a = ck->async;
    zs_status_t st;

    if (out != NULL) {
        memset(out, 0, sizeof(*out));
    }
    if (a == NULL) {
        return ZS_OK;
    }
    pthread_join(a->thread, NULL);
    st = a->result;
    if (st != ZS_OK && err != NULL) {
        zs_ckpt_pathf(err, errlen, "checkpoint %s/%s: %s", a->dir.shown, a->tag, a->err);
    }
    if (out != NULL) {
        zs_ckpt_pathf(out->path, sizeof(out->path), "%s/%s", a->dir.shown, a->tag);
        zs_ckpt_pathf(out->tag, sizeof(out->tag), "%s", a->tag);
        out->step = a->step;
    }
    if (a->keep && a->stage != NULL) { /* for the next save */
        ck->stage = a->stage;
        ck->stage_bytes = a->stage_bytes;
        a->stage = NULL;
    }
    zd_ckpt_async_free(a);
    ck->async = NULL;
    return st;
}

void zd_ckpt_async_cancel(zd_ckpt_t *ck)
{
    if (ck->async != NULL) {
        zd_ckpt_async_set(ck->async, false);
        (void)zd_ckpt_async_join(ck, NULL, NULL, 0);
    }
}

/* ---- a job's checkpoints between calls ----------------------------------------------------- */

zs_status_t zd_ckpt_create(zd_ckpt_t **ck_p)
{
    zd_ckpt_t *ck = calloc(1, sizeof(*ck));

    if (ck == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    *ck_p = ck;
    return ZS_OK;
}

void zd_ckpt_settle(zd_ckpt_t *ck)
{
    if (ck != NULL) {
        (void)zd_ckpt_async_join(ck, NULL, NULL, 0);
    }
}

void zd_ckpt_destroy(zd_ckpt_t *ck)
{
    if (ck == NULL) {
        return;
    }
    zd_ckpt_settle(ck);
    if (ck->stage != NULL) {
        munmap(ck->stage, ck->stage_bytes);
    }
    free(ck);
}

zs_status_t zd_ckpt_wait(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, zd_ckpt_out_t *out, char *err,
                         size_t errlen)
{
    zs_status_t st = zd_ckpt_async_join(ck, out, err, errlen);

    /* rank 0's outcome is the commit's: every rank learns it */
    return zd_ckpt_agree(sh, st, "checkpoint write", err, errlen);
}
