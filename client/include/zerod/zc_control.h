/*
 * libzc's queries of a daemon, the calls zeroctl is built on: the daemon's status and this
 * rank's shard, the daemon's job, its step trace. Part of libzc's public API, declared apart
 * from the trainer's calls: zerod/zc.h includes it at its end, and a program includes
 * <zerod/zc.h>, never this file alone.
 */
#ifndef ZEROD_ZC_CONTROL_H
#define ZEROD_ZC_CONTROL_H

#ifndef ZEROD_ZC_H
#error "include <zerod/zc.h>: it declares what zerod/zc_control.h needs, and includes it"
#endif

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- daemon status and shard layout (what zeroctl shows) ------------------------------ */

/*
 * Queries of the daemon a session is open on, usually with the control role. Their result
 * structs start with a field_mask: the caller sets the parts it wants (ZC_*_FIELD_*), the call
 * fills those and leaves field_mask holding the parts it filled, so that parts can be added
 * without breaking callers. Strings are never NULL ("" when the daemon sent none); they, and
 * the terms and groups read by index, belong to the session and stay valid until the next
 * query of the same kind on it or zc_session_close(). A daemon error is returned as its
 * status, with zc_last_error() "status: NAME: message" (or "shard: ...").
 */

enum {
    ZC_DAEMON_STATUS_FIELD_DAEMON = 1u << 0,   /* version .. uptime_s, heap_in_use */
    ZC_DAEMON_STATUS_FIELD_ACTIVITY = 1u << 1, /* activity, activity_s */
    ZC_DAEMON_STATUS_FIELD_JOB = 1u << 2,      /* has_job, job_id .. collectives */
    ZC_DAEMON_STATUS_FIELD_MEMORY = 1u << 3,   /* n_memory */
    ZC_DAEMON_STATUS_FIELD_RATE = 1u << 4,     /* steps_per_s .. busbw_all_gather */
    ZC_DAEMON_STATUS_FIELD_DEVICE = 1u << 5,   /* device_free_bytes .. mps */
    ZC_DAEMON_STATUS_FIELD_REPLICA = 1u << 6,  /* replication .. replica_buddy */
    ZC_DAEMON_STATUS_FIELD_WAIT = 1u << 7,     /* wait_reduce_scatter_s .. params_shared */
};

typedef struct zc_daemon_status {
    uint64_t field_mask;
    const char *version; /* zerod's */
    int32_t pid;
    const char *device;
    const char *socket; /* the socket the daemon listens on */
    double uptime_s;
    const char *activity; /* what the daemon is busy with ("step 42"); "" when idle */
    double activity_s;    /* for how long */
    int has_job;          /* 0: the job fields below are zero */
    const char *job_id;
    uint32_t rank;
    uint32_t world;
    uint32_t stage;
    zc_dtype_t dtype;     /* as the daemon sent it: zc_dtype_name() says "unknown" if need be */
    int trainer_attached; /* 1: a trainer session holds the job */
    uint64_t step;        /* optimizer steps completed */
    uint64_t skipped_steps;
    double loss_scale;
    double grad_norm;            /* the last step's; < 0 when not finite */
    uint64_t param_numel;        /* parameter elements, unpadded */
    uint64_t layout_hash;        /* the job's layout, as zc_attach_info_t's */
    const char *collectives;     /* the algorithm the job's daemons agreed on, and why */
    uint32_t n_memory;           /* memory terms: zc_session_memory_term(), i < n_memory */
    uint64_t heap_in_use;        /* bytes the daemon's malloc holds for it; 0: unknown (DAEMON) */
    double steps_per_s;          /* steps that ran in the last 10 s (or since the job began, if
                                    later), per second; 0 when none ran (RATE; docs/metrics.md) */
    uint32_t train_batch_size;   /* samples per step, every rank's; 0: the config gave none */
    double busbw_reduce_scatter; /* bytes/s of the last step's collectives over their transfer */
    double busbw_all_gather;     /* time (nccl-tests' bus bandwidth, the wait below excluded); 0
                                    at world 1, before a step, and the all-gather of a shared
                                    params region */
    uint64_t device_free_bytes;  /* the CUDA backend's GPU memory, as its driver reported it at */
    uint64_t device_total_bytes; /* the job's last status; 0 and 0 on the CPU or before a job */
    int mps; /* 1: an NVIDIA MPS control daemon serves the CUDA daemon (else the trainer's and the
                daemon's kernels time-slice the GPU) */
    int replication;              /* 1: replication = buddy (the four below say more; REPLICA) */
    uint32_t replica_owner;       /* the rank whose shard this daemon holds a replica of, */
    uint64_t replica_step;        /* at this step, */
    int replica_valid;            /* 1: it holds one (0: not received yet) */
    uint32_t replica_buddy;       /* the rank whose daemon holds this rank's shard */
    double wait_reduce_scatter_s; /* how long the last step's collectives waited for the other */
    double wait_all_gather_s;     /* ranks to enter them (WAIT; docs/metrics.md) */
    int params_shared; /* 1: one params region for the host's daemons: the all-gather is a
                          barrier, no bytes (all wait) */
} zc_daemon_status_t;

enum {
    ZC_MEMORY_TERM_FIELD_MEASURED = 1u << 0, /* name, bytes */
    ZC_MEMORY_TERM_FIELD_FORMULA = 1u << 1,  /* formula_bytes, formula */
};

/* One category of the daemon's memory: what it allocated, beside the formula of
 * docs/semantics.md ("Memory per rank"). */
typedef struct zc_memory_term {
    uint64_t field_mask;
    const char *name; /* params, slots, grads, master, m, v, accumulator */
    uint64_t bytes;   /* measured: bytes allocated */
    uint64_t formula_bytes;
    const char *formula; /* e.g. "2Ψ", "4Ψ/N" (UTF-8) */
} zc_memory_term_t;

/* Ask the daemon for its status (timeout_ms < 0: the session default). */
ZC_API int zc_session_daemon_status(zc_session_t *session, int timeout_ms,
                                    zc_daemon_status_t *status_p);
/* Memory term i of the last zc_session_daemon_status() on this session. */
ZC_API int zc_session_memory_term(zc_session_t *session, uint32_t i, zc_memory_term_t *term_p);

enum {
    ZC_SHARD_INFO_FIELD_LAYOUT = 1u << 0, /* job_id .. layout_hash */
    ZC_SHARD_INFO_FIELD_MASTER = 1u << 1, /* master_sumsq */
    ZC_SHARD_INFO_FIELD_GROUPS = 1u << 2, /* n_groups */
};

/* This daemon's rank of the job: its shard of the flat (bucket-padded) parameter space. */
typedef struct zc_shard_info {
    uint64_t field_mask;
    const char *job_id;
    uint32_t rank;
    uint32_t world;
    uint64_t total_numel; /* elements of the flat space, padded */
    uint64_t param_numel; /* of them, parameter elements */
    uint64_t shard_numel; /* elements this rank owns */
    uint32_t n_buckets;
    uint64_t max_bucket_numel;
    uint64_t bucket_size; /* elements */
    uint64_t layout_hash;
    double master_sumsq; /* sum of squares of this rank's fp32 master shard */
    uint32_t n_groups;   /* parameter groups: zc_session_group_shard(), i < n_groups */
} zc_shard_info_t;

enum {
    ZC_GROUP_SHARD_FIELD_RANGES = 1u << 0,  /* group .. shard_numel */
    ZC_GROUP_SHARD_FIELD_OPTIONS = 1u << 1, /* lr, weight_decay */
};

/* One parameter group's place in the flat space and in this rank's shard, in elements. */
typedef struct zc_group_shard {
    uint64_t field_mask;
    uint32_t group;
    uint32_t n_params;
    uint32_t n_buckets;
    uint64_t flat_offset;
    uint64_t flat_numel;
    uint64_t shard_offset;
    uint64_t shard_numel;
    double lr;
    double weight_decay;
} zc_group_shard_t;

/* Ask the daemon for this rank's shard of its job (timeout_ms < 0: the session default). */
ZC_API int zc_session_shard_info(zc_session_t *session, int timeout_ms, zc_shard_info_t *info_p);
/* The daemon writes its job's parameters, as the trainers see them, into a new safetensors file
 * at path (made absolute here), in a directory the calling user owns; dtype ZC_DTYPE_F32 or
 * ZC_DTYPE_BF16. Between two steps: one step's parameters; *step_p (may be NULL) says which. */
ZC_API int zc_session_export(zc_session_t *session, const char *path, zc_dtype_t dtype,
                             int timeout_ms, uint64_t *step_p);
/* Group i of the last zc_session_shard_info() on this session. */
ZC_API int zc_session_group_shard(zc_session_t *session, uint32_t i, zc_group_shard_t *group_p);
/* The job's resolved training config from the last zc_session_shard_info(): a JSON array of
 * {"key", "value", "source"} (source "config", "default" or "derived"); "" from a daemon that
 * does not send it, NULL before a shard_info. Valid until the next shard_info or close. */
ZC_API const char *zc_session_training_config(zc_session_t *session);

/* ---- the daemon's job (what `zeroctl job` does) ----------------------------------------- */

enum {
    ZC_JOB_INFO_FIELD_JOB = 1u << 0,  /* job_id .. step, coordinator */
    ZC_JOB_INFO_FIELD_LIFE = 1u << 1, /* state .. mesh_up */
};

/* A job a daemon holds (it holds one at most). */
typedef struct zc_job_info {
    uint64_t field_mask;
    const char *job_id;
    uint32_t rank;
    uint32_t world;
    uint64_t step;
    const char *coordinator;
    const char *state;    /* "attached", "lost" (attached, its mesh lost), "kept" (its trainer
                             detached keeping it) or "orphaned" (its trainer went without one) */
    double age_s;         /* since it was created on this daemon */
    double idle_s;        /* since its trainer went; 0 while attached */
    double linger_left_s; /* until job_linger ends it; 0 while attached */
    int32_t trainer_pid;  /* the attached trainer's; 0 when none */
    int mesh_up;          /* 1: its daemons' mesh is formed (world 1: always) */
} zc_job_info_t;

/* Ask the daemon for its job: *n_jobs_p is 0 or 1; zc_session_job_info() reads it. */
ZC_API int zc_session_job_list(zc_session_t *session, int timeout_ms, uint32_t *n_jobs_p);
/* Job i of the last zc_session_job_list() on this session. */
ZC_API int zc_session_job_info(zc_session_t *session, uint32_t i, zc_job_info_t *info_p);

enum {
    ZC_JOB_END_FIELD_CHECKPOINT_DIR = 1u << 0,
    ZC_JOB_END_FIELD_TIMEOUT_MS = 1u << 1,
};

typedef struct zc_job_end_params {
    uint64_t field_mask;
    const char *checkpoint_dir; /* a final checkpoint there (made absolute here; the calling
                                   user's, or root's). At world > 1 every daemon of the job must
                                   be asked, the job's trainers gone; a failed save leaves the
                                   job as it was */
    int timeout_ms;             /* default: the session's */
} zc_job_end_params_t;

enum {
    ZC_JOB_END_FIELD_RESULT = 1u << 0, /* every field below */
};

typedef struct zc_job_end_result {
    uint64_t field_mask;
    const char *job_id; /* the job ended */
    uint32_t rank;
    uint32_t world;
    uint64_t step;          /* its step when it ended */
    const char *checkpoint; /* the final checkpoint's directory, or "" */
    int peers_told;         /* 1: its mesh was up, its other daemons end it too */
} zc_job_end_result_t;

/* End the daemon's job (job_id), or whatever job it holds (job_id NULL): its trainer's next
 * call fails with ZC_ERR_JOB_ENDED. ZC_ERR_NOT_FOUND when it holds no such job. params and
 * result_p may be NULL; result_p's strings stay valid until the next zc_session_job_end(). */
ZC_API int zc_session_job_end(zc_session_t *session, const char *job_id,
                              const zc_job_end_params_t *params, zc_job_end_result_t *result_p);

/* ---- the step trace (what `zeroctl trace` does; docs/trace.md) --------------------------- */

/* What a span is (ipc.proto TraceKind): the daemon's work on one step, on its engine thread. */
typedef enum zc_trace_kind {
    ZC_TRACE_STEP = 1,           /* a step: the whole pipeline, from the Step request on */
    ZC_TRACE_BUCKET = 2,         /* a bucket's gradients arrived (BucketReady); dur: its wait */
    ZC_TRACE_REDUCE_SCATTER = 3, /* one bucket reduce-scattered into the accumulator */
    ZC_TRACE_NORM = 4,           /* overflow check, global norm, loss scaler */
    ZC_TRACE_ALL_REDUCE = 5,     /* the norm's all-reduce (inside NORM) */
    ZC_TRACE_ADAM = 6,           /* Adam on the shard, cast into the params region */
    ZC_TRACE_ALL_GATHER = 7,     /* one bucket's new slices into every params region */
    ZC_TRACE_CHECKPOINT = 8,     /* a checkpoint save (asynchronous: until its copy is staged) */
    ZC_TRACE_REPLICA = 9,        /* replication = buddy: the gradient (at times the shard) to the
                                    buddy, before the norm */
    ZC_TRACE_RECOVER_AGREE = 10, /* a mesh formed: the ranks' replica states gathered */
    ZC_TRACE_RECOVER_SHARD = 11, /* a fresh rank's shard from its buddy's replica */
} zc_trace_kind_t;

enum {
    ZC_TRACE_SPAN_SKIPPED = 1u << 0, /* STEP: skipped on overflow */
    ZC_TRACE_SPAN_FAILED = 1u << 1,  /* the operation failed (a lost peer, a kernel error) */
    ZC_TRACE_SPAN_REFRESH = 1u << 2, /* ALL_GATHER outside a step: parameters loaded, a mesh
                                        formed again */
    ZC_TRACE_SPAN_BARRIER = 1u << 3, /* ALL_GATHER of a shared params region: a barrier that
                                        moves no bytes */
};

enum {
    ZC_TRACE_FIELD_STEPS = 1u << 0,
    ZC_TRACE_FIELD_LAST_STEP = 1u << 1,
    ZC_TRACE_FIELD_TIMEOUT_MS = 1u << 2,
};

typedef struct zc_trace_params {
    uint64_t field_mask;
    uint32_t steps;     /* the last N complete steps (default 1) */
    uint64_t last_step; /* the newest step to give (default: the newest complete one): the
                           daemons of one job asked alike give the same steps */
    int timeout_ms;     /* default: the session's */
} zc_trace_params_t;

enum {
    ZC_TRACE_INFO_FIELD_JOB = 1u << 0,   /* job_id, rank, world */
    ZC_TRACE_INFO_FIELD_STEPS = 1u << 1, /* steps .. recorded */
};

typedef struct zc_trace_info {
    uint64_t field_mask;
    const char *job_id; /* the job the trace is of (the daemon's last); "" when it held none */
    uint32_t rank;
    uint32_t world;
    uint32_t steps;          /* complete steps given; fewer than asked when the daemon's ring
                                holds fewer */
    uint64_t first_step;     /* 0 when steps is 0 */
    uint64_t last_step;      /* 0 when steps is 0 */
    uint32_t n_spans;        /* spans: zc_session_trace_span(), i < n_spans */
    int64_t clock_offset_ns; /* a span's start_ns plus this is Unix time (ns) */
    uint32_t capacity;       /* spans the daemon's ring holds (config trace_buffer) */
    uint64_t recorded;       /* spans it recorded since the job attached; beyond capacity the
                                oldest are gone */
} zc_trace_info_t;

enum {
    ZC_TRACE_SPAN_FIELD_ALL = 1u << 0, /* every field below */
};

/* One span of the daemon's trace; times are the daemon's CLOCK_MONOTONIC, in ns. */
typedef struct zc_trace_span {
    uint64_t field_mask;
    zc_trace_kind_t kind; /* as the daemon sent it: a newer daemon's may be unknown here */
    uint64_t start_ns;
    uint64_t dur_ns;
    uint64_t step;       /* the optimizer step it belongs to */
    uint32_t bucket;     /* BUCKET, REDUCE_SCATTER, ALL_GATHER */
    uint64_t bytes;      /* collectives: world x slice x element size */
    uint32_t micro_step; /* BUCKET */
    uint32_t flags;      /* ZC_TRACE_SPAN_* */
} zc_trace_span_t;

/* Ask the daemon for the spans of its last complete steps (params may be NULL);
 * ZC_ERR_UNSUPPORTED when it records no trace (trace_buffer 0). */
ZC_API int zc_session_trace(zc_session_t *session, const zc_trace_params_t *params,
                            zc_trace_info_t *info_p);
/* Span i of the last zc_session_trace() on this session, in the order the daemon recorded. */
ZC_API int zc_session_trace_span(zc_session_t *session, uint32_t i, zc_trace_span_t *span_p);

#ifdef __cplusplus
}
#endif
#endif
