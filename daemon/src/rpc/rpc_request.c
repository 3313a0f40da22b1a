/*
 * Frames to runner requests (rpc/rpc_int.h, zd_rpc_request): every count the client controls
 * bounded before it is used, an Attach's arrays, a checkpoint's or an export's directory taken
 * into the request with the peer's credentials.
 */
#define _GNU_SOURCE
#include "rpc/rpc_int.h"

#include "zs/ckpt.h"
#include "zs/error.h"
#include "zs/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- what goes to the runner ------------------------------------------------------------------
 */

/* An Attach's spec, pointing into the frame and into arrays made here (freed together). */
typedef struct zd_rpc_attach_mem {
    zd_frame_t *frame;
    uint32_t *gnp;
    uint64_t *numel;
    const char **gjson;
    const char **names; /* NULL, or [n_params] */
    uint32_t *ndim;     /* NULL, or [n_params] */
    uint64_t *dims;
} zd_rpc_attach_mem_t;

static void zd_rpc_release_frame(void *mem)
{
    zerod__ipc__v1__frame__free_unpacked(mem, NULL);
}

static void zd_rpc_release_attach(void *mem)
{
    zd_rpc_attach_mem_t *m = mem;

    if (m == NULL) {
        return;
    }
    zerod__ipc__v1__frame__free_unpacked(m->frame, NULL);
    free(m->gnp);
    free(m->numel);
    free(m->gjson);
    free(m->names);
    free(m->ndim);
    free(m->dims);
    free(m);
}

/* Group g's optional names and shapes (Group.names, ndim, dims) into m from parameter k on. */
static zs_status_t zd_rpc_group_names(const Zerod__Ipc__V1__Group *gr, size_t g, size_t k,
                                      zd_rpc_attach_mem_t *m, size_t *dim_at, char *err,
                                      size_t errlen)
{
    size_t d0 = 0;

    if (gr->n_names != 0 && gr->n_names != gr->n_numel) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: groups[%zu].names has %zu entries for %zu parameters", g,
                       gr->n_names, gr->n_numel);
    }
    if (gr->n_ndim != 0 && gr->n_ndim != gr->n_numel) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: groups[%zu].ndim has %zu entries for %zu parameters", g, gr->n_ndim,
                       gr->n_numel);
    }
    for (size_t i = 0; i < gr->n_numel; i++) {
        uint64_t prod = 1;
        m->names[k + i] = gr->n_names != 0 ? gr->names[i] : NULL;
        if (m->names[k + i] != NULL && strlen(m->names[k + i]) >= ZS_CKPT_NAME_MAX) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "attach: groups[%zu].names[%zu] is longer than %u bytes", g, i,
                           ZS_CKPT_NAME_MAX - 1);
        }
        uint32_t nd = gr->n_ndim != 0 ? gr->ndim[i] : 0; /* 0: a 1-D shape of numel */
        if (nd > ZS_CKPT_MAX_DIMS || d0 + nd > gr->n_dims) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "attach: groups[%zu].ndim[%zu] = %u is above %u or past dims (%zu)", g,
                           i, nd, ZS_CKPT_MAX_DIMS, gr->n_dims);
        }
        m->ndim[k + i] = nd != 0 ? nd : 1;
        for (uint32_t d = 0; d < m->ndim[k + i]; d++) {
            uint64_t v = nd != 0 ? gr->dims[d0++] : gr->numel[i];
            m->dims[(*dim_at)++] = v;
            prod *= v;
        }
        if (prod != gr->numel[i]) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "attach: groups[%zu] parameter %zu: its shape holds %llu elements, "
                           "numel says %llu",
                           g, i, (unsigned long long)prod, (unsigned long long)gr->numel[i]);
        }
    }
    if (gr->n_ndim != 0 && d0 != gr->n_dims) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: groups[%zu].dims has %zu entries; ndim adds up to %zu", g,
                       gr->n_dims, d0);
    }
    return ZS_OK;
}

/* The counts and codes of an Attach the client controls, bounded before anything is sized by
 * them: *n_params_p is the parameters of every group. */
static zs_status_t zd_rpc_attach_counts(const Zerod__Ipc__V1__Attach *at, size_t *n_params_p,
                                        zs_dtype_t *dtype_p, char *err, size_t errlen)
{
    size_t n_params = 0;

    if (at->n_groups == 0 || at->n_groups > ZS_LAYOUT_MAX_GROUPS) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: groups has %zu entries (allowed 1..%u)", at->n_groups,
                       ZS_LAYOUT_MAX_GROUPS);
    }
    for (size_t g = 0; g < at->n_groups; g++) {
        n_params += at->groups[g]->n_numel;
    }
    if (n_params > ZS_LAYOUT_MAX_PARAMS) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: %zu parameters exceed the limit of %u",
                       n_params, ZS_LAYOUT_MAX_PARAMS);
    }
    if ((int)at->resume < ZD_RESUME_IF_KEPT || (int)at->resume > ZD_RESUME_MUST) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: resume %d is not one of IF_KEPT, AUTO, NEVER, MUST (0..3)",
                       (int)at->resume);
    }
    if (zs_dtype_from_int((long)at->dtype, dtype_p) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: dtype %d is not fp32, fp16 or bf16",
                       (int)at->dtype);
    }
    *n_params_p = n_params;
    return ZS_OK;
}

/* Every count the client controls is bounded before it is used. */
static zs_status_t zd_rpc_attach_spec(zd_frame_t *f, zd_req_t *req, char *err, size_t errlen)
{
    const Zerod__Ipc__V1__Attach *at = f->attach;
    zd_rpc_attach_mem_t *m;
    size_t n_params = 0, k = 0;
    zs_status_t st;

    st = zd_rpc_attach_counts(at, &n_params, &req->u.attach.dtype, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL || (m->gnp = calloc(at->n_groups, sizeof(*m->gnp))) == NULL ||
        (m->names = calloc(n_params ? n_params : 1, sizeof(*m->names))) == NULL ||
        (m->ndim = calloc(n_params ? n_params : 1, sizeof(*m->ndim))) == NULL ||
        (m->dims = calloc(n_params * ZS_CKPT_MAX_DIMS + 1, sizeof(*m->dims))) == NULL ||
        (m->numel = calloc(n_params ? n_params : 1, sizeof(*m->numel))) == NULL ||
        (m->gjson = calloc(at->n_groups, sizeof(*m->gjson))) == NULL) {
        zd_rpc_release_attach(m);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory for %zu parameters",
                       n_params);
    }
    for (size_t g = 0, dim_at = 0; g < at->n_groups; g++) {
        st = zd_rpc_group_names(at->groups[g], g, k, m, &dim_at, err, errlen);
        if (st != ZS_OK) {
            m->frame = NULL; /* the caller frees the frame */
            zd_rpc_release_attach(m);
            return st;
        }
        m->gnp[g] = (uint32_t)at->groups[g]->n_numel;
        m->gjson[g] = at->groups[g]->options_json;
        for (size_t i = 0; i < at->groups[g]->n_numel; i++) {
            m->numel[k++] = at->groups[g]->numel[i];
        }
    }
    m->frame = f;
    req->u.attach = (zd_job_spec_t){at->job_id,
                                    at->rank,
                                    at->world,
                                    at->coordinator,
                                    req->u.attach.dtype,
                                    (uint32_t)at->n_groups,
                                    m->gnp,
                                    m->numel,
                                    m->gjson,
                                    at->config_json,
                                    m->names,
                                    m->ndim,
                                    m->dims,
                                    (zd_resume_t)at->resume, /* checked above */
                                    at->restart,
                                    0,
                                    at->own_slices_only};
    req->release = zd_rpc_release_attach;
    req->mem = m;
    return ZS_OK;
}

/* The checkpoint and export requests of zd_rpc_request. */
static zs_status_t zd_rpc_request_ckpt(const zd_frame_t *f, zd_req_t *req, char *err, size_t errlen)
{
    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE:
        req->kind = ZD_REQ_CKPT_SAVE;
        req->u.ckpt.dir = f->checkpoint_save->dir;
        req->u.ckpt.dir_fd = req->fd;
        req->u.ckpt.cred = &req->cred;
        req->u.ckpt.tag = f->checkpoint_save->tag;
        if (f->checkpoint_save->trainer_state.len > 0) {
            req->u.ckpt.trainer_state = f->checkpoint_save->trainer_state.data;
            req->u.ckpt.trainer_state_len = f->checkpoint_save->trainer_state.len;
        }
        return ZS_OK;
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_WAIT:
        req->kind = ZD_REQ_CKPT_WAIT;
        return ZS_OK;
    case ZEROD__IPC__V1__FRAME__BODY_EXPORT_REQUEST:
        req->kind = ZD_REQ_EXPORT;
        req->u.export_.path = f->export_request->path;
        req->u.export_.dir_fd = req->fd;
        req->u.export_.cred = &req->cred;
        if (zs_dtype_from_int((long)f->export_request->dtype, &req->u.export_.dtype) != ZS_OK) {
            return zs_errf(err, errlen, ZS_ERR_INVALID, "export: dtype %d is not fp32 or bf16",
                           (int)f->export_request->dtype);
        }
        return ZS_OK;
    default: /* CHECKPOINT_LOAD */
        req->kind = ZD_REQ_CKPT_LOAD;
        req->u.ckpt.dir = f->checkpoint_load->dir;
        req->u.ckpt.dir_fd = req->fd;
        req->u.ckpt.cred = &req->cred;
        req->u.ckpt.tag = f->checkpoint_load->tag;
        req->u.ckpt.load_optimizer_states = f->checkpoint_load->load_optimizer_states;
        return ZS_OK;
    }
}

/* The training requests of zd_rpc_request: attach, params ready, bucket ready, step, detach. */
static zs_status_t zd_rpc_request_train(const zd_rpc_session_t *s, zd_frame_t *f, zd_req_t *req,
                                        char *err, size_t errlen)
{
    zs_status_t st = ZS_OK;

    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_ATTACH:
        req->kind = ZD_REQ_ATTACH;
        req->release = NULL;
        st = zd_rpc_attach_spec(f, req, err, errlen);
        req->u.attach.trainer_pid = s->pid;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
        req->kind = ZD_REQ_PARAMS_READY;
        req->u.params_ready.reload = f->params_ready->reload;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY:
        req->kind = ZD_REQ_BUCKET_READY;
        req->u.bucket_ready.slot = f->bucket_ready->slot;
        req->u.bucket_ready.bucket = f->bucket_ready->bucket;
        req->u.bucket_ready.micro_step = f->bucket_ready->micro_step;
        req->u.bucket_ready.event_len =
            (uint32_t)(f->bucket_ready->event.len > UINT32_MAX ? UINT32_MAX
                                                               : f->bucket_ready->event.len);
        if (f->bucket_ready->event.len == sizeof(req->u.bucket_ready.event)) {
            memcpy(req->u.bucket_ready.event, f->bucket_ready->event.data,
                   sizeof(req->u.bucket_ready.event));
        }
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
        req->kind = ZD_REQ_STEP;
        req->u.step.group_lr = f->step->group_lr;
        req->u.step.n_group_lr = f->step->n_group_lr;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
        req->kind = ZD_REQ_DETACH;
        req->u.detach.end_job = f->detach->end_job;
        break;
    default:
        break;
    }
    return st;
}

/* The runner request of a checked frame; takes the frame and fd (its directory, or -1). */
zs_status_t zd_rpc_request(zd_rpc_session_t *s, zd_frame_t *f, int fd, zd_req_t **req_p, char *err,
                           size_t errlen)
{
    zd_req_t *req = calloc(1, sizeof(*req));
    zs_status_t st = ZS_OK;

    if (req == NULL) {
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        if (fd >= 0) {
            close(fd);
        }
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory queueing a request");
    }
    req->fd = fd;
    req->cred = s->cred;
    req->conn_id = s->conn_id;
    req->seq = f->seq;
    req->release = zd_rpc_release_frame;
    req->mem = f;
    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_ATTACH:
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
    case ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY:
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
        st = zd_rpc_request_train(s, f, req, err, errlen);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_WAIT:
    case ZEROD__IPC__V1__FRAME__BODY_EXPORT_REQUEST:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD:
        st = zd_rpc_request_ckpt(f, req, err, errlen);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_JOB_END:
        req->kind = ZD_REQ_JOB_END;
        req->u.job_end = (zd_job_end_req_t){f->job_end->job_id, f->job_end->all,
                                            f->job_end->checkpoint_dir, req->fd, &req->cred};
        break;
    default: /* zd_rpc_check let only the bodies above through, and ShardInfo */
        req->kind = ZD_REQ_SHARD_INFO;
        break;
    }
    if (st != ZS_OK) {
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        if (req->fd >= 0) {
            close(req->fd);
        }
        free(req);
        return st;
    }
    *req_p = req;
    return ZS_OK;
}
