/*
 * A job that goes on at another world from its daemons' memory (job/replica.h): the trainers came
 * back at world N' after a daemon was lost, each surviving daemon made a job of the new world and
 * holds the old one beside it, with its own old shard and its replica of another's. Between them
 * they hold every old shard; each goes, element run by element run, to the new rank whose shard
 * holds those elements in the new layout (a pure function of the world, as a checkpoint's
 * reshard: docs/checkpoints.md), over one point-to-point round per rank distance.
 */
#define _GNU_SOURCE
#include "job/job_int.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Elements that move together: len of them, from old rank q's shard to a new shard. */
typedef struct zd_run {
    uint64_t old_off, old_flat; /* in old rank q's shard; in the old flat vector */
    uint64_t new_off, new_flat; /* in the new shard; in the new flat vector */
    uint64_t len;
    uint32_t q;
} zd_run_t;

typedef struct zd_runs {
    zd_run_t *v;
    size_t n, cap;
} zd_runs_t;

/* What the old job's ranks agree on, and who provides each old shard. */
typedef struct zd_reshard {
    const zd_rep_info_t *in;
    uint32_t old_world;
    uint64_t step;
    uint32_t *provider; /* [old_world]: the new rank that sends old rank q's shard */
} zd_reshard_t;

static int zd_runs_push(zd_runs_t *rs, const zd_run_t *u)
{
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? 2 * rs->cap : 256;
        zd_run_t *v = realloc(rs->v, cap * sizeof(*v));
        if (v == NULL) {
            return -1;
        }
        rs->v = v;
        rs->cap = cap;
    }
    rs->v[rs->n++] = *u;
    return 0;
}

/* The elements from param offset pe (len of them, at new flat new_flat and new shard offset
 * new_off) as runs of old shards. */
static int zd_runs_param(const zs_layout_t *ol, uint32_t id, uint64_t pe, zd_run_t u, zd_runs_t *rs)
{
    uint64_t fo = zs_layout_param_by_id(ol, id)->offset + pe, len = u.len;

    while (len > 0) {
        zs_layout_loc_t loc;
        const zs_layout_bucket_t *ob;
        if (zs_layout_locate(ol, fo, &loc) != ZS_OK) {
            return -1;
        }
        ob = &ol->buckets[loc.bucket];
        u.len = ob->offset + (uint64_t)(loc.rank + 1) * ob->slice - fo;
        u.len = u.len < len ? u.len : len;
        u.q = loc.rank;
        u.old_off = loc.shard_offset;
        u.old_flat = fo;
        if (zd_runs_push(rs, &u) != 0) {
            return -1;
        }
        fo += u.len;
        u.new_off += u.len;
        u.new_flat += u.len;
        len -= u.len;
    }
    return 0;
}

/* Every run of new rank d's shard (the new layout nl) in the old layout ol. */
static int zd_runs_of(const zs_layout_t *nl, const zs_layout_t *ol, uint32_t d, zd_runs_t *rs)
{
    rs->n = 0;
    for (uint32_t b = 0; b < nl->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &nl->buckets[b];
        uint64_t lo = (uint64_t)d * bk->slice, hi = lo + bk->slice;
        for (uint32_t i = 0; i < bk->n_params; i++) {
            zs_layout_piece_t pc;
            zs_layout_bucket_piece(nl, b, i, &pc);
            uint64_t s0 = pc.bucket_offset > lo ? pc.bucket_offset : lo;
            uint64_t s1 = pc.bucket_offset + pc.numel < hi ? pc.bucket_offset + pc.numel : hi;
            if (s0 >= s1) {
                continue;
            }
            zd_run_t u = {.new_off = bk->shard_offset + (s0 - lo),
                          .new_flat = bk->offset + s0,
                          .len = s1 - s0};
            if (zd_runs_param(ol, nl->params[pc.param].id,
                              pc.param_offset + (s0 - pc.bucket_offset), u, rs) != 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* Where run u's master, m and v are in the old job o (its own shard, or its replica). */
static void zd_run_src(const zd_job_t *o, const zd_run_t *u, float **p)
{
    if (u->q == o->rank) {
        p[0] = o->master_shared ? (float *)o->params.addr + u->old_flat : o->master + u->old_off;
        p[1] = o->m + u->old_off;
        p[2] = o->v + u->old_off;
    } else {
        p[0] = o->rep.master + u->old_off;
        p[1] = o->rep.m + u->old_off;
        p[2] = o->rep.v + u->old_off;
    }
}

/* ... and in the new job. */
static void zd_run_dst(const zd_job_t *job, const zd_run_t *u, float **p)
{
    p[0] = job->master_shared ? (float *)job->params.addr + u->new_flat : job->master + u->new_off;
    p[1] = job->m + u->new_off;
    p[2] = job->v + u->new_off;
}

/* The elements of rs that rank `from` provides: how many. */
static uint64_t zd_runs_total(const zd_runs_t *rs, const zd_reshard_t *x, uint32_t from)
{
    uint64_t n = 0;

    for (size_t i = 0; i < rs->n; i++) {
        n += x->provider[rs->v[i].q] == from ? rs->v[i].len : 0;
    }
    return n;
}

/* Copy between the runs of rs that `from` provides and buf (3 x total floats: masters, then m,
 * then v): pack (from the old job) or unpack (into the new). */
static void zd_runs_copy(zd_job_t *job, const zd_runs_t *rs, const zd_reshard_t *x, uint32_t from,
                         float *buf, uint64_t total, bool pack)
{
    uint64_t at = 0;

    for (size_t i = 0; i < rs->n; i++) {
        const zd_run_t *u = &rs->v[i];
        float *p[3];
        if (x->provider[u->q] != from) {
            continue;
        }
        if (pack) {
            zd_run_src(job->rep.from, u, p);
        } else {
            zd_run_dst(job, u, p);
        }
        for (int k = 0; k < 3; k++) {
            float *b = buf + (uint64_t)k * total + at;
            memcpy(pack ? b : p[k], pack ? p[k] : b, u->len * sizeof(float));
        }
        at += u->len;
    }
}

/* One round: this rank's elements of `to`'s new shard to it, `from`'s of this rank's from it. */
static zs_status_t zd_reshard_round(zd_job_t *job, const zd_reshard_t *x, uint32_t to,
                                    uint32_t from, zd_runs_t *rs_to, zd_runs_t *rs_me, char *err,
                                    size_t errlen)
{
    uint64_t ns = zd_runs_total(rs_to, x, job->rank), nr = zd_runs_total(rs_me, x, from);
    float *sb = ns ? malloc(3 * ns * sizeof(float)) : NULL;
    float *rb = nr && from != job->rank ? malloc(3 * nr * sizeof(float)) : NULL;
    zd_coll_buf_t s = {sb, 3 * ns * sizeof(float)}, r = {rb, 3 * nr * sizeof(float)};
    zs_status_t st = ZS_OK;

    if ((ns && sb == NULL) || (nr && from != job->rank && rb == NULL)) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "reshard: out of memory");
    } else if (ns) {
        zd_runs_copy(job, rs_to, x, job->rank, sb, ns, true);
    }
    if (st == ZS_OK && to == job->rank) {
        zd_runs_copy(job, rs_me, x, from, sb, nr, false); /* this rank's own elements */
    } else if (st == ZS_OK) {
        st = job->coll->ops->sendrecv(job->coll, ns ? to : ZD_COLL_NONE, &s, 1,
                                      nr ? from : ZD_COLL_NONE, &r, 1, err, errlen);
        if (st == ZS_OK && nr) {
            zd_runs_copy(job, rs_me, x, from, rb, nr, false);
        }
        job->stats.replica_bytes[0] += st == ZS_OK ? s.bytes : 0;
        job->stats.replica_bytes[1] += st == ZS_OK ? r.bytes : 0;
    }
    free(sb);
    free(rb);
    return st;
}

/* Every round, rank distance k = 0 .. world - 1 (0: this rank's own elements). */
static zs_status_t zd_reshard_move(zd_job_t *job, const zd_reshard_t *x, char *err, size_t errlen)
{
    const zs_layout_t *ol = job->rep.from->layout;
    const uint32_t N = job->world;
    zd_runs_t rs_to = {0}, rs_me = {0};
    zs_status_t st = ZS_OK;

    if (zd_runs_of(job->layout, ol, job->rank, &rs_me) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "reshard: out of memory");
    }
    for (uint32_t k = 0; k < N && st == ZS_OK; k++) {
        uint32_t to = (job->rank + k) % N, from = (job->rank + N - k) % N;
        if (zd_runs_of(job->layout, ol, to, &rs_to) != 0) {
            st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "reshard: out of memory");
            break;
        }
        st = zd_reshard_round(job, x, to, from, &rs_to, &rs_me, err, errlen);
    }
    free(rs_to.v);
    free(rs_me.v);
    return st;
}

/* Who provides old rank q's shard: the new rank that was q (its own), else the lowest that
 * holds q's replica at the step; UINT32_MAX: none. */
static uint32_t zd_reshard_provider(const zd_rep_info_t *in, uint32_t N, uint32_t q, uint64_t S)
{
    for (uint32_t r = 0; r < N; r++) {
        if (in[r].o_world != 0 && in[r].o_rank == q) {
            return r;
        }
    }
    for (uint32_t r = 0; r < N; r++) {
        if (in[r].o_world != 0 && in[r].o_owner == q && in[r].o_rep == S + 1) {
            return r;
        }
    }
    return UINT32_MAX;
}

/* The old job's ranks agree on its world and step; every new rank has one. */
static zs_status_t zd_reshard_check(const zd_job_t *job, const zd_rep_info_t *in, char *err,
                                    size_t errlen)
{
    for (uint32_t r = 0; r < job->world; r++) {
        if (in[r].o_world == 0) {
            return zs_errf(err, errlen, ZS_ERR_STATE,
                           "job '%s' goes on at world %u from its daemons' memory, but rank %u's "
                           "daemon holds none of it (a fresh daemon cannot join a change of world)",
                           job->id, job->world, r);
        }
        if (in[r].o_world != in[0].o_world || in[r].o_loaded != in[0].o_loaded) {
            return zs_errf(err, errlen, ZS_ERR_STATE,
                           "job '%s': rank %u holds it at world %llu step %llu, rank 0 at world "
                           "%llu step %llu",
                           job->id, r, (unsigned long long)in[r].o_world,
                           (unsigned long long)in[r].o_loaded - 1,
                           (unsigned long long)in[0].o_world,
                           (unsigned long long)in[0].o_loaded - 1);
        }
    }
    return ZS_OK;
}

/* The common state (step, counters, scaler, lr) from the old job, which every rank holds. */
static void zd_reshard_take_state(zd_job_t *job)
{
    const zd_job_t *o = job->rep.from;

    job->step = o->step;
    job->skipped_steps = o->skipped_steps;
    job->last_grad_norm = o->last_grad_norm;
    job->scaler = o->scaler;
    for (uint32_t g = 0; g < job->layout->n_groups && g < o->layout->n_groups; g++) {
        job->group_opts[g].lr = o->group_opts[g].lr;
    }
    job->params_loaded = true;
    job->recovered = true;
    job->ckpt_last_step = o->step;
}

/* Old rank q's shard and its replica are both gone. */
static zs_status_t zd_reshard_lost(zd_job_t *job, const zd_job_env_t *env, const zd_reshard_t *x,
                                   uint32_t q, char *err, size_t errlen)
{
    uint32_t b = (q + 1) % x->old_world;

    for (uint32_t r = 0; r < job->world; r++) {
        b = x->in[r].o_owner == q && x->in[r].o_rep != 0 ? (uint32_t)x->in[r].o_rank : b;
    }
    job->stats.recovery_fallbacks++;
    if (env->ckpt_dir == NULL) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "job '%s': rank %u's shard and its replica on rank %u (of world %u) are "
                       "both lost (replication = buddy), and no checkpoint_dir to fall back to",
                       job->id, q, b, x->old_world);
    }
    snprintf(job->recover_msg, sizeof(job->recover_msg),
             "rank %u's shard and its replica on rank %u (of world %u) are both lost: falling "
             "back to the last checkpoint in %s",
             q, b, x->old_world, env->ckpt_dir);
    zs_warn(ZS_SUB_ENGINE, "job '%s': %s", job->id, job->recover_msg);
    return ZS_OK; /* the new job stays without values: ParamsReady loads the checkpoint */
}

zs_status_t zd_reshard_settle(zd_job_t *job, const zd_job_env_t *env, const zd_rep_info_t *in,
                              char *err, size_t errlen)
{
    zd_reshard_t x = {.in = in, .old_world = (uint32_t)in[0].o_world};
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st = zd_reshard_check(job, in, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    x.step = in[0].o_loaded - 1;
    x.provider = malloc(x.old_world * sizeof(*x.provider));
    if (x.provider == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "reshard: out of memory");
    }
    for (uint32_t q = 0; q < x.old_world && st == ZS_OK; q++) {
        x.provider[q] = zd_reshard_provider(in, job->world, q, x.step);
        if (x.provider[q] == UINT32_MAX) {
            st = zd_reshard_lost(job, env, &x, q, err, errlen);
            free(x.provider);
            return st;
        }
    }
    st = zd_reshard_move(job, &x, err, errlen);
    free(x.provider);
    zd_trace_span(job->trace, ZD_TRACE_RECOVER_SHARD, x.step + 1, t0, zs_time_now_ns(),
                  st != ZS_OK ? ZD_TRACE_FAILED : 0);
    if (st != ZS_OK) {
        return st;
    }
    zd_reshard_take_state(job);
    job->stats.recoveries++;
    zs_info(ZS_SUB_ENGINE,
            "job '%s' continues at world %u from world %u at step %llu, its shards moved between "
            "the daemons' memories in %.3f s",
            job->id, job->world, x.old_world, (unsigned long long)x.step,
            (double)(zs_time_now_ns() - t0) * 1e-9);
    return ZS_OK;
}
