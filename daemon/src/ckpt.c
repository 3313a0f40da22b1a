/*
 * Checkpoints of a job (docs/checkpoints.md): the parameter names and shapes the trainer gave at
 * attach, the save protocol (every rank writes its shard into a temporary directory and fsyncs
 * it; rank 0 writes the manifest and commits the directory and `latest` by rename only when
 * every rank succeeded), and the load at any world size (each rank reads the element ranges its
 * shard owns from the saved ranks' files, found through the saved layout).
 */
#define _GNU_SOURCE
#include "job_int.h"
#include "mesh.h"
#include "zs/error.h"
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

/* How long the ranks wait for each other in a save or load: the slowest disk's write of a
 * shard; a rank that dies meanwhile is noticed by its heartbeat instead. */
#define ZD_CKPT_AGREE_NS (3600ull * 1000000000ull)

/* ---- names and shapes ----------------------------------------------------------------- */

zs_status_t zd_ckpt_meta_init(zd_job_t *job, const zd_job_spec_t *spec, char *err, size_t errlen)
{
    uint32_t n = job->layout->n_params, k = 0;
    uint64_t dim_at = 0;

    job->pmeta = calloc(n ? n : 1, sizeof(*job->pmeta));
    job->group_json = calloc(spec->n_groups, sizeof(*job->group_json));
    if (job->pmeta == NULL || job->group_json == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory for names");
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        const char *j = spec->group_json != NULL ? spec->group_json[g] : NULL;
        job->group_json[g] = j != NULL && j[0] != '\0' ? strdup(j) : NULL;
        for (uint32_t i = 0; i < spec->group_n_params[g]; i++, k++) {
            zs_ckpt_param_t *p = &job->pmeta[k];
            const char *name = spec->names != NULL ? spec->names[k] : NULL;
            char def[32];

            snprintf(def, sizeof(def), "param.%u", k);
            p->name = strdup(name != NULL && name[0] != '\0' ? name : def);
            p->group = g;
            p->numel = spec->numel[k];
            if (spec->ndim != NULL) {
                p->ndim = spec->ndim[k];
                memcpy(p->dims, spec->dims + dim_at, p->ndim * sizeof(uint64_t));
                dim_at += p->ndim;
            } else {
                p->ndim = 1;
                p->dims[0] = p->numel;
            }
            if (p->name == NULL) {
                return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory for names");
            }
        }
    }
    return ZS_OK;
}

void zd_ckpt_meta_free(zd_job_t *job)
{
    for (uint32_t i = 0; job->pmeta != NULL && i < job->layout->n_params; i++) {
        free(job->pmeta[i].name);
    }
    for (uint32_t g = 0; job->group_json != NULL && g < job->layout->n_groups; g++) {
        free(job->group_json[g]);
    }
    free(job->pmeta);
    free(job->group_json);
}

/* ---- agreement between the ranks -------------------------------------------------------- */

/* Every rank passes its own outcome; all learn whether every rank succeeded. A rank that
 * succeeded while another failed gets ZS_ERR_ABORTED naming the failed rank. */
zs_status_t zd_ckpt_agree(zd_job_t *job, zs_status_t mine, const char *what, char *err,
                          size_t errlen)
{
    double v = mine != ZS_OK ? (double)job->rank + 1 : 0;
    zd_reduce_op_t op = ZD_REDUCE_MAX;
    char why[ZD_MAX_MSG] = "";
    zs_status_t st;

    if (job->coll == NULL) {
        return mine != ZS_OK ? mine
                             : zs_errf(err, errlen, ZS_ERR_PEER_LOST, "%s: the mesh is down", what);
    }
    if (job->mesh != NULL) { /* the other ranks may still be writing: wait for their disks */
        uint64_t was = zd_mesh_collective_timeout_ns(job->mesh);
        zd_mesh_set_collective_timeout_ns(job->mesh, ZD_CKPT_AGREE_NS);
        st = job->coll->ops->all_reduce(job->coll, &v, &op, 1, why, sizeof(why));
        zd_mesh_set_collective_timeout_ns(job->mesh, was);
    } else {
        st = job->coll->ops->all_reduce(job->coll, &v, &op, 1, why, sizeof(why));
    }
    if (st != ZS_OK) {
        return mine != ZS_OK ? mine : zs_errf(err, errlen, st, "%s: %s", what, why);
    }
    if (mine != ZS_OK) {
        return mine;
    }
    if (v > 0) {
        return zs_errf(err, errlen, ZS_ERR_ABORTED,
                       "%s failed on rank %u (its daemon's log says why); nothing was changed",
                       what, (unsigned)v - 1);
    }
    return ZS_OK;
}

/* ---- save ------------------------------------------------------------------------------- */

zs_status_t zd_ckpt_write_rank(const zd_job_t *job, const float *stage, uint64_t step,
                               const char *tmp, uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                               size_t errlen)
{
    const zs_layout_t *l = job->layout;
    char path[4096], name[64], rank_s[16], world_s[16], step_s[32];
    uint64_t dims[1] = {l->shard_numel};
    zs_st_meta_t t[ZS_CKPT_N_TENSORS];
    const char *kv[] = {"format", ZS_CKPT_FORMAT, "rank", rank_s, "world", world_s, "step", step_s};
    zs_st_writer_t *w = NULL;
    zs_status_t st;

    for (unsigned i = 0; i < ZS_CKPT_N_TENSORS; i++) {
        t[i] = (zs_st_meta_t){zs_ckpt_tensor_names[i], ZS_DTYPE_F32, 1, dims};
    }
    snprintf(rank_s, sizeof(rank_s), "%u", job->rank);
    snprintf(world_s, sizeof(world_s), "%u", job->world);
    snprintf(step_s, sizeof(step_s), "%" PRIu64, step);
    zs_ckpt_rank_file(job->rank, name, sizeof(name));
    zs_ckpt_pathf(path, sizeof(path), "%s/%s", tmp, name);
    st = zs_st_create(path, t, ZS_CKPT_N_TENSORS, kv, 4, &w, err, errlen);
    if (stage != NULL) { /* the staging copy: master, m and v one after another */
        for (unsigned i = 0; i < ZS_CKPT_N_TENSORS && st == ZS_OK; i++) {
            st = zs_st_put(w, stage + (size_t)i * l->shard_numel, l->shard_numel * sizeof(float),
                           err, errlen);
        }
    }
    for (uint32_t b = 0; stage == NULL && b < l->n_buckets && st == ZS_OK; b++) {
        st = zs_st_put(w, zd_step_master(job, b), l->buckets[b].slice * sizeof(float), err, errlen);
    }
    if (st == ZS_OK && stage == NULL) {
        st = zs_st_put(w, job->m, l->shard_numel * sizeof(float), err, errlen);
    }
    if (st == ZS_OK && stage == NULL) {
        st = zs_st_put(w, job->v, l->shard_numel * sizeof(float), err, errlen);
    }
    if (st != ZS_OK) {
        zs_st_abort(w);
        return st;
    }
    return zs_st_finish(w, bytes_p, xxh3_p, err, errlen);
}

/* What rank r wrote, for rank 0's manifest: a small side file next to its shard. */
static void zd_ckpt_sum_path(const char *tmp, uint32_t r, char *path, size_t len)
{
    zs_ckpt_pathf(path, len, "%s/.rank_%05u.sum", tmp, r);
}

/* A rank's report appears whole or not at all: rank 0 polls for the name (ckpt_async.c) and
 * reads it at once, so it is written under another name and renamed into place. */
zs_status_t zd_ckpt_write_report(const char *path, const char *text, char *err, size_t errlen)
{
    char part[4096 + 8];
    zs_status_t st;

    zs_ckpt_pathf(part, sizeof(part), "%s.part", path);
    st = zs_ckpt_write_file(part, text, strlen(text), NULL, err, errlen);
    if (st == ZS_OK && rename(part, path) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "renaming %s to %s: %s", part, path, strerror(errno));
    }
    return st;
}

zs_status_t zd_ckpt_write_sum(uint32_t rank, const char *tmp, uint64_t bytes, uint64_t xxh3,
                              char *err, size_t errlen)
{
    char path[4096], text[64];

    zd_ckpt_sum_path(tmp, rank, path, sizeof(path));
    zs_ckpt_pathf(text, sizeof(text), "%" PRIu64 " %016" PRIx64 "\n", bytes, xxh3);
    return zd_ckpt_write_report(path, text, err, errlen);
}

static zs_status_t zd_ckpt_read_sum(const char *tmp, uint32_t r, zs_ckpt_file_t *f, char *err,
                                    size_t errlen)
{
    char path[4096];
    FILE *fp;
    int n;

    zd_ckpt_sum_path(tmp, r, path, sizeof(path));
    fp = fopen(path, "r");
    n = fp != NULL ? fscanf(fp, "%" SCNu64 " %" SCNx64, &f->bytes, &f->xxh3) : 0;
    if (fp != NULL) {
        fclose(fp);
    }
    if (n != 2) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: rank %u's report is missing or unreadable",
                       path, r);
    }
    unlink(path);
    zs_ckpt_rank_file(r, f->name, sizeof(f->name));
    f->rank = (int32_t)r;
    return ZS_OK;
}

void zd_ckpt_manifest_release(zs_ckpt_manifest_t *m);

/* The manifest of a save as the job stands now (files come later: zd_ckpt_manifest_finish);
 * names, shapes and group options are borrowed from the job. */
zs_status_t zd_ckpt_manifest_head(const zd_job_t *job, const char *tag, zs_ckpt_manifest_t *mp)
{
    zs_ckpt_manifest_t m;

    memset(&m, 0, sizeof(m));
    if (zs_ckpt_manifest_alloc(&m, job->layout->n_groups, 0, job->world + 1) != ZS_OK) {
        zd_ckpt_manifest_release(&m);
        return ZS_ERR_NO_MEMORY;
    }
    m.version = ZS_CKPT_VERSION;
    snprintf(m.job_id, sizeof(m.job_id), "%s", job->id);
    snprintf(m.tag, sizeof(m.tag), "%s", tag);
    m.step = job->step;
    m.skipped_steps = job->skipped_steps;
    m.world = job->world;
    m.stage = job->cfg.stage;
    m.dtype = job->dtype;
    m.bucket_size = job->layout->bucket_size;
    m.elem_align = job->layout->elem_align;
    m.round_robin = job->layout->round_robin;
    m.layout_hash = job->layout->hash;
    m.config_hash = job->config_hash;
    m.shard_numel = job->layout->shard_numel;
    m.optimizer_states = true;
    m.scaler = (zs_ckpt_scaler_t){job->scaler.cur_scale, job->scaler.cur_hysteresis,
                                  job->scaler.cur_iter, job->scaler.last_overflow_iter};
    for (uint32_t g = 0; g < m.n_groups; g++) {
        m.group_n_params[g] = job->layout->groups[g].n_params;
        m.group_options[g] = job->group_json[g]; /* borrowed */
    }
    free(m.params);
    m.params = job->pmeta; /* borrowed */
    m.n_params = job->layout->n_params;
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

/* Every rank's report and the trainer state into the manifest; write it into tmp. */
zs_status_t zd_ckpt_manifest_finish(zs_ckpt_manifest_t *m, const char *tmp, bool has_state,
                                    uint64_t state_bytes, uint64_t state_xxh3, char *err,
                                    size_t errlen)
{
    zs_status_t st;

    m->n_files = m->world;
    for (uint32_t r = 0; r < m->world; r++) {
        st = zd_ckpt_read_sum(tmp, r, &m->files[r], err, errlen);
        if (st != ZS_OK) {
            return st;
        }
    }
    if (has_state) {
        zs_ckpt_file_t *f = &m->files[m->n_files++];
        zs_ckpt_pathf(f->name, sizeof(f->name), "%s", ZS_CKPT_TRAINER_STATE);
        f->rank = -1;
        f->bytes = state_bytes;
        f->xxh3 = state_xxh3;
    }
    return zs_ckpt_manifest_write(tmp, m, err, errlen);
}

/* Rank 0 before anyone writes: DIR exists, leftovers of unfinished saves are gone, and the
 * temporary directory is new and empty. */
zs_status_t zd_ckpt_prepare(const char *dir, const char *tmp, char *err, size_t errlen)
{
    DIR *d;
    struct dirent *e;
    zs_status_t st = ZS_OK;

    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        return zs_errf(err, errlen, errno == EACCES ? ZS_ERR_PERMISSION : ZS_ERR_IO,
                       "checkpoint dir %s: cannot create it: %s", dir, strerror(errno));
    }
    d = opendir(dir);
    if (d == NULL) {
        return zs_errf(err, errlen, errno == EACCES ? ZS_ERR_PERMISSION : ZS_ERR_IO,
                       "checkpoint dir %s: %s", dir, strerror(errno));
    }
    while ((e = readdir(d)) != NULL && st == ZS_OK) {
        char path[4096];
        if (strncmp(e->d_name, ZS_CKPT_TMP_PREFIX, strlen(ZS_CKPT_TMP_PREFIX)) != 0 &&
            strncmp(e->d_name, ZS_CKPT_OLD_PREFIX, strlen(ZS_CKPT_OLD_PREFIX)) != 0) {
            continue;
        }
        zs_ckpt_pathf(path, sizeof(path), "%s/%s", dir, e->d_name);
        zs_info(ZS_SUB_ENGINE, "checkpoint: removing %s, left by an unfinished save", path);
        st = zs_ckpt_remove_tree(path, err, errlen);
    }
    closedir(d);
    if (st == ZS_OK && mkdir(tmp, 0755) != 0) {
        st = zs_errf(err, errlen, errno == EACCES ? ZS_ERR_PERMISSION : ZS_ERR_IO,
                     "cannot create %s: %s", tmp, strerror(errno));
    }
    return st;
}

/* Rank 0, every file in place: TMP becomes DIR/TAG (replacing one of the same tag), then
 * DIR/latest names it. Each rename is atomic, so a crash leaves either the old or the new. */
zs_status_t zd_ckpt_commit(const zd_job_t *job, uint64_t step, const char *dir, const char *tag,
                           const char *tmp, char *err, size_t errlen)
{
    char final[4096], old[4096], latest_tmp[4096], latest[4096], text[ZS_CKPT_TAG_MAX + 2];
    zs_status_t st = zs_ckpt_fsync_dir(tmp, err, errlen);

    zs_ckpt_pathf(final, sizeof(final), "%s/%s", dir, tag);
    zs_ckpt_pathf(old, sizeof(old), "%s/%s%s", dir, ZS_CKPT_OLD_PREFIX, tag);
    if (st == ZS_OK && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE) != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY) {
            /* the same tag again: swap atomically where the filesystem can, else two steps */
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
                st = zs_ckpt_remove_tree(tmp, err, errlen); /* now the old one */
            } else if (rename(final, old) != 0 || rename(tmp, final) != 0) {
                st = zs_errf(err, errlen, ZS_ERR_IO, "replacing %s: %s", final, strerror(errno));
            } else {
                st = zs_ckpt_remove_tree(old, err, errlen);
            }
        } else {
            st = zs_errf(err, errlen, ZS_ERR_IO, "renaming %s to %s: %s", tmp, final,
                         strerror(errno));
        }
    }
    if (st == ZS_OK) {
        st = zs_ckpt_fsync_dir(dir, err, errlen);
    }
    zd_step_test_pause(job, "ckpt", step); /* committed, `latest` not yet */
    zs_ckpt_pathf(latest_tmp, sizeof(latest_tmp), "%s/%slatest", dir, ZS_CKPT_TMP_PREFIX);
    zs_ckpt_pathf(latest, sizeof(latest), "%s/%s", dir, ZS_CKPT_LATEST);
    zs_ckpt_pathf(text, sizeof(text), "%s\n", tag);
    if (st == ZS_OK) {
        st = zs_ckpt_write_file(latest_tmp, text, strlen(text), NULL, err, errlen);
    }
    if (st == ZS_OK && rename(latest_tmp, latest) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "renaming %s to %s: %s", latest_tmp, latest,
                     strerror(errno));
    }
    return st == ZS_OK ? zs_ckpt_fsync_dir(dir, err, errlen) : st;
}

/* Rank 0 after a commit: keep the newest keep_last committed checkpoints of this job in DIR (by
 * step, as their manifests say; other jobs' and the one just saved are never removed). */
void zd_ckpt_prune(const char *dir, const char *job_id, const char *keep_tag, uint32_t keep_last)
{
    typedef struct {
        char tag[ZS_CKPT_TAG_MAX];
        uint64_t step;
    } entry_t;
    entry_t *ents = NULL;
    size_t n = 0, cap = 0;
    DIR *d = keep_last > 0 ? opendir(dir) : NULL;
    struct dirent *e;
    char err[ZD_MAX_MSG], path[4096];

    while (d != NULL && (e = readdir(d)) != NULL) {
        zs_ckpt_manifest_t *m = NULL;
        if (e->d_name[0] == '.' || zs_ckpt_tag_check(e->d_name, err, sizeof(err)) != ZS_OK) {
            continue;
        }
        zs_ckpt_pathf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (zs_ckpt_manifest_read(path, &m, err, sizeof(err)) != ZS_OK) {
            continue; /* not ours, or unreadable: never removed */
        }
        if (strcmp(m->job_id, job_id) != 0) {
            zs_ckpt_manifest_free(m);
            continue;
        }
        if (n == cap) {
            entry_t *ne = realloc(ents, (cap = cap ? 2 * cap : 16) * sizeof(*ents));
            if (ne == NULL) {
                zs_ckpt_manifest_free(m);
                break;
            }
            ents = ne;
        }
        zs_ckpt_pathf(ents[n].tag, sizeof(ents[n].tag), "%s", e->d_name);
        ents[n++].step = m->step;
        zs_ckpt_manifest_free(m);
    }
    if (d != NULL) {
        closedir(d);
    }
    while (n > keep_last) { /* drop the oldest until keep_last remain */
        size_t oldest = 0;
        for (size_t i = 1; i < n; i++) {
            if (ents[i].step < ents[oldest].step) {
                oldest = i;
            }
        }
        if (strcmp(ents[oldest].tag, keep_tag) != 0) {
            zs_ckpt_pathf(path, sizeof(path), "%s/%s", dir, ents[oldest].tag);
            zs_info(ZS_SUB_ENGINE, "checkpoint: removing %s (keep_last = %u)", path, keep_last);
            (void)zs_ckpt_remove_tree(path, err, sizeof(err));
        }
        ents[oldest] = ents[--n];
    }
    free(ents);
}

zs_status_t zd_ckpt_check_dir(const char *dir, char *err, size_t errlen)
{
    if (dir == NULL || dir[0] != '/') {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "checkpoint dir '%s' is not an absolute path (the daemon's working "
                       "directory is not the trainer's)",
                       dir != NULL ? dir : "");
    }
    if (strlen(dir) > ZD_CKPT_DIR_MAX) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "checkpoint dir is %zu bytes long (at most %u)",
                       strlen(dir), ZD_CKPT_DIR_MAX);
    }
    return ZS_OK;
}

static zs_status_t zd_ckpt_check_req(const zd_job_t *job, const zd_ckpt_req_t *req, char *tag,
                                     char *err, size_t errlen)
{
    zs_status_t st = zd_ckpt_check_dir(req->dir, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    if (req->tag != NULL && req->tag[0] != '\0') {
        snprintf(tag, ZS_CKPT_TAG_MAX, "%s", req->tag);
        return zs_ckpt_tag_check(req->tag, err, errlen);
    }
    snprintf(tag, ZS_CKPT_TAG_MAX, "global_step%" PRIu64, job->step);
    return ZS_OK;
}

static void zd_ckpt_save_out(const zd_job_t *job, const char *dir, const char *tag, bool has_state,
                             zd_ckpt_out_t *out)
{
    zs_ckpt_pathf(out->path, sizeof(out->path), "%s/%s", dir, tag);
    zs_ckpt_pathf(out->tag, sizeof(out->tag), "%s", tag);
    out->step = job->step;
    out->loss_scale = job->scaler.cur_scale;
    out->saved_world = job->world;
    out->has_trainer_state = has_state;
}

/* This rank's file, written before the save replies: from the shard itself on the CPU, from a
 * host copy of it on the GPU. */
static zs_status_t zd_ckpt_write_synced(zd_job_t *job, const char *tmp, uint64_t *bytes_p,
                                        uint64_t *xxh3_p, char *err, size_t errlen)
{
    size_t n = (size_t)job->layout->shard_numel;
    float *stage;
    zs_status_t st;

    if (zd_backend_device(job->be) < 0) {
        return zd_ckpt_write_rank(job, NULL, job->step, tmp, bytes_p, xxh3_p, err, errlen);
    }
    stage = malloc((3 * n + 1) * sizeof(float));
    if (stage == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                       "checkpoint save: no host memory to copy %zu bytes of device shard state",
                       3 * n * sizeof(float));
    }
    st = zd_ckpt_stage_copy(job, stage);
    if (st != ZS_OK) {
        st = zs_errf(err, errlen, st, "checkpoint save: %s", zd_backend_error(job->be));
    } else {
        st = zd_ckpt_write_rank(job, stage, job->step, tmp, bytes_p, xxh3_p, err, errlen);
    }
    free(stage);
    return st;
}

static zs_status_t zd_ckpt_save_run(zd_job_t *job, const zd_ckpt_req_t *req, zd_ckpt_out_t *out,
                                    char *err, size_t errlen)
{
    char tag[ZS_CKPT_TAG_MAX], tmp[4096];
    uint64_t bytes = 0, xxh3 = 0, sbytes = 0, sxxh3 = 0;
    bool has_state = job->rank == 0 && req->trainer_state != NULL;
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st;

    zd_ckpt_async_wait(job); /* a save still writing finishes first */
    st = zd_ckpt_check_req(job, req, tag, err, errlen);
    zs_ckpt_pathf(tmp, sizeof(tmp), "%s/%s%s", req->dir != NULL ? req->dir : "", ZS_CKPT_TMP_PREFIX,
                  tag);
    if (st == ZS_OK && job->rank == 0) {
        st = zd_ckpt_prepare(req->dir, tmp, err, errlen);
    }
    st = zd_ckpt_agree(job, st, "checkpoint save (preparing the directory)", err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    zd_step_test_pause(job, "ckpt", job->step);
    if (req->async) { /* a staging copy on every rank, written in the background */
        st = zd_ckpt_async_start(job, req, tag, tmp, err, errlen);
        st = zd_ckpt_agree(job, st, "checkpoint save (staging a copy)", err, errlen);
        if (st == ZS_OK) {
            zd_ckpt_async_release(job); /* every rank staged: the writers go */
            zd_ckpt_save_out(job, req->dir, tag, has_state, out);
            zs_info(ZS_SUB_ENGINE, "checkpoint %s staged at step %" PRIu64 " in %.3f s; writing",
                    out->path, job->step, (double)(zs_time_now_ns() - t0) * 1e-9);
            return ZS_OK;
        }
        zd_ckpt_async_cancel(job); /* nothing written yet: the synchronous way, on every rank */
        if (st == ZS_ERR_PEER_LOST) {
            return st;
        }
        zs_warn(ZS_SUB_ENGINE, "checkpoint: no staging copy (%s); writing it before replying", err);
    }
    st = zd_ckpt_write_synced(job, tmp, &bytes, &xxh3, err, errlen);
    if (st == ZS_OK) {
        st = zd_ckpt_write_sum(job->rank, tmp, bytes, xxh3, err, errlen);
    }
    if (st == ZS_OK && has_state) {
        char path[4096];
        zs_ckpt_pathf(path, sizeof(path), "%s/%s", tmp, ZS_CKPT_TRAINER_STATE);
        sbytes = req->trainer_state_len;
        st = zs_ckpt_write_file(path, req->trainer_state, req->trainer_state_len, &sxxh3, err,
                                errlen);
    }
    zd_step_test_pause(job, "ckpt", job->step);
    st = zd_ckpt_agree(job, st, "checkpoint save (writing the shards)", err, errlen);
    if (st == ZS_OK && job->rank == 0) {
        zs_ckpt_manifest_t m;
        memset(&m, 0, sizeof(m));
        st = zd_ckpt_manifest_head(job, tag, &m);
        if (st == ZS_OK) {
            st = zd_ckpt_manifest_finish(&m, tmp, has_state, sbytes, sxxh3, err, errlen);
        } else {
            st = zs_errf(err, errlen, st, "out of memory for the manifest");
        }
        zd_ckpt_manifest_release(&m);
        zd_step_test_pause(job, "ckpt", job->step);
        if (st == ZS_OK) {
            st = zd_ckpt_commit(job, job->step, req->dir, tag, tmp, err, errlen);
        }
        if (st == ZS_OK) {
            zd_ckpt_prune(req->dir, job->id, tag, req->keep_last);
        }
    }
    st = zd_ckpt_agree(job, st, "checkpoint save (committing)", err, errlen);
    if (st != ZS_OK) {
        if (job->rank == 0) { /* every rank is past its writes: what they left goes */
            char why[ZD_MAX_MSG];
            (void)zs_ckpt_remove_tree(tmp, why, sizeof(why));
        }
        return st;
    }
    zd_ckpt_save_out(job, req->dir, tag, has_state, out);
    zs_info(ZS_SUB_ENGINE, "checkpoint %s saved at step %" PRIu64 " (%.3f s, %" PRIu64 " bytes)",
            out->path, job->step, (double)(zs_time_now_ns() - t0) * 1e-9, bytes);
    return ZS_OK;
}

/* A save, a span of the step trace (trace.h) whatever its outcome. */
zs_status_t zd_ckpt_save(zd_job_t *job, const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                         size_t errlen)
{
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st = zd_ckpt_save_run(job, req, out, err, errlen);

    zd_trace_span(job->trace, ZD_TRACE_CHECKPOINT, job->step, t0, zs_time_now_ns(),
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    return st;
}

/* ---- the daemons' own checkpoints (checkpoint_* of the daemon config) ------------------------ */

/* checkpoint_dir/<job id>: the daemons' own checkpoints of one job. */
static zs_status_t zd_ckpt_job_dir(const zd_job_t *job, const char *dir, char *out, size_t len,
                                   char *err, size_t errlen)
{
    if (!zs_ckpt_pathf(out, len, "%s/%s", dir, job->id) || strlen(out) > ZD_CKPT_DIR_MAX ||
        zs_ckpt_tag_check(job->id, err, errlen) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "job id '%s' cannot name a directory under checkpoint_dir %s", job->id, dir);
    }
    return ZS_OK;
}

void zd_ckpt_auto(zd_job_t *job, const zd_job_env_t *env)
{
    char dir[4096];
    zd_ckpt_req_t req = {.dir = dir,
                         .keep_last = env->ckpt_keep_last,
                         .async = env->ckpt_async,
                         .keep_staging = env->ckpt_staging_keep};
    zd_ckpt_out_t out;
    char err[ZD_MAX_MSG] = "";
    uint64_t now = zs_time_now_ns();
    double due = 0;
    zs_status_t st;

    if (env->ckpt_dir == NULL || job->step == job->ckpt_last_step || job->coll == NULL) {
        return;
    }
    if (job->ckpt_last_ns == 0) {
        job->ckpt_last_ns = now; /* the clock starts with the job */
    }
    if (env->ckpt_every_steps > 0 && job->step % env->ckpt_every_steps == 0) {
        due = 1;
    }
    if (env->ckpt_every_ns > 0) { /* clocks differ: the ranks agree (every rank asks) */
        zd_reduce_op_t op = ZD_REDUCE_MAX;
        if (now - job->ckpt_last_ns >= env->ckpt_every_ns) {
            due = 1;
        }
        st = job->coll->ops->all_reduce(job->coll, &due, &op, 1, err, sizeof(err));
        if (st != ZS_OK) {
            zs_warn(ZS_SUB_ENGINE, "automatic checkpoint: the ranks could not agree: %s", err);
            return;
        }
    }
    if (due == 0) {
        return;
    }
    job->ckpt_last_step = job->step;
    job->ckpt_last_ns = now;
    st = zd_ckpt_job_dir(job, env->ckpt_dir, dir, sizeof(dir), err, sizeof(err));
    if (st == ZS_OK && job->rank == 0 && mkdir(env->ckpt_dir, 0755) != 0 && errno != EEXIST) {
        zs_warn(ZS_SUB_ENGINE, "checkpoint_dir %s: %s", env->ckpt_dir, strerror(errno));
    }
    st = st == ZS_OK ? zd_ckpt_save(job, &req, &out, err, sizeof(err)) : st;
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "automatic checkpoint at step %" PRIu64 " failed: %s", job->step,
                err);
    }
}

zs_status_t zd_ckpt_restore(zd_job_t *job, const char *dir, zd_ckpt_out_t *out, bool *restored_p)
{
    char path[4096], tag[ZS_CKPT_TAG_MAX], err[ZD_MAX_MSG] = "", jdir[4096];
    zs_ckpt_manifest_t *m = NULL;
    zd_ckpt_req_t req = {.dir = jdir, .load_optimizer_states = true};
    zs_status_t st;

    *restored_p = false;
    st = zd_ckpt_job_dir(job, dir, jdir, sizeof(jdir), err, sizeof(err));
    if (st == ZS_OK) {
        st = zs_ckpt_resolve(jdir, NULL, path, sizeof(path), tag, sizeof(tag), err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(path, &m, err, sizeof(err));
    }
    if (st == ZS_OK && strcmp(m->job_id, job->id) != 0) {
        st = zs_errf(err, sizeof(err), ZS_ERR_NOT_FOUND, "%s is job '%s''s, not '%s''s", path,
                     m->job_id, job->id);
    }
    zs_ckpt_manifest_free(m);
    /* every rank must find one, or none loads */
    st = zd_ckpt_agree(job, st, "resuming from checkpoint_dir", err, sizeof(err));
    if (st != ZS_OK) {
        zs_info(ZS_SUB_ENGINE, "job '%s' starts from its trainer's parameters: %s", job->id, err);
        return st == ZS_ERR_PEER_LOST ? st : ZS_OK;
    }
    st = zd_ckpt_load(job, &req, out, err, sizeof(err));
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "job '%s': resuming from %s failed: %s", job->id, path, err);
        return st;
    }
    *restored_p = true;
    zs_info(ZS_SUB_ENGINE, "job '%s' resumed from %s at step %" PRIu64, job->id, out->path,
            job->step);
    return ZS_OK;
}

/* ---- the trainer's requests ---------------------------------------------------------- */

zs_status_t zd_job_ckpt_save(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    st = zd_ckpt_save(job, req, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    return st;
}

zs_status_t zd_job_ckpt_load(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    st = zd_ckpt_load(job, req, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    return st;
}

zs_status_t zd_job_ckpt_wait(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    st = zd_ckpt_wait(job, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    return st;
}
