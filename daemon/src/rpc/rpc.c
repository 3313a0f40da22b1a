#define _GNU_SOURCE
#include "rpc/rpc.h"
#include "rpc/rpc_int.h"

#include "config/daemon_config.h"
#include "rpc/rpc_check.h"
#include "zs/ckpt.h"
#include "zs/error.h"
#include "zs/frame.h"
#include "zs/layout.h"
#include "zs/log.h"
#include "zs/time.h"
#include "zs/version.h"

#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(ZD_MAX_SLOTS <= 64, "a session's slots are the bits of a uint64_t");
/* ipc.proto's DType carries zs_dtype_t's values */
_Static_assert(ZEROD__IPC__V1__DTYPE__DTYPE_F32 == (int)ZS_DTYPE_F32 &&
                   ZEROD__IPC__V1__DTYPE__DTYPE_F16 == (int)ZS_DTYPE_F16 &&
                   ZEROD__IPC__V1__DTYPE__DTYPE_BF16 == (int)ZS_DTYPE_BF16,
               "ipc.proto DType and zs_dtype_t differ");

zd_rpc_session_t *zd_rpc_session_create(uint64_t conn_id)
{
    zd_rpc_session_t *s = calloc(1, sizeof(*s));

    if (s != NULL) {
        s->conn_id = conn_id;
    }
    return s;
}

void zd_rpc_session_set_cred(zd_rpc_session_t *s, const zs_cred_t *cred)
{
    if (s != NULL) {
        s->cred = *cred;
        s->has_cred = true;
    }
}

void zd_fdq_close(zd_fdq_t *q)
{
    for (unsigned i = 0; i < q->n; i++) {
        close(q->fd[i]);
    }
    q->n = 0;
}

/* The oldest queued descriptor, now the caller's; -1 when none is queued. */
static int zd_fdq_pop(zd_fdq_t *q)
{
    int fd;

    if (q->n == 0) {
        return -1;
    }
    fd = q->fd[0];
    memmove(q->fd, q->fd + 1, (q->n - 1) * sizeof(int));
    q->n--;
    return fd;
}

/* How many descriptors a checked frame must come with: the directory of a request that names
 * one (ipc.proto), none otherwise. */
static uint32_t zd_rpc_fds_needed(const zd_frame_t *f)
{
    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD:
    case ZEROD__IPC__V1__FRAME__BODY_EXPORT_REQUEST:
        return 1;
    case ZEROD__IPC__V1__FRAME__BODY_JOB_END:
        return f->job_end->checkpoint_dir != NULL && f->job_end->checkpoint_dir[0] != '\0';
    default:
        return 0;
    }
}

void zd_rpc_session_set_pid(zd_rpc_session_t *s, int32_t pid)
{
    if (s != NULL) {
        s->pid = pid;
    }
}

void zd_rpc_session_destroy(zd_rpc_session_t *s)
{
    free(s);
}

/* ---- replies ------------------------------------------------------------------------------ */

void zd_reply_free(zd_reply_t *reply)
{
    if (reply == NULL) {
        return;
    }
    for (int i = 0; i < reply->n_fds; i++) {
        if (reply->fds[i] >= 0) {
            close(reply->fds[i]);
        }
    }
    free(reply->buf);
    free(reply);
}

/* The length prefix and the packed frame, in a new reply (NULL on allocation failure). */
zd_reply_t *zd_rpc_pack(const zd_frame_t *frame)
{
    size_t len = zerod__ipc__v1__frame__get_packed_size(frame);
    zd_reply_t *reply = calloc(1, sizeof(*reply));
    char err[128];

    if (reply == NULL) {
        return NULL;
    }
    reply->buf = malloc(len + ZS_FRAME_HEADER);
    if (reply->buf == NULL || zs_frame_header(len, reply->buf, err, sizeof(err)) != ZS_OK) {
        zs_error(ZS_SUB_IPC, "cannot send a %s reply of %zu bytes: %s",
                 zd_rpc_body_name(frame->body_case), len, reply->buf ? err : "out of memory");
        free(reply->buf);
        free(reply);
        return NULL;
    }
    zerod__ipc__v1__frame__pack(frame, reply->buf + ZS_FRAME_HEADER);
    reply->len = len + ZS_FRAME_HEADER;
    return reply;
}

Zerod__Ipc__V1__Result zd_rpc_result_of(zs_status_t status, const char *msg)
{
    Zerod__Ipc__V1__Result r = ZEROD__IPC__V1__RESULT__INIT;

    r.status = (Zerod__Common__V1__Status)status;
    r.message = (char *)(msg != NULL ? msg : "");
    return r;
}

zd_reply_t *zd_rpc_error(uint64_t seq, zs_status_t status, const char *msg)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ErrorReply er = ZEROD__IPC__V1__ERROR_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(status, msg);

    er.result = &r;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ERROR;
    f.error = &er;
    return zd_rpc_pack(&f);
}

/* ---- what is answered here ------------------------------------------------------------------ */

static zd_reply_t *zd_rpc_hello(const zd_rpc_t *rpc, zd_rpc_session_t *s, const zd_frame_t *f)
{
    Zerod__Ipc__V1__Frame out = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__HelloReply hr = ZEROD__IPC__V1__HELLO_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(ZS_OK, NULL);

    s->role =
        f->hello->role == ZEROD__IPC__V1__ROLE__ROLE_TRAINER ? ZD_ROLE_TRAINER : ZD_ROLE_CONTROL;
    hr.result = &r;
    hr.protocol = ZD_IPC_PROTOCOL;
    hr.version = (char *)ZS_VERSION;
    hr.pid = (int32_t)getpid();
    hr.device = (char *)rpc->device;
    hr.peer_deadline_ms = rpc->peer_deadline_ms;
    out.seq = f->seq;
    out.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY;
    out.hello_reply = &hr;
    zs_debug(ZS_SUB_IPC, "connection %llu: hello from %s (%s)", (unsigned long long)s->conn_id,
             s->role == ZD_ROLE_TRAINER ? "trainer" : "control", f->hello->version);
    return zd_rpc_pack(&out);
}

/* The memory terms of Status, each beside its formula of docs/semantics.md §1. */
static void zd_rpc_memory(const zd_job_status_t *j, Zerod__Ipc__V1__MemoryTerm *terms,
                          Zerod__Ipc__V1__MemoryTerm **ptrs, char (*formulas)[40])
{
    const char *d = j->dtype == ZS_DTYPE_F32 ? "4" : "2";

    for (int t = 0; t < ZD_MEM_COUNT; t++) {
        zerod__ipc__v1__memory_term__init(&terms[t]);
        terms[t].name = (char *)zd_mem_term_names[t];
        terms[t].bytes = j->mem_bytes[t];
        terms[t].formula_bytes = j->mem_formula[t];
        if (t == ZD_MEM_PARAMS) {
            snprintf(formulas[t], sizeof(formulas[t]), "%sΨ%s", d,
                     j->params_shared ? "/N (one region per host)" : "");
        } else if (t == ZD_MEM_SLOTS) {
            snprintf(formulas[t], sizeof(formulas[t]), "bucket_slots × largest bucket");
        } else if (t == ZD_MEM_GRADS) {
            snprintf(formulas[t], sizeof(formulas[t]), "%s%s", j->stage == 1 ? d : "0",
                     j->stage == 1 ? "Ψ" : "");
        } else if (t == ZD_MEM_MASTER && j->mem_formula[t] == 0) {
            snprintf(formulas[t], sizeof(formulas[t]), "0 (fp32: the params region's slices)");
        } else {
            snprintf(formulas[t], sizeof(formulas[t]), "4Ψ/N");
        }
        terms[t].formula = formulas[t];
        ptrs[t] = &terms[t];
    }
}

/* What the daemon's malloc holds (every arena and the mmapped chunks), so that a test or an
 * operator can watch for a leak without attaching a debugger; 0 where libc cannot say. */
/* An NVIDIA MPS control daemon serves this process: its control pipe is in the pipe directory
 * ($CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps), where a CUDA client finds it. */
static bool zd_rpc_mps_running(void)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char path[4096];
    struct stat sb;

    snprintf(path, sizeof(path), "%s/control",
             dir != NULL && dir[0] != '\0' ? dir : "/tmp/nvidia-mps");
    return stat(path, &sb) == 0;
}

static uint64_t zd_rpc_heap_in_use(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();

    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#else
    return 0;
#endif
}

/* Status, from what the engine published: it comes back at once even while the engine is busy
 * for long (a mesh forming, a peer awaited, a big step). */
static zd_reply_t *zd_rpc_status(const zd_rpc_t *rpc, const zd_frame_t *f)
{
    static zd_runner_status_t st; /* the loop thread only */
    Zerod__Ipc__V1__Frame out = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StatusReply s = ZEROD__IPC__V1__STATUS_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(ZS_OK, NULL);
    Zerod__Ipc__V1__MemoryTerm terms[ZD_MEM_COUNT];
    Zerod__Ipc__V1__MemoryTerm *term_ptrs[ZD_MEM_COUNT];
    char formulas[ZD_MEM_COUNT][40];
    uint64_t now = zs_time_now_ns();

    zd_runner_status_get(rpc->engine, &st);
    s.result = &r;
    s.version = (char *)ZS_VERSION;
    s.pid = (int32_t)getpid();
    s.device = (char *)rpc->device;
    s.socket = (char *)rpc->socket_path;
    s.uptime_s = (double)(now - st.start_ns) * 1e-9;
    s.heap_in_use = zd_rpc_heap_in_use();
    s.activity = st.activity;
    s.activity_s = st.activity[0] != '\0' ? (double)(now - st.activity_since_ns) * 1e-9 : 0;
    s.mps = rpc->device != NULL && strncmp(rpc->device, "cuda:", 5) == 0 && zd_rpc_mps_running();
    if (st.has_job) {
        const zd_job_status_t *j = &st.job;
        s.has_job = true;
        s.job_id = (char *)j->job_id;
        s.rank = j->rank;
        s.world = j->world;
        s.stage = j->stage;
        s.step = j->step;
        s.skipped_steps = j->skipped_steps;
        s.loss_scale = j->loss_scale;
        s.grad_norm = j->grad_norm;
        s.trainer_attached = j->trainer_attached;
        s.param_numel = j->param_numel;
        s.layout_hash = j->layout_hash;
        s.dtype = (Zerod__Ipc__V1__DType)j->dtype;
        s.collectives = (char *)j->collectives;
        s.steps_per_s = zd_step_rate(&j->stats, j->created_ns, zs_time_now_ns());
        s.train_batch_size = j->train_batch_size;
        s.busbw_reduce_scatter = j->stats.busbw[ZD_XFER_REDUCE_SCATTER];
        s.busbw_all_gather = j->stats.busbw[ZD_XFER_ALL_GATHER];
        s.device_free_bytes = j->device_free;
        s.device_total_bytes = j->device_total;
        zd_rpc_memory(j, terms, term_ptrs, formulas);
        s.n_memory = ZD_MEM_COUNT;
        s.memory = term_ptrs;
    }
    out.seq = f->seq;
    out.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY;
    out.status_reply = &s;
    return zd_rpc_pack(&out);
}

Zerod__Ipc__V1__Frame zd_rpc_slot_free_frame(uint64_t seq, Zerod__Ipc__V1__SlotFree *sf,
                                             Zerod__Ipc__V1__Result *r, uint32_t slot,
                                             uint32_t bucket)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;

    sf->result = r;
    sf->slot = slot;
    sf->bucket = bucket;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE;
    f.slot_free = sf;
    return f;
}

/* A slot submitted while still in flight is answered here, not queued: it would be reduced
 * twice. Returns the refusal, or NULL when the slot is taken now (or out of range: the job names
 * the range). */
static zd_reply_t *zd_rpc_take_slot(zd_rpc_session_t *s, const zd_frame_t *f, bool *refused_p,
                                    char *msg, size_t msglen)
{
    Zerod__Ipc__V1__SlotFree sf = ZEROD__IPC__V1__SLOT_FREE__INIT;
    Zerod__Ipc__V1__Result r;
    Zerod__Ipc__V1__Frame out;
    uint32_t slot = f->bucket_ready->slot;

    *refused_p = false;
    if (slot >= s->n_slots || slot >= ZD_MAX_SLOTS) {
        return NULL;
    }
    if (!(s->slot_busy & (1ull << slot))) {
        s->slot_busy |= 1ull << slot;
        return NULL;
    }
    *refused_p = true;
    snprintf(msg, msglen,
             "BucketReady.slot %u submitted twice: it is still in flight (wait for its SlotFree)",
             slot);
    r = zd_rpc_result_of(ZS_ERR_INVALID, msg);
    out = zd_rpc_slot_free_frame(f->seq, &sf, &r, slot, f->bucket_ready->bucket);
    return zd_rpc_pack(&out);
}

/* ---- what goes to the engine ------------------------------------------------------------------
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

/* Every count the client controls is bounded before it is used. */
static zs_status_t zd_rpc_attach_spec(zd_frame_t *f, zd_req_t *req, char *err, size_t errlen)
{
    const Zerod__Ipc__V1__Attach *at = f->attach;
    zd_rpc_attach_mem_t *m;
    size_t n_params = 0, k = 0;

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
    if (zs_dtype_from_int((long)at->dtype, &req->u.attach.dtype) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: dtype %d is not fp32, fp16 or bf16",
                       (int)at->dtype);
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
        zs_status_t st = zd_rpc_group_names(at->groups[g], g, k, m, &dim_at, err, errlen);
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

/* The engine request of a checked frame; takes the frame and fd (its directory, or -1). */
static zs_status_t zd_rpc_request(zd_rpc_session_t *s, zd_frame_t *f, int fd, zd_req_t **req_p,
                                  char *err, size_t errlen)
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
        req->kind = ZD_REQ_ATTACH;
        req->release = NULL;
        st = zd_rpc_attach_spec(f, req, err, errlen);
        req->u.attach.trainer_pid = s->pid;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
        req->kind = ZD_REQ_PARAMS_READY;
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

static void zd_rpc_submit(const zd_rpc_t *rpc, zd_req_t *req)
{
    if (rpc->submit != NULL) {
        rpc->submit(rpc->submit_arg, req);
    } else {
        zd_runner_submit(rpc->engine, req);
    }
}

/* The reply a refused Attach gets: the kind's own reply with the error. */
static zd_reply_t *zd_rpc_refused(zd_rpc_session_t *s, zd_req_kind_t kind, uint64_t seq,
                                  zs_status_t st, const char *msg)
{
    zd_resp_t *resp = calloc(1, sizeof(*resp));

    if (resp == NULL) {
        return NULL;
    }
    resp->kind = kind;
    resp->conn_id = s->conn_id;
    resp->seq = seq;
    resp->status = st;
    snprintf(resp->msg, sizeof(resp->msg), "%s", msg);
    return zd_rpc_result(s, resp);
}

/* The descriptors f says came with it, taken from fds (*fd_p: the one a directory request
 * needs, or -1). A count that does not match closes the connection: no descriptor is left for
 * a later frame to claim. */
static zs_status_t zd_rpc_take_fds(const zd_rpc_session_t *s, const zd_frame_t *f, zd_fdq_t *fds,
                                   int *fd_p, char *why, size_t whylen)
{
    uint32_t need = zd_rpc_fds_needed(f);

    *fd_p = -1;
    if (f->fds > fds->n || f->fds != need) {
        return zs_errf(why, whylen, ZS_ERR_PROTOCOL,
                       "frame %llu says %u file descriptor(s) came with it, %u are queued, and "
                       "its request needs %u%s",
                       (unsigned long long)f->seq, f->fds, fds->n, need,
                       need > f->fds ? " (its directory: a client older than this daemon?)" : "");
    }
    if (need > 0 && !s->has_cred) {
        return zs_errf(why, whylen, ZS_ERR_PERMISSION,
                       "the connection's peer credentials are unknown: no directory is used");
    }
    if (need > 0) {
        *fd_p = zd_fdq_pop(fds);
    }
    return ZS_OK;
}

zs_status_t zd_rpc_frame(const zd_rpc_t *rpc, zd_rpc_session_t *s, const uint8_t *payload,
                         size_t len, zd_fdq_t *fds, zd_reply_t **reply_p, bool *submitted_p,
                         bool *close_p, char *why, size_t whylen)
{
    zd_frame_t *f = NULL;
    zd_req_t *req = NULL;
    bool refused = false;
    uint64_t seq;
    zd_req_kind_t kind;
    int fd = -1;
    zs_status_t st;

    *reply_p = NULL;
    *submitted_p = false;
    *close_p = false;
    st = zd_rpc_decode(payload, len, &f, why, whylen);
    if (st == ZS_OK) {
        st = zd_rpc_check(s->role, f, why, whylen);
    }
    if (st == ZS_OK) {
        st = zd_rpc_take_fds(s, f, fds, &fd, why, whylen);
    }
    if (st != ZS_OK) {
        *reply_p = zd_rpc_error(f != NULL ? f->seq : 0, st, why);
        *close_p = true;
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return st;
    }
    if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_JOB_LIST ||
        f->body_case == ZEROD__IPC__V1__FRAME__BODY_TRACE) { /* rpc/rpc_job.c, rpc/rpc_trace.c */
        bool trace = f->body_case == ZEROD__IPC__V1__FRAME__BODY_TRACE;
        *reply_p = trace ? zd_rpc_trace(rpc, f) : zd_rpc_job_list(rpc, f->seq);
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return ZS_OK;
    }
    if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_HELLO ||
        f->body_case == ZEROD__IPC__V1__FRAME__BODY_STATUS) {
        *reply_p = f->body_case == ZEROD__IPC__V1__FRAME__BODY_HELLO ? zd_rpc_hello(rpc, s, f)
                                                                     : zd_rpc_status(rpc, f);
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        return ZS_OK;
    }
    if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY) {
        *reply_p = zd_rpc_take_slot(s, f, &refused, why, whylen);
        if (refused) {
            zerod__ipc__v1__frame__free_unpacked(f, NULL);
            return ZS_ERR_INVALID;
        }
    }
    seq = f->seq;
    kind = f->body_case == ZEROD__IPC__V1__FRAME__BODY_ATTACH ? ZD_REQ_ATTACH : ZD_REQ_SHARD_INFO;
    st = zd_rpc_request(s, f, fd, &req, why, whylen); /* takes f and fd */
    if (st != ZS_OK) {
        *reply_p = kind == ZD_REQ_ATTACH ? zd_rpc_refused(s, kind, seq, st, why)
                                         : zd_rpc_error(seq, st, why);
        return st;
    }
    zd_rpc_submit(rpc, req);
    *submitted_p = true;
    return ZS_OK;
}

void zd_rpc_closed(const zd_rpc_t *rpc, zd_rpc_session_t *s)
{
    zd_req_t *req;

    if (s->role != ZD_ROLE_TRAINER) {
        return;
    }
    req = calloc(1, sizeof(*req));
    if (req == NULL) {
        zs_error(ZS_SUB_ENGINE, "out of memory queueing a disconnect");
        return;
    }
    req->kind = ZD_REQ_DISCONNECT;
    req->conn_id = s->conn_id;
    req->fd = -1;
    zd_rpc_submit(rpc, req);
}
