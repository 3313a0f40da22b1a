/*
 * The point-to-point layer of the `ucx` collectives (coll/ucx/coll_ucx_int.h), below the ring and
 * the direct path: tagged sends and receives on the mesh's worker, request slots, progress with
 * a deadline and the mesh's abort, an exchange of small messages with every rank, and the
 * all-reduce of small scalars (everyone sends to everyone; all combine in rank order, so every
 * rank gets the same bits).
 */
#define _GNU_SOURCE
#include "coll/ucx/coll_ucx_int.h"
#include "zs/log.h"
#include "zs/mem.h"

#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t zd_ucx_tag(uint64_t seq, uint32_t src, uint32_t step, uint32_t seg)
{
    return ((seq & 0xffffffull) << 40) | ((uint64_t)(src & 0xffffu) << 24) |
           ((uint64_t)(step & 0xfffu) << 12) | (seg & 0xfffu);
}

static void zd_ucx_nop_send_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)request;
    (void)status;
    (void)user_data;
}

static void zd_ucx_nop_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                               void *user_data)
{
    (void)request;
    (void)status;
    (void)info;
    (void)user_data;
}

void *zd_ucx_post_send(zd_coll_ucx_t *c, uint32_t to, const void *buf, size_t bytes, uint64_t tag)
{
    ucp_request_param_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    prm.cb.send = zd_ucx_nop_send_cb;
    return ucp_tag_send_nbx(zd_mesh_ep(c->mesh, to), buf, bytes, tag, &prm);
}

void *zd_ucx_post_recv(zd_coll_ucx_t *c, void *buf, size_t bytes, uint64_t tag)
{
    ucp_request_param_t prm;

    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    prm.cb.recv = zd_ucx_nop_recv_cb;
    return ucp_tag_recv_nbx(c->worker, buf, bytes, tag, UINT64_MAX, &prm);
}

/* Is *req complete? Frees it and clears the slot. A failed request sets *st. */
bool zd_ucx_req_test(void **req, zs_status_t *st)
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

/* UCX 1.13 cancels receives but not sends: a large send to a daemon that died stays in
 * progress for good (the data endpoints have no peer error mode). So the wait is bounded, and
 * a request still in progress is freed anyway, which UCX allows: the mesh is torn down after
 * a failed collective, and its endpoints' force close purges what is left. Once the mesh has
 * aborted (a rank was lost: the usual reason a collective fails) nothing is worth waiting
 * for, and the recovery is waiting: 1 s spent here on a send to the lost daemon was most of
 * one in three in-place recoveries in replica_bench. */
void zd_ucx_reqs_cancel(zd_coll_ucx_t *c, void **reqs, size_t n)
{
    zs_deadline_t d = zs_deadline_in_ms(zd_mesh_aborted(c->mesh, NULL, 0) ? 20 : 1000);

    for (size_t i = 0; i < n; i++) {
        if (reqs[i] != NULL && !UCS_PTR_IS_ERR(reqs[i])) {
            ucp_request_cancel(c->worker, reqs[i]);
            while (ucp_request_check_status(reqs[i]) == UCS_INPROGRESS && !zs_deadline_expired(d)) {
                ucp_worker_progress(c->worker);
            }
            ucp_request_free(reqs[i]);
        }
        reqs[i] = NULL;
    }
}

zs_status_t zd_ucx_reqs_reserve(zd_coll_ucx_t *c, size_t n)
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

/* Nothing moved for ZD_COLL_IDLE_SPINS rounds of progress: sleep until the worker has an event
 * (its wakeup fd), at most ZD_COLL_SLEEP_MS. A daemon shares the host's cores with the trainers
 * whose gradients it waits for: spinning on (with sched_yield, which the scheduler may ignore)
 * took the CPU from the very processes it waited on, 30 ms a step per rank on a 2-core host
 * training the 31.7 M MLP. The cap bounds what a transport without wakeup events could cost. */
static void zd_ucx_sleep(zd_coll_ucx_t *c)
{
    int fd = zd_mesh_arm(c->mesh);
    struct pollfd p = {.fd = fd, .events = POLLIN};

    if (fd == -2) {
        return; /* events pending: progress them */
    }
    if (fd < 0) {
        sched_yield();
        return;
    }
    (void)poll(&p, 1, ZD_COLL_SLEEP_MS);
}

/* One round of progress. Fails when the mesh aborted or the deadline passed (then the job is
 * aborted everywhere, naming `suspect`). */
zs_status_t zd_ucx_pump(zd_coll_ucx_t *c, unsigned *idle, zs_deadline_t deadline, uint32_t suspect,
                        const char *what, char *err, size_t errlen)
{
    char why[512];

    if (ucp_worker_progress(c->worker) != 0) {
        *idle = 0;
        return ZS_OK;
    }
    if (++*idle < ZD_COLL_IDLE_SPINS) {
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
    zd_ucx_sleep(c);
    return ZS_OK;
}

/* Send `len` bytes of c->out to every other rank and receive one message of at most
 * ZD_COLL_MSG_MAX bytes from each into c->in (lengths in c->in_info), within the deadline. */
zs_status_t zd_ucx_exchange(zd_coll_ucx_t *c, size_t len, uint64_t seq, uint32_t segno,
                            zs_deadline_t deadline, const char *what, char *err, size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    if (zd_ucx_reqs_reserve(c, 2 * (size_t)N) != ZS_OK) {
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
        c->reqs[q] =
            ucp_tag_recv_nbx(c->worker, c->in + (size_t)q * ZD_COLL_MSG_MAX, ZD_COLL_MSG_MAX,
                             zd_ucx_tag(seq, q, 0, segno), UINT64_MAX, &prm);
        c->reqs[N + q] = zd_ucx_post_send(c, q, c->out, len, zd_ucx_tag(seq, r, 0, segno));
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
        } else if (zd_ucx_req_test(&c->reqs[i], &st)) {
            i++;
            continue;
        }
        st = zd_ucx_pump(c, &idle, deadline, i % N, what, err, errlen);
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "%s: a transfer failed", what);
        }
        zd_ucx_reqs_cancel(c, c->reqs, 2 * (size_t)N);
    }
    return st;
}

zs_status_t zd_ucx_all_reduce(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops, unsigned n,
                              char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    const uint32_t N = coll->world, r = coll->rank;
    zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    double *all;
    uint64_t seq = ++c->seq;
    unsigned idle = 0;
    zs_status_t st = ZS_OK;

    all = calloc((size_t)N * n, sizeof(double));
    if (all == NULL || zd_ucx_reqs_reserve(c, 2 * (size_t)N) != ZS_OK) {
        free(all);
        return ZS_ERR_NO_MEMORY;
    }
    memcpy(all + (size_t)r * n, vals, n * sizeof(double));
    for (uint32_t q = 0; q < N; q++) {
        if (q == r) {
            continue;
        }
        c->reqs[q] =
            zd_ucx_post_recv(c, all + (size_t)q * n, n * sizeof(double), zd_ucx_tag(seq, q, 0, 0));
        c->reqs[N + q] = zd_ucx_post_send(c, q, vals, n * sizeof(double), zd_ucx_tag(seq, r, 0, 0));
    }
    for (uint32_t i = 0; i < 2 * N && st == ZS_OK;) {
        if (zd_ucx_req_test(&c->reqs[i], &st)) {
            i++;
            continue;
        }
        st = zd_ucx_pump(c, &idle, deadline, i % N, "all_reduce", err, errlen);
    }
    if (st != ZS_OK) {
        if (err[0] == '\0') {
            snprintf(err, errlen, "all_reduce: a transfer failed");
        }
        zd_ucx_reqs_cancel(c, c->reqs, 2 * (size_t)N);
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

/* Post the receives and sends of a sendrecv into c->reqs: receives at [0, n_recv), sends
 * after. Every receive gets a request, whose test gives the length (as zd_ucx_exchange). */
static void zd_ucx_sendrecv_post(zd_coll_ucx_t *c, uint64_t seq, uint32_t to,
                                 const zd_coll_buf_t *send, unsigned n_send, uint32_t from,
                                 const zd_coll_buf_t *recv, unsigned n_recv)
{
    for (unsigned i = 0; i < n_recv; i++) {
        ucp_request_param_t prm;

        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        prm.cb.recv = zd_ucx_nop_recv_cb;
        c->reqs[i] = ucp_tag_recv_nbx(c->worker, recv[i].addr, recv[i].bytes,
                                      zd_ucx_tag(seq, from, 0, i), UINT64_MAX, &prm);
    }
    for (unsigned i = 0; i < n_send; i++) {
        c->reqs[n_recv + i] = zd_ucx_post_send(c, to, send[i].addr, send[i].bytes,
                                               zd_ucx_tag(seq, c->base.rank, 0, i));
    }
}

/* Is receive *req complete, with exactly `bytes`? As zd_ucx_req_test otherwise. */
static bool zd_ucx_recv_test(void **req, size_t bytes, zs_status_t *st)
{
    ucp_tag_recv_info_t info = {0};
    ucs_status_t us;

    if (*req == NULL || UCS_PTR_IS_ERR(*req)) {
        return zd_ucx_req_test(req, st);
    }
    us = ucp_tag_recv_request_test(*req, &info);
    if (us == UCS_INPROGRESS) {
        return false;
    }
    ucp_request_free(*req);
    *req = NULL;
    if (us != UCS_OK) {
        *st = ZS_ERR_PEER_LOST;
    } else if (info.length != bytes) {
        *st = ZS_ERR_PROTOCOL;
    }
    return true;
}

zs_status_t zd_ucx_sendrecv(zd_coll_t *coll, uint32_t to, const zd_coll_buf_t *send,
                            unsigned n_send, uint32_t from, const zd_coll_buf_t *recv,
                            unsigned n_recv, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    uint64_t seq = ++c->seq;
    unsigned idle = 0, n;
    bool pumped = false; /* the pump failed and said why in err */
    zs_status_t st = ZS_OK;

    n_send = to < coll->world && to != coll->rank ? n_send : 0;
    n_recv = from < coll->world && from != coll->rank ? n_recv : 0;
    n = n_send + n_recv;
    if (n_send > ZD_COLL_MAX_BUFS || n_recv > ZD_COLL_MAX_BUFS) {
        snprintf(err, errlen, "sendrecv: more than %u messages", ZD_COLL_MAX_BUFS);
        return ZS_ERR_INVALID;
    }
    if (zd_ucx_reqs_reserve(c, n) != ZS_OK) {
        snprintf(err, errlen, "sendrecv: out of memory");
        return ZS_ERR_NO_MEMORY;
    }
    zd_ucx_sendrecv_post(c, seq, to, send, n_send, from, recv, n_recv);
    for (unsigned i = 0; i < n && st == ZS_OK;) {
        bool done = i < n_recv ? zd_ucx_recv_test(&c->reqs[i], recv[i].bytes, &st)
                               : zd_ucx_req_test(&c->reqs[i], &st);
        if (done) {
            i++;
            continue;
        }
        st = zd_ucx_pump(c, &idle, deadline, i < n_recv ? from : to, "sendrecv", err, errlen);
        pumped = st != ZS_OK;
    }
    if (st != ZS_OK) {
        if (!pumped) {
            snprintf(err, errlen,
                     st == ZS_ERR_PROTOCOL ? "sendrecv: rank %u sent a message of another size"
                                           : "sendrecv: a transfer with rank %u failed",
                     from);
        }
        zd_ucx_reqs_cancel(c, c->reqs, n);
    }
    return st;
}
