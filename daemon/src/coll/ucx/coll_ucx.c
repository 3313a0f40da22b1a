/*
 * Host-memory collectives over UCX (docs/architecture.md), the `ucx` ops table: the choice of
 * algorithm for each reduce-scatter and all-gather -- the direct path between co-located ranks
 * (coll_direct.c) when every rank agreed on it at share time, the ring otherwise (coll_ring.c)
 * -- both over the point-to-point layer below them (ucx_p2p.c).
 */
#define _GNU_SOURCE
#include "coll/ucx/coll_ucx_int.h"
#include "zs/log.h"
#include "zs/mem.h"
#include "zs/time.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the interface ---------------------------------------------------------------------- */

/* The arguments of one reduce-scatter or all-gather, for zd_ucx_run. */
typedef struct zd_coll_call {
    bool rs;   /* reduce-scatter, else all-gather */
    void *buf; /* reduce-scatter: the source bucket; all-gather: the buffer gathered into */
    zs_dtype_t dtype;
    uint64_t slice;
    float *acc;
    unsigned flags;
    zd_coll_norm_t *norm; /* reduce-scatter: the direct path's sum of squares, or NULL */
} zd_coll_call_t;

/* One reduce-scatter or all-gather: on the direct path a ready round, the copy and a done
 * round; the ring when the ranks agreed on it, or when some rank's buffer is outside its
 * regions for this call. */
static zs_status_t zd_ucx_run(zd_coll_ucx_t *c, const zd_coll_call_t *k, char *err, size_t errlen)
{
    const char *what = k->rs ? "reduce_scatter" : "all_gather";
    uint64_t seq;
    bool direct = false;
    zs_status_t st = ZS_OK;

    c->base.wait_ns = 0;
    if (k->slice == 0) {
        return ZS_OK;
    }
    seq = ++c->seq;
    if (c->direct) {
        zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
        /* the ready and done rounds wait for the peers; the copy between them moves the bytes */
        uint64_t t0 = zs_time_now_ns(), t1;
        st = zd_direct_begin(c, k->buf, k->slice * c->base.world * zs_dtype_size(k->dtype), seq,
                             deadline, &direct, what, err, errlen);
        t1 = zs_time_now_ns();
        c->base.wait_ns = t1 - t0;
        if (st == ZS_OK && direct) {
            st = k->rs ? zd_direct_reduce_scatter(c, k->dtype, k->slice, k->acc, k->flags, k->norm,
                                                  err, errlen)
                       : zd_direct_all_gather(c, k->buf, k->dtype, k->slice, err, errlen);
            if (st != ZS_OK) {
                zd_mesh_abort(c->mesh, c->base.rank, "rank %u: %s", c->base.rank, err);
                return st;
            }
            t0 = zs_time_now_ns();
            st = zd_direct_end(c, seq, deadline, what, err, errlen);
            c->base.wait_ns += zs_time_now_ns() - t0;
            return st;
        }
    }
    if (st != ZS_OK) {
        return st;
    }
    return k->rs ? zd_ring_reduce_scatter(c, k->buf, k->dtype, k->slice, k->acc, k->flags, seq, err,
                                          errlen)
                 : zd_ring_all_gather(c, k->buf, k->dtype, k->slice, seq, err, errlen);
}

static zs_status_t zd_ucx_reduce_scatter(zd_coll_t *coll, const void *src, zs_dtype_t dtype,
                                         uint64_t slice, float *acc, unsigned flags,
                                         zd_coll_norm_t *norm, char *err, size_t errlen)
{
    const zd_coll_call_t k = {true, (void *)src, dtype, slice, acc, flags, norm};

    return zd_ucx_run((zd_coll_ucx_t *)coll, &k, err, errlen);
}

static zs_status_t zd_ucx_all_gather(zd_coll_t *coll, void *buf, zs_dtype_t dtype, uint64_t slice,
                                     char *err, size_t errlen)
{
    const zd_coll_call_t k = {false, buf, dtype, slice, NULL, 0, NULL};

    return zd_ucx_run((zd_coll_ucx_t *)coll, &k, err, errlen);
}

static zs_status_t zd_ucx_barrier(zd_coll_t *coll, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;

    return zd_mesh_barrier(c->mesh, err, errlen);
}

static void zd_ucx_destroy(zd_coll_t *coll)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;

    zd_direct_unmap(c);
    zs_aligned_free(c->part[0]);
    zs_aligned_free(c->part[1]);
    free(c->norm_part);
    free(c->reqs);
    free(c->peer);
    free(c->peer_buf);
    free(c->in);
    free(c->in_info);
    free(c);
}

static const zd_coll_ops_t zd_coll_ucx_ops = {
    .name = "ucx",
    .reduce_scatter = zd_ucx_reduce_scatter,
    .all_gather = zd_ucx_all_gather,
    .all_reduce = zd_ucx_all_reduce,
    .barrier = zd_ucx_barrier,
    .share = zd_direct_share,
    .sendrecv = zd_ucx_sendrecv,
    .destroy = zd_ucx_destroy,
};

zs_status_t zd_coll_ucx_create(zd_mesh_t *mesh, const zk_exec_t *exec, bool direct,
                               zd_coll_t **coll_p)
{
    zd_coll_ucx_t *c;
    size_t N;

    if (zd_mesh_world(mesh) > 4096) {
        return ZS_ERR_UNSUPPORTED; /* 12-bit step field of the tag */
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    c->base.ops = &zd_coll_ucx_ops;
    c->base.rank = zd_mesh_rank(mesh);
    c->base.world = zd_mesh_world(mesh);
    c->mesh = mesh;
    c->worker = zd_mesh_worker(mesh);
    c->exec = *exec;
    c->direct_allowed = direct;
    snprintf(c->base.algo, sizeof(c->base.algo), "ring over UCX (no regions shared yet)");
    N = c->base.world;
    c->peer = calloc(N * ZD_COLL_MAX_REGIONS, sizeof(*c->peer));
    c->peer_buf = calloc(N, sizeof(*c->peer_buf));
    c->in = calloc(N, ZD_COLL_MSG_MAX);
    c->in_info = calloc(N, sizeof(*c->in_info));
    if (c->peer == NULL || c->peer_buf == NULL || c->in == NULL || c->in_info == NULL) {
        zd_ucx_destroy(&c->base);
        return ZS_ERR_NO_MEMORY;
    }
    *coll_p = &c->base;
    return ZS_OK;
}
