/*
 * A job's start on a session: zc_session_attach (the Attach request, the checks of its reply
 * (layout hash, sizes), the regions the daemon sends (params, slots, stage 1's grads) mapped,
 * the layout rebuilt here), zc_session_params_ready, and what the two replies said. Part of
 * zc_session (session_int.h).
 */
#define _GNU_SOURCE
#include "session_int.h"

#include "zs/dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    at->own_slices_only = (mask & ZC_ATTACH_FIELD_OWN_SLICES) && p->own_slices_only != 0;
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

/* Where the reply says the regions live (AttachReply.memory, .device). */
static int zc_attach_memory(zc_session_t *s, const Zerod__Ipc__V1__AttachReply *ar)
{
    switch (ar->memory) {
    case ZEROD__IPC__V1__MEMORY_KIND__MEMORY_HOST:
        s->mem = ZS_MEM_HOST;
        s->device = -1;
        return ZC_OK;
    case ZEROD__IPC__V1__MEMORY_KIND__MEMORY_DEVICE:
        if (ar->device < 0) {
            return zc_fail(ZC_ERR_PROTOCOL, "attach: device regions on CUDA device %d",
                           (int)ar->device);
        }
        s->mem = ZS_MEM_DEVICE;
        s->device = (int)ar->device;
        return ZC_OK;
    default:
        return zc_fail(ZC_ERR_PROTOCOL,
                       "attach: the reply's memory kind %d is neither MEMORY_HOST (0) nor "
                       "MEMORY_DEVICE (2)",
                       (int)ar->memory);
    }
}

/* One region of the reply, of `size` bytes: a memfd mapped (host), or a CUDA allocation
 * imported and mapped on the session's device, which *r then describes (device address, fd
 * -1). Takes *fd (sets it to -1) on success. */
static int zc_attach_region(zc_session_t *s, int *fd, size_t size, zs_region_t *r,
                            zk_cuda_region_t *dev)
{
    zs_status_t st;

    if (s->mem != ZS_MEM_DEVICE) {
        st = zs_region_map_fd(*fd, size, r);
        if (st != ZS_OK) {
            return zc_fail((int)st, "cannot map %zu bytes of fd %d", size, *fd);
        }
        *fd = -1;
        zs_prefault(r->addr, size); /* the daemon's pages, mapped here in one call per thread */
        return ZC_OK;
    }
    r->mem = ZS_MEM_DEVICE;
    if (size == 0) {
        return ZC_OK; /* nothing to map (the attach closes the fd) */
    }
    st = zk_cuda_region_import(s->device, *fd, size, dev);
    if (st != ZS_OK) {
        return zc_fail((int)st, "cannot import %zu bytes of device memory on cuda:%d: %s", size,
                       s->device, zk_last_error());
    }
    *fd = -1; /* the import closed it */
    r->fd = -1;
    r->addr = (void *)dev->ptr;
    r->size = size;
    return ZC_OK;
}

/* The reply's fds and region sizes are what the stage and the layout need. */
static int zc_attach_check_sizes(const zc_session_t *s, const Zerod__Ipc__V1__AttachReply *ar,
                                 uint32_t n_fds)
{
    uint32_t want = (s->stage == 1) ? 3 : 2;
    uint64_t need;

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
    return ZC_OK;
}

/* Check the reply's sizes against the layout and map the regions (takes the fds). */
static int zc_attach_map(zc_session_t *s, const Zerod__Ipc__V1__AttachReply *ar, int *fds,
                         uint32_t n_fds)
{
    int status = zc_attach_check_sizes(s, ar, n_fds);

    if (status != ZC_OK) {
        return status;
    }
    status = zc_attach_region(s, &fds[0], (size_t)ar->params_bytes, &s->params, &s->dev_params);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "attach: the params region");
    }
    status = zc_attach_region(s, &fds[1], (size_t)(ar->n_slots * ar->slot_bytes), &s->slots,
                              &s->dev_slots);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "attach: the slot region");
    }
    if (s->stage == 1) {
        status = zc_attach_region(s, &fds[2], (size_t)ar->grads_bytes, &s->grads, &s->dev_grads);
        if (status != ZC_OK) {
            return zc_fail_prefix(status, "attach: the grads region");
        }
    }
    s->n_slots = ar->n_slots;
    s->slot_bytes = ar->slot_bytes;
    s->slot_rec = calloc(s->n_slots > 0 ? s->n_slots : 1, sizeof(*s->slot_rec));
    if (s->slot_rec == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "attach: out of memory");
    }
    return ZC_OK;
}

/* Send Attach and wait for its reply, its Result OK (the fds that came with it stay in the
 * connection either way). */
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
    status =
        zc_session_call(s, &req, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, -1, "attach", reply_p);

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
    s->params_shared = ar->params_shared;
    s->replicated = ar->replicated;
    s->rank = (p->field_mask & ZC_ATTACH_FIELD_RANK) ? p->rank : 0;
    snprintf(s->ignored_keys, sizeof(s->ignored_keys), "%s",
             ar->ignored_keys != NULL ? ar->ignored_keys : "");
    snprintf(s->replaced, sizeof(s->replaced), "%s", ar->replaced != NULL ? ar->replaced : "");
    if (s->stage != 1 && s->stage != 2) {
        return zc_fail(ZC_ERR_PROTOCOL, "attach: the daemon replied stage %u", s->stage);
    }
    status = zc_attach_memory(s, ar);
    if (status == ZC_OK) {
        status = zc_attach_layout(s, p, zc_attach_world(p), ar);
    }
    if (status != ZC_OK) {
        return status;
    }
    return zc_attach_map(s, ar, fds, n_fds);
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

/* ---- ParamsReady, and what the replies said ------------------------------------------- */

ZC_API int zc_session_params_ready(zc_session_t *session)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    const Zerod__Ipc__V1__ParamsReadyReply *pr_reply;
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
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY, -1,
                             "params_ready", &reply);
    if (status != ZC_OK) {
        return status;
    }
    pr_reply = reply->params_ready_reply;
    if (pr_reply->restored_from != NULL && pr_reply->restored_from[0] != '\0') {
        session->restored = true;
        session->restored_step = pr_reply->step;
        session->restored_scale = pr_reply->loss_scale;
        snprintf(session->restore_warning, sizeof(session->restore_warning), "%s",
                 pr_reply->restore_warning != NULL ? pr_reply->restore_warning : "");
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    session->params_ready = true;
    return ZC_OK;
}

ZC_API int zc_session_params_reload(zc_session_t *session)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "params_reload");
    if (status != ZC_OK) {
        return status;
    }
    if (!session->params_ready) {
        return zc_fail(ZC_ERR_STATE, "params_reload: the job has no parameters yet (write them "
                                     "and call zc_session_params_ready first)");
    }
    /* with fp32 parameters the write reached the master already, but the daemon's buddy
     * replica (replication = buddy) must take it too */
    pr.reload = true;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY;
    req.params_ready = &pr;
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY, -1,
                             "params_reload", &reply);
    if (status == ZC_OK) {
        zerod__ipc__v1__frame__free_unpacked(reply, NULL);
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

ZC_API const char *zc_session_restore_warning(zc_session_t *session)
{
    return session != NULL ? session->restore_warning : "";
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
