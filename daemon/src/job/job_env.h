/*
 * What a job needs from the daemon (job/job.h): its settings, the kernels, a way back to the
 * runner, and where an ended job's trainer is told why. The runner fills it; every call of job/
 * reads it.
 */
#ifndef ZD_JOB_ENV_H
#define ZD_JOB_ENV_H

#include "obs/trace.h"
#include "zk/kernels.h"
#include "zs/error.h"
#include "zs/log.h"

#include <stdatomic.h>
#include <stdbool.h>
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
    uint32_t replication;      /* zd_replication_t: buddy replicas of every shard (job/replica.h) */
    const char *stores_file;   /* where a store plan measured here is kept (NULL: nowhere) */
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

#endif
