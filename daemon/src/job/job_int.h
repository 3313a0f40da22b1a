/*
 * The job's state and the calls between the files of job/ (its lifecycle, its creation, its mesh,
 * its checkpoints, the arithmetic of a step): never included elsewhere.
 */
#ifndef ZD_JOB_INT_H
#define ZD_JOB_INT_H

#include "backend/backend.h"
#include "ckpt/ckpt.h"
#include "coll/coll.h"
#include "config/train_config.h"
#include "job/job_env.h"
#include "job/job_types.h"
#include "job/replica.h"
#include "job/scaler.h"
#include "obs/trace.h"
#include "zs/ckpt.h"
#include "zs/layout.h"
#include "zs/mem.h"

/* A slice's sum of squares (double, zk_sumsq's order) and non-finite flag, taken once its
 * gradient is complete: after the reduce-scatter of its last micro-step, while the runner has
 * no request waiting (zd_step_idle_norm), or at the step for one still without. fresh: they
 * hold the slice's content now; due: the slice is complete and its sum not taken yet. */
typedef struct zd_slice_norm {
    double sumsq;
    uint8_t nonfinite;
    uint8_t fresh;
    uint8_t due;
} zd_slice_norm_t;

struct zd_job {
    char id[ZD_JOB_ID_MAX];
    uint32_t rank, world;
    char coordinator[256];
    zs_dtype_t dtype;
    zd_train_config_t cfg;
    char cfg_ignored[256]; /* keys of the config zerod accepted and does not use */
    char *cfg_explained;   /* zd_train_config_explain (zeroctl config); may be NULL */
    uint64_t config_hash;
    zs_layout_t *layout;
    zd_group_opts_t *group_opts; /* [n_groups] */
    zd_backend_t *be;            /* where the shard and regions live, what runs on them */
    float *master, *m, *v, *acc; /* [layout->shard_numel] each; master NULL when shared */
    bool master_shared;          /* fp32: the master is this rank's slices of the params region */
    bool own_slices_only;        /* the trainer writes only this rank's slices of fresh params */
    bool params_shared; /* every rank of the job maps one params region (rank 0's): Adam writes
                           each slice in place, the all-gather is a barrier */
    uint8_t *acc_clean; /* [n_buckets]: the slice's next contribution overwrites it (it is zero,
                           or holds the last step's gradients while acc_stale) */
    zd_slice_norm_t *slice_norm; /* [n_buckets]: each slice's sum of squares (job/step.c) */
    bool acc_stale;              /* Adam left last step's gradients in the slices still clean */
    zs_region_t params;          /* total_numel x dtype */
    zs_region_t slots;           /* n_slots x slot_bytes */
    zs_region_t grads;           /* stage 1: total_numel x dtype */
    uint32_t n_slots;
    uint64_t slot_bytes;
    zd_scaler_t scaler;
    bool params_loaded;       /* master initialized from the params region */
    uint64_t attached_conn;   /* connection of the attached trainer, 0 when none */
    uint64_t linger_until_ns; /* monotonic; the job is dropped then if no trainer re-attached */
    zd_coll_t *coll;          /* NULL while the mesh is down (world > 1) */
    zd_mesh_t *mesh;          /* world > 1 */
    bool mesh_lost;           /* the mesh aborted: every rank's trainer must re-attach */
    char mesh_why[512];
    bool params_stale; /* an all-gather was interrupted: redo it from the master */
    uint64_t step;
    uint64_t skipped_steps;
    double last_grad_norm;
    uint64_t mem_bytes[ZD_MEM_COUNT];
    uint64_t mem_formula[ZD_MEM_COUNT];
    zd_step_stats_t stats;  /* measured by job/step.c, published with the status (obs/metrics.h) */
    zd_trace_t *trace;      /* the daemon's step trace (obs/trace.h; env->trace); NULL: off */
    zs_ckpt_param_t *pmeta; /* [n_params], registration order: names and shapes (job_ckpt.c) */
    char **group_json;      /* [n_groups]: each group's options as the trainer sent them */
    float **bucket_master;  /* [n_buckets]: zd_step_master of each, for checkpoints */
    zd_ckpt_t *ck;          /* its checkpoints between calls (ckpt/ckpt.h) */
    uint64_t ckpt_last_ns;  /* when the last automatic checkpoint was taken (monotonic) */
    uint64_t ckpt_last_step;
    /* its life (job/job_ctl.c): monotonic times; the trainer's pid for messages */
    uint64_t created_ns;
    uint64_t released_ns; /* its trainer went; 0 while attached */
    bool kept;            /* its trainer detached without end_job (not a crash) */
    int32_t trainer_pid;
    bool end_pending; /* a peer ended the job (mesh END) while its mesh was torn down */
    char end_why[256];
    zd_replica_t rep;      /* replication = buddy: another rank's shard (job/replica.h) */
    bool recovered;        /* a fresh job given its shard by its buddy: the trainer resumes */
    char recover_msg[256]; /* why the job fell back to its last checkpoint ("": it did not) */
};

/* ---- job/job_create.c ----------------------------------------------------------------------- */

/* A job from an attach spec: checked, laid out within env->max_shard_bytes, every region
 * allocated. The mesh is not formed yet. */
zs_status_t zd_job_create(const zd_job_spec_t *spec, const zd_job_env_t *env, zd_job_t **job_p,
                          char *err, size_t errlen);
/* Everything a job holds, and the job. */
void zd_job_destroy(zd_job_t *job);

/* ---- job/job.c ------------------------------------------------------------------------------ */

/* conn holds the job, its mesh is up, and (loaded) the job has its parameters. */
zs_status_t zd_job_require_trainer(const zd_job_t *job, uint64_t conn, bool loaded, char *err,
                                   size_t errlen);
/* A re-attach of the kept job: the same rank, world, layout and config, and no live trainer. */
zs_status_t zd_job_check_reattach(const zd_job_t *job, uint64_t conn, const zd_job_spec_t *spec,
                                  char *err, size_t errlen);
/* World 1: the local collectives. World > 1: form the mesh (bounded by mesh_timeout) and, when
 * the job already has parameters, redo the all-gather from the master shards. */
zs_status_t zd_job_form_mesh(zd_job_t *job, const zd_job_env_t *env, char *err, size_t errlen);
/* The mesh aborted: tear it down, drop the partial micro-step; trainers must re-attach. */
void zd_job_mesh_failed(zd_job_t *job, const zd_job_env_t *env);

/* ---- job/job_ctl.c: what the operator and the attach policy decide ------------------------------
 */

/* Before an attach: refuse it (ERR_BUSY naming the job held, ERR_NOT_FOUND for resume MUST
 * with nothing to resume), or replace the kept job of the same id (dropped; *why says so),
 * or leave *job_p for a re-attach. */
zs_status_t zd_job_attach_decide(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn,
                                 const zd_job_spec_t *spec, char *replaced, size_t replaced_len,
                                 char *err, size_t errlen);
/* Between requests: a peer ended the job (mesh END)? Then it is dropped here too and its
 * trainer told (env->ended). */
bool zd_job_ended_by_peer(zd_job_t **job_p, const zd_job_env_t *env);

/* ---- job_ckpt.c: the job's side of its checkpoints ---------------------------------------- */

/* Names and shapes of the attach spec (defaults "param.<id>" and [numel]). */
zs_status_t zd_job_names_init(zd_job_t *job, const zd_job_spec_t *spec, char *err, size_t errlen);
void zd_job_names_free(zd_job_t *job);
/* A save for an operator (zeroctl job end --checkpoint): no trainer is asked. */
zs_status_t zd_job_ckpt_save_to(zd_job_t *job, const zd_ckpt_req_t *req, zd_ckpt_out_t *out,
                                char *err, size_t errlen);
/* After a step: the automatic checkpoint checkpoint_every_* asks for (failures are logged). */
void zd_job_ckpt_auto(zd_job_t *job, const zd_job_env_t *env);
/* A fresh job at ParamsReady: resume from checkpoint_dir/<job id> (ckpt/ckpt.h
 * zd_ckpt_own_resume: latest's checkpoint, or the newest that verifies, out->warning saying
 * why); *restored_p false: there is none, a fresh start. Fails, err naming the file, on every
 * rank when there is one but none loads. */
zs_status_t zd_job_ckpt_restore(zd_job_t *job, const zd_job_env_t *env, zd_ckpt_out_t *out,
                                bool *restored_p, char *err, size_t errlen);

/* ---- job/step.c ----------------------------------------------------------------------------- */

/* Fresh job: load the fp32 master from this rank's slices of the params region, then
 * all-gather so every rank starts from the owners' values. */
zs_status_t zd_step_load_params(zd_job_t *job, char *err, size_t errlen);
/* Weights written after attach: the fp32 master from this rank's slices of the params region,
 * without a collective (every rank's trainer wrote the same values). Adam's state stays. */
zs_status_t zd_step_reload_master(zd_job_t *job, char *err, size_t errlen);
/* Recast this rank's slices from the master and all-gather every bucket (a re-formed mesh, or
 * an interrupted all-gather). */
zs_status_t zd_step_refresh_params(zd_job_t *job, char *err, size_t errlen);
/* Stage 2: reduce-scatter the slot into the accumulator slice (at the last micro-step, its sum of
 * squares becomes due). arrived_ns: when its BucketReady arrived (monotonic; 0: unknown), for
 * the trace. */
zs_status_t zd_step_reduce_slot(zd_job_t *job, uint32_t slot, uint32_t bucket, uint32_t micro_step,
                                uint64_t arrived_ns, char *err, size_t errlen);
/* The sum of squares of one slice that is due (zd_slice_norm_t), for the runner to call while
 * no request waits; false when none is due. */
bool zd_step_idle_norm(zd_job_t *job);
/* docs/semantics.md §4 in order (group_lr: NULL or one per group). On ZS_ERR_LOSS_SCALE the
 * accumulators are zeroed and nothing else changes. */
zs_status_t zd_step_run(zd_job_t *job, const double *group_lr, zd_step_out_t *out, char *err,
                        size_t errlen);
/* The trainer went: the next step's window (bucket wait, obs/metrics.h) opens at its first bucket.
 */
void zd_step_stats_reset_window(zd_job_t *job);

/* ---- job/step_shard.c ----------------------------------------------------------------------- */

/* This rank's slice of bucket b inside a full-layout region of the job's dtype. */
void *zd_step_slice_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b);
/* This rank's whole bucket b inside a full-layout region. */
void *zd_step_bucket_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b);
/* Bucket b's slice of the fp32 master: in the params region itself when shared. */
float *zd_step_master(const zd_job_t *job, uint32_t b);
/* Sum of squares of this rank's fp32 master (0 before a shared master is loaded). */
void zd_step_master_sumsq(const zd_job_t *job, double *sumsq_p, int *nonfinite_p);
/* Drop a partial accumulation: zero the accumulator and the stage-1 grads. */
void zd_step_drop_partial(zd_job_t *job);

#endif
