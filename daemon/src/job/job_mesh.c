/*
 * The mesh of a world > 1 job (job/job.h): forming it at an attach (bounded by mesh_timeout), the
 * agreement on one params region for the ranks on a host, and its teardown when it fails.
 */
#define _GNU_SOURCE
#include "job/job_int.h"
#if defined(ZD_HAVE_NCCL)
#include "coll/coll_nccl.h"
#endif
#include "config/daemon_config.h"
#include "mesh/mesh.h"
#include "zs/error.h"

#include <stdio.h>
#include <string.h>

/* ---- the mesh ---------------------------------------------------------------------------- */

/* The mesh aborted (a peer lost, a collective timed out, a trainer gone): tear it down and
 * drop the partial micro-step. The shard stays at the last completed step; every rank's trainer
 * gets ERR_PEER_LOST until it re-attaches, which forms a new mesh. */
void zd_job_mesh_failed(zd_job_t *job, const zd_job_env_t *env)
{
    if (job->mesh == NULL) {
        return;
    }
    if (zd_mesh_ended(job->mesh, job->end_why, sizeof(job->end_why))) {
        job->end_pending = true; /* a peer ended the job: zd_job_ended_by_peer drops it */
    }
    zd_mesh_aborted(job->mesh, job->mesh_why, sizeof(job->mesh_why));
    zd_ckpt_settle(job->ck); /* its writer waits on the mesh's heartbeat: it stops first */
    zd_coll_destroy(job->coll);
    job->coll = NULL;
    zd_mesh_destroy(job->mesh);
    job->mesh = NULL;
    job->mesh_lost = true;
    zd_replica_pause(job);
    zd_step_drop_partial(job);
    zs_warn_limited(env->warn_rl, ZS_SUB_ENGINE,
                    "job '%s' keeps step %llu; its trainers must re-attach (%s)", job->id,
                    (unsigned long long)job->step, job->mesh_why);
}

static zs_status_t zd_job_mesh_create(zd_job_t *job, const zd_job_env_t *env, char *err,
                                      size_t errlen)
{
    zd_mesh_params_t mp;
    uint8_t token[ZD_TOKEN_MAX];
    size_t token_len = 0;
    char what[512];
    zs_status_t st;

    st = zd_mesh_read_token(env->token_file, token, &token_len, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&mp, 0, sizeof(mp));
    mp.job_id = job->id;
    mp.rank = job->rank;
    mp.world = job->world;
    mp.coordinator = job->coordinator;
    mp.layout_hash = job->layout->hash;
    mp.config_hash = job->config_hash;
    mp.step = job->step;
    mp.params_loaded = job->params_loaded;
    mp.replication = env->replication;
    mp.token = token;
    mp.token_len = token_len;
    mp.mesh_timeout_ns = env->mesh_timeout_ns;
    mp.collective_timeout_ns = env->collective_timeout_ns;
    mp.heartbeat_interval_ns = env->heartbeat_interval_ns;
    mp.heartbeat_timeout_ns = env->heartbeat_timeout_ns;
    mp.cancel = env->cancel;
    mp.wake = env->wake;
    mp.wake_arg = env->arg;
    snprintf(what, sizeof(what), "forming the mesh of job '%s' (rank %u of %u, coordinator %s)",
             job->id, job->rank, job->world, job->coordinator);
    env->busy(env->arg, what);
    st = zd_mesh_create(&mp, &job->mesh, err, errlen);
    explicit_bzero(token, sizeof(token));
    return st;
}

/* The daemons agreed on one params region for the job's ranks (rank 0's): ranks > 0 take it
 * in place of their own, which no trainer has mapped yet, and every rank offers its regions
 * again so that the peers' mappings follow. */
static zs_status_t zd_job_take_shared_params(zd_job_t *job, zd_share_params_t *sp, char *err,
                                             size_t errlen)
{
    const zs_region_t *regions[3] = {&job->params, &job->slots, &job->grads};

    job->params_shared = true;
    job->mem_bytes[ZD_MEM_PARAMS] = job->params.size / job->world;
    job->mem_formula[ZD_MEM_PARAMS] /= job->world;
    zs_info(ZS_SUB_ENGINE, "params region: one for the job's %u ranks on this host (rank 0's)",
            job->world);
    if (job->rank > 0) {
        zs_region_cleanup(&job->params);
        job->params = sp->region;
        sp->region = (zs_region_t)ZS_REGION_INIT;
    }
    return zd_coll_share(job->coll, regions, 3, NULL, err, errlen); /* a collective: every rank */
}

/* World 1 on the CUDA backend: a communicator of one, so that the step's reduce-scatter,
 * norm all-reduce and all-gather run on device memory as they will at world > 1. */
static zs_status_t zd_job_nccl_local(zd_job_t *job, const zd_job_env_t *env, char *err,
                                     size_t errlen)
{
#if defined(ZD_HAVE_NCCL)
    uint8_t id[ZD_NCCL_ID_BYTES];
    zs_status_t st = zd_coll_nccl_unique_id(id, err, errlen);

    if (st == ZS_OK) {
        st = zd_coll_nccl_create(0, 1, id, zd_backend_device(job->be), env->collective_timeout_ns,
                                 &job->coll, err, errlen);
    }
    return st;
#else
    (void)job, (void)env;
    return zs_errf(err, errlen, ZS_ERR_UNSUPPORTED, "attach: zerod was built without NCCL");
#endif
}

/* World 1: the local collectives. World > 1: form the mesh (bounded by mesh_timeout) and, when
 * the job already has parameters, redo the all-gather from the master shards. */
zs_status_t zd_job_form_mesh(zd_job_t *job, const zd_job_env_t *env, char *err, size_t errlen)
{
    const zs_region_t *regions[3] = {&job->params, &job->slots, &job->grads};
    zd_share_params_t sp = {.want = false};
    zs_status_t st;

    if (job->coll != NULL) {
        return ZS_OK; /* world 1, or a re-attach that kept the job: the mesh is still up */
    }
    if (job->world == 1 && zd_backend_device(job->be) >= 0) {
        return zd_job_nccl_local(job, env, err, errlen);
    }
    if (job->world == 1) {
        zd_backend_prefault(job->be, &job->params);
        st = zd_coll_local_create(env->exec, &job->coll);
        return st == ZS_OK ? st : zs_errf(err, errlen, st, "attach: out of memory");
    }
    st = zd_job_mesh_create(job, env, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    st = zd_coll_ucx_create(job->mesh, env->exec, env->direct_collectives, &job->coll);
    if (st != ZS_OK) {
        zd_mesh_destroy(job->mesh);
        job->mesh = NULL;
        return zs_errf(err, errlen, st, "attach: cannot create the UCX collectives");
    }
    job->mesh_lost = false;
    job->mesh_why[0] = '\0';
    /* one params region per host: only for a job with no values yet, whose trainers write only
     * their own slices */
    sp.want = job->own_slices_only && !job->params_loaded && !job->params_shared;
    /* with buddy replicas a daemon of the host may come back fresh: each keeps its own region */
    sp.want = sp.want && env->replication == ZD_REPLICATION_OFF;
    st = zd_coll_share(job->coll, regions, 3, &sp, err, errlen);
    if (st == ZS_OK && sp.agreed) {
        st = zd_job_take_shared_params(job, &sp, err, errlen);
    }
    zs_region_cleanup(&sp.region);
    zd_backend_prefault(job->be, &job->params); /* this rank's own, or the host's one */
    if (st == ZS_OK) { /* a fresh rank gets its shard from its buddy here */
        st = zd_replica_form(job, env, err, errlen);
    }
    if (st == ZS_OK && job->params_loaded) {
        st = zd_step_refresh_params(job, err, errlen);
    }
    if (st != ZS_OK) {
        zd_job_mesh_failed(job, env);
    }
    return st;
}
