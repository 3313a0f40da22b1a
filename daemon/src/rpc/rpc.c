/*
 * rpc's door (rpc/rpc.h): a connection's session (credentials, the descriptors that came with
 * its frames, its slots in flight), one frame in -- answered here (Hello, Status, a slot
 * submitted twice, a refusal) or handed to the runner as a request (rpc_request.c) -- and the
 * connection's end.
 */
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

void zd_rpc_session_peer(const zd_rpc_session_t *s, zd_rpc_peer_t *peer_p)
{
    peer_p->hello = s->role != ZD_ROLE_NONE;
    peer_p->control = s->role == ZD_ROLE_CONTROL;
    peer_p->holds_job = s->holds_job;
    peer_p->keepalive = s->keepalive;
}

void zd_rpc_session_destroy(zd_rpc_session_t *s)
{
    free(s);
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
    s->keepalive = f->hello->keepalive && rpc->keepalive_interval_ms > 0;
    if (s->keepalive) {
        hr.keepalive_interval_ms = rpc->keepalive_interval_ms;
        hr.keepalive_timeout_ms = rpc->keepalive_timeout_ms;
    }
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

/* The job's pace and its collectives (docs/metrics.md "Step rate"). */
static void zd_rpc_status_rate(Zerod__Ipc__V1__StatusReply *s, const zd_job_status_t *j)
{
    s->steps_per_s = zd_step_rate(&j->stats, j->created_ns, zs_time_now_ns());
    s->train_batch_size = j->train_batch_size;
    s->busbw_reduce_scatter = j->stats.busbw[ZD_XFER_REDUCE_SCATTER];
    s->busbw_all_gather = j->stats.busbw[ZD_XFER_ALL_GATHER];
    s->wait_reduce_scatter_s = j->stats.last_wait_s[ZD_XFER_REDUCE_SCATTER];
    s->wait_all_gather_s = j->stats.last_wait_s[ZD_XFER_ALL_GATHER];
    s->params_shared = j->params_shared;
}

/* Status, from what the runner published: it comes back at once even while the runner is busy
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

    zd_runner_status_get(rpc->runner, &st);
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
        zd_rpc_status_rate(&s, j);
        s.device_free_bytes = j->device_free;
        s.device_total_bytes = j->device_total;
        s.replication = j->replication;
        s.replica_owner = j->replica_owner;
        s.replica_step = j->replica_step;
        s.replica_valid = j->replica_valid;
        s.replica_buddy = j->replica_buddy;
        zd_rpc_memory(j, terms, term_ptrs, formulas);
        s.n_memory = ZD_MEM_COUNT;
        s.memory = term_ptrs;
    }
    out.seq = f->seq;
    out.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY;
    out.status_reply = &s;
    return zd_rpc_pack(&out);
}

/* A slot submitted while still in flight is answered here, not queued: it would be reduced
 * twice. Returns the refusal, or NULL when the slot is taken now (or out of range: the job names
 * the range). */
static zd_reply_t *zd_rpc_take_slot(zd_rpc_session_t *s, const zd_frame_t *f, bool *refused_p,
                                    char *msg, size_t msglen)
{
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
    return zd_rpc_slot_free(f->seq, slot, f->bucket_ready->bucket, ZS_ERR_INVALID, msg);
}

static void zd_rpc_submit(const zd_rpc_t *rpc, zd_req_t *req)
{
    if (rpc->submit != NULL) {
        rpc->submit(rpc->submit_arg, req);
    } else {
        zd_runner_submit(rpc->runner, req);
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

/* The requests the loop thread answers itself, without the runner: true when f is one. */
static bool zd_rpc_answer_now(const zd_rpc_t *rpc, zd_rpc_session_t *s, const zd_frame_t *f,
                              zd_reply_t **reply_p)
{
    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_JOB_LIST: /* rpc/rpc_job.c */
        *reply_p = zd_rpc_job_list(rpc, f->seq);
        return true;
    case ZEROD__IPC__V1__FRAME__BODY_TRACE: /* rpc/rpc_trace.c */
        *reply_p = zd_rpc_trace(rpc, f);
        return true;
    case ZEROD__IPC__V1__FRAME__BODY_HELLO:
        *reply_p = zd_rpc_hello(rpc, s, f);
        return true;
    case ZEROD__IPC__V1__FRAME__BODY_STATUS:
        *reply_p = zd_rpc_status(rpc, f);
        return true;
    default:
        return false;
    }
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
    if (zd_rpc_answer_now(rpc, s, f, reply_p)) {
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
