/*
 * A job kept here that its launcher restarts at another world (job/replica.h; docs/design-notes.md
 * "Buddy replicas"): with replication = buddy its daemons' memories hold every shard, so a new job
 * of the new world and rank takes the old one's state over when its mesh forms
 * (job/replica_reshard.c), and replaces it.
 */
#define _GNU_SOURCE
#include "config/daemon_config.h"
#include "job/job_int.h"
#include "zs/error.h"
#include "zs/log.h"

#include <stdio.h>
#include <string.h>

bool zd_job_reshape_wanted(const zd_job_t *job, const zd_job_env_t *env, const zd_job_spec_t *spec)
{
    bool restart = spec->restart || (spec->resume != ZD_RESUME_AUTO);

    return job != NULL && env->replication == ZD_REPLICATION_BUDDY && job->mesh == NULL &&
           job->attached_conn == 0 && job->params_loaded && spec->job_id != NULL &&
           strcmp(job->id, spec->job_id) == 0 && spec->world != job->world && spec->world > 1 &&
           spec->resume != ZD_RESUME_NEVER && restart;
}

zs_status_t zd_job_reshape(zd_job_t **job_p, const zd_job_env_t *env, const zd_job_spec_t *spec,
                           char *err, size_t errlen)
{
    zd_job_t *old = *job_p, *job = NULL;
    zs_status_t st = zd_job_create(spec, env, &job, err, errlen);

    if (st == ZS_OK && (job->config_hash != old->config_hash || job->dtype != old->dtype)) {
        st = zs_errf(err, errlen, ZS_ERR_CONFIG,
                     "job '%s' at world %u: config hash 0x%016llx (dtype %s), but the job kept "
                     "here has 0x%016llx (dtype %s)",
                     spec->job_id, spec->world, (unsigned long long)job->config_hash,
                     zs_dtype_name(job->dtype), (unsigned long long)old->config_hash,
                     zs_dtype_name(old->dtype));
    }
    if (st != ZS_OK) {
        zd_job_destroy(job);
        return st;
    }
    zs_log_set_rank((int)job->rank);
    zd_trace_begin(job->trace, job->id, job->rank, job->world);
    job->rep.from = old;
    st = zd_job_form_mesh(job, env, err, errlen);
    job->rep.from = NULL;
    if (st != ZS_OK) {
        zs_warn(ZS_SUB_ENGINE, "job '%s' cannot go on at world %u: %s", job->id, job->world, err);
        zd_job_destroy(job);
        zs_log_set_rank((int)old->rank);
        return st;
    }
    zs_info(ZS_SUB_ENGINE, "job '%s' (rank %u of %u) goes on as rank %u of %u at step %llu",
            old->id, old->rank, old->world, job->rank, job->world, (unsigned long long)job->step);
    zd_job_destroy(old);
    *job_p = job;
    return ZS_OK;
}
