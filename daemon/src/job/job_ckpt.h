/*
 * The job's checkpoints as its trainer asks for them (job/job_ckpt.c; ckpt/ckpt.h does the
 * checkpoints): save, wait for a background save, load, and export of the parameters.
 */
#ifndef ZD_JOB_CKPT_H
#define ZD_JOB_CKPT_H

#include "job/job_env.h"
#include "job/job_types.h"
#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

/* Save or load the job's state: a collective of every rank's trainer (docs/checkpoints.md). */
zs_status_t zd_job_ckpt_save(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                             size_t errlen);
zs_status_t zd_job_ckpt_wait(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             zd_ckpt_out_t *out, char *err, size_t errlen);
zs_status_t zd_job_ckpt_load(zd_job_t *job, const zd_job_env_t *env, uint64_t conn,
                             const zd_ckpt_req_t *req, zd_ckpt_out_t *out, char *err,
                             size_t errlen);

/* The job's parameters into one new safetensors file (ckpt/ckpt_export.c). */
zs_status_t zd_job_export(zd_job_t *job, const zd_job_env_t *env, const zd_export_req_t *req,
                          zd_ckpt_out_t *out, char *err, size_t errlen);

#endif
