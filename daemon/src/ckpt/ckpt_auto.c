/*
 * The daemons' own checkpoints (docs/checkpoints.md "Checkpoints the daemons take themselves"):
 * checkpoint_dir/<job id>, saved every checkpoint_every_* and resumed from when a job's daemons
 * start afresh. The directory is the daemon's own: it is used with the daemon's rights.
 */
#define _GNU_SOURCE
#include "job/job_int.h"
#include "zs/error.h"
#include "zs/time.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* checkpoint_dir/<job id>: the daemons' own checkpoints of one job (made when missing). */
static zs_status_t zd_ckpt_job_dir(const zd_job_t *job, const char *dir, bool make, char *out,
                                   size_t len, char *err, size_t errlen)
{
    if (!zs_ckpt_pathf(out, len, "%s/%s", dir, job->id) || strlen(out) > ZD_CKPT_DIR_MAX ||
        zs_ckpt_tag_check(job->id, err, errlen) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "job id '%s' cannot name a directory under checkpoint_dir %s", job->id, dir);
    }
    if (make && (mkdir(dir, 0750) != 0 && errno != EEXIST)) {
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint_dir %s: %s", dir, strerror(errno));
    }
    if (make && (mkdir(out, 0750) != 0 && errno != EEXIST)) {
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint dir %s: %s", out, strerror(errno));
    }
    return ZS_OK;
}

void zd_ckpt_auto(zd_job_t *job, const zd_job_env_t *env)
{
    char dir[4096];
    zd_ckpt_req_t req = {.dir = dir,
                         .dir_fd = -1,
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
    st = zd_ckpt_job_dir(job, env->ckpt_dir, job->rank == 0, dir, sizeof(dir), err, sizeof(err));
    st = zd_ckpt_agree(job, st, "automatic checkpoint", err, sizeof(err));
    st = st == ZS_OK ? zd_ckpt_save(job, &req, &out, err, sizeof(err)) : st;
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "automatic checkpoint at step %" PRIu64 " failed: %s", job->step,
                err);
    }
}

zs_status_t zd_ckpt_restore(zd_job_t *job, const char *dir, const zs_cancel_t *cancel,
                            zd_ckpt_out_t *out, bool *restored_p)
{
    char tag[ZS_CKPT_TAG_MAX], err[ZD_MAX_MSG] = "", jdir[4096];
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t d = ZS_DIR_INIT, ckpt = ZS_DIR_INIT;
    zd_ckpt_req_t req = {.dir = jdir, .dir_fd = -1, .load_optimizer_states = true};
    zs_status_t st;

    *restored_p = false;
    if (cancel != NULL) {
        req.cancel = *cancel;
    }
    st = zd_ckpt_job_dir(job, dir, false, jdir, sizeof(jdir), err, sizeof(err));
    if (st == ZS_OK) {
        st = zs_dir_open(&d, jdir, err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_ckpt_open(&d, NULL, &ckpt, tag, sizeof(tag), err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(&ckpt, &m, err, sizeof(err));
    }
    if (st == ZS_OK && strcmp(m->job_id, job->id) != 0) {
        st = zs_errf(err, sizeof(err), ZS_ERR_NOT_FOUND, "%s is job '%s''s, not '%s''s", ckpt.shown,
                     m->job_id, job->id);
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    zs_dir_close(&d);
    /* every rank must find one, or none loads */
    st = zd_ckpt_agree(job, st, "resuming from checkpoint_dir", err, sizeof(err));
    if (st != ZS_OK) {
        zs_info(ZS_SUB_ENGINE, "job '%s' starts from its trainer's parameters: %s", job->id, err);
        return st == ZS_ERR_PEER_LOST ? st : ZS_OK;
    }
    st = zd_ckpt_load(job, &req, out, err, sizeof(err));
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "job '%s': resuming from %s failed: %s", job->id, jdir, err);
        return st;
    }
    *restored_p = true;
    zs_info(ZS_SUB_ENGINE, "job '%s' resumed from %s at step %" PRIu64, job->id, out->path,
            job->step);
    return ZS_OK;
}
