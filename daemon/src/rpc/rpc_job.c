/*
 * The operator's job control on the wire (ipc.proto JobList, JobEnd; `zeroctl job`): the list
 * is answered on the loop from the runner's published status, the end is the runner's
 * (job/job_ctl.c). Part of rpc.
 */
#include "rpc/rpc_int.h"
#include "zs/time.h"

#include <stdio.h>

static double zd_rpc_secs(uint64_t from_ns, uint64_t to_ns)
{
    return from_ns != 0 && to_ns > from_ns ? (double)(to_ns - from_ns) * 1e-9 : 0.0;
}

static void zd_rpc_job_info(const zd_job_status_t *j, Zerod__Ipc__V1__JobInfo *ji)
{
    uint64_t now = zs_time_now_ns();

    ji->job_id = (char *)j->job_id;
    ji->rank = j->rank;
    ji->world = j->world;
    ji->step = j->step;
    ji->state = (char *)zd_job_state_name(j);
    ji->age_s = zd_rpc_secs(j->created_ns, now);
    ji->idle_s = j->trainer_attached ? 0 : zd_rpc_secs(j->released_ns, now);
    ji->linger_left_s = j->trainer_attached ? 0 : zd_rpc_secs(now, j->linger_until_ns);
    ji->trainer_pid = j->trainer_pid;
    ji->coordinator = (char *)j->coordinator;
    ji->mesh_up = j->mesh_up;
}

zd_reply_t *zd_rpc_job_list(const zd_rpc_t *rpc, uint64_t seq)
{
    static zd_runner_status_t st; /* the loop thread only */
    Zerod__Ipc__V1__Frame out = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__JobListReply lr = ZEROD__IPC__V1__JOB_LIST_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(ZS_OK, NULL);
    Zerod__Ipc__V1__JobInfo ji = ZEROD__IPC__V1__JOB_INFO__INIT;
    Zerod__Ipc__V1__JobInfo *jobs[1] = {&ji};

    zd_runner_status_get(rpc->runner, &st);
    lr.result = &r;
    if (st.has_job) {
        zd_rpc_job_info(&st.job, &ji);
        lr.n_jobs = 1;
        lr.jobs = jobs;
    }
    out.seq = seq;
    out.body_case = ZEROD__IPC__V1__FRAME__BODY_JOB_LIST_REPLY;
    out.job_list_reply = &lr;
    return zd_rpc_pack(&out);
}

zd_reply_t *zd_rpc_job_end_reply(const zd_resp_t *resp, Zerod__Ipc__V1__Result *r)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__JobEndReply er = ZEROD__IPC__V1__JOB_END_REPLY__INIT;
    const zd_job_end_out_t *o = &resp->u.job_end;

    er.result = r;
    er.job_id = (char *)o->job_id;
    er.step = o->step;
    er.checkpoint = (char *)o->ckpt_path;
    er.peers_told = o->peers_told;
    er.rank = o->rank;
    er.world = o->world;
    f.seq = resp->seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_JOB_END_REPLY;
    f.job_end_reply = &er;
    return zd_rpc_pack(&f);
}
