/*
 * What an operator does to the daemon's job (docs/design-notes.md "A job's life"): end it
 * (`zeroctl job end`, the control role's JobEnd), with an optional final checkpoint, the job's
 * other daemons told over its mesh; and how `zeroctl job ls` names its state. The runner thread
 * alone calls zd_job_end; the attach policy (re-attach, replace, refuse) is job/job_ctl.c's too,
 * behind zd_job_attach.
 */
#ifndef ZD_JOB_CTL_H
#define ZD_JOB_CTL_H

#include "job/job.h"

/* End the job: a final checkpoint first when asked (a failed one leaves the job as it was),
 * then its peers told (mesh up, no checkpoint), its trainer's next call answered ERR_JOB_ENDED
 * (env->ended), and the job dropped (*job_p becomes NULL). ERR_NOT_FOUND when the daemon holds
 * no such job. */
zs_status_t zd_job_end(zd_job_t **job_p, const zd_job_env_t *env, const zd_job_end_req_t *req,
                       zd_job_end_out_t *out, char *err, size_t errlen);

#endif
