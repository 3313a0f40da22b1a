/*
 * The daemon's job as an operator sees it (zerod/zc_control.h "the daemon's job"): which job a
 * daemon holds, and ending it (`zeroctl job ls`, `zeroctl job end`). The session keeps each
 * reply (zc_session_keep), so that the strings handed out stay valid until the next call of
 * the same kind.
 */
#include "zc_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ZC_JOB_INFO_FIELDS (ZC_JOB_INFO_FIELD_JOB | ZC_JOB_INFO_FIELD_LIFE)

/* ipc.proto Resume carries zc_resume_t's values (attach.c sends it as it is) */
_Static_assert(ZEROD__IPC__V1__RESUME__RESUME_IF_KEPT == (int)ZC_RESUME_IF_KEPT &&
                   ZEROD__IPC__V1__RESUME__RESUME_AUTO == (int)ZC_RESUME_AUTO &&
                   ZEROD__IPC__V1__RESUME__RESUME_NEVER == (int)ZC_RESUME_NEVER &&
                   ZEROD__IPC__V1__RESUME__RESUME_MUST == (int)ZC_RESUME_MUST,
               "ipc.proto Resume and zc_resume_t differ");

static const char *zc_job_str(const char *s)
{
    return s != NULL ? s : "";
}

ZC_API int zc_session_job_list(zc_session_t *session, int timeout_ms, uint32_t *n_jobs_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__JobList jl = ZEROD__IPC__V1__JOB_LIST__INIT;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    if (session == NULL || n_jobs_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "job list: %s is NULL",
                       session == NULL ? "session" : "n_jobs_p");
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_JOB_LIST;
    req.job_list = &jl;
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_JOB_LIST_REPLY, timeout_ms,
                             "job list", &reply);
    if (status != ZC_OK) {
        return status;
    }
    *n_jobs_p = (uint32_t)reply->job_list_reply->n_jobs;
    zc_session_keep(session, ZC_KEPT_JOB_LIST, reply);
    return ZC_OK;
}

ZC_API int zc_session_job_info(zc_session_t *session, uint32_t i, zc_job_info_t *info_p)
{
    const Zerod__Ipc__V1__JobInfo *j;
    const zc_frame_t *kept;
    uint64_t want;

    if (session == NULL || info_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "job info: %s is NULL",
                       session == NULL ? "session" : "info_p");
    }
    kept = zc_session_kept(session, ZC_KEPT_JOB_LIST);
    if (kept == NULL) {
        return zc_fail(ZC_ERR_STATE, "job info: no zc_session_job_list() yet");
    }
    if (i >= kept->job_list_reply->n_jobs) {
        return zc_fail(ZC_ERR_INVALID, "job info: job %u is not below %zu", i,
                       kept->job_list_reply->n_jobs);
    }
    j = kept->job_list_reply->jobs[i];
    want = info_p->field_mask & ZC_JOB_INFO_FIELDS;
    if (want & ZC_JOB_INFO_FIELD_JOB) {
        info_p->job_id = zc_job_str(j->job_id);
        info_p->rank = j->rank;
        info_p->world = j->world;
        info_p->step = j->step;
        info_p->coordinator = zc_job_str(j->coordinator);
    }
    if (want & ZC_JOB_INFO_FIELD_LIFE) {
        info_p->state = zc_job_str(j->state);
        info_p->age_s = j->age_s;
        info_p->idle_s = j->idle_s;
        info_p->linger_left_s = j->linger_left_s;
        info_p->trainer_pid = j->trainer_pid;
        info_p->mesh_up = j->mesh_up ? 1 : 0;
    }
    info_p->field_mask = want;
    return ZC_OK;
}

static void zc_job_end_fill(const Zerod__Ipc__V1__JobEndReply *r, zc_job_end_result_t *res)
{
    uint64_t want = res->field_mask & ZC_JOB_END_FIELD_RESULT;

    if (want & ZC_JOB_END_FIELD_RESULT) {
        res->job_id = zc_job_str(r->job_id);
        res->rank = r->rank;
        res->world = r->world;
        res->step = r->step;
        res->checkpoint = zc_job_str(r->checkpoint);
        res->peers_told = r->peers_told ? 1 : 0;
    }
    res->field_mask = want;
}

ZC_API int zc_session_job_end(zc_session_t *session, const char *job_id,
                              const zc_job_end_params_t *params, zc_job_end_result_t *result_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__JobEnd je = ZEROD__IPC__V1__JOB_END__INIT;
    uint64_t mask = params != NULL ? params->field_mask : 0;
    zc_frame_t *reply = NULL;
    char abs[4096];
    int status, fd = -1;

    zc_error_clear();
    if (session == NULL) {
        return zc_fail(ZC_ERR_INVALID, "job end: session is NULL");
    }
    if ((mask & ZC_JOB_END_FIELD_CHECKPOINT_DIR) && params->checkpoint_dir != NULL &&
        params->checkpoint_dir[0] != '\0') { /* the daemon saves into it with our rights */
        status = zc_dir_open("job end", params->checkpoint_dir, true, abs, sizeof(abs), &fd);
        if (status != ZC_OK) {
            return status;
        }
        je.checkpoint_dir = abs;
    }
    je.all = job_id == NULL;
    je.job_id = (char *)(job_id != NULL ? job_id : "");
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_JOB_END;
    req.job_end = &je;
    status = zc_session_call_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_JOB_END_REPLY,
                                (mask & ZC_JOB_END_FIELD_TIMEOUT_MS) ? params->timeout_ms : -1,
                                "job end", &reply);
    if (fd >= 0) {
        close(fd);
    }
    if (status != ZC_OK) {
        return status;
    }
    zc_session_keep(session, ZC_KEPT_JOB_END, reply);
    if (result_p != NULL) {
        zc_job_end_fill(reply->job_end_reply, result_p);
    }
    return ZC_OK;
}
