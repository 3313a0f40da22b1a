/*
 * The job's plain types (docs/architecture.md): what a trainer attaches with, what the job's
 * calls answer, and what an operator asks of it. The runner's requests carry them; nothing here
 * needs the job's API, its settings or the kernels.
 */
#ifndef ZD_JOB_TYPES_H
#define ZD_JOB_TYPES_H

#include "ckpt/ckpt_types.h"
#include "obs/metrics.h"
#include "zs/dir.h"
#include "zs/dtype.h"
#include "zs/error.h"
#include "zs/mem.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zd_job zd_job_t;

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
    bool replicated;        /* buddy replicas of every shard: a lost daemon costs no step */
    zs_mem_type_t memory;   /* the regions' kind: host memfds or device VMM fds */
    int device;             /* the CUDA ordinal of device regions; -1 for host */
    char ignored_keys[256]; /* config keys accepted and not used ("" when none) */
    uint32_t train_batch_size, micro_batch_size; /* 0: not given */
    zs_dtype_t grads_dtype;                      /* stage 1's grads region */
    int fds[3];                                  /* params, slots, and (stage 1) grads */
    int n_fds;
    char replaced[ZS_MSG_MAX]; /* the kept job this attach replaced, and why ("" when none) */
} zd_attach_out_t;

typedef struct zd_step_out {
    uint64_t step; /* the job's step after the call */
    bool skipped;
    double grad_norm;
    double loss_scale;
    uint64_t skipped_steps;
} zd_step_out_t;

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

/* JobEnd. */
typedef struct zd_job_end_req {
    const char *job_id;    /* the job to end (unused with all) */
    bool all;              /* whatever job the daemon holds */
    const char *ckpt_dir;  /* NULL or "": no final checkpoint; else absolute, for messages */
    int ckpt_dir_fd;       /* ckpt_dir, opened by the requester (the request's) */
    const zs_cred_t *cred; /* the requester's: the checkpoint is written with its rights */
} zd_job_end_req_t;

typedef struct zd_job_end_out {
    char job_id[ZD_JOB_ID_MAX];
    uint32_t rank, world;
    uint64_t step;
    char ckpt_path[4096]; /* the final checkpoint, or "" */
    bool peers_told;      /* its mesh was up: the other daemons end it too (mesh END) */
} zd_job_end_out_t;

#endif
