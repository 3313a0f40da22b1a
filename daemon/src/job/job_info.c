/*
 * What a job says about itself (job/job.h): its status for `zeroctl status` and the metrics, its
 * shard's layout and master for `zeroctl shard`, and whether a connection holds it as its
 * trainer.
 */
#define _GNU_SOURCE
#include "job/job_info.h"
#include "job/job_int.h"
#include "zs/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- what the job says about itself -------------------------------------------------------- */

zs_status_t zd_job_require_trainer(const zd_job_t *job, uint64_t conn, bool loaded, char *err,
                                   size_t errlen)
{
    if (job == NULL || job->attached_conn != conn) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "no job attached on this connection (send Attach first)");
    }
    if (job->mesh_lost) {
        return zs_errf(err, errlen, ZS_ERR_PEER_LOST,
                       "%s; job '%s' is at step %llu: re-attach every rank to continue",
                       job->mesh_why, job->id, (unsigned long long)job->step);
    }
    if (loaded && !job->params_loaded) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "job '%s' has no initial parameters yet (send ParamsReady after writing "
                       "them into the params region)",
                       job->id);
    }
    return ZS_OK;
}

void zd_job_status(const zd_job_t *job, zd_job_status_t *s)
{
    snprintf(s->job_id, sizeof(s->job_id), "%s", job->id);
    s->rank = job->rank;
    s->world = job->world;
    s->stage = job->cfg.stage;
    s->dtype = job->dtype;
    s->step = job->step;
    s->skipped_steps = job->skipped_steps;
    s->loss_scale = job->scaler.cur_scale;
    s->grad_norm = job->last_grad_norm;
    s->stats = job->stats;
    s->trainer_attached = job->attached_conn != 0;
    s->param_numel = job->layout->param_numel;
    s->layout_hash = job->layout->hash;
    snprintf(s->collectives, sizeof(s->collectives), "%s",
             job->coll != NULL ? job->coll->algo
             : job->mesh_lost  ? "none (the mesh was lost: trainers must re-attach)"
                               : "none (no mesh yet)");
    memcpy(s->mem_bytes, job->mem_bytes, sizeof(s->mem_bytes));
    memcpy(s->mem_formula, job->mem_formula, sizeof(s->mem_formula));
    s->params_shared = job->params_shared;
    zd_replica_status(job, s);
    s->created_ns = job->created_ns;
    s->released_ns = job->attached_conn != 0 ? 0 : job->released_ns;
    s->linger_until_ns = job->attached_conn != 0 ? 0 : job->linger_until_ns;
    s->kept = job->kept;
    s->mesh_lost = job->mesh_lost;
    s->mesh_up = job->coll != NULL;
    s->trainer_pid = job->attached_conn != 0 ? job->trainer_pid : 0;
    snprintf(s->coordinator, sizeof(s->coordinator), "%s", job->coordinator);
    s->train_batch_size = job->cfg.train_batch_size;
    zd_backend_mem_info(job->be, &s->device_free, &s->device_total);
}

void zd_shard_out_free(zd_shard_out_t *out)
{
    free(out->groups);
    free(out->training_config);
    out->groups = NULL;
    out->training_config = NULL;
}

zs_status_t zd_job_shard_info(const zd_job_t *job, zd_shard_out_t *out, char *err, size_t errlen)
{
    const zs_layout_t *l;
    double sumsq = 0;
    int nonfinite = 0;

    memset(out, 0, sizeof(*out));
    if (job == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "no job on this daemon");
    }
    l = job->layout;
    out->groups = calloc(l->n_groups, sizeof(*out->groups));
    if (out->groups == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    snprintf(out->job_id, sizeof(out->job_id), "%s", job->id);
    out->rank = job->rank;
    out->world = job->world;
    out->total_numel = l->total_numel;
    out->param_numel = l->param_numel;
    out->shard_numel = l->shard_numel;
    out->n_buckets = l->n_buckets;
    out->max_bucket_numel = l->max_bucket_numel;
    out->bucket_size = l->bucket_size;
    out->layout_hash = l->hash;
    out->n_groups = l->n_groups;
    for (uint32_t g = 0; g < l->n_groups; g++) {
        out->groups[g] = (zd_group_shard_t){
            l->groups[g].n_params,   l->groups[g].n_buckets,         l->groups[g].flat_offset,
            l->groups[g].flat_numel, l->groups[g].shard_offset,      l->groups[g].shard_numel,
            job->group_opts[g].lr,   job->group_opts[g].weight_decay};
    }
    zd_step_master_sumsq(job, &sumsq, &nonfinite);
    out->master_sumsq = nonfinite ? NAN : sumsq;
    out->training_config = job->cfg_explained != NULL ? strdup(job->cfg_explained) : NULL;
    return ZS_OK;
}
