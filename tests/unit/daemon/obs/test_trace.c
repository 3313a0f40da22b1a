/* The step trace (daemon/src/obs/trace.c, rpc/rpc_trace.c; docs/trace.md): the ring keeps the
 * newest spans in recording order, a read gives the last complete steps (whole ones only once the
 * ring has wrapped), and TraceRequest is a control-role query answered at once from the ring. */
#include "obs/trace.h"
#include "rpc/rpc_test.h"
#include "zs/time.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

TestSuite(zd_trace);
TestSuite(zd_rpc_trace, .init = rpct_setup, .fini = rpct_teardown);

/* Spans per step of add_step: a bucket's arrival, its reduce-scatter, norm, Adam, all-gather,
 * the step. */
#define PER_STEP 6

static uint64_t clock_ns; /* the start of the next span: every span 10 ns after the last */

static void add(zd_trace_t *t, zd_trace_kind_t kind, uint64_t step, uint16_t flags)
{
    zd_trace_span_t s = {.start_ns = clock_ns,
                         .dur_ns = 5,
                         .step = step,
                         .bucket = (uint32_t)step % 3,
                         .bytes = 4096,
                         .kind = (uint16_t)kind,
                         .flags = flags};

    clock_ns += 10;
    zd_trace_add(t, &s);
}

/* The spans of one step k, as job/step.c records them. */
static void add_step(zd_trace_t *t, uint64_t k, uint16_t step_flags)
{
    add(t, ZD_TRACE_BUCKET, k, 0);
    add(t, ZD_TRACE_REDUCE_SCATTER, k, 0);
    add(t, ZD_TRACE_NORM, k, 0);
    add(t, ZD_TRACE_ADAM, k, 0);
    add(t, ZD_TRACE_ALL_GATHER, k, 0);
    add(t, ZD_TRACE_STEP, k, step_flags);
}

static zd_trace_t *ring(uint32_t capacity)
{
    zd_trace_t *t = NULL;

    cr_assert_eq(zd_trace_create(capacity, &t), ZS_OK);
    cr_assert_not_null(t);
    zd_trace_begin(t, "job-t", 1, 2);
    clock_ns = 1000;
    return t;
}

/* Read `steps` up to last_step and check what came back: the steps, and every span in
 * recording order (start times rising), of a step in first..last unless allow_older. */
static zd_trace_out_t read_ok(zd_trace_t *t, uint32_t steps, uint64_t last_step, uint32_t want,
                              uint64_t first, uint64_t last)
{
    zd_trace_out_t o;

    cr_assert_eq(zd_trace_read(t, steps, last_step, &o), ZS_OK);
    cr_assert_eq(o.steps, want, "steps %u, expected %u", o.steps, want);
    cr_assert_eq(o.first_step, first, "first step %llu, expected %llu",
                 (unsigned long long)o.first_step, (unsigned long long)first);
    cr_assert_eq(o.last_step, last, "last step %llu, expected %llu",
                 (unsigned long long)o.last_step, (unsigned long long)last);
    for (size_t i = 0; i < o.n_spans; i++) {
        cr_assert(i == 0 || o.spans[i].start_ns > o.spans[i - 1].start_ns, "span %zu out of order",
                  i);
    }
    return o;
}

Test(zd_trace, capacity_zero_is_off_and_null_is_a_no_op)
{
    zd_trace_t *t = (zd_trace_t *)1;
    zd_trace_out_t o;

    cr_assert_eq(zd_trace_create(0, &t), ZS_OK);
    cr_assert_null(t);
    zd_trace_begin(NULL, "j", 0, 1);
    add(NULL, ZD_TRACE_STEP, 1, 0);
    cr_assert_eq(zd_trace_read(NULL, 3, 0, &o), ZS_OK);
    cr_assert_eq(o.n_spans, 0);
    cr_assert_eq(o.steps, 0);
    zd_trace_out_free(&o);
    zd_trace_destroy(NULL);
    cr_assert_eq(zd_trace_create(ZD_TRACE_MAX_SPANS + 1, &t), ZS_ERR_INVALID);
}

Test(zd_trace, gives_the_last_complete_steps_in_recording_order)
{
    zd_trace_t *t = ring(1024);
    zd_trace_out_t o;

    for (uint64_t k = 1; k <= 5; k++) {
        add_step(t, k, 0);
    }
    add(t, ZD_TRACE_BUCKET, 6, 0); /* step 6 in progress: not complete, not given */
    o = read_ok(t, 3, 0, 3, 3, 5);
    cr_assert_eq(o.n_spans, 3 * PER_STEP);
    cr_assert_eq(o.spans[0].step, 3);
    cr_assert_eq(o.spans[0].kind, ZD_TRACE_BUCKET);
    cr_assert_eq(o.spans[o.n_spans - 1].kind, ZD_TRACE_STEP);
    cr_assert_eq(o.spans[o.n_spans - 1].step, 5);
    cr_assert_str_eq(o.job_id, "job-t");
    cr_assert_eq(o.rank, 1);
    cr_assert_eq(o.world, 2);
    cr_assert_eq(o.capacity, 1024);
    cr_assert_eq(o.recorded, 5 * PER_STEP + 1);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, gives_fewer_steps_when_it_holds_fewer)
{
    zd_trace_t *t = ring(1024);
    zd_trace_out_t o = read_ok(t, 3, 0, 0, 0, 0);

    cr_assert_eq(o.n_spans, 0, "no step yet: nothing");
    zd_trace_out_free(&o);
    add_step(t, 1, 0);
    add_step(t, 2, 0);
    o = read_ok(t, 10, 0, 2, 1, 2);
    cr_assert_eq(o.n_spans, 2 * PER_STEP);
    zd_trace_out_free(&o);
    o = read_ok(t, 0, 0, 1, 2, 2); /* 0 steps asked: 1 */
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, last_step_bounds_the_newest_step)
{
    zd_trace_t *t = ring(1024);
    zd_trace_out_t o;

    for (uint64_t k = 1; k <= 6; k++) {
        add_step(t, k, 0);
    }
    o = read_ok(t, 2, 4, 2, 3, 4);
    cr_assert_eq(o.n_spans, 2 * PER_STEP, "steps 3 and 4 only, not 5 and 6");
    for (size_t i = 0; i < o.n_spans; i++) {
        cr_assert(o.spans[i].step >= 3 && o.spans[i].step <= 4);
    }
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, the_checkpoint_after_the_newest_step_is_its)
{
    zd_trace_t *t = ring(1024);
    zd_trace_out_t o;

    add_step(t, 1, 0);
    add_step(t, 2, 0);
    add(t, ZD_TRACE_CHECKPOINT, 2, 0); /* saved after step 2 */
    add(t, ZD_TRACE_BUCKET, 3, 0);     /* step 3 begins */
    o = read_ok(t, 1, 0, 1, 2, 2);
    cr_assert_eq(o.n_spans, PER_STEP + 1);
    cr_assert_eq(o.spans[o.n_spans - 1].kind, ZD_TRACE_CHECKPOINT);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, a_skipped_attempt_and_its_retry_are_one_step)
{
    zd_trace_t *t = ring(1024);
    zd_trace_out_t o;

    add_step(t, 1, 0);
    add_step(t, 2, ZD_TRACE_SKIPPED); /* overflow: step 2 again */
    add_step(t, 2, 0);
    add_step(t, 3, 0);
    o = read_ok(t, 2, 0, 2, 2, 3);
    cr_assert_eq(o.n_spans, 3 * PER_STEP, "both attempts of step 2, and step 3");
    cr_assert_eq(o.spans[PER_STEP - 1].flags, ZD_TRACE_SKIPPED);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, after_wraparound_only_whole_steps_are_given)
{
    zd_trace_t *t = ring(16);
    zd_trace_out_t o;

    for (uint64_t k = 1; k <= 5; k++) { /* 30 spans: the ring holds the last 16 */
        add_step(t, k, 0);
    }
    /* spans 14..29: the end of step 3 (14..17, its start overwritten), steps 4 and 5 */
    o = read_ok(t, 5, 0, 2, 4, 5);
    cr_assert_eq(o.n_spans, 2 * PER_STEP);
    cr_assert_eq(o.spans[0].kind, ZD_TRACE_BUCKET);
    cr_assert_eq(o.spans[0].step, 4);
    cr_assert_eq(o.spans[0].start_ns, 1000 + 18 * 10, "the 19th span recorded");
    cr_assert_eq(o.recorded, 30);
    zd_trace_out_free(&o);
    /* asked for fewer than it holds, the bound is the step before's STEP span */
    o = read_ok(t, 1, 0, 1, 5, 5);
    cr_assert_eq(o.n_spans, PER_STEP);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, wraps_many_times_and_stays_ordered)
{
    zd_trace_t *t = ring(64);
    zd_trace_out_t o;

    for (uint64_t k = 1; k <= 1000; k++) {
        add_step(t, k, 0);
    }
    /* the last 64 of 6000 spans: the end of step 990 (its STEP span at 5939), 991..1000 */
    o = read_ok(t, 100, 0, 10, 991, 1000);
    cr_assert_eq(o.n_spans, 10 * PER_STEP);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

Test(zd_trace, a_new_job_empties_it)
{
    zd_trace_t *t = ring(64);
    zd_trace_out_t o;

    add_step(t, 1, 0);
    zd_trace_begin(t, "job-u", 0, 1);
    o = read_ok(t, 3, 0, 0, 0, 0);
    cr_assert_eq(o.n_spans, 0);
    cr_assert_str_eq(o.job_id, "job-u");
    cr_assert_eq(o.recorded, 0);
    zd_trace_out_free(&o);
    zd_trace_destroy(t);
}

/* ---- a reader beside the writer ------------------------------------------------------------ */

typedef struct writer_arg {
    zd_trace_t *t;
    atomic_bool stop;
} writer_arg_t;

static void *writer(void *arg)
{
    writer_arg_t *w = arg;

    for (uint64_t k = 1; !atomic_load(&w->stop) && k < 1000000; k++) {
        for (int i = 0; i < PER_STEP; i++) {
            zd_trace_span_t s = {
                .start_ns = k * 100 + (uint64_t)i, /* rising */
                .step = k,
                .kind = (uint16_t)(i == PER_STEP - 1 ? ZD_TRACE_STEP : ZD_TRACE_REDUCE_SCATTER)};
            zd_trace_add(w->t, &s);
        }
    }
    return NULL;
}

Test(zd_trace, a_read_while_the_engine_writes_sees_whole_steps)
{
    writer_arg_t w = {.t = ring(4096)};
    pthread_t th;

    atomic_init(&w.stop, false);
    cr_assert_eq(pthread_create(&th, NULL, writer, &w), 0);
    for (int r = 0; r < 200; r++) {
        zd_trace_out_t o;
        cr_assert_eq(zd_trace_read(w.t, 5, 0, &o), ZS_OK);
        cr_assert_eq(o.n_spans, (size_t)o.steps * PER_STEP, "read %d: %zu spans of %u steps", r,
                     o.n_spans, o.steps);
        for (size_t i = 1; i < o.n_spans; i++) {
            cr_assert_gt(o.spans[i].start_ns, o.spans[i - 1].start_ns);
        }
        if (o.steps > 0) {
            cr_assert_eq(o.spans[o.n_spans - 1].kind, ZD_TRACE_STEP);
            cr_assert_eq(o.last_step - o.first_step + 1, o.steps);
        }
        zd_trace_out_free(&o);
    }
    atomic_store(&w.stop, true);
    pthread_join(th, NULL);
    zd_trace_destroy(w.t);
}

/* ---- TraceRequest ------------------------------------------------------------------------- */

ZDT_TEST(zd_rpc_trace, is_a_control_role_request)
{
    Zerod__Ipc__V1__TraceRequest tr = ZEROD__IPC__V1__TRACE_REQUEST__INIT;
    frame_t f = frame_of(3, ZEROD__IPC__V1__FRAME__BODY_TRACE, &tr);
    outcome_t o;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    o = send_frame(sess, &f);
    expect_closed(&o, 3, ZS_ERR_PERMISSION, "control role only");
}

ZDT_TEST(zd_rpc_trace, without_a_ring_it_is_unsupported)
{
    Zerod__Ipc__V1__TraceRequest tr = ZEROD__IPC__V1__TRACE_REQUEST__INIT;
    frame_t in = frame_of(4, ZEROD__IPC__V1__FRAME__BODY_TRACE, &tr);
    outcome_t o;
    frame_t *f;

    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_ok(sess, &in);
    cr_assert(!o.submitted);
    f = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_TRACE_REPLY, 4);
    expect_result(f->trace_reply->result, ZS_ERR_UNSUPPORTED, "trace_buffer is 0");
}

static int64_t clock_offset_now(void)
{
    struct timespec m, r;

    clock_gettime(CLOCK_MONOTONIC, &m);
    clock_gettime(CLOCK_REALTIME, &r);
    return ((int64_t)r.tv_sec - m.tv_sec) * 1000000000 + (r.tv_nsec - m.tv_nsec);
}

ZDT_TEST(zd_rpc_trace, is_answered_at_once_from_the_ring)
{
    Zerod__Ipc__V1__TraceRequest tr = ZEROD__IPC__V1__TRACE_REQUEST__INIT;
    frame_t in = frame_of(5, ZEROD__IPC__V1__FRAME__BODY_TRACE, &tr);
    const Zerod__Ipc__V1__TraceReply *r;
    zd_trace_t *t = ring(256);
    int64_t offset = clock_offset_now();
    outcome_t o;

    for (uint64_t k = 1; k <= 4; k++) {
        add_step(t, k, k == 3 ? ZD_TRACE_SKIPPED : 0);
    }
    rpc.trace = t;
    tr.steps = 2;
    hello(sess, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    o = send_ok(sess, &in);
    zd_trace_destroy(t);
    rpc.trace = NULL;
    cr_assert(!o.submitted, "answered on the loop, not queued for the engine");
    r = reply_frame(o.reply, ZEROD__IPC__V1__FRAME__BODY_TRACE_REPLY, 5)->trace_reply;
    expect_result(r->result, ZS_OK, NULL);
    cr_assert_str_eq(r->job_id, "job-t");
    cr_assert_eq(r->rank, 1);
    cr_assert_eq(r->world, 2);
    cr_assert_eq(r->steps, 2);
    cr_assert_eq(r->first_step, 3);
    cr_assert_eq(r->last_step, 4);
    cr_assert_eq(r->capacity, 256);
    cr_assert_eq(r->recorded, 4 * PER_STEP);
    cr_assert_eq(r->n_spans, 2 * PER_STEP);
    cr_assert_eq(r->spans[0]->kind, ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_BUCKET);
    cr_assert_eq(r->spans[1]->bytes, 4096);
    cr_assert_eq(r->spans[1]->bucket, 0, "step 3's bucket (3 %% 3)");
    cr_assert_eq(r->spans[PER_STEP - 1]->flags, ZD_TRACE_SKIPPED);
    cr_assert_eq(r->spans[PER_STEP]->start_ns, 1000 + 3 * PER_STEP * 10);
    cr_assert_lt(llabs(r->clock_offset_ns - offset), 1000000000LL,
                 "realtime - monotonic: %lld, here %lld", (long long)r->clock_offset_ns,
                 (long long)offset);
}
