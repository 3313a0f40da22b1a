#define _GNU_SOURCE
#include "mesh/heartbeat.h"

#include "mesh/ucx_util.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define ZD_HEARTBEAT_LEAVE_MS 500 /* LEAVE: how long to wait until it is out */
#define ZD_HEARTBEAT_MSG_MAX  4096

typedef struct zd_heartbeat_peer {
    zd_heartbeat_t *hb;
    uint32_t rank;
    uint64_t last_seen_ns; /* heartbeat thread only */
    bool left;             /* it said LEAVE: its endpoint closing is expected */
} zd_heartbeat_peer_t;

struct zd_heartbeat {
    zd_heartbeat_params_t p;
    char job_id[128];
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *address;
    size_t address_len;
    int efd;    /* the worker's event fd; -1: poll on a short timeout instead */
    int cmd_fd; /* eventfd: a command or stop from another thread */
    ucp_ep_h *eps;
    zd_heartbeat_peer_t *peers;
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* under lock */
    bool stop;
    bool cmd_abort, cmd_leave, leave_done;
    bool aborted; /* the runner aborted the job (zd_heartbeat_abort): no report will come */
    uint32_t abort_rank;
    char abort_why[512];
    bool lost;
    uint32_t lost_rank;
    char why[512];
    zd_ckpt_report_t *reports; /* [world]: the last report of each rank */
    bool send_report;          /* reports[rank] is to be sent */
    /* readable without the lock */
    atomic_bool lost_flag;
    /* heartbeat thread only */
    bool checking; /* false once lost, aborted or left */
    uint64_t next_beat_ns;
};

static void zd_heartbeat_send(zd_heartbeat_t *w, uint32_t to, Zerod__Mesh__V1__Control__Type type,
                              uint32_t lost_rank, const char *reason)
{
    zd_ucx_send_control(w->eps[to], ZD_AM_HEARTBEAT, type, w->p.rank, 0, lost_rank, reason);
}

static void zd_heartbeat_broadcast(zd_heartbeat_t *w, Zerod__Mesh__V1__Control__Type type,
                                   uint32_t lost_rank, const char *reason)
{
    for (uint32_t r = 0; r < w->p.world; r++) {
        if (r != w->p.rank && r != lost_rank && !w->peers[r].left) {
            zd_heartbeat_send(w, r, type, lost_rank, reason);
        }
    }
}

/* Record the first loss; tell the others (unless it came from them) and wake the runner. */
static void zd_heartbeat_set_lost(zd_heartbeat_t *w, uint32_t rank, const char *why, bool broadcast)
{
    pthread_mutex_lock(&w->lock);
    if (w->lost) {
        pthread_mutex_unlock(&w->lock);
        return;
    }
    w->lost = true;
    w->lost_rank = rank;
    snprintf(w->why, sizeof(w->why), "%s", why);
    pthread_mutex_unlock(&w->lock);
    atomic_store(&w->lost_flag, true);
    w->checking = false;
    zs_debug(ZS_SUB_MESH, "heartbeat: %s", why);
    if (broadcast) {
        zd_heartbeat_broadcast(w, ZEROD__MESH__V1__CONTROL__TYPE__ABORT, rank, why);
    }
    if (w->p.notify != NULL) {
        w->p.notify(w->p.notify_arg);
    }
}

static void zd_heartbeat_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    zd_heartbeat_peer_t *peer = arg;
    zd_heartbeat_t *w = peer->hb;
    char why[256];

    if (peer->left || !w->checking) {
        return;
    }
    snprintf(why, sizeof(why), "rank %u lost: the connection to its daemon failed (%s)", peer->rank,
             ucs_status_string(status));
    zd_heartbeat_set_lost(w, peer->rank, why, true);
}

static ucs_status_t zd_heartbeat_am_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    (void)header_length;
    zd_heartbeat_t *w = arg;
    Zerod__Mesh__V1__MeshMsg *msg;
    const Zerod__Mesh__V1__Control *c;

    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > ZD_HEARTBEAT_MSG_MAX) {
        return UCS_OK; /* heartbeat messages are small and eager */
    }
    msg = zerod__mesh__v1__mesh_msg__unpack(NULL, length, data);
    if (msg == NULL) {
        return UCS_OK;
    }
    c = msg->control;
    if (msg->body_case != ZEROD__MESH__V1__MESH_MSG__BODY_CONTROL || c->origin >= w->p.world ||
        c->origin == w->p.rank) {
        zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
        return UCS_OK;
    }
    w->peers[c->origin].last_seen_ns = zs_time_now_ns();
    switch (c->type) {
    case ZEROD__MESH__V1__CONTROL__TYPE__ABORT: {
        char why[600];
        snprintf(why, sizeof(why), "%.512s (abort from rank %u)", c->reason, c->origin);
        zd_heartbeat_set_lost(w, c->lost_rank < w->p.world ? c->lost_rank : c->origin, why, false);
        break;
    }
    case ZEROD__MESH__V1__CONTROL__TYPE__LEAVE:
        w->peers[c->origin].left = true;
        break;
    case ZEROD__MESH__V1__CONTROL__TYPE__CKPT_REPORT: {
        zd_ckpt_report_t *r = &w->reports[c->origin];
        pthread_mutex_lock(&w->lock);
        r->seq = c->ckpt_seq;
        r->status = c->ckpt_status;
        r->bytes = c->ckpt_bytes;
        r->xxh3 = c->ckpt_xxh3;
        snprintf(r->why, sizeof(r->why), "%s", c->reason != NULL ? c->reason : "");
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
        break;
    }
    default:
        break; /* HEARTBEAT: last_seen is all it does */
    }
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    return UCS_OK;
}

/* Send LEAVE and wait (bounded) until the worker flushed it. */
static void zd_heartbeat_do_leave(zd_heartbeat_t *w)
{
    ucp_request_param_t prm;
    zs_deadline_t d = zs_deadline_in_ms(ZD_HEARTBEAT_LEAVE_MS);
    void *req;

    w->checking = false;
    zd_heartbeat_broadcast(w, ZEROD__MESH__V1__CONTROL__TYPE__LEAVE, UINT32_MAX, NULL);
    memset(&prm, 0, sizeof(prm));
    req = ucp_worker_flush_nbx(w->worker, &prm);
    if (req != NULL && !UCS_PTR_IS_ERR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && !zs_deadline_expired(d)) {
            ucp_worker_progress(w->worker);
        }
        ucp_request_free(req);
    }
}

/* This rank's report to every peer. */
static void zd_heartbeat_send_report(zd_heartbeat_t *w, const zd_ckpt_report_t *r)
{
    Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__Control c = ZEROD__MESH__V1__CONTROL__INIT;

    c.type = ZEROD__MESH__V1__CONTROL__TYPE__CKPT_REPORT;
    c.origin = w->p.rank;
    c.ckpt_seq = r->seq;
    c.ckpt_status = r->status;
    c.ckpt_bytes = r->bytes;
    c.ckpt_xxh3 = r->xxh3;
    c.reason = (char *)r->why;
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_CONTROL;
    msg.control = &c;
    for (uint32_t to = 0; to < w->p.world; to++) {
        if (to != w->p.rank && w->eps[to] != NULL && !w->peers[to].left) {
            (void)zd_ucx_send_msg(w->eps[to], ZD_AM_HEARTBEAT, &msg, false);
        }
    }
}

/* Commands from other threads; returns false when the thread should stop. */
static bool zd_heartbeat_commands(zd_heartbeat_t *w)
{
    bool stop, abort_now, leave_now, report_now;
    uint32_t abort_rank;
    char why[512];
    zd_ckpt_report_t report;

    pthread_mutex_lock(&w->lock);
    report_now = w->send_report;
    w->send_report = false;
    report = w->reports[w->p.rank];
    stop = w->stop;
    abort_now = w->cmd_abort;
    leave_now = w->cmd_leave;
    abort_rank = w->abort_rank;
    snprintf(why, sizeof(why), "%s", w->abort_why);
    w->cmd_abort = false;
    w->cmd_leave = false;
    pthread_mutex_unlock(&w->lock);
    if (report_now) {
        zd_heartbeat_send_report(w, &report);
    }
    if (abort_now) {
        w->checking = false;
        zd_heartbeat_broadcast(w, ZEROD__MESH__V1__CONTROL__TYPE__ABORT, abort_rank, why);
    }
    if (leave_now) {
        zd_heartbeat_do_leave(w);
        pthread_mutex_lock(&w->lock);
        w->leave_done = true;
        pthread_cond_broadcast(&w->cond);
        pthread_mutex_unlock(&w->lock);
    }
    return !stop;
}

/* Heartbeats due, and peers silent for too long. Returns ns until the next thing to do. */
static uint64_t zd_heartbeat_beat(zd_heartbeat_t *w)
{
    uint64_t now = zs_time_now_ns();
    uint64_t next;

    if (now >= w->next_beat_ns) {
        zd_heartbeat_broadcast(w, ZEROD__MESH__V1__CONTROL__TYPE__HEARTBEAT, UINT32_MAX, NULL);
        w->next_beat_ns = now + w->p.interval_ns;
    }
    next = w->next_beat_ns - now;
    for (uint32_t r = 0; w->checking && r < w->p.world; r++) {
        zd_heartbeat_peer_t *peer = &w->peers[r];
        uint64_t due;

        if (r == w->p.rank || peer->left) {
            continue;
        }
        due = peer->last_seen_ns + w->p.timeout_ns;
        if (now >= due) {
            char why[256];
            snprintf(why, sizeof(why), "rank %u lost: no heartbeat for %.1f s (heartbeat_timeout)",
                     r, (double)(now - peer->last_seen_ns) * 1e-9);
            zd_heartbeat_set_lost(w, r, why, true);
            break;
        }
        next = due - now < next ? due - now : next;
    }
    return next;
}

static void *zd_heartbeat_main(void *arg)
{
    zd_heartbeat_t *w = arg;

    for (;;) {
        struct pollfd fds[2];
        nfds_t n = 1;
        uint64_t sleep_ns;
        uint64_t drain;
        int ms;

        while (ucp_worker_progress(w->worker) != 0) {
        }
        if (!zd_heartbeat_commands(w)) {
            break;
        }
        sleep_ns = zd_heartbeat_beat(w);
        fds[0].fd = w->cmd_fd;
        fds[0].events = POLLIN;
        if (w->efd >= 0) {
            ucs_status_t us = ucp_worker_arm(w->worker);
            if (us == UCS_ERR_BUSY) {
                continue; /* events arrived meanwhile: progress first */
            }
            fds[1].fd = w->efd;
            fds[1].events = POLLIN;
            n = 2;
        } else if (sleep_ns > 10 * ZS_NSEC_PER_MSEC) {
            sleep_ns = 10 * ZS_NSEC_PER_MSEC;
        }
        ms = (int)((sleep_ns + ZS_NSEC_PER_MSEC - 1) / ZS_NSEC_PER_MSEC);
        if (poll(fds, n, ms) > 0 && (fds[0].revents & POLLIN)) {
            if (read(w->cmd_fd, &drain, sizeof(drain)) < 0) {
                drain = 0;
            }
        }
    }
    return NULL;
}

static void zd_heartbeat_kick(zd_heartbeat_t *w)
{
    uint64_t one = 1;

    if (write(w->cmd_fd, &one, sizeof(one)) < 0) {
        /* the counter is saturated: the thread is awake anyway */
    }
}

static zs_status_t zd_heartbeat_alloc(const zd_heartbeat_params_t *params, zd_heartbeat_t *w,
                                      char *err, size_t errlen)
{
    pthread_condattr_t ca;

    w->p = *params;
    snprintf(w->job_id, sizeof(w->job_id), "%s", params->job_id);
    w->p.job_id = w->job_id;
    w->efd = -1;
    w->cmd_fd = -1;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* zs_deadline_timespec's clock */
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    w->eps = calloc(params->world, sizeof(*w->eps));
    w->peers = calloc(params->world, sizeof(*w->peers));
    w->reports = calloc(params->world, sizeof(*w->reports));
    if (w->eps == NULL || w->peers == NULL || w->reports == NULL) {
        snprintf(err, errlen, "out of memory for the mesh heartbeat");
        return ZS_ERR_NO_MEMORY;
    }
    w->cmd_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->cmd_fd < 0) {
        snprintf(err, errlen, "mesh heartbeat: eventfd: %s", strerror(errno));
        return ZS_ERR_IO;
    }
    return ZS_OK;
}

/* TCP only: a peer-failure-mode endpoint needs a transport that reports a closed peer, and a
 * killed process's sockets are reset by its kernel at once. */
static zs_status_t zd_heartbeat_open_worker(zd_heartbeat_t *w, char *err, size_t errlen)
{
    ucp_am_handler_param_t ah;
    zs_status_t st;

    st = zd_ucx_init("tcp", UCP_FEATURE_AM | UCP_FEATURE_WAKEUP, &w->ctx, &w->worker, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = ZD_AM_HEARTBEAT;
    ah.cb = zd_heartbeat_am_cb;
    ah.arg = w;
    if (ucp_worker_set_am_recv_handler(w->worker, &ah) != UCS_OK ||
        ucp_worker_get_address(w->worker, &w->address, &w->address_len) != UCS_OK) {
        snprintf(err, errlen, "UCX: cannot set up the mesh heartbeat worker");
        return ZS_ERR_UCX;
    }
    if (ucp_worker_get_efd(w->worker, &w->efd) != UCS_OK) {
        w->efd = -1;
    }
    return ZS_OK;
}

zs_status_t zd_heartbeat_create(const zd_heartbeat_params_t *params, zd_heartbeat_t **hb_p,
                                char *err, size_t errlen)
{
    zd_heartbeat_t *w;
    zs_status_t st;

    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        snprintf(err, errlen, "out of memory for the mesh heartbeat");
        return ZS_ERR_NO_MEMORY;
    }
    st = zd_heartbeat_alloc(params, w, err, errlen);
    if (st == ZS_OK) {
        st = zd_heartbeat_open_worker(w, err, errlen);
    }
    if (st != ZS_OK) {
        zd_heartbeat_destroy(w);
        return st;
    }
    *hb_p = w;
    return ZS_OK;
}

void zd_heartbeat_address(const zd_heartbeat_t *w, const uint8_t **addr_p, size_t *len_p)
{
    *addr_p = (const uint8_t *)w->address;
    *len_p = w->address_len;
}

zs_status_t zd_heartbeat_start(zd_heartbeat_t *w, uint8_t *const *addrs, const size_t *lens,
                               char *err, size_t errlen)
{
    uint64_t now = zs_time_now_ns();
    int rc;

    for (uint32_t r = 0; r < w->p.world; r++) {
        ucp_ep_params_t ep;
        ucs_status_t us;

        w->peers[r].hb = w;
        w->peers[r].rank = r;
        w->peers[r].last_seen_ns = now;
        if (r == w->p.rank) {
            continue;
        }
        if (addrs[r] == NULL || lens[r] == 0) {
            snprintf(err, errlen, "rank %u sent no heartbeat address", r);
            return ZS_ERR_PROTOCOL;
        }
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = (const ucp_address_t *)addrs[r];
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = zd_heartbeat_ep_err_cb;
        ep.err_handler.arg = &w->peers[r];
        us = ucp_ep_create(w->worker, &ep, &w->eps[r]);
        if (us != UCS_OK) {
            w->eps[r] = NULL;
            snprintf(err, errlen, "cannot reach rank %u's heartbeat worker: %s", r,
                     ucs_status_string(us));
            return ZS_ERR_UNREACHABLE;
        }
    }
    w->checking = true;
    w->next_beat_ns = now;
    rc = zs_thread_start(&w->thread, false, zd_heartbeat_main, w);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the mesh heartbeat thread: %s", strerror(rc));
        return ZS_ERR_NO_MEMORY;
    }
    w->started = true;
    return ZS_OK;
}

bool zd_heartbeat_lost(zd_heartbeat_t *w, uint32_t *lost_rank_p, char *why, size_t len)
{
    if (w == NULL || !atomic_load(&w->lost_flag)) {
        return false;
    }
    pthread_mutex_lock(&w->lock);
    if (lost_rank_p != NULL) {
        *lost_rank_p = w->lost_rank;
    }
    if (why != NULL && len > 0) {
        snprintf(why, len, "%s", w->why);
    }
    pthread_mutex_unlock(&w->lock);
    return true;
}

void zd_heartbeat_abort(zd_heartbeat_t *w, uint32_t lost_rank, const char *why)
{
    if (w == NULL || !w->started) {
        return;
    }
    pthread_mutex_lock(&w->lock);
    w->cmd_abort = true;
    w->aborted = true;
    w->abort_rank = lost_rank;
    snprintf(w->abort_why, sizeof(w->abort_why), "%s", why);
    pthread_cond_broadcast(&w->cond); /* a writer waiting for reports stops */
    pthread_mutex_unlock(&w->lock);
    zd_heartbeat_kick(w);
}

void zd_heartbeat_leave(zd_heartbeat_t *w)
{
    zs_deadline_t d = zs_deadline_in_ms(2 * ZD_HEARTBEAT_LEAVE_MS);
    struct timespec ts = zs_deadline_timespec(d);

    if (w == NULL || !w->started) {
        return;
    }
    pthread_mutex_lock(&w->lock);
    w->cmd_leave = true;
    pthread_mutex_unlock(&w->lock);
    zd_heartbeat_kick(w);
    pthread_mutex_lock(&w->lock);
    while (!w->leave_done && !zs_deadline_expired(d)) {
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    pthread_mutex_unlock(&w->lock);
}

void zd_heartbeat_destroy(zd_heartbeat_t *w)
{
    if (w == NULL) {
        return;
    }
    if (w->started) {
        pthread_mutex_lock(&w->lock);
        w->stop = true;
        pthread_mutex_unlock(&w->lock);
        zd_heartbeat_kick(w);
        pthread_join(w->thread, NULL);
    }
    w->checking = false; /* closing our endpoints is not a lost peer */
    if (w->eps != NULL) {
        for (uint32_t r = 0; r < w->p.world; r++) {
            zd_ucx_ep_close(w->worker, w->eps[r], true);
        }
    }
    if (w->address != NULL) {
        ucp_worker_release_address(w->worker, w->address);
    }
    zd_ucx_cleanup(w->ctx, w->worker);
    if (w->cmd_fd >= 0) {
        close(w->cmd_fd);
    }
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w->eps);
    free(w->peers);
    free(w->reports);
    free(w);
}

void zd_heartbeat_report(zd_heartbeat_t *w, const zd_ckpt_report_t *report)
{
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->lock);
    w->reports[w->p.rank] = *report;
    w->send_report = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    zd_heartbeat_kick(w);
}

/* Under w->lock: every rank's report of seq is in (ZS_OK), one failed (ZS_ERR_ABORTED), or
 * not yet (ZS_IN_PROGRESS). */
static zs_status_t zd_heartbeat_reports_state(zd_heartbeat_t *w, uint64_t seq, bool stop_on_error,
                                              uint32_t *failed_p)
{
    bool all = true;

    for (uint32_t r = 0; r < w->p.world; r++) {
        const zd_ckpt_report_t *rep = &w->reports[r];
        if (rep->seq != seq) {
            all = false;
        } else if (rep->status != ZS_OK && stop_on_error) {
            *failed_p = r;
            return ZS_ERR_ABORTED;
        }
    }
    return all ? ZS_OK : ZS_IN_PROGRESS;
}

zs_status_t zd_heartbeat_await_reports(zd_heartbeat_t *w, uint64_t seq, bool stop_on_error,
                                       zs_deadline_t deadline, const atomic_bool *cancel,
                                       zd_ckpt_report_t *reports, uint32_t *failed_p, char *err,
                                       size_t errlen)
{
    zs_status_t st;

    pthread_mutex_lock(&w->lock);
    for (;;) {
        zs_deadline_t tick = zs_deadline_in_ms(100); /* cancel and the deadline, checked */
        struct timespec ts;

        st = zd_heartbeat_reports_state(w, seq, stop_on_error, failed_p);
        if (st != ZS_IN_PROGRESS) {
            break;
        }
        if (w->lost || w->aborted) {
            st = zs_errf(err, errlen, ZS_ERR_PEER_LOST, "%s", w->lost ? w->why : w->abort_why);
            break;
        }
        if (zs_deadline_expired(deadline) || (cancel != NULL && atomic_load(cancel))) {
            st = zs_errf(err, errlen, ZS_ERR_TIMEOUT, "%s",
                         zs_deadline_expired(deadline) ? "the deadline passed"
                                                       : "the daemon is shutting down");
            break;
        }
        if (deadline.at_ns < tick.at_ns) {
            tick = deadline;
        }
        ts = zs_deadline_timespec(tick);
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    memcpy(reports, w->reports, w->p.world * sizeof(*reports));
    pthread_mutex_unlock(&w->lock);
    return st;
}
