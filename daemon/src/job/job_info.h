/*
 * What a job says about itself (job/job_info.c): its status for `zeroctl status` and the metrics,
 * and its shard for `zeroctl shard`.
 */
#ifndef ZD_JOB_INFO_H
#define ZD_JOB_INFO_H

#include "job/job_types.h"
#include "zs/status.h"

#include <stddef.h>

/* Free what a zd_job_shard_info() allocated in *out (groups, training_config); NULLs them. */
void zd_shard_out_free(zd_shard_out_t *out);

/* The job's status as Status and the metrics show it (a NULL job: none). */
void zd_job_status(const zd_job_t *job, zd_job_status_t *status_p);
/* This rank's shard: its layout, groups, training config and master (`zeroctl shard`). */
zs_status_t zd_job_shard_info(const zd_job_t *job, zd_shard_out_t *out, char *err, size_t errlen);

#endif
