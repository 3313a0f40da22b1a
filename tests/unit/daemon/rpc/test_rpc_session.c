/* A connection's slots in flight (zd_rpc_session_t, daemon/src/rpc/rpc.c): a BucketReady takes its
 * slot until the SlotFree for it goes out; the same slot submitted again meanwhile is refused
 * here in a SlotFree of its own, without reaching the engine (it would be reduced twice). An
 * attach sets the slot count and frees every slot; a detach leaves the connection no slots.
 * Slots out of the range an attach gave are left for the job to refuse, naming the range. */
#include "rpc_test.h"

TestSuite(zd_rpc_session, .init = rpct_setup, .fini = rpct_teardown);

static outcome_t bucket_ready(zd_rpc_session_t *s, uint64_t seq, uint32_t slot, uint32_t bucket)
{
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    frame_t f = frame_of(seq, ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY, &br);

    br.slot = slot;
    br.bucket = bucket;
    return send_frame(s, &f);
}

/* A BucketReady handed to the engine. */
static void taken(zd_rpc_session_t *s, uint64_t seq, uint32_t slot, uint32_t bucket)
{
    outcome_t o = bucket_ready(s, seq, slot, bucket);

    cr_assert_eq(o.st, ZS_OK, "slot %u refused: %s", slot, why);
    cr_assert(o.submitted, "slot %u not handed to the engine", slot);
}

/* A BucketReady refused here: its slot is in flight. */
static void refused_twice(zd_rpc_session_t *s, uint64_t seq, uint32_t slot, uint32_t bucket)
{
    int before = n_reqs;
    outcome_t o = bucket_ready(s, seq, slot, bucket);
    frame_t *f;

    cr_assert_eq(o.st, ZS_ERR_INVALID, "slot %u in flight was taken again", slot);
    cr_assert(!o.submitted && !o.close);
    cr_assert_eq(n_reqs, before, "the second BucketReady reached the engine");
    f = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE, seq);
    expect_result(f->slot_free->result, ZS_ERR_INVALID, "submitted twice");
    cr_assert_eq(f->slot_free->slot, slot);
    cr_assert_eq(f->slot_free->bucket, bucket);
}

/* The engine's SlotFree for (slot, bucket). */
static void slot_freed(zd_rpc_session_t *s, uint64_t seq, uint32_t slot, uint32_t bucket,
                       zs_status_t st)
{
    zd_resp_t *r = resp_of(ZD_REQ_BUCKET_READY, seq, st, st == ZS_OK ? NULL : "reduce failed");
    frame_t *f;

    r->u.slot_free.slot = slot;
    r->u.slot_free.bucket = bucket;
    f = reply_frame(track_reply(zd_rpc_result(s, r)), ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE, seq);
    expect_result(f->slot_free->result, st, NULL);
    cr_assert_eq(f->slot_free->slot, slot);
    cr_assert_eq(f->slot_free->bucket, bucket);
}

/* The engine's DetachReply. */
static void detached(zd_rpc_session_t *s, uint64_t seq)
{
    zd_resp_t *r = resp_of(ZD_REQ_DETACH, seq, ZS_OK, NULL);

    reply_frame(track_reply(zd_rpc_result(s, r)), ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY, seq);
}

ZDT_TEST(zd_rpc_session, bucket_ready_twice_in_flight_is_refused)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 1, 10);
    refused_twice(sess, 31, 1, 11);
    cr_assert_eq(n_reqs, 1, "the second BucketReady reached the engine");
    taken(sess, 32, 2, 11); /* another slot is free */
}

ZDT_TEST(zd_rpc_session, slot_free_makes_the_slot_submittable_again)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 0, 5);
    slot_freed(sess, 30, 0, 5, ZS_OK);
    taken(sess, 31, 0, 6);
    refused_twice(sess, 32, 0, 7);
}

ZDT_TEST(zd_rpc_session, a_failed_slot_free_releases_the_slot_too)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 3, 5);
    slot_freed(sess, 30, 3, 5, ZS_ERR_PEER_LOST);
    taken(sess, 31, 3, 5);
}

ZDT_TEST(zd_rpc_session, slot_free_of_one_slot_leaves_the_others_in_flight)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 0, 0);
    taken(sess, 31, 1, 1);
    slot_freed(sess, 30, 0, 0, ZS_OK);
    refused_twice(sess, 32, 1, 2);
}

ZDT_TEST(zd_rpc_session, detach_clears_the_slots_in_flight)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 0, 0);
    taken(sess, 31, 1, 1);
    detached(sess, 32);
    attached(sess, 4); /* a re-attach on the same connection starts with every slot free */
    taken(sess, 33, 0, 0);
    taken(sess, 34, 1, 1);
}

ZDT_TEST(zd_rpc_session, after_detach_no_slot_is_held_back_from_the_job)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 0, 0);
    detached(sess, 31);
    /* no job on the connection: the engine answers "send Attach first" for each */
    taken(sess, 32, 0, 0);
    taken(sess, 33, 0, 0);
}

ZDT_TEST(zd_rpc_session, a_new_attach_clears_the_slots_in_flight)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 2, 0);
    attached(sess, 4);
    taken(sess, 31, 2, 0);
}

ZDT_TEST(zd_rpc_session, a_refused_attach_keeps_the_slots_in_flight)
{
    zd_resp_t *r;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    taken(sess, 30, 2, 0);
    r = resp_of(ZD_REQ_ATTACH, 31, ZS_ERR_BUSY, "busy: this daemon serves job 'x'");
    r->u.attach.n_slots = 8; /* ignored: the attach failed */
    reply_frame(track_reply(zd_rpc_result(sess, r)), ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 31);
    refused_twice(sess, 32, 2, 0);
}

ZDT_TEST(zd_rpc_session, slots_in_flight_belong_to_one_connection)
{
    zd_rpc_session_t *other = zd_rpc_session_create(8);

    cr_assert_not_null(other);
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    hello(other, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    attached(other, 4);
    taken(sess, 30, 1, 0);
    taken(other, 30, 1, 0);
    zd_rpc_session_destroy(other);
}

ZDT_TEST(zd_rpc_session, a_slot_out_of_range_is_left_for_the_job_to_refuse)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 4);
    /* not tracked (the job names the range in its SlotFree), so never "submitted twice" */
    taken(sess, 30, 4, 0);
    taken(sess, 31, 4, 0);
    taken(sess, 32, 1000, 0);
    taken(sess, 33, 1000, 0);
}

ZDT_TEST(zd_rpc_session, bucket_ready_before_attach_is_left_for_the_job_to_refuse)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    taken(sess, 30, 0, 0);
    taken(sess, 31, 0, 0);
}

ZDT_TEST(zd_rpc_session, each_of_64_slots_is_tracked)
{
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    attached(sess, 64);
    for (uint32_t s = 0; s < 64; s += 21) { /* 0, 21, 42, 63 */
        taken(sess, 100 + s, s, s);
        refused_twice(sess, 200 + s, s, s);
    }
}
