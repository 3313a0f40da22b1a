/*
 * One job on this daemon (docs/architecture.md): its lifecycle -- attach (a fresh job, or a
 * re-attach of the job kept after its trainer went), the mesh of its daemons, ParamsReady, buckets,
 * steps, detach, linger; with its checkpoints (job/job_ckpt.h) and what it says about itself
 * (job/job_info.h). Its state (layout, fp32 shard, shared regions, loss scaler) is private to
 * job/ (job/job_int.h). The runner thread alone calls these; each returns a status and, on
 * failure, a message naming the field, the rank or the limit in err.
 */
#ifndef ZD_JOB_H
#define ZD_JOB_H

#include "job/job_ckpt.h"
#include "job/job_env.h"
#include "job/job_info.h"
#include "job/job_types.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The daemon holds at most one job: *job_p. Attach connection `conn` to the job of spec: a new
 * job (when *job_p is NULL), or a re-attach of *job_p (the same id, rank, layout and config, its
 * trainer gone); ZS_ERR_BUSY for another job. At world > 1 the mesh forms (bounded by
 * mesh_timeout) unless it is still up. */
zs_status_t zd_job_attach(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn,
                          const zd_job_spec_t *spec, zd_attach_out_t *out, char *err,
                          size_t errlen);
/* A fresh job's trainer wrote the initial values into the params region. With checkpoint_dir
 * set and a checkpoint of this job there, the job resumes from it instead (*out says so).
 * reload: a job that has its parameters; the trainer wrote new ones into the region (weights
 * loaded after attach), and this rank's master shard is loaded from them again. */
zs_status_t zd_job_params_ready(zd_job_t *job, const zd_job_env_t *env, uint64_t conn, bool reload,
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

#endif
