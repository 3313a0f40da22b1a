/*
 * The control queries of zerod/zc_control.h: the daemon's status and this rank's shard, as
 * plain C structs (zeroctl prints them), and the export of its parameters. The session keeps
 * the reply of each query (zc_session_keep), so that the strings handed out and the terms and
 * groups read by index stay valid until the next query of the same kind.
 */
#include "zc_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ZC_STATUS_FIELDS                                                                           \
    (ZC_DAEMON_STATUS_FIELD_DAEMON | ZC_DAEMON_STATUS_FIELD_ACTIVITY |                             \
     ZC_DAEMON_STATUS_FIELD_JOB | ZC_DAEMON_STATUS_FIELD_MEMORY | ZC_DAEMON_STATUS_FIELD_RATE |    \
     ZC_DAEMON_STATUS_FIELD_DEVICE | ZC_DAEMON_STATUS_FIELD_REPLICA | ZC_DAEMON_STATUS_FIELD_WAIT)
#define ZC_MEMORY_TERM_FIELDS (ZC_MEMORY_TERM_FIELD_MEASURED | ZC_MEMORY_TERM_FIELD_FORMULA)
#define ZC_SHARD_INFO_FIELDS                                                                       \
    (ZC_SHARD_INFO_FIELD_LAYOUT | ZC_SHARD_INFO_FIELD_MASTER | ZC_SHARD_INFO_FIELD_GROUPS)
#define ZC_GROUP_SHARD_FIELDS (ZC_GROUP_SHARD_FIELD_RANGES | ZC_GROUP_SHARD_FIELD_OPTIONS)

/* protobuf-c gives "" for an absent string; a NULL would be a decoder's, never the caller's. */
static const char *zc_str(const char *s)
{
    return s != NULL ? s : "";
}

/* ---- status ------------------------------------------------------------------------ */

static void zc_status_fill_job(const Zerod__Ipc__V1__StatusReply *r, zc_daemon_status_t *st)
{
    st->has_job = r->has_job ? 1 : 0;
    st->job_id = zc_str(r->job_id);
    st->rank = r->rank;
    st->world = r->world;
    st->stage = r->stage;
    st->dtype = (zc_dtype_t)r->dtype; /* unchecked: zc_dtype_name() names a stranger "unknown" */
    st->trainer_attached = r->trainer_attached ? 1 : 0;
    st->step = r->step;
    st->skipped_steps = r->skipped_steps;
    st->loss_scale = r->loss_scale;
    st->grad_norm = r->grad_norm;
    st->param_numel = r->param_numel;
    st->layout_hash = r->layout_hash;
    st->collectives = zc_str(r->collectives);
}

static void zc_status_fill(const Zerod__Ipc__V1__StatusReply *r, zc_daemon_status_t *st)
{
    uint64_t want = st->field_mask & ZC_STATUS_FIELDS;

    if (want & ZC_DAEMON_STATUS_FIELD_DAEMON) {
        st->version = zc_str(r->version);
        st->pid = r->pid;
        st->device = zc_str(r->device);
        st->socket = zc_str(r->socket);
        st->uptime_s = r->uptime_s;
        st->heap_in_use = r->heap_in_use;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_ACTIVITY) {
        st->activity = zc_str(r->activity);
        st->activity_s = r->activity_s;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_JOB) {
        zc_status_fill_job(r, st);
    }
    if (want & ZC_DAEMON_STATUS_FIELD_MEMORY) {
        st->n_memory = (uint32_t)r->n_memory;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_RATE) {
        st->steps_per_s = r->steps_per_s;
        st->train_batch_size = r->train_batch_size;
        st->busbw_reduce_scatter = r->busbw_reduce_scatter;
        st->busbw_all_gather = r->busbw_all_gather;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_DEVICE) {
        st->device_free_bytes = r->device_free_bytes;
        st->device_total_bytes = r->device_total_bytes;
        st->mps = r->mps;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_REPLICA) {
        st->replication = r->replication;
        st->replica_owner = r->replica_owner;
        st->replica_step = r->replica_step;
        st->replica_valid = r->replica_valid;
        st->replica_buddy = r->replica_buddy;
    }
    if (want & ZC_DAEMON_STATUS_FIELD_WAIT) {
        st->wait_reduce_scatter_s = r->wait_reduce_scatter_s;
        st->wait_all_gather_s = r->wait_all_gather_s;
        st->params_shared = r->params_shared;
    }
    st->field_mask = want;
}

ZC_API int zc_session_daemon_status(zc_session_t *session, int timeout_ms,
                                    zc_daemon_status_t *status_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    if (session == NULL || status_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "status: %s is NULL",
                       session == NULL ? "session" : "status_p");
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS;
    req.status = &sr;
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY, timeout_ms,
                             "status", &reply);
    if (status != ZC_OK) {
        return status;
    }
    zc_session_keep(session, ZC_KEPT_STATUS, reply);
    zc_status_fill(reply->status_reply, status_p);
    return ZC_OK;
}

ZC_API int zc_session_memory_term(zc_session_t *session, uint32_t i, zc_memory_term_t *term_p)
{
    const Zerod__Ipc__V1__MemoryTerm *t;
    const zc_frame_t *kept;
    uint64_t want;

    if (session == NULL || term_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "memory_term: %s is NULL",
                       session == NULL ? "session" : "term_p");
    }
    kept = zc_session_kept(session, ZC_KEPT_STATUS);
    if (kept == NULL) {
        return zc_fail(ZC_ERR_STATE, "memory_term: no zc_session_daemon_status() yet");
    }
    if (i >= kept->status_reply->n_memory) {
        return zc_fail(ZC_ERR_INVALID, "memory_term: term %u is not below %zu", i,
                       kept->status_reply->n_memory);
    }
    t = kept->status_reply->memory[i];
    want = term_p->field_mask & ZC_MEMORY_TERM_FIELDS;
    if (want & ZC_MEMORY_TERM_FIELD_MEASURED) {
        term_p->name = zc_str(t->name);
        term_p->bytes = t->bytes;
    }
    if (want & ZC_MEMORY_TERM_FIELD_FORMULA) {
        term_p->formula_bytes = t->formula_bytes;
        term_p->formula = zc_str(t->formula);
    }
    term_p->field_mask = want;
    return ZC_OK;
}

/* ---- shard ------------------------------------------------------------------------- */

static void zc_shard_fill(const Zerod__Ipc__V1__ShardInfoReply *r, zc_shard_info_t *info)
{
    uint64_t want = info->field_mask & ZC_SHARD_INFO_FIELDS;

    if (want & ZC_SHARD_INFO_FIELD_LAYOUT) {
        info->job_id = zc_str(r->job_id);
        info->rank = r->rank;
        info->world = r->world;
        info->total_numel = r->total_numel;
        info->param_numel = r->param_numel;
        info->shard_numel = r->shard_numel;
        info->n_buckets = r->n_buckets;
        info->max_bucket_numel = r->max_bucket_numel;
        info->bucket_size = r->bucket_size;
        info->layout_hash = r->layout_hash;
    }
    if (want & ZC_SHARD_INFO_FIELD_MASTER) {
        info->master_sumsq = r->master_sumsq;
    }
    if (want & ZC_SHARD_INFO_FIELD_GROUPS) {
        info->n_groups = (uint32_t)r->n_groups;
    }
    info->field_mask = want;
}

ZC_API int zc_session_shard_info(zc_session_t *session, int timeout_ms, zc_shard_info_t *info_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ShardInfoRequest sr = ZEROD__IPC__V1__SHARD_INFO_REQUEST__INIT;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    if (session == NULL || info_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "shard: %s is NULL", session == NULL ? "session" : "info_p");
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO;
    req.shard_info = &sr;
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY,
                             timeout_ms, "shard", &reply);
    if (status != ZC_OK) {
        return status;
    }
    zc_session_keep(session, ZC_KEPT_SHARD, reply);
    zc_shard_fill(reply->shard_info_reply, info_p);
    return ZC_OK;
}

ZC_API const char *zc_session_training_config(zc_session_t *session)
{
    const zc_frame_t *kept = session != NULL ? zc_session_kept(session, ZC_KEPT_SHARD) : NULL;

    if (kept == NULL) {
        return NULL;
    }
    return kept->shard_info_reply->training_config != NULL ? kept->shard_info_reply->training_config
                                                           : "";
}

ZC_API int zc_session_group_shard(zc_session_t *session, uint32_t i, zc_group_shard_t *group_p)
{
    const Zerod__Ipc__V1__GroupShard *g;
    const zc_frame_t *kept;
    uint64_t want;

    if (session == NULL || group_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "group_shard: %s is NULL",
                       session == NULL ? "session" : "group_p");
    }
    kept = zc_session_kept(session, ZC_KEPT_SHARD);
    if (kept == NULL) {
        return zc_fail(ZC_ERR_STATE, "group_shard: no zc_session_shard_info() yet");
    }
    if (i >= kept->shard_info_reply->n_groups) {
        return zc_fail(ZC_ERR_INVALID, "group_shard: group %u is not below %zu", i,
                       kept->shard_info_reply->n_groups);
    }
    g = kept->shard_info_reply->groups[i];
    want = group_p->field_mask & ZC_GROUP_SHARD_FIELDS;
    if (want & ZC_GROUP_SHARD_FIELD_RANGES) {
        group_p->group = g->group;
        group_p->n_params = g->n_params;
        group_p->n_buckets = g->n_buckets;
        group_p->flat_offset = g->flat_offset;
        group_p->flat_numel = g->flat_numel;
        group_p->shard_offset = g->shard_offset;
        group_p->shard_numel = g->shard_numel;
    }
    if (want & ZC_GROUP_SHARD_FIELD_OPTIONS) {
        group_p->lr = g->lr;
        group_p->weight_decay = g->weight_decay;
    }
    group_p->field_mask = want;
    return ZC_OK;
}

ZC_API int zc_session_export(zc_session_t *session, const char *path, zc_dtype_t dtype,
                             int timeout_ms, uint64_t *step_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ExportRequest er = ZEROD__IPC__V1__EXPORT_REQUEST__INIT;
    zc_frame_t *reply = NULL;
    char abs[4096], dir[4096], dabs[4096], *slash;
    int status, fd = -1;

    zc_error_clear();
    if (session == NULL) {
        return zc_fail(ZC_ERR_INVALID, "export: session is NULL");
    }
    status = zc_abs_path("export", path, abs, sizeof(abs));
    if (status != ZC_OK) {
        return status;
    }
    /* the file's directory, opened here: the daemon creates the file in it with our rights */
    snprintf(dir, sizeof(dir), "%s", abs);
    slash = strrchr(dir, '/');
    slash[slash == dir ? 1 : 0] = '\0';
    status = zc_dir_open("export", dir, false, dabs, sizeof(dabs), &fd);
    if (status != ZC_OK) {
        return status;
    }
    er.path = abs;
    er.dtype = (Zerod__Ipc__V1__DType)dtype;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_EXPORT_REQUEST;
    req.export_request = &er;
    status = zc_session_call_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_EXPORT_REPLY,
                                timeout_ms, "export", &reply);
    close(fd);
    if (status != ZC_OK) {
        return status;
    }
    if (step_p != NULL) {
        *step_p = reply->export_reply->step;
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return ZC_OK;
}

ZC_API int zc_coordinator_from_env(char *buf, size_t len)
{
    const char *c = getenv("ZEROD_COORDINATOR"), *addr = getenv("MASTER_ADDR");
    const char *port = getenv("MASTER_PORT");
    char *end = NULL;
    unsigned long p;
    int n;

    zc_error_clear();
    if (buf == NULL || len == 0) {
        return zc_fail(ZC_ERR_INVALID, "coordinator_from_env: buf is NULL or empty");
    }
    if (c != NULL && c[0] != '\0') {
        n = snprintf(buf, len, "%s", c);
        return n > 0 && (size_t)n < len
                   ? ZC_OK
                   : zc_fail(ZC_ERR_INVALID, "ZEROD_COORDINATOR '%.100s' is too long", c);
    }
    if (addr == NULL || addr[0] == '\0' || port == NULL || port[0] == '\0') {
        return zc_fail(ZC_ERR_NOT_FOUND, "neither ZEROD_COORDINATOR nor MASTER_ADDR and "
                                         "MASTER_PORT are set");
    }
    p = strtoul(port, &end, 10);
    if (end == port || *end != '\0' || p == 0 || p >= 65535) {
        return zc_fail(ZC_ERR_INVALID,
                       "MASTER_PORT '%.40s' is not a port in 1..65534 (the daemons listen on "
                       "MASTER_PORT + 1; or set ZEROD_COORDINATOR=host:port)",
                       port);
    }
    n = snprintf(buf, len, "%s:%lu", addr, p + 1);
    return n > 0 && (size_t)n < len
               ? ZC_OK
               : zc_fail(ZC_ERR_INVALID, "MASTER_ADDR '%.100s' is too long", addr);
}
