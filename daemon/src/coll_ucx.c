/*
 * Host-memory collectives over UCX tagged messages (design.md §4).
 *
 * reduce_scatter: ring of world-1 steps; partial sums travel in fp32 whatever the param dtype,
 *   each arriving segment is summed with this rank's contribution by the accumulate kernel,
 *   and the last step adds straight into the shard accumulator. Segments pipeline the steps:
 *   a segment is forwarded as soon as it is reduced.
 * all_gather: ring in place in the params region; every receive is posted up front (distinct
 *   destinations) and a segment is forwarded as soon as it arrives.
 * all_reduce: every rank sends its values to every other; all combine in rank order.
 * Tags: collective sequence (24 bits) | source rank (16) | step (12) | segment (12).
 */
#include "coll.h"
#include "mesh.h"
#include "zs/log.h"
#include "zs/mem.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZD_SEG_MIN_BYTES (1u << 20)
#define ZD_MAX_SEGS      64u
#define ZD_IDLE_SPINS    1000u

typedef struct zd_coll_ucx {
    zd_coll_t base;
    zd_mesh_t *mesh;
    ucp_worker_h worker;
    zk_exec_t exec;
    uint64_t seq;
    float *part[2]; /* reduce-scatter partial sums, double-buffered by step parity */
    uint64_t part_elems;
    void **reqs; /* request slots */
    size_t n_reqs;
} zd_coll_ucx_t;

static uint64_t zd_tag(uint64_t seq, uint32_t src, uint32_t step, uint32_t seg)
{
    return ((seq & 0xffffffull) << 40) | ((uint64_t)(src & 0xffffu) << 24) |
           ((uint64_t)(step & 0xfffu) << 12) | (seg & 0xfffu);
}

static void zd_ucx_nop_send_cb(void *request, ucs_status_t status, void *user_data)
{
}

static void zd_ucx_nop_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                               void *user_data)
{
}

static void *zd_post_send(zd_coll_ucx_t *c, uint32_t to, const void *buf, size_t bytes,
                          uint64_t tag)
{
    ucp_request_param_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    prm.cb.send = zd_ucx_nop_send_cb;
    return ucp_tag_send_nbx(zd_mesh_ep(c->mesh, to), buf, bytes, tag, &prm);
}

static void *zd_post_recv(zd_coll_ucx_t *c, void *buf, size_t bytes, uint64_t tag)
{
    ucp_request_param_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    prm.cb.recv = zd_ucx_nop_recv_cb;
    return ucp_tag_recv_nbx(c->worker, buf, bytes, tag, UINT64_MAX, &prm);
}

/* Is *req complete? Frees it and clears the slot. A failed request sets *st. */
static bool zd_req_test(void **req, zs_status_t *st)
{
    ucs_status_t us;

    if (*req == NULL) {
        return true;
    }
    if (UCS_PTR_IS_ERR(*req)) {
        *req = NULL;
        *st = ZS_ERR_PEER_LOST;
        return true;
    }
    us = ucp_request_check_status(*req);
    if (us == UCS_INPROGRESS) {
        return false;
    }
    ucp_request_free(*req);
    *req = NULL;
    if (us != UCS_OK) {
        *st = ZS_ERR_PEER_LOST;
    }
    return true;
}

static void zd_reqs_cancel(zd_coll_ucx_t *c, void **reqs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (reqs[i] != NULL && !UCS_PTR_IS_ERR(reqs[i])) {
            ucp_request_cancel(c->worker, reqs[i]);
            while (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS) {
                ucp_worker_progress(c->worker);
            }
            ucp_request_free(reqs[i]);
        }
        reqs[i] = NULL;
    }
}

static zs_status_t zd_reqs_reserve(zd_coll_ucx_t *c, size_t n)
{
    if (n > c->n_reqs) {
        void **r = realloc(c->reqs, n * sizeof(*r));
        if (r == NULL) {
            return ZS_ERR_NO_MEMORY;
        }
        c->reqs = r;
        c->n_reqs = n;
    }
    memset(c->reqs, 0, n * sizeof(*c->reqs));
    return ZS_OK;
}

/* One round of progress. Fails when the mesh aborted or the deadline passed (then the job is
 * aborted everywhere, naming `suspect`). */
static zs_status_t zd_pump(zd_coll_ucx_t *c, unsigned *idle, zs_deadline_t deadline,
                           uint32_t suspect, const char *what, char *err, size_t errlen)
{
    char why[512];

    if (ucp_worker_progress(c->worker) != 0) {
        *idle = 0;
        return ZS_OK;
    }
    if (++*idle < ZD_IDLE_SPINS) {
        return ZS_OK;
    }
    *idle = 0;
    zd_mesh_tick(c->mesh);
    if (zd_mesh_cancelled(c->mesh)) {
        zd_mesh_abort(c->mesh, c->base.rank, "rank %u: its daemon is shutting down", c->base.rank);
    }
    if (zd_mesh_aborted(c->mesh, why, sizeof(why))) {
        snprintf(err, errlen, "%s: %s", what, why);
        return ZS_ERR_PEER_LOST;
    }
    if (zs_deadline_expired(deadline)) {
        zd_mesh_abort(c->mesh, suspect,
                      "rank %u lost: %s waited %.1f s for it (collective_timeout)", suspect, what,
                      (double)zd_mesh_collective_timeout_ns(c->mesh) * 1e-9);
        zd_mesh_aborted(c->mesh, why, sizeof(why));
        snprintf(err, errlen, "%s", why);
        return ZS_ERR_PEER_LOST;
    }
    sched_yield();
    return ZS_OK;
}

static uint64_t zd_seg_elems(uint64_t slice, size_t elem_bytes)
{
    uint64_t min_elems = ZD_SEG_MIN_BYTES / elem_bytes;
    uint64_t by_count = (slice + ZD_MAX_SEGS - 1) / ZD_MAX_SEGS;
    uint64_t s = by_count > min_elems ? by_count : min_elems;

    return (s + 15) & ~15ull;
}

static zs_status_t zd_part_reserve(zd_coll_ucx_t *c, uint64_t elems)
{
    if (elems <= c->part_elems) {
        return ZS_OK;
    }
    for (int i = 0; i < 2; i++) {
        zs_aligned_free(c->part[i]);
        c->part[i] = NULL;
        if (zs_aligned_alloc(elems * sizeof(float), ZS_CACHE_LINE, (void **)&c->part[i]) != ZS_OK) {
            c->part_elems = 0;
            return ZS_ERR_NO_MEMORY;
        }
    }
    c->part_elems = elems;
    return ZS_OK;
}

static zs_status_t zd_ucx_reduce_scatter(zd_coll_t *coll, const void *src, zk_dtype_t dtype,
                                         uint64_t slice, float *acc, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    const uint32_t N = coll->world, r = coll->rank;
    const uint32_t left = (r + N - 1) % N, right = (r + 1) % N;
    const size_t dsz = zk_dtype_size(dtype);
    const char *base = src;
    uint64_t seg, nseg, seq;
    zs_deadline_t deadline;
    void **recv_req, **send_req[2];
    uint8_t *reduced;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    if (slice == 0) {
        return ZS_OK;
    }
    seg = zd_seg_elems(slice, sizeof(float));
    nseg = (slice + seg - 1) / seg;
    seq = ++c->seq;
    deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    if (zd_part_reserve(c, slice) != ZS_OK || zd_reqs_reserve(c, 3 * nseg) != ZS_OK) {
        snprintf(err, errlen, "reduce_scatter: out of memory for %llu elements",
                 (unsigned long long)slice);
        return ZS_ERR_NO_MEMORY;
    }
    recv_req = c->reqs;
    send_req[0] = c->reqs + nseg;
    send_req[1] = c->reqs + 2 * nseg;
    reduced = calloc(nseg, 1);
    if (reduced == NULL) {
        return ZS_ERR_NO_MEMORY;
    }

    /* step 0: this rank's own contribution to chunk r-1, as fp32 */
    {
        uint32_t idx = (r + N - 1) % N;
        const float *from;
        if (dtype == ZK_DTYPE_F32) {
            from = (const float *)(const void *)(base + (uint64_t)idx * slice * dsz);
        } else {
            st = zk_cast(&c->exec, c->part[1], ZK_DTYPE_F32, base + (uint64_t)idx * slice * dsz,
                         dtype, slice);
            from = c->part[1];
        }
        for (uint64_t j = 0; j < nseg && st == ZS_OK; j++) {
            uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
            recv_req[j] = zd_post_recv(c, c->part[0] + lo, n * sizeof(float),
                                       zd_tag(seq, left, 0, (uint32_t)j));
            send_req[0][j] = zd_post_send(c, right, from + lo, n * sizeof(float),
                                          zd_tag(seq, r, 0, (uint32_t)j));
        }
    }
    for (uint32_t k = 0; k + 1 < N && st == ZS_OK; k++) {
        uint32_t idx = (r + 2 * N - k - 2) % N;
        const char *own = base + (uint64_t)idx * slice * dsz;
        float *p = c->part[k % 2];
        uint64_t pending = nseg;

        memset(reduced, 0, nseg);
        while (pending > 0 && st == ZS_OK) {
            for (uint64_t j = 0; j < nseg && st == ZS_OK; j++) {
                uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
                if (reduced[j] || !zd_req_test(&recv_req[j], &st) || st != ZS_OK) {
                    continue;
                }
                st = zk_accumulate(&c->exec, p + lo, own + lo * dsz, dtype, 1.0f, n);
                if (st != ZS_OK) {
                    break;
                }
                if (k + 2 < N) {
                    send_req[(k + 1) % 2][j] = zd_post_send(c, right, p + lo, n * sizeof(float),
                                                            zd_tag(seq, r, k + 1, (uint32_t)j));
                } else {
                    st = zk_accumulate(&c->exec, acc + lo, p + lo, ZK_DTYPE_F32, 1.0f, n);
                }
                reduced[j] = 1;
                pending--;
            }
            if (pending > 0 && st == ZS_OK) {
                st = zd_pump(c, &idle, deadline, left, "reduce_scatter", err, errlen);
            }
        }
        /* this step's sends must leave before their buffer receives step k+1 */
        for (uint64_t j = 0; j < nseg && st == ZS_OK;) {
            if (zd_req_test(&send_req[k % 2][j], &st)) {
                j++;
                continue;
            }
            st = zd_pump(c, &idle, deadline, right, "reduce_scatter", err, errlen);
        }
        if (st == ZS_OK && k + 2 < N) {
            float *next = c->part[(k + 1) % 2];
            for (uint64_t j = 0; j < nseg; j++) {
                uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
                recv_req[j] = zd_post_recv(c, next + lo, n * sizeof(float),
                                           zd_tag(seq, left, k + 1, (uint32_t)j));
            }
        }
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "reduce_scatter: a transfer with rank %u or %u failed", left,
                     right);
        }
        zd_reqs_cancel(c, c->reqs, 3 * nseg);
    }
    free(reduced);
    return st;
}

static zs_status_t zd_ucx_all_gather(zd_coll_t *coll, void *buf, zk_dtype_t dtype, uint64_t slice,
                                     char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    const uint32_t N = coll->world, r = coll->rank;
    const uint32_t left = (r + N - 1) % N, right = (r + 1) % N;
    const size_t dsz = zk_dtype_size(dtype);
    char *base = buf;
    uint64_t seg, nseg, seq, total;
    zs_deadline_t deadline;
    void **recv_req, **send_req;
    uint8_t *forwarded;
    uint64_t pending;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    if (slice == 0) {
        return ZS_OK;
    }
    seg = zd_seg_elems(slice, dsz);
    nseg = (slice + seg - 1) / seg;
    total = (uint64_t)(N - 1) * nseg;
    seq = ++c->seq;
    deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    if (zd_reqs_reserve(c, 2 * total) != ZS_OK) {
        snprintf(err, errlen, "all_gather: out of memory");
        return ZS_ERR_NO_MEMORY;
    }
    forwarded = calloc(total, 1);
    if (forwarded == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    recv_req = c->reqs;
    send_req = c->reqs + total;
    /* step k receives chunk r-k-1 from the left, into its final place */
    for (uint32_t k = 0; k + 1 < N; k++) {
        uint32_t idx = (r + 2 * N - k - 1) % N;
        for (uint64_t j = 0; j < nseg; j++) {
            uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
            recv_req[k * nseg + j] = zd_post_recv(c, base + ((uint64_t)idx * slice + lo) * dsz,
                                                  n * dsz, zd_tag(seq, left, k, (uint32_t)j));
        }
    }
    for (uint64_t j = 0; j < nseg; j++) {
        uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
        send_req[j] = zd_post_send(c, right, base + ((uint64_t)r * slice + lo) * dsz, n * dsz,
                                   zd_tag(seq, r, 0, (uint32_t)j));
    }
    pending = total;
    while (pending > 0 && st == ZS_OK) {
        for (uint32_t k = 0; k + 1 < N && st == ZS_OK; k++) {
            uint32_t idx = (r + 2 * N - k - 1) % N;
            for (uint64_t j = 0; j < nseg && st == ZS_OK; j++) {
                uint64_t i = k * nseg + j;
                uint64_t lo = j * seg, n = slice - lo < seg ? slice - lo : seg;
                if (forwarded[i] || !zd_req_test(&recv_req[i], &st) || st != ZS_OK) {
                    continue;
                }
                if (k + 2 < N) {
                    send_req[(k + 1) * nseg + j] =
                        zd_post_send(c, right, base + ((uint64_t)idx * slice + lo) * dsz, n * dsz,
                                     zd_tag(seq, r, k + 1, (uint32_t)j));
                }
                forwarded[i] = 1;
                pending--;
            }
        }
        if (pending > 0 && st == ZS_OK) {
            st = zd_pump(c, &idle, deadline, left, "all_gather", err, errlen);
        }
    }
    for (uint64_t i = 0; i < total && st == ZS_OK;) {
        if (zd_req_test(&send_req[i], &st)) {
            i++;
            continue;
        }
        st = zd_pump(c, &idle, deadline, right, "all_gather", err, errlen);
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "all_gather: a transfer with rank %u or %u failed", left, right);
        }
        zd_reqs_cancel(c, c->reqs, 2 * total);
    }
    free(forwarded);
    return st;
}

static zs_status_t zd_ucx_all_reduce(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops,
                                     unsigned n, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    const uint32_t N = coll->world, r = coll->rank;
    zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    double *all;
    uint64_t seq = ++c->seq;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    all = calloc((size_t)N * n, sizeof(double));
    if (all == NULL || zd_reqs_reserve(c, 2 * (size_t)N) != ZS_OK) {
        free(all);
        return ZS_ERR_NO_MEMORY;
    }
    memcpy(all + (size_t)r * n, vals, n * sizeof(double));
    for (uint32_t q = 0; q < N; q++) {
        if (q == r) {
            continue;
        }
        c->reqs[q] = zd_post_recv(c, all + (size_t)q * n, n * sizeof(double), zd_tag(seq, q, 0, 0));
        c->reqs[N + q] = zd_post_send(c, q, vals, n * sizeof(double), zd_tag(seq, r, 0, 0));
    }
    for (uint32_t i = 0; i < 2 * N && st == ZS_OK;) {
        if (zd_req_test(&c->reqs[i], &st)) {
            i++;
            continue;
        }
        st = zd_pump(c, &idle, deadline, i % N, "all_reduce", err, errlen);
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "all_reduce: a transfer failed");
        }
        zd_reqs_cancel(c, c->reqs, 2 * (size_t)N);
        free(all);
        return st;
    }
    for (unsigned i = 0; i < n; i++) {
        double v = all[i];
        for (uint32_t q = 1; q < N; q++) {
            double x = all[(size_t)q * n + i];
            v = ops[i] == ZD_REDUCE_SUM ? v + x : (x > v || x != x ? x : v);
        }
        vals[i] = v;
    }
    free(all);
    return ZS_OK;
}

static zs_status_t zd_ucx_barrier(zd_coll_t *coll, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;

    return zd_mesh_barrier(c->mesh, err, errlen);
}

static void zd_ucx_destroy(zd_coll_t *coll)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;

    zs_aligned_free(c->part[0]);
    zs_aligned_free(c->part[1]);
    free(c->reqs);
    free(c);
}

static const zd_coll_ops_t zd_coll_ucx_ops = {
    .name = "ucx",
    .reduce_scatter = zd_ucx_reduce_scatter,
    .all_gather = zd_ucx_all_gather,
    .all_reduce = zd_ucx_all_reduce,
    .barrier = zd_ucx_barrier,
    .destroy = zd_ucx_destroy,
};

zs_status_t zd_coll_ucx_create(zd_mesh_t *mesh, const zk_exec_t *exec, zd_coll_t **coll_p)
{
    zd_coll_ucx_t *c;

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
    *coll_p = &c->base;
    return ZS_OK;
}
