/*
 * The job's side of its checkpoints (ckpt/ckpt.h does the checkpoints; docs/checkpoints.md):
 * the names and shapes the trainer gave at attach, the job described as a shard for each call,
 * the trainer's save, wait, load and export, a load's staging copy taken into the job, and the
 * daemon's own checkpoints (when to save, whether to resume).
 */
#define _GNU_SOURCE
#include "job/job_ckpt.h"
#include "job/job_int.h"
#include "zs/time.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and shapes --------------------------------------------------------------------- */

static zs_status_t zd_job_name_param(zs_ckpt_param_t *p, const zd_job_spec_t *spec, uint32_t k,
                                     uint32_t g, uint64_t *dim_at)
{
    const char *name = spec->names != NULL ? spec->names[k] : NULL;
    char def[32];

    snprintf(def, sizeof(def), "param.%u", k);
    p->name = strdup(name != NULL && name[0] != '\0' ? name : def);
    p->group = g;
    p->numel = spec->numel[k];
    if (spec->ndim != NULL) {
        p->ndim = spec->ndim[k];
        memcpy(p->dims, spec->dims + *dim_at, p->ndim * sizeof(uint64_t));
        *dim_at += p->ndim;
    } else {
        p->ndim = 1;
        p->dims[0] = p->numel;
    }
    return p->name != NULL ? ZS_OK : ZS_ERR_NO_MEMORY;
}

zs_status_t zd_job_names_init(zd_job_t *job, const zd_job_spec_t *spec, char *err, size_t errlen)
{
    uint32_t n = job->layout->n_params, k = 0;
    uint64_t dim_at = 0;

    job->pmeta = calloc(n ? n : 1, sizeof(*job->pmeta));
    job->group_json = calloc(spec->n_groups, sizeof(*job->group_json));
    job->bucket_master = calloc(job->layout->n_buckets + 1u, sizeof(*job->bucket_master));
    if (job->pmeta == NULL || job->group_json == NULL || job->bucket_master == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory for names");
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        const char *j = spec->group_json != NULL ? spec->group_json[g] : NULL;
        job->group_json[g] = j != NULL && j[0] != '\0' ? strdup(j) : NULL;
        for (uint32_t i = 0; i < spec->group_n_params[g]; i++, k++) {
            if (zd_job_name_param(&job->pmeta[k], spec, k, g, &dim_at) != ZS_OK) {
                return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory for names");
            }
        }
    }
    return ZS_OK;
}

void zd_job_names_free(zd_job_t *job)
{
    for (uint32_t i = 0; job->pmeta != NULL && i < job->layout->n_params; i++) {
        free(job->pmeta[i].name);
    }
    for (uint32_t g = 0; job->group_json != NULL && g < job->layout->n_groups; g++) {
        free(job->group_json[g]);
    }
    free(job->pmeta);
    free(job->group_json);
    free(job->bucket_master);
}

/* ---- the job as a checkpoint sees it -------------------------------------------------------- */

/* The job's shard for one checkpoint call (ckpt/ckpt.h): what it is now. */
static zd_ckpt_shard_t zd_job_shard(zd_job_t *job)
{
    for (uint32_t b = 0; b < job->layout->n_buckets; b++) {
        job->bucket_master[b] = zd_step_master(job, b); /* the params region may have moved */
    }
    return (zd_ckpt_shard_t){
        .job_id = job->id,
        .rank = job->rank,
        .world = job->world,
        .stage = job->cfg.stage,
        .dtype = job->dtype,
        .config_hash = job->config_hash,
        .layout = job->layout,
        .pmeta = job->pmeta,
        .group_json = job->group_json,
        .be = job->be,
        .coll = job->coll,
        .mesh = job->mesh,
        .trace = job->trace,
        .master = job->bucket_master,
        .m = job->m,
        .v = job->v,
        .params = &job->params,
        .params_loaded = job->params_loaded,
        .step = job->step,
        .skipped_steps = job->skipped_steps,
        .scaler = {job->scaler.cur_scale, job->scaler.cur_hysteresis, job->scaler.cur_iter,
                   job->scaler.last_overflow_iter},
    };
}

/* On the GPU a load's staging copy is copied into the device shard. A failure leaves the shard
 * part old, part new: the load fails and the job with it, as a failed read does. */
static zs_status_t zd_job_copy_loaded(zd_job_t *job, const zd_ckpt_loaded_t *l)
{
    const zs_layout_t *lay = job->layout;
    size_t bytes = (size_t)lay->shard_numel * sizeof(float);
    zs_status_t st = ZS_OK;

    for (uint32_t b = 0; b < lay->n_buckets && st == ZS_OK; b++) {
        st = zd_backend_copy(job->be, zd_step_master(job, b),
                             l->stage[0] + lay->buckets[b].shard_offset,
                             (size_t)lay->buckets[b].slice * sizeof(float));
    }
    if (st == ZS_OK && l->moments) {
        st = zd_backend_copy(job->be, job->m, l->stage[1], bytes);
        if (st == ZS_OK) {
            st = zd_backend_copy(job->be, job->v, l->stage[2], bytes);
        }
    } else if (st == ZS_OK) {
        st = zd_backend_zero(job->be, job->m, bytes);
        if (st == ZS_OK) {
            st = zd_backend_zero(job->be, job->v, bytes);
        }
    }
    return st;
}

/* Every rank read everything: the staging copy becomes the job's state. The master is moved
 * (or copied into the params region's slices, where they are the master); m and v are moved,
 * or zeroed when the moments were not read. The job's old arrays go with l. */
static zs_status_t zd_job_take_loaded(zd_job_t *job, zd_ckpt_loaded_t *l)
{
    const zs_layout_t *lay = job->layout;
    float *t;

    if (zd_backend_device(job->be) >= 0) {
        return zd_job_copy_loaded(job, l);
    }
    if (job->master_shared) {
        for (uint32_t b = 0; b < lay->n_buckets; b++) {
            memcpy(zd_step_master(job, b), l->stage[0] + lay->buckets[b].shard_offset,
                   (size_t)lay->buckets[b].slice * sizeof(float));
        }
    } else {
        t = job->master;
        job->master = l->stage[0];
        l->stage[0] = t;
    }
    if (l->moments) {
        t = job->m;
        job->m = l->stage[1];
        l->stage[1] = t;
        t = job->v;
        job->v = l->stage[2];
        l->stage[2] = t;
    } else {
        memset(job->m, 0, (size_t)lay->shard_numel * sizeof(float));
        memset(job->v, 0, (size_t)lay->shard_numel * sizeof(float));
    }
    return ZS_OK;
}

/* A load read and agreed: into the job, then the params region gets the loaded values. */
static zs_status_t zd_job_apply_loaded(zd_job_t *job, zd_ckpt_loaded_t *l, zd_ckpt_out_t *out,
                                       char *err, size_t errlen)
{
    zs_status_t st = zd_job_take_loaded(job, l);

    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "checkpoint load: %s", zd_backend_error(job->be));
    }
    zd_step_drop_partial(job);
    job->step = l->step;
    job->skipped_steps = l->skipped_steps;
    if (job->scaler.dynamic && isfinite(l->scaler.cur_scale) && l->scaler.cur_scale > 0) {
        job->scaler.cur_scale = l->scaler.cur_scale;
        job->scaler.cur_hysteresis = l->scaler.cur_hysteresis;
        job->scaler.cur_iter = l->scaler.cur_iter;
        job->scaler.last_overflow_iter = l->scaler.last_overflow_iter;
    }
    job->params_loaded = true;
    zd_replica_resend(job); /* the buddy gets the loaded shard whole at the next step */
    st = zd_step_refresh_params(job, err, errlen);
    if (st == ZS_OK) {
        *out = l->out;
        out->step = job->step;
        out->loss_scale = job->scaler.cur_scale;
        zs_info(ZS_SUB_ENGINE, "checkpoint %s (world %u) loaded at step %" PRIu64, out->path,
                out->saved_world, job->step);
    }
    return st;
}

static zs_status_t zd_job_load(zd_job_t *job, const zd_ckpt_req_t *req, zd_ckpt_out_t *out,
                               char *err, size_t errlen)
{
    zd_ckpt_shard_t sh = zd_job_shard(job);
    zd_ckpt_loaded_t loaded;
    zs_status_t st = zd_ckpt_load(job->ck, &sh, req, &loaded, err, errlen);

    if (st == ZS_OK) { /* from here the job's state changes */
        st = zd_job_apply_loaded(job, &loaded, out, err, errlen);
        zd_ckpt_loaded_free(&loaded);
    }
    return st;
}

/* ---- the trainer's requests --------------------------------------------------------------- */

zs_status_t zd_job_ckpt_save(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);
    zd_ckpt_shard_t sh;

    if (st != ZS_OK) {
        return st;
    }
    sh = zd_job_shard(job);
    st = zd_ckpt_save(job->ck, &sh, req, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    return st;
}

zs_status_t zd_job_ckpt_load(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);

    if (st == ZS_OK) {
        st = zd_job_load(job, req, out, err, errlen);
        if (st != ZS_OK) {
            zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
        }
    }
    return st;
}

zs_status_t zd_job_ckpt_wait(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);
    zd_ckpt_shard_t sh;

    if (st != ZS_OK) {
        return st;
    }
    sh = zd_job_shard(job);
    st = zd_ckpt_wait(job->ck, &sh, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    return st;
}

zs_status_t zd_job_export(zd_job_t *job, const zd_job_env_t *env, const zd_export_req_t *req,
                          zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zd_ckpt_shard_t sh;

    memset(out, 0, sizeof(*out));
    if (job == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "export: no job on this daemon");
    }
    sh = zd_job_shard(job);
    return zd_ckpt_export(&sh, env->exec, req, out, err, errlen);
}

zs_status_t zd_job_ckpt_save_to(zd_job_t *job, const zd_ckpt_req_t *req, zd_ckpt_out_t *out,
                                char *err, size_t errlen)
{
    zd_ckpt_shard_t sh = zd_job_shard(job);

    return zd_ckpt_save(job->ck, &sh, req, out, err, errlen);
}

/* ---- the daemon's own checkpoints (checkpoint_* of the daemon config) ------------------------ */

/* Is an automatic save due after this step? Clocks differ, so with checkpoint_every_seconds
 * the ranks agree (every rank asks). */
static bool zd_job_ckpt_due(zd_job_t *job, const zd_job_env_t *env, uint64_t now)
{
    double due = env->ckpt_every_steps > 0 && job->step % env->ckpt_every_steps == 0;
    zd_reduce_op_t op = ZD_REDUCE_MAX;
    char err[ZS_MSG_MAX] = "";

    if (job->ckpt_last_ns == 0) {
        job->ckpt_last_ns = now; /* the clock starts with the job */
    }
    if (env->ckpt_every_ns > 0) {
        if (now - job->ckpt_last_ns >= env->ckpt_every_ns) {
            due = 1;
        }
        if (job->coll->ops->all_reduce(job->coll, &due, &op, 1, err, sizeof(err)) != ZS_OK) {
            zs_warn(ZS_SUB_ENGINE, "automatic checkpoint: the ranks could not agree: %s", err);
            return false;
        }
    }
    return due != 0;
}

void zd_job_ckpt_auto(zd_job_t *job, const zd_job_env_t *env)
{
    char dir[4096], err[ZS_MSG_MAX] = "";
    zd_ckpt_req_t req = {.dir = dir,
                         .dir_fd = -1,
                         .keep_last = env->ckpt_keep_last,
                         .async = env->ckpt_async,
                         .keep_staging = env->ckpt_staging_keep,
                         .latest_onward = true};
    zd_ckpt_out_t out;
    uint64_t now = zs_time_now_ns();
    zd_ckpt_shard_t sh;
    zs_status_t st;

    if (env->ckpt_dir == NULL || job->step == job->ckpt_last_step || job->coll == NULL ||
        !zd_job_ckpt_due(job, env, now)) {
        return;
    }
    job->ckpt_last_step = job->step;
    job->ckpt_last_ns = now;
    sh = zd_job_shard(job);
    st =
        zd_ckpt_own_dir(env->ckpt_dir, job->id, job->rank == 0, dir, sizeof(dir), err, sizeof(err));
    st = zd_ckpt_agree(&sh, st, "automatic checkpoint", err, sizeof(err));
    st = st == ZS_OK ? zd_ckpt_save(job->ck, &sh, &req, &out, err, sizeof(err)) : st;
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "automatic checkpoint at step %" PRIu64 " failed: %s", job->step,
                err);
    }
}

/* A resume's read failed on every rank (zd_ckpt_load agrees): does every rank try another
 * checkpoint? Only after latest's own (first), and not when the model is not the checkpoint's
 * (an older one of the job would not be either), the mesh is lost or the daemon is stopping. */
static bool zd_job_ckpt_retry(const zd_ckpt_shard_t *sh, zs_status_t st, bool first)
{
    char why[ZS_MSG_MAX] = "";
    bool mine = first && st != ZS_ERR_LAYOUT_MISMATCH && st != ZS_ERR_PEER_LOST &&
                st != ZS_ERR_ABORTED && st != ZS_ERR_TIMEOUT;

    st = zd_ckpt_agree(sh, mine ? ZS_OK : st, "resuming from checkpoint_dir", why, sizeof(why));
    return st == ZS_OK;
}

zs_status_t zd_job_ckpt_restore(zd_job_t *job, const zd_job_env_t *env, zd_ckpt_out_t *out,
                                bool *restored_p, char *err, size_t errlen)
{
    char why[ZS_MSG_MAX] = "", jdir[4096], bad[ZS_CKPT_TAG_MAX], reason[ZS_MSG_MAX];
    zd_ckpt_req_t req = {
        .dir = jdir, .dir_fd = -1, .cancel = {env->cancel, 0}, .load_optimizer_states = true};
    zd_ckpt_shard_t sh = zd_job_shard(job);
    zd_ckpt_loaded_t loaded;
    zd_ckpt_resume_t res;
    bool read;
    zs_status_t st =
        zd_ckpt_own_dir(env->ckpt_dir, job->id, false, jdir, sizeof(jdir), why, sizeof(why));

    *restored_p = false;
    out->warning[0] = '\0';
    if (st != ZS_OK) { /* the same on every rank: no checkpoint of it can exist */
        zs_warn(ZS_SUB_ENGINE, "job '%s' starts from its trainer's parameters: %s", job->id, why);
        return ZS_OK;
    }
    st = zd_ckpt_own_resume(&sh, jdir, NULL, NULL, &req.cancel, &res, why, sizeof(why));
    if (st == ZS_OK && !res.found) {
        zs_info(ZS_SUB_ENGINE,
                "job '%s' starts from its trainer's parameters: %s has no checkpoint", job->id,
                jdir);
        return ZS_OK;
    }
    req.tag = res.tag;
    read = st == ZS_OK; /* the same on every rank, as zd_ckpt_load's outcome */
    if (read) {
        st = zd_ckpt_load(job->ck, &sh, &req, &loaded, why, sizeof(why));
    }
    if (read && st != ZS_OK && zd_job_ckpt_retry(&sh, st, res.warning[0] == '\0')) {
        zs_ckpt_pathf(bad, sizeof(bad), "%s", res.tag);
        zs_ckpt_pathf(reason, sizeof(reason), "%s/%s names '%s', which did not load: %s", jdir,
                      ZS_CKPT_LATEST, bad, why);
        st = zd_ckpt_own_resume(&sh, jdir, bad, reason, &req.cancel, &res, why, sizeof(why));
        if (st == ZS_OK) {
            st = zd_ckpt_load(job->ck, &sh, &req, &loaded, why, sizeof(why));
        }
    }
    if (st == ZS_OK) { /* from here the job's state changes */
        st = zd_job_apply_loaded(job, &loaded, out, why, sizeof(why));
        zd_ckpt_loaded_free(&loaded);
    }
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "job '%s': resuming from %s failed: %s", job->id, jdir, why);
        return zs_errf(err, errlen, st, "job '%s' cannot resume: %s", job->id, why);
    }
    if (res.warning[0] != '\0') {
        zs_warn(ZS_SUB_ENGINE, "job '%s': %s", job->id, res.warning);
        snprintf(out->warning, sizeof(out->warning), "%s", res.warning);
    }
    *restored_p = true;
    zs_info(ZS_SUB_ENGINE, "job '%s' resumed from %s at step %" PRIu64, job->id, out->path,
            job->step);
    return ZS_OK;
}
