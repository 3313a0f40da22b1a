/*
 * The ring algorithms of the `ucx` collectives (between hosts, or with direct_collectives =
 * false), over UCX tagged messages:
 * reduce_scatter: world-1 steps; partial sums travel in fp32 whatever the param dtype, each
 *   arriving segment is summed with this rank's contribution by the accumulate kernel, and the
 *   last step adds straight into the shard accumulator. Segments pipeline the steps: a segment
 *   is forwarded as soon as it is reduced.
 * all_gather: in place in the params region; every receive is posted up front (distinct
 *   destinations) and a segment is forwarded as soon as it arrives.
 * Beside the data, each rank sends a one-byte token to the right as it enters and passes on each
 * token from the left (N - 2 hops): the token of hop k says ranks r-1 .. r-1-k have entered, so
 * the call has waited for its peers until hop N - 2 arrives (coll.h wait_ns). The data flows
 * meanwhile; what a late rank holds up is counted as wait, with the hops' latency.
 */
#include "coll/ucx/coll_ucx_int.h"
#include "zs/error.h"
#include "zs/mem.h"
#include "zs/time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZD_SEG_MIN_BYTES (1u << 20)
#define ZD_MAX_SEGS      64u

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

/* One ring collective: who the neighbours are, how the slice is cut into segments, and the
 * requests and progress of the call. */
typedef struct zd_ring {
    zd_coll_ucx_t *c;
    uint32_t N, r, left, right;
    size_t dsz;
    uint64_t slice, seg, nseg, seq;
    zs_deadline_t deadline;
    unsigned idle;
    uint8_t *done; /* per segment (and step): reduced or forwarded */
    /* the tokens: one receive at a time from the left, a send per hop to the right */
    void *tok_recv;
    void **tok_send; /* [N - 1] */
    uint32_t tok_in; /* tokens received, hops 0 .. N - 2 */
    uint8_t tok_buf[2];
    uint64_t t0, wait_ns; /* the call's start; until the last token arrived */
    const char *what;
    char *err;
    size_t errlen;
} zd_ring_t;

static zs_status_t zd_ring_init(zd_ring_t *g, zd_coll_ucx_t *c, size_t seg_bytes, size_t dsz,
                                uint64_t slice, uint64_t seq, const char *what, char *err,
                                size_t errlen)
{
    memset(g, 0, sizeof(*g));
    g->c = c;
    g->N = c->base.world;
    g->r = c->base.rank;
    g->left = (g->r + g->N - 1) % g->N;
    g->right = (g->r + 1) % g->N;
    g->dsz = dsz;
    g->slice = slice;
    g->seg = zd_seg_elems(slice, seg_bytes);
    g->nseg = (slice + g->seg - 1) / g->seg;
    g->seq = seq;
    g->deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    g->what = what;
    g->err = err;
    g->errlen = errlen;
    g->t0 = zs_time_now_ns();
    g->done = calloc((size_t)g->N * g->nseg, 1);
    g->tok_send = calloc(g->N, sizeof(*g->tok_send));
    if (g->done == NULL || g->tok_send == NULL) {
        free(g->done);
        free(g->tok_send);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "%s: out of memory", what);
    }
    return ZS_OK;
}

static void zd_ring_free(zd_ring_t *g)
{
    free(g->done);
    free(g->tok_send);
}

/* Token hop k: receive it from the left and send it (this rank's own at hop 0, the left's
 * hop k - 1 passed on) to the right. */
static void zd_ring_tok_post(zd_ring_t *g, uint32_t k)
{
    if (g->N < 2) {
        return;
    }
    g->tok_recv =
        zd_ucx_post_recv(g->c, &g->tok_buf[0], 1, zd_ucx_tag(g->seq, g->left, k, ZD_SEG_TOKEN));
    g->tok_send[k] = zd_ucx_post_send(g->c, g->right, &g->tok_buf[1], 1,
                                      zd_ucx_tag(g->seq, g->r, k, ZD_SEG_TOKEN));
}

/* Take the tokens that arrived, pass each on; the last one ends the wait. */
static zs_status_t zd_ring_tok_poll(zd_ring_t *g)
{
    zs_status_t st = ZS_OK;

    while (g->tok_in + 1 < g->N && zd_ucx_req_test(&g->tok_recv, &st) && st == ZS_OK) {
        if (++g->tok_in + 1 < g->N) {
            zd_ring_tok_post(g, g->tok_in);
        } else {
            g->wait_ns = zs_time_now_ns() - g->t0;
        }
    }
    return st;
}

/* One round of progress, the tokens' included. */
static zs_status_t zd_ring_pump(zd_ring_t *g, uint32_t suspect)
{
    zs_status_t st = zd_ring_tok_poll(g);

    return st != ZS_OK
               ? st
               : zd_ucx_pump(g->c, &g->idle, g->deadline, suspect, g->what, g->err, g->errlen);
}

/* The elements [lo, lo + n) of segment j. */
static uint64_t zd_ring_seg(const zd_ring_t *g, uint64_t j, uint64_t *n_p)
{
    uint64_t lo = j * g->seg;

    *n_p = g->slice - lo < g->seg ? g->slice - lo : g->seg;
    return lo;
}

/* Wait until the n requests at reqs completed (this step's sends leave before their buffer is
 * reused), or fail naming `suspect`. */
static zs_status_t zd_ring_wait(zd_ring_t *g, void **reqs, uint64_t n, uint32_t suspect)
{
    zs_status_t st = ZS_OK;

    for (uint64_t j = 0; j < n && st == ZS_OK;) {
        if (zd_ucx_req_test(&reqs[j], &st)) {
            j++;
            continue;
        }
        st = zd_ring_pump(g, suspect);
    }
    return st;
}

static zs_status_t zd_ring_finish(zd_ring_t *g, zs_status_t st, size_t n_reqs)
{
    while (st == ZS_OK && g->tok_in + 1 < g->N) { /* the data is in: so are the peers */
        st = zd_ring_pump(g, g->left);
    }
    if (st == ZS_OK) {
        st = zd_ring_wait(g, g->tok_send, g->N - 1, g->right);
    }
    g->c->base.wait_ns += g->wait_ns;
    if (st != ZS_OK) {
        if (g->err[0] == '\0') {
            snprintf(g->err, g->errlen, "%s: a transfer with rank %u or %u failed", g->what,
                     g->left, g->right);
        }
        zd_ucx_reqs_cancel(g->c, g->c->reqs, n_reqs);
        zd_ucx_reqs_cancel(g->c, &g->tok_recv, 1);
        zd_ucx_reqs_cancel(g->c, g->tok_send, g->N - 1);
    }
    zd_ring_free(g);
    return st;
}

/* Reduce-scatter step 0: this rank's own contribution to chunk r-1, as fp32, to the right;
 * the left's arrives in part[0]. */
static zs_status_t zd_rs_start(zd_ring_t *g, const char *base, zs_dtype_t dtype, void **recv_req,
                               void **send_req)
{
    zd_coll_ucx_t *c = g->c;
    uint32_t idx = (g->r + g->N - 1) % g->N;
    const float *from = (const float *)(const void *)(base + (uint64_t)idx * g->slice * g->dsz);
    zs_status_t st = ZS_OK;

    if (dtype != ZS_DTYPE_F32) {
        st = zk_cast(&c->exec, c->part[1], ZS_DTYPE_F32, base + (uint64_t)idx * g->slice * g->dsz,
                     dtype, g->slice);
        from = c->part[1];
    }
    for (uint64_t j = 0; j < g->nseg && st == ZS_OK; j++) {
        uint64_t n, lo = zd_ring_seg(g, j, &n);
        recv_req[j] = zd_ucx_post_recv(c, c->part[0] + lo, n * sizeof(float),
                                       zd_ucx_tag(g->seq, g->left, 0, (uint32_t)j));
        send_req[j] = zd_ucx_post_send(c, g->right, from + lo, n * sizeof(float),
                                       zd_ucx_tag(g->seq, g->r, 0, (uint32_t)j));
    }
    return st;
}

/* Segment j of step k arrived in p: add this rank's own, then forward it (k + 2 < N) or land
 * it in the accumulator (the last step). */
static zs_status_t zd_rs_segment(zd_ring_t *g, uint32_t k, uint64_t j, float *p, const char *own,
                                 zs_dtype_t dtype, float *acc, unsigned flags, void **send_req)
{
    zd_coll_ucx_t *c = g->c;
    uint64_t n, lo = zd_ring_seg(g, j, &n);
    zs_status_t st = zk_accumulate(&c->exec, p + lo, own + lo * g->dsz, dtype, 1.0f, n);

    if (st != ZS_OK) {
        return st;
    }
    if (k + 2 < g->N) {
        send_req[j] = zd_ucx_post_send(c, g->right, p + lo, n * sizeof(float),
                                       zd_ucx_tag(g->seq, g->r, k + 1, (uint32_t)j));
        return ZS_OK;
    }
    if (flags & ZD_COLL_OVERWRITE) {
        return zk_cast(&c->exec, acc + lo, ZS_DTYPE_F32, p + lo, ZS_DTYPE_F32, n);
    }
    return zk_accumulate(&c->exec, acc + lo, p + lo, ZS_DTYPE_F32, 1.0f, n);
}

/* Step k: reduce every segment as it arrives; then post the receives of step k + 1. */
static zs_status_t zd_rs_step(zd_ring_t *g, uint32_t k, const char *base, zs_dtype_t dtype,
                              float *acc, unsigned flags, void **recv_req, void **send_req[2])
{
    uint32_t idx = (g->r + 2 * g->N - k - 2) % g->N;
    const char *own = base + (uint64_t)idx * g->slice * g->dsz;
    float *p = g->c->part[k % 2];
    uint64_t pending = g->nseg;
    zs_status_t st = ZS_OK;

    memset(g->done, 0, g->nseg);
    while (pending > 0 && st == ZS_OK) {
        for (uint64_t j = 0; j < g->nseg && st == ZS_OK; j++) {
            if (g->done[j] || !zd_ucx_req_test(&recv_req[j], &st) || st != ZS_OK) {
                continue;
            }
            st = zd_rs_segment(g, k, j, p, own, dtype, acc, flags, send_req[(k + 1) % 2]);
            g->done[j] = 1;
            pending--;
        }
        if (pending > 0 && st == ZS_OK) {
            st = zd_ring_pump(g, g->left);
        }
    }
    if (st == ZS_OK) {
        st = zd_ring_wait(g, send_req[k % 2], g->nseg, g->right);
    }
    for (uint64_t j = 0; st == ZS_OK && k + 2 < g->N && j < g->nseg; j++) {
        uint64_t n, lo = zd_ring_seg(g, j, &n);
        recv_req[j] = zd_ucx_post_recv(g->c, g->c->part[(k + 1) % 2] + lo, n * sizeof(float),
                                       zd_ucx_tag(g->seq, g->left, k + 1, (uint32_t)j));
    }
    return st;
}

zs_status_t zd_ring_reduce_scatter(zd_coll_ucx_t *c, const void *src, zs_dtype_t dtype,
                                   uint64_t slice, float *acc, unsigned flags, uint64_t seq,
                                   char *err, size_t errlen)
{
    zd_ring_t g;
    void **send_req[2];
    zs_status_t st;

    st = zd_ring_init(&g, c, sizeof(float), zs_dtype_size(dtype), slice, seq, "reduce_scatter", err,
                      errlen);
    if (st != ZS_OK) {
        return st;
    }
    if (zd_part_reserve(c, slice) != ZS_OK || zd_ucx_reqs_reserve(c, 3 * g.nseg) != ZS_OK) {
        zd_ring_free(&g);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY,
                       "reduce_scatter: out of memory for %llu elements",
                       (unsigned long long)slice);
    }
    send_req[0] = c->reqs + g.nseg;
    send_req[1] = c->reqs + 2 * g.nseg;
    zd_ring_tok_post(&g, 0);
    st = zd_rs_start(&g, src, dtype, c->reqs, send_req[0]);
    for (uint32_t k = 0; k + 1 < g.N && st == ZS_OK; k++) {
        st = zd_rs_step(&g, k, src, dtype, acc, flags, c->reqs, send_req);
    }
    return zd_ring_finish(&g, st, 3 * g.nseg);
}

/* All-gather: post every receive (step k gets chunk r-k-1 from the left, into its place) and
 * send this rank's chunk. */
static void zd_ag_start(zd_ring_t *g, char *base, void **recv_req, void **send_req)
{
    for (uint32_t k = 0; k + 1 < g->N; k++) {
        uint32_t idx = (g->r + 2 * g->N - k - 1) % g->N;
        for (uint64_t j = 0; j < g->nseg; j++) {
            uint64_t n, lo = zd_ring_seg(g, j, &n);
            recv_req[k * g->nseg + j] =
                zd_ucx_post_recv(g->c, base + ((uint64_t)idx * g->slice + lo) * g->dsz, n * g->dsz,
                                 zd_ucx_tag(g->seq, g->left, k, (uint32_t)j));
        }
    }
    for (uint64_t j = 0; j < g->nseg; j++) {
        uint64_t n, lo = zd_ring_seg(g, j, &n);
        send_req[j] =
            zd_ucx_post_send(g->c, g->right, base + ((uint64_t)g->r * g->slice + lo) * g->dsz,
                             n * g->dsz, zd_ucx_tag(g->seq, g->r, 0, (uint32_t)j));
    }
}

/* Forward every segment as it arrives, until all have. */
static zs_status_t zd_ag_forward(zd_ring_t *g, char *base, void **recv_req, void **send_req)
{
    uint64_t pending = (uint64_t)(g->N - 1) * g->nseg;
    zs_status_t st = ZS_OK;

    while (pending > 0 && st == ZS_OK) {
        for (uint32_t k = 0; k + 1 < g->N && st == ZS_OK; k++) {
            uint32_t idx = (g->r + 2 * g->N - k - 1) % g->N;
            for (uint64_t j = 0; j < g->nseg && st == ZS_OK; j++) {
                uint64_t i = k * g->nseg + j, n, lo = zd_ring_seg(g, j, &n);
                if (g->done[i] || !zd_ucx_req_test(&recv_req[i], &st) || st != ZS_OK) {
                    continue;
                }
                if (k + 2 < g->N) {
                    send_req[(k + 1) * g->nseg + j] = zd_ucx_post_send(
                        g->c, g->right, base + ((uint64_t)idx * g->slice + lo) * g->dsz, n * g->dsz,
                        zd_ucx_tag(g->seq, g->r, k + 1, (uint32_t)j));
                }
                g->done[i] = 1;
                pending--;
            }
        }
        if (pending > 0 && st == ZS_OK) {
            st = zd_ring_pump(g, g->left);
        }
    }
    return st;
}

zs_status_t zd_ring_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype, uint64_t slice,
                               uint64_t seq, char *err, size_t errlen)
{
    zd_ring_t g;
    uint64_t total;
    zs_status_t st;

    st = zd_ring_init(&g, c, zs_dtype_size(dtype), zs_dtype_size(dtype), slice, seq, "all_gather",
                      err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    total = (uint64_t)(g.N - 1) * g.nseg;
    if (zd_ucx_reqs_reserve(c, 2 * total) != ZS_OK) {
        zd_ring_free(&g);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "all_gather: out of memory");
    }
    zd_ring_tok_post(&g, 0);
    zd_ag_start(&g, buf, c->reqs, c->reqs + total);
    st = zd_ag_forward(&g, buf, c->reqs, c->reqs + total);
    if (st == ZS_OK) {
        st = zd_ring_wait(&g, c->reqs + total, total, g.right);
    }
    return zd_ring_finish(&g, st, 2 * total);
}
