/*
 * What a daemon tells Prometheus and its health checks (docs/metrics.md). The loop and runner
 * threads publish into one snapshot under one mutex, at cheap points: the runner whenever it
 * publishes its status (zd_runner_status_t: the job, with its step statistics), the loop on its
 * heartbeat timer and when it refuses a connection or drops a bad client. The HTTP endpoint
 * (server/metrics_http.c) formats from a copy of that snapshot only, so a scrape never waits on the
 * loop or the runner, and they never wait on a scrape beyond one memcpy.
 *
 * The step statistics (zd_step_stats_t) belong to the job: job/step.c measures them on the runner
 * thread (CLOCK_MONOTONIC), and they travel with the job's status, so a new job starts from
 * zero and a scrape sees one consistent step.
 */
#ifndef ZD_METRICS_H
#define ZD_METRICS_H

#include "zs/dtype.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The phases of a step, one histogram series each (docs/metrics.md "Step phases"). */
typedef enum zd_phase {
    ZD_PHASE_BUCKET_WAIT = 0, /* the daemon waited for the trainer's gradients */
    ZD_PHASE_REDUCE_SCATTER,  /* the step's buckets reduce-scattered into the accumulator */
    ZD_PHASE_NORM,            /* overflow check, global norm (all-reduce), loss scaler */
    ZD_PHASE_ADAM,            /* Adam on the shard and the cast into the params region */
    ZD_PHASE_ALL_GATHER,      /* every rank's new slices into every params region */
    ZD_PHASE_COUNT
} zd_phase_t;

/* The collectives whose bytes are counted. */
typedef enum zd_xfer { ZD_XFER_REDUCE_SCATTER = 0, ZD_XFER_ALL_GATHER, ZD_XFER_COUNT } zd_xfer_t;

/* Upper bounds of the duration histogram's buckets, in seconds (fixed; docs/metrics.md). */
#define ZD_HIST_BOUNDS 18
extern const double zd_hist_bounds[ZD_HIST_BOUNDS];
extern const char *const zd_phase_names[ZD_PHASE_COUNT];
extern const char *const zd_xfer_names[ZD_XFER_COUNT];

typedef struct zd_hist {
    uint64_t count;
    double sum;                  /* seconds */
    uint64_t in[ZD_HIST_BOUNDS]; /* observations in (bound[i-1], bound[i]]: not cumulative */
} zd_hist_t;

void zd_hist_observe(zd_hist_t *h, double seconds);

/* The step rate of Status: a ring of the last step ends, looked at over a window. */
#define ZD_RATE_STEPS     64
#define ZD_RATE_WINDOW_NS (10ull * 1000000000ull)

/* A job's step statistics (runner thread; copied out with the job's status). */
typedef struct zd_step_stats {
    zd_hist_t phase[ZD_PHASE_COUNT];
    /* every call since the job began: bytes, and its time split into the wait for the peers to
     * enter it (zd_coll_t wait_ns; all of a shared params region's barrier) and the transfer */
    uint64_t xfer_bytes[ZD_XFER_COUNT];
    uint64_t xfer_wait_ns[ZD_XFER_COUNT], xfer_busy_ns[ZD_XFER_COUNT];
    /* the last step: bytes/s over its transfer time only (0 when it did not run, at world 1, and
     * for a barrier), and its wait in seconds */
    double busbw[ZD_XFER_COUNT];
    double last_wait_s[ZD_XFER_COUNT];
    uint64_t reattaches;
    /* replication = buddy (job/replica.h) */
    uint64_t replica_bytes[2];   /* sent to the buddy, received from the owner (and recoveries) */
    uint64_t recoveries;         /* fresh ranks given their shard by their buddies, per formation */
    uint64_t recovery_fallbacks; /* a shard and its buddy both lost: back to the checkpoint */
    /* the step window in progress (job/step.c): from the last step's end, or from its first
     * bucket when there is none, to the end of the next step */
    uint64_t window_ns; /* monotonic; 0: no window open */
    uint64_t win_rs_ns, win_rs_wait_ns, win_rs_bytes;
    uint64_t win_ag_ns, win_ag_wait_ns, win_ag_bytes; /* the step's all-gather */
    /* when the last steps that ran ended (monotonic), for the step rate (zd_step_rate) */
    uint64_t step_end_ns[ZD_RATE_STEPS]; /* a ring: step k at [k % ZD_RATE_STEPS] */
    uint64_t n_step_ends;                /* steps that ran, committed or skipped */
} zd_step_stats_t;

/* A step ran and ended at now_ns (runner thread). */
void zd_step_rate_note(zd_step_stats_t *s, uint64_t now_ns);
/* Steps per second (docs/metrics.md "Step rate"): those that ended in the last
 * ZD_RATE_WINDOW_NS, or since since_ns (the job's creation) when that is later, over that
 * time; with more of them than the ring holds, the last ZD_RATE_STEPS - 1 over the time since
 * the oldest. 0 when none ended in it. */
double zd_step_rate(const zd_step_stats_t *s, uint64_t since_ns, uint64_t now_ns);

/* ---- what a daemon says about its job (Status, /metrics) ---------------------------------- */

#define ZD_JOB_ID_MAX 128

/* Bytes of each term of docs/semantics.md §1, measured and by formula. */
typedef enum zd_mem_term {
    ZD_MEM_PARAMS = 0,
    ZD_MEM_SLOTS,
    ZD_MEM_GRADS,
    ZD_MEM_MASTER,
    ZD_MEM_M,
    ZD_MEM_V,
    ZD_MEM_ACC,
    ZD_MEM_COUNT
} zd_mem_term_t;

extern const char *const zd_mem_term_names[ZD_MEM_COUNT];

/* What Status says about the job. */
typedef struct zd_job_status {
    char job_id[ZD_JOB_ID_MAX];
    uint32_t rank, world, stage;
    zs_dtype_t dtype;
    uint64_t step, skipped_steps;
    double loss_scale, grad_norm;
    zd_step_stats_t stats; /* step phases, collective bytes, re-attaches (obs/metrics.h) */
    bool trainer_attached;
    uint64_t param_numel, layout_hash;
    char collectives[256];
    uint64_t mem_bytes[ZD_MEM_COUNT], mem_formula[ZD_MEM_COUNT];
    bool params_shared; /* the params term is this rank's share of one region per host */
    /* replication = buddy: the replica this rank holds (of replica_owner's shard, at
     * replica_step when valid) and the rank that holds this rank's */
    bool replication, replica_valid;
    uint32_t replica_owner, replica_buddy;
    uint64_t replica_step;
    /* its life (JobList, zeroctl job ls): monotonic times */
    uint64_t created_ns;
    uint64_t released_ns;     /* its trainer went (0 while attached) */
    uint64_t linger_until_ns; /* 0 while attached */
    bool kept;                /* its trainer detached keeping it (not a crash) */
    bool mesh_lost, mesh_up;
    int32_t trainer_pid;
    char coordinator[256];
    uint32_t train_batch_size;          /* samples per step, every rank's; 0: not given */
    uint64_t device_free, device_total; /* the CUDA backend's GPU memory; 0 on the CPU */
} zd_job_status_t;

/* "attached", "lost" (attached, its mesh lost), "kept" (its trainer detached keeping it) or
 * "orphaned" (its trainer went without a detach), from a published status. */
const char *zd_job_state_name(const zd_job_status_t *status);

/* ---- the snapshot ---------------------------------------------------------------------- */

typedef struct zd_metrics zd_metrics_t;

/* How long the loop's heartbeat may be silent before /healthz fails. */
#define ZD_METRICS_HEARTBEAT_NS    (1000ull * 1000000ull)
#define ZD_METRICS_HEALTH_STALE_NS (5000ull * 1000000ull)

/* device: the resolved device ("cpu:0"), a label of every series. */
zs_status_t zd_metrics_create(const char *device, zd_metrics_t **metrics_p);
/* After every publisher and reader stopped. NULL is a no-op. */
void zd_metrics_destroy(zd_metrics_t *m);

/* Publishers: any thread; m == NULL is a no-op. */
/* The runner's job (NULL: none), as its status says. */
void zd_metrics_publish_job(zd_metrics_t *m, const zd_job_status_t *job);
/* The loop is alive at now_ns (monotonic). */
void zd_metrics_heartbeat(zd_metrics_t *m, uint64_t now_ns);
/* The daemon socket listens (or stopped listening). */
void zd_metrics_set_listening(zd_metrics_t *m, bool listening);
/* A connection was refused (permission, per-uid limit, buffer budget). */
void zd_metrics_conn_refused(zd_metrics_t *m);
/* A client's frame or request was refused as malformed or not allowed. */
void zd_metrics_protocol_error(zd_metrics_t *m);

/* Readers: the Prometheus text of the snapshot (malloc'd, the caller frees). */
zs_status_t zd_metrics_format(zd_metrics_t *m, char **text_p, size_t *len_p);
/* /healthz and /readyz: true when healthy (ready); why says what was checked, or what failed. */
bool zd_metrics_healthy(zd_metrics_t *m, uint64_t now_ns, char *why, size_t len);
bool zd_metrics_ready(zd_metrics_t *m, char *why, size_t len);

/* ---- metrics_listen ---------------------------------------------------------------------- */

typedef enum zd_listen_kind {
    ZD_LISTEN_OFF = 0,
    ZD_LISTEN_TCP,
    ZD_LISTEN_UNIX,
    ZD_LISTEN_AUTO, /* a unix socket beside the daemon socket: zd_listen_auto_path */
} zd_listen_kind_t;

typedef struct zd_listen {
    zd_listen_kind_t kind;
    char host[256]; /* TCP: an address or name, without the brackets of [v6] */
    char port[8];   /* TCP: 1..65535 */
    char path[108]; /* unix: absolute */
} zd_listen_t;

/* "auto" (the default), "off", "none" or "" (off), HOST:PORT ([V6]:PORT) with PORT 1..65535, or
 * an absolute unix socket path. err names the key and the value. */
zs_status_t zd_listen_parse(const char *value, zd_listen_t *out, char *err, size_t errlen);

/* metrics_listen = auto: the unix socket beside the daemon socket `socket_path`, its ".sock"
 * replaced by ".metrics.sock" (zerod-cpu0.sock: zerod-cpu0.metrics.sock; a path without
 * ".sock" gets it appended). ZS_ERR_INVALID (err says why) when that is 108 bytes or longer. */
#define ZD_METRICS_SOCK_SUFFIX ".metrics.sock"
zs_status_t zd_listen_auto_path(const char *socket_path, char *out, size_t len, char *err,
                                size_t errlen);

#endif
