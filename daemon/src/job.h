/*
 * A job's state on this daemon (design.md §1-3): layout, fp32 shard (master, m, v,
 * accumulator), shared regions, loss scaler, counters. Owned and mutated by the engine
 * thread only.
 */
#ifndef ZD_JOB_H
#define ZD_JOB_H

#include "coll.h"
#include "scaler.h"
#include "train_config.h"
#include "zk/kernels.h"
#include "zs/layout.h"
#include "zs/mem.h"

#include <stdbool.h>
#include <stdint.h>

#define ZD_JOB_ID_MAX 128
#define ZD_MAX_SLOTS  64
#define ZD_MAX_MSG    512

typedef struct zd_job_spec {
    const char *job_id;
    uint32_t rank;
    uint32_t world;
    const char *coordinator;
    zs_dtype_t dtype;
    uint32_t n_groups;
    const uint32_t *group_n_params;
    const uint64_t *numel;         /* group-major */
    const char *const *group_json; /* [n_groups], may hold NULL */
    const char *config_json;
    uint32_t n_slots;
    uint64_t max_shard_bytes;
} zd_job_spec_t;

/* Bytes of each term of design.md §2, measured and by formula. */
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

typedef struct zd_job {
    char id[ZD_JOB_ID_MAX];
    uint32_t rank, world;
    char coordinator[256];
    zs_dtype_t dtype;
    zd_train_config_t cfg;
    uint64_t config_hash;
    zs_layout_t *layout;
    zd_group_opts_t *group_opts; /* [n_groups] */
    float *master, *m, *v, *acc; /* [layout->shard_numel] each */
    uint8_t *acc_clean;          /* [n_buckets]: the bucket's accumulator slice is all zero */
    zs_region_t params;          /* total_numel x dtype */
    zs_region_t slots;           /* n_slots x slot_bytes */
    zs_region_t grads;           /* stage 1: total_numel x dtype */
    uint32_t n_slots;
    uint64_t slot_bytes;
    zd_scaler_t scaler;
    bool params_loaded;       /* master initialized from the params region */
    uint64_t attached_conn;   /* connection of the attached trainer, 0 when none */
    uint64_t linger_until_ns; /* monotonic; job dropped then if no trainer re-attached */
    zd_coll_t *coll;          /* NULL while the mesh is down (world > 1) */
    zd_mesh_t *mesh;          /* world > 1 */
    bool mesh_lost;           /* the mesh aborted: trainers must re-attach */
    char mesh_why[512];
    bool params_stale; /* an all-gather was interrupted: redo it from the master */
    uint64_t step;
    uint64_t skipped_steps;
    double last_grad_norm;
    uint64_t mem_bytes[ZD_MEM_COUNT];
    uint64_t mem_formula[ZD_MEM_COUNT];
} zd_job_t;

extern const char *const zd_mem_term_names[ZD_MEM_COUNT];

/* Validate the spec, compute the layout, allocate shard and regions. err names the field. */
zs_status_t zd_job_create(const zd_job_spec_t *spec, zd_job_t **job_p, char *err, size_t errlen);
void zd_job_destroy(zd_job_t *job);

/* Fresh job: load the fp32 master from this rank's slices of the params region, then
 * all-gather so every rank starts from the owners' values. */
zs_status_t zd_job_load_params(zd_job_t *job, const zk_exec_t *exec, char *err, size_t errlen);

/* Recast this rank's slices from the master and all-gather every bucket (after a re-formed
 * mesh, or an interrupted all-gather). */
zs_status_t zd_job_refresh_params(zd_job_t *job, const zk_exec_t *exec, char *err, size_t errlen);

/* Offer the job's shared regions (params, slots, grads) to the collectives (after the mesh
 * formed): co-located daemons then read them in place. A collective: every rank calls it. */
zs_status_t zd_job_share_regions(zd_job_t *job, char *err, size_t errlen);

/* Stage 2: reduce-scatter the slot into the accumulator slice. */
zs_status_t zd_job_accumulate_slot(zd_job_t *job, const zk_exec_t *exec, uint32_t slot,
                                   uint32_t bucket, char *err, size_t errlen);

typedef struct zd_step_out {
    bool skipped;
    double grad_norm;
} zd_step_out_t;

/* semantics.md §3 in order. group_lr: NULL or one per group. On ZS_ERR_LOSS_SCALE the
 * accumulators are zeroed and nothing else changes. */
zs_status_t zd_job_step(zd_job_t *job, const zk_exec_t *exec, const double *group_lr,
                        zd_step_out_t *out, char *err, size_t errlen);

/* Drop a partial accumulation (trainer died mid-step): zero acc and the stage-1 grads. */
void zd_job_drop_partial(zd_job_t *job);

#endif
