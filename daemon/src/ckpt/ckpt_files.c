/*
 * The steps of a save on disk (docs/checkpoints.md "Format", "Commit protocol"), shared by the
 * synchronous save (ckpt_save.c) and the background writer (ckpt_async.c): a rank's file, the
 * manifest, the temporary directory, the commit by rename, the pruning of old checkpoints.
 * Everything goes through zs_dir (zs/dir.h), with the requester's rights.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"
#include "obs/testpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

zs_status_t zd_ckpt_write_rank(const zd_ckpt_shard_t *sh, const float *stage, uint64_t step,
                               const zs_dir_t *tmp, uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                               size_t errlen)
{
    const zs_layout_t *l = sh->layout;
    char name[64], rank_s[16], world_s[16], step_s[32];
    uint64_t dims[1] = {l->shard_numel};
    zs_st_meta_t t[ZS_CKPT_N_TENSORS];
    const char *kv[] = {"format", ZS_CKPT_FORMAT, "rank", rank_s, "world", world_s, "step", step_s};
    zs_st_writer_t *w = NULL;
    zs_status_t st;

    for (unsigned i = 0; i < ZS_CKPT_N_TENSORS; i++) {
        t[i] = (zs_st_meta_t){zs_ckpt_tensor_names[i], ZS_DTYPE_F32, 1, dims};
    }
    snprintf(rank_s, sizeof(rank_s), "%u", sh->rank);
    snprintf(world_s, sizeof(world_s), "%u", sh->world);
    snprintf(step_s, sizeof(step_s), "%" PRIu64, step);
    zs_ckpt_rank_file(sh->rank, name, sizeof(name));
    st = zs_st_create(tmp, name, t, ZS_CKPT_N_TENSORS, kv, 4, &w, err, errlen);
    if (stage != NULL) { /* the staging copy: master, m and v one after another */
        for (unsigned i = 0; i < ZS_CKPT_N_TENSORS && st == ZS_OK; i++) {
            st = zs_st_put(w, stage + (size_t)i * l->shard_numel, l->shard_numel * sizeof(float),
                           err, errlen);
        }
    }
    for (uint32_t b = 0; stage == NULL && b < l->n_buckets && st == ZS_OK; b++) {
        st = zs_st_put(w, sh->master[b], l->buckets[b].slice * sizeof(float), err, errlen);
    }
    if (st == ZS_OK && stage == NULL) {
        st = zs_st_put(w, sh->m, l->shard_numel * sizeof(float), err, errlen);
    }
    if (st == ZS_OK && stage == NULL) {
        st = zs_st_put(w, sh->v, l->shard_numel * sizeof(float), err, errlen);
    }
    if (st != ZS_OK) {
        zs_st_abort(w);
        return st;
    }
    return zs_st_finish(w, bytes_p, xxh3_p, err, errlen);
}

void zd_ckpt_manifest_release(zs_ckpt_manifest_t *m);

/* The manifest of a save as the job stands now, without its files (zd_ckpt_manifest_finish adds
 * them); names, shapes and group options are borrowed from the job. */
zs_status_t zd_ckpt_manifest_head(const zd_ckpt_shard_t *sh, const char *tag,
                                  zs_ckpt_manifest_t *mp)
{
    zs_ckpt_manifest_t m;

    memset(&m, 0, sizeof(m));
    if (zs_ckpt_manifest_alloc(&m, sh->layout->n_groups, 0, sh->world + 2) != ZS_OK) {
        zd_ckpt_manifest_release(&m);
        return ZS_ERR_NO_MEMORY;
    }
    m.version = ZS_CKPT_VERSION;
    snprintf(m.job_id, sizeof(m.job_id), "%s", sh->job_id);
    snprintf(m.tag, sizeof(m.tag), "%s", tag);
    m.step = sh->step;
    m.skipped_steps = sh->skipped_steps;
    m.world = sh->world;
    m.stage = sh->stage;
    m.dtype = sh->dtype;
    m.bucket_size = sh->layout->bucket_size;
    m.elem_align = sh->layout->elem_align;
    m.round_robin = sh->layout->round_robin;
    m.layout_hash = sh->layout->hash;
    m.config_hash = sh->config_hash;
    m.shard_numel = sh->layout->shard_numel;
    m.optimizer_states = true;
    m.scaler = sh->scaler;
    for (uint32_t g = 0; g < m.n_groups; g++) {
        m.group_n_params[g] = sh->layout->groups[g].n_params;
        m.group_options[g] = sh->group_json[g]; /* borrowed */
    }
    free(m.params);
    m.params = (zs_ckpt_param_t *)sh->pmeta; /* borrowed: the manifest writer only reads it */
    m.n_params = sh->layout->n_params;
    m.n_files = 0;
    *mp = m;
    return ZS_OK;
}

/* Free what zd_ckpt_manifest_head allocated (not what it borrowed). */
void zd_ckpt_manifest_release(zs_ckpt_manifest_t *m)
{
    free(m->group_n_params);
    free(m->group_options);
    free(m->files);
    m->group_n_params = NULL;
    m->group_options = NULL;
    m->files = NULL;
}

/* Every rank's file (files[world]) and the trainer state into the manifest; write it into tmp. */
#define ZD_CKPT_BUNDLE_MAGIC "ZDBUNDL1"

zs_status_t zd_ckpt_write_state(const zs_dir_t *tmp, const void *bytes, size_t len,
                                zd_ckpt_state_sums_t *sums, char *err, size_t errlen)
{
    const uint8_t *b = bytes;
    size_t head = sizeof(ZD_CKPT_BUNDLE_MAGIC) - 1 + 8, pt_len = len;
    zs_status_t st;

    memset(sums, 0, sizeof(*sums));
    if (bytes == NULL) {
        return ZS_OK;
    }
    if (len >= head && memcmp(b, ZD_CKPT_BUNDLE_MAGIC, head - 8) == 0) {
        uint64_t n = 0;
        for (unsigned i = 0; i < 8; i++) {
            n |= (uint64_t)b[head - 8 + i] << (8 * i);
        }
        if (n > len - head) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "the trainer's state names %" PRIu64 " bytes of %s in %zu bytes", n,
                           ZS_CKPT_TRAINER_STATE, len - head);
        }
        pt_len = (size_t)n;
        b += head;
        sums->has_module = true;
        sums->module_bytes = len - head - pt_len;
        st = zs_dir_write_file(tmp, ZD_CKPT_MODULE, b + pt_len, len - head - pt_len,
                               &sums->module_xxh3, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
    }
    sums->has_state = true;
    sums->state_bytes = pt_len;
    return zs_dir_write_file(tmp, ZS_CKPT_TRAINER_STATE, b, pt_len, &sums->state_xxh3, err, errlen);
}

zs_status_t zd_ckpt_manifest_finish(zs_ckpt_manifest_t *m, const zs_dir_t *tmp,
                                    const zs_ckpt_file_t *files, const zd_ckpt_state_sums_t *sums,
                                    char *err, size_t errlen)
{
    struct stat sb;

    /* a rank whose directory only looked like rank 0's (a leftover temporary directory of the
     * same name on a host of its own) wrote its file elsewhere: nothing is committed */
    for (uint32_t r = 0; r < m->world; r++) {
        if (!zs_dir_has(tmp, files[r].name, &sb) || !S_ISREG(sb.st_mode) ||
            (uint64_t)sb.st_size != files[r].bytes) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "rank %u's file %s (%" PRIu64 " bytes) is not in %s: rank %u wrote "
                           "into another directory than rank 0's; every rank must save into one "
                           "directory that every rank's host shares",
                           r, files[r].name, files[r].bytes, tmp->shown, r);
        }
    }
    m->n_files = m->world;
    memcpy(m->files, files, m->world * sizeof(*files));
    if (sums->has_state) {
        zs_ckpt_file_t *f = &m->files[m->n_files++];
        zs_ckpt_pathf(f->name, sizeof(f->name), "%s", ZS_CKPT_TRAINER_STATE);
        f->rank = -1;
        f->bytes = sums->state_bytes;
        f->xxh3 = sums->state_xxh3;
    }
    if (sums->has_module) {
        zs_ckpt_file_t *f = &m->files[m->n_files++];
        zs_ckpt_pathf(f->name, sizeof(f->name), "%s", ZD_CKPT_MODULE);
        f->rank = -1;
        f->bytes = sums->module_bytes;
        f->xxh3 = sums->module_xxh3;
    }
    return zs_ckpt_manifest_write(tmp, m, err, errlen);
}

void zd_ckpt_tmp_name(const char *tag, char *name, size_t len)
{
    zs_ckpt_pathf(name, len, "%s%s", ZS_CKPT_TMP_PREFIX, tag);
}

/* Rank 0 before anyone writes: the tag may be replaced (absent, or a checkpoint zerod wrote
 * that is the requester's), leftovers of unfinished saves are gone, and the temporary
 * directory is new and empty. */
zs_status_t zd_ckpt_prepare(const zs_dir_t *dir, const char *tag, zs_dir_t *tmp, char *err,
                            size_t errlen)
{
    char name[ZD_CKPT_TMP_NAME_MAX];
    int fd = fcntl(dir->fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    zs_status_t st = ZS_OK;

    if (d == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint dir %s: %s", dir->shown,
                       strerror(errno));
    }
    rewinddir(d); /* a duplicate shares the offset of every other reading of dir */
    st = zs_dir_may_replace(dir, tag, err, errlen);
    if (st == ZS_OK) { /* the commit renames over latest: refused now, before anything is written */
        st = zs_dir_may_replace(dir, ZS_CKPT_LATEST, err, errlen);
    }
    if (st == ZS_OK && zs_dir_has(dir, tag, NULL) && !zs_ckpt_is_checkpoint(dir, tag)) {
        st = zs_errf(err, errlen, ZS_ERR_EXISTS,
                     "%s/%s exists and is not a checkpoint zerod wrote (no manifest.json of its "
                     "own): refused, nothing was removed; choose another tag",
                     dir->shown, tag);
    }
    while (st == ZS_OK && (e = readdir(d)) != NULL) {
        char why[ZS_MSG_MAX];
        if (strncmp(e->d_name, ZS_CKPT_TMP_PREFIX, strlen(ZS_CKPT_TMP_PREFIX)) != 0 &&
            strncmp(e->d_name, ZS_CKPT_OLD_PREFIX, strlen(ZS_CKPT_OLD_PREFIX)) != 0) {
            continue;
        }
        zs_info(ZS_SUB_ENGINE, "checkpoint: removing %s/%s, left by an unfinished save", dir->shown,
                e->d_name);
        if (zs_ckpt_remove(dir, e->d_name, why, sizeof(why)) != ZS_OK) {
            zs_warn(ZS_SUB_ENGINE, "checkpoint: %s", why); /* another's: left as it is */
        }
    }
    closedir(d);
    zd_ckpt_tmp_name(tag, name, sizeof(name));
    if (st == ZS_OK) {
        st = zs_dir_mkdir(dir, name, tmp, err, errlen);
    }
    return st;
}

/* latest names tag: written beside it, then renamed over it. */
static zs_status_t zd_ckpt_set_latest(const zs_dir_t *dir, const char *tag, char *err,
                                      size_t errlen)
{
    char name[64], text[ZS_CKPT_TAG_MAX + 2];
    zs_status_t st;

    zs_ckpt_pathf(name, sizeof(name), "%slatest", ZS_CKPT_TMP_PREFIX);
    zs_ckpt_pathf(text, sizeof(text), "%s\n", tag);
    st = zs_dir_unlink(dir, name, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_write_file(dir, name, text, strlen(text), NULL, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_rename(dir, name, ZS_CKPT_LATEST, 0, err, errlen);
    }
    return st == ZS_OK ? zs_dir_fsync(dir, err, errlen) : st;
}

/* The step of the checkpoint DIR/latest names (tag out), when that directory is there: its
 * manifest's as written, or the N of a tag global_step<N> when the manifest cannot be read;
 * false when there is no such directory or neither says. */
static bool zd_ckpt_latest_step(const zs_dir_t *dir, char *tag, size_t taglen, uint64_t *step_p)
{
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t sub = ZS_DIR_INIT;
    char rest[2];
    bool known = false;

    if (zs_ckpt_resolve(dir, NULL, tag, taglen, NULL, 0) != ZS_OK ||
        zs_dir_sub(dir, tag, ZS_MAY_EXEC, &sub, NULL, 0) != ZS_OK) {
        return false;
    }
    if (zs_ckpt_manifest_read_unsealed(&sub, &m, NULL, 0) == ZS_OK) {
        *step_p = m->step;
        known = true;
    } else {
        known = sscanf(tag, "global_step%" SCNu64 "%1s", step_p, rest) == 1;
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&sub);
    return known;
}

/* Rank 0, every file in place: the temporary directory becomes DIR/TAG (replacing one of the
 * same tag), then DIR/latest names it, unless onward and latest names a later step. Each rename
 * is atomic, so a crash leaves either the old or the new. */
zs_status_t zd_ckpt_commit(const char *job_id, uint64_t step, bool onward, const zs_dir_t *dir,
                           const char *tag, const zs_dir_t *tmp, char *err, size_t errlen)
{
    char named[ZS_CKPT_TAG_MAX];
    uint64_t named_step = 0;
    char tname[ZD_CKPT_TMP_NAME_MAX], old[ZD_CKPT_TMP_NAME_MAX];
    zs_status_t st = zs_dir_fsync(tmp, err, errlen);

    zd_ckpt_tmp_name(tag, tname, sizeof(tname));
    zs_ckpt_pathf(old, sizeof(old), "%s%s", ZS_CKPT_OLD_PREFIX, tag);
    if (st == ZS_OK) {
        st = zs_dir_rename(dir, tname, tag, RENAME_NOREPLACE, err, errlen);
    }
    if (st == ZS_ERR_EXISTS) { /* the same tag again: only a checkpoint zerod wrote goes */
        if (!zs_ckpt_is_checkpoint(dir, tag)) {
            st = zs_errf(err, errlen, ZS_ERR_EXISTS,
                         "%s/%s is not a checkpoint zerod wrote: refused, nothing was removed",
                         dir->shown, tag);
        } else if ((st = zs_dir_rename(dir, tname, tag, RENAME_EXCHANGE, err, errlen)) == ZS_OK) {
            st = zs_ckpt_remove(dir, tname, err, errlen); /* now the old one */
        } else if (st == ZS_ERR_UNSUPPORTED) {            /* no atomic swap here: two steps */
            st = zs_dir_rename(dir, tag, old, RENAME_NOREPLACE, err, errlen);
            if (st == ZS_OK) {
                st = zs_dir_rename(dir, tname, tag, RENAME_NOREPLACE, err, errlen);
            }
            if (st == ZS_OK) {
                st = zs_ckpt_remove(dir, old, err, errlen);
            }
        }
    }
    if (st == ZS_OK) {
        st = zs_dir_fsync(dir, err, errlen);
    }
    zd_test_pause("ckpt", job_id, step); /* committed, `latest` not yet */
    if (st == ZS_OK && onward && zd_ckpt_latest_step(dir, named, sizeof(named), &named_step) &&
        named_step > step) {
        zs_warn(ZS_SUB_ENGINE,
                "checkpoint %s/%s (step %" PRIu64 ") committed; %s/%s still names %s (step %" PRIu64
                "): the daemon's own saves never move it back",
                dir->shown, tag, step, dir->shown, ZS_CKPT_LATEST, named, named_step);
        return ZS_OK;
    }
    return st == ZS_OK ? zd_ckpt_set_latest(dir, tag, err, errlen) : st;
}

/* The step of checkpoint `name` in dir when it is a verifiable one of this job. */
static bool zd_ckpt_entry_step(const zs_dir_t *dir, const char *name, const char *job_id,
                               uint64_t *step_p)
{
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t sub = ZS_DIR_INIT;
    char err[ZS_MSG_MAX];
    bool ours;

    if (name[0] == '.' || zs_ckpt_tag_check(name, err, sizeof(err)) != ZS_OK ||
        zs_dir_sub(dir, name, ZS_MAY_READ | ZS_MAY_EXEC, &sub, err, sizeof(err)) != ZS_OK) {
        return false;
    }
    ours = zs_ckpt_manifest_read(&sub, &m, err, sizeof(err)) == ZS_OK &&
           strcmp(m->job_id, job_id) == 0;
    if (ours) {
        *step_p = m->step;
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&sub);
    return ours;
}

zd_ckpt_entry_t *zd_ckpt_list_job(const zs_dir_t *dir, const char *job_id, size_t *n_p)
{
    zd_ckpt_entry_t *ents = NULL;
    size_t n = 0, cap = 0;
    int fd = fcntl(dir->fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    uint64_t step;

    if (fd >= 0 && d == NULL) {
        close(fd);
    }
    if (d != NULL) {
        rewinddir(d); /* a duplicate shares the offset of every other reading of dir */
    }
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (!zd_ckpt_entry_step(dir, e->d_name, job_id, &step)) {
            continue; /* not ours, or not verifiable: never removed */
        }
        if (n == cap) {
            zd_ckpt_entry_t *ne = realloc(ents, (cap = cap ? 2 * cap : 16) * sizeof(*ents));
            if (ne == NULL) {
                break;
            }
            ents = ne;
        }
        zs_ckpt_pathf(ents[n].tag, sizeof(ents[n].tag), "%s", e->d_name);
        ents[n++].step = step;
    }
    if (d != NULL) {
        closedir(d);
    }
    *n_p = n;
    return ents;
}

/* Rank 0 after a commit: keep the newest keep_last committed checkpoints of this job in DIR (by
 * step, as their manifests say; other jobs', unverifiable ones and the one just saved are never
 * removed). */
void zd_ckpt_prune(const zs_dir_t *dir, const char *job_id, const char *keep_tag,
                   uint32_t keep_last)
{
    zd_ckpt_entry_t *ents;
    size_t n = 0;
    char err[ZS_MSG_MAX];

    if (keep_last == 0) {
        return;
    }
    ents = zd_ckpt_list_job(dir, job_id, &n);
    while (n > keep_last) { /* drop the oldest until keep_last remain */
        size_t oldest = 0;
        for (size_t i = 1; i < n; i++) {
            if (ents[i].step < ents[oldest].step) {
                oldest = i;
            }
        }
        if (strcmp(ents[oldest].tag, keep_tag) != 0) {
            zs_info(ZS_SUB_ENGINE, "checkpoint: removing %s/%s (keep_last = %u)", dir->shown,
                    ents[oldest].tag, keep_last);
            if (zs_ckpt_remove(dir, ents[oldest].tag, err, sizeof(err)) != ZS_OK) {
                zs_warn(ZS_SUB_ENGINE, "checkpoint: %s", err);
            }
        }
        ents[oldest] = ents[--n];
    }
    free(ents);
}

zs_status_t zd_ckpt_open_dir(const zd_ckpt_req_t *req, int want, zs_dir_t *dir, char *err,
                             size_t errlen)
{
    int fd;

    *dir = (zs_dir_t)ZS_DIR_INIT;
    if (req->dir == NULL || req->dir[0] != '/' || strlen(req->dir) > ZD_CKPT_DIR_MAX) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "checkpoint dir '%.200s' is not an absolute path of at most %u bytes",
                       req->dir != NULL ? req->dir : "", ZD_CKPT_DIR_MAX);
    }
    if (req->dir_fd < 0) { /* the daemon's own (checkpoint_dir) */
        return zs_dir_open(dir, req->dir, err, errlen);
    }
    fd = fcntl(req->dir_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint dir %s: %s", req->dir, strerror(errno));
    }
    return zs_dir_adopt(dir, fd, req->dir, req->cred, want, err, errlen);
}

zs_status_t zd_ckpt_stage_copy(const zd_ckpt_shard_t *sh, float *stage)
{
    const zs_layout_t *l = sh->layout;
    size_t n = (size_t)l->shard_numel;
    zs_status_t st = ZS_OK;

    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK; b++) {
        st = zd_backend_copy(sh->be, stage + l->buckets[b].shard_offset, sh->master[b],
                             l->buckets[b].slice * sizeof(float));
    }
    if (st == ZS_OK) {
        st = zd_backend_copy(sh->be, stage + n, sh->m, n * sizeof(float));
    }
    if (st == ZS_OK) {
        st = zd_backend_copy(sh->be, stage + 2 * n, sh->v, n * sizeof(float));
    }
    return st;
}
