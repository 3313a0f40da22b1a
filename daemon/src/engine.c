#include "engine.h"

#include "job.h"
#include "mesh.h"
#include "zk/kernels.h"
#include "zs/log.h"
#include "zs/time.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#ifndef ZEROD_VERSION
#define ZEROD_VERSION "0.0.0"
#endif

typedef enum zd_work_type {
    ZD_WORK_REQUEST,
    ZD_WORK_DISCONNECT,
} zd_work_type_t;

typedef struct zd_work {
    struct zd_work *next;
    zd_work_type_t type;
    uint64_t conn_id;
    zd_frame_t *frame; /* REQUEST: owned by the work item */
} zd_work_t;

struct zd_engine {
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    int wake_fd; /* eventfd: work queued or shutdown */
    zd_work_t *head, *tail;
    zd_reply_t *rhead, *rtail;
    bool shutdown;
    atomic_bool cancel; /* shutdown, readable without the lock (mesh waits poll it) */
    bool stopped;
    /* settings (under lock) */
    uint32_t bucket_slots;
    uint64_t max_shard_bytes;
    uint64_t job_linger_ns;
    char device[64];
    char socket_path[256];
    char token_file[512];
    uint64_t mesh_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns;
    bool direct_collectives;
    zd_engine_status_t pub; /* under lock: what Status reports (zd_engine_publish) */
    void (*notify)(void *arg);
    void *notify_arg;
    /* engine-thread state */
    zs_ratelimit_t warn_rl; /* warnings trainers can cause at will (refused attaches, ...) */
    zd_job_t *job;
    zk_pool_t *pool;
    zk_exec_t exec;
    uint64_t start_ns;
};

/* ---- replies -------------------------------------------------------------------------- */

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

zd_reply_t *zd_reply_pack(uint64_t conn_id, const zd_frame_t *frame)
{
    size_t len = zerod__ipc__v1__frame__get_packed_size(frame);
    zd_reply_t *reply = calloc(1, sizeof(*reply));

    if (reply == NULL) {
        return NULL;
    }
    reply->buf = malloc(len + 4);
    if (reply->buf == NULL) {
        free(reply);
        return NULL;
    }
    reply->buf[0] = (uint8_t)len;
    reply->buf[1] = (uint8_t)(len >> 8);
    reply->buf[2] = (uint8_t)(len >> 16);
    reply->buf[3] = (uint8_t)(len >> 24);
    zerod__ipc__v1__frame__pack(frame, reply->buf + 4);
    reply->len = len + 4;
    reply->conn_id = conn_id;
    reply->slot_freed = -1;
    return reply;
}

static void zd_engine_push_reply(zd_engine_t *e, zd_reply_t *reply)
{
    if (reply == NULL) {
        zs_error(ZS_SUB_ENGINE, "out of memory packing a reply; the client's call will time out");
        return;
    }
    pthread_mutex_lock(&e->lock);
    if (e->rtail != NULL) {
        e->rtail->next = reply;
    } else {
        e->rhead = reply;
    }
    e->rtail = reply;
    pthread_mutex_unlock(&e->lock);
    e->notify(e->notify_arg);
}

zd_reply_t *zd_engine_take_replies(zd_engine_t *e)
{
    zd_reply_t *list;

    pthread_mutex_lock(&e->lock);
    list = e->rhead;
    e->rhead = e->rtail = NULL;
    pthread_mutex_unlock(&e->lock);
    return list;
}

/* A result message; `msg` is copied into the frame by packing before it goes out of scope. */
typedef struct zd_result {
    Zerod__Ipc__V1__Result pb;
    char msg[ZD_MAX_MSG];
} zd_result_t;

static void zd_result_set(zd_result_t *r, zs_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void zd_result_set(zd_result_t *r, zs_status_t st, const char *fmt, ...)
{
    va_list ap;

    zerod__ipc__v1__result__init(&r->pb);
    r->msg[0] = '\0';
    if (fmt != NULL) {
        va_start(ap, fmt);
        vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
        va_end(ap);
    }
    r->pb.status = (Zerod__Common__V1__Status)st;
    r->pb.message = r->msg;
}

/* ---- the published status (engine thread writes, any thread reads) --------------------- */

/* Copy the job's state into pub; the caller holds the lock. */
static void zd_engine_publish_locked(zd_engine_t *e)
{
    zd_engine_status_t *s = &e->pub;
    const zd_job_t *job = e->job;

    s->has_job = job != NULL;
    if (job == NULL) {
        return;
    }
    snprintf(s->job_id, sizeof(s->job_id), "%s", job->id);
    s->rank = job->rank;
    s->world = job->world;
    s->stage = job->cfg.stage;
    s->dtype = job->dtype;
    s->step = job->step;
    s->skipped_steps = job->skipped_steps;
    s->loss_scale = job->scaler.cur_scale;
    s->grad_norm = job->last_grad_norm;
    s->trainer_attached = job->attached_conn != 0;
    s->param_numel = job->layout->param_numel;
    s->layout_hash = job->layout->hash;
    snprintf(s->collectives, sizeof(s->collectives), "%s",
             job->coll != NULL ? job->coll->algo
             : job->mesh_lost  ? "none (the mesh was lost: trainers must re-attach)"
                               : "none (no mesh yet)");
    memcpy(s->mem_bytes, job->mem_bytes, sizeof(s->mem_bytes));
    memcpy(s->mem_formula, job->mem_formula, sizeof(s->mem_formula));
}

static void zd_engine_publish(zd_engine_t *e)
{
    pthread_mutex_lock(&e->lock);
    zd_engine_publish_locked(e);
    pthread_mutex_unlock(&e->lock);
}

/* Say what the engine is about to be busy with (fmt NULL: nothing), publishing the job too. */
static void zd_engine_activity(zd_engine_t *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void zd_engine_activity(zd_engine_t *e, const char *fmt, ...)
{
    va_list ap;

    pthread_mutex_lock(&e->lock);
    e->pub.activity[0] = '\0';
    if (fmt != NULL) {
        va_start(ap, fmt);
        vsnprintf(e->pub.activity, sizeof(e->pub.activity), fmt, ap);
        va_end(ap);
    }
    e->pub.activity_since_ns = zs_time_now_ns();
    zd_engine_publish_locked(e);
    pthread_mutex_unlock(&e->lock);
}

void zd_engine_status_get(zd_engine_t *e, zd_engine_status_t *status_p)
{
    pthread_mutex_lock(&e->lock);
    *status_p = e->pub;
    pthread_mutex_unlock(&e->lock);
}

/* ---- request handlers (engine thread) -------------------------------------------------- */

/* The trainer is gone (disconnected or detached keeping the job): drop its partial
 * micro-step and keep the job for job_linger. */
static void zd_engine_release_trainer(zd_engine_t *e)
{
    zd_job_drop_partial(e->job);
    e->job->attached_conn = 0;
    pthread_mutex_lock(&e->lock);
    e->job->linger_until_ns = zs_time_now_ns() + e->job_linger_ns;
    pthread_mutex_unlock(&e->lock);
}

/* The mesh aborted (a peer lost, a collective timed out, a trainer gone): tear it down and
 * drop the partial micro-step. The shard stays at the last completed step; every rank's
 * trainer gets ERR_PEER_LOST until it re-attaches, which forms a new mesh. */
static void zd_engine_mesh_failed(zd_engine_t *e)
{
    zd_job_t *job = e->job;

    if (job == NULL || job->mesh == NULL) {
        return;
    }
    zd_mesh_aborted(job->mesh, job->mesh_why, sizeof(job->mesh_why));
    zd_coll_destroy(job->coll);
    job->coll = NULL;
    zd_mesh_destroy(job->mesh);
    job->mesh = NULL;
    job->mesh_lost = true;
    zd_job_drop_partial(job);
    zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE,
                    "job '%s' keeps step %llu; its trainers must re-attach (%s)", job->id,
                    (unsigned long long)job->step, job->mesh_why);
}

static void zd_engine_wake(zd_engine_t *e);

/* The mesh watch saw a peer go (its thread): wake the engine to tear the mesh down. */
static void zd_engine_wake_cb(void *arg)
{
    zd_engine_wake(arg);
}

/* World 1: the local collectives. World > 1: form the mesh (bounded by mesh_timeout) and,
 * when the job already has parameters, redo the all-gather from the master shards. */
static zs_status_t zd_engine_form_mesh(zd_engine_t *e, zd_job_t *job, const char *coordinator,
                                       char *err, size_t errlen)
{
    zd_mesh_params_t mp;
    uint8_t token[ZD_TOKEN_MAX];
    size_t token_len = 0;
    zs_status_t st;

    if (job->mesh != NULL && !job->mesh_lost) {
        return ZS_OK; /* re-attach after a detach that kept the job: the mesh is still up */
    }
    if (job->world == 1) {
        if (job->coll == NULL) {
            st = zd_coll_local_create(&e->exec, &job->coll);
            if (st != ZS_OK) {
                snprintf(err, errlen, "attach: out of memory");
            }
            return st;
        }
        return ZS_OK;
    }
    st = zd_mesh_read_token(e->token_file, token, &token_len, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&mp, 0, sizeof(mp));
    mp.job_id = job->id;
    mp.rank = job->rank;
    mp.world = job->world;
    mp.coordinator = coordinator;
    mp.layout_hash = job->layout->hash;
    mp.config_hash = job->config_hash;
    mp.step = job->step;
    mp.params_loaded = job->params_loaded;
    mp.token = token;
    mp.token_len = token_len;
    mp.mesh_timeout_ns = e->mesh_timeout_ns;
    mp.collective_timeout_ns = e->collective_timeout_ns;
    mp.heartbeat_interval_ns = e->heartbeat_interval_ns;
    mp.heartbeat_timeout_ns = e->heartbeat_timeout_ns;
    mp.cancel = &e->cancel;
    mp.wake = zd_engine_wake_cb;
    mp.wake_arg = e;
    zd_engine_activity(e, "forming the mesh of job '%s' (rank %u of %u, coordinator %s)", job->id,
                       job->rank, job->world, coordinator);
    st = zd_mesh_create(&mp, &job->mesh, err, errlen);
    explicit_bzero(token, sizeof(token));
    if (st != ZS_OK) {
        return st;
    }
    st = zd_coll_ucx_create(job->mesh, &e->exec, e->direct_collectives, &job->coll);
    if (st != ZS_OK) {
        snprintf(err, errlen, "attach: cannot create the UCX collectives");
        zd_mesh_destroy(job->mesh);
        job->mesh = NULL;
        return st;
    }
    job->mesh_lost = false;
    job->mesh_why[0] = '\0';
    st = zd_job_share_regions(job, err, errlen);
    if (st != ZS_OK) {
        zd_engine_mesh_failed(e);
        return st;
    }
    if (job->params_loaded) {
        st = zd_job_refresh_params(job, &e->exec, err, errlen);
        if (st != ZS_OK) {
            zd_engine_mesh_failed(e);
        }
    }
    return st;
}

static zs_status_t zd_engine_require_trainer(zd_engine_t *e, uint64_t conn_id, bool loaded,
                                             zd_result_t *r)
{
    if (e->job == NULL || e->job->attached_conn != conn_id) {
        zd_result_set(r, ZS_ERR_STATE, "no job attached on this connection (send Attach first)");
        return ZS_ERR_STATE;
    }
    if (e->job->mesh_lost) {
        zd_result_set(r, ZS_ERR_PEER_LOST,
                      "%s; job '%s' is at step %llu: re-attach every rank to continue",
                      e->job->mesh_why, e->job->id, (unsigned long long)e->job->step);
        return ZS_ERR_PEER_LOST;
    }
    if (loaded && !e->job->params_loaded) {
        zd_result_set(r, ZS_ERR_STATE,
                      "job '%s' has no initial parameters yet (send ParamsReady after writing "
                      "them into the params region)",
                      e->job->id);
        return ZS_ERR_STATE;
    }
    return ZS_OK;
}

static int zd_dup_fd(int fd)
{
    return fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

/* The spec of an Attach frame, with bounded counts. */
typedef struct zd_attach_spec {
    zd_job_spec_t spec;
    uint32_t *gnp;
    uint64_t *numel;
    const char **gjson;
} zd_attach_spec_t;

static void zd_attach_spec_cleanup(zd_attach_spec_t *a)
{
    free(a->gnp);
    free(a->numel);
    free(a->gjson);
}

/* ipc.proto's DType carries zs_dtype_t's values */
_Static_assert(ZEROD__IPC__V1__DTYPE__DTYPE_F32 == (int)ZS_DTYPE_F32 &&
                   ZEROD__IPC__V1__DTYPE__DTYPE_F16 == (int)ZS_DTYPE_F16 &&
                   ZEROD__IPC__V1__DTYPE__DTYPE_BF16 == (int)ZS_DTYPE_BF16,
               "ipc.proto DType and zs_dtype_t differ");

static zs_status_t zd_attach_spec_init(zd_engine_t *e, const Zerod__Ipc__V1__Attach *at,
                                       zd_attach_spec_t *a, zd_result_t *r)
{
    size_t n_params = 0, k = 0;

    memset(a, 0, sizeof(*a));
    if (at->n_groups == 0 || at->n_groups > ZS_LAYOUT_MAX_GROUPS) {
        zd_result_set(r, ZS_ERR_INVALID, "attach: groups has %zu entries (allowed 1..%u)",
                      at->n_groups, ZS_LAYOUT_MAX_GROUPS);
        return ZS_ERR_INVALID;
    }
    for (size_t g = 0; g < at->n_groups; g++) {
        n_params += at->groups[g]->n_numel;
    }
    if (n_params > ZS_LAYOUT_MAX_PARAMS) {
        zd_result_set(r, ZS_ERR_INVALID, "attach: %zu parameters exceed the limit of %u", n_params,
                      ZS_LAYOUT_MAX_PARAMS);
        return ZS_ERR_INVALID;
    }
    if (zs_dtype_from_int((long)at->dtype, &a->spec.dtype) != ZS_OK) {
        zd_result_set(r, ZS_ERR_INVALID, "attach: dtype %d is not fp32, fp16 or bf16",
                      (int)at->dtype);
        return ZS_ERR_INVALID;
    }
    a->gnp = calloc(at->n_groups, sizeof(*a->gnp));
    a->numel = calloc(n_params ? n_params : 1, sizeof(*a->numel));
    a->gjson = calloc(at->n_groups, sizeof(*a->gjson));
    if (a->gnp == NULL || a->numel == NULL || a->gjson == NULL) {
        zd_result_set(r, ZS_ERR_NO_MEMORY, "attach: out of memory for %zu parameters", n_params);
        return ZS_ERR_NO_MEMORY;
    }
    for (size_t g = 0; g < at->n_groups; g++) {
        a->gnp[g] = (uint32_t)at->groups[g]->n_numel;
        a->gjson[g] = at->groups[g]->options_json;
        for (size_t i = 0; i < at->groups[g]->n_numel; i++) {
            a->numel[k++] = at->groups[g]->numel[i];
        }
    }
    a->spec.job_id = at->job_id;
    a->spec.rank = at->rank;
    a->spec.world = at->world;
    a->spec.coordinator = at->coordinator;
    a->spec.n_groups = (uint32_t)at->n_groups;
    a->spec.group_n_params = a->gnp;
    a->spec.numel = a->numel;
    a->spec.group_json = a->gjson;
    a->spec.config_json = at->config_json;
    pthread_mutex_lock(&e->lock);
    a->spec.n_slots = e->bucket_slots;
    a->spec.max_shard_bytes = e->max_shard_bytes;
    pthread_mutex_unlock(&e->lock);
    return ZS_OK;
}

static void zd_engine_drop_job(zd_engine_t *e, const char *why)
{
    if (e->job == NULL) {
        return;
    }
    zs_info(ZS_SUB_ENGINE, "job '%s' ends (%s) at step %llu", e->job->id, why,
            (unsigned long long)e->job->step);
    zd_mesh_leave(e->job->mesh);
    zd_job_destroy(e->job);
    e->job = NULL;
    zs_log_set_rank(-1);
}

/* Re-attach of the live job: layout, config and identity must match. */
static zs_status_t zd_engine_check_reattach(zd_engine_t *e, uint64_t conn_id,
                                            const zd_attach_spec_t *a, zd_result_t *r)
{
    zd_job_t *job = e->job;
    char err[ZD_MAX_MSG];
    zd_job_spec_t spec = a->spec;
    zs_status_t st;

    if (job->attached_conn != 0 && !(job->mesh_lost && job->attached_conn == conn_id)) {
        zd_result_set(r, ZS_ERR_BUSY, "busy: job '%s' is attached by another trainer", job->id);
        return ZS_ERR_BUSY;
    }
    if (spec.rank != job->rank || spec.world != job->world) {
        zd_result_set(r, ZS_ERR_LAYOUT_MISMATCH,
                      "re-attach of job '%s' as rank %u of %u, but the job is rank %u of %u",
                      job->id, spec.rank, spec.world, job->rank, job->world);
        return ZS_ERR_LAYOUT_MISMATCH;
    }
    /* compare hashes computed from the request, without allocating a second job */
    {
        zd_train_config_t cfg;
        zs_layout_spec_t ls;
        uint64_t hash;

        st = zd_train_config_parse(spec.config_json, &cfg, NULL, 0, err, sizeof(err));
        if (st != ZS_OK) {
            zd_result_set(r, st, "%s", err);
            return st;
        }
        memset(&ls, 0, sizeof(ls));
        ls.world = spec.world;
        ls.bucket_size = cfg.reduce_bucket_size;
        ls.elem_align = ZS_ELEM_ALIGN;
        ls.round_robin = cfg.round_robin_gradients;
        ls.n_groups = spec.n_groups;
        ls.group_n_params = spec.group_n_params;
        ls.numel = spec.numel;
        hash = zs_layout_spec_hash(&ls);
        if (hash != job->layout->hash) {
            zd_result_set(r, ZS_ERR_LAYOUT_MISMATCH,
                          "re-attach of job '%s' with layout hash 0x%016llx, but the job has "
                          "layout hash 0x%016llx",
                          job->id, (unsigned long long)hash, (unsigned long long)job->layout->hash);
            return ZS_ERR_LAYOUT_MISMATCH;
        }
        if (zd_train_config_hash(&cfg) != job->config_hash || spec.dtype != job->dtype) {
            zd_result_set(r, ZS_ERR_CONFIG,
                          "re-attach of job '%s' with config hash 0x%016llx (dtype %s), but the "
                          "job has config hash 0x%016llx (dtype %s)",
                          job->id, (unsigned long long)zd_train_config_hash(&cfg),
                          zs_dtype_name(spec.dtype), (unsigned long long)job->config_hash,
                          zs_dtype_name(job->dtype));
            return ZS_ERR_CONFIG;
        }
    }
    return ZS_OK;
}

static void zd_engine_attach(zd_engine_t *e, uint64_t conn_id, uint64_t seq,
                             const Zerod__Ipc__V1__Attach *at)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__AttachReply ar = ZEROD__IPC__V1__ATTACH_REPLY__INIT;
    zd_attach_spec_t a;
    zd_result_t r;
    zd_reply_t *reply;
    bool resumed = false;
    char err[ZD_MAX_MSG] = "";
    zs_status_t st;

    zd_result_set(&r, ZS_OK, NULL);
    st = zd_attach_spec_init(e, at, &a, &r);
    if (st != ZS_OK) {
        goto out;
    }
    if (e->job != NULL && strcmp(e->job->id, at->job_id) != 0) {
        if (e->job->attached_conn != 0 && e->job->attached_conn != conn_id) {
            zd_result_set(&r, ZS_ERR_BUSY, "busy: this daemon serves job '%s' (attached)",
                          e->job->id);
        } else {
            zd_result_set(&r, ZS_ERR_BUSY,
                          "busy: this daemon keeps job '%s' for a re-attach for %.0f s more "
                          "(job_linger)",
                          e->job->id, (double)(e->job->linger_until_ns - zs_time_now_ns()) * 1e-9);
        }
        st = ZS_ERR_BUSY;
        goto out;
    }
    if (e->job != NULL) {
        st = zd_engine_check_reattach(e, conn_id, &a, &r);
        if (st != ZS_OK) {
            goto out;
        }
        resumed = true;
        st = zd_engine_form_mesh(e, e->job, at->coordinator, err, sizeof(err));
        if (st != ZS_OK) {
            zd_result_set(&r, st, "%s", err);
            zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE, "re-attach of job '%s' failed: %s",
                            at->job_id, err);
            goto out;
        }
        zs_info(ZS_SUB_ENGINE, "job '%s' re-attached at step %llu", e->job->id,
                (unsigned long long)e->job->step);
    } else {
        st = zd_job_create(&a.spec, &e->job, err, sizeof(err));
        if (st != ZS_OK) {
            zd_result_set(&r, st, "%s", err);
            zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE, "attach of job '%s' refused: %s",
                            at->job_id, err);
            goto out;
        }
        zs_log_set_rank((int)e->job->rank);
        st = zd_engine_form_mesh(e, e->job, at->coordinator, err, sizeof(err));
        if (st != ZS_OK) {
            zd_result_set(&r, st, "%s", err);
            zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE, "attach of job '%s' failed: %s", at->job_id,
                            err);
            zd_job_destroy(e->job);
            e->job = NULL;
            zs_log_set_rank(-1);
            goto out;
        }
        zs_info(ZS_SUB_ENGINE,
                "job '%s' attached: rank %u/%u, %s, stage %u, %llu params in %u buckets, shard "
                "%llu elements, layout 0x%016llx",
                e->job->id, e->job->rank, e->job->world, zs_dtype_name(e->job->dtype),
                e->job->cfg.stage, (unsigned long long)e->job->layout->param_numel,
                e->job->layout->n_buckets, (unsigned long long)e->job->layout->shard_numel,
                (unsigned long long)e->job->layout->hash);
    }
    e->job->attached_conn = conn_id;
    {
        zd_job_t *job = e->job;
        ar.layout_hash = job->layout->hash;
        ar.step = job->step;
        /* a job whose first trainer died before ParamsReady has no values yet: its next
         * trainer starts it like a fresh one (writes the initial values, ParamsReady) */
        ar.resumed = resumed && job->params_loaded;
        ar.loss_scale = job->scaler.cur_scale;
        ar.n_slots = job->n_slots;
        ar.slot_bytes = job->slot_bytes;
        ar.params_bytes = job->params.size;
        ar.grads_bytes = job->grads.size;
        ar.stage = job->cfg.stage;
        ar.gradient_accumulation_steps = job->cfg.gradient_accumulation_steps;
        ar.config_hash = job->config_hash;
        ar.bucket_size = job->cfg.reduce_bucket_size;
        ar.round_robin = job->cfg.round_robin_gradients;
        ar.elem_align = job->layout->elem_align;
    }
out:
    ar.result = &r.pb;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY;
    f.attach_reply = &ar;
    reply = zd_reply_pack(conn_id, &f);
    if (reply != NULL && st == ZS_OK) {
        reply->fds[0] = zd_dup_fd(e->job->params.fd);
        reply->fds[1] = zd_dup_fd(e->job->slots.fd);
        reply->n_fds = 2;
        if (e->job->grads.fd >= 0) {
            reply->fds[2] = zd_dup_fd(e->job->grads.fd);
            reply->n_fds = 3;
        }
        reply->n_slots = e->job->n_slots;
    }
    zd_engine_push_reply(e, reply);
    zd_attach_spec_cleanup(&a);
}

static void zd_engine_params_ready(zd_engine_t *e, uint64_t conn_id, uint64_t seq)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ParamsReadyReply pr = ZEROD__IPC__V1__PARAMS_READY_REPLY__INIT;
    zd_result_t r;

    zd_result_set(&r, ZS_OK, NULL);
    if (zd_engine_require_trainer(e, conn_id, false, &r) == ZS_OK) {
        if (e->job->params_loaded) {
            zd_result_set(&r, ZS_ERR_STATE,
                          "job '%s' already has its parameters (a resumed job keeps them)",
                          e->job->id);
        } else {
            char err[ZD_MAX_MSG] = "";
            zs_status_t st = zd_job_load_params(e->job, &e->exec, err, sizeof(err));
            if (st != ZS_OK) {
                zd_result_set(&r, st, "%s", err);
            }
        }
    }
    pr.result = &r.pb;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY;
    f.params_ready_reply = &pr;
    zd_engine_push_reply(e, zd_reply_pack(conn_id, &f));
}

static void zd_engine_bucket_ready(zd_engine_t *e, uint64_t conn_id, uint64_t seq,
                                   const Zerod__Ipc__V1__BucketReady *br)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__SlotFree sf = ZEROD__IPC__V1__SLOT_FREE__INIT;
    zd_result_t r;
    zd_reply_t *reply;
    zd_job_t *job = e->job;

    zd_result_set(&r, ZS_OK, NULL);
    if (zd_engine_require_trainer(e, conn_id, true, &r) != ZS_OK) {
        goto out;
    }
    if (job->cfg.stage == 1) {
        zd_result_set(&r, ZS_ERR_STATE,
                      "BucketReady in stage 1: gradients go in the grads region until Step");
    } else if (br->slot >= job->n_slots) {
        zd_result_set(&r, ZS_ERR_INVALID, "BucketReady.slot %u is out of range (%u slots)",
                      br->slot, job->n_slots);
    } else if (br->bucket >= job->layout->n_buckets) {
        zd_result_set(&r, ZS_ERR_INVALID, "BucketReady.bucket %u is unknown (layout has %u)",
                      br->bucket, job->layout->n_buckets);
    } else if (br->micro_step >= job->cfg.gradient_accumulation_steps) {
        zd_result_set(&r, ZS_ERR_INVALID,
                      "BucketReady.micro_step %u is out of range (gradient_accumulation_steps "
                      "%u)",
                      br->micro_step, job->cfg.gradient_accumulation_steps);
    } else {
        char err[ZD_MAX_MSG] = "";
        zs_status_t st =
            zd_job_accumulate_slot(job, &e->exec, br->slot, br->bucket, err, sizeof(err));
        if (st != ZS_OK) {
            zd_result_set(&r, st, "bucket %u: %s", br->bucket, err);
        }
    }
out:
    sf.result = &r.pb;
    sf.slot = br->slot;
    sf.bucket = br->bucket;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE;
    f.slot_free = &sf;
    reply = zd_reply_pack(conn_id, &f);
    if (reply != NULL) {
        reply->slot_freed = (int)br->slot;
    }
    zd_engine_push_reply(e, reply);
}

static void zd_engine_step(zd_engine_t *e, uint64_t conn_id, uint64_t seq,
                           const Zerod__Ipc__V1__Step *sp)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StepReply sr = ZEROD__IPC__V1__STEP_REPLY__INIT;
    zd_result_t r;
    zd_step_out_t out = {false, 0};
    char err[ZD_MAX_MSG] = "";
    zd_job_t *job = e->job;
    zs_status_t st;

    zd_result_set(&r, ZS_OK, NULL);
    if (zd_engine_require_trainer(e, conn_id, true, &r) != ZS_OK) {
        goto out;
    }
    if (sp->n_group_lr != 0 && sp->n_group_lr != job->layout->n_groups) {
        zd_result_set(&r, ZS_ERR_INVALID, "Step.group_lr has %zu entries; the job has %u groups",
                      sp->n_group_lr, job->layout->n_groups);
        goto out;
    }
    for (size_t g = 0; g < sp->n_group_lr; g++) {
        if (!isfinite(sp->group_lr[g]) || sp->group_lr[g] < 0) {
            zd_result_set(&r, ZS_ERR_INVALID, "Step.group_lr[%zu] = %g is not a finite lr >= 0", g,
                          sp->group_lr[g]);
            goto out;
        }
    }
    st = zd_job_step(job, &e->exec, sp->n_group_lr ? sp->group_lr : NULL, &out, err, sizeof(err));
    if (st != ZS_OK) {
        zd_result_set(&r, st, "%s", err);
        zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE, "%s", err);
    }
    zs_debug(ZS_SUB_ENGINE, "step %llu: skipped=%d grad_norm=%g loss_scale=%g",
             (unsigned long long)job->step, out.skipped, out.grad_norm, job->scaler.cur_scale);
out:
    sr.result = &r.pb;
    if (job != NULL) {
        sr.step = job->step;
        sr.loss_scale = job->scaler.cur_scale;
        sr.skipped_steps = job->skipped_steps;
    }
    sr.skipped = out.skipped;
    sr.grad_norm = out.grad_norm;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY;
    f.step_reply = &sr;
    zd_engine_push_reply(e, zd_reply_pack(conn_id, &f));
}

static void zd_engine_detach(zd_engine_t *e, uint64_t conn_id, uint64_t seq,
                             const Zerod__Ipc__V1__Detach *d)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__DetachReply dr = ZEROD__IPC__V1__DETACH_REPLY__INIT;
    zd_result_t r;
    zd_reply_t *reply;

    zd_result_set(&r, ZS_OK, NULL);
    /* a detach works on a job whose mesh was lost too: that is how a job ends after a fault */
    if (e->job == NULL || e->job->attached_conn != conn_id) {
        zd_result_set(&r, ZS_ERR_STATE, "no job attached on this connection (send Attach first)");
    } else {
        if (d->end_job) {
            zd_engine_drop_job(e, "trainer detached");
        } else {
            /* the mesh stays up (heartbeats go on while idle): the trainers of every rank
             * detach between steps and a later re-attach continues on the same mesh */
            zd_engine_release_trainer(e);
        }
    }
    dr.result = &r.pb;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY;
    f.detach_reply = &dr;
    reply = zd_reply_pack(conn_id, &f);
    if (reply != NULL) {
        reply->detached = true;
    }
    zd_engine_push_reply(e, reply);
}

static void zd_engine_shard_info(zd_engine_t *e, uint64_t conn_id, uint64_t seq)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ShardInfoReply s = ZEROD__IPC__V1__SHARD_INFO_REPLY__INIT;
    Zerod__Ipc__V1__GroupShard *groups = NULL;
    Zerod__Ipc__V1__GroupShard **group_ptrs = NULL;
    zd_result_t r;
    zd_job_t *job = e->job;

    zd_result_set(&r, ZS_OK, NULL);
    if (job == NULL) {
        zd_result_set(&r, ZS_ERR_NOT_FOUND, "no job on this daemon");
    } else {
        const zs_layout_t *l = job->layout;
        double sumsq = 0;
        int nonfinite = 0;

        groups = calloc(l->n_groups, sizeof(*groups));
        group_ptrs = calloc(l->n_groups, sizeof(*group_ptrs));
        if (groups == NULL || group_ptrs == NULL) {
            zd_result_set(&r, ZS_ERR_NO_MEMORY, "out of memory");
            goto out;
        }
        s.job_id = job->id;
        s.rank = job->rank;
        s.world = job->world;
        s.total_numel = l->total_numel;
        s.param_numel = l->param_numel;
        s.shard_numel = l->shard_numel;
        s.n_buckets = l->n_buckets;
        s.max_bucket_numel = l->max_bucket_numel;
        s.bucket_size = l->bucket_size;
        s.layout_hash = l->hash;
        for (uint32_t g = 0; g < l->n_groups; g++) {
            zerod__ipc__v1__group_shard__init(&groups[g]);
            groups[g].group = g;
            groups[g].n_params = l->groups[g].n_params;
            groups[g].n_buckets = l->groups[g].n_buckets;
            groups[g].flat_offset = l->groups[g].flat_offset;
            groups[g].flat_numel = l->groups[g].flat_numel;
            groups[g].shard_offset = l->groups[g].shard_offset;
            groups[g].shard_numel = l->groups[g].shard_numel;
            groups[g].lr = job->group_opts[g].lr;
            groups[g].weight_decay = job->group_opts[g].weight_decay;
            group_ptrs[g] = &groups[g];
        }
        s.n_groups = l->n_groups;
        s.groups = group_ptrs;
        zk_sumsq(&e->exec, job->master, l->shard_numel, &sumsq, &nonfinite);
        s.master_sumsq = nonfinite ? NAN : sumsq;
    }
out:
    s.result = &r.pb;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY;
    f.shard_info_reply = &s;
    zd_engine_push_reply(e, zd_reply_pack(conn_id, &f));
    free(groups);
    free(group_ptrs);
}

static void zd_engine_handle(zd_engine_t *e, zd_work_t *w)
{
    const zd_frame_t *fr = w->frame;

    if (w->type == ZD_WORK_DISCONNECT) {
        if (e->job != NULL && e->job->attached_conn == w->conn_id) {
            if (e->job->mesh != NULL) {
                zd_mesh_abort(e->job->mesh, e->job->rank, "rank %u: its trainer disconnected",
                              e->job->rank);
                zd_engine_mesh_failed(e);
            }
            zd_engine_release_trainer(e);
            zs_warn_limited(&e->warn_rl, ZS_SUB_ENGINE,
                            "trainer of job '%s' disconnected at step %llu; partial micro-step "
                            "dropped; keeping the job %.0f s for a re-attach",
                            e->job->id, (unsigned long long)e->job->step,
                            (double)e->job_linger_ns * 1e-9);
        }
        return;
    }
    switch (fr->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_ATTACH:
        zd_engine_activity(e, "attach of job '%.128s' as rank %u of %u", fr->attach->job_id,
                           fr->attach->rank, fr->attach->world);
        zd_engine_attach(e, w->conn_id, fr->seq, fr->attach);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
        zd_engine_activity(e, "loading the initial parameters");
        zd_engine_params_ready(e, w->conn_id, fr->seq);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY:
        zd_engine_activity(e, "reduce-scatter of bucket %u", fr->bucket_ready->bucket);
        zd_engine_bucket_ready(e, w->conn_id, fr->seq, fr->bucket_ready);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
        zd_engine_activity(e, "step %llu",
                           e->job != NULL ? (unsigned long long)e->job->step + 1 : 0ull);
        zd_engine_step(e, w->conn_id, fr->seq, fr->step);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
        zd_engine_detach(e, w->conn_id, fr->seq, fr->detach);
        break;
    case ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO:
        zd_engine_shard_info(e, w->conn_id, fr->seq);
        break;
    default:
        /* the loop only submits the bodies above */
        zs_error(ZS_SUB_ENGINE, "unexpected request body %d", (int)fr->body_case);
        break;
    }
}

/* Fail a queued request that will not run. */
static void zd_engine_abort_work(zd_engine_t *e, zd_work_t *w)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ErrorReply er = ZEROD__IPC__V1__ERROR_REPLY__INIT;
    zd_result_t r;

    if (w->type != ZD_WORK_REQUEST) {
        return;
    }
    zd_result_set(&r, ZS_ERR_ABORTED, "daemon shutting down; request not run");
    er.result = &r.pb;
    f.seq = w->frame->seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ERROR;
    f.error = &er;
    zd_engine_push_reply(e, zd_reply_pack(w->conn_id, &f));
}

static void zd_work_free(zd_work_t *w)
{
    if (w->frame != NULL) {
        zerod__ipc__v1__frame__free_unpacked(w->frame, NULL);
    }
    free(w);
}

static void zd_engine_wake(zd_engine_t *e)
{
    uint64_t one = 1;
    ssize_t n = write(e->wake_fd, &one, sizeof(one));
    (void)n;
}

/* Idle: sleep until work arrives, the next heartbeat is due, a mesh event, or the linger
 * deadline of a job without trainer. */
static void zd_engine_idle(zd_engine_t *e)
{
    struct pollfd fds[2];
    nfds_t n = 1;
    uint64_t timeout_ns = UINT64_MAX;
    zd_job_t *job = e->job;
    uint64_t drain;

    fds[0].fd = e->wake_fd;
    fds[0].events = POLLIN;
    if (job != NULL && job->mesh != NULL) {
        int fd;
        timeout_ns = zd_mesh_tick(job->mesh);
        fd = zd_mesh_arm(job->mesh);
        if (fd == -2) {
            timeout_ns = 0;
        } else if (fd >= 0) {
            fds[1].fd = fd;
            fds[1].events = POLLIN;
            n = 2;
        }
    }
    if (job != NULL && job->attached_conn == 0) {
        uint64_t now = zs_time_now_ns();
        uint64_t left = job->linger_until_ns > now ? job->linger_until_ns - now : 0;
        timeout_ns = left < timeout_ns ? left : timeout_ns;
    }
    poll(fds, n, timeout_ns == UINT64_MAX ? -1 : (int)((timeout_ns + 999999) / 1000000));
    if (read(e->wake_fd, &drain, sizeof(drain)) < 0) {
        drain = 0;
    }
}

static void *zd_engine_main(void *arg)
{
    zd_engine_t *e = arg;

    for (;;) {
        zd_work_t *w;

        pthread_mutex_lock(&e->lock);
        if (e->shutdown) {
            pthread_mutex_unlock(&e->lock);
            break;
        }
        w = e->head;
        if (w != NULL) {
            e->head = w->next;
            if (e->head == NULL) {
                e->tail = NULL;
            }
        }
        pthread_mutex_unlock(&e->lock);
        if (w != NULL) {
            zd_engine_handle(e, w);
            zd_work_free(w);
            if (e->job != NULL && e->job->mesh != NULL && zd_mesh_aborted(e->job->mesh, NULL, 0)) {
                zd_engine_mesh_failed(e);
            }
            zd_engine_activity(e, NULL);
            continue;
        }
        zd_engine_idle(e);
        if (e->job != NULL && e->job->mesh != NULL) {
            zd_mesh_tick(e->job->mesh);
            if (zd_mesh_aborted(e->job->mesh, NULL, 0)) {
                zd_engine_mesh_failed(e);
            }
        }
        if (e->job != NULL && e->job->attached_conn == 0 &&
            zs_time_now_ns() >= e->job->linger_until_ns) {
            zd_engine_drop_job(e, "job_linger passed with no trainer");
        }
        zd_engine_publish(e);
    }
    /* shutdown: fail what is queued */
    pthread_mutex_lock(&e->lock);
    while (e->head != NULL) {
        zd_work_t *w = e->head;
        e->head = w->next;
        pthread_mutex_unlock(&e->lock);
        zd_engine_abort_work(e, w);
        zd_work_free(w);
        pthread_mutex_lock(&e->lock);
    }
    e->tail = NULL;
    e->stopped = true;
    pthread_mutex_unlock(&e->lock);
    e->notify(e->notify_arg);
    return NULL;
}

static void zd_engine_enqueue(zd_engine_t *e, zd_work_t *w)
{
    pthread_mutex_lock(&e->lock);
    if (e->shutdown) {
        pthread_mutex_unlock(&e->lock);
        zd_engine_abort_work(e, w);
        zd_work_free(w);
        return;
    }
    if (e->tail != NULL) {
        e->tail->next = w;
    } else {
        e->head = w;
    }
    e->tail = w;
    pthread_mutex_unlock(&e->lock);
    zd_engine_wake(e);
}

void zd_engine_submit(zd_engine_t *e, uint64_t conn_id, zd_frame_t *request)
{
    zd_work_t *w = calloc(1, sizeof(*w));

    if (w == NULL) {
        zs_error(ZS_SUB_ENGINE, "out of memory queueing a request");
        zerod__ipc__v1__frame__free_unpacked(request, NULL);
        return;
    }
    w->type = ZD_WORK_REQUEST;
    w->conn_id = conn_id;
    w->frame = request;
    zd_engine_enqueue(e, w);
}

void zd_engine_disconnect(zd_engine_t *e, uint64_t conn_id)
{
    zd_work_t *w = calloc(1, sizeof(*w));

    if (w == NULL) {
        zs_error(ZS_SUB_ENGINE, "out of memory queueing a disconnect");
        return;
    }
    w->type = ZD_WORK_DISCONNECT;
    w->conn_id = conn_id;
    zd_engine_enqueue(e, w);
}

void zd_engine_shutdown(zd_engine_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->shutdown = true;
    atomic_store(&e->cancel, true);
    pthread_mutex_unlock(&e->lock);
    zd_engine_wake(e);
}

bool zd_engine_stopped(zd_engine_t *e)
{
    bool stopped;

    pthread_mutex_lock(&e->lock);
    stopped = e->stopped;
    pthread_mutex_unlock(&e->lock);
    return stopped;
}

void zd_engine_set_limits(zd_engine_t *e, uint64_t max_shard_bytes, uint64_t job_linger_ns)
{
    pthread_mutex_lock(&e->lock);
    e->max_shard_bytes = max_shard_bytes;
    e->job_linger_ns = job_linger_ns;
    pthread_mutex_unlock(&e->lock);
    zd_engine_wake(e);
}

zs_status_t zd_engine_create(const zd_engine_params_t *p, zd_engine_t **engine_p)
{
    zd_engine_t *e;
    zs_status_t st;

    e = calloc(1, sizeof(*e));
    if (e == NULL) {
        st = ZS_ERR_NO_MEMORY;
        goto err;
    }
    pthread_mutex_init(&e->lock, NULL);
    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->wake_fd < 0) {
        zs_error(ZS_SUB_ENGINE, "eventfd: %m");
        pthread_mutex_destroy(&e->lock);
        free(e);
        st = ZS_ERR_IO;
        goto err;
    }
    e->bucket_slots = p->bucket_slots;
    e->max_shard_bytes = p->max_shard_bytes;
    e->job_linger_ns = p->job_linger_ns;
    snprintf(e->device, sizeof(e->device), "%s", p->device);
    snprintf(e->socket_path, sizeof(e->socket_path), "%s", p->socket_path);
    snprintf(e->token_file, sizeof(e->token_file), "%s", p->token_file ? p->token_file : "");
    e->mesh_timeout_ns = p->mesh_timeout_ns;
    e->collective_timeout_ns = p->collective_timeout_ns;
    e->heartbeat_interval_ns = p->heartbeat_interval_ns;
    e->heartbeat_timeout_ns = p->heartbeat_timeout_ns;
    e->direct_collectives = p->direct_collectives;
    e->notify = p->notify;
    e->notify_arg = p->notify_arg;
    e->start_ns = zs_time_now_ns();
    e->pub.start_ns = e->start_ns;
    e->warn_rl = (zs_ratelimit_t)ZS_RATELIMIT_INIT(10ull * ZS_NSEC_PER_SEC, 20);
    e->exec.variant = ZK_VARIANT_DEFAULT;
    if (p->threads > 1) {
        st = zk_pool_create(p->threads, &e->pool);
        if (st != ZS_OK) {
            zs_error(ZS_SUB_ENGINE, "cannot start %u kernel threads: %s", p->threads,
                     zk_last_error());
            goto err_free;
        }
        e->exec.pool = e->pool;
    }
    if (pthread_create(&e->thread, NULL, zd_engine_main, e) != 0) {
        zs_error(ZS_SUB_ENGINE, "cannot start the engine thread: %m");
        st = ZS_ERR_NO_MEMORY;
        goto err_pool;
    }
    e->thread_started = true;
    *engine_p = e;
    return ZS_OK;

err_pool:
    zk_pool_destroy(e->pool);
err_free:
    close(e->wake_fd);
    pthread_mutex_destroy(&e->lock);
    free(e);
err:
    return st;
}

void zd_engine_destroy(zd_engine_t *e)
{
    zd_reply_t *r;

    if (e == NULL) {
        return;
    }
    zd_engine_shutdown(e);
    if (e->thread_started) {
        pthread_join(e->thread, NULL);
    }
    zd_engine_drop_job(e, "daemon stopped");
    r = zd_engine_take_replies(e);
    while (r != NULL) {
        zd_reply_t *next = r->next;
        zd_reply_free(r);
        r = next;
    }
    zk_pool_destroy(e->pool);
    close(e->wake_fd);
    pthread_mutex_destroy(&e->lock);
    free(e);
}
