/* rpc (daemon/src/rpc/rpc.c), the one file that knows ipc.proto: what it answers itself (Hello,
 * Status, malformed or forbidden frames), what each request frame becomes for the engine, and
 * the reply frame of each engine result (rpc_test.h drives it without a socket or an engine). */
#include "rpc_test.h"
#include "zs/layout.h"
#include "zs/version.h"

#include <fcntl.h>
#include <unistd.h>

TestSuite(zd_rpc, .init = rpct_setup, .fini = rpct_teardown);

/* ---- what is answered here ------------------------------------------------------------------ */

ZDT_TEST(zd_rpc, hello_is_answered_here_with_the_daemons_terms)
{
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    frame_t in = frame_of(41, ZEROD__IPC__V1__FRAME__BODY_HELLO, &h);
    outcome_t o;
    frame_t *f;

    h.protocol = ZD_IPC_PROTOCOL;
    h.role = ZEROD__IPC__V1__ROLE__ROLE_TRAINER;
    o = send_ok(sess, &in);
    cr_assert(!o.submitted);
    cr_assert_eq(n_reqs, 0);
    f = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY, 41);
    expect_result(f->hello_reply->result, ZS_OK, NULL);
    cr_assert_eq(f->hello_reply->protocol, ZD_IPC_PROTOCOL);
    cr_assert_str_eq(f->hello_reply->version, ZS_VERSION);
    cr_assert_str_eq(f->hello_reply->device, "cpu (test)");
    cr_assert_eq(f->hello_reply->peer_deadline_ms, 4321);
    cr_assert_eq(f->hello_reply->pid, getpid());
}

ZDT_TEST(zd_rpc, a_request_before_hello_is_refused_and_closes)
{
    Zerod__Ipc__V1__Step step = ZEROD__IPC__V1__STEP__INIT;
    frame_t f = frame_of(5, ZEROD__IPC__V1__FRAME__BODY_STEP, &step);
    outcome_t o = send_frame(sess, &f);

    expect_closed(&o, 5, ZS_ERR_PROTOCOL, "before hello");
}

ZDT_TEST(zd_rpc, hello_twice_is_refused_and_closes)
{
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    frame_t f = frame_of(9, ZEROD__IPC__V1__FRAME__BODY_HELLO, &h);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    h.protocol = ZD_IPC_PROTOCOL;
    h.role = ZEROD__IPC__V1__ROLE__ROLE_CONTROL;
    o = send_frame(sess, &f);
    expect_closed(&o, 9, ZS_ERR_PROTOCOL, "sent twice");
}

ZDT_TEST(zd_rpc, hello_of_another_protocol_is_refused_naming_both)
{
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    frame_t f = frame_of(3, ZEROD__IPC__V1__FRAME__BODY_HELLO, &h);
    outcome_t o;

    h.protocol = ZD_IPC_PROTOCOL + 1;
    h.role = ZEROD__IPC__V1__ROLE__ROLE_TRAINER;
    o = send_frame(sess, &f);
    expect_closed(&o, 3, ZS_ERR_VERSION, "daemon speaks protocol");
}

ZDT_TEST(zd_rpc, a_payload_that_is_no_frame_is_refused_and_closes)
{
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    outcome_t o = send_payload(sess, junk, sizeof(junk));

    expect_closed(&o, 0, ZS_ERR_PROTOCOL, "not a valid zerod.ipc.v1.Frame");
}

ZDT_TEST(zd_rpc, a_trainer_request_from_a_control_connection_is_refused)
{
    Zerod__Ipc__V1__Detach d = ZEROD__IPC__V1__DETACH__INIT;
    frame_t f = frame_of(4, ZEROD__IPC__V1__FRAME__BODY_DETACH, &d);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_frame(sess, &f);
    expect_closed(&o, 4, ZS_ERR_PERMISSION, "trainer role only");
}

ZDT_TEST(zd_rpc, a_control_request_from_a_trainer_connection_is_refused)
{
    Zerod__Ipc__V1__ShardInfoRequest si = ZEROD__IPC__V1__SHARD_INFO_REQUEST__INIT;
    frame_t f = frame_of(4, ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO, &si);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    expect_closed(&o, 4, ZS_ERR_PERMISSION, "control role only");
}

ZDT_TEST(zd_rpc, a_reply_sent_as_a_request_is_refused)
{
    Zerod__Ipc__V1__StepReply sr = ZEROD__IPC__V1__STEP_REPLY__INIT;
    frame_t f = frame_of(6, ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY, &sr);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    expect_closed(&o, 6, ZS_ERR_PROTOCOL, "not a request");
}

static void nop_notify(void *arg)
{
    (void)arg;
}

ZDT_TEST(zd_rpc, status_is_answered_here_from_the_published_status)
{
    zd_runner_params_t ep = {.bucket_slots = 4, .threads = 1, .notify = nop_notify};
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;
    frame_t in = frame_of(8, ZEROD__IPC__V1__FRAME__BODY_STATUS, &sr);
    zd_runner_t *engine = NULL;
    outcome_t o;
    frame_t *f;

    cr_assert_eq(zd_runner_create(&ep, &engine), ZS_OK);
    rpc.runner = engine;
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_ok(sess, &in);
    zd_runner_destroy(engine);
    cr_assert(!o.submitted);
    f = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY, 8);
    expect_result(f->status_reply->result, ZS_OK, NULL);
    cr_assert(!f->status_reply->has_job);
    cr_assert_str_eq(f->status_reply->version, ZS_VERSION);
    cr_assert_str_eq(f->status_reply->device, "cpu (test)");
    cr_assert_str_eq(f->status_reply->socket, "/run/zerod/test.sock");
    cr_assert_eq(f->status_reply->pid, getpid());
    cr_assert_geq(f->status_reply->uptime_s, 0.0);
    cr_assert_eq(f->status_reply->n_memory, 0, "memory terms without a job");
}

/* ---- what goes to the engine ---------------------------------------------------------------- */

ZDT_TEST(zd_rpc, attach_decodes_into_a_job_spec)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g0 = ZEROD__IPC__V1__GROUP__INIT, g1 = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *groups[] = {&g0, &g1};
    uint64_t numel0[] = {10, 20, 30}, numel1[] = {7};
    frame_t f = frame_of(12, ZEROD__IPC__V1__FRAME__BODY_ATTACH, &at);
    const zd_job_spec_t *spec;
    outcome_t o;

    g0.n_numel = 3;
    g0.numel = numel0;
    g1.n_numel = 1;
    g1.numel = numel1;
    g1.options_json = (char *)"{\"lr\": 0.5}";
    at.job_id = (char *)"job-a";
    at.rank = 2;
    at.world = 4;
    at.coordinator = (char *)"10.0.0.1:2900";
    at.dtype = ZEROD__IPC__V1__DTYPE__DTYPE_BF16;
    at.n_groups = 2;
    at.groups = groups;
    at.config_json = (char *)"{\"bf16\": {\"enabled\": true}}";
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_ok(sess, &f);
    spec = &queued(&o, ZD_REQ_ATTACH, 12)->u.attach;
    cr_assert_str_eq(spec->job_id, "job-a");
    cr_assert_eq(spec->rank, 2);
    cr_assert_eq(spec->world, 4);
    cr_assert_str_eq(spec->coordinator, "10.0.0.1:2900");
    cr_assert_eq(spec->dtype, ZS_DTYPE_BF16);
    cr_assert_eq(spec->n_groups, 2);
    cr_assert_eq(spec->group_n_params[0], 3);
    cr_assert_eq(spec->group_n_params[1], 1);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(spec->numel[i], numel0[i], "numel[%d]", i);
    }
    cr_assert_eq(spec->numel[3], 7, "numel is group-major");
    cr_assert_str_eq(spec->group_json[0], "");
    cr_assert_str_eq(spec->group_json[1], "{\"lr\": 0.5}");
    cr_assert_str_eq(spec->config_json, "{\"bf16\": {\"enabled\": true}}");
}

/* An Attach refused before the engine sees it: its own AttachReply, the connection kept. */
static void expect_attach_refused(const Zerod__Ipc__V1__Attach *at, const char *needle)
{
    frame_t f = frame_of(13, ZEROD__IPC__V1__FRAME__BODY_ATTACH, (void *)at);
    outcome_t o;
    frame_t *r;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    cr_assert_eq(o.st, ZS_ERR_INVALID, "%s: %s", zs_status_name(o.st), why);
    cr_assert(!o.submitted && !o.close);
    cr_assert_eq(n_reqs, 0);
    r = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 13);
    expect_result(r->attach_reply->result, ZS_ERR_INVALID, needle);
    cr_assert_eq(r->attach_reply->n_slots, 0);
}

ZDT_TEST(zd_rpc, attach_without_groups_is_refused_in_an_attach_reply)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;

    at.job_id = (char *)"j";
    at.world = 1;
    expect_attach_refused(&at, "groups has 0 entries");
}

ZDT_TEST(zd_rpc, attach_with_more_groups_than_the_limit_is_refused)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    size_t n = ZS_LAYOUT_MAX_GROUPS + 1;
    Zerod__Ipc__V1__Group *one = malloc(sizeof(*one));
    Zerod__Ipc__V1__Group **groups = malloc(n * sizeof(*groups));

    cr_assert(one != NULL && groups != NULL);
    zerod__ipc__v1__group__init(one);
    for (size_t g = 0; g < n; g++) {
        groups[g] = one;
    }
    at.job_id = (char *)"j";
    at.world = 1;
    at.n_groups = n;
    at.groups = groups;
    expect_attach_refused(&at, "allowed 1..4096");
    free(groups);
    free(one);
}

ZDT_TEST(zd_rpc, attach_with_an_unknown_dtype_is_refused_in_an_attach_reply)
{
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *groups[] = {&g};
    uint64_t numel[] = {4};

    g.n_numel = 1;
    g.numel = numel;
    at.job_id = (char *)"j";
    at.world = 1;
    at.n_groups = 1;
    at.groups = groups;
    at.dtype = (Zerod__Ipc__V1__DType)7;
    expect_attach_refused(&at, "dtype 7");
}

ZDT_TEST(zd_rpc, params_ready_goes_to_the_engine)
{
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    frame_t f = frame_of(20, ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY, &pr);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_ok(sess, &f);
    queued(&o, ZD_REQ_PARAMS_READY, 20);
}

ZDT_TEST(zd_rpc, bucket_ready_decodes_slot_bucket_and_micro_step)
{
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    frame_t f = frame_of(21, ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY, &br);
    zd_req_t *req;
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    br.slot = 3;
    br.bucket = 1234;
    br.micro_step = 5;
    o = send_ok(sess, &f);
    req = queued(&o, ZD_REQ_BUCKET_READY, 21);
    cr_assert_eq(req->u.bucket_ready.slot, 3);
    cr_assert_eq(req->u.bucket_ready.bucket, 1234);
    cr_assert_eq(req->u.bucket_ready.micro_step, 5);
}

ZDT_TEST(zd_rpc, step_decodes_its_group_learning_rates)
{
    Zerod__Ipc__V1__Step st = ZEROD__IPC__V1__STEP__INIT;
    double lr[] = {0.25, 1e-3, 0};
    frame_t f = frame_of(22, ZEROD__IPC__V1__FRAME__BODY_STEP, &st);
    zd_req_t *req;
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    st.n_group_lr = 3;
    st.group_lr = lr;
    o = send_ok(sess, &f);
    req = queued(&o, ZD_REQ_STEP, 22);
    cr_assert_eq(req->u.step.n_group_lr, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(req->u.step.group_lr[i], lr[i], "group_lr[%d] (bit-exact: a double copied)",
                     i);
    }
}

ZDT_TEST(zd_rpc, step_without_learning_rates_keeps_the_configured_ones)
{
    Zerod__Ipc__V1__Step st = ZEROD__IPC__V1__STEP__INIT;
    frame_t f = frame_of(23, ZEROD__IPC__V1__FRAME__BODY_STEP, &st);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_ok(sess, &f);
    cr_assert_eq(queued(&o, ZD_REQ_STEP, 23)->u.step.n_group_lr, 0);
}

ZDT_TEST(zd_rpc, detach_decodes_end_job)
{
    Zerod__Ipc__V1__Detach d = ZEROD__IPC__V1__DETACH__INIT;
    frame_t f = frame_of(24, ZEROD__IPC__V1__FRAME__BODY_DETACH, &d);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_ok(sess, &f);
    cr_assert(!queued(&o, ZD_REQ_DETACH, 24)->u.detach.end_job);
    d.end_job = true;
    f.seq = 25;
    o = send_ok(sess, &f);
    cr_assert(queued(&o, ZD_REQ_DETACH, 25)->u.detach.end_job);
}

ZDT_TEST(zd_rpc, shard_info_from_control_goes_to_the_engine)
{
    Zerod__Ipc__V1__ShardInfoRequest si = ZEROD__IPC__V1__SHARD_INFO_REQUEST__INIT;
    frame_t f = frame_of(26, ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO, &si);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_ok(sess, &f);
    queued(&o, ZD_REQ_SHARD_INFO, 26);
}

ZDT_TEST(zd_rpc, closing_a_trainer_connection_tells_the_engine)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    zd_rpc_closed(&rpc, sess);
    cr_assert_eq(n_reqs, 1);
    cr_assert_eq(reqs[0]->kind, ZD_REQ_DISCONNECT);
    cr_assert_eq(reqs[0]->conn_id, 7);
}

ZDT_TEST(zd_rpc, closing_a_control_or_silent_connection_tells_no_one)
{
    zd_rpc_session_t *control = zd_rpc_session_create(8);

    cr_assert_not_null(control);
    zd_rpc_closed(&rpc, sess); /* no Hello: never held a trainer */
    hello(control, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    zd_rpc_closed(&rpc, control);
    zd_rpc_session_destroy(control);
    cr_assert_eq(n_reqs, 0);
}

/* ---- results out ---------------------------------------------------------------------------- */

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

ZDT_TEST(zd_rpc, attach_result_encodes_every_field_and_hands_over_its_fds)
{
    zd_resp_t *r = resp_of(ZD_REQ_ATTACH, 50, ZS_OK, NULL);
    zd_attach_out_t *a = &r->u.attach;
    Zerod__Ipc__V1__AttachReply *ar;
    zd_reply_t *reply;
    int fds[3];

    for (int i = 0; i < 3; i++) {
        fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        cr_assert_geq(fds[i], 0);
    }
    *a = (zd_attach_out_t){.layout_hash = 0x1122334455667788ull,
                           .step = 17,
                           .resumed = true,
                           .loss_scale = 1024,
                           .n_slots = 6,
                           .slot_bytes = 4096,
                           .params_bytes = 1 << 20,
                           .grads_bytes = 1 << 21,
                           .stage = 1,
                           .gradient_accumulation_steps = 4,
                           .config_hash = 0xfeedull,
                           .bucket_size = 500,
                           .round_robin = true,
                           .elem_align = 16,
                           .fds = {fds[0], fds[1], fds[2]},
                           .n_fds = 3};
    reply = track_reply(zd_rpc_result(sess, r));
    ar = reply_frame(reply, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 50)->attach_reply;
    expect_result(ar->result, ZS_OK, NULL);
    cr_assert_eq(ar->layout_hash, 0x1122334455667788ull);
    cr_assert_eq(ar->step, 17);
    cr_assert(ar->resumed);
    cr_assert_eq(ar->loss_scale, 1024.0);
    cr_assert_eq(ar->n_slots, 6);
    cr_assert_eq(ar->slot_bytes, 4096);
    cr_assert_eq(ar->params_bytes, 1 << 20);
    cr_assert_eq(ar->grads_bytes, 1 << 21);
    cr_assert_eq(ar->stage, 1);
    cr_assert_eq(ar->gradient_accumulation_steps, 4);
    cr_assert_eq(ar->config_hash, 0xfeedull);
    cr_assert_eq(ar->bucket_size, 500);
    cr_assert(ar->round_robin);
    cr_assert_eq(ar->elem_align, 16);
    cr_assert_eq(reply->n_fds, 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(reply->fds[i], fds[i], "fd %d", i);
        cr_assert(fd_open(fds[i]), "fd %d was closed with the result", i);
    }
    replies[--n_replies] = NULL;
    zd_reply_free(reply);
    for (int i = 0; i < 3; i++) {
        cr_assert(!fd_open(fds[i]), "fd %d outlived its reply", i);
    }
}

ZDT_TEST(zd_rpc, a_refused_attach_result_carries_no_fds_and_the_message)
{
    zd_resp_t *r = resp_of(ZD_REQ_ATTACH, 51, ZS_ERR_LAYOUT_MISMATCH, "layout hash differs");
    Zerod__Ipc__V1__AttachReply *ar;
    zd_reply_t *reply;

    r->u.attach.n_slots = 4;
    reply = track_reply(zd_rpc_result(sess, r));
    cr_assert_not_null(reply);
    cr_assert_eq(reply->n_fds, 0);
    ar = reply_frame(reply, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 51)->attach_reply;
    expect_result(ar->result, ZS_ERR_LAYOUT_MISMATCH, "layout hash differs");
    cr_assert_eq(ar->n_slots, 0, "a refused attach tells its slot count");
}

ZDT_TEST(zd_rpc, step_result_encodes_step_skip_norm_and_scale)
{
    zd_resp_t *r = resp_of(ZD_REQ_STEP, 52, ZS_OK, NULL);
    Zerod__Ipc__V1__StepReply *sr;

    r->u.step = (zd_step_out_t){
        .step = 9, .skipped = true, .grad_norm = -1, .loss_scale = 32768, .skipped_steps = 3};
    sr =
        reply_frame(track_reply(zd_rpc_result(sess, r)), ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY, 52)
            ->step_reply;
    expect_result(sr->result, ZS_OK, NULL);
    cr_assert_eq(sr->step, 9);
    cr_assert(sr->skipped);
    cr_assert_eq(sr->grad_norm, -1.0);
    cr_assert_eq(sr->loss_scale, 32768.0);
    cr_assert_eq(sr->skipped_steps, 3);
}

ZDT_TEST(zd_rpc, shard_info_result_encodes_every_group)
{
    zd_resp_t *r = resp_of(ZD_REQ_SHARD_INFO, 53, ZS_OK, NULL);
    zd_shard_out_t *o = &r->u.shard;
    Zerod__Ipc__V1__ShardInfoReply *si;

    snprintf(o->job_id, sizeof(o->job_id), "job-s");
    o->rank = 1;
    o->world = 2;
    o->total_numel = 96;
    o->param_numel = 70;
    o->shard_numel = 48;
    o->n_buckets = 3;
    o->max_bucket_numel = 32;
    o->bucket_size = 32;
    o->layout_hash = 0xabcull;
    o->master_sumsq = 2.5;
    o->n_groups = 2;
    o->groups = calloc(2, sizeof(*o->groups));
    cr_assert_not_null(o->groups);
    o->groups[0] = (zd_group_shard_t){2, 2, 0, 64, 0, 32, 0.1, 0.01};
    o->groups[1] = (zd_group_shard_t){1, 1, 64, 32, 32, 16, 0.2, 0};
    si = reply_frame(track_reply(zd_rpc_result(sess, r)),
                     ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY, 53)
             ->shard_info_reply;
    expect_result(si->result, ZS_OK, NULL);
    cr_assert_str_eq(si->job_id, "job-s");
    cr_assert_eq(si->rank, 1);
    cr_assert_eq(si->world, 2);
    cr_assert_eq(si->total_numel, 96);
    cr_assert_eq(si->param_numel, 70);
    cr_assert_eq(si->shard_numel, 48);
    cr_assert_eq(si->n_buckets, 3);
    cr_assert_eq(si->max_bucket_numel, 32);
    cr_assert_eq(si->bucket_size, 32);
    cr_assert_eq(si->layout_hash, 0xabcull);
    cr_assert_eq(si->master_sumsq, 2.5);
    cr_assert_eq(si->n_groups, 2);
    cr_assert_eq(si->groups[1]->group, 1);
    cr_assert_eq(si->groups[1]->n_params, 1);
    cr_assert_eq(si->groups[1]->n_buckets, 1);
    cr_assert_eq(si->groups[1]->flat_offset, 64);
    cr_assert_eq(si->groups[1]->flat_numel, 32);
    cr_assert_eq(si->groups[1]->shard_offset, 32);
    cr_assert_eq(si->groups[1]->shard_numel, 16);
    cr_assert_eq(si->groups[1]->lr, 0.2);
    cr_assert_eq(si->groups[0]->weight_decay, 0.01);
}

ZDT_TEST(zd_rpc, a_refused_shard_info_has_no_groups)
{
    zd_resp_t *r = resp_of(ZD_REQ_SHARD_INFO, 54, ZS_ERR_NOT_FOUND, "no job on this daemon");
    Zerod__Ipc__V1__ShardInfoReply *si;

    si = reply_frame(track_reply(zd_rpc_result(sess, r)),
                     ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY, 54)
             ->shard_info_reply;
    expect_result(si->result, ZS_ERR_NOT_FOUND, "no job on this daemon");
    cr_assert_eq(si->n_groups, 0);
}

ZDT_TEST(zd_rpc, params_ready_and_detach_results_carry_status_and_message)
{
    zd_resp_t *r = resp_of(ZD_REQ_PARAMS_READY, 55, ZS_ERR_STATE, "already has its parameters");
    frame_t *f;

    f = reply_frame(track_reply(zd_rpc_result(sess, r)),
                    ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY, 55);
    expect_result(f->params_ready_reply->result, ZS_ERR_STATE, "already has its parameters");
    r = resp_of(ZD_REQ_DETACH, 56, ZS_ERR_STATE, "send Attach first");
    f = reply_frame(track_reply(zd_rpc_result(sess, r)), ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY,
                    56);
    expect_result(f->detach_reply->result, ZS_ERR_STATE, "send Attach first");
}

ZDT_TEST(zd_rpc, a_request_aborted_at_shutdown_gets_an_error_reply)
{
    static const zd_req_kind_t kinds[] = {ZD_REQ_ATTACH, ZD_REQ_BUCKET_READY, ZD_REQ_STEP,
                                          ZD_REQ_SHARD_INFO};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        zd_resp_t *r = resp_of(kinds[i], 60 + i, ZS_ERR_ABORTED, "daemon shutting down");
        frame_t *f = reply_frame(track_reply(zd_rpc_result(sess, r)),
                                 ZEROD__IPC__V1__FRAME__BODY_ERROR, 60 + i);
        expect_result(f->error->result, ZS_ERR_ABORTED, "daemon shutting down");
    }
}

ZDT_TEST(zd_rpc, a_disconnect_has_no_reply)
{
    zd_resp_t *r = resp_of(ZD_REQ_DISCONNECT, 0, ZS_OK, NULL);

    cr_assert_null(zd_rpc_result(sess, r));
}

ZDT_TEST(zd_rpc, an_error_reply_carries_seq_status_and_message)
{
    zd_reply_t *reply = track_reply(zd_rpc_error(77, ZS_ERR_TIMEOUT, "frame incomplete after 5 s"));
    frame_t *f = reply_frame(reply, ZEROD__IPC__V1__FRAME__BODY_ERROR, 77);

    cr_assert_eq(reply->n_fds, 0);
    expect_result(f->error->result, ZS_ERR_TIMEOUT, "frame incomplete after 5 s");
}
