/*
 * zc_session: one connection to the local zerod, the job's layout and the shared regions.
 *
 * Frames are handled in order on one thread. SlotFree frames (replies to BucketReady) may
 * arrive while any call waits for its own reply; they are always processed on the way, so a
 * slot comes back whichever call happens to read its SlotFree. A SlotFree with an error is
 * reported by the call that reads it.
 */
#define _GNU_SOURCE
#include "zc_int.h"

#include "zs/dtype.h"

#include "zs/layout.h"
#include "zs/mem.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum zc_slot_state {
    ZC_SLOT_FREE = 0,
    ZC_SLOT_ACQUIRED, /* handed to the caller, being filled */
    ZC_SLOT_SUBMITTED /* BucketReady sent, SlotFree not yet received */
} zc_slot_state_t;

typedef struct zc_slot_rec {
    zc_slot_state_t state;
    uint32_t bucket;
    uint64_t seq; /* BucketReady seq while submitted */
} zc_slot_rec_t;

struct zc_session {
    zc_conn_t conn;
    int timeout_ms;
    bool
        timeout_set; /* the caller chose timeout_ms: the daemon's peer deadline does not raise it */
    int control;
    char socket_path[108];
    zc_daemon_info_t daemon;

    /* attached job */
    bool attached;
    bool resumed;
    bool params_ready; /* fresh job: ParamsReady acknowledged */
    bool restored;     /* ParamsReady: the daemons resumed from their checkpoint_dir */
    uint64_t restored_step;
    double restored_scale;
    char ignored_keys[256]; /* AttachReply.ignored_keys */
    char replaced[512];     /* AttachReply.replaced */
    bool params_are_master; /* fp32: the params region is the daemon's master: read-only once
                               ready */
    zs_layout_t *layout;
    zc_dtype_t dtype;
    size_t dsize;
    zc_dtype_t grads_dtype; /* stage 1's grads region (data_types.grad_accum_dtype) */
    size_t gsize;
    uint32_t train_batch, micro_batch; /* AttachReply: 0 when the config gives none */
    uint32_t stage;
    uint32_t accum_steps;
    uint32_t n_slots;
    uint64_t slot_bytes;
    zs_region_t params;
    zs_region_t slots;
    zs_region_t grads;
    zc_slot_rec_t *slot_rec; /* [n_slots] */
    uint32_t n_outstanding;  /* slots in ZC_SLOT_SUBMITTED */
    zc_copy_plan_t copy;     /* how zc_session_slot_fill copies (the daemon's plan) */

    zc_frame_t *kept[ZC_KEPT_COUNT]; /* the latest control replies (zc_session_keep) */
};

static zs_deadline_t zc_deadline(const zc_session_t *s, int timeout_ms)
{
    return zs_deadline_in_ms((uint64_t)(timeout_ms >= 0 ? timeout_ms : s->timeout_ms));
}

/* A broken connection stays broken: every later call gets ZC_ERR_CLOSED. */
static int zc_session_broken(zc_session_t *s, int status)
{
    if (status == ZC_ERR_CLOSED || status == ZC_ERR_PROTOCOL || status == ZC_ERR_IO) {
        zc_conn_cleanup(&s->conn);
    }
    return status;
}

static int zc_session_check_conn(const zc_session_t *s)
{
    if (s->conn.fd < 0) {
        return zc_fail(ZC_ERR_CLOSED, "the connection to the daemon is closed (after an earlier "
                                      "error); open a new session");
    }
    return ZC_OK;
}

static void zc_session_unmap(zc_session_t *s)
{
    zs_region_cleanup(&s->params);
    zs_region_cleanup(&s->slots);
    zs_region_cleanup(&s->grads);
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

/* Read one frame and dispatch SlotFree and ErrorReply. *frame_p is set (and owned by the
 * caller) only for any other frame. */
static int zc_session_read(zc_session_t *s, zs_deadline_t deadline, zc_frame_t **frame_p)
{
    zc_frame_t *f = NULL;
    int status;

    *frame_p = NULL;
    status = zc_conn_recv(&s->conn, deadline, &f);
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    switch (f->body_case) {
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
static int zc_session_wait_reply(zc_session_t *s, uint64_t seq, zc_body_case_t reply_case,
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
    zs_deadline_t deadline = zc_deadline(s, timeout_ms);
    int status;

    status = zc_session_check_conn(s);
    if (status != ZC_OK) {
        return status;
    }
    request->seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, request, deadline);
    if (status == ZC_ERR_CLOSED) {
        /* The daemon may have said why before it closed (an ErrorReply, e.g. permission
         * denied): report that rather than the broken pipe. */
        zc_frame_t *f = NULL;
        zs_deadline_t soon = zs_deadline_in_ms(1000);
        int why;

        if (soon.at_ns > deadline.at_ns) {
            soon = deadline;
        }
        why = zc_session_read(s, soon, &f);
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
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
    req.hello = &hello;
    status = zc_session_request(s, &req, ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY, -1, &reply);
    if (status != ZC_OK) {
        return status;
    }
    hr = reply->hello_reply;
    status = zc_result_status(hr->result, "hello");
    if (status == ZC_OK && hr->protocol != ZC_PROTOCOL_VERSION) {
        status = zc_fail(ZC_ERR_VERSION,
                         "hello: daemon speaks protocol %u (zerod %s), libzc %s "
                         "speaks protocol %u",
                         hr->protocol, hr->version, zc_version(), ZC_PROTOCOL_VERSION);
    }
    if (status == ZC_OK) {
        snprintf(s->daemon.version, sizeof(s->daemon.version), "%s", hr->version);
        snprintf(s->daemon.device, sizeof(s->daemon.device), "%s", hr->device);
        s->daemon.pid = hr->pid;
        s->daemon.protocol = hr->protocol;
        s->daemon.peer_deadline_ms = hr->peer_deadline_ms;
        if (!s->timeout_set) {
            /* outwait the daemon: a lost or hung peer is then reported as ERR_PEER_LOST
             * naming the rank, not as this call's own timeout */
            uint64_t want = 2 * hr->peer_deadline_ms + ZC_PEER_DEADLINE_MARGIN_MS;
            if (want > (uint64_t)s->timeout_ms) {
                s->timeout_ms = want > INT32_MAX ? INT32_MAX : (int)want;
            }
        }
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

ZC_API int zc_session_open(const zc_open_params_t *params, zc_session_t **session_p)
{
    uint64_t mask = params ? params->field_mask : 0;
    const char *path = NULL;
    zc_session_t *s;
    int status;

    zc_error_clear();
    if (session_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "zc_session_open: session_p is NULL");
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "zc_session_open: out of memory");
    }
    s->conn.fd = -1;
    s->params = (zs_region_t)ZS_REGION_INIT;
    s->slots = (zs_region_t)ZS_REGION_INIT;
    s->grads = (zs_region_t)ZS_REGION_INIT;
    s->timeout_ms = ZC_DEFAULT_TIMEOUT_MS;
    if (mask & ZC_OPEN_FIELD_TIMEOUT_MS) {
        if (params->timeout_ms <= 0) {
            status = zc_fail(ZC_ERR_INVALID, "zc_session_open: timeout_ms %d is not positive",
                             params->timeout_ms);
            goto err_free;
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

/* ---- attach ------------------------------------------------------------------------ */

static int zc_attach_check(const zc_session_t *s, const zc_attach_params_t *p)
{
    uint64_t mask;

    if (p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "attach: params is NULL");
    }
    if (s->control) {
        return zc_fail(ZC_ERR_STATE, "attach: a control session cannot attach a job");
    }
    if (s->attached) {
        return zc_fail(ZC_ERR_STATE, "attach: the session is already attached");
    }
    mask = p->field_mask;
    if (!(mask & ZC_ATTACH_FIELD_JOB_ID) || p->job_id == NULL || p->job_id[0] == '\0') {
        return zc_fail(ZC_ERR_INVALID, "attach: job_id is required");
    }
    if ((mask & ZC_ATTACH_FIELD_WORLD) && p->world == 0) {
        return zc_fail(ZC_ERR_INVALID, "attach: world is 0");
    }
    if ((mask & ZC_ATTACH_FIELD_RANK) &&
        p->rank >= ((mask & ZC_ATTACH_FIELD_WORLD) ? p->world : 1)) {
        return zc_fail(ZC_ERR_INVALID, "attach: rank %u is not below world %u", p->rank,
                       (mask & ZC_ATTACH_FIELD_WORLD) ? p->world : 1);
    }
    if ((mask & ZC_ATTACH_FIELD_WORLD) && p->world > 1 &&
        (!(mask & ZC_ATTACH_FIELD_COORDINATOR) || p->coordinator == NULL ||
         p->coordinator[0] == '\0')) {
        return zc_fail(ZC_ERR_INVALID,
                       "attach: coordinator (host:port) is required when world "
                       "is %u",
                       p->world);
    }
    if ((mask & ZC_ATTACH_FIELD_DTYPE) && zc_dtype_size(p->dtype) == 0) {
        return zc_fail(ZC_ERR_INVALID, "attach: dtype %d is not a zc_dtype_t", (int)p->dtype);
    }
    if ((mask & ZC_ATTACH_FIELD_RESUME) &&
        ((int)p->resume < ZC_RESUME_IF_KEPT || (int)p->resume > ZC_RESUME_MUST)) {
        return zc_fail(ZC_ERR_INVALID, "attach: resume %d is not a zc_resume_t", (int)p->resume);
    }
    if (!(mask & ZC_ATTACH_FIELD_GROUPS) || p->n_groups == 0 || p->groups == NULL) {
        return zc_fail(ZC_ERR_INVALID, "attach: at least one parameter group is required");
    }
    if (p->n_groups > ZS_LAYOUT_MAX_GROUPS) {
        return zc_fail(ZC_ERR_INVALID, "attach: %u groups exceed the limit of %u", p->n_groups,
                       ZS_LAYOUT_MAX_GROUPS);
    }
    for (uint32_t g = 0; g < p->n_groups; g++) {
        if (p->groups[g].n_params > 0 && p->groups[g].numel == NULL) {
            return zc_fail(ZC_ERR_INVALID, "attach: group %u has %u params but numel is NULL", g,
                           p->groups[g].n_params);
        }
    }
    return ZC_OK;
}

/* The job's world size: the caller's, else 1. */
static uint32_t zc_attach_world(const zc_attach_params_t *p)
{
    return (p->field_mask & ZC_ATTACH_FIELD_WORLD) ? p->world : 1;
}

/* Build the Attach message; frees nothing of the caller's. groups/pgroups are caller storage
 * of n_groups entries. */
/* Group's names and shapes from its parameters' zc_param_info_t (info->... from parameter k). */
typedef struct zc_info_arrays {
    const zc_param_info_t *pi;
    char **names;
    uint32_t *ndim;
    uint64_t *dims;
} zc_info_arrays_t;

static void zc_attach_fill_info(const zc_info_arrays_t *info, uint32_t k, uint32_t n,
                                Zerod__Ipc__V1__Group *group)
{
    uint64_t *dims = info->dims + (size_t)k * ZC_MAX_DIMS;
    size_t nd = 0;

    group->n_names = group->n_ndim = n;
    group->names = info->names + k;
    group->ndim = info->ndim + k;
    group->dims = dims;
    for (uint32_t i = 0; i < n; i++) {
        const zc_param_info_t *pi = &info->pi[k + i];
        uint32_t d = pi->ndim;
        info->names[k + i] = (char *)(pi->name != NULL ? pi->name : "");
        if (d == 0 || d > ZC_MAX_DIMS) {
            d = 0; /* a 1-D shape of numel: the daemon's default */
        }
        info->ndim[k + i] = d;
        for (uint32_t j = 0; j < d; j++) {
            dims[nd++] = pi->dims[j];
        }
    }
    group->n_dims = nd;
}

static void zc_attach_fill(const zc_attach_params_t *p, const zc_info_arrays_t *info,
                           Zerod__Ipc__V1__Attach *at, Zerod__Ipc__V1__Group *groups,
                           Zerod__Ipc__V1__Group **pgroups)
{
    uint64_t mask = p->field_mask;
    uint32_t k = 0;

    at->job_id = (char *)p->job_id;
    at->rank = (mask & ZC_ATTACH_FIELD_RANK) ? p->rank : 0;
    at->world = zc_attach_world(p);
    if ((mask & ZC_ATTACH_FIELD_COORDINATOR) && p->coordinator != NULL) {
        at->coordinator = (char *)p->coordinator;
    }
    at->dtype = (Zerod__Ipc__V1__DType)((mask & ZC_ATTACH_FIELD_DTYPE) ? p->dtype : ZC_DTYPE_F32);
    if (mask & ZC_ATTACH_FIELD_RESUME) { /* ipc.proto Resume has zc_resume_t's values */
        at->resume = (Zerod__Ipc__V1__Resume)p->resume;
        at->restart = p->restart != 0;
    }
    at->config_json =
        (char *)(((mask & ZC_ATTACH_FIELD_CONFIG_JSON) && p->config_json != NULL) ? p->config_json
                                                                                  : "{}");
    for (uint32_t g = 0; g < p->n_groups; g++) {
        zerod__ipc__v1__group__init(&groups[g]);
        groups[g].n_numel = p->groups[g].n_params;
        groups[g].numel = (uint64_t *)p->groups[g].numel;
        if (p->groups[g].options_json != NULL) {
            groups[g].options_json = (char *)p->groups[g].options_json;
        }
        if (info != NULL) {
            zc_attach_fill_info(info, k, p->groups[g].n_params, &groups[g]);
        }
        k += p->groups[g].n_params;
        pgroups[g] = &groups[g];
    }
    at->n_groups = p->n_groups;
    at->groups = pgroups;
}

/* The client's own layout from the Attach groups and the reply's layout inputs. */
static int zc_attach_layout(zc_session_t *s, const zc_attach_params_t *p, uint32_t world,
                            const Zerod__Ipc__V1__AttachReply *ar)
{
    zs_layout_spec_t spec;
    uint32_t *group_n = NULL;
    uint64_t *numel = NULL;
    uint64_t n_params = 0, k = 0;
    char err[256] = "";
    int status;

    group_n = calloc(p->n_groups, sizeof(*group_n));
    for (uint32_t g = 0; g < p->n_groups; g++) {
        n_params += p->groups[g].n_params;
    }
    numel = calloc(n_params > 0 ? n_params : 1, sizeof(*numel));
    if (group_n == NULL || numel == NULL) {
        status = zc_fail(ZC_ERR_NO_MEMORY, "attach: out of memory for %llu parameters",
                         (unsigned long long)n_params);
        goto out;
    }
    for (uint32_t g = 0; g < p->n_groups; g++) {
        group_n[g] = p->groups[g].n_params;
        for (uint32_t i = 0; i < p->groups[g].n_params; i++) {
            numel[k++] = p->groups[g].numel[i];
        }
    }
    memset(&spec, 0, sizeof(spec));
    spec.world = world;
    spec.bucket_size = ar->bucket_size;
    spec.elem_align = ar->elem_align;
    spec.round_robin = ar->round_robin;
    spec.n_groups = p->n_groups;
    spec.group_n_params = group_n;
    spec.numel = numel;
    status = zs_layout_create(&spec, &s->layout, err, sizeof(err));
    if (status != ZS_OK) {
        status = zc_fail(status,
                         "attach: cannot compute the layout the daemon sent "
                         "(bucket_size %llu, elem_align %u): %s",
                         (unsigned long long)ar->bucket_size, ar->elem_align, err);
        goto out;
    }
    if (s->layout->hash != ar->layout_hash) {
        status = zc_fail(ZC_ERR_LAYOUT_MISMATCH,
                         "attach: layout hash mismatch: libzc computed 0x%016llx, the daemon "
                         "has 0x%016llx",
                         (unsigned long long)s->layout->hash, (unsigned long long)ar->layout_hash);
        goto out;
    }
    status = ZC_OK;

out:
    free(numel);
    free(group_n);
    return status;
}

/* Where the params region is the daemon's fp32 master, the trainer only reads it once the
 * daemon holds it: a stray write faults here instead of changing the optimizer's state. */
static int zc_params_protect(zc_session_t *s)
{
    if (!s->params_are_master || zs_region_protect_read(&s->params) == ZS_OK) {
        return ZC_OK;
    }
    return zc_fail(ZC_ERR_IO, "cannot make the params region read-only: %s", strerror(errno));
}

/* Check the reply's sizes against the layout and map the regions (takes the fds). */
static int zc_attach_map(zc_session_t *s, const Zerod__Ipc__V1__AttachReply *ar, int *fds,
                         uint32_t n_fds)
{
    uint32_t want = (s->stage == 1) ? 3 : 2;
    uint64_t need;
    int status;

    if (n_fds < want) {
        return zc_fail(ZC_ERR_PROTOCOL,
                       "attach: the reply carried %u file descriptors, "
                       "stage %u needs %u",
                       n_fds, s->stage, want);
    }
    need = s->layout->total_numel * s->dsize;
    if (ar->params_bytes < need) {
        return zc_fail(ZC_ERR_PROTOCOL,
                       "attach: params region of %llu bytes, the layout needs "
                       "%llu",
                       (unsigned long long)ar->params_bytes, (unsigned long long)need);
    }
    need = s->layout->max_bucket_numel * s->dsize;
    if (s->stage == 2 && (ar->n_slots == 0 || ar->slot_bytes < need)) {
        return zc_fail(ZC_ERR_PROTOCOL,
                       "attach: %u slots of %llu bytes, the largest bucket "
                       "needs one of %llu",
                       ar->n_slots, (unsigned long long)ar->slot_bytes, (unsigned long long)need);
    }
    need = s->layout->total_numel * s->gsize;
    if (s->stage == 1 && ar->grads_bytes < need) {
        return zc_fail(ZC_ERR_PROTOCOL,
                       "attach: grads region of %llu bytes, the layout needs "
                       "%llu",
                       (unsigned long long)ar->grads_bytes, (unsigned long long)need);
    }
    if (ar->n_slots > 0 && ar->slot_bytes > SIZE_MAX / ar->n_slots) {
        return zc_fail(ZC_ERR_PROTOCOL, "attach: %u slots of %llu bytes overflow", ar->n_slots,
                       (unsigned long long)ar->slot_bytes);
    }
    status = zs_region_map_fd(fds[0], (size_t)ar->params_bytes, &s->params);
    if (status != ZS_OK) {
        return zc_fail(status, "attach: cannot map the params region (%llu bytes)",
                       (unsigned long long)ar->params_bytes);
    }
    fds[0] = -1;
    status = zs_region_map_fd(fds[1], (size_t)(ar->n_slots * ar->slot_bytes), &s->slots);
    if (status != ZS_OK) {
        return zc_fail(status, "attach: cannot map the slot region (%u x %llu bytes)", ar->n_slots,
                       (unsigned long long)ar->slot_bytes);
    }
    fds[1] = -1;
    if (s->stage == 1) {
        status = zs_region_map_fd(fds[2], (size_t)ar->grads_bytes, &s->grads);
        if (status != ZS_OK) {
            return zc_fail(status, "attach: cannot map the grads region (%llu bytes)",
                           (unsigned long long)ar->grads_bytes);
        }
        fds[2] = -1;
    }
    s->n_slots = ar->n_slots;
    s->slot_bytes = ar->slot_bytes;
    s->slot_rec = calloc(s->n_slots > 0 ? s->n_slots : 1, sizeof(*s->slot_rec));
    if (s->slot_rec == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "attach: out of memory");
    }
    return ZC_OK;
}

/* Send Attach and wait for its reply (the fds that came with it stay in the connection). */
static int zc_attach_request(zc_session_t *s, const zc_attach_params_t *p, zc_frame_t **reply_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group *groups;
    Zerod__Ipc__V1__Group **pgroups;
    zc_info_arrays_t info = {NULL, NULL, NULL, NULL};
    size_t n_params = 0;
    int status;

    for (uint32_t g = 0; g < p->n_groups; g++) {
        n_params += p->groups[g].n_params;
    }
    groups = calloc(p->n_groups, sizeof(*groups));
    pgroups = calloc(p->n_groups, sizeof(*pgroups));
    if ((p->field_mask & ZC_ATTACH_FIELD_PARAM_INFO) && p->param_info != NULL) {
        info.pi = p->param_info;
        info.names = calloc(n_params + 1, sizeof(*info.names));
        info.ndim = calloc(n_params + 1, sizeof(*info.ndim));
        info.dims = calloc(n_params * ZC_MAX_DIMS + 1, sizeof(*info.dims));
    }
    if (groups == NULL || pgroups == NULL ||
        (info.pi != NULL && (info.names == NULL || info.ndim == NULL || info.dims == NULL))) {
        status = zc_fail(ZC_ERR_NO_MEMORY, "attach: out of memory");
        goto out_free;
    }
    zc_attach_fill(p, info.pi != NULL ? &info : NULL, &at, groups, pgroups);
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    req.attach = &at;
    status = zc_session_request(s, &req, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, -1, reply_p);

out_free:
    free(info.names);
    free(info.ndim);
    free(info.dims);
    free(pgroups);
    free(groups);
    return status;
}

/* The daemon has attached us: take the job's shape from its reply, compute the layout and map
 * the regions (taking the fds it maps). */
static int zc_attach_setup(zc_session_t *s, const zc_attach_params_t *p,
                           const Zerod__Ipc__V1__AttachReply *ar, int *fds, uint32_t n_fds)
{
    int status;

    s->stage = ar->stage;
    s->dtype = (p->field_mask & ZC_ATTACH_FIELD_DTYPE) ? p->dtype : ZC_DTYPE_F32;
    s->dsize = zc_dtype_size(s->dtype);
    s->accum_steps = ar->gradient_accumulation_steps ? ar->gradient_accumulation_steps : 1;
    s->grads_dtype = (zc_dtype_t)ar->grads_dtype;
    s->train_batch = ar->train_batch_size;
    s->micro_batch = ar->train_micro_batch_size;
    if (s->stage == 1 && s->grads_dtype != s->dtype && s->grads_dtype != ZC_DTYPE_F32) {
        return zc_fail(ZC_ERR_PROTOCOL, "attach: grads region of dtype %d for %s parameters",
                       (int)ar->grads_dtype, zc_dtype_name(s->dtype));
    }
    s->gsize = zc_dtype_size(s->grads_dtype);
    s->resumed = ar->resumed;
    s->params_ready = ar->resumed;
    s->params_are_master = ar->params_are_master;
    snprintf(s->ignored_keys, sizeof(s->ignored_keys), "%s",
             ar->ignored_keys != NULL ? ar->ignored_keys : "");
    snprintf(s->replaced, sizeof(s->replaced), "%s", ar->replaced != NULL ? ar->replaced : "");
    if (s->stage != 1 && s->stage != 2) {
        return zc_fail(ZC_ERR_PROTOCOL, "attach: the daemon replied stage %u", s->stage);
    }
    status = zc_attach_layout(s, p, zc_attach_world(p), ar);
    if (status != ZC_OK) {
        return status;
    }
    status = zc_attach_map(s, ar, fds, n_fds);
    if (status == ZC_OK && s->params_ready) {
        status = zc_params_protect(s);
    }
    return status;
}

static void zc_attach_info_fill(const zc_session_t *s, const Zerod__Ipc__V1__AttachReply *ar,
                                zc_attach_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->layout_hash = ar->layout_hash;
    info->step = ar->step;
    info->resumed = ar->resumed ? 1 : 0;
    info->loss_scale = ar->loss_scale;
    info->stage = s->stage;
    info->gradient_accumulation_steps = s->accum_steps;
    info->n_params = s->layout->n_params;
    info->n_buckets = s->layout->n_buckets;
    info->n_slots = s->n_slots;
    info->total_numel = s->layout->total_numel;
}

ZC_API int zc_session_attach(zc_session_t *session, const zc_attach_params_t *params,
                             zc_attach_info_t *info_p)
{
    const Zerod__Ipc__V1__AttachReply *ar;
    zc_frame_t *reply = NULL;
    int fds[ZC_MAX_PENDING_FDS];
    uint32_t n_fds;
    zc_session_t *s = session;
    int status;

    zc_error_clear();
    if (s == NULL) {
        return zc_fail(ZC_ERR_INVALID, "attach: session is NULL");
    }
    status = zc_attach_check(s, params);
    if (status == ZC_OK) {
        status = zc_session_check_conn(s);
    }
    if (status != ZC_OK) {
        return status;
    }
    zc_conn_close_fds(&s->conn); /* stray fds of earlier frames are not ours */
    status = zc_attach_request(s, params, &reply);
    n_fds = zc_conn_take_fds(&s->conn, fds, ZC_MAX_PENDING_FDS);
    if (status != ZC_OK) {
        goto out_close_fds;
    }
    ar = reply->attach_reply;
    status = zc_result_status(ar->result, "attach");
    if (status != ZC_OK) {
        goto out_reply;
    }
    /* The daemon has attached us: a failure from here on leaves the connection unusable. */
    status = zc_attach_setup(s, params, ar, fds, n_fds);
    if (status != ZC_OK) {
        goto err_detach;
    }
    s->attached = true;
    if (info_p != NULL) {
        zc_attach_info_fill(s, ar, info_p);
    }
    goto out_reply;

err_detach:
    /* Closing the connection lets the daemon keep the job for job_linger. */
    zc_session_unmap(s);
    zc_conn_cleanup(&s->conn);
out_reply:
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
out_close_fds:
    for (uint32_t i = 0; i < n_fds; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
    return status;
}

static int zc_session_check_attached(const zc_session_t *s, const char *what)
{
    if (s == NULL) {
        return zc_fail(ZC_ERR_INVALID, "%s: session is NULL", what);
    }
    if (!s->attached) {
        return zc_fail(ZC_ERR_STATE, "%s: the session is not attached to a job", what);
    }
    return zc_session_check_conn(s);
}

static int zc_session_check_ready(const zc_session_t *s, const char *what)
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

ZC_API int zc_session_params_ready(zc_session_t *session)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "params_ready");
    if (status != ZC_OK) {
        return status;
    }
    if (session->params_ready) {
        return zc_fail(ZC_ERR_STATE, "params_ready: %s",
                       session->resumed ? "the job was resumed; the daemon already holds its "
                                          "parameters"
                                        : "already sent");
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY;
    req.params_ready = &pr;
    status = zc_session_request(session, &req, ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY, -1,
                                &reply);
    if (status != ZC_OK) {
        return status;
    }
    status = zc_result_status(reply->params_ready_reply->result, "params_ready");
    if (status == ZC_OK && reply->params_ready_reply->restored_from != NULL &&
        reply->params_ready_reply->restored_from[0] != '\0') {
        session->restored = true;
        session->restored_step = reply->params_ready_reply->step;
        session->restored_scale = reply->params_ready_reply->loss_scale;
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    if (status == ZC_OK) {
        session->params_ready = true;
        status = zc_params_protect(session);
    }
    return status;
}

ZC_API const char *zc_session_replaced(zc_session_t *session)
{
    return session != NULL ? session->replaced : "";
}

ZC_API const char *zc_session_ignored_keys(zc_session_t *session)
{
    return session != NULL ? session->ignored_keys : "";
}

ZC_API zc_dtype_t zc_session_grads_dtype(zc_session_t *session)
{
    return session != NULL && session->attached ? session->grads_dtype : ZC_DTYPE_F32;
}

ZC_API int zc_session_batch(zc_session_t *session, uint32_t *train_batch_p, uint32_t *micro_p)
{
    if (session == NULL || !session->attached) {
        return zc_fail(ZC_ERR_STATE, "batch: the session is not attached");
    }
    if (train_batch_p != NULL) {
        *train_batch_p = session->train_batch;
    }
    if (micro_p != NULL) {
        *micro_p = session->micro_batch;
    }
    return ZC_OK;
}

ZC_API int zc_session_restored(zc_session_t *session, uint64_t *step_p, double *loss_scale_p)
{
    if (session == NULL || !session->restored) {
        return 0;
    }
    if (step_p != NULL) {
        *step_p = session->restored_step;
    }
    if (loss_scale_p != NULL) {
        *loss_scale_p = session->restored_scale;
    }
    return 1;
}

/* ---- layout queries ---------------------------------------------------------------- */

/* The public zc_dtype_t, ipc.proto's DType and zs_dtype_t carry the same values: codes.c
 * checks both against ZS_DTYPE_MAP. */

ZC_API size_t zc_dtype_size(zc_dtype_t dtype)
{
    zs_dtype_t d;

    return zs_dtype_from_int((long)dtype, &d) == ZS_OK ? zs_dtype_size(d) : 0;
}

ZC_API const char *zc_dtype_name(zc_dtype_t dtype)
{
    zs_dtype_t d;

    return zs_dtype_from_int((long)dtype, &d) == ZS_OK ? zs_dtype_name(d) : "unknown";
}

ZC_API zc_dtype_t zc_session_dtype(zc_session_t *session)
{
    return (session != NULL && session->attached) ? session->dtype : ZC_DTYPE_F32;
}

static int zc_session_check_param(zc_session_t *s, uint32_t id, const char *what)
{
    int status = zc_session_check_attached(s, what);

    if (status == ZC_OK && id >= s->layout->n_params) {
        status = zc_fail(ZC_ERR_INVALID, "%s: parameter %u is not below %u", what, id,
                         s->layout->n_params);
    }
    return status;
}

ZC_API void *zc_session_param_ptr(zc_session_t *session, uint32_t id)
{
    if (zc_session_check_param(session, id, "param_ptr") != ZC_OK) {
        return NULL;
    }
    return (uint8_t *)session->params.addr +
           zs_layout_param_by_id(session->layout, id)->offset * session->dsize;
}

ZC_API uint64_t zc_session_param_numel(zc_session_t *session, uint32_t id)
{
    if (zc_session_check_param(session, id, "param_numel") != ZC_OK) {
        return 0;
    }
    return zs_layout_param_by_id(session->layout, id)->numel;
}

static int zc_session_check_bucket(zc_session_t *s, uint32_t bucket, const char *what)
{
    int status = zc_session_check_attached(s, what);

    if (status == ZC_OK && bucket >= s->layout->n_buckets) {
        status = zc_fail(ZC_ERR_INVALID, "%s: bucket %u is not below %u", what, bucket,
                         s->layout->n_buckets);
    }
    return status;
}

ZC_API int zc_session_bucket_info(zc_session_t *session, uint32_t bucket, zc_bucket_info_t *info_p)
{
    const zs_layout_bucket_t *b;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_info");
    if (status != ZC_OK) {
        return status;
    }
    if (info_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_info: info_p is NULL");
    }
    b = &session->layout->buckets[bucket];
    info_p->group = b->group;
    info_p->n_params = b->n_params;
    info_p->numel = b->numel;
    info_p->padded = b->padded;
    return ZC_OK;
}

ZC_API int zc_session_param_bucket(zc_session_t *session, uint32_t id, uint32_t *bucket_p,
                                   uint64_t *offset_p)
{
    const zs_layout_param_t *p;
    int status;

    status = zc_session_check_param(session, id, "param_bucket");
    if (status != ZC_OK) {
        return status;
    }
    p = zs_layout_param_by_id(session->layout, id);
    if (bucket_p != NULL) {
        *bucket_p = p->bucket;
    }
    if (offset_p != NULL) {
        *offset_p = p->offset - session->layout->buckets[p->bucket].offset;
    }
    return ZC_OK;
}

ZC_API int zc_session_bucket_param(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   uint32_t *id_p)
{
    const zs_layout_bucket_t *b;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_param");
    if (status != ZC_OK) {
        return status;
    }
    b = &session->layout->buckets[bucket];
    if (i >= b->n_params) {
        return zc_fail(ZC_ERR_INVALID,
                       "bucket_param: index %u is not below bucket %u's %u "
                       "params",
                       i, bucket, b->n_params);
    }
    if (id_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_param: id_p is NULL");
    }
    *id_p = session->layout->params[b->first_param + i].id;
    return ZC_OK;
}

ZC_API int zc_session_bucket_piece(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   zc_bucket_piece_t *piece_p)
{
    zs_layout_piece_t pc;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_piece");
    if (status != ZC_OK) {
        return status;
    }
    if (i >= session->layout->buckets[bucket].n_params) {
        return zc_fail(ZC_ERR_INVALID, "bucket_piece: index %u is not below bucket %u's %u pieces",
                       i, bucket, session->layout->buckets[bucket].n_params);
    }
    if (piece_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_piece: piece_p is NULL");
    }
    zs_layout_bucket_piece(session->layout, bucket, i, &pc);
    piece_p->id = session->layout->params[pc.param].id;
    piece_p->param_offset = pc.param_offset;
    piece_p->slot_offset = pc.bucket_offset;
    piece_p->numel = pc.numel;
    return ZC_OK;
}

ZC_API void *zc_session_grads_ptr(zc_session_t *session)
{
    if (zc_session_check_attached(session, "grads_ptr") != ZC_OK) {
        return NULL;
    }
    if (session->stage != 1) {
        zc_fail(ZC_ERR_STATE, "grads_ptr: stage %u has no full-gradient region", session->stage);
        return NULL;
    }
    return session->grads.addr;
}

ZC_API void *zc_session_param_grad_ptr(zc_session_t *session, uint32_t id)
{
    uint8_t *grads = zc_session_grads_ptr(session);

    if (grads == NULL || zc_session_check_param(session, id, "param_grad_ptr") != ZC_OK) {
        return NULL;
    }
    return grads + zs_layout_param_by_id(session->layout, id)->offset * session->gsize;
}

/* ---- slots ------------------------------------------------------------------------- */

/* Zero the alignment gaps between the bucket's params and its tail padding. */
static void zc_slot_zero_gaps(const zc_session_t *s, uint32_t bucket, uint8_t *data)
{
    const zs_layout_bucket_t *b = &s->layout->buckets[bucket];
    uint64_t pos = 0;

    for (uint32_t i = 0; i < b->n_params; i++) {
        zs_layout_piece_t pc; /* the first and last may be parts of split parameters */
        zs_layout_bucket_piece(s->layout, bucket, i, &pc);
        if (pc.bucket_offset > pos) {
            memset(data + pos * s->dsize, 0, (pc.bucket_offset - pos) * s->dsize);
        }
        pos = pc.bucket_offset + pc.numel > pos ? pc.bucket_offset + pc.numel : pos;
    }
    if (b->padded > pos) {
        memset(data + pos * s->dsize, 0, (b->padded - pos) * s->dsize);
    }
}

static int zc_slot_find_free(const zc_session_t *s)
{
    for (uint32_t i = 0; i < s->n_slots; i++) {
        if (s->slot_rec[i].state == ZC_SLOT_FREE) {
            return (int)i;
        }
    }
    return -1;
}

/* Read frames until a submitted slot comes back (or the deadline passes). */
static int zc_session_wait_slot_free(zc_session_t *s, zs_deadline_t deadline)
{
    uint32_t before = s->n_outstanding;
    zc_frame_t *f = NULL;
    int status;

    while (s->n_outstanding == before) {
        status = zc_session_read(s, deadline, &f);
        if (status != ZC_OK) {
            return status;
        }
        if (f != NULL) {
            status = zc_fail(ZC_ERR_PROTOCOL,
                             "unexpected %s frame (seq %llu) while waiting for "
                             "a SlotFree",
                             zc_body_name(f->body_case), (unsigned long long)f->seq);
            zerod__ipc__v1__frame__free_unpacked(f, NULL);
            return zc_session_broken(s, status);
        }
    }
    return ZC_OK;
}

ZC_API int zc_session_slot_acquire(zc_session_t *session, uint32_t bucket, int timeout_ms,
                                   zc_slot_t *slot_p)
{
    zc_session_t *s = session;
    zs_deadline_t deadline;
    int status;
    int idx;

    zc_error_clear();
    status = zc_session_check_bucket(s, bucket, "slot_acquire");
    if (status == ZC_OK) {
        status = zc_session_check_ready(s, "slot_acquire");
    }
    if (status != ZC_OK) {
        return status;
    }
    if (slot_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "slot_acquire: slot_p is NULL");
    }
    if (s->stage != 2) {
        return zc_fail(ZC_ERR_STATE,
                       "slot_acquire: stage %u has no gradient slots; add "
                       "gradients at zc_session_grads_ptr()",
                       s->stage);
    }
    deadline = zc_deadline(s, timeout_ms);
    while ((idx = zc_slot_find_free(s)) < 0) {
        if (s->n_outstanding == 0) {
            return zc_fail(ZC_ERR_STATE,
                           "slot_acquire: all %u slots are acquired and none is "
                           "submitted",
                           s->n_slots);
        }
        status = zc_session_wait_slot_free(s, deadline);
        if (status == ZC_ERR_TIMEOUT) {
            return zc_fail(status,
                           "slot_acquire: no slot came back within the deadline "
                           "(%u submitted)",
                           s->n_outstanding);
        }
        if (status != ZC_OK) {
            return status;
        }
    }
    s->slot_rec[idx].state = ZC_SLOT_ACQUIRED;
    s->slot_rec[idx].bucket = bucket;
    s->slot_rec[idx].seq = 0;
    slot_p->index = (uint32_t)idx;
    slot_p->bucket = bucket;
    slot_p->data = (uint8_t *)s->slots.addr + (size_t)idx * s->slot_bytes;
    slot_p->bytes = (size_t)(s->layout->buckets[bucket].padded * s->dsize);
    zc_slot_zero_gaps(s, bucket, slot_p->data);
    return ZC_OK;
}

ZC_API int zc_session_slot_fill(zc_session_t *session, const zc_slot_t *slot, uint64_t offset,
                                const void *src, uint64_t numel)
{
    zc_session_t *s = session;
    const zc_slot_rec_t *rec;
    uint64_t padded;
    uint8_t *dst;
    zk_exec_t ex;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(s, "slot_fill");
    if (status != ZC_OK) {
        return status;
    }
    if (slot == NULL || slot->index >= s->n_slots) {
        return zc_fail(ZC_ERR_INVALID, "slot_fill: not a slot of this session");
    }
    rec = &s->slot_rec[slot->index];
    if (rec->state != ZC_SLOT_ACQUIRED || rec->bucket != slot->bucket) {
        return zc_fail(ZC_ERR_STATE, "slot_fill: slot %u is not acquired for bucket %u",
                       slot->index, slot->bucket);
    }
    padded = s->layout->buckets[rec->bucket].padded;
    if (offset > padded || numel > padded - offset || (src == NULL && numel > 0)) {
        return zc_fail(ZC_ERR_INVALID,
                       "slot_fill: elements [%llu, %llu + %llu) of bucket %u (%llu elements)%s",
                       (unsigned long long)offset, (unsigned long long)offset,
                       (unsigned long long)numel, rec->bucket, (unsigned long long)padded,
                       src == NULL && numel > 0 ? ": src is NULL" : " are outside it");
    }
    dst =
        (uint8_t *)s->slots.addr + (size_t)slot->index * s->slot_bytes + (size_t)offset * s->dsize;
    ex = zc_copy_exec(&s->copy, numel * s->dsize);
    if (zk_cast(&ex, dst, (zs_dtype_t)s->dtype, src, (zs_dtype_t)s->dtype, (size_t)numel) !=
        ZS_OK) {
        return zc_fail(ZC_ERR_INVALID, "slot_fill: %s", zk_last_error());
    }
    return ZC_OK;
}

ZC_API int zc_session_fill_stores(zc_session_t *session, uint64_t numel, int *nt_p,
                                  unsigned *prefetch_p, int *planned_p)
{
    zk_exec_t ex;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "fill_stores");
    if (status != ZC_OK) {
        return status;
    }
    ex = zc_copy_exec(&session->copy,
                      numel > UINT64_MAX / session->dsize ? UINT64_MAX : numel * session->dsize);
    if (nt_p != NULL) {
        *nt_p = ex.stores == ZK_STORES_NT;
    }
    if (prefetch_p != NULL) {
        *prefetch_p = ex.prefetch > 0 ? (unsigned)ex.prefetch : 0;
    }
    if (planned_p != NULL) {
        *planned_p = session->copy.valid;
    }
    return ZC_OK;
}

ZC_API int zc_session_slot_submit(zc_session_t *session, const zc_slot_t *slot, uint32_t micro_step)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    zc_session_t *s = session;
    zc_slot_rec_t *rec;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(s, "slot_submit");
    if (status != ZC_OK) {
        return status;
    }
    if (slot == NULL || slot->index >= s->n_slots) {
        return zc_fail(ZC_ERR_INVALID, "slot_submit: not a slot of this session");
    }
    rec = &s->slot_rec[slot->index];
    if (rec->state != ZC_SLOT_ACQUIRED || rec->bucket != slot->bucket) {
        return zc_fail(ZC_ERR_STATE, "slot_submit: slot %u is not acquired for bucket %u",
                       slot->index, slot->bucket);
    }
    if (micro_step >= s->accum_steps) {
        return zc_fail(ZC_ERR_INVALID,
                       "slot_submit: micro_step %u is not below "
                       "gradient_accumulation_steps %u",
                       micro_step, s->accum_steps);
    }
    br.slot = slot->index;
    br.bucket = slot->bucket;
    br.micro_step = micro_step;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
    req.bucket_ready = &br;
    req.seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, &req, zc_deadline(s, -1));
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    rec->state = ZC_SLOT_SUBMITTED;
    rec->seq = req.seq;
    s->n_outstanding++;
    return ZC_OK;
}

/* ---- step / detach ----------------------------------------------------------------- */

static int zc_session_drain(zc_session_t *s, zs_deadline_t deadline, const char *what);

int zc_session_prepare_call(zc_session_t *s, int timeout_ms, const char *what)
{
    int status = zc_session_check_ready(s, what);

    return status == ZC_OK ? zc_session_drain(s, zc_deadline(s, timeout_ms), what) : status;
}

static int zc_session_drain(zc_session_t *s, zs_deadline_t deadline, const char *what)
{
    int status;

    while (s->n_outstanding > 0) {
        status = zc_session_wait_slot_free(s, deadline);
        if (status != ZC_OK) {
            return zc_fail_prefix(status, what);
        }
    }
    return ZC_OK;
}

ZC_API int zc_session_step(zc_session_t *session, const zc_step_params_t *params,
                           zc_step_result_t *result_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Step st = ZEROD__IPC__V1__STEP__INIT;
    const Zerod__Ipc__V1__StepReply *sr;
    uint64_t mask = params ? params->field_mask : 0;
    zc_session_t *s = session;
    zc_frame_t *reply = NULL;
    zs_deadline_t deadline;
    int timeout_ms = -1;
    int status;

    zc_error_clear();
    status = zc_session_check_ready(s, "step");
    if (status != ZC_OK) {
        return status;
    }
    if (mask & ZC_STEP_FIELD_GROUP_LR) {
        if (params->n_group_lr != s->layout->n_groups || params->group_lr == NULL) {
            return zc_fail(ZC_ERR_INVALID, "step: %u learning rates for %u groups",
                           params->n_group_lr, s->layout->n_groups);
        }
        st.n_group_lr = params->n_group_lr;
        st.group_lr = (double *)params->group_lr;
    }
    if (mask & ZC_STEP_FIELD_TIMEOUT_MS) {
        timeout_ms = params->timeout_ms;
    }
    for (uint32_t i = 0; i < s->n_slots; i++) {
        if (s->slot_rec[i].state == ZC_SLOT_ACQUIRED) {
            return zc_fail(ZC_ERR_STATE,
                           "step: slot %u was acquired for bucket %u but never "
                           "submitted",
                           i, s->slot_rec[i].bucket);
        }
    }
    deadline = zc_deadline(s, timeout_ms);
    status = zc_session_drain(s, deadline, "step");
    if (status != ZC_OK) {
        return status;
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
    req.step = &st;
    req.seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, &req, deadline);
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    status =
        zc_session_wait_reply(s, req.seq, ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY, deadline, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "step");
    }
    sr = reply->step_reply;
    zc_copy_plan_take(&s->copy, sr->copy_stores);
    status = zc_result_status(sr->result, "step");
    if (status == ZC_OK && result_p != NULL) {
        result_p->step = sr->step;
        result_p->skipped = sr->skipped ? 1 : 0;
        result_p->grad_norm = sr->grad_norm;
        result_p->loss_scale = sr->loss_scale;
        result_p->skipped_steps = sr->skipped_steps;
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

ZC_API int zc_session_detach(zc_session_t *session, int end_job)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Detach dt = ZEROD__IPC__V1__DETACH__INIT;
    zc_frame_t *reply = NULL;
    zs_deadline_t deadline;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "detach");
    if (status != ZC_OK) {
        return status;
    }
    deadline = zc_deadline(session, -1);
    status = zc_session_drain(session, deadline, "detach");
    if (status != ZC_OK) {
        return status;
    }
    dt.end_job = end_job ? 1 : 0;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH;
    req.detach = &dt;
    status =
        zc_session_request(session, &req, ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY, -1, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "detach");
    }
    status = zc_result_status(reply->detach_reply->result, "detach");
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    if (status == ZC_OK) {
        zc_session_unmap(session);
    }
    return status;
}
