/*
 * Buddy replicas (daemon config key replication = buddy; docs/design-notes.md "Buddy replicas"):
 * every rank's shard -- fp32 master, Adam's m and v -- is also held by its buddy, another daemon
 * of the job (on another host when the job spans hosts). The buddy keeps it current by running
 * the owner's Adam on it with the owner's reduced gradient, which the owner sends it before the
 * step's norm all-reduce: the step commits on a rank only once every rank passed that
 * all-reduce, so a replica is always at its holder's step. When a daemon dies and a fresh one
 * takes its rank, the mesh that forms again sends the fresh daemon its shard from the buddy and
 * the job goes on at its step; when a shard and its buddy are both gone, the job falls back to
 * checkpoint_dir's latest checkpoint (or fails), naming both ranks.
 */
#ifndef ZD_REPLICA_H
#define ZD_REPLICA_H

#include "job/job_env.h"
#include "job/job_types.h"
#include "zk/kernels.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A job's replica of another rank's shard, and what it sends of its own. */
typedef struct zd_replica {
    bool on;        /* replication = buddy at world > 1, and the mesh is up */
    uint32_t shift; /* rank r's buddy is (r + shift) % world */
    uint32_t owner; /* whose shard this rank holds: (rank - shift) mod world */
    uint32_t buddy; /* who holds this rank's: (rank + shift) % world */
    bool valid;     /* master, m and v hold owner's shard at `step` */
    uint64_t step;  /* of the replica: the holder's own step while valid */
    bool send_full; /* the next exchange sends this rank's whole shard, not only its gradient */
    float *master, *m, *v, *acc; /* [shard_numel] each: the replica and its gradient */
    float *stage; /* [shard_numel]: a shared master in one array, while a whole shard moves */
    uint64_t last_recovery_step; /* step of the last recovery this daemon took part in */
    zd_job_t *from; /* while the mesh forms: the job of another world this one takes over */
    /* The replica's Adam of the last step, run after the step's reply (zd_replica_idle):
     * buckets [due_bucket, n_buckets) still due, with their group's parameters. */
    zk_adam_params_t *due_p; /* [n_groups] */
    uint32_t due_bucket;
    bool due;
} zd_replica_t;

/* What each rank says of itself when a mesh forms (all-gathered; steps + 1, 0: none). */
typedef struct zd_rep_info {
    uint64_t loaded; /* step + 1 when the rank holds the job's values; 0: fresh */
    uint64_t rep;    /* step + 1 of the valid replica it holds; 0: none */
    uint64_t owner;  /* whose shard that replica is */
    uint64_t host;   /* where it runs: boot id, network namespace, host name */
    /* the job of another world this rank takes over (o_world 0: none) */
    uint64_t o_world, o_rank, o_loaded, o_rep, o_owner;
} zd_rep_info_t;

/* After a mesh formed (every rank, right after the regions are shared): agree on the buddies,
 * and when some rank came back fresh while the others kept the job, send it its shard from its
 * buddy (the job continues at its step), or, with the shard and its buddy both gone, drop the
 * job's values on every rank so that checkpoint_dir's latest checkpoint is loaded at ParamsReady
 * (ZS_ERR_STATE naming both ranks when there is no checkpoint_dir). */
zs_status_t zd_replica_form(zd_job_t *job, const zd_job_env_t *env, char *err, size_t errlen);
/* In a step, before the norm's all-reduce: this rank's reduced gradient (and, once after each
 * formation or change of its values, its shard) to its buddy; its owner's into the replica. */
zs_status_t zd_replica_exchange(zd_job_t *job, char *err, size_t errlen);
/* Group g's Adam parameters of the step for the replica's Adam. */
void zd_replica_adam_params(zd_job_t *job, uint32_t g, const zk_adam_params_t *p);
/* The step's Adam ran on this rank's shard: the replica's is due. zd_replica_idle runs it while
 * the runner has nothing else to do, zd_replica_catch_up before anything reads or overwrites
 * the replica. */
void zd_replica_adam_due(zd_job_t *job);
/* One bucket of the replica's due Adam; false when none was due. */
bool zd_replica_idle(zd_job_t *job);
/* Whatever of the replica's Adam is still due, now. */
zs_status_t zd_replica_catch_up(zd_job_t *job, char *err, size_t errlen);
/* The step committed (job->step moved on): so did the replica. */
void zd_replica_commit(zd_job_t *job);
/* This rank's values changed outside a step (a reload, a checkpoint load): send them whole. */
void zd_replica_resend(zd_job_t *job);
/* The mesh is down: no exchange until it forms again. */
void zd_replica_pause(zd_job_t *job);
/* What Status says of the replicas. */
void zd_replica_status(const zd_job_t *job, zd_job_status_t *st);
void zd_replica_free(zd_job_t *job);

/* ---- job/replica_reshard.c: the job at another world ---------------------------------------- */

/* zd_replica_form when some rank takes over a job of another world (job->rep.from): every old
 * shard from the rank that holds it (its own, or a replica) into the new layout's shards, the
 * common state from the old job; a shard lost with its replica falls back (or fails) as at the
 * same world. */
zs_status_t zd_reshard_settle(zd_job_t *job, const zd_job_env_t *env, const zd_rep_info_t *in,
                              char *err, size_t errlen);

/* ---- job/job_reshape.c ----------------------------------------------------------------------- */

/* Does this attach take the job kept here to another world? replication = buddy, the job's
 * trainers and mesh are gone, the same job id at another world (> 1), a restart. */
bool zd_job_reshape_wanted(const zd_job_t *job, const zd_job_env_t *env, const zd_job_spec_t *spec);
/* A new job of the spec's world and rank takes over *job_p's state in memory, with its
 * peers, when its mesh forms; *job_p becomes it. The old job stays on failure. */
zs_status_t zd_job_reshape(zd_job_t **job_p, const zd_job_env_t *env, const zd_job_spec_t *spec,
                           char *err, size_t errlen);

#endif
