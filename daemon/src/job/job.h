/*
 * One job on this daemon (docs/architecture.md): its lifecycle -- attach (a fresh job, or a
 * re-attach of the job kept after its trainer went), the mesh of its daemons, ParamsReady, buckets,
 * steps, detach, linger -- and its state (layout, fp32 shard, shared regions, loss scaler), private
 * to job/job.c and job/step.c. The engine thread alone calls these; each returns a status and, on
 * failure, a message naming the field, the rank or the limit in err.
 */
#ifndef ZD_JOB_H
#define ZD_JOB_H

#include "obs/metrics.h"
#include "obs/trace.h"
#include "zk/kernels.h"
#include "zs/dir.h"
#include "zs/dtype.h"
#include "zs/log.h"
#include "zs/mem.h"
#include "zs/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZD_JOB_ID_MAX 128
/* A message returned to a client (Result.message) or logged for one request. */
#define ZD_MAX_MSG 512

typedef struct zd_job zd_job_t;

/* The trainer connection of the last job an operator ended (zeroctl job end, here or on a
 * peer), so that its next call is told why (ERR_JOB_ENDED). The engine's; job/job_ctl.c writes it.
 */
typedef struct zd_job_ended {
    uint64_t conn; /* 0: none */
    char msg[ZD_MAX_MSG];
} zd_job_ended_t;

/* What a job needs from the daemon: settings, the kernels, and a way back to the engine. */
typedef struct zd_job_env {
    const zk_exec_t *exec;
    bool cuda; /* the CUDA backend on GPU cuda_device (backend/backend.h); false: the CPU's */
    int cuda_device;
    const char *token_file;
    uint64_t mesh_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns;
    bool direct_collectives;
    const atomic_bool *cancel; /* the daemon stops: mesh formation and waits end */
    void (*wake)(void *arg);   /* a peer was lost (called from the mesh watch thread) */
    void (*busy)(void *arg, const char *what); /* a long operation begins ("forming the mesh") */
    void *arg;                                 /* of wake and busy */
    zs_ratelimit_t *warn_rl;                   /* warnings a trainer can cause at will */
    /* reloadable (SIGHUP): read when used */
    uint64_t job_linger_ns;
    uint64_t max_shard_bytes;
    uint32_t n_slots;
    /* checkpoint.* of the daemon config (docs/checkpoints.md): automatic saves */
    const char *ckpt_dir; /* NULL: none */
    uint64_t ckpt_every_steps;
    uint64_t ckpt_every_ns;
    uint32_t ckpt_keep_last;
    bool ckpt_async;
    bool ckpt_staging_keep;
    zd_job_ended_t *ended;   /* NULL: not recorded */
    zd_trace_t *trace;       /* the step trace (obs/trace.h); NULL: off */
    uint64_t req_arrived_ns; /* when the request being run arrived (monotonic; 0: unknown) */
} zd_job_env_t;

/* What an attach wants done with a job kept for a re-attach (ipc.proto Resume;
 * docs/design-notes.md "A job's life"). */
typedef enum zd_resume {
    ZD_RESUME_IF_KEPT = 0, /* re-attach whenever the layout matches (clients without the field) */
    ZD_RESUME_AUTO = 1,    /* only on a restart, or a job kept on purpose; else replace it */
    ZD_RESUME_NEVER = 2,   /* always replace it */
    ZD_RESUME_MUST = 3,    /* re-attach it, or fail */
} zd_resume_t;

/* What a trainer attaches with. */
typedef struct zd_job_spec {
    const char *job_id;
    uint32_t rank;
    uint32_t world;
    const char *coordinator; /* host:port of rank 0's daemon (world > 1) */
    zs_dtype_t dtype;
    uint32_t n_groups;
    const uint32_t *group_n_params;
    const uint64_t *numel;         /* group-major */
    const char *const *group_json; /* [n_groups], may hold NULL */
    const char *config_json;
    const char *const *names; /* NULL, or [n_params] (NULL or "" entries: "param.<id>") */
    const uint32_t *ndim;     /* NULL, or [n_params] */
    const uint64_t *dims;     /* the dims of every parameter in turn (sum of ndim) */
    zd_resume_t resume;
    bool restart;         /* the launcher says this process is a restart */
    int32_t trainer_pid;  /* SO_PEERCRED of the connection; 0: unknown */
    bool own_slices_only; /* Attach.own_slices_only: one params region per host is allowed */
} zd_job_spec_t;

/* CheckpointSave / CheckpointLoad (docs/checkpoints.md). */
#define ZD_CKPT_DIR_MAX 3800u
typedef struct zd_ckpt_req {
    const char *dir;           /* absolute, as the client named it: for messages */
    int dir_fd;                /* that directory, opened by the client (the request's: closed
                                * with it); -1: the daemon's own, opened by path */
    const zs_cred_t *cred;     /* whose rights dir_fd is used with (zs/dir.h); NULL: the
                                * daemon's own */
    zs_cancel_t cancel;        /* loads and verifies stop when the daemon stops */
    const char *tag;           /* NULL or "": global_step<N> (save), DIR/latest (load) */
    const void *trainer_state; /* save, rank 0: stored as trainer_state.pt; may be NULL */
    size_t trainer_state_len;
    bool load_optimizer_states;
    uint32_t keep_last; /* save: keep the newest keep_last checkpoints of dir; 0 keeps all */
    bool async;         /* save: reply once every rank holds a staging copy (checkpoint_async) */
    bool keep_staging;  /* async: keep the copy's memory for the next save */
} zd_ckpt_req_t;

typedef struct zd_ckpt_out {
    char path[4096];
    char tag[128];
    uint64_t step;
    double loss_scale;
    uint32_t saved_world;
    bool has_trainer_state;
    uint64_t bytes; /* export: the file's size (saved_world: its tensor count) */
} zd_ckpt_out_t;

/* What an attach gives the trainer (AttachReply); fds are new descriptors the caller owns. */
typedef struct zd_attach_out {
    uint64_t layout_hash;
    uint64_t step;
    bool resumed; /* a live job whose params region holds its values */
    double loss_scale;
    uint32_t n_slots;
    uint64_t slot_bytes, params_bytes, grads_bytes;
    uint32_t stage;
    uint32_t gradient_accumulation_steps;
    uint64_t config_hash;
    uint64_t bucket_size;
    bool round_robin;
    uint32_t elem_align;
    bool params_are_master; /* fp32: the params region's slices are the master (read-only) */
    bool params_shared;     /* every co-located rank maps this params region */
    zs_mem_type_t memory;   /* the regions' kind: host memfds or device VMM fds */
    int device;             /* the CUDA ordinal of device regions; -1 for host */
    char ignored_keys[256]; /* config keys accepted and not used ("" when none) */
    uint32_t train_batch_size, micro_batch_size; /* 0: not given */
    zs_dtype_t grads_dtype;                      /* stage 1's grads region */
    int fds[3];                                  /* params, slots, and (stage 1) grads */
    int n_fds;
    char replaced[ZD_MAX_MSG]; /* the kept job this attach replaced, and why ("" when none) */
} zd_attach_out_t;

typedef struct zd_step_out {
    uint64_t step; /* the job's step after the call */
    bool skipped;
    double grad_norm;
    double loss_scale;
    uint64_t skipped_steps;
} zd_step_out_t;

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

/* ShardInfo. */
typedef struct zd_group_shard {
    uint32_t n_params, n_buckets;
    uint64_t flat_offset, flat_numel, shard_offset, shard_numel;
    double lr, weight_decay;
} zd_group_shard_t;

typedef struct zd_shard_out {
    char job_id[ZD_JOB_ID_MAX];
    uint32_t rank, world;
    uint64_t total_numel, param_numel, shard_numel, max_bucket_numel, bucket_size, layout_hash;
    uint32_t n_buckets, n_groups;
    zd_group_shard_t *groups; /* [n_groups], malloc'd: the caller frees */
    double master_sumsq;      /* NaN when the master holds a non-finite value */
    char *training_config;    /* zd_train_config_explain's, malloc'd: the caller frees */
} zd_shard_out_t;

/* Free what a zd_job_shard_info() allocated in *out (groups, training_config); NULLs them. */
void zd_shard_out_free(zd_shard_out_t *out);

/* The daemon holds at most one job: *job_p. Attach connection `conn` to the job of spec: a new
 * job (when *job_p is NULL), or a re-attach of *job_p (the same id, rank, layout and config, its
 * trainer gone); ZS_ERR_BUSY for another job. At world > 1 the mesh forms (bounded by
 * mesh_timeout) unless it is still up. */
zs_status_t zd_job_attach(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn,
                          const zd_job_spec_t *spec, zd_attach_out_t *out, char *err,
                          size_t errlen);
/* A fresh job's trainer wrote the initial values into the params region. With checkpoint_dir
 * set and a checkpoint of this job there, the job resumes from it instead (*out says so). */
zs_status_t zd_job_params_ready(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                zd_ckpt_out_t *out, char *err, size_t errlen);
/* Stage 2: slot `slot` holds bucket `bucket` of micro-step `micro_step`: reduce-scatter it. */
zs_status_t zd_job_bucket_ready(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                uint32_t slot, uint32_t bucket, uint32_t micro_step, char *err,
                                size_t errlen);
/* The same with BucketReady.event (event_len bytes; 0: none): on the CUDA backend the daemon
 * first waits, within collective_timeout, for the trainer's interprocess event (64 bytes). */
zs_status_t zd_job_bucket_ready_event(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                                      uint32_t slot, uint32_t bucket, uint32_t micro_step,
                                      const uint8_t *event, uint32_t event_len, char *err,
                                      size_t errlen);
/* The optimizer step of docs/semantics.md §4 (group_lr: NULL or n_groups learning rates). */
zs_status_t zd_job_step(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                        const double *group_lr, size_t n_group_lr, zd_step_out_t *out, char *err,
                        size_t errlen);
/* The trainer detaches: end_job drops the job (*job_p becomes NULL); otherwise it is kept,
 * with its mesh, for job_linger. */
zs_status_t zd_job_detach(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn, bool end_job,
                          char *err, size_t errlen);
/* Connection `conn` closed: if it held the job, the partial micro-step is dropped, the mesh of
 * a world > 1 job aborted, and the job kept for job_linger. */
void zd_job_disconnect(zd_job_t *job, const zd_job_env_t *env, uint64_t conn);
/* Work the engine does while no request waits: one slice's sum of squares that is due (the
 * step's norm then has it). False when there was none (or no job). */
bool zd_job_idle_work(zd_job_t *job);
/* Between requests: take in a lost mesh, and drop the job when its linger ran out. Returns the
 * nanoseconds until the linger deadline (UINT64_MAX: none). */
uint64_t zd_job_tick(zd_job_t **job_p, const zd_job_env_t *env);
/* The job's UCX event fd, armed for poll(); -1: none; -2: events are pending (do not sleep). */
int zd_job_poll_fd(zd_job_t *job);
/* End the job (tell the peers, free everything); *job_p becomes NULL. NULL is a no-op. */
void zd_job_drop(zd_job_t **job_p, const char *why);

/* Save or load the job's state: a collective of every rank's trainer (docs/checkpoints.md). */
zs_status_t zd_job_ckpt_save(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                             size_t errlen);
zs_status_t zd_job_ckpt_wait(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             zd_ckpt_out_t *out, char *err, size_t errlen);
zs_status_t zd_job_ckpt_load(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                             size_t errlen);

/* ExportRequest (control role). */
typedef struct zd_export_req {
    const char *path;      /* absolute, for messages; its last component is the file's name */
    int dir_fd;            /* path's directory, opened by the requester (the request's) */
    const zs_cred_t *cred; /* the requester's: the file is created with its rights, for it */
    zs_dtype_t dtype;
} zd_export_req_t;

/* The job's parameters into one new safetensors file (ckpt/ckpt_export.c). */
zs_status_t zd_job_export(zd_job_t *job, const zd_job_env_t *env, const zd_export_req_t *req,
                          zd_ckpt_out_t *out, char *err, size_t errlen);

void zd_job_status(const zd_job_t *job, zd_job_status_t *status_p);
zs_status_t zd_job_shard_info(const zd_job_t *job, zd_shard_out_t *out, char *err, size_t errlen);

#endif
