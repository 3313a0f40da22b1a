/*
 * One job on this daemon (docs/architecture.md): its lifecycle -- attach (a fresh job, or a
 * re-attach of the job kept after its trainer went), the mesh of its daemons, ParamsReady, buckets,
 * steps, detach, linger -- and its state (layout, fp32 shard, shared regions, loss scaler), private
 * to job/job.c and job/step.c. The runner thread alone calls these; each returns a status and, on
 * failure, a message naming the field, the rank or the limit in err.
 */
#ifndef ZD_JOB_H
#define ZD_JOB_H

#include "job/job_types.h"
#include "obs/metrics.h"
#include "obs/trace.h"
#include "zk/kernels.h"
#include "zs/dir.h"
#include "zs/dtype.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/mem.h"
#include "zs/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The trainer connection of the last job an operator ended (zeroctl job end, here or on a
 * peer), so that its next call is told why (ERR_JOB_ENDED). The runner's; job/job_ctl.c writes it.
 */
typedef struct zd_job_ended {
    uint64_t conn; /* 0: none */
    char msg[ZS_MSG_MAX];
} zd_job_ended_t;

/* What a job needs from the daemon: settings, the kernels, and a way back to the runner. */
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
    void (*wake)(void *arg);   /* a peer was lost (called from the mesh heartbeat thread) */
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
/* Work the runner does while no request waits: one slice's sum of squares that is due (the
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

/* The job's parameters into one new safetensors file (ckpt/ckpt_export.c). */
zs_status_t zd_job_export(zd_job_t *job, const zd_job_env_t *env, const zd_export_req_t *req,
                          zd_ckpt_out_t *out, char *err, size_t errlen);

void zd_job_status(const zd_job_t *job, zd_job_status_t *status_p);
zs_status_t zd_job_shard_info(const zd_job_t *job, zd_shard_out_t *out, char *err, size_t errlen);

#endif
