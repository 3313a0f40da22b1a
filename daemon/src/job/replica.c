/*
 * Buddy replicas (job/replica.h; docs/design-notes.md "Buddy replicas"): the buddies agreed when a
 * mesh forms, a fresh rank's shard sent from its buddy, the fall back to a checkpoint when both
 * are gone, and each step's exchange of gradients and Adam on the replica.
 */
#define _GNU_SOURCE
#include "job/replica.h"
#include "config/daemon_config.h"
#include "job/job_int.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/time.h"

#define XXH_STATIC_LINKING_ONLY
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* What a buddy sends a fresh rank besides its shard: the job's step and the state every rank
 * holds alike (the loss scaler, the counters). */
typedef struct zd_rep_head {
    uint64_t step, skipped_steps;
    double last_grad_norm, cur_scale;
    int64_t cur_iter, last_overflow_iter;
    uint32_t cur_hysteresis, n_groups;
} zd_rep_head_t;

/* A step's word to the buddy before the gradient: whose, at which step, and whether the whole
 * shard follows. */
typedef struct zd_rep_note {
    uint64_t step;
    uint32_t owner, full;
} zd_rep_note_t;

static uint64_t zd_replica_host_key(void)
{
    char key[512] = "", host[256] = "";
    struct stat ns = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    size_t n;

    if (f != NULL) {
        n = fread(key, 1, 64, f);
        key[n] = '\0';
        fclose(f);
    }
    (void)stat("/proc/self/ns/net", &ns);
    (void)gethostname(host, sizeof(host) - 1);
    n = strlen(key);
    snprintf(key + n, sizeof(key) - n, "/%llu/%s", (unsigned long long)ns.st_ino, host);
    return XXH3_64bits(key, strlen(key));
}

/* The smallest shift that puts every rank's buddy on another host; 1 when none does (one host,
 * or hosts of uneven sizes in an order no shift separates). */
static uint32_t zd_replica_shift(const zd_rep_info_t *in, uint32_t world)
{
    for (uint32_t k = 1; k < world; k++) {
        uint32_t r = 0;
        while (r < world && in[(r + k) % world].host != in[r].host) {
            r++;
        }
        if (r == world) {
            return k;
        }
    }
    return 1;
}

static zs_status_t zd_replica_alloc(zd_job_t *job, char *err, size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    float **arrays[4] = {&rp->master, &rp->m, &rp->v, &rp->acc};
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);

    for (int i = 0; i < 4; i++) {
        if (*arrays[i] == NULL && zd_backend_alloc(job->be, bytes, arrays[i]) != ZS_OK) {
            return zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                           "job '%s': no memory for the buddy replica (%zu bytes x 4): %s", job->id,
                           bytes, zd_backend_error(job->be));
        }
    }
    if (rp->due_p == NULL) {
        rp->due_p = calloc(job->layout->n_groups, sizeof(*rp->due_p));
    }
    return rp->due_p != NULL
               ? ZS_OK
               : zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                         "job '%s': no memory for the replica's Adam parameters", job->id);
}

/* A shared master's slices in one array, for a whole shard's send or receive: held only for
 * that (once per mesh formation), so the replica costs 16 bytes per shard element, not 20. */
static zs_status_t zd_replica_stage_get(zd_job_t *job, char *err, size_t errlen)
{
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);

    if (!job->master_shared || job->rep.stage != NULL ||
        zd_backend_alloc(job->be, bytes, &job->rep.stage) == ZS_OK) {
        return ZS_OK;
    }
    return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "job '%s': no memory to stage the master: %s",
                   job->id, zd_backend_error(job->be));
}

static void zd_replica_stage_put(zd_job_t *job)
{
    zd_backend_free(job->be, job->rep.stage);
    job->rep.stage = NULL;
}

void zd_replica_free(zd_job_t *job)
{
    zd_replica_t *rp = &job->rep;

    if (job->be == NULL) {
        return;
    }
    zd_backend_free(job->be, rp->master);
    zd_backend_free(job->be, rp->m);
    zd_backend_free(job->be, rp->v);
    zd_backend_free(job->be, rp->acc);
    zd_backend_free(job->be, rp->stage);
    free(rp->due_p);
    memset(rp, 0, sizeof(*rp));
}

/* This rank's master into one array: the shared master's slices gathered into rp->stage. */
static float *zd_replica_own_master(zd_job_t *job)
{
    const zs_layout_t *l = job->layout;

    if (!job->master_shared) {
        return job->master;
    }
    for (uint32_t b = 0; b < l->n_buckets; b++) {
        memcpy(job->rep.stage + l->buckets[b].shard_offset, zd_step_master(job, b),
               l->buckets[b].slice * sizeof(float));
    }
    return job->rep.stage;
}

/* rp->stage into the shared master's slices. */
static void zd_replica_scatter_master(zd_job_t *job)
{
    const zs_layout_t *l = job->layout;

    for (uint32_t b = 0; b < l->n_buckets; b++) {
        memcpy(zd_step_master(job, b), job->rep.stage + l->buckets[b].shard_offset,
               l->buckets[b].slice * sizeof(float));
    }
}

/* ---- recovery ---------------------------------------------------------------------------- */

/* The job's values dropped on this rank, so that ParamsReady loads checkpoint_dir's latest. */
static void zd_replica_drop_values(zd_job_t *job)
{
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);

    (void)zd_backend_zero(job->be, job->m, bytes);
    (void)zd_backend_zero(job->be, job->v, bytes);
    zd_step_drop_partial(job);
    zd_scaler_init(&job->scaler, &job->cfg);
    job->params_loaded = false;
    job->step = 0;
    job->skipped_steps = 0;
    job->last_grad_norm = 0;
}

/* Rank f's shard and its replica on rank b are both gone. */
static zs_status_t zd_replica_fallback(zd_job_t *job, const zd_job_env_t *env, uint32_t f,
                                       uint32_t b, char *err, size_t errlen)
{
    job->rep.valid = false;
    job->stats.recovery_fallbacks++;
    if (env->ckpt_dir == NULL) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "job '%s': rank %u's shard and its replica on rank %u are both lost "
                       "(replication = buddy), and no checkpoint_dir to fall back to; end the "
                       "job (zeroctl job end %s) and start it again",
                       job->id, f, b, job->id);
    }
    snprintf(job->recover_msg, sizeof(job->recover_msg),
             "rank %u's shard and its replica on rank %u are both lost: falling back to the last "
             "checkpoint in %s",
             f, b, env->ckpt_dir);
    zs_warn(ZS_SUB_ENGINE, "job '%s': %s", job->id, job->recover_msg);
    if (job->params_loaded) {
        zd_replica_drop_values(job);
    }
    return ZS_OK;
}

/* holder[f]: the loaded rank that holds fresh rank f's replica at step S (UINT32_MAX: none);
 * the lowest such rank when several do. */
static void zd_replica_holders(const zd_rep_info_t *in, uint32_t world, uint64_t S,
                               uint32_t *holder)
{
    for (uint32_t r = 0; r < world; r++) {
        holder[r] = UINT32_MAX;
    }
    for (uint32_t r = 0; r < world; r++) {
        uint64_t o = in[r].owner;
        if (in[r].loaded != 0 && in[r].rep == S + 1 && o < world && in[o].loaded == 0 &&
            holder[o] == UINT32_MAX) {
            holder[o] = r;
        }
    }
}

/* Install a fresh rank's shard and state received from its buddy. */
static void zd_replica_install(zd_job_t *job, const zd_rep_head_t *h, const double *lr)
{
    if (job->master_shared) {
        zd_replica_scatter_master(job);
    }
    job->step = h->step;
    job->skipped_steps = h->skipped_steps;
    job->last_grad_norm = h->last_grad_norm;
    job->scaler.cur_scale = h->cur_scale;
    job->scaler.cur_iter = h->cur_iter;
    job->scaler.last_overflow_iter = h->last_overflow_iter;
    job->scaler.cur_hysteresis = h->cur_hysteresis;
    for (uint32_t g = 0; g < job->layout->n_groups; g++) {
        job->group_opts[g].lr = lr[g];
    }
    job->params_loaded = true;
    job->recovered = true;
    job->ckpt_last_step = h->step;
}

/* The shard of every fresh rank from its holder: one sendrecv on every rank. */
static zs_status_t zd_replica_transfer(zd_job_t *job, uint32_t to, uint32_t from, char *err,
                                       size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);
    size_t lr_bytes = job->layout->n_groups * sizeof(double);
    zd_rep_head_t hs = {0}, hr = {0};
    /* before r[]: a shared master is received into the stage */
    zs_status_t st = from != ZD_COLL_NONE ? zd_replica_stage_get(job, err, errlen) : ZS_OK;
    double *lr_s = calloc(job->layout->n_groups, sizeof(double));
    double *lr_r = calloc(job->layout->n_groups, sizeof(double));
    zd_coll_buf_t s[5] = {
        {&hs, sizeof(hs)}, {lr_s, lr_bytes}, {rp->master, bytes}, {rp->m, bytes}, {rp->v, bytes}};
    zd_coll_buf_t r[5] = {{&hr, sizeof(hr)},
                          {lr_r, lr_bytes},
                          {job->master_shared ? rp->stage : job->master, bytes},
                          {job->m, bytes},
                          {job->v, bytes}};

    if (st != ZS_OK) {
        free(lr_s);
        free(lr_r);
        return st;
    }
    st = ZS_ERR_NO_MEMORY;
    hs = (zd_rep_head_t){job->step,
                         job->skipped_steps,
                         job->last_grad_norm,
                         job->scaler.cur_scale,
                         job->scaler.cur_iter,
                         job->scaler.last_overflow_iter,
                         job->scaler.cur_hysteresis,
                         job->layout->n_groups};
    for (uint32_t g = 0; lr_s != NULL && g < job->layout->n_groups; g++) {
        lr_s[g] = job->group_opts[g].lr;
    }
    if (lr_s != NULL && lr_r != NULL) {
        st = job->coll->ops->sendrecv(job->coll, to, s, 5, from, r, 5, err, errlen);
    }
    if (st == ZS_OK && from != ZD_COLL_NONE) {
        zd_replica_install(job, &hr, lr_r);
    }
    zd_replica_stage_put(job);
    job->stats.replica_bytes[0] += to != ZD_COLL_NONE ? 3 * bytes : 0;
    job->stats.replica_bytes[1] += from != ZD_COLL_NONE ? 3 * bytes : 0;
    free(lr_s);
    free(lr_r);
    return st == ZS_ERR_NO_MEMORY ? zs_errf(err, errlen, st, "recovery: out of memory") : st;
}

/* Every fresh rank has a holder at step S: each gets its shard. */
static zs_status_t zd_replica_recover(zd_job_t *job, const zd_rep_info_t *in,
                                      const uint32_t *holder, uint64_t S, char *err, size_t errlen)
{
    uint32_t to = ZD_COLL_NONE, from = ZD_COLL_NONE, n_fresh = 0;
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st;

    for (uint32_t r = 0; r < job->world; r++) {
        n_fresh += in[r].loaded == 0;
    }
    if (in[job->rank].loaded == 0) {
        from = holder[job->rank];
    } else if (in[job->rank].owner < job->world && holder[in[job->rank].owner] == job->rank) {
        to = (uint32_t)in[job->rank].owner;
    }
    st = zd_replica_transfer(job, to, from, err, errlen);
    zd_trace_span(job->trace, ZD_TRACE_RECOVER_SHARD, S + 1, t0, zs_time_now_ns(),
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    if (st != ZS_OK) {
        return st;
    }
    job->stats.recoveries++;
    job->rep.last_recovery_step = S;
    zs_info(ZS_SUB_ENGINE,
            "job '%s' recovered %u fresh rank(s) from their buddies' replicas at step %llu in "
            "%.3f s%s",
            job->id, n_fresh, (unsigned long long)S, (double)(zs_time_now_ns() - t0) * 1e-9,
            from != ZD_COLL_NONE ? " (this rank's shard came from its buddy)" : "");
    return ZS_OK;
}

/* The ranks' word on themselves: nothing to do, a recovery, or a fall back. */
static zs_status_t zd_replica_settle(zd_job_t *job, const zd_job_env_t *env,
                                     const zd_rep_info_t *in, char *err, size_t errlen)
{
    const uint32_t N = job->world;
    uint32_t L = UINT32_MAX, n_fresh = 0, *holder;
    zs_status_t st = ZS_OK;

    for (uint32_t r = 0; r < N; r++) {
        n_fresh += in[r].loaded == 0;
        if (in[r].loaded != 0 && L == UINT32_MAX) {
            L = r;
        } else if (in[r].loaded != 0 && in[r].loaded != in[L].loaded) {
            return zs_errf(err, errlen, ZS_ERR_STATE,
                           "job '%s': rank %u is at step %llu, rank %u at step %llu", job->id, r,
                           (unsigned long long)in[r].loaded - 1, L,
                           (unsigned long long)in[L].loaded - 1);
        }
    }
    if (L == UINT32_MAX || n_fresh == 0) {
        return ZS_OK; /* a fresh job, or every rank kept it */
    }
    holder = malloc(N * sizeof(*holder));
    if (holder == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "recovery: out of memory");
    }
    zd_replica_holders(in, N, in[L].loaded - 1, holder);
    for (uint32_t f = 0; f < N && st == ZS_OK; f++) {
        if (in[f].loaded == 0 && holder[f] == UINT32_MAX) {
            uint32_t b = (f + job->rep.shift) % N; /* who holds it now, or would have */
            for (uint32_t r = 0; r < N; r++) {
                b = in[r].owner == f && in[r].rep != 0 && r != f ? r : b;
            }
            st = zd_replica_fallback(job, env, f, b, err, errlen);
            free(holder);
            return st;
        }
    }
    st = zd_replica_recover(job, in, holder, in[L].loaded - 1, err, errlen);
    free(holder);
    return st;
}

/* What this rank holds: of this job, and of the job of another world it takes over. */
static void zd_replica_info_self(const zd_job_t *job, zd_rep_info_t *me)
{
    const zd_job_t *o = job->rep.from;

    *me = (zd_rep_info_t){.loaded = job->params_loaded ? job->step + 1 : 0,
                          .rep = job->rep.valid ? job->rep.step + 1 : 0,
                          .owner = job->rep.owner,
                          .host = zd_replica_host_key()};
    if (o != NULL) {
        me->o_world = o->world;
        me->o_rank = o->rank;
        me->o_loaded = o->step + 1;
        me->o_rep = o->rep.valid ? o->rep.step + 1 : 0;
        me->o_owner = o->rep.owner;
    }
}

static bool zd_replica_from_other_world(const zd_rep_info_t *in, uint32_t world)
{
    for (uint32_t r = 0; r < world; r++) {
        if (in[r].o_world != 0) {
            return true;
        }
    }
    return false;
}

zs_status_t zd_replica_form(zd_job_t *job, const zd_job_env_t *env, char *err, size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    const uint32_t N = job->world;
    uint64_t t0 = zs_time_now_ns(), t1;
    zd_rep_info_t *in;
    uint32_t owner;
    bool kept = false;
    zs_status_t st;

    job->recover_msg[0] = '\0';
    if (env->replication != ZD_REPLICATION_BUDDY || N == 1 || job->coll == NULL) {
        return ZS_OK;
    }
    /* the replicas as their holders committed them, before anyone says or sends what it holds */
    st = zd_replica_catch_up(job, err, errlen);
    if (st == ZS_OK && rp->from != NULL) {
        st = zd_replica_catch_up(rp->from, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    st = zd_replica_alloc(job, err, errlen);
    in = calloc(N, sizeof(*in));
    if (st != ZS_OK || in == NULL) {
        free(in);
        return st != ZS_OK ? st : zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "recovery: out of memory");
    }
    zd_replica_info_self(job, &in[job->rank]);
    st = job->coll->ops->all_gather(job->coll, in, ZS_DTYPE_F32, sizeof(*in) / sizeof(float), err,
                                    errlen);
    t1 = zs_time_now_ns();
    if (st == ZS_OK) {
        rp->shift = zd_replica_shift(in, N);
        st = zd_replica_from_other_world(in, N) ? zd_reshard_settle(job, env, in, err, errlen)
                                                : zd_replica_settle(job, env, in, err, errlen);
    }
    /* recorded once the step is settled: the spans go with the step built next */
    zd_trace_span(job->trace, ZD_TRACE_RECOVER_AGREE, job->step + 1, t0, t1,
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    if (st == ZS_OK) { /* the buddy holds our shard at our step: a survivor's replica, or the
                        * one this rank's shard just came from */
        const zd_rep_info_t *b = &in[(job->rank + rp->shift) % N];

        kept = job->params_loaded && b->rep == job->step + 1 && b->owner == job->rank;
    }
    free(in);
    if (st != ZS_OK) {
        return st;
    }
    owner = (job->rank + N - rp->shift) % N;
    rp->valid = rp->valid && rp->owner == owner && rp->step == job->step && job->params_loaded;
    rp->owner = owner;
    rp->buddy = (job->rank + rp->shift) % N;
    /* the buddy may be fresh, or hold another shard: it gets the whole of ours with the next
     * gradient, unless it holds ours at this step; one still due (weights reloaded) stays */
    rp->send_full = rp->send_full || !kept;
    rp->on = true;
    return ZS_OK;
}

/* ---- every step -------------------------------------------------------------------------- */

/* The whole shard after the note: this rank's to its buddy when it says so, the owner's into
 * the replica when the owner's note says so. */
static zs_status_t zd_replica_exchange_full(zd_job_t *job, const zd_rep_note_t *in, char *err,
                                            size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);
    zd_coll_buf_t s[3] = {{NULL, bytes}, {job->m, bytes}, {job->v, bytes}};
    zd_coll_buf_t r[3] = {{rp->master, bytes}, {rp->m, bytes}, {rp->v, bytes}};
    uint32_t to = rp->send_full ? rp->buddy : ZD_COLL_NONE;
    uint32_t from = in->full ? rp->owner : ZD_COLL_NONE;
    zs_status_t st;

    st = to != ZD_COLL_NONE ? zd_replica_stage_get(job, err, errlen) : ZS_OK;
    if (st != ZS_OK) {
        return st;
    }
    if (to != ZD_COLL_NONE) {
        s[0].addr = zd_replica_own_master(job);
    }
    if (from != ZD_COLL_NONE) {
        rp->valid = false; /* until the whole of it is in */
    }
    st = job->coll->ops->sendrecv(job->coll, to, s, 3, from, r, 3, err, errlen);
    zd_replica_stage_put(job);
    if (st != ZS_OK) {
        return st;
    }
    rp->send_full = false;
    job->stats.replica_bytes[0] += to != ZD_COLL_NONE ? 3 * bytes : 0;
    job->stats.replica_bytes[1] += from != ZD_COLL_NONE ? 3 * bytes : 0;
    if (from != ZD_COLL_NONE) {
        rp->valid = true;
        rp->step = in->step;
    }
    return ZS_OK;
}

zs_status_t zd_replica_exchange(zd_job_t *job, char *err, size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    size_t bytes = (size_t)job->layout->shard_numel * sizeof(float);
    zd_rep_note_t out = {job->step, job->rank, rp->send_full}, in = {0};
    zd_coll_buf_t s[2] = {{&out, sizeof(out)}, {job->acc, bytes}};
    zd_coll_buf_t r[2] = {{&in, sizeof(in)}, {rp->acc, bytes}};
    uint64_t t0 = zs_time_now_ns(), before = job->stats.replica_bytes[0];
    zs_status_t st;

    if (!rp->on) {
        return ZS_OK;
    }
    st = zd_replica_catch_up(job, err, errlen); /* the last step's, before its gradient goes */
    if (st != ZS_OK) {
        return st;
    }
    st = job->coll->ops->sendrecv(job->coll, rp->buddy, s, 2, rp->owner, r, 2, err, errlen);
    if (st == ZS_OK && (in.owner != rp->owner || in.step != job->step)) {
        st = zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                     "replica: rank %u sent its gradient as rank %u at step %llu, this rank is "
                     "at step %llu",
                     rp->owner, in.owner, (unsigned long long)in.step,
                     (unsigned long long)job->step);
    }
    if (st == ZS_OK) {
        job->stats.replica_bytes[0] += bytes;
        job->stats.replica_bytes[1] += bytes;
        st = zd_replica_exchange_full(job, &in, err, errlen);
    }
    {
        zd_trace_span_t span = {.kind = ZD_TRACE_REPLICA,
                                .start_ns = t0,
                                .dur_ns = zs_time_now_ns() - t0,
                                .step = job->step + 1,
                                .bytes = job->stats.replica_bytes[0] - before,
                                .flags = st != ZS_OK ? ZD_TRACE_FAILED : 0};
        zd_trace_add(job->trace, &span);
    }
    return st;
}

void zd_replica_adam_params(zd_job_t *job, uint32_t g, const zk_adam_params_t *p)
{
    if (job->rep.due_p != NULL) {
        job->rep.due_p[g] = *p;
    }
}

void zd_replica_adam_due(zd_job_t *job)
{
    zd_replica_t *rp = &job->rep;

    rp->due = rp->on && rp->valid && rp->due_p != NULL;
    rp->due_bucket = 0;
}

/* Adam on the replica's slice of bucket b with its group's parameters of the step (no cast). */
static zs_status_t zd_replica_adam(zd_job_t *job, uint32_t b)
{
    const zs_layout_t *l = job->layout;
    zd_replica_t *rp = &job->rep;
    uint64_t off = l->buckets[b].shard_offset;
    uint32_t g = 0;

    while (g + 1 < l->n_groups && b >= l->groups[g].first_bucket + l->groups[g].n_buckets) {
        g++;
    }
    return zd_backend_adam(job->be, &rp->due_p[g], rp->master + off, rp->m + off, rp->v + off,
                           rp->acc + off, NULL, job->dtype, l->buckets[b].slice);
}

/* The next due bucket's Adam; a kernel that failed leaves the replica invalid (a recovery then
 * falls back as if it were lost) rather than a step behind its holder. */
static zs_status_t zd_replica_adam_next(zd_job_t *job, char *err, size_t errlen)
{
    zd_replica_t *rp = &job->rep;
    zs_status_t st = zd_replica_adam(job, rp->due_bucket);

    rp->due = ++rp->due_bucket < job->layout->n_buckets && st == ZS_OK;
    if (st != ZS_OK) {
        rp->valid = false;
        return zs_errf(err, errlen, st, "job '%s': the replica of rank %u's shard: Adam failed: %s",
                       job->id, rp->owner, zd_backend_error(job->be));
    }
    return ZS_OK;
}

bool zd_replica_idle(zd_job_t *job)
{
    char err[ZS_MSG_MAX];

    if (!job->rep.due) {
        return false;
    }
    if (zd_replica_adam_next(job, err, sizeof(err)) != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "%s", err);
    }
    return true;
}

zs_status_t zd_replica_catch_up(zd_job_t *job, char *err, size_t errlen)
{
    zs_status_t st = ZS_OK;

    while (job->rep.due && st == ZS_OK) {
        st = zd_replica_adam_next(job, err, errlen);
    }
    return st;
}

void zd_replica_commit(zd_job_t *job)
{
    if (job->rep.on && job->rep.valid) {
        job->rep.step = job->step;
    }
}

void zd_replica_resend(zd_job_t *job)
{
    job->rep.send_full = true;
}

void zd_replica_pause(zd_job_t *job)
{
    job->rep.on = false;
}

void zd_replica_status(const zd_job_t *job, zd_job_status_t *st)
{
    const zd_replica_t *rp = &job->rep;

    st->replication = rp->master != NULL;
    st->replica_owner = rp->owner;
    st->replica_buddy = rp->buddy;
    st->replica_valid = rp->valid;
    st->replica_step = rp->step;
}
