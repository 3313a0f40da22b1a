/*
 * The runner thread (runner/runner.h): takes requests in arrival order off one queue, runs each
 * against the daemon's job (job/job.h, job/job_ctl.h) and pushes exactly one result back for the
 * loop; between requests it sleeps in poll() on its eventfd and the mesh's worker fd, does the
 * job's idle work, and publishes the status and health that Status and the watchdog read.
 */
#define _GNU_SOURCE
#include "runner/runner.h"

#include "job/job.h"
#include "job/job_ctl.h"

#include "zk/kernels.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* The longest a checkpoint request reads (verify, load): the deadline every checkpoint call
 * has on the trainer's side too (docs/checkpoints.md). */
#define ZD_RUNNER_CKPT_DEADLINE_NS (3600ull * ZS_NSEC_PER_SEC)

struct zd_runner {
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t lock;
    int wake_fd; /* eventfd: work queued, shutdown, a lost peer */
    /* under lock */
    zd_req_t *head, *tail;
    zd_resp_t *rhead, *rtail;
    bool shutdown;
    bool stopped;
    uint64_t max_shard_bytes; /* reloadable */
    uint64_t job_linger_ns;   /* reloadable */
    zd_runner_status_t pub;   /* what Status reports */
    atomic_bool cancel;       /* shutdown, readable without the lock (mesh waits poll it) */
    /* the watchdog's view (zd_runner_health), written by the runner thread alone */
    _Atomic uint64_t beat_ns, phase_since_ns;
    atomic_int phase; /* ZD_RUNNER_PHASE_IDLE, _TEARDOWN, or the zd_req_kind_t in progress */
    uint64_t beat_interval_ns;
    void (*notify)(void *arg);
    void *notify_arg;
    zd_metrics_t *metrics; /* the published job goes there too (its own lock, taken inside ours) */
    zd_trace_t *trace;     /* the step trace: written by the runner thread, read by TraceRequest */
    /* runner thread */
    zd_job_env_t env;
    char token_file[512];
    char ckpt_dir[4096];
    zs_ratelimit_t warn_rl; /* warnings trainers can cause at will (refused attaches, ...) */
    zd_job_t *job;
    zd_job_ended_t ended; /* the trainer of the job an operator ended last (job/job_ctl.c) */
    zk_pool_t *pool;
    zk_exec_t exec;
};

/* ---- requests and results ---------------------------------------------------------------- */

void zd_req_free(zd_req_t *req)
{
    if (req == NULL) {
        return;
    }
    if (req->release != NULL) {
        req->release(req->mem);
    }
    if (req->fd >= 0) {
        close(req->fd);
    }
    free(req);
}

void zd_resp_free(zd_resp_t *resp)
{
    if (resp == NULL) {
        return;
    }
    if (resp->kind == ZD_REQ_ATTACH) {
        for (int i = 0; i < resp->u.attach.n_fds; i++) {
            if (resp->u.attach.fds[i] >= 0) {
                close(resp->u.attach.fds[i]);
            }
        }
    } else if (resp->kind == ZD_REQ_SHARD_INFO) {
        zd_shard_out_free(&resp->u.shard);
    }
    free(resp);
}

static void zd_runner_push(zd_runner_t *e, zd_resp_t *resp)
{
    pthread_mutex_lock(&e->lock);
    if (e->rtail != NULL) {
        e->rtail->next = resp;
    } else {
        e->rhead = resp;
    }
    e->rtail = resp;
    pthread_mutex_unlock(&e->lock);
    e->notify(e->notify_arg);
}

zd_resp_t *zd_runner_take_results(zd_runner_t *e)
{
    zd_resp_t *list;

    pthread_mutex_lock(&e->lock);
    list = e->rhead;
    e->rhead = e->rtail = NULL;
    pthread_mutex_unlock(&e->lock);
    return list;
}

/* ---- the published status ------------------------------------------------------------------ */

static void zd_runner_publish_locked(zd_runner_t *e)
{
    e->pub.has_job = e->job != NULL;
    if (e->job != NULL) {
        zd_job_status(e->job, &e->pub.job);
    }
    zd_metrics_publish_job(e->metrics, e->pub.has_job ? &e->pub.job : NULL);
}

static void zd_runner_publish(zd_runner_t *e)
{
    pthread_mutex_lock(&e->lock);
    zd_runner_publish_locked(e);
    pthread_mutex_unlock(&e->lock);
}

/* Say what the runner is about to be busy with (NULL: nothing), publishing the job too. */
static void zd_runner_busy(void *arg, const char *what)
{
    zd_runner_t *e = arg;

    pthread_mutex_lock(&e->lock);
    snprintf(e->pub.activity, sizeof(e->pub.activity), "%s", what != NULL ? what : "");
    e->pub.activity_since_ns = zs_time_now_ns();
    atomic_store(&e->beat_ns, e->pub.activity_since_ns);
    zd_runner_publish_locked(e);
    pthread_mutex_unlock(&e->lock);
}

void zd_runner_status_get(zd_runner_t *e, zd_runner_status_t *status_p)
{
    pthread_mutex_lock(&e->lock);
    *status_p = e->pub;
    pthread_mutex_unlock(&e->lock);
}

/* Enter a phase (idle, a request of some kind, the stop's teardown): a sign of life too. */
static void zd_runner_phase(zd_runner_t *e, int phase)
{
    uint64_t now = zs_time_now_ns();

    atomic_store(&e->phase_since_ns, now);
    atomic_store(&e->beat_ns, now);
    atomic_store(&e->phase, phase);
}

void zd_runner_health(zd_runner_t *e, zd_runner_health_t *health_p)
{
    health_p->phase = atomic_load(&e->phase);
    health_p->since_ns = atomic_load(&e->phase_since_ns);
    health_p->beat_ns = atomic_load(&e->beat_ns);
}

/* ---- running a request ------------------------------------------------------------------- */

/* The settings a SIGHUP may have changed, into the job's environment. */
static void zd_runner_env_refresh(zd_runner_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->env.max_shard_bytes = e->max_shard_bytes;
    e->env.job_linger_ns = e->job_linger_ns;
    pthread_mutex_unlock(&e->lock);
}

static void zd_runner_describe(const zd_req_t *req, char *buf, size_t len)
{
    switch (req->kind) {
    case ZD_REQ_ATTACH:
        snprintf(buf, len, "attach of job '%.128s' as rank %u of %u", req->u.attach.job_id,
                 req->u.attach.rank, req->u.attach.world);
        break;
    case ZD_REQ_PARAMS_READY:
        snprintf(buf, len, "loading the initial parameters");
        break;
    case ZD_REQ_BUCKET_READY:
        snprintf(buf, len, "reduce-scatter of bucket %u", req->u.bucket_ready.bucket);
        break;
    case ZD_REQ_STEP:
        snprintf(buf, len, "a step");
        break;
    case ZD_REQ_CKPT_SAVE:
        snprintf(buf, len, "saving checkpoint '%.128s' in %.1024s",
                 req->u.ckpt.tag != NULL && req->u.ckpt.tag[0] ? req->u.ckpt.tag : "global_step*",
                 req->u.ckpt.dir != NULL ? req->u.ckpt.dir : "");
        break;
    case ZD_REQ_CKPT_WAIT:
        snprintf(buf, len, "waiting for a checkpoint's write");
        break;
    case ZD_REQ_EXPORT:
        snprintf(buf, len, "exporting the parameters to %.1024s",
                 req->u.export_.path != NULL ? req->u.export_.path : "");
        break;
    case ZD_REQ_CKPT_LOAD:
        snprintf(buf, len, "loading checkpoint '%.128s' from %.1024s",
                 req->u.ckpt.tag != NULL && req->u.ckpt.tag[0] ? req->u.ckpt.tag : "latest",
                 req->u.ckpt.dir != NULL ? req->u.ckpt.dir : "");
        break;
    case ZD_REQ_JOB_END:
        snprintf(buf, len, "ending job '%.128s' (zeroctl job end)",
                 req->u.job_end.all ? "*" : req->u.job_end.job_id);
        break;
    default:
        snprintf(buf, len, "%s", "");
        break;
    }
}

/* An operator's JobEnd; and the trainer of a job an operator ended, told so at its next call (a
 * detach is fine: nothing is left to detach). True when r holds the result. */
static bool zd_runner_run_ctl(zd_runner_t *e, zd_req_t *req, zd_resp_t *r)
{
    if (req->kind == ZD_REQ_JOB_END) {
        r->status =
            zd_job_end(&e->job, &e->env, &req->u.job_end, &r->u.job_end, r->msg, sizeof(r->msg));
        return true;
    }
    if (e->ended.conn == 0 || req->conn_id != e->ended.conn || req->kind == ZD_REQ_ATTACH) {
        return false;
    }
    if (req->kind == ZD_REQ_DETACH) {
        e->ended.conn = 0;
        r->status = ZS_OK;
        return true;
    }
    r->status = zs_errf(r->msg, sizeof(r->msg), ZS_ERR_JOB_ENDED, "%s", e->ended.msg);
    return true;
}

/* What stops a checkpoint's reads: the daemon stopping, and the hour every checkpoint call
 * has (docs/checkpoints.md). */
static zs_cancel_t zd_runner_ckpt_cancel(const zd_runner_t *e)
{
    return (zs_cancel_t){e->env.cancel, zs_time_now_ns() + ZD_RUNNER_CKPT_DEADLINE_NS};
}

/* A request's checkpoint calls: the runner's settings go with them. */
static void zd_runner_run_ckpt(zd_runner_t *e, zd_req_t *req, zd_resp_t *r)
{
    zd_job_env_t *env = &e->env;

    switch (req->kind) {
    case ZD_REQ_CKPT_SAVE:
        req->u.ckpt.cancel = zd_runner_ckpt_cancel(e);
        req->u.ckpt.keep_last = env->ckpt_keep_last;
        req->u.ckpt.async = env->ckpt_async;
        req->u.ckpt.keep_staging = env->ckpt_staging_keep;
        r->status = zd_job_ckpt_save(e->job, env, req->conn_id, &req->u.ckpt, &r->u.ckpt, r->msg,
                                     sizeof(r->msg));
        break;
    case ZD_REQ_EXPORT:
        r->status = zd_job_export(e->job, env, &req->u.export_, &r->u.ckpt, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_CKPT_WAIT:
        r->status = zd_job_ckpt_wait(e->job, env, req->conn_id, &r->u.ckpt, r->msg, sizeof(r->msg));
        break;
    default: /* ZD_REQ_CKPT_LOAD */
        req->u.ckpt.cancel = zd_runner_ckpt_cancel(e);
        r->status = zd_job_ckpt_load(e->job, env, req->conn_id, &req->u.ckpt, &r->u.ckpt, r->msg,
                                     sizeof(r->msg));
        break;
    }
}

/* The job's calls. */
static void zd_runner_run_job(zd_runner_t *e, zd_req_t *req, zd_resp_t *r)
{
    zd_job_env_t *env = &e->env;
    const uint64_t conn = req->conn_id;

    switch (req->kind) {
    case ZD_REQ_ATTACH:
        r->status =
            zd_job_attach(&e->job, env, conn, &req->u.attach, &r->u.attach, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_PARAMS_READY:
        r->status = zd_job_params_ready(e->job, env, conn, req->u.params_ready.reload, &r->u.ckpt,
                                        r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_BUCKET_READY:
        r->status = zd_job_bucket_ready_event(
            e->job, env, conn, req->u.bucket_ready.slot, req->u.bucket_ready.bucket,
            req->u.bucket_ready.micro_step, req->u.bucket_ready.event,
            req->u.bucket_ready.event_len, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_STEP:
        r->status = zd_job_step(e->job, env, conn, req->u.step.group_lr, req->u.step.n_group_lr,
                                &r->u.step, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_DETACH:
        r->status =
            zd_job_detach(&e->job, env, conn, req->u.detach.end_job, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_SHARD_INFO:
        r->status = zd_job_shard_info(e->job, &r->u.shard, r->msg, sizeof(r->msg));
        break;
    case ZD_REQ_CKPT_SAVE:
    case ZD_REQ_EXPORT:
    case ZD_REQ_CKPT_WAIT:
    case ZD_REQ_CKPT_LOAD:
        zd_runner_run_ckpt(e, req, r);
        break;
    case ZD_REQ_DISCONNECT:
    case ZD_REQ_JOB_END: /* zd_runner_run_ctl's */
        break;
    }
}

/* A new result for req (NULL: out of memory, logged); a BucketReady's names its slot, which is
 * free again whatever the outcome. */
static zd_resp_t *zd_runner_result_new(const zd_req_t *req)
{
    zd_resp_t *r = calloc(1, sizeof(*r));

    if (r == NULL) {
        zs_error(ZS_SUB_ENGINE, "out of memory for a result; the client's call will time out");
        return NULL;
    }
    r->kind = req->kind;
    r->conn_id = req->conn_id;
    r->seq = req->seq;
    if (req->kind == ZD_REQ_BUCKET_READY) {
        r->u.slot_free.slot = req->u.bucket_ready.slot;
        r->u.slot_free.bucket = req->u.bucket_ready.bucket;
    }
    return r;
}

/* Run one request against the job; its result (if it has one) goes out. */
static void zd_runner_run(zd_runner_t *e, zd_req_t *req)
{
    zd_resp_t *r;
    char what[256];

    if (req->kind == ZD_REQ_DISCONNECT) {
        zd_job_disconnect(e->job, &e->env, req->conn_id);
        return;
    }
    r = zd_runner_result_new(req);
    if (r == NULL) {
        return;
    }
    zd_runner_describe(req, what, sizeof(what));
    e->env.req_arrived_ns = req->arrived_ns;
    zd_runner_phase(e, (int)req->kind);
    zd_runner_busy(e, what);
    if (!zd_runner_run_ctl(e, req, r)) {
        zd_runner_run_job(e, req, r);
    }
    zd_runner_push(e, r);
}

/* Fail a queued request that will not run (the daemon stops). */
static void zd_runner_abort(zd_runner_t *e, const zd_req_t *req)
{
    zd_resp_t *r;

    if (req->kind == ZD_REQ_DISCONNECT || (r = zd_runner_result_new(req)) == NULL) {
        return;
    }
    r->status =
        zs_errf(r->msg, sizeof(r->msg), ZS_ERR_ABORTED, "daemon shutting down; request not run");
    zd_runner_push(e, r);
}

/* ---- the thread ------------------------------------------------------------------------------ */

static void zd_runner_wake(void *arg)
{
    zd_runner_t *e = arg;
    uint64_t one = 1;

    if (write(e->wake_fd, &one, sizeof(one)) < 0) {
        /* the counter is saturated: the runner is awake anyway */
    }
}

/* Idle: sleep until work arrives, a mesh event, a lost peer, or the job's linger deadline. */
static void zd_runner_idle(zd_runner_t *e)
{
    struct pollfd fds[2] = {{.fd = e->wake_fd, .events = POLLIN}};
    nfds_t n = 1;
    uint64_t timeout_ns = zd_job_tick(&e->job, &e->env);
    int fd = zd_job_poll_fd(e->job);
    uint64_t drain;

    zd_runner_publish(e);
    if (fd == -2) {
        timeout_ns = 0;
    } else if (fd >= 0) {
        fds[1] = (struct pollfd){.fd = fd, .events = POLLIN};
        n = 2;
    }
    if (e->beat_interval_ns != 0 && timeout_ns > e->beat_interval_ns) {
        timeout_ns = e->beat_interval_ns; /* wake to beat: the watchdog sees an idle runner live */
    }
    atomic_store(&e->beat_ns, zs_time_now_ns());
    poll(fds, n, timeout_ns == UINT64_MAX ? -1 : (int)((timeout_ns + 999999) / 1000000));
    atomic_store(&e->beat_ns, zs_time_now_ns());
    if (read(e->wake_fd, &drain, sizeof(drain)) < 0) {
        drain = 0;
    }
}

static zd_req_t *zd_runner_next(zd_runner_t *e, bool *shutdown_p)
{
    zd_req_t *req;

    pthread_mutex_lock(&e->lock);
    *shutdown_p = e->shutdown;
    req = e->shutdown ? NULL : e->head;
    if (req != NULL) {
        e->head = req->next;
        e->tail = e->head == NULL ? NULL : e->tail;
    }
    pthread_mutex_unlock(&e->lock);
    return req;
}

/* The stop: the job ends here, on the runner thread that owns it, while the loop still runs and
 * tells systemd (EXTEND_TIMEOUT_USEC) that a large job's teardown -- an async checkpoint's
 * write to finish, its memory to free -- is under way. */
static void zd_runner_teardown(zd_runner_t *e)
{
    char what[256];

    if (e->job == NULL) {
        return;
    }
    zd_runner_phase(e, ZD_RUNNER_PHASE_TEARDOWN);
    pthread_mutex_lock(&e->lock);
    snprintf(what, sizeof(what), "stopping: ending job '%.128s'", e->pub.job.job_id);
    pthread_mutex_unlock(&e->lock);
    zd_runner_busy(e, what);
    zd_job_drop(&e->job, "daemon stopped");
    zd_runner_busy(e, NULL);
    zd_runner_phase(e, ZD_RUNNER_PHASE_IDLE);
}

/* No request waits, nor a stop. */
static bool zd_runner_queue_empty(zd_runner_t *e)
{
    bool empty;

    pthread_mutex_lock(&e->lock);
    empty = e->head == NULL && !e->shutdown;
    pthread_mutex_unlock(&e->lock);
    return empty;
}

static void *zd_runner_main(void *arg)
{
    zd_runner_t *e = arg;
    bool shutdown = false;

    while (!shutdown) {
        zd_req_t *req = zd_runner_next(e, &shutdown);

        if (req != NULL) {
            zd_runner_env_refresh(e);
            zd_runner_run(e, req);
            zd_req_free(req);
            zd_job_tick(&e->job, &e->env); /* a mesh lost during the request */
            zd_runner_phase(e, ZD_RUNNER_PHASE_IDLE);
            zd_runner_busy(e, NULL);
            /* after the reply (a SlotFree is on its way): what the next step will need */
            while (zd_runner_queue_empty(e) && zd_job_idle_work(e->job)) {
            }
        } else if (!shutdown) {
            zd_runner_idle(e);
        }
    }
    pthread_mutex_lock(&e->lock);
    while (e->head != NULL) { /* fail what is queued */
        zd_req_t *req = e->head;
        e->head = req->next;
        pthread_mutex_unlock(&e->lock);
        zd_runner_abort(e, req);
        zd_req_free(req);
        pthread_mutex_lock(&e->lock);
    }
    e->tail = NULL;
    pthread_mutex_unlock(&e->lock);
    zd_runner_teardown(e);
    pthread_mutex_lock(&e->lock);
    e->stopped = true;
    pthread_mutex_unlock(&e->lock);
    e->notify(e->notify_arg);
    return NULL;
}

/* ---- the loop's side ------------------------------------------------------------------------- */

void zd_runner_submit(zd_runner_t *e, zd_req_t *req)
{
    req->next = NULL;
    req->arrived_ns = zs_time_now_ns();
    pthread_mutex_lock(&e->lock);
    if (e->shutdown) {
        pthread_mutex_unlock(&e->lock);
        zd_runner_abort(e, req);
        zd_req_free(req);
        return;
    }
    if (e->tail != NULL) {
        e->tail->next = req;
    } else {
        e->head = req;
    }
    e->tail = req;
    pthread_mutex_unlock(&e->lock);
    zd_runner_wake(e);
}

void zd_runner_shutdown(zd_runner_t *e)
{
    pthread_mutex_lock(&e->lock);
    e->shutdown = true;
    atomic_store(&e->cancel, true);
    pthread_mutex_unlock(&e->lock);
    zd_runner_wake(e);
}

zd_trace_t *zd_runner_trace(zd_runner_t *e)
{
    return e->trace;
}

bool zd_runner_stopped(zd_runner_t *e)
{
    bool stopped;

    pthread_mutex_lock(&e->lock);
    stopped = e->stopped;
    pthread_mutex_unlock(&e->lock);
    return stopped;
}

void zd_runner_set_limits(zd_runner_t *e, uint64_t max_shard_bytes, uint64_t job_linger_ns)
{
    pthread_mutex_lock(&e->lock);
    e->max_shard_bytes = max_shard_bytes;
    e->job_linger_ns = job_linger_ns;
    pthread_mutex_unlock(&e->lock);
    zd_runner_wake(e);
}

static void zd_runner_env_init(zd_runner_t *e, const zd_runner_params_t *p)
{
    zd_job_env_t *env = &e->env;

    snprintf(e->token_file, sizeof(e->token_file), "%s", p->token_file ? p->token_file : "");
    e->warn_rl = (zs_ratelimit_t)ZS_RATELIMIT_INIT(10ull * ZS_NSEC_PER_SEC, 20);
    e->exec.variant = ZK_VARIANT_DEFAULT;
    env->exec = &e->exec;
    env->cuda = p->cuda;
    env->cuda_device = p->cuda_device;
    env->token_file = e->token_file;
    env->mesh_timeout_ns = p->mesh_timeout_ns;
    env->collective_timeout_ns = p->collective_timeout_ns;
    env->heartbeat_interval_ns = p->heartbeat_interval_ns;
    env->heartbeat_timeout_ns = p->heartbeat_timeout_ns;
    env->direct_collectives = p->direct_collectives;
    env->replication = p->replication;
    env->stores_file = p->stores_file; /* main's, alive while the runner is (jobs copy it) */
    env->cancel = &e->cancel;
    env->wake = zd_runner_wake;
    env->busy = zd_runner_busy;
    env->arg = e;
    env->warn_rl = &e->warn_rl;
    env->ended = &e->ended;
    env->n_slots = p->bucket_slots;
    env->job_linger_ns = e->job_linger_ns = p->job_linger_ns;
    env->max_shard_bytes = e->max_shard_bytes = p->max_shard_bytes;
    snprintf(e->ckpt_dir, sizeof(e->ckpt_dir), "%s", p->ckpt_dir ? p->ckpt_dir : "");
    env->ckpt_dir = e->ckpt_dir[0] != '\0' ? e->ckpt_dir : NULL;
    env->ckpt_every_steps = p->ckpt_every_steps;
    env->ckpt_every_ns = p->ckpt_every_seconds * 1000000000ull;
    env->ckpt_keep_last = p->ckpt_keep_last;
    env->ckpt_async = p->ckpt_async;
    env->ckpt_staging_keep = p->ckpt_staging_keep;
}

/* The runner's wake eventfd, its kernel threads and its own thread; on failure nothing of them
 * is left. */
static zs_status_t zd_runner_start(zd_runner_t *e, const zd_runner_params_t *p)
{
    zs_status_t st;

    e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->wake_fd < 0) {
        zs_error(ZS_SUB_ENGINE, "eventfd: %m");
        return ZS_ERR_IO;
    }
    if (p->threads > 1) {
        st = zk_pool_create(p->threads, &e->pool);
        if (st != ZS_OK) {
            zs_error(ZS_SUB_ENGINE, "cannot start %u kernel threads: %s", p->threads,
                     zk_last_error());
            close(e->wake_fd);
            return st;
        }
        e->exec.pool = e->pool;
    }
    if (zs_thread_start(&e->thread, false, zd_runner_main, e) != 0) {
        zs_error(ZS_SUB_ENGINE, "cannot start the engine thread: %m");
        zk_pool_destroy(e->pool);
        close(e->wake_fd);
        return ZS_ERR_NO_MEMORY;
    }
    e->thread_started = true;
    return ZS_OK;
}

zs_status_t zd_runner_create(const zd_runner_params_t *p, zd_runner_t **runner_p)
{
    zd_runner_t *e = calloc(1, sizeof(*e));
    zs_status_t st;

    if (e == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&e->lock, NULL);
    e->notify = p->notify;
    e->notify_arg = p->notify_arg;
    e->metrics = p->metrics;
    e->pub.start_ns = zs_time_now_ns();
    e->beat_interval_ns = p->beat_interval_ns;
    atomic_init(&e->beat_ns, e->pub.start_ns);
    atomic_init(&e->phase_since_ns, e->pub.start_ns);
    atomic_init(&e->phase, ZD_RUNNER_PHASE_IDLE);
    zd_runner_env_init(e, p);
    st = zd_trace_create(p->trace_spans, &e->trace);
    if (st == ZS_ERR_INVALID) {
        zs_error(ZS_SUB_ENGINE, "a step trace of %u spans is above the %u allowed", p->trace_spans,
                 ZD_TRACE_MAX_SPANS);
    }
    if (st == ZS_OK) { /* else ZS_ERR_NO_MEMORY: obs/trace.c said why */
        e->env.trace = e->trace;
        st = zd_runner_start(e, p);
        if (st != ZS_OK) {
            zd_trace_destroy(e->trace);
        }
    }
    if (st != ZS_OK) {
        pthread_mutex_destroy(&e->lock);
        free(e);
        return st;
    }
    *runner_p = e;
    return ZS_OK;
}

void zd_runner_destroy(zd_runner_t *e)
{
    zd_resp_t *r;

    if (e == NULL) {
        return;
    }
    zd_runner_shutdown(e);
    if (e->thread_started) {
        pthread_join(e->thread, NULL);
    }
    zd_job_drop(&e->job, "daemon stopped");
    r = zd_runner_take_results(e);
    while (r != NULL) {
        zd_resp_t *next = r->next;
        zd_resp_free(r);
        r = next;
    }
    zk_pool_destroy(e->pool);
    close(e->wake_fd);
    zd_trace_destroy(e->trace);
    pthread_mutex_destroy(&e->lock);
    free(e);
}
