/*
 * A job's mesh at run time (docs/architecture.md): the data worker and its endpoints, control
 * messages (abort, barrier, leave), and the heartbeat's word on lost peers. Formation is
 * mesh/mesh_boot.c.
 */
#define _GNU_SOURCE
#include "mesh/mesh.h"
#include "mesh/mesh_int.h"
#include "zs/error.h"
#include "zs/log.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* a barrier polls without sleeping this long, then sleeps 50 us between polls */
#define ZD_BARRIER_SPIN_NS (2u * 1000u * 1000u)

/* ---- data side: endpoints, control messages ------------------------------------------- */

static void zd_mesh_mark_lost(zd_mesh_t *mesh, uint32_t rank, const char *why)
{
    if (mesh->aborted || mesh->closing) {
        return;
    }
    mesh->aborted = true;
    snprintf(mesh->why, sizeof(mesh->why), "%s", why);
    zs_error(ZS_SUB_MESH, "job '%s' aborted: %s", mesh->job_id, why);
    (void)rank;
}

/* A rank ended the job (END): the mesh stops like an abort, but it is no fault. */
static void zd_mesh_mark_ended(zd_mesh_t *mesh, uint32_t origin, const char *reason)
{
    mesh->left[origin] = true; /* its endpoints close next: expected */
    if (mesh->ended || mesh->closing) {
        return;
    }
    mesh->ended = true;
    if (!mesh->aborted) {
        mesh->aborted = true;
        snprintf(mesh->why, sizeof(mesh->why), "%s", reason != NULL ? reason : "");
    }
    zs_info(ZS_SUB_MESH, "job '%s' ended by rank %u: %s", mesh->job_id, origin,
            reason != NULL ? reason : "");
}

static void zd_data_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    zd_peer_ref_t *ref = arg;
    char why[256];

    if (ref->mesh->left[ref->rank]) {
        return; /* it said goodbye: its endpoint closing is expected */
    }
    snprintf(why, sizeof(why), "rank %u lost: endpoint error (%s)", ref->rank,
             ucs_status_string(status));
    zd_mesh_mark_lost(ref->mesh, ref->rank, why);
}

static ucs_status_t zd_ctrl_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    (void)header_length;
    zd_mesh_t *mesh = arg;
    zd_mesh_msg_t *msg;

    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > 65536) {
        return UCS_OK; /* control messages are small and eager */
    }
    msg = zerod__mesh__v1__mesh_msg__unpack(NULL, length, data);
    if (msg == NULL) {
        return UCS_OK;
    }
    if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_CONTROL &&
        msg->control->origin < mesh->p.world) {
        const Zerod__Mesh__V1__Control *c = msg->control;
        switch (c->type) {
        case ZEROD__MESH__V1__CONTROL__TYPE__ABORT: {
            char why[512];
            snprintf(why, sizeof(why), "%s (abort from rank %u)", c->reason, c->origin);
            zd_mesh_mark_lost(mesh, c->lost_rank, why);
            break;
        }
        case ZEROD__MESH__V1__CONTROL__TYPE__LEAVE:
            mesh->left[c->origin] = true;
            break;
        case ZEROD__MESH__V1__CONTROL__TYPE__END:
            zd_mesh_mark_ended(mesh, c->origin, c->reason);
            break;
        case ZEROD__MESH__V1__CONTROL__TYPE__BARRIER:
            if (c->seq > mesh->barrier_seen[c->origin]) {
                mesh->barrier_seen[c->origin] = c->seq;
            }
            break;
        default:
            break;
        }
    }
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    return UCS_OK;
}

static void zd_mesh_send_ctrl(zd_mesh_t *mesh, uint32_t to, Zerod__Mesh__V1__Control__Type type,
                              uint64_t seq, uint32_t lost, const char *reason)
{
    zd_ucx_send_control(mesh->eps[to], ZD_AM_CTRL, type, mesh->p.rank, seq, lost, reason);
}

uint64_t zd_mesh_tick(zd_mesh_t *mesh)
{
    char why[512];
    uint32_t lost;

    while (ucp_worker_progress(mesh->worker) != 0) {
    }
    if (!mesh->aborted && zd_heartbeat_lost(mesh->heartbeat, &lost, why, sizeof(why))) {
        zd_mesh_mark_lost(mesh, lost, why);
    }
    return UINT64_MAX; /* heartbeats are the heartbeat thread's: nothing is due here */
}

void zd_mesh_leave(zd_mesh_t *mesh)
{
    if (mesh == NULL || (mesh->aborted && !mesh->ended)) {
        return;
    }
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__LEAVE, 0, 0, NULL);
        }
    }
    zd_heartbeat_leave(mesh->heartbeat);
    for (int i = 0; i < 100; i++) {
        if (ucp_worker_progress(mesh->worker) == 0) {
            usleep(100);
        }
    }
}

void zd_mesh_end(zd_mesh_t *mesh, const char *why)
{
    if (mesh == NULL) {
        return;
    }
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__END, 0, 0, why);
        }
    }
    mesh->ended = true; /* zd_mesh_leave, which follows, goes out even after an abort */
}

bool zd_mesh_ended(const zd_mesh_t *mesh, char *why, size_t len)
{
    if (mesh != NULL && mesh->ended && why != NULL) {
        snprintf(why, len, "%s", mesh->why);
    }
    return mesh != NULL && mesh->ended;
}

bool zd_mesh_cancelled(const zd_mesh_t *mesh)
{
    return zd_mesh_params_cancelled(&mesh->p);
}

void zd_mesh_abort(zd_mesh_t *mesh, uint32_t lost_rank, const char *fmt, ...)
{
    char why[512];
    va_list ap;

    if (mesh == NULL || mesh->aborted) {
        return;
    }
    va_start(ap, fmt);
    (void)zs_verrf(why, sizeof(why), ZS_ERR_PEER_LOST, fmt, ap);
    va_end(ap);
    zd_mesh_mark_lost(mesh, lost_rank, why);
    zd_heartbeat_abort(mesh->heartbeat, lost_rank, why);
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank && r != lost_rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__ABORT, 0, lost_rank, why);
        }
    }
    /* give the aborts a moment to leave */
    for (int i = 0; i < 100; i++) {
        if (ucp_worker_progress(mesh->worker) == 0) {
            usleep(100);
        }
    }
}

bool zd_mesh_aborted(const zd_mesh_t *mesh, char *why, size_t len)
{
    if (mesh->aborted && why != NULL) {
        snprintf(why, len, "%s", mesh->why);
    }
    return mesh->aborted;
}

int zd_mesh_arm(zd_mesh_t *mesh)
{
    if (mesh->efd < 0) {
        return -1;
    }
    while (ucp_worker_progress(mesh->worker) != 0) {
    }
    if (ucp_worker_arm(mesh->worker) == UCS_ERR_BUSY) {
        return -2; /* events pending: do not sleep */
    }
    return mesh->efd;
}

zs_status_t zd_mesh_barrier(zd_mesh_t *mesh, char *err, size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(mesh->p.collective_timeout_ns);
    uint64_t seq = ++mesh->barrier_seq;
    uint64_t spin_until = zs_time_now_ns() + ZD_BARRIER_SPIN_NS;

    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__BARRIER, seq, 0, NULL);
        }
    }
    for (;;) {
        uint32_t missing = UINT32_MAX;
        for (uint32_t r = 0; r < mesh->p.world; r++) {
            if (r != mesh->p.rank && mesh->barrier_seen[r] < seq) {
                missing = r;
                break;
            }
        }
        if (missing == UINT32_MAX) {
            return ZS_OK;
        }
        zd_mesh_tick(mesh);
        if (zd_mesh_cancelled(mesh)) {
            zd_mesh_abort(mesh, mesh->p.rank, "rank %u: its daemon is shutting down", mesh->p.rank);
        }
        if (mesh->aborted) {
            return zs_errf(err, errlen, ZS_ERR_PEER_LOST, "barrier: %s", mesh->why);
        }
        if (zs_deadline_expired(deadline)) {
            zd_mesh_abort(mesh, missing, "rank %u lost: barrier timed out after %.1f s", missing,
                          (double)mesh->p.collective_timeout_ns * 1e-9);
            return zs_errf(err, errlen, ZS_ERR_PEER_LOST, "%s", mesh->why);
        }
        /* spin first (ranks leave within microseconds of each other), then sleep */
        if (zs_time_now_ns() < spin_until) {
            sched_yield();
        } else {
            usleep(50);
        }
    }
}

/* Endpoints to every peer's data worker, then the heartbeat's to every peer's heartbeat worker. */
static zs_status_t zd_mesh_connect(zd_mesh_t *mesh, const zd_roster_t *roster, char *err,
                                   size_t errlen)
{
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        ucp_ep_params_t ep;
        ucs_status_t us;

        if (r == mesh->p.rank) {
            continue;
        }
        mesh->refs[r].mesh = mesh;
        mesh->refs[r].rank = r;
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = (const ucp_address_t *)roster->data[r];
        /* UCX 1.13 refuses the shared-memory transports (posix, sysv, cma) under
         * UCP_ERR_HANDLING_MODE_PEER, which would push same-host traffic onto TCP loopback at a
         * fraction of memory bandwidth. A lost peer is caught by the heartbeat (its own TCP
         * endpoints in peer-failure mode, and heartbeats) and the collective deadline instead
         * (TCP data endpoints still report a reset through the handler). */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        ep.err_handler.cb = zd_data_ep_err_cb;
        ep.err_handler.arg = &mesh->refs[r];
        us = ucp_ep_create(mesh->worker, &ep, &mesh->eps[r]);
        if (us != UCS_OK) {
            return zs_errf(err, errlen, ZS_ERR_UNREACHABLE,
                           "cannot reach rank %u's worker address: %s", r, ucs_status_string(us));
        }
    }
    return zd_heartbeat_start(mesh->heartbeat, roster->heartbeat, roster->heartbeat_len, err,
                              errlen);
}

/* ---- lifetime ------------------------------------------------------------------------- */

static zs_status_t zd_mesh_alloc(const zd_mesh_params_t *params, zd_mesh_t **mesh_p)
{
    zd_mesh_t *mesh = calloc(1, sizeof(*mesh));

    *mesh_p = mesh;
    if (mesh == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    mesh->p = *params;
    snprintf(mesh->job_id, sizeof(mesh->job_id), "%s", params->job_id);
    mesh->p.job_id = mesh->job_id;
    mesh->efd = -1;
    mesh->eps = calloc(params->world, sizeof(*mesh->eps));
    mesh->refs = calloc(params->world, sizeof(*mesh->refs));
    mesh->barrier_seen = calloc(params->world, sizeof(uint64_t));
    mesh->left = calloc(params->world, sizeof(bool));
    if (mesh->eps == NULL || mesh->refs == NULL || mesh->barrier_seen == NULL ||
        mesh->left == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    return ZS_OK;
}

/* This rank's data worker (every transport, control messages received on it) and its
 * heartbeat, before the mesh forms: HELLO carries both addresses. */
static zs_status_t zd_mesh_open_workers(zd_mesh_t *mesh, char *err, size_t errlen)
{
    const zd_mesh_params_t *params = &mesh->p;
    zd_heartbeat_params_t hp;
    ucp_am_handler_param_t ah;
    zs_status_t st;

    st = zd_ucx_init(NULL, UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP, &mesh->ctx,
                     &mesh->worker, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&hp, 0, sizeof(hp));
    hp.job_id = mesh->job_id;
    hp.rank = params->rank;
    hp.world = params->world;
    hp.interval_ns = params->heartbeat_interval_ns;
    hp.timeout_ns = params->heartbeat_timeout_ns;
    hp.notify = params->wake;
    hp.notify_arg = params->wake_arg;
    st = zd_heartbeat_create(&hp, &mesh->heartbeat, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = ZD_AM_CTRL;
    ah.cb = zd_ctrl_am_cb;
    ah.arg = mesh;
    ucp_worker_set_am_recv_handler(mesh->worker, &ah);
    if (ucp_worker_get_address(mesh->worker, &mesh->address, &mesh->address_len) != UCS_OK) {
        return zs_errf(err, errlen, ZS_ERR_UCX, "UCX: cannot get the worker address");
    }
    if (ucp_worker_get_efd(mesh->worker, &mesh->efd) != UCS_OK) {
        mesh->efd = -1;
    }
    return ZS_OK;
}

zs_status_t zd_mesh_create(const zd_mesh_params_t *params, zd_mesh_t **mesh_p, char *err,
                           size_t errlen)
{
    zd_mesh_t *mesh;
    zd_roster_t roster;
    zs_status_t st;

    memset(&roster, 0, sizeof(roster));
    st = zd_mesh_alloc(params, &mesh);
    if (st == ZS_OK) {
        st = zd_mesh_open_workers(mesh, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_mesh_boot(mesh, &roster, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_mesh_connect(mesh, &roster, err, errlen);
        zd_roster_free(&roster);
    }
    if (st == ZS_OK) {
        /* every data endpoint works in both directions before anyone uses the mesh */
        st = zd_mesh_barrier(mesh, err, errlen);
    }
    if (st != ZS_OK) {
        if (mesh != NULL) {
            zd_mesh_destroy(mesh);
        }
        return st;
    }
    zs_info(ZS_SUB_MESH, "mesh of job '%s' formed: rank %u of %u", mesh->job_id, params->rank,
            params->world);
    *mesh_p = mesh;
    return ZS_OK;
}

void zd_mesh_destroy(zd_mesh_t *mesh)
{
    if (mesh == NULL) {
        return;
    }
    mesh->closing = true;
    zd_heartbeat_destroy(mesh->heartbeat);
    if (mesh->eps != NULL) {
        for (uint32_t r = 0; r < mesh->p.world; r++) {
            zd_ucx_ep_close(mesh->worker, mesh->eps[r], mesh->aborted);
        }
    }
    if (mesh->address != NULL) {
        ucp_worker_release_address(mesh->worker, mesh->address);
    }
    zd_ucx_cleanup(mesh->ctx, mesh->worker);
    free(mesh->eps);
    free(mesh->refs);
    free(mesh->barrier_seen);
    free(mesh->left);
    free(mesh);
}

uint32_t zd_mesh_rank(const zd_mesh_t *mesh)
{
    return mesh->p.rank;
}

uint32_t zd_mesh_world(const zd_mesh_t *mesh)
{
    return mesh->p.world;
}

ucp_worker_h zd_mesh_worker(zd_mesh_t *mesh)
{
    return mesh->worker;
}

ucp_ep_h zd_mesh_ep(zd_mesh_t *mesh, uint32_t rank)
{
    return mesh->eps[rank];
}

struct zd_heartbeat *zd_mesh_heartbeat(zd_mesh_t *mesh)
{
    return mesh != NULL ? mesh->heartbeat : NULL;
}

uint64_t zd_mesh_collective_timeout_ns(const zd_mesh_t *mesh)
{
    return mesh->p.collective_timeout_ns;
}

void zd_mesh_set_collective_timeout_ns(zd_mesh_t *mesh, uint64_t ns)
{
    mesh->p.collective_timeout_ns = ns;
}
