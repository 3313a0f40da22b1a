/*
 * The arithmetic of a job (docs/semantics.md §4): loading the master from the params region, the
 * reduce-scatter of gradient buckets into the accumulator, and the optimizer step -- overflow
 * check, loss scaler, global norm, clip, Adam on this rank's shard, cast, all-gather.
 */
#define _GNU_SOURCE
#include "job/job_int.h"
#include "obs/testpoint.h"
#include "zs/error.h"
#include "zs/time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One collective call of dur_ns, wait_ns of it waiting for the peers (the collective's own
 * measure), into the job's totals; returns the wait, at most dur_ns. */
static uint64_t zd_step_xfer_note(zd_step_stats_t *s, zd_xfer_t x, uint64_t dur_ns,
                                  uint64_t wait_ns, uint64_t bytes)
{
    wait_ns = wait_ns < dur_ns ? wait_ns : dur_ns;
    s->xfer_bytes[x] += bytes;
    s->xfer_wait_ns[x] += wait_ns;
    s->xfer_busy_ns[x] += dur_ns - wait_ns;
    return wait_ns;
}

/* All-gather bucket b of the params region (its span: the job's step; flags ZD_TRACE_*). */
static zs_status_t zd_step_gather_bucket(zd_job_t *job, uint32_t b, uint16_t flags, char *err,
                                         size_t errlen)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    void *dst = zd_step_bucket_ptr(job, &job->params, b);
    zd_trace_span_t span = {.kind = ZD_TRACE_ALL_GATHER, .step = job->step, .bucket = b};
    zs_status_t st;

    span.bytes = (uint64_t)job->world * bk->slice * zs_dtype_size(job->dtype);
    span.start_ns = zs_time_now_ns();
    st = job->coll->ops->all_gather(job->coll, dst, job->dtype, bk->slice, err, errlen);
    span.dur_ns = zs_time_now_ns() - span.start_ns;
    span.flags = (uint16_t)(flags | (st != ZS_OK ? ZD_TRACE_FAILED : 0));
    zd_trace_add(job->trace, &span);
    job->stats.win_ag_wait_ns += zd_step_xfer_note(&job->stats, ZD_XFER_ALL_GATHER, span.dur_ns,
                                                   job->coll->wait_ns, span.bytes);
    job->stats.win_ag_ns += span.dur_ns;
    job->stats.win_ag_bytes += span.bytes;
    return st;
}

/* One params region for every rank: each slice is in place once every rank wrote its own, so
 * the all-gather is a barrier, one span of the job's trace (flag BARRIER), all of it a wait for
 * the peers and no bytes. An all-reduce of nothing over the collectives' own path (their
 * progress and deadline, as the norm's), not the mesh's control barrier, which spins on
 * sched_yield for 2 ms while the trainers want the cores. */
static zs_status_t zd_step_gather_shared(zd_job_t *job, uint16_t flags, char *err, size_t errlen)
{
    static const zd_reduce_op_t max_op = ZD_REDUCE_MAX;
    zd_trace_span_t span = {.kind = ZD_TRACE_ALL_GATHER, .step = job->step, .bucket = 0};
    double none = 0.0;
    zs_status_t st;

    span.start_ns = zs_time_now_ns();
    st = job->coll->ops->all_reduce(job->coll, &none, &max_op, 1, err, errlen);
    span.dur_ns = zs_time_now_ns() - span.start_ns;
    span.flags = (uint16_t)(flags | ZD_TRACE_BARRIER | (st != ZS_OK ? ZD_TRACE_FAILED : 0));
    zd_trace_add(job->trace, &span);
    zd_step_xfer_note(&job->stats, ZD_XFER_ALL_GATHER, span.dur_ns, span.dur_ns, 0);
    job->stats.win_ag_ns += span.dur_ns;
    job->stats.win_ag_wait_ns += span.dur_ns;
    return st;
}

zs_status_t zd_step_refresh_params(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    zs_status_t st = ZS_OK;

    job->params_stale = true;
    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        if (!job->master_shared) {
            st = zd_backend_cast(job->be, zd_step_slice_ptr(job, &job->params, b), job->dtype,
                                 zd_step_master(job, b), ZS_DTYPE_F32, bk->slice);
        }
        if (st != ZS_OK) {
            return zs_errf(err, errlen, st, "cast: %s", zd_backend_error(job->be));
        }
        if (!job->params_shared) {
            st = zd_step_gather_bucket(job, b, ZD_TRACE_REFRESH, err, errlen);
        }
    }
    if (st == ZS_OK && job->params_shared) {
        st = zd_step_gather_shared(job, ZD_TRACE_REFRESH, err, errlen);
    }
    if (st == ZS_OK) {
        job->params_stale = false;
    }
    return st;
}

zs_status_t zd_step_reload_master(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    zs_status_t st = ZS_OK;

    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK && !job->master_shared; b++) {
        st = zd_backend_cast(job->be, zd_step_master(job, b), ZS_DTYPE_F32,
                             zd_step_slice_ptr(job, &job->params, b), job->dtype,
                             l->buckets[b].slice);
    }
    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "loading parameters: %s", zd_backend_error(job->be));
    }
    return ZS_OK;
}

zs_status_t zd_step_load_params(zd_job_t *job, char *err, size_t errlen)
{
    zs_status_t st = zd_step_reload_master(job, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    job->params_loaded = true;
    if (job->world > 1) {
        st = zd_step_refresh_params(job, err, errlen);
    }
    return st;
}

/* A span of bucket b for the step being built, from t0 to t1. */
static void zd_step_trace_bucket(const zd_job_t *job, zd_trace_kind_t kind, uint64_t t0,
                                 uint64_t t1, uint32_t b, uint64_t bytes, uint16_t flags)
{
    zd_trace_span_t span = {.kind = (uint16_t)kind,
                            .start_ns = t0,
                            .dur_ns = t1 - t0,
                            .step = job->step + 1,
                            .bucket = b,
                            .bytes = bytes,
                            .flags = flags};

    zd_trace_add(job->trace, &span);
}

/* Slice b's sum of squares and non-finite flag into job->slice_norm[b]. */
static zs_status_t zd_step_slice_norm(zd_job_t *job, uint32_t b, char *err, size_t errlen)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    zd_slice_norm_t *sn = &job->slice_norm[b];
    int nonfinite = 0;
    zs_status_t st =
        zd_backend_sumsq(job->be, job->acc + bk->shard_offset, bk->slice, &sn->sumsq, &nonfinite);

    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "step %llu: kernel failed: %s (%s)",
                       (unsigned long long)job->step + 1, zs_status_string(st),
                       zd_backend_error(job->be));
    }
    sn->nonfinite = nonfinite != 0;
    sn->fresh = 1;
    return ZS_OK;
}

bool zd_step_idle_norm(zd_job_t *job)
{
    char err[ZS_MSG_MAX];

    for (uint32_t b = 0; job->slice_norm != NULL && b < job->layout->n_buckets; b++) {
        if (job->slice_norm[b].due) {
            job->slice_norm[b].due = 0;
            (void)zd_step_slice_norm(job, b, err, sizeof(err)); /* else: at the step */
            return true;
        }
    }
    return false;
}

/* Reduce-scatter `src` (bucket b of this rank, in dtype) into the accumulator: the first
 * contribution of an accumulation window overwrites (no read of a zero accumulator), later ones
 * add. `last`: the window's last contribution, whose slice's sum of squares the collective
 * takes in the same pass where it can (the direct path); else it is due (the step's norm then
 * only adds the slices' sums, taken while the runner had nothing else to do). */
static zs_status_t zd_step_reduce_bucket(zd_job_t *job, const void *src, zs_dtype_t dtype,
                                         uint32_t b, bool last, char *err, size_t errlen)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    unsigned flags = job->acc_clean[b] ? ZD_COLL_OVERWRITE : 0;
    zd_step_stats_t *s = &job->stats;
    uint64_t bytes = (uint64_t)job->world * bk->slice * zs_dtype_size(dtype);
    uint64_t t0 = zs_time_now_ns(), t1;
    zd_coll_norm_t norm = {.done = false};
    zs_status_t st;

    job->acc_clean[b] = 0;
    job->slice_norm[b].fresh = 0;
    job->slice_norm[b].due = 0;
    st = job->coll->ops->reduce_scatter(job->coll, src, dtype, bk->slice,
                                        job->acc + bk->shard_offset, flags, last ? &norm : NULL,
                                        err, errlen);
    t1 = zs_time_now_ns();
    zd_step_trace_bucket(job, ZD_TRACE_REDUCE_SCATTER, t0, t1, b, bytes,
                         st != ZS_OK ? ZD_TRACE_FAILED : 0);
    s->window_ns = s->window_ns != 0 ? s->window_ns : t0; /* the window's first bucket */
    s->win_rs_ns += t1 - t0;
    s->win_rs_wait_ns +=
        zd_step_xfer_note(s, ZD_XFER_REDUCE_SCATTER, t1 - t0, job->coll->wait_ns, bytes);
    s->win_rs_bytes += bytes;
    if (st == ZS_OK && norm.done) {
        job->slice_norm[b] = (zd_slice_norm_t){
            .sumsq = norm.sumsq, .nonfinite = norm.nonfinite != 0, .fresh = 1, .due = 0};
    } else {
        job->slice_norm[b].due = st == ZS_OK && last;
    }
    return st;
}

/* Adam leaves the last step's gradients in the accumulator (one write stream fewer) and marks
 * every slice clean, so that its next reduce-scatter overwrites it. A slice that got no
 * contribution since still holds them: zero it before the step reads the accumulator. */
static zs_status_t zd_step_zero_stale(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;

    for (uint32_t b = 0; job->acc_stale && b < l->n_buckets; b++) {
        if (job->acc_clean[b]) {
            zs_status_t st = zd_backend_zero(job->be, job->acc + l->buckets[b].shard_offset,
                                             l->buckets[b].slice * sizeof(float));
            if (st != ZS_OK) {
                return zs_errf(err, errlen, st, "step %llu: %s", (unsigned long long)job->step + 1,
                               zd_backend_error(job->be));
            }
            job->slice_norm[b] =
                (zd_slice_norm_t){.sumsq = 0.0, .nonfinite = 0, .fresh = 1, .due = 0};
        }
    }
    job->acc_stale = false;
    return ZS_OK;
}

zs_status_t zd_step_reduce_slot(zd_job_t *job, uint32_t slot, uint32_t bucket, uint32_t micro_step,
                                uint64_t arrived_ns, char *err, size_t errlen)
{
    const char *src = (const char *)job->slots.addr + (uint64_t)slot * job->slot_bytes;

    if (job->trace != NULL && arrived_ns != 0) { /* its wait for the runner since it arrived */
        zd_trace_span_t span = {.kind = ZD_TRACE_BUCKET,
                                .start_ns = arrived_ns,
                                .step = job->step + 1,
                                .bucket = bucket,
                                .micro_step = micro_step};
        uint64_t now = zs_time_now_ns();
        span.dur_ns = now > arrived_ns ? now - arrived_ns : 0;
        zd_trace_add(job->trace, &span);
    }
    return zd_step_reduce_bucket(job, src, job->dtype, bucket,
                                 micro_step + 1 == job->cfg.gradient_accumulation_steps, err,
                                 errlen);
}

/* Stage 1 at the boundary: reduce-scatter the full-gradient region into the accumulator and
 * zero it for the next accumulation. */
static zs_status_t zd_step_consume_grads(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    zs_dtype_t gtype = job->cfg.grad_accum_dtype;
    size_t gsize = zs_dtype_size(gtype);

    for (uint32_t b = 0; b < l->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        char *src = (char *)job->grads.addr + bk->offset * gsize;
        zs_status_t st = zd_step_reduce_bucket(job, src, gtype, b, true, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        st = zd_backend_zero(job->be, src, (size_t)(bk->padded * gsize));
        if (st != ZS_OK) {
            return zs_errf(err, errlen, st, "step %llu: %s", (unsigned long long)job->step + 1,
                           zd_backend_error(job->be));
        }
    }
    return ZS_OK;
}

/* 1. The sum of squares and the overflow flag of the accumulator, global over the ranks
 * (SUM and MAX, in rank order so every rank gets the same bits). This rank's sum is its slices'
 * sums added in bucket order, each taken while the runner was idle or, if not yet, here. */
static zs_status_t zd_step_norm(zd_job_t *job, double *sumsq_p, bool *nonfinite_p, char *err,
                                size_t errlen)
{
    static const zd_reduce_op_t ops[2] = {ZD_REDUCE_SUM, ZD_REDUCE_MAX};
    double vals[2] = {0.0, 0.0};
    uint64_t t0;
    zs_status_t st;

    for (uint32_t b = 0; b < job->layout->n_buckets; b++) {
        if (!job->slice_norm[b].fresh) {
            st = zd_step_slice_norm(job, b, err, errlen);
            if (st != ZS_OK) {
                return st;
            }
        }
        vals[0] += job->slice_norm[b].sumsq;
        vals[1] = job->slice_norm[b].nonfinite ? 1.0 : vals[1];
    }
    t0 = zs_time_now_ns();
    st = job->coll->ops->all_reduce(job->coll, vals, ops, 2, err, errlen);
    zd_trace_span(job->trace, ZD_TRACE_ALL_REDUCE, job->step + 1, t0, zs_time_now_ns(),
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    if (st != ZS_OK) {
        return st;
    }
    *sumsq_p = vals[0];
    *nonfinite_p = vals[1] != 0.0 || !isfinite(vals[0]);
    return ZS_OK;
}

/* 4-5. The norm of the averaged gradient, and the one factor that unscales, averages and
 * clips (grad_scale multiplies the accumulator in Adam). S: the loss scale of this step. */
static float zd_step_grad_scale(const zd_job_t *job, double sumsq, double S, double *grad_norm_p)
{
    const zd_train_config_t *cfg = &job->cfg;
    double n_avg = cfg->allreduce_mean ? (double)job->world : 1.0;
    double scaled_norm = sqrt(sumsq) / (n_avg * cfg->gradient_accumulation_steps);
    double c = S;

    *grad_norm_p = isfinite(scaled_norm) ? scaled_norm / S : -1;
    if (cfg->gradient_clipping > 0) {
        c = fmax(1.0, (scaled_norm / S + 1e-6) / cfg->gradient_clipping) * S;
    }
    return (float)(1.0 / (n_avg * cfg->gradient_accumulation_steps * c));
}

/* 6-7. Adam per group over this rank's slices, cast into the params region. */
static zs_status_t zd_step_adam(zd_job_t *job, const double *group_lr, float grad_scale, char *err,
                                size_t errlen)
{
    const zs_layout_t *l = job->layout;

    for (uint32_t g = 0; g < l->n_groups; g++) {
        const zs_layout_group_t *grp = &l->groups[g];
        zd_group_opts_t *o = &job->group_opts[g];
        zk_adam_params_t p = {0};

        if (group_lr != NULL) {
            o->lr = group_lr[g];
        }
        p.lr = (float)o->lr;
        p.beta1 = (float)o->beta1;
        p.beta2 = (float)o->beta2;
        p.eps = (float)o->eps;
        p.weight_decay = (float)o->weight_decay;
        p.adam_w_mode = o->adam_w_mode;
        p.bias_correction = o->bias_correction;
        p.step = job->step + 1;
        p.grad_scale = grad_scale;
        p.keep_acc = 1; /* every slice is overwritten by its next reduce-scatter (acc_stale) */
        for (uint32_t b = grp->first_bucket; b < grp->first_bucket + grp->n_buckets; b++) {
            uint64_t off = l->buckets[b].shard_offset;
            /* shared master: Adam writes the params region itself, no cast copy */
            void *dst = job->master_shared ? NULL : zd_step_slice_ptr(job, &job->params, b);
            zs_status_t st =
                zd_backend_adam(job->be, &p, zd_step_master(job, b), job->m + off, job->v + off,
                                job->acc + off, dst, job->dtype, l->buckets[b].slice);
            if (st != ZS_OK) {
                return zs_errf(err, errlen, st, "step %llu: kernel failed: %s (%s)",
                               (unsigned long long)job->step + 1, zs_status_string(st),
                               zd_backend_error(job->be));
            }
        }
        zd_replica_adam_params(job, g, &p);
    }
    zd_replica_adam_due(job); /* run after the step's reply: off the trainer's wait */
    /* each slice's next contribution overwrites it; one that gets none is zeroed first */
    memset(job->acc_clean, 1, l->n_buckets);
    memset(job->slice_norm, 0, l->n_buckets * sizeof(*job->slice_norm));
    job->acc_stale = true;
    return ZS_OK;
}

/* 8. Every rank's new slices into every params region (world > 1). */
static zs_status_t zd_step_all_gather(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;

    job->params_stale = true;
    job->stats.win_ag_ns = job->stats.win_ag_wait_ns = job->stats.win_ag_bytes = 0;
    for (uint32_t b = 0; b < (job->params_shared ? 1 : l->n_buckets); b++) {
        zs_status_t st = job->params_shared ? zd_step_gather_shared(job, 0, err, errlen)
                                            : zd_step_gather_bucket(job, b, 0, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        if (b == 0) {
            zd_test_pause("allgather", job->id, job->step);
        }
    }
    job->params_stale = false;
    return ZS_OK;
}

/* The time since *t, which moves to now (CLOCK_MONOTONIC). */
static uint64_t zd_step_lap(uint64_t *t)
{
    uint64_t now = zs_time_now_ns(), d = now - *t;

    *t = now;
    return d;
}

/* zd_step_lap, the phase that ended also a span of kind of the trace (step: the one built). */
static uint64_t zd_step_lap_trace(const zd_job_t *job, uint64_t *t, zd_trace_kind_t kind,
                                  uint64_t step)
{
    uint64_t from = *t, d = zd_step_lap(t);

    zd_trace_span(job->trace, kind, step, from, *t, 0);
    return d;
}

/* The phases of docs/semantics.md §4; ns[phase] gets the duration of each phase that ran. */
/* This rank's reduced gradients in place (stage 1 consumes them now), stale slices zeroed, then
 * step 1: the global sum of squares; *t_p starts the norm's lap. */
static zs_status_t zd_step_grads_in(zd_job_t *job, double *sumsq, bool *nonfinite, uint64_t *t_p,
                                    char *err, size_t errlen)
{
    zs_status_t st;

    if (job->cfg.stage == 1) {
        st = zd_step_consume_grads(job, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
    }
    *t_p = zs_time_now_ns();
    st = zd_step_zero_stale(job, err, errlen);
    if (st == ZS_OK) { /* before the all-reduce, which commits the step on every rank */
        st = zd_replica_exchange(job, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_step_norm(job, sumsq, nonfinite, err, errlen);
    }
    return st;
}

static zs_status_t zd_step_pipeline(zd_job_t *job, const double *group_lr, zd_step_out_t *out,
                                    uint64_t *ns, char *err, size_t errlen)
{
    double sumsq = 0, S, grad_norm;
    bool nonfinite = false, overflow;
    float grad_scale;
    zs_status_t st;
    uint64_t t;

    zd_test_pause("step", job->id, job->step + 1);
    st = zd_step_grads_in(job, &sumsq, &nonfinite, &t, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    overflow = nonfinite && (job->dtype == ZS_DTYPE_F16 ||
                             (job->dtype == ZS_DTYPE_BF16 && job->cfg.bf16_check_overflow));
    /* 2. loss-scaler update; S is the scale this step's backward used */
    S = job->scaler.cur_scale;
    st = zd_scaler_update(&job->scaler, overflow);
    ns[ZD_PHASE_NORM] = zd_step_lap_trace(job, &t, ZD_TRACE_NORM, job->step + 1);
    if (st != ZS_OK) {
        zd_step_drop_partial(job);
        return zs_errf(err, errlen, st,
                       "step %llu: gradients overflowed with the loss scale already at its "
                       "minimum %g (fp16.min_loss_scale) and hysteresis spent",
                       (unsigned long long)job->step + 1, job->scaler.min_scale);
    }
    if (overflow) { /* 3. skip */
        zd_step_drop_partial(job);
        job->skipped_steps++;
        job->last_grad_norm = -1;
        out->skipped = true;
        out->grad_norm = -1;
        return ZS_OK;
    }
    grad_scale = zd_step_grad_scale(job, sumsq, S, &grad_norm);
    st = zd_step_adam(job, group_lr, grad_scale, err, errlen);
    ns[ZD_PHASE_ADAM] = zd_step_lap_trace(job, &t, ZD_TRACE_ADAM, job->step + 1);
    if (st != ZS_OK) {
        return st;
    }
    /* Adam ran on every rank (it cannot fail for want of a peer): the step is committed. An
     * interrupted all-gather below is redone from the master on re-attach. */
    job->step++;
    zd_replica_commit(job);
    job->last_grad_norm = grad_norm;
    out->skipped = false;
    out->grad_norm = grad_norm;
    if (job->world == 1) {
        return ZS_OK;
    }
    st = zd_step_all_gather(job, err, errlen);
    ns[ZD_PHASE_ALL_GATHER] = zd_step_lap(&t);
    return st;
}

void zd_step_stats_reset_window(zd_job_t *job)
{
    zd_step_stats_t *s = &job->stats;

    s->window_ns = s->win_rs_ns = s->win_rs_wait_ns = s->win_rs_bytes = 0;
    s->win_ag_ns = s->win_ag_wait_ns = s->win_ag_bytes = 0;
}

/* Bus bandwidth over the transfer time alone (docs/metrics.md): 0 with no bytes (a barrier, a
 * collective that did not run) or no transfer time. */
static double zd_step_busbw(uint64_t bytes, uint64_t ns, uint64_t wait_ns, double share)
{
    uint64_t busy = ns > wait_ns ? ns - wait_ns : 0;

    return bytes > 0 && busy > 0 ? (double)bytes / ((double)busy * 1e-9) * share : 0;
}

/* A step that ran (committed or skipped) goes into the phase histograms, the busbw and wait of
 * its collectives and the step rate; either way the next window opens (at once after a step,
 * at the next bucket after a failure). */
static void zd_step_stats_end(zd_job_t *job, zs_status_t st, uint64_t *ns)
{
    zd_step_stats_t *s = &job->stats;
    double share = (double)(job->world - 1) / job->world; /* (N - 1) / N */
    bool ag = ns[ZD_PHASE_ALL_GATHER] != UINT64_MAX;

    if (s->win_rs_bytes > 0) {
        ns[ZD_PHASE_REDUCE_SCATTER] = s->win_rs_ns;
    }
    if (st == ZS_OK) {
        for (int p = 0; p < ZD_PHASE_COUNT; p++) {
            if (ns[p] != UINT64_MAX) {
                zd_hist_observe(&s->phase[p], (double)ns[p] * 1e-9);
            }
        }
        s->busbw[ZD_XFER_REDUCE_SCATTER] =
            zd_step_busbw(s->win_rs_bytes, s->win_rs_ns, s->win_rs_wait_ns, share);
        s->last_wait_s[ZD_XFER_REDUCE_SCATTER] = (double)s->win_rs_wait_ns * 1e-9;
        s->busbw[ZD_XFER_ALL_GATHER] =
            ag ? zd_step_busbw(s->win_ag_bytes, s->win_ag_ns, s->win_ag_wait_ns, share) : 0;
        s->last_wait_s[ZD_XFER_ALL_GATHER] = ag ? (double)s->win_ag_wait_ns * 1e-9 : 0;
    }
    zd_step_stats_reset_window(job);
    s->window_ns = st == ZS_OK ? zs_time_now_ns() : 0;
    if (st == ZS_OK) {
        zd_step_rate_note(s, s->window_ns);
    }
}

zs_status_t zd_step_run(zd_job_t *job, const double *group_lr, zd_step_out_t *out, char *err,
                        size_t errlen)
{
    zd_step_stats_t *s = &job->stats;
    uint64_t ns[ZD_PHASE_COUNT], start = zs_time_now_ns(), step = job->step + 1;
    uint16_t flags;
    zs_status_t st;

    for (int p = 0; p < ZD_PHASE_COUNT; p++) {
        ns[p] = UINT64_MAX; /* did not run */
    }
    if (s->window_ns != 0) { /* the time not spent reducing: waiting for the trainer */
        uint64_t busy = s->window_ns + s->win_rs_ns;
        ns[ZD_PHASE_BUCKET_WAIT] = start > busy ? start - busy : 0;
    }
    st = zd_step_pipeline(job, group_lr, out, ns, err, errlen);
    flags = st != ZS_OK ? ZD_TRACE_FAILED : (out->skipped ? ZD_TRACE_SKIPPED : 0);
    zd_trace_span(job->trace, ZD_TRACE_STEP, step, start, zs_time_now_ns(), flags);
    zd_step_stats_end(job, st, ns);
    return st;
}
