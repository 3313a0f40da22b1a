/*
 * zc_session: one connection to the local zerod. Its frames, the request API the rest of libzc
 * is built on (zc_session_request, zc_session_call), Hello, open and close, and the checks every
 * call of an attached session makes. The job's start is attach.c's, its layout queries
 * layout.c's, the trainer's slots and step train.c's.
 *
 * Frames are handled in order on one thread. SlotFree frames (replies to BucketReady) may
 * arrive while any call waits for its own reply; they are always processed on the way, so a
 * slot comes back whichever call happens to read its SlotFree. A SlotFree with an error is
 * reported by the call that reads it.
 */
#include "session_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

zs_deadline_t zc_deadline(const zc_session_t *s, int timeout_ms)
{
    return zs_deadline_in_ms((uint64_t)(timeout_ms >= 0 ? timeout_ms : s->timeout_ms));
}

/* A broken connection stays broken: every later call gets ZC_ERR_CLOSED. */
int zc_session_broken(zc_session_t *s, int status)
{
    if (status == ZC_ERR_CLOSED || status == ZC_ERR_PROTOCOL || status == ZC_ERR_IO) {
        zc_conn_cleanup(&s->conn);
    }
    return status;
}

int zc_session_check_conn(const zc_session_t *s)
{
    if (s->conn.fd < 0) {
        return zc_fail(ZC_ERR_CLOSED, "the connection to the daemon is closed (after an earlier "
                                      "error); open a new session");
    }
    return ZC_OK;
}

/* A device region's zs_region_t only describes the CUDA mapping: zk unmaps that, munmap never
 * sees its address. */
static void zc_region_release(zs_region_t *r, zk_cuda_region_t *dev)
{
    if (r->mem == ZS_MEM_DEVICE) {
        *r = (zs_region_t)ZS_REGION_INIT;
    } else {
        zs_region_cleanup(r);
    }
    zk_cuda_region_cleanup(dev); /* a no-op on one never imported */
}

void zc_session_unmap(zc_session_t *s)
{
    zc_region_release(&s->params, &s->dev_params);
    zc_region_release(&s->slots, &s->dev_slots);
    zc_region_release(&s->grads, &s->dev_grads);
    s->mem = ZS_MEM_HOST;
    s->device = -1;
    zs_layout_destroy(s->layout);
    s->layout = NULL;
    free(s->slot_rec);
    s->slot_rec = NULL;
    s->n_slots = 0;
    s->n_outstanding = 0;
    s->attached = false;
}

/* ---- frame dispatch ---------------------------------------------------------------- */

/* A SlotFree: the slot submitted with that seq is free again. */
static int zc_session_on_slot_free(zc_session_t *s, const zc_frame_t *f)
{
    const Zerod__Ipc__V1__SlotFree *sf = f->slot_free;
    zc_slot_rec_t *rec;
    char what[64];

    if (!s->attached || sf->slot >= s->n_slots) {
        return zc_fail(ZC_ERR_PROTOCOL, "SlotFree for slot %u, but the session has %u slots",
                       sf->slot, s->attached ? s->n_slots : 0);
    }
    rec = &s->slot_rec[sf->slot];
    if (rec->state != ZC_SLOT_SUBMITTED || rec->seq != f->seq) {
        return zc_fail(ZC_ERR_PROTOCOL,
                       "SlotFree seq %llu for slot %u, which has no BucketReady with that seq",
                       (unsigned long long)f->seq, sf->slot);
    }
    rec->state = ZC_SLOT_FREE;
    s->n_outstanding--;
    snprintf(what, sizeof(what), "bucket %u (slot %u)", rec->bucket, sf->slot);
    return zc_result_status(sf->result, what);
}

/* Read one frame and dispatch SlotFree, StillWorking and ErrorReply. *frame_p is set (and
 * owned by the caller) only for any other frame. */
int zc_session_read(zc_session_t *s, zs_deadline_t deadline, zc_frame_t **frame_p)
{
    zc_frame_t *f = NULL;
    int status;

    *frame_p = NULL;
    status = zc_conn_recv(&s->conn, deadline, &f);
    if (status == ZC_ERR_PEER_LOST) {
        /* the daemon went silent (wire.c): a reply that comes later must not be mistaken */
        zc_conn_cleanup(&s->conn);
        return status;
    }
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_STILL_WORKING:
        /* the daemon lives and works on a request of ours: the wait goes on */
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return ZC_OK;
    case ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE:
        status = zc_session_on_slot_free(s, f);
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return (status == ZC_ERR_PROTOCOL) ? zc_session_broken(s, status) : status;
    case ZEROD__IPC__V1__FRAME__BODY_ERROR:
        status = zc_result_status(f->error->result, "daemon closed the connection");
        if (status == ZC_OK) {
            status = zc_fail(ZC_ERR_PROTOCOL, "daemon closed the connection with an error frame");
        }
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        zc_conn_cleanup(&s->conn);
        return status;
    default:
        *frame_p = f;
        return ZC_OK;
    }
}

/* Wait for the reply that echoes `seq`; anything else is a protocol error. */
int zc_session_wait_reply(zc_session_t *s, uint64_t seq, zc_body_case_t reply_case,
                          zs_deadline_t deadline, zc_frame_t **reply_p)
{
    char slot_err[ZC_ERRMSG_LEN] = "";
    int slot_status = ZC_OK;
    zc_frame_t *f;
    int status;

    for (;;) {
        status = zc_session_read(s, deadline, &f);
        if (status != ZC_OK && s->conn.fd >= 0 && status != ZC_ERR_TIMEOUT) {
            /* A SlotFree with an error: the connection is fine and the reply still comes;
             * report the SlotFree's error once the stream is in sync again. */
            if (slot_status == ZC_OK) {
                slot_status = status;
                snprintf(slot_err, sizeof(slot_err), "%s", zc_last_error());
            }
            continue;
        }
        if (status == ZC_ERR_TIMEOUT) {
            /* The reply may still come: drop the connection rather than mistake it later. */
            zc_conn_cleanup(&s->conn);
            return zc_fail(status,
                           "no %s from the daemon within the deadline; connection "
                           "closed",
                           zc_body_name(reply_case));
        }
        if (status != ZC_OK) {
            return status;
        }
        if (f != NULL) {
            break;
        }
    }
    if (slot_status != ZC_OK) {
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return zc_fail(slot_status, "%s", slot_err);
    }
    if (f->body_case != reply_case || f->seq != seq) {
        status = zc_fail(ZC_ERR_PROTOCOL, "expected %s for seq %llu, got %s with seq %llu",
                         zc_body_name(reply_case), (unsigned long long)seq,
                         zc_body_name(f->body_case), (unsigned long long)f->seq);
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return zc_session_broken(s, status);
    }
    *reply_p = f;
    return ZC_OK;
}

int zc_session_request(zc_session_t *s, zc_frame_t *request, zc_body_case_t reply_case,
                       int timeout_ms, zc_frame_t **reply_p)
{
    return zc_session_request_fd(s, request, -1, reply_case, timeout_ms, reply_p);
}

int zc_session_request_fd(zc_session_t *s, zc_frame_t *request, int fd, zc_body_case_t reply_case,
                          int timeout_ms, zc_frame_t **reply_p)
{
    zs_deadline_t deadline = zc_deadline(s, timeout_ms);
    int status;

    status = zc_session_check_conn(s);
    if (status != ZC_OK) {
        return status;
    }
    request->seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, request, fd, deadline);
    if (status == ZC_ERR_CLOSED) {
        /* The daemon may have said why before it closed (an ErrorReply, e.g. permission
         * denied): report that rather than the broken pipe. */
        zc_frame_t *f = NULL;
        zs_deadline_t soon = zs_deadline_in_ms(1000);
        int why;

        if (soon.at_ns > deadline.at_ns) {
            soon = deadline;
        }
        do {
            why = zc_session_read(s, soon, &f); /* past SlotFree and StillWorking */
        } while (why == ZC_OK && f == NULL);
        if (f != NULL) {
            zerod__ipc__v1__frame__free_unpacked(f, NULL);
        }
        if (why != ZC_OK && why != ZC_ERR_CLOSED && why != ZC_ERR_TIMEOUT) {
            return zc_session_broken(s, why);
        }
        status = zc_fail(ZC_ERR_CLOSED, "the daemon closed the connection");
    }
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    return zc_session_wait_reply(s, request->seq, reply_case, deadline, reply_p);
}

int zc_session_call(zc_session_t *s, zc_frame_t *request, zc_body_case_t reply_case, int timeout_ms,
                    const char *what, zc_frame_t **reply_p)
{
    return zc_session_call_fd(s, request, -1, reply_case, timeout_ms, what, reply_p);
}

int zc_session_call_fd(zc_session_t *s, zc_frame_t *request, int fd, zc_body_case_t reply_case,
                       int timeout_ms, const char *what, zc_frame_t **reply_p)
{
    zc_frame_t *reply = NULL;
    int status;

    status = zc_session_request_fd(s, request, fd, reply_case, timeout_ms, &reply);
    if (status != ZC_OK) {
        return status;
    }
    status = zc_result_status(zc_frame_result(reply), what);
    if (status != ZC_OK) {
        zerod__ipc__v1__frame__free_unpacked(reply, NULL);
        return status;
    }
    *reply_p = reply;
    return ZC_OK;
}

void zc_session_keep(zc_session_t *session, zc_kept_t kind, zc_frame_t *reply)
{
    if (session->kept[kind] != NULL) {
        zerod__ipc__v1__frame__free_unpacked(session->kept[kind], NULL);
    }
    session->kept[kind] = reply;
}

const zc_frame_t *zc_session_kept(const zc_session_t *session, zc_kept_t kind)
{
    return session->kept[kind];
}

const zc_daemon_info_t *zc_session_daemon_info(const zc_session_t *session)
{
    return &session->daemon;
}

int zc_session_timeout_ms(const zc_session_t *session)
{
    return session->timeout_ms;
}

/* ---- open / close ------------------------------------------------------------------ */

/* What the daemon says of itself in its HelloReply, and the session's default deadline raised
 * to outwait its peer deadline (unless the caller chose one). */
static void zc_session_take_hello(zc_session_t *s, const Zerod__Ipc__V1__HelloReply *hr)
{
    snprintf(s->daemon.version, sizeof(s->daemon.version), "%s", hr->version);
    snprintf(s->daemon.device, sizeof(s->daemon.device), "%s", hr->device);
    s->daemon.pid = hr->pid;
    s->daemon.protocol = hr->protocol;
    s->daemon.peer_deadline_ms = hr->peer_deadline_ms;
    s->conn.silence_ms = hr->keepalive_timeout_ms; /* 0 from a daemon that sends none */
    if (!s->timeout_set) {
        /* outwait the daemon: a lost or hung peer is then reported as ERR_PEER_LOST naming the
         * rank, not as this call's own timeout */
        uint64_t want = 2 * hr->peer_deadline_ms + ZC_PEER_DEADLINE_MARGIN_MS;
        if (want > (uint64_t)s->timeout_ms) {
            s->timeout_ms = want > INT32_MAX ? INT32_MAX : (int)want;
        }
    }
}

static int zc_session_hello(zc_session_t *s)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Hello hello = ZEROD__IPC__V1__HELLO__INIT;
    const Zerod__Ipc__V1__HelloReply *hr;
    zc_frame_t *reply = NULL;
    int status;

    hello.protocol = ZC_PROTOCOL_VERSION;
    hello.version = (char *)zc_version();
    hello.role =
        s->control ? ZEROD__IPC__V1__ROLE__ROLE_CONTROL : ZEROD__IPC__V1__ROLE__ROLE_TRAINER;
    hello.keepalive = true;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
    req.hello = &hello;
    status = zc_session_call(s, &req, ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY, -1, "hello", &reply);
    if (status != ZC_OK) {
        return status;
    }
    hr = reply->hello_reply;
    if (hr->protocol != ZC_PROTOCOL_VERSION) {
        status = zc_fail(ZC_ERR_VERSION,
                         "hello: daemon speaks protocol %u (zerod %s), libzc %s "
                         "speaks protocol %u",
                         hr->protocol, hr->version, zc_version(), ZC_PROTOCOL_VERSION);
    } else {
        zc_session_take_hello(s, hr);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

/* A session not yet connected: no regions, no job, the default deadline. */
static zc_session_t *zc_session_alloc(void)
{
    zc_session_t *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        return NULL;
    }
    s->conn.fd = -1;
    s->params = (zs_region_t)ZS_REGION_INIT;
    s->slots = (zs_region_t)ZS_REGION_INIT;
    s->grads = (zs_region_t)ZS_REGION_INIT;
    s->mem = ZS_MEM_HOST;
    s->device = -1;
    s->dev_params = (zk_cuda_region_t)ZK_CUDA_REGION_INIT; /* fd -1: calloc's 0 is stdin */
    s->dev_slots = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    s->dev_grads = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    s->timeout_ms = ZC_DEFAULT_TIMEOUT_MS;
    return s;
}

/* The caller's open params (NULL: all defaults) into the session: deadline and role; *path_p
 * the socket to connect to (else $ZEROD_SOCKET, else ZC_DEFAULT_SOCKET) as given, of which
 * s->socket_path keeps a copy that may be cut to its size. */
static int zc_session_configure(zc_session_t *s, const zc_open_params_t *params,
                                const char **path_p)
{
    uint64_t mask = params ? params->field_mask : 0;
    const char *path;

    if (mask & ZC_OPEN_FIELD_TIMEOUT_MS) {
        if (params->timeout_ms <= 0) {
            return zc_fail(ZC_ERR_INVALID, "zc_session_open: timeout_ms %d is not positive",
                           params->timeout_ms);
        }
        s->timeout_ms = params->timeout_ms;
        s->timeout_set = true;
    }
    if (mask & ZC_OPEN_FIELD_CONTROL) {
        s->control = params->control ? 1 : 0;
    }
    if ((mask & ZC_OPEN_FIELD_SOCKET_PATH) && params->socket_path != NULL) {
        path = params->socket_path;
    } else {
        path = getenv("ZEROD_SOCKET");
        if (path == NULL || path[0] == '\0') {
            path = ZC_DEFAULT_SOCKET;
        }
    }
    snprintf(s->socket_path, sizeof(s->socket_path), "%s", path);
    *path_p = path;
    return ZC_OK;
}

ZC_API int zc_session_open(const zc_open_params_t *params, zc_session_t **session_p)
{
    const char *path = NULL;
    zc_session_t *s;
    int status;

    zc_error_clear();
    if (session_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "zc_session_open: session_p is NULL");
    }
    s = zc_session_alloc();
    if (s == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "zc_session_open: out of memory");
    }
    status = zc_session_configure(s, params, &path);
    if (status != ZC_OK) {
        goto err_free;
    }
    status = zc_conn_connect(&s->conn, path, zs_deadline_in_ms((uint64_t)s->timeout_ms));
    if (status != ZC_OK) {
        goto err_free;
    }
    status = zc_session_hello(s);
    if (status != ZC_OK) {
        goto err_close;
    }
    *session_p = s;
    return ZC_OK;

err_close:
    zc_conn_cleanup(&s->conn);
err_free:
    free(s);
    return status;
}

ZC_API void zc_session_disconnect(zc_session_t *session)
{
    if (session != NULL) {
        zc_conn_cleanup(&session->conn);
    }
}

ZC_API void zc_session_close(zc_session_t *session)
{
    if (session == NULL) {
        return;
    }
    zc_session_unmap(session);
    zc_conn_cleanup(&session->conn);
    for (int k = 0; k < ZC_KEPT_COUNT; k++) {
        zc_session_keep(session, (zc_kept_t)k, NULL);
    }
    free(session);
}

int zc_session_check_attached(const zc_session_t *s, const char *what)
{
    if (s == NULL) {
        return zc_fail(ZC_ERR_INVALID, "%s: session is NULL", what);
    }
    if (!s->attached) {
        return zc_fail(ZC_ERR_STATE, "%s: the session is not attached to a job", what);
    }
    return zc_session_check_conn(s);
}

int zc_session_check_ready(const zc_session_t *s, const char *what)
{
    int status = zc_session_check_attached(s, what);

    if (status == ZC_OK && !s->params_ready) {
        status = zc_fail(ZC_ERR_STATE,
                         "%s: fresh job: write the initial parameter values and "
                         "call zc_session_params_ready() first",
                         what);
    }
    return status;
}
