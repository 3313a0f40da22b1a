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
 *
 * Direct algorithm (every rank on this host, agreed at share time): each rank offers its
 * memfd regions (params, gradient slots, stage-1 grads); the peers open them through
 * /proc/<pid>/fd/<fd> (as UCX's posix transport does), check device and inode, and map them
 * read-only. A collective is then: CollReady to every peer (where the buffer lies), each rank
 * reads what it needs straight from its peers' buffers (reduce-scatter: its slice of every
 * rank's bucket, summed in rank order into the accumulator; all-gather: every peer's slice
 * into its own params region), CollDone to every peer, and return once all peers are done
 * reading this rank's buffer. One copy, no staging, no chunking.
 * Tags: collective sequence (24 bits) | source rank (16) | step (12) | segment (12).
 */
#define _GNU_SOURCE
#include "coll.h"
#include "mesh.h"
#include "zerod/mesh/v1/mesh.pb-c.h"
#include "zs/log.h"
#include "zs/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZD_SEG_MIN_BYTES (1u << 20)
#define ZD_MAX_SEGS      64u
#define ZD_IDLE_SPINS    1000u
/* segment numbers of the direct algorithm's messages (ring segments stay below ZD_MAX_SEGS) */
#define ZD_SEG_SHARE 0xffdu
#define ZD_SEG_READY 0xffeu
#define ZD_SEG_DONE  0xfffu
#define ZD_MSG_MAX   1024u
/* reduce-scatter of more than two sources: elements per block, so that the accumulator block
 * stays in cache while every source is added to it */
#define ZD_RS_BLOCK 32768u

typedef struct zd_map {
    const char *addr;
    size_t size;
} zd_map_t;

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
    /* direct algorithm */
    bool direct_allowed;                 /* config key direct_collectives */
    bool direct;                         /* agreed by every rank at the last share */
    zd_map_t local[ZD_COLL_MAX_REGIONS]; /* this rank's offered regions */
    unsigned n_local;
    zd_map_t *peer;               /* [world][ZD_COLL_MAX_REGIONS] read-only mappings */
    const char **peer_buf;        /* [world] this collective's buffer of each peer */
    uint8_t *in;                  /* [world][ZD_MSG_MAX] small-message landing */
    ucp_tag_recv_info_t *in_info; /* [world] */
    uint8_t out[ZD_MSG_MAX];
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

static zs_status_t zd_ring_reduce_scatter(zd_coll_ucx_t *c, const void *src, zs_dtype_t dtype,
                                          uint64_t slice, float *acc, unsigned flags, uint64_t seq,
                                          char *err, size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    const uint32_t left = (r + N - 1) % N, right = (r + 1) % N;
    const size_t dsz = zs_dtype_size(dtype);
    const char *base = src;
    uint64_t seg, nseg;
    zs_deadline_t deadline;
    void **recv_req, **send_req[2];
    uint8_t *reduced;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    seg = zd_seg_elems(slice, sizeof(float));
    nseg = (slice + seg - 1) / seg;
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
        if (dtype == ZS_DTYPE_F32) {
            from = (const float *)(const void *)(base + (uint64_t)idx * slice * dsz);
        } else {
            st = zk_cast(&c->exec, c->part[1], ZS_DTYPE_F32, base + (uint64_t)idx * slice * dsz,
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
                } else if (flags & ZD_COLL_OVERWRITE) {
                    st = zk_cast(&c->exec, acc + lo, ZS_DTYPE_F32, p + lo, ZS_DTYPE_F32, n);
                } else {
                    st = zk_accumulate(&c->exec, acc + lo, p + lo, ZS_DTYPE_F32, 1.0f, n);
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

static zs_status_t zd_ring_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype, uint64_t slice,
                                      uint64_t seq, char *err, size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    const uint32_t left = (r + N - 1) % N, right = (r + 1) % N;
    const size_t dsz = zs_dtype_size(dtype);
    char *base = buf;
    uint64_t seg, nseg, total;
    zs_deadline_t deadline;
    void **recv_req, **send_req;
    uint8_t *forwarded;
    uint64_t pending;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    seg = zd_seg_elems(slice, dsz);
    nseg = (slice + seg - 1) / seg;
    total = (uint64_t)(N - 1) * nseg;
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

/* ---- direct algorithm: co-located ranks read each other's regions ----------------------- */

/* Send `len` bytes of c->out to every other rank and receive one message of at most
 * ZD_MSG_MAX bytes from each into c->in (lengths in c->in_info), within the deadline. */
static zs_status_t zd_exchange(zd_coll_ucx_t *c, size_t len, uint64_t seq, uint32_t segno,
                               zs_deadline_t deadline, const char *what, char *err, size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    if (zd_reqs_reserve(c, 2 * (size_t)N) != ZS_OK) {
        snprintf(err, errlen, "%s: out of memory", what);
        return ZS_ERR_NO_MEMORY;
    }
    for (uint32_t q = 0; q < N; q++) {
        ucp_request_param_t prm;

        if (q == r) {
            continue;
        }
        memset(&prm, 0, sizeof(prm));
        memset(&c->in_info[q], 0, sizeof(c->in_info[q]));
        /* always a request, whose test gives the length (UCX 1.13 leaves recv_info unset when
         * a message completes in place) */
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        prm.cb.recv = zd_ucx_nop_recv_cb;
        c->reqs[q] = ucp_tag_recv_nbx(c->worker, c->in + (size_t)q * ZD_MSG_MAX, ZD_MSG_MAX,
                                      zd_tag(seq, q, 0, segno), UINT64_MAX, &prm);
        c->reqs[N + q] = zd_post_send(c, q, c->out, len, zd_tag(seq, r, 0, segno));
    }
    for (uint32_t i = 0; i < 2 * N && st == ZS_OK;) {
        if (i < N && c->reqs[i] != NULL && !UCS_PTR_IS_ERR(c->reqs[i])) {
            ucs_status_t us = ucp_tag_recv_request_test(c->reqs[i], &c->in_info[i]);
            if (us != UCS_INPROGRESS) {
                ucp_request_free(c->reqs[i]);
                c->reqs[i] = NULL;
                st = us == UCS_OK ? ZS_OK : ZS_ERR_PEER_LOST;
                i++;
                continue;
            }
        } else if (zd_req_test(&c->reqs[i], &st)) {
            i++;
            continue;
        }
        st = zd_pump(c, &idle, deadline, i % N, what, err, errlen);
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "%s: a transfer failed", what);
        }
        zd_reqs_cancel(c, c->reqs, 2 * (size_t)N);
    }
    return st;
}

static void zd_direct_unmap(zd_coll_ucx_t *c)
{
    for (size_t i = 0; c->peer != NULL && i < (size_t)c->base.world * ZD_COLL_MAX_REGIONS; i++) {
        if (c->peer[i].addr != NULL) {
            munmap((void *)c->peer[i].addr, c->peer[i].size);
        }
        c->peer[i].addr = NULL;
        c->peer[i].size = 0;
    }
    c->direct = false;
}

static uint64_t zd_ns_inode(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* This process's host identity; false when it cannot be read. */
static bool zd_host_identity(char *boot_id, size_t len, uint64_t *net_ns, uint64_t *pid_ns)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    bool ok = f != NULL && fgets(boot_id, (int)len, f) != NULL;

    if (f != NULL) {
        fclose(f);
    }
    boot_id[ok ? strcspn(boot_id, "\n") : 0] = '\0';
    *net_ns = zd_ns_inode("/proc/self/ns/net");
    *pid_ns = zd_ns_inode("/proc/self/ns/pid");
    return ok && boot_id[0] != '\0' && *net_ns != 0 && *pid_ns != 0;
}

/* Map peer q's offered region i read-only; false with why. */
static bool zd_direct_map(zd_coll_ucx_t *c, uint32_t q, uint32_t pid, unsigned i,
                          const Zerod__Mesh__V1__SharedRegion *sr, char *why, size_t whylen)
{
    char path[64], target[64] = "";
    struct stat sb;
    void *addr;
    int fd;

    if (sr->fd < 0 || sr->size == 0) {
        return true;
    }
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, sr->fd);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "rank %u cannot open rank %u's region %u (%s): %s", c->base.rank, q,
                 i, path, strerror(errno));
        return false;
    }
    /* only a size-sealed zerod memfd: it cannot shrink under the mapping (no SIGBUS) */
    if (readlink(path, target, sizeof(target) - 1) < 0 ||
        strncmp(target, "/memfd:zerod", 12) != 0 || (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) == 0) {
        snprintf(why, whylen, "rank %u: %s is not a size-sealed zerod memfd", c->base.rank, path);
        close(fd);
        return false;
    }
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_dev != sr->dev || (uint64_t)sb.st_ino != sr->ino ||
        (uint64_t)sb.st_size < sr->size || sr->size > SIZE_MAX) {
        snprintf(why, whylen,
                 "rank %u: %s is not the region rank %u offered (device, inode or "
                 "size differ)",
                 c->base.rank, path, q);
        close(fd);
        return false;
    }
    addr = mmap(NULL, (size_t)sr->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) {
        snprintf(why, whylen, "rank %u cannot map rank %u's region %u (%llu bytes): %s",
                 c->base.rank, q, i, (unsigned long long)sr->size, strerror(errno));
        return false;
    }
    c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + i].addr = addr;
    c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + i].size = (size_t)sr->size;
    return true;
}

static zs_status_t zd_ucx_share(zd_coll_t *coll, const zs_region_t *const *regions, unsigned n,
                                char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    const uint32_t N = coll->world, r = coll->rank;
    Zerod__Mesh__V1__RegionOffer offer = ZEROD__MESH__V1__REGION_OFFER__INIT;
    Zerod__Mesh__V1__HostIdentity host = ZEROD__MESH__V1__HOST_IDENTITY__INIT;
    Zerod__Mesh__V1__SharedRegion sr[ZD_COLL_MAX_REGIONS];
    Zerod__Mesh__V1__SharedRegion *srp[ZD_COLL_MAX_REGIONS];
    char boot_id[64] = "", why[320] = "";
    zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    uint64_t seq = ++c->seq;
    bool ok;
    double fail;
    static const zd_reduce_op_t max_op = ZD_REDUCE_MAX;
    zs_status_t st;

    zd_direct_unmap(c);
    c->n_local = 0;
    if (n > ZD_COLL_MAX_REGIONS) {
        snprintf(err, errlen, "share: %u regions (at most %u)", n, ZD_COLL_MAX_REGIONS);
        return ZS_ERR_INVALID;
    }
    ok = c->direct_allowed;
    if (!ok) {
        snprintf(why, sizeof(why), "direct_collectives = false on rank %u", r);
    } else if (!zd_host_identity(boot_id, sizeof(boot_id), &host.net_ns, &host.pid_ns)) {
        ok = false;
        snprintf(why, sizeof(why), "rank %u cannot read its boot id and namespaces from /proc", r);
    }
    host.boot_id = boot_id;
    offer.enabled = ok;
    offer.host = &host;
    offer.pid = (uint32_t)getpid();
    for (unsigned i = 0; i < n; i++) {
        struct stat sb;

        zerod__mesh__v1__shared_region__init(&sr[i]);
        srp[i] = &sr[i];
        sr[i].fd = -1;
        c->local[i].addr = regions[i]->addr;
        c->local[i].size = regions[i]->addr != NULL ? regions[i]->size : 0;
        if (regions[i]->fd >= 0 && regions[i]->size > 0 && fstat(regions[i]->fd, &sb) == 0) {
            sr[i].fd = regions[i]->fd;
            sr[i].size = regions[i]->size;
            sr[i].dev = (uint64_t)sb.st_dev;
            sr[i].ino = (uint64_t)sb.st_ino;
        }
    }
    c->n_local = n;
    offer.n_regions = n;
    offer.regions = srp;
    if (zerod__mesh__v1__region_offer__get_packed_size(&offer) > ZD_MSG_MAX) {
        snprintf(err, errlen, "share: region offer larger than %u bytes", ZD_MSG_MAX);
        return ZS_ERR_INVALID;
    }
    st = zd_exchange(c, zerod__mesh__v1__region_offer__pack(&offer, c->out), seq, ZD_SEG_SHARE,
                     deadline, "share", err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    for (uint32_t q = 0; q < N; q++) {
        Zerod__Mesh__V1__RegionOffer *po;

        if (q == r) {
            continue;
        }
        po = zerod__mesh__v1__region_offer__unpack(NULL, c->in_info[q].length,
                                                   c->in + (size_t)q * ZD_MSG_MAX);
        if (po == NULL) {
            snprintf(why, sizeof(why), "rank %u sent an unreadable region offer", q);
            ok = false;
            continue;
        }
        if (ok && !po->enabled) {
            snprintf(why, sizeof(why),
                     "rank %u cannot take part (direct_collectives = false or "
                     "no /proc)",
                     q);
            ok = false;
        }
        if (ok && (po->host == NULL || strcmp(po->host->boot_id, boot_id) != 0 ||
                   po->host->net_ns != host.net_ns || po->host->pid_ns != host.pid_ns)) {
            snprintf(why, sizeof(why), "rank %u runs on another host or in other namespaces", q);
            ok = false;
        }
        if (ok && po->n_regions > ZD_COLL_MAX_REGIONS) {
            snprintf(why, sizeof(why), "rank %u offered %zu regions (at most %u)", q, po->n_regions,
                     ZD_COLL_MAX_REGIONS);
            ok = false;
        }
        for (unsigned i = 0; ok && i < po->n_regions; i++) {
            ok = zd_direct_map(c, q, po->pid, i, po->regions[i], why, sizeof(why));
        }
        zerod__mesh__v1__region_offer__free_unpacked(po, NULL);
    }
    /* every rank must choose the same algorithm */
    fail = ok ? 0.0 : 1.0;
    st = zd_ucx_all_reduce(coll, &fail, &max_op, 1, err, errlen);
    if (st != ZS_OK) {
        zd_direct_unmap(c);
        return st;
    }
    if (fail != 0.0) {
        zd_direct_unmap(c);
        snprintf(coll->algo, sizeof(coll->algo), "ring over UCX (no direct path: %s)",
                 ok ? "another rank cannot use it" : why);
    } else {
        c->direct = true;
        snprintf(coll->algo, sizeof(coll->algo),
                 "direct (%u ranks on this host read each other's regions in place)", N);
    }
    zs_info(ZS_SUB_MESH, "collectives: %s", coll->algo);
    return ZS_OK;
}

/* Where [buf, buf + bytes) lies in this rank's offered regions. */
static bool zd_direct_locate(const zd_coll_ucx_t *c, const void *buf, size_t bytes,
                             uint32_t *region, uint64_t *offset)
{
    for (unsigned i = 0; i < c->n_local; i++) {
        const char *lo = c->local[i].addr;
        if (lo != NULL && (const char *)buf >= lo && bytes <= c->local[i].size &&
            (size_t)((const char *)buf - lo) <= c->local[i].size - bytes) {
            *region = i;
            *offset = (uint64_t)((const char *)buf - lo);
            return true;
        }
    }
    return false;
}

/* Opening round: tell every peer where this rank's buffer is, learn theirs (c->peer_buf).
 * *direct false: some rank's buffer is outside its regions, every rank falls back to the
 * ring for this collective. */
static zs_status_t zd_direct_begin(zd_coll_ucx_t *c, const void *buf, size_t bytes, uint64_t seq,
                                   zs_deadline_t deadline, bool *direct, const char *what,
                                   char *err, size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    Zerod__Mesh__V1__CollReady ready = ZEROD__MESH__V1__COLL_READY__INIT;
    uint32_t region = 0;
    uint64_t offset = 0;
    zs_status_t st;

    ready.direct = zd_direct_locate(c, buf, bytes, &region, &offset);
    ready.region = region;
    ready.offset = offset;
    st = zd_exchange(c, zerod__mesh__v1__coll_ready__pack(&ready, c->out), seq, ZD_SEG_READY,
                     deadline, what, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    *direct = ready.direct;
    c->peer_buf[r] = buf;
    for (uint32_t q = 0; q < N; q++) {
        Zerod__Mesh__V1__CollReady *pr;
        const zd_map_t *m;

        if (q == r) {
            continue;
        }
        pr = zerod__mesh__v1__coll_ready__unpack(NULL, c->in_info[q].length,
                                                 c->in + (size_t)q * ZD_MSG_MAX);
        if (pr == NULL) {
            zd_mesh_abort(c->mesh, q, "rank %u sent an unreadable CollReady", q);
            snprintf(err, errlen, "%s: rank %u sent an unreadable CollReady", what, q);
            return ZS_ERR_PEER_LOST;
        }
        if (!pr->direct) {
            *direct = false;
        }
        m = pr->region < ZD_COLL_MAX_REGIONS
                ? &c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + pr->region]
                : NULL;
        if (pr->direct &&
            (m == NULL || m->addr == NULL || bytes > m->size || pr->offset > m->size - bytes)) {
            zd_mesh_abort(c->mesh, q,
                          "rank %u announced %zu bytes at offset %llu of its region %u, outside "
                          "what it offered",
                          q, bytes, (unsigned long long)pr->offset, pr->region);
            snprintf(err, errlen, "%s: rank %u announced a buffer outside its regions", what, q);
            zerod__mesh__v1__coll_ready__free_unpacked(pr, NULL);
            return ZS_ERR_PEER_LOST;
        }
        c->peer_buf[q] = pr->direct ? m->addr + pr->offset : NULL;
        zerod__mesh__v1__coll_ready__free_unpacked(pr, NULL);
    }
    return ZS_OK;
}

/* Closing round: this rank is done reading; return once every peer is done with ours. */
static zs_status_t zd_direct_end(zd_coll_ucx_t *c, uint64_t seq, zs_deadline_t deadline,
                                 const char *what, char *err, size_t errlen)
{
    Zerod__Mesh__V1__CollDone done = ZEROD__MESH__V1__COLL_DONE__INIT;

    return zd_exchange(c, zerod__mesh__v1__coll_done__pack(&done, c->out), seq, ZD_SEG_DONE,
                       deadline, what, err, errlen);
}

#define ZD_RS_MAX_WORKERS 256u /* the threads key's upper bound */

typedef struct zd_rs_job {
    const zd_coll_ucx_t *c;
    zs_dtype_t dtype;
    size_t dsz;
    uint64_t slice;
    float *acc;
    unsigned flags;
    zs_status_t st[ZD_RS_MAX_WORKERS];
} zd_rs_job_t;

/* One worker's range of the direct reduce-scatter: acc (=|+=) Σ_q src_q, in rank order. */
static void zd_rs_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    zd_rs_job_t *j = arg;
    const uint32_t N = j->c->base.world, r = j->c->base.rank;
    const zk_exec_t one = {.variant = j->c->exec.variant, .pool = NULL};
    const uint64_t at = (uint64_t)r * j->slice;
    const bool overwrite = (j->flags & ZD_COLL_OVERWRITE) != 0;
    const char *const *src = j->c->peer_buf;
    zs_status_t st = ZS_OK;

    if (N == 2 && j->dtype == ZS_DTYPE_F32 && overwrite) {
        /* one pass; streaming stores for large ranges */
        st = zk_reduce(&one, j->acc + b, (const float *)(const void *)src[0] + at + b,
                       (const float *)(const void *)src[1] + at + b, ZS_DTYPE_F32, e - b);
    } else {
        /* block by block, so the accumulator block stays in cache across the sources */
        for (size_t lo = b; lo < e && st == ZS_OK; lo += ZD_RS_BLOCK) {
            size_t n = e - lo < ZD_RS_BLOCK ? e - lo : ZD_RS_BLOCK;
            for (uint32_t q = 0; q < N && st == ZS_OK; q++) {
                const char *s = src[q] + (at + lo) * j->dsz;
                st = q == 0 && overwrite ? zk_cast(&one, j->acc + lo, ZS_DTYPE_F32, s, j->dtype, n)
                                         : zk_accumulate(&one, j->acc + lo, s, j->dtype, 1.0f, n);
            }
        }
    }
    if (worker < ZD_RS_MAX_WORKERS) {
        j->st[worker] = st;
    }
}

static zs_status_t zd_direct_reduce_scatter(zd_coll_ucx_t *c, const void *src, zs_dtype_t dtype,
                                            uint64_t slice, float *acc, unsigned flags, char *err,
                                            size_t errlen)
{
    zd_rs_job_t job;
    zs_status_t st;

    memset(&job, 0, sizeof(job));
    job.c = c;
    job.dtype = dtype;
    job.dsz = zs_dtype_size(dtype);
    job.slice = slice;
    job.acc = acc;
    job.flags = flags;
    st = zk_pool_run(c->exec.pool, slice, 1024, zd_rs_chunk, &job);
    for (unsigned w = 0; w < ZD_RS_MAX_WORKERS && st == ZS_OK; w++) {
        st = job.st[w];
    }
    if (st != ZS_OK) {
        snprintf(err, errlen, "reduce_scatter: %s", zk_last_error());
    }
    return st;
}

static zs_status_t zd_direct_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype,
                                        uint64_t slice, char *err, size_t errlen)
{
    const size_t bytes = slice * zs_dtype_size(dtype);
    zs_status_t st = ZS_OK;

    for (uint32_t q = 0; q < c->base.world && st == ZS_OK; q++) {
        if (q != c->base.rank) {
            st = zk_cast(&c->exec, (char *)buf + q * bytes, dtype, c->peer_buf[q] + q * bytes,
                         dtype, slice);
        }
    }
    if (st != ZS_OK) {
        snprintf(err, errlen, "all_gather: %s", zk_last_error());
    }
    return st;
}

/* ---- the interface ---------------------------------------------------------------------- */

/* The arguments of one reduce-scatter or all-gather, for zd_ucx_run. */
typedef struct zd_coll_call {
    bool rs;   /* reduce-scatter, else all-gather */
    void *buf; /* reduce-scatter: the source bucket; all-gather: the buffer gathered into */
    zs_dtype_t dtype;
    uint64_t slice;
    float *acc;
    unsigned flags;
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

    if (k->slice == 0) {
        return ZS_OK;
    }
    seq = ++c->seq;
    if (c->direct) {
        zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
        st = zd_direct_begin(c, k->buf, k->slice * c->base.world * zs_dtype_size(k->dtype), seq,
                             deadline, &direct, what, err, errlen);
        if (st == ZS_OK && direct) {
            st = k->rs ? zd_direct_reduce_scatter(c, k->buf, k->dtype, k->slice, k->acc, k->flags,
                                                  err, errlen)
                       : zd_direct_all_gather(c, k->buf, k->dtype, k->slice, err, errlen);
            if (st != ZS_OK) {
                zd_mesh_abort(c->mesh, c->base.rank, "rank %u: %s", c->base.rank, err);
                return st;
            }
            return zd_direct_end(c, seq, deadline, what, err, errlen);
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
                                         uint64_t slice, float *acc, unsigned flags, char *err,
                                         size_t errlen)
{
    const zd_coll_call_t k = {true, (void *)src, dtype, slice, acc, flags};

    return zd_ucx_run((zd_coll_ucx_t *)coll, &k, err, errlen);
}

static zs_status_t zd_ucx_all_gather(zd_coll_t *coll, void *buf, zs_dtype_t dtype, uint64_t slice,
                                     char *err, size_t errlen)
{
    const zd_coll_call_t k = {false, buf, dtype, slice, NULL, 0};

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
    .share = zd_ucx_share,
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
    c->in = calloc(N, ZD_MSG_MAX);
    c->in_info = calloc(N, sizeof(*c->in_info));
    if (c->peer == NULL || c->peer_buf == NULL || c->in == NULL || c->in_info == NULL) {
        zd_ucx_destroy(&c->base);
        return ZS_ERR_NO_MEMORY;
    }
    *coll_p = &c->base;
    return ZS_OK;
}
