/* The operator's job control on the wire (daemon/src/rpc/rpc_job.c and rpc/rpc.c): JobList answered
 * at once from the published status, JobEnd a control-role request for the engine and its reply,
 * and the Attach fields of a job's life (resume, restart, the trainer's pid, replaced). */
#include "rpc_test.h"

#include <unistd.h>

TestSuite(zd_rpc_job, .init = rpct_setup, .fini = rpct_teardown);

static void nop_notify(void *arg)
{
    (void)arg;
}

ZDT_TEST(zd_rpc_job, job_end_and_job_list_are_the_control_roles)
{
    Zerod__Ipc__V1__JobEnd je = ZEROD__IPC__V1__JOB_END__INIT;
    frame_t f = frame_of(4, ZEROD__IPC__V1__FRAME__BODY_JOB_END, &je);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    expect_closed(&o, 4, ZS_ERR_PERMISSION, "control role only");
}

ZDT_TEST(zd_rpc_job, job_list_from_a_trainer_is_refused)
{
    Zerod__Ipc__V1__JobList jl = ZEROD__IPC__V1__JOB_LIST__INIT;
    frame_t f = frame_of(5, ZEROD__IPC__V1__FRAME__BODY_JOB_LIST, &jl);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    expect_closed(&o, 5, ZS_ERR_PERMISSION, "control role only");
}

ZDT_TEST(zd_rpc_job, job_list_is_answered_here_from_the_published_status)
{
    zd_runner_params_t ep = {.bucket_slots = 4, .threads = 1, .notify = nop_notify};
    Zerod__Ipc__V1__JobList jl = ZEROD__IPC__V1__JOB_LIST__INIT;
    frame_t in = frame_of(8, ZEROD__IPC__V1__FRAME__BODY_JOB_LIST, &jl);
    zd_runner_t *engine = NULL;
    outcome_t o;
    frame_t *f;

    cr_assert_eq(zd_runner_create(&ep, &engine), ZS_OK);
    rpc.runner = engine;
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_ok(sess, &in);
    zd_runner_destroy(engine);
    cr_assert(!o.submitted);
    f = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_JOB_LIST_REPLY, 8);
    expect_result(f->job_list_reply->result, ZS_OK, NULL);
    cr_assert_eq(f->job_list_reply->n_jobs, 0, "a daemon without a job lists none");
}

ZDT_TEST(zd_rpc_job, job_end_goes_to_the_engine_with_the_requesters_rights_and_directory)
{
    Zerod__Ipc__V1__JobEnd je = ZEROD__IPC__V1__JOB_END__INIT;
    frame_t f = frame_of(9, ZEROD__IPC__V1__FRAME__BODY_JOB_END, &je);
    zs_cred_t cred = {.uid = 1234, .gid = 99, .n_groups = 1, .groups = {4321}};
    const zd_job_end_req_t *req;
    outcome_t o;
    int fd;

    je.job_id = (char *)"job-x";
    je.checkpoint_dir = (char *)"/tmp/final";
    f.fds = 1;
    zd_rpc_session_set_cred(sess, &cred);
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    fd = queue_dir_fd("/tmp");
    o = send_ok(sess, &f);
    req = &queued(&o, ZD_REQ_JOB_END, 9)->u.job_end;
    cr_assert_str_eq(req->job_id, "job-x");
    cr_assert(!req->all);
    cr_assert_str_eq(req->ckpt_dir, "/tmp/final");
    cr_assert_eq(req->ckpt_dir_fd, fd, "the queued directory goes with the request");
    cr_assert_eq(fdq.n, 0u, "and leaves the connection's queue");
    cr_assert_eq(req->cred->uid, 1234);
    cr_assert_eq(req->cred->groups[0], 4321);
}

ZDT_TEST(zd_rpc_job, a_directory_request_without_its_descriptor_closes_the_connection)
{
    Zerod__Ipc__V1__JobEnd je = ZEROD__IPC__V1__JOB_END__INIT;
    frame_t f = frame_of(9, ZEROD__IPC__V1__FRAME__BODY_JOB_END, &je);
    zs_cred_t cred = {.uid = 1234, .gid = 99};
    outcome_t o;

    je.job_id = (char *)"job-x";
    je.checkpoint_dir = (char *)"/tmp/final";
    zd_rpc_session_set_cred(sess, &cred);
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_frame(sess, &f); /* fds 0: a client that passes no directory */
    cr_assert_eq(o.st, ZS_ERR_PROTOCOL);
    cr_assert(o.close && !o.submitted);
    cr_assert(strstr(why, "needs 1") != NULL, "%s", why);
    f.fds = 1; /* says one came, none did */
    o = send_frame(sess, &f);
    cr_assert_eq(o.st, ZS_ERR_PROTOCOL);
    cr_assert(o.close && !o.submitted);
}

ZDT_TEST(zd_rpc_job, a_descriptor_on_a_request_that_names_no_directory_closes_the_connection)
{
    Zerod__Ipc__V1__JobEnd je = ZEROD__IPC__V1__JOB_END__INIT;
    frame_t f = frame_of(9, ZEROD__IPC__V1__FRAME__BODY_JOB_END, &je);
    zs_cred_t cred = {.uid = 1234, .gid = 99};
    outcome_t o;

    je.all = true; /* no checkpoint_dir */
    f.fds = 1;
    zd_rpc_session_set_cred(sess, &cred);
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    queue_dir_fd("/tmp");
    o = send_frame(sess, &f);
    cr_assert_eq(o.st, ZS_ERR_PROTOCOL);
    cr_assert(o.close && !o.submitted);
}

ZDT_TEST(zd_rpc_job, job_end_result_is_a_job_end_reply)
{
    zd_resp_t *r = resp_of(ZD_REQ_JOB_END, 10, ZS_OK, NULL);
    frame_t *f;

    snprintf(r->u.job_end.job_id, sizeof(r->u.job_end.job_id), "job-x");
    snprintf(r->u.job_end.ckpt_path, sizeof(r->u.job_end.ckpt_path), "/tmp/final/global_step7");
    r->u.job_end.step = 7;
    r->u.job_end.rank = 1;
    r->u.job_end.world = 2;
    r->u.job_end.peers_told = true;
    f = reply_frame(track_reply(zd_rpc_result(sess, r)), ZEROD__IPC__V1__FRAME__BODY_JOB_END_REPLY,
                    10);
    expect_result(f->job_end_reply->result, ZS_OK, NULL);
    cr_assert_str_eq(f->job_end_reply->job_id, "job-x");
    cr_assert_str_eq(f->job_end_reply->checkpoint, "/tmp/final/global_step7");
    cr_assert_eq(f->job_end_reply->step, 7);
    cr_assert_eq(f->job_end_reply->rank, 1);
    cr_assert_eq(f->job_end_reply->world, 2);
    cr_assert(f->job_end_reply->peers_told);
}

static void attach_frame(Zerod__Ipc__V1__Attach *at, Zerod__Ipc__V1__Group *g,
                         Zerod__Ipc__V1__Group **groups, uint64_t *numel)
{
    numel[0] = 4;
    g->n_numel = 1;
    g->numel = numel;
    groups[0] = g;
    at->job_id = (char *)"j";
    at->world = 1;
    at->n_groups = 1;
    at->groups = groups;
}

ZDT_TEST(zd_rpc_job, attach_carries_resume_restart_and_the_trainers_pid)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *groups[1];
    uint64_t numel[1];
    frame_t f = frame_of(12, ZEROD__IPC__V1__FRAME__BODY_ATTACH, &at);
    const zd_job_spec_t *spec;
    outcome_t o;

    attach_frame(&at, &g, groups, numel);
    at.resume = ZEROD__IPC__V1__RESUME__RESUME_AUTO;
    at.restart = true;
    zd_rpc_session_set_pid(sess, 4321);
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_ok(sess, &f);
    spec = &queued(&o, ZD_REQ_ATTACH, 12)->u.attach;
    cr_assert_eq(spec->resume, ZD_RESUME_AUTO);
    cr_assert(spec->restart);
    cr_assert_eq(spec->trainer_pid, 4321);
}

ZDT_TEST(zd_rpc_job, attach_with_an_unknown_resume_is_refused_in_an_attach_reply)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *groups[1];
    uint64_t numel[1];
    frame_t f = frame_of(13, ZEROD__IPC__V1__FRAME__BODY_ATTACH, &at);
    outcome_t o;
    frame_t *r;

    attach_frame(&at, &g, groups, numel);
    at.resume = (Zerod__Ipc__V1__Resume)7;
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    cr_assert_eq(o.st, ZS_ERR_INVALID, "%s: %s", zs_status_name(o.st), why);
    cr_assert(!o.submitted && !o.close);
    r = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 13);
    expect_result(r->attach_reply->result, ZS_ERR_INVALID, "resume 7");
}

ZDT_TEST(zd_rpc_job, attach_reply_says_what_it_replaced)
{
    zd_resp_t *r = resp_of(ZD_REQ_ATTACH, 14, ZS_OK, NULL);
    frame_t *f;

    r->u.attach.n_slots = 2;
    snprintf(r->u.attach.replaced, sizeof(r->u.attach.replaced), "job 'j' at step 3, kept 1 s");
    f = reply_frame(track_reply(zd_rpc_result(sess, r)), ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY,
                    14);
    cr_assert_str_eq(f->attach_reply->replaced, "job 'j' at step 3, kept 1 s");
}
