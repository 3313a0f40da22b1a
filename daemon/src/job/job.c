/*
 * The lifecycle of the daemon's job (job/job.h): attach (a new job, job/job_create.c, or a
 * re-attach), trainer checks, detach, linger, drop. The mesh is in job/job_mesh.c, the status in
 * job/job_info.c, the arithmetic in job/step.c.
 */
#define _GNU_SOURCE
#include "job/job.h"
#include "job/job_int.h"
#include "mesh/mesh.h"
#include "obs/testpoint.h"
#include "zs/error.h"
#include "zs/time.h"
#include "zs/version.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void zd_job_drop(zd_job_t **job_p, const char *why)
{
    zd_job_t *job = *job_p;

    if (job == NULL) {
        return;
    }
    zs_info(ZS_SUB_ENGINE, "job '%s' ends (%s) at step %llu", job->id, why,
            (unsigned long long)job->step);
    /* a checkpoint being written reports to the other ranks over the mesh: it finishes before
     * this rank leaves it */
    zd_ckpt_settle(job->ck);
    zd_mesh_leave(job->mesh);
    zd_job_destroy(job);
    *job_p = NULL;
    zs_log_set_rank(-1);
}

/* ---- attach -------------------------------------------------------------------------------- */

zs_status_t zd_job_check_reattach(const zd_job_t *job, uint64_t conn, const zd_job_spec_t *spec,
                                  char *err, size_t errlen)
{
    zd_train_config_t cfg;
    zs_layout_spec_t ls;
    uint64_t hash;
    zs_status_t st;

    if (job->attached_conn != 0 && !(job->mesh_lost && job->attached_conn == conn)) {
        return zs_errf(err, errlen, ZS_ERR_BUSY, "busy: job '%s' is attached by another trainer",
                       job->id);
    }
    if (spec->rank != job->rank || spec->world != job->world) {
        return zs_errf(err, errlen, ZS_ERR_LAYOUT_MISMATCH,
                       "re-attach of job '%s' as rank %u of %u, but the job is rank %u of %u",
                       job->id, spec->rank, spec->world, job->rank, job->world);
    }
    /* compare hashes computed from the request, without allocating a second job */
    st = zd_train_config_parse(spec->config_json, &cfg, NULL, 0, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&ls, 0, sizeof(ls));
    ls.world = spec->world;
    ls.bucket_size = cfg.reduce_bucket_size;
    ls.elem_align = ZS_ELEM_ALIGN;
    ls.round_robin = cfg.round_robin_gradients;
    ls.n_groups = spec->n_groups;
    ls.group_n_params = spec->group_n_params;
    ls.numel = spec->numel;
    hash = zs_layout_spec_hash(&ls);
    if (hash != job->layout->hash) {
        return zs_errf(err, errlen, ZS_ERR_LAYOUT_MISMATCH,
                       "re-attach of job '%s' with layout hash 0x%016llx, but the job has layout "
                       "hash 0x%016llx",
                       job->id, (unsigned long long)hash, (unsigned long long)job->layout->hash);
    }
    if (zd_train_config_hash(&cfg) != job->config_hash || spec->dtype != job->dtype) {
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "re-attach of job '%s' with config hash 0x%016llx (dtype %s), but the job "
                       "has config hash 0x%016llx (dtype %s)",
                       job->id, (unsigned long long)zd_train_config_hash(&cfg),
                       zs_dtype_name(spec->dtype), (unsigned long long)job->config_hash,
                       zs_dtype_name(job->dtype));
    }
    return ZS_OK;
}

static int zd_dup_fd(int fd)
{
    return fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

static void zd_job_attach_out(const zd_job_t *job, bool resumed, zd_attach_out_t *out)
{
    memset(out, 0, sizeof(*out));
    out->layout_hash = job->layout->hash;
    out->step = job->step;
    /* a job whose first trainer died before ParamsReady has no values yet: its next trainer
     * starts it like a fresh one (writes the initial values, ParamsReady) */
    out->resumed = resumed && job->params_loaded;
    out->loss_scale = job->scaler.cur_scale;
    out->n_slots = job->n_slots;
    out->slot_bytes = job->slot_bytes;
    out->params_bytes = job->params.size;
    out->grads_bytes = job->grads.size;
    out->stage = job->cfg.stage;
    out->gradient_accumulation_steps = job->cfg.gradient_accumulation_steps;
    out->config_hash = job->config_hash;
    out->bucket_size = job->cfg.reduce_bucket_size;
    out->round_robin = job->cfg.round_robin_gradients;
    out->elem_align = job->layout->elem_align;
    out->params_are_master = job->master_shared;
    out->params_shared = job->params_shared;
    out->replicated = job->rep.on;
    out->memory = zd_backend_mem(job->be);
    out->device = zd_backend_device(job->be);
    snprintf(out->ignored_keys, sizeof(out->ignored_keys), "%s", job->cfg_ignored);
    out->train_batch_size = job->cfg.train_batch_size;
    out->micro_batch_size = job->cfg.micro_batch_size;
    out->grads_dtype = job->cfg.grad_accum_dtype;
    out->fds[out->n_fds++] = zd_dup_fd(job->params.fd);
    out->fds[out->n_fds++] = zd_dup_fd(job->slots.fd);
    if (job->grads.fd >= 0) {
        out->fds[out->n_fds++] = zd_dup_fd(job->grads.fd);
    }
}

/* arg: a copy of the file where the plan is kept for a restarted daemon, or NULL. */
static void zd_job_stores_measured(const zk_store_plan_t *plan, void *arg)
{
    char *file = arg;

    zs_info(ZS_SUB_ENGINE, "kernel stores: %s", plan->how);
    if (file != NULL && zk_store_plan_save(plan, file, "zerod " ZS_VERSION) != 0) {
        zs_warn(ZS_SUB_ENGINE,
                "kernel stores: not kept in %s (%s): a restarted daemon measures "
                "them again",
                file, strerror(errno));
    }
    free(file);
}

/* A shard big enough for the kernels' store plan to matter: start measuring it now, on a
 * thread of its own (about 6 s of one core on an AMD EPYC VM, ties timed again; the steps
 * meanwhile use regular stores, and no peer waits for it), and say what it chose. */
static void zd_job_log_stores(const zd_job_t *job, const zd_job_env_t *env)
{
    uint64_t adam_bytes = job->layout->shard_numel * (32 + zs_dtype_size(job->dtype));
    char *file;
    int rc;

    if (adam_bytes < ZK_STORES_PLAN_MIN_BYTES || zk_store_plan_measured() != NULL) {
        return;
    }
    file = env->stores_file != NULL ? strdup(env->stores_file) : NULL;
    rc = zk_store_plan_start(zd_job_stores_measured, file);
    if (rc <= 0) {
        free(file);
    }
    if (rc < 0) {
        zs_warn(ZS_SUB_ENGINE, "kernel stores: no thread to measure them; regular stores until "
                               "a large call measures them");
    }
}

static zs_status_t zd_job_attach_new(zd_job_t **job_p, const zd_job_env_t *env,
                                     const zd_job_spec_t *spec, char *err, size_t errlen)
{
    zd_job_t *job = NULL;
    zs_status_t st;

    st = zd_job_create(spec, env, &job, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "attach of job '%s' refused: %s", spec->job_id,
                        err);
        return st;
    }
    zs_log_set_rank((int)job->rank);
    /* the trace is this job's now: a recovery while the mesh forms is its first spans */
    zd_trace_begin(job->trace, job->id, job->rank, job->world);
    st = zd_job_form_mesh(job, env, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "attach of job '%s' failed: %s", spec->job_id,
                        err);
        zd_job_destroy(job);
        zs_log_set_rank(-1);
        return st;
    }
    zs_info(ZS_SUB_ENGINE,
            "job '%s' attached: rank %u/%u, %s, stage %u, %llu params in %u buckets, shard %llu "
            "elements, layout 0x%016llx",
            job->id, job->rank, job->world, zs_dtype_name(job->dtype), job->cfg.stage,
            (unsigned long long)job->layout->param_numel, job->layout->n_buckets,
            (unsigned long long)job->layout->shard_numel, (unsigned long long)job->layout->hash);
    zd_job_log_stores(job, env);
    *job_p = job;
    return ZS_OK;
}

zs_status_t zd_job_attach(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn,
                          const zd_job_spec_t *spec, zd_attach_out_t *out, char *err, size_t errlen)
{
    char replaced[ZS_MSG_MAX] = "";
    zd_job_t *job;
    bool resumed;
    zs_status_t st;

    /* busy, nothing to resume, or the kept job replaced (job/job_ctl.c); with buddy replicas a
     * restart at another world takes the job over in memory (job/job_reshape.c), and then
     * re-attaches to it below */
    if (zd_job_reshape_wanted(*job_p, env, spec)) {
        st = zd_job_reshape(job_p, env, spec, err, errlen);
    } else {
        st = zd_job_attach_decide(job_p, env, conn, spec, replaced, sizeof(replaced), err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    job = *job_p;
    resumed = job != NULL;
    if (job == NULL) {
        st = zd_job_attach_new(job_p, env, spec, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        job = *job_p;
    } else {
        st = zd_job_check_reattach(job, conn, spec, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        st = zd_job_form_mesh(job, env, err, errlen);
        if (st != ZS_OK) {
            zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "re-attach of job '%s' failed: %s",
                            spec->job_id, err);
            return st;
        }
        job->stats.reattaches++;
        zs_info(ZS_SUB_ENGINE, "job '%s' re-attached at step %llu", job->id,
                (unsigned long long)job->step);
    }
    job->attached_conn = conn;
    job->released_ns = 0;
    job->kept = false;
    job->trainer_pid = spec->trainer_pid;
    /* a fresh job whose shard came from its buddy continues like a kept one */
    zd_job_attach_out(job, resumed || job->recovered, out);
    snprintf(out->replaced, sizeof(out->replaced), "%s", replaced);
    return ZS_OK;
}

/* ---- the trainer's requests -------------------------------------------------------------- */

/* conn holds the job, its mesh is up, and (loaded) the job has its parameters. */
zs_status_t zd_job_params_ready(zd_job_t *job, const zd_job_env_t *env, uint64_t conn, bool reload,
                                zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, false, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    out->path[0] = '\0';
    if (reload) {
        if (!job->params_loaded) {
            return zs_errf(err, errlen, ZS_ERR_STATE,
                           "job '%s' has no parameters to reload yet (send ParamsReady first)",
                           job->id);
        }
        st = zd_step_reload_master(job, err, errlen);
        zd_replica_resend(job);
        out->step = job->step;
        out->loss_scale = job->scaler.cur_scale;
        return st;
    }
    if (job->params_loaded) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "job '%s' already has its parameters (a resumed job keeps them)", job->id);
    }
    st = zd_step_load_params(job, err, errlen);
    if (st == ZS_OK && env->ckpt_dir != NULL) {
        bool restored = false;
        st = zd_job_ckpt_restore(job, env, out, &restored, err, errlen);
        if (st == ZS_OK && !restored) {
            out->path[0] = '\0';
        }
    }
    out->step = job->step;
    out->loss_scale = job->scaler.cur_scale;
    return st;
}

zs_status_t zd_job_bucket_ready(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                uint32_t slot, uint32_t bucket, uint32_t micro_step, char *err,
                                size_t errlen)
{
    return zd_job_bucket_ready_event(job, env, conn, slot, bucket, micro_step, NULL, 0, err,
                                     errlen);
}

/* BucketReady.event: nothing, or the trainer's event to wait for (device jobs only). */
static zs_status_t zd_job_slot_event(zd_job_t *job, const zd_job_env_t *env, uint32_t slot,
                                     const uint8_t *event, uint32_t event_len, char *err,
                                     size_t errlen)
{
    if (event_len == 0) {
        return ZS_OK;
    }
    if (event_len != ZD_EVENT_HANDLE_BYTES) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "BucketReady.event: %u bytes, not an interprocess CUDA event handle (%d)",
                       event_len, ZD_EVENT_HANDLE_BYTES);
    }
    if (zd_backend_device(job->be) < 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "BucketReady.event: job '%s' is on the CPU backend, whose slots are host "
                       "memory (no CUDA event to wait for)",
                       job->id);
    }
    zs_status_t st = zd_backend_wait_event(job->be, slot, event, env->collective_timeout_ns);

    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "slot %u: %s", slot, zd_backend_error(job->be));
    }
    return ZS_OK;
}

zs_status_t zd_job_bucket_ready_event(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                      uint32_t slot, uint32_t bucket, uint32_t micro_step,
                                      const uint8_t *event, uint32_t event_len, char *err,
                                      size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);
    char why[ZS_MSG_MAX];

    if (st != ZS_OK) {
        return st;
    }
    if (job->cfg.stage == 1) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "BucketReady in stage 1: gradients go in the grads region until Step");
    }
    if (slot >= job->n_slots) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "BucketReady.slot %u is out of range (%u slots)", slot, job->n_slots);
    }
    if (bucket >= job->layout->n_buckets) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "BucketReady.bucket %u is unknown (layout has %u)", bucket,
                       job->layout->n_buckets);
    }
    if (micro_step >= job->cfg.gradient_accumulation_steps) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "BucketReady.micro_step %u is out of range (gradient_accumulation_steps "
                       "%u)",
                       micro_step, job->cfg.gradient_accumulation_steps);
    }
    st = zd_job_slot_event(job, env, slot, event, event_len, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    st = zd_step_reduce_slot(job, slot, bucket, micro_step, env->req_arrived_ns, why, sizeof(why));
    return st == ZS_OK ? st : zs_errf(err, errlen, st, "bucket %u: %s", bucket, why);
}

bool zd_job_idle_work(zd_job_t *job)
{
    if (job == NULL || zd_test_phase("noidle")) {
        return false;
    }
    return zd_step_idle_norm(job) || zd_replica_idle(job);
}

static zs_status_t zd_job_step_checked(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                       const double *group_lr, size_t n_group_lr,
                                       zd_step_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = zd_job_require_trainer(job, conn, true, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    if (n_group_lr != 0 && n_group_lr != job->layout->n_groups) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "Step.group_lr has %zu entries; the job has %u groups", n_group_lr,
                       job->layout->n_groups);
    }
    for (size_t g = 0; g < n_group_lr; g++) {
        if (!isfinite(group_lr[g]) || group_lr[g] < 0) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "Step.group_lr[%zu] = %g is not a finite lr >= 0", g, group_lr[g]);
        }
    }
    st = zd_step_run(job, n_group_lr != 0 ? group_lr : NULL, out, err, errlen);
    if (st != ZS_OK) {
        zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    zs_debug(ZS_SUB_ENGINE, "step %llu: skipped=%d grad_norm=%g loss_scale=%g",
             (unsigned long long)job->step, out->skipped, out->grad_norm, job->scaler.cur_scale);
    return st;
}

zs_status_t zd_job_step(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                        const double *group_lr, size_t n_group_lr, zd_step_out_t *out, char *err,
                        size_t errlen)
{
    zs_status_t st = zd_job_step_checked(job, env, conn, group_lr, n_group_lr, out, err, errlen);

    if (st == ZS_OK && !out->skipped && env->ckpt_dir != NULL) {
        zd_job_ckpt_auto(job, env);
    }

    if (job != NULL) { /* where the job stands, whatever happened */
        out->step = job->step;
        out->loss_scale = job->scaler.cur_scale;
        out->skipped_steps = job->skipped_steps;
    }
    return st;
}

/* The trainer is gone (disconnected, or detached keeping the job): drop its partial micro-step
 * and keep the job for job_linger. */
static void zd_job_release_trainer(zd_job_t *job, const zd_job_env_t *env)
{
    zd_step_drop_partial(job);
    zd_step_stats_reset_window(job);
    job->attached_conn = 0;
    job->released_ns = zs_time_now_ns();
    job->linger_until_ns = job->released_ns + env->job_linger_ns;
}

zs_status_t zd_job_detach(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn, bool end_job,
                          char *err, size_t errlen)
{
    zd_job_t *job = *job_p;

    /* a detach works on a job whose mesh was lost too: that is how a job ends after a fault */
    if (job == NULL || job->attached_conn != conn) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "no job attached on this connection (send Attach first)");
    }
    if (end_job) {
        zd_job_drop(job_p, "trainer detached");
    } else {
        /* the mesh stays up (its heartbeat beats on): the trainers of every rank detach between
         * steps and a later re-attach continues on the same mesh */
        zd_job_release_trainer(job, env);
        job->kept = true; /* on purpose: RESUME_AUTO re-attaches it (job/job_ctl.c) */
    }
    return ZS_OK;
}

void zd_job_disconnect(zd_job_t *job, const zd_job_env_t *env, uint64_t conn)
{
    if (job == NULL || job->attached_conn != conn) {
        return;
    }
    if (job->mesh != NULL) {
        zd_mesh_abort(job->mesh, job->rank, "rank %u: its trainer disconnected", job->rank);
        zd_job_mesh_failed(job, env);
    }
    zd_job_release_trainer(job, env);
    zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE,
                    "trainer of job '%s' disconnected at step %llu; partial micro-step dropped; "
                    "keeping the job %.0f s for a re-attach",
                    job->id, (unsigned long long)job->step, (double)env->job_linger_ns * 1e-9);
}

/* ---- between requests ---------------------------------------------------------------------- */

uint64_t zd_job_tick(zd_job_t **job_p, const zd_job_env_t *env)
{
    zd_job_t *job = *job_p;
    uint64_t now;

    if (job == NULL) {
        return UINT64_MAX;
    }
    if (job->mesh != NULL) {
        zd_mesh_tick(job->mesh);
        if (!zd_mesh_ended(job->mesh, NULL, 0) && zd_mesh_aborted(job->mesh, NULL, 0)) {
            zd_job_mesh_failed(job, env);
        }
    }
    if (zd_job_ended_by_peer(job_p, env)) { /* a peer's END, here or in a request */
        return UINT64_MAX;
    }
    if (job->attached_conn != 0) {
        return UINT64_MAX;
    }
    now = zs_time_now_ns();
    if (now >= job->linger_until_ns) {
        zd_job_drop(job_p, "job_linger passed with no trainer");
        return UINT64_MAX;
    }
    return job->linger_until_ns - now;
}

int zd_job_poll_fd(zd_job_t *job)
{
    return job != NULL && job->mesh != NULL ? zd_mesh_arm(job->mesh) : -1;
}
