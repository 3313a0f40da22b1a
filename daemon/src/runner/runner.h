/*
 * The runner: the scheduler of the daemon's work (docs/request-flow.md). One thread, the runner
 * thread, runs every request in arrival order against the daemon's job (job/), and between
 * requests keeps the job's mesh alive and its linger counted. Requests and results are plain C
 * (rpc/ converts ipc.proto): this header holds no protobuf and no job internals. The libuv loop
 * submits requests and takes results, and never waits on the runner. Operators know it by its
 * log subsystem, `engine` (ZEROD_LOG_SUBSYS), which its log and watchdog lines keep.
 */
#ifndef ZD_RUNNER_H
#define ZD_RUNNER_H

#include "job/job_types.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zd_runner zd_runner_t;

typedef enum zd_req_kind {
    ZD_REQ_ATTACH,
    ZD_REQ_PARAMS_READY,
    ZD_REQ_BUCKET_READY,
    ZD_REQ_STEP,
    ZD_REQ_DETACH,
    ZD_REQ_SHARD_INFO,
    ZD_REQ_CKPT_SAVE,
    ZD_REQ_CKPT_LOAD,
    ZD_REQ_CKPT_WAIT,
    ZD_REQ_EXPORT,
    ZD_REQ_DISCONNECT, /* the connection closed: no result */
    ZD_REQ_JOB_END,    /* control: zeroctl job end */
} zd_req_kind_t;

/* One request of a connection. */
typedef struct zd_req {
    struct zd_req *next;
    zd_req_kind_t kind;
    uint64_t conn_id;
    uint64_t seq;        /* echoed in the result */
    uint64_t arrived_ns; /* when zd_runner_submit took it (monotonic): the step trace's */
    union {
        zd_job_spec_t attach;
        struct {
            uint32_t slot, bucket, micro_step;
            uint32_t event_len; /* BucketReady.event's length (0: none) */
            uint8_t event[64];  /* its bytes when event_len is 64 */
        } bucket_ready;
        struct {
            bool reload; /* ParamsReady.reload: the master from the params region again */
        } params_ready;
        struct {
            const double *group_lr;
            size_t n_group_lr;
        } step;
        struct {
            bool end_job;
        } detach;
        zd_ckpt_req_t ckpt;
        zd_export_req_t export_;
        zd_job_end_req_t job_end;
    } u;
    zs_cred_t cred; /* the requester's (SO_PEERCRED, SO_PEERGROUPS): u's cred points here */
    int fd;         /* a directory that came with the request (SCM_RIGHTS); -1: none */
    void (*release)(void *mem); /* frees what u points into (the decoded frame); may be NULL */
    void *mem;
} zd_req_t;

/* The result of one request, for the connection that sent it. */
typedef struct zd_resp {
    struct zd_resp *next;
    zd_req_kind_t kind;
    uint64_t conn_id;
    uint64_t seq;
    zs_status_t status;
    char msg[ZS_MSG_MAX]; /* why, when status is not ZS_OK */
    union {
        zd_attach_out_t attach; /* its fds are owned by the result */
        struct {
            uint32_t slot, bucket;
        } slot_free;
        zd_step_out_t step;
        zd_shard_out_t shard; /* its groups are owned by the result */
        zd_ckpt_out_t ckpt;
        zd_job_end_out_t job_end;
    } u;
} zd_resp_t;

/* Free a request (what it points into, and its fd). NULL is a no-op. */
void zd_req_free(zd_req_t *req);
/* Free a result, closing the fds and freeing the arrays it still owns. NULL is a no-op. */
void zd_resp_free(zd_resp_t *resp);

typedef struct zd_runner_params {
    bool cuda; /* jobs on the CUDA backend, on GPU cuda_device; false: the CPU backend */
    int cuda_device;
    uint32_t bucket_slots;
    uint64_t max_shard_bytes;
    uint64_t job_linger_ns;
    unsigned threads;
    const char *token_file; /* mesh authentication (world > 1) */
    uint64_t mesh_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns;
    bool direct_collectives;
    const char *stores_file; /* where the kernels' store plan is kept for a restart; NULL: none */
    uint32_t replication;    /* zd_replication_t (config/daemon_config.h) */
    const char *ckpt_dir;    /* checkpoint_* of the daemon config */
    uint64_t ckpt_every_steps, ckpt_every_seconds;
    uint32_t ckpt_keep_last;
    bool ckpt_async, ckpt_staging_keep;
    void (*notify)(void *arg); /* results are ready (called from the runner thread) */
    void *notify_arg;
    uint64_t beat_interval_ns; /* 0, or the longest the idle runner sleeps without a beat */
    zd_metrics_t *metrics;     /* NULL, or where the published status goes too (obs/metrics.h) */
    uint32_t trace_spans;      /* the step trace's ring (obs/trace.h, trace_buffer); 0: off */
} zd_runner_params_t;

zs_status_t zd_runner_create(const zd_runner_params_t *params, zd_runner_t **runner_p);
/* Joins the thread (after zd_runner_shutdown), drops the job. NULL is a no-op. */
void zd_runner_destroy(zd_runner_t *runner);

/* Hand a request over (the runner frees it). */
void zd_runner_submit(zd_runner_t *runner, zd_req_t *req);
/* The step trace the runner records (NULL: off); TraceRequest reads it on any thread. */
zd_trace_t *zd_runner_trace(zd_runner_t *runner);
/* Results ready to send, oldest first; the caller frees each with zd_resp_free. */
zd_resp_t *zd_runner_take_results(zd_runner_t *runner);
/* Finish the request in progress, fail the queued ones with ERR_ABORTED, stop the thread. */
void zd_runner_shutdown(zd_runner_t *runner);
/* True once the thread has stopped and every result was queued. */
bool zd_runner_stopped(zd_runner_t *runner);

/* Reloadable settings (SIGHUP). */
void zd_runner_set_limits(zd_runner_t *runner, uint64_t max_shard_bytes, uint64_t job_linger_ns);

/* What Status reports. The runner thread publishes it whenever it changes, and says what it is
 * busy with, so that the loop answers Status at once even while the runner is occupied for long
 * (forming a mesh, waiting for a peer, a step on a big shard). */
typedef struct zd_runner_status {
    uint64_t start_ns;
    bool has_job;
    zd_job_status_t job;
    char activity[256]; /* what the runner is doing; "" when it waits for work */
    uint64_t activity_since_ns;
} zd_runner_status_t;

/* A copy of the last published status (any thread). */
void zd_runner_status_get(zd_runner_t *runner, zd_runner_status_t *status_p);

/* What the watchdog (server/sdnotify.c) asks, lock-free from any thread: the runner's phase and its
 * last sign of life. It beats when it enters a phase, when it publishes an activity (a request's
 * begin and end, "forming the mesh", ...), and on every idle wake -- at least every
 * beat_interval_ns when that is set. */
#define ZD_RUNNER_PHASE_IDLE     (-1)
#define ZD_RUNNER_PHASE_TEARDOWN (-2) /* the stop: the job is being ended */
typedef struct zd_runner_health {
    int phase;         /* one of the above, or the zd_req_kind_t of the request in progress */
    uint64_t since_ns; /* when the phase began (zs_time_now_ns) */
    uint64_t beat_ns;  /* the last sign of life */
} zd_runner_health_t;

void zd_runner_health(zd_runner_t *runner, zd_runner_health_t *health_p);

#endif
