/*
 * Checkpoints of one rank's shard (docs/checkpoints.md): the save protocol (every rank writes its
 * shard into a temporary directory, rank 0 commits it by rename once every rank's file is on
 * disk, in the background with checkpoint_async), the load at any world size (each rank reads
 * the element ranges its shard owns into a staging copy, agreed by every rank before any job
 * takes it), the export of the parameters, and the daemon's own checkpoint_dir. Collectives of
 * every rank of the job; the runner thread calls them, through job/.
 *
 * ckpt/ knows nothing of the job: the job describes its shard in a zd_ckpt_shard_t for each
 * call, keeps a zd_ckpt_t between calls, and takes a load's staging copy into itself.
 */
#ifndef ZD_CKPT_H
#define ZD_CKPT_H

#include "backend/backend.h"
#include "ckpt/ckpt_types.h"
#include "coll/coll.h"
#include "mesh/mesh.h"
#include "obs/trace.h"
#include "zk/kernels.h"
#include "zs/ckpt.h"
#include "zs/layout.h"
#include "zs/mem.h"

/* One rank's shard of a job, as a checkpoint sees it: the job's, described for the call (the
 * arrays and pointers stay the job's; a save reads them, nothing here writes them). */
typedef struct zd_ckpt_shard {
    const char *job_id;
    uint32_t rank, world, stage;
    zs_dtype_t dtype; /* of the params region */
    uint64_t config_hash;
    const zs_layout_t *layout;
    const zs_ckpt_param_t *pmeta; /* [n_params], registration order: names and shapes */
    char *const *group_json;      /* [n_groups]: each group's options as the trainer sent them */
    zd_backend_t *be;
    zd_coll_t *coll; /* NULL while the mesh is down */
    zd_mesh_t *mesh; /* world > 1 */
    zd_trace_t *trace;
    float *const *master;      /* [n_buckets]: each bucket's slice of the fp32 master */
    const float *m, *v;        /* [shard_numel] */
    const zs_region_t *params; /* the params region (an export writes it) */
    bool params_loaded;
    uint64_t step, skipped_steps;
    zs_ckpt_scaler_t scaler;
} zd_ckpt_shard_t;

/* A job's checkpoints between calls: the save count the ranks agree on, the save being written
 * in the background, the staging copy kept for the next save. */
typedef struct zd_ckpt zd_ckpt_t;

zs_status_t zd_ckpt_create(zd_ckpt_t **ck_p);
/* Waits for a save still being written, frees the kept copy. NULL is a no-op. */
void zd_ckpt_destroy(zd_ckpt_t *ck);
/* A save still being written (checkpoint_async) finishes first: before a load, before the job
 * leaves its mesh (the writer reports over it), before the job ends. */
void zd_ckpt_settle(zd_ckpt_t *ck);

/* CheckpointSave (a collective; a span of the step trace). */
zs_status_t zd_ckpt_save(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                         zd_ckpt_out_t *out, char *err, size_t errlen);
/* CheckpointWait (a collective): the background save's outcome, the same on every rank. */
zs_status_t zd_ckpt_wait(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, zd_ckpt_out_t *out, char *err,
                         size_t errlen);

/* What a load read: this rank's new shard state, agreed by every rank, for the job to take. */
typedef struct zd_ckpt_loaded {
    float *stage[ZS_CKPT_N_TENSORS]; /* master, m, v in shard order (m and v only with moments);
                                      * zs_aligned_alloc'd: the job may take them */
    bool moments;                    /* m and v were read (load_optimizer_states) */
    uint64_t step, skipped_steps;    /* the saved ones (0 without the moments) */
    zs_ckpt_scaler_t scaler;
    zd_ckpt_out_t out; /* path, tag, saved_world, has_trainer_state */
} zd_ckpt_loaded_t;

/* CheckpointLoad (a collective), up to the staging copy: verified and read by every rank. */
zs_status_t zd_ckpt_load(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                         zd_ckpt_loaded_t *loaded, char *err, size_t errlen);
/* Frees what a load staged and the job did not take. */
void zd_ckpt_loaded_free(zd_ckpt_loaded_t *loaded);

/* ExportRequest: the job's parameters (its params region) into one new safetensors file. */
zs_status_t zd_ckpt_export(const zd_ckpt_shard_t *sh, const zk_exec_t *exec,
                           const zd_export_req_t *req, zd_ckpt_out_t *out, char *err,
                           size_t errlen);

/* The daemon's own checkpoints (checkpoint_dir/<job id>): the directory's path (made, with
 * checkpoint_dir, when make). */
zs_status_t zd_ckpt_own_dir(const char *ckpt_dir, const char *job_id, bool make, char *path,
                            size_t len, char *err, size_t errlen);
/* Which checkpoint a resume loads. */
typedef struct zd_ckpt_resume {
    bool found;                /* false: a fresh start (no latest and no checkpoint at all) */
    char tag[ZS_CKPT_TAG_MAX]; /* path/tag */
    uint64_t step;
    char warning[1024]; /* why not the one latest names (it names the file), or "" */
} zd_ckpt_resume_t;
/* The checkpoint of this job in path that every rank resumes from (a collective): the one
 * latest names; or, when latest cannot be used, or its checkpoint `bad` failed to load (`why`
 * says how), the newest other one that verifies in full, with a warning. Fails on every rank,
 * naming the file, when none verifies, and when the ranks would choose differently. */
zs_status_t zd_ckpt_own_resume(const zd_ckpt_shard_t *sh, const char *path, const char *bad,
                               const char *why, const zs_cancel_t *cancel, zd_ckpt_resume_t *res,
                               char *err, size_t errlen);

/* A phase's outcome agreed by every rank (a collective): ZS_OK only when every rank's was, else
 * the first failed rank's status and message on every rank. */
zs_status_t zd_ckpt_agree(const zd_ckpt_shard_t *sh, zs_status_t mine, const char *what, char *err,
                          size_t errlen);

#endif
