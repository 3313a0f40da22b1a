/* The lifecycle of a job (daemon/src/job/job.c and job/step.c) driven through job/job.h as the
 * engine drives it, at world 1 on the CPU with the local collectives (no mesh): attach,
 * ParamsReady, buckets, steps, detach or disconnect, linger, re-attach, end; and the refusals of
 * each state. The trainer's side is played here: the params and slots regions are mapped from the
 * fds an attach hands out. */
#include "backend/backend.h"
#include "job/job.h"
#include "zd_test.h"
#include "zk/kernels_cuda.h"
#include "zs/mem.h"
#include "zs/time.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONN_A 1
#define CONN_B 2

/* Buckets of 16 elements: params of 10 and 20 elements, at 0 and 16, take 3 buckets (the
 * second parameter split between the second and the third). */
#define CONFIG_F32 "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, \"gradient_clipping\": 0}"
#define CONFIG_F16                                                                                 \
    "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, \"gradient_clipping\": 0, \"fp16\": "   \
    "{\"enabled\": true, \"initial_scale_power\": 8, \"hysteresis\": 1}}"

#define F16_ONE 0x3c00u
#define F16_INF 0x7c00u

/* Bigger than the params region of these jobs (3 buckets of 16 elements). */
#define PARAMS_MAX 1024

/* what ParamsReady says about a resume from checkpoint_dir (none configured here) */
static zd_ckpt_out_t ck_out;

static atomic_bool cancel;
static zs_ratelimit_t warn_rl;
static zk_exec_t exec;
static zd_job_env_t env;
static zd_job_t *job;
static char err[ZS_MSG_MAX];
static const uint32_t group_n_params[] = {2};
static const uint64_t numel[] = {10, 20};
static zd_job_spec_t spec;
static zs_region_t params, slots; /* the trainer's mappings */
static zd_attach_out_t out;

static void busy(void *arg, const char *what)
{
    (void)arg;
    (void)what;
}

static void wake(void *arg)
{
    (void)arg;
}

static void setup(void)
{
    atomic_store(&cancel, false);
    warn_rl = (zs_ratelimit_t)ZS_RATELIMIT_INIT(10ull * ZS_NSEC_PER_SEC, 100);
    exec = (zk_exec_t){.variant = ZK_VARIANT_DEFAULT};
    env = (zd_job_env_t){.exec = &exec,
                         .token_file = "",
                         .cancel = &cancel,
                         .wake = wake,
                         .busy = busy,
                         .warn_rl = &warn_rl,
                         .job_linger_ns = 60ull * ZS_NSEC_PER_SEC,
                         .n_slots = 4};
    spec = (zd_job_spec_t){.job_id = "job-1",
                           .rank = 0,
                           .world = 1,
                           .dtype = ZS_DTYPE_F32,
                           .n_groups = 1,
                           .group_n_params = group_n_params,
                           .numel = numel,
                           .config_json = CONFIG_F32};
    params = (zs_region_t)ZS_REGION_INIT;
    slots = (zs_region_t)ZS_REGION_INIT;
    job = NULL;
}

static void unmap(void)
{
    zs_region_cleanup(&params);
    zs_region_cleanup(&slots);
}

static void teardown(void)
{
    unmap();
    zs_log_set_level(ZS_LOG_WARN); /* not the line of the job's end */
    zd_job_drop(&job, "test over");
}

TestSuite(zd_job, .init = setup, .fini = teardown);

/* ---- the trainer's side --------------------------------------------------------------------- */

/* Attach `spec` from conn; the regions of the reply mapped as the trainer maps them. */
static void attach(uint64_t conn)
{
    zs_status_t st;

    unmap();
    st = zd_job_attach(&job, &env, conn, &spec, &out, err, sizeof(err));
    cr_assert_eq(st, ZS_OK, "attach: %s (%s)", zs_status_name(st), err);
    cr_assert_not_null(job);
    cr_assert_geq(out.n_fds, 2);
    cr_assert_leq(out.params_bytes, PARAMS_MAX);
    cr_assert_eq(zs_region_map_fd(out.fds[0], out.params_bytes, &params), ZS_OK);
    cr_assert_eq(zs_region_map_fd(out.fds[1], (size_t)out.n_slots * out.slot_bytes, &slots), ZS_OK);
    for (int i = 2; i < out.n_fds; i++) {
        close(out.fds[i]);
    }
}

static void expect_status(zs_status_t st, zs_status_t want, const char *needle)
{
    cr_assert_eq(st, want, "%s, expected %s (%s)", zs_status_name(st), zs_status_name(want), err);
    cr_assert(needle == NULL || strstr(err, needle) != NULL, "'%s' not in: %s", needle, err);
}

static void expect_attach_refused(uint64_t conn, zs_status_t want, const char *needle)
{
    zd_attach_out_t o;

    expect_status(zd_job_attach(&job, &env, conn, &spec, &o, err, sizeof(err)), want, needle);
}

static void params_ready(uint64_t conn)
{
    expect_status(zd_job_params_ready(job, &env, conn, false, &ck_out, err, sizeof(err)), ZS_OK,
                  NULL);
}

static zd_shard_out_t shard(void)
{
    zd_shard_out_t s;

    expect_status(zd_job_shard_info(job, &s, err, sizeof(err)), ZS_OK, NULL);
    zd_shard_out_free(&s);
    return s;
}

static void fill_f32(const zs_region_t *r, size_t first, size_t n, float v)
{
    float *p = (float *)r->addr + first;

    cr_assert_leq((first + n) * sizeof(float), r->size);
    for (size_t i = 0; i < n; i++) {
        p[i] = v;
    }
}

static void fill_f16(const zs_region_t *r, size_t first, size_t n, uint16_t v)
{
    uint16_t *p = (uint16_t *)r->addr + first;

    cr_assert_leq((first + n) * sizeof(uint16_t), r->size);
    for (size_t i = 0; i < n; i++) {
        p[i] = v;
    }
}

/* Every bucket's gradient of micro-step `micro`, all `g`, through slot (bucket % n_slots). */
static void backward_micro_f32(uint64_t conn, float g, uint32_t micro)
{
    zd_shard_out_t s = shard();
    size_t per_slot = out.slot_bytes / sizeof(float);

    for (uint32_t b = 0; b < s.n_buckets; b++) {
        uint32_t slot = b % out.n_slots;
        fill_f32(&slots, slot * per_slot, per_slot, g);
        expect_status(zd_job_bucket_ready(job, &env, conn, slot, b, micro, err, sizeof(err)), ZS_OK,
                      NULL);
    }
}

static void backward_f32(uint64_t conn, float g)
{
    backward_micro_f32(conn, g, 0);
}

static zd_step_out_t step(uint64_t conn)
{
    zd_step_out_t o;

    memset(&o, 0, sizeof(o));
    expect_status(zd_job_step(job, &env, conn, NULL, 0, &o, err, sizeof(err)), ZS_OK, NULL);
    return o;
}

static zd_job_status_t status(void)
{
    zd_job_status_t s;

    cr_assert_not_null(job);
    zd_job_status(job, &s);
    return s;
}

/* ---- attach ----------------------------------------------------------------------------------
 */

ZDT_TEST(zd_job, attach_at_world_1_uses_local_collectives_and_hands_out_regions)
{
    zd_job_status_t s;

    attach(CONN_A);
    cr_assert(!out.resumed);
    cr_assert_eq(out.step, 0);
    cr_assert_eq(out.n_slots, 4);
    cr_assert_eq(out.stage, 2);
    cr_assert_eq(out.n_fds, 2, "stage 2 has no grads region");
    cr_assert_eq(out.grads_bytes, 0);
    cr_assert_eq(out.loss_scale, 1.0, "fp32 is not scaled");
    cr_assert_eq(out.bucket_size, 16);
    cr_assert_eq(out.slot_bytes, shard().max_bucket_numel * sizeof(float), "a slot holds a bucket");
    cr_assert_geq(out.params_bytes, 30 * sizeof(float));
    cr_assert_eq(out.memory, ZS_MEM_HOST, "the CPU backend's regions are memfds");
    cr_assert_eq(out.device, -1);
    s = status();
    cr_assert_str_eq(s.job_id, "job-1");
    cr_assert(s.trainer_attached);
    cr_assert_eq(s.param_numel, 30);
    cr_assert(strncmp(s.collectives, "local", 5) == 0, "collectives: %s", s.collectives);
}

ZDT_TEST(zd_job, stage_1_hands_out_a_grads_region_and_refuses_bucket_ready)
{
    spec.config_json = "{\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 16}}";
    attach(CONN_A);
    cr_assert_eq(out.stage, 1);
    cr_assert_eq(out.n_fds, 3);
    cr_assert_eq(out.grads_bytes, out.params_bytes);
    params_ready(CONN_A);
    expect_status(zd_job_bucket_ready(job, &env, CONN_A, 0, 0, 0, err, sizeof(err)), ZS_ERR_STATE,
                  "stage 1");
}

ZDT_TEST(zd_job, an_unusable_attach_is_refused_and_leaves_no_job)
{
    zdt_expect_warn("refused");
    spec.world = 0;
    expect_attach_refused(CONN_A, ZS_ERR_INVALID, "world 0");
    spec.world = 2;
    spec.rank = 2;
    expect_attach_refused(CONN_A, ZS_ERR_INVALID, "rank 2 is not below world 2");
    spec.world = 1;
    spec.rank = 0;
    spec.job_id = "a b";
    expect_attach_refused(CONN_A, ZS_ERR_INVALID, "job_id");
    spec.job_id = "job-1";
    spec.dtype = ZS_DTYPE_F16; /* the config says fp32 */
    expect_attach_refused(CONN_A, ZS_ERR_CONFIG, "does not match the config");
    cr_assert_null(job);
}

/* A daemon on the CUDA backend (env.cuda) on a machine without a GPU, or built without CUDA:
 * the attach is refused naming the device, and no job is left. */
ZDT_TEST(zd_job, a_cuda_job_without_a_gpu_is_refused_naming_the_device)
{
    zd_attach_out_t o;
    zs_status_t st;

    if (zk_cuda_available()) {
        cr_skip_test("a GPU is present: bench/gpu/train_check.py trains on it");
    }
    zdt_expect_warn("refused");
    env.cuda = true;
    env.cuda_device = 0;
    st = zd_job_attach(&job, &env, CONN_A, &spec, &o, err, sizeof(err));
    cr_assert(st == ZS_ERR_NO_DEVICE || st == ZS_ERR_UNSUPPORTED, "%s (%s)", zs_status_name(st),
              err);
    cr_assert(strstr(err, "cuda:0") != NULL, "%s", err);
    cr_assert_null(job);
}

ZDT_TEST(zd_job, an_attach_over_max_shard_bytes_is_refused_naming_the_limit)
{
    zdt_expect_warn("refused");
    env.max_shard_bytes = 64;
    expect_attach_refused(CONN_A, ZS_ERR_LIMIT, "max_shard_bytes = 64");
    cr_assert_null(job);
}

/* ---- a trainer's requests ------------------------------------------------------------------- */

ZDT_TEST(zd_job, requests_without_a_job_are_refused_naming_attach)
{
    zd_step_out_t o;
    zd_shard_out_t s;

    expect_status(zd_job_params_ready(NULL, &env, CONN_A, false, &ck_out, err, sizeof(err)),
                  ZS_ERR_STATE, "send Attach first");
    expect_status(zd_job_bucket_ready(NULL, &env, CONN_A, 0, 0, 0, err, sizeof(err)), ZS_ERR_STATE,
                  "send Attach first");
    expect_status(zd_job_step(NULL, &env, CONN_A, NULL, 0, &o, err, sizeof(err)), ZS_ERR_STATE,
                  "send Attach first");
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_ERR_STATE,
                  "send Attach first");
    expect_status(zd_job_shard_info(NULL, &s, err, sizeof(err)), ZS_ERR_NOT_FOUND, "no job");
}

ZDT_TEST(zd_job, requests_from_another_connection_are_refused)
{
    zd_step_out_t o;

    attach(CONN_A);
    expect_status(zd_job_params_ready(job, &env, CONN_B, false, &ck_out, err, sizeof(err)),
                  ZS_ERR_STATE, "no job attached on this connection");
    params_ready(CONN_A);
    expect_status(zd_job_bucket_ready(job, &env, CONN_B, 0, 0, 0, err, sizeof(err)), ZS_ERR_STATE,
                  "no job attached on this connection");
    expect_status(zd_job_step(job, &env, CONN_B, NULL, 0, &o, err, sizeof(err)), ZS_ERR_STATE,
                  "no job attached on this connection");
    expect_status(zd_job_detach(&job, &env, CONN_B, true, err, sizeof(err)), ZS_ERR_STATE,
                  "no job attached on this connection");
    cr_assert(status().trainer_attached);
}

ZDT_TEST(zd_job, buckets_and_steps_wait_for_params_ready)
{
    zd_step_out_t o;

    attach(CONN_A);
    expect_status(zd_job_bucket_ready(job, &env, CONN_A, 0, 0, 0, err, sizeof(err)), ZS_ERR_STATE,
                  "send ParamsReady");
    expect_status(zd_job_step(job, &env, CONN_A, NULL, 0, &o, err, sizeof(err)), ZS_ERR_STATE,
                  "send ParamsReady");
    cr_assert_eq(o.step, 0);
}

ZDT_TEST(zd_job, params_ready_twice_is_refused)
{
    attach(CONN_A);
    params_ready(CONN_A);
    expect_status(zd_job_params_ready(job, &env, CONN_A, false, &ck_out, err, sizeof(err)),
                  ZS_ERR_STATE, "already has its parameters");
}

ZDT_TEST(zd_job, bucket_ready_out_of_range_is_refused_naming_the_range)
{
    uint32_t n_buckets;

    attach(CONN_A);
    params_ready(CONN_A);
    n_buckets = shard().n_buckets;
    cr_assert_eq(n_buckets, 3); /* 10 | 16..36 cut every 16: [0,16) [16,32) [32,36) */
    expect_status(zd_job_bucket_ready(job, &env, CONN_A, 4, 0, 0, err, sizeof(err)), ZS_ERR_INVALID,
                  "(4 slots)");
    expect_status(zd_job_bucket_ready(job, &env, CONN_A, 0, n_buckets, 0, err, sizeof(err)),
                  ZS_ERR_INVALID, "layout has 3");
    expect_status(zd_job_bucket_ready(job, &env, CONN_A, 0, 0, 1, err, sizeof(err)), ZS_ERR_INVALID,
                  "gradient_accumulation_steps");
}

/* BucketReady.event is a device session's: a CPU job refuses one, and a handle of the wrong
 * size is refused naming it, before anything is reduced. */
ZDT_TEST(zd_job, bucket_ready_refuses_an_event_on_the_cpu_and_a_bad_handle)
{
    uint8_t ev[ZD_EVENT_HANDLE_BYTES + 1];

    memset(ev, 7, sizeof(ev));
    attach(CONN_A);
    params_ready(CONN_A);
    expect_status(zd_job_bucket_ready_event(job, &env, CONN_A, 0, 0, 0, ev, ZD_EVENT_HANDLE_BYTES,
                                            err, sizeof(err)),
                  ZS_ERR_INVALID, "CPU backend");
    expect_status(zd_job_bucket_ready_event(job, &env, CONN_A, 0, 0, 0, ev, 5, err, sizeof(err)),
                  ZS_ERR_INVALID, "5 bytes");
    cr_assert(status().trainer_attached, "the job goes on");
}

ZDT_TEST(zd_job, step_with_unusable_learning_rates_is_refused)
{
    static const double two[] = {1e-3, 1e-3};
    static const double negative[] = {-1e-3};
    zd_step_out_t o;

    attach(CONN_A);
    params_ready(CONN_A);
    expect_status(zd_job_step(job, &env, CONN_A, two, 2, &o, err, sizeof(err)), ZS_ERR_INVALID,
                  "the job has 1 groups");
    expect_status(zd_job_step(job, &env, CONN_A, negative, 1, &o, err, sizeof(err)), ZS_ERR_INVALID,
                  "not a finite lr >= 0");
    cr_assert_eq(o.step, 0);
}

/* The first Adam step moves each parameter by lr * g / (|g| + eps) (bias correction makes m̂ = g
 * and v̂ = g²): 1e-3 * (1 - 2e-8) from 1. The kernels' fp32 arithmetic errs by a few ulps of the
 * update (~1e-9 absolute); p rounds once at ulp(0.999) = 2^-24: two ulps bound it. Every element
 * of the region, padding included, was given the same value and gradient. */
ZDT_TEST(zd_job, a_step_runs_adam_on_the_params_region)
{
    zd_step_out_t o;
    size_t n;

    attach(CONN_A);
    n = out.params_bytes / sizeof(float);
    fill_f32(&params, 0, n, 1.0f);
    params_ready(CONN_A);
    backward_f32(CONN_A, 0.5f);
    o = step(CONN_A);
    cr_assert_eq(o.step, 1);
    cr_assert(!o.skipped);
    cr_assert_gt(o.grad_norm, 0.0);
    cr_assert_eq(status().step, 1);
    for (size_t i = 0; i < n; i++) {
        float p = ((const float *)params.addr)[i];
        cr_assert(fabs(p - 0.999) <= 2 * 0x1p-24, "params[%zu] = %.9g after one step", i, p);
    }
}

/* Adam leaves the gradients in the accumulator for the next reduce-scatter to overwrite: a step
 * whose buckets got no gradient at all sees zeros, not the last step's. */
ZDT_TEST(zd_job, a_step_without_gradients_sees_zero_not_the_last_ones)
{
    zd_step_out_t o;
    double first;

    attach(CONN_A);
    fill_f32(&params, 0, out.params_bytes / sizeof(float), 1.0f);
    params_ready(CONN_A);
    backward_f32(CONN_A, 0.5f);
    o = step(CONN_A);
    first = o.grad_norm;
    cr_assert_gt(first, 0.0);
    o = step(CONN_A); /* no BucketReady in between */
    cr_assert_eq(o.step, 2);
    cr_assert_eq(o.grad_norm, 0.0, "the second step saw a gradient norm of %g", o.grad_norm);
    backward_f32(CONN_A, 0.25f);
    o = step(CONN_A); /* and a later one sees only its own */
    cr_assert_float_eq(o.grad_norm, first / 2, 1e-12, "%.17g vs half of %.17g", o.grad_norm, first);
}

/* A slice's sum of squares is due after the reduce-scatter of its last micro-step and taken while
 * the engine is idle; a contribution of an earlier micro-step that comes after it changes the
 * slice, and the step's norm must see that: the same gradients in either order give the same
 * norm, whether the sums were taken before the step or at it. */
ZDT_TEST(zd_job, the_norm_sees_a_contribution_after_the_last_micro_step)
{
    zd_step_out_t o;
    double in_order;

    spec.config_json = "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, "
                       "\"gradient_clipping\": 0, \"gradient_accumulation_steps\": 2}";
    attach(CONN_A);
    fill_f32(&params, 0, out.params_bytes / sizeof(float), 1.0f);
    params_ready(CONN_A);
    backward_micro_f32(CONN_A, 0.25f, 0);
    backward_micro_f32(CONN_A, 0.5f, 1);
    o = step(CONN_A); /* the sums taken at the step */
    in_order = o.grad_norm;
    cr_assert_gt(in_order, 0.0);
    backward_micro_f32(CONN_A, 0.25f, 0);
    backward_micro_f32(CONN_A, 0.5f, 1);
    while (zd_job_idle_work(job)) { /* taken before it */
    }
    o = step(CONN_A);
    cr_assert_eq(o.grad_norm, in_order, "%.17g with the sums taken before the step, %.17g at it",
                 o.grad_norm, in_order);
    backward_micro_f32(CONN_A, 0.5f, 1);
    while (zd_job_idle_work(job)) {
    }
    backward_micro_f32(CONN_A, 0.25f, 0);
    o = step(CONN_A);
    cr_assert_eq(o.step, 3);
    cr_assert_eq(o.grad_norm, in_order,
                 "%.17g after the last micro-step came first, %.17g in order", o.grad_norm,
                 in_order);
}

/* ---- detach, linger, re-attach -------------------------------------------------------------- */

ZDT_TEST(zd_job, detach_keeps_the_job_and_a_reattach_resumes_it)
{
    static uint8_t before[PARAMS_MAX];

    attach(CONN_A);
    fill_f32(&params, 0, out.params_bytes / sizeof(float), 1.0f);
    params_ready(CONN_A);
    backward_f32(CONN_A, 0.5f);
    step(CONN_A);
    memcpy(before, params.addr, params.size);
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    cr_assert_not_null(job, "a detach without end_job dropped the job");
    cr_assert(!status().trainer_attached);
    attach(CONN_B);
    cr_assert(out.resumed);
    cr_assert_eq(out.step, 1);
    cr_assert(memcmp(params.addr, before, params.size) == 0,
              "the re-attached params region does not hold the job's values");
    expect_status(zd_job_params_ready(job, &env, CONN_B, false, &ck_out, err, sizeof(err)),
                  ZS_ERR_STATE, "a resumed job keeps them");
    backward_f32(CONN_B, 0.5f);
    cr_assert_eq(step(CONN_B).step, 2);
}

ZDT_TEST(zd_job, a_job_left_before_params_ready_is_started_afresh)
{
    attach(CONN_A);
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    attach(CONN_B);
    cr_assert(!out.resumed, "a job without parameters was resumed");
    params_ready(CONN_B);
}

ZDT_TEST(zd_job, detach_with_end_job_drops_the_job)
{
    attach(CONN_A);
    expect_status(zd_job_detach(&job, &env, CONN_A, true, err, sizeof(err)), ZS_OK, NULL);
    cr_assert_null(job);
    spec.job_id = "job-2";
    attach(CONN_B);
    cr_assert(!out.resumed);
}

ZDT_TEST(zd_job, another_job_is_busy_while_one_is_attached_or_lingers)
{
    attach(CONN_A);
    spec.job_id = "job-2";
    expect_attach_refused(CONN_B, ZS_ERR_BUSY, "holds job 'job-1'");
    cr_assert(strstr(err, "attached by a live trainer") != NULL, "%s", err);
    cr_assert(strstr(err, "zeroctl job end job-1") != NULL, "%s", err);
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    expect_attach_refused(CONN_B, ZS_ERR_BUSY, "holds job 'job-1'");
    cr_assert(strstr(err, "for a re-attach (job_linger)") != NULL, "%s", err);
    cr_assert(strstr(err, "zeroctl job end job-1") != NULL, "%s", err);
}

ZDT_TEST(zd_job, a_reattach_while_the_trainer_is_attached_is_busy)
{
    attach(CONN_A);
    expect_attach_refused(CONN_B, ZS_ERR_BUSY, "attached by a live trainer");
    cr_assert(status().trainer_attached);
}

ZDT_TEST(zd_job, a_reattach_must_match_rank_layout_and_config)
{
    static const uint64_t other_numel[] = {10, 21};

    attach(CONN_A);
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    spec.numel = other_numel;
    expect_attach_refused(CONN_B, ZS_ERR_LAYOUT_MISMATCH, "layout hash");
    spec.numel = numel;
    spec.world = 2;
    expect_attach_refused(CONN_B, ZS_ERR_LAYOUT_MISMATCH, "as rank 0 of 2");
    spec.world = 1;
    spec.config_json = "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, "
                       "\"gradient_clipping\": 0, \"optimizer\": {\"params\": {\"lr\": 0.5}}}";
    expect_attach_refused(CONN_B, ZS_ERR_CONFIG, "config hash");
    spec.config_json = CONFIG_F32;
    attach(CONN_B); /* the job was kept through the refusals */
}

ZDT_TEST(zd_job, the_linger_drops_a_job_no_trainer_came_back_to)
{
    uint64_t left;

    attach(CONN_A);
    cr_assert_eq(zd_job_tick(&job, &env), UINT64_MAX, "an attached job has a linger deadline");
    expect_status(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    left = zd_job_tick(&job, &env);
    cr_assert_not_null(job);
    cr_assert(left > 0 && left <= env.job_linger_ns, "%llu ns left of the linger",
              (unsigned long long)left);
    attach(CONN_B); /* back within the linger: kept */
    env.job_linger_ns = 0;
    expect_status(zd_job_detach(&job, &env, CONN_B, false, err, sizeof(err)), ZS_OK, NULL);
    cr_assert_eq(zd_job_tick(&job, &env), UINT64_MAX);
    cr_assert_null(job, "the job outlived its linger");
}

/* With the partial micro-step dropped, the step after the re-attach sees a zero gradient, and
 * Adam's update is then exactly 0 / (0 + eps) = 0: the params stay bit-identical. */
ZDT_TEST(zd_job, a_disconnect_drops_the_partial_micro_step)
{
    static uint8_t before[PARAMS_MAX];

    zdt_expect_warn("partial micro-step dropped");
    attach(CONN_A);
    fill_f32(&params, 0, out.params_bytes / sizeof(float), 1.0f);
    params_ready(CONN_A);
    memcpy(before, params.addr, params.size);
    backward_f32(CONN_A, 0.5f);
    zd_job_disconnect(job, &env, CONN_A);
    cr_assert(!status().trainer_attached);
    attach(CONN_B);
    cr_assert(out.resumed);
    cr_assert_eq(step(CONN_B).step, 1);
    cr_assert(memcmp(params.addr, before, params.size) == 0,
              "the gradient of the dropped micro-step reached the params");
}

ZDT_TEST(zd_job, a_disconnect_of_another_connection_changes_nothing)
{
    attach(CONN_A);
    zd_job_disconnect(job, &env, CONN_B);
    zd_job_disconnect(NULL, &env, CONN_A);
    cr_assert(status().trainer_attached);
    params_ready(CONN_A);
}

/* ---- fp16: the loss scaler in the step ------------------------------------------------------ */

static void attach_f16(void)
{
    spec.dtype = ZS_DTYPE_F16;
    spec.config_json = CONFIG_F16;
    attach(CONN_A);
    cr_assert_eq(out.loss_scale, 256.0);
    fill_f16(&params, 0, out.params_bytes / 2, F16_ONE);
    params_ready(CONN_A);
}

static void backward_f16(uint16_t g)
{
    size_t per_slot = out.slot_bytes / 2;

    for (uint32_t b = 0; b < 2; b++) {
        fill_f16(&slots, b * per_slot, per_slot, g);
        expect_status(zd_job_bucket_ready(job, &env, CONN_A, b, b, 0, err, sizeof(err)), ZS_OK,
                      NULL);
    }
}

ZDT_TEST(zd_job, an_fp16_overflow_skips_the_step_and_halves_the_scale)
{
    static uint8_t before[PARAMS_MAX];
    zd_step_out_t o;

    attach_f16();
    memcpy(before, params.addr, params.size);
    backward_f16(F16_INF);
    o = step(CONN_A);
    cr_assert(o.skipped);
    cr_assert_eq(o.step, 0);
    cr_assert_eq(o.skipped_steps, 1);
    cr_assert_eq(o.loss_scale, 128.0);
    cr_assert_eq(o.grad_norm, -1.0);
    cr_assert(memcmp(params.addr, before, params.size) == 0, "a skipped step moved params");
    backward_f16(F16_ONE); /* the skipped step's gradients were dropped: this one counts */
    o = step(CONN_A);
    cr_assert(!o.skipped);
    cr_assert_eq(o.step, 1);
}

/* Weights written into the 16-bit params region after ParamsReady reach the master with a
 * reload, so the next step starts from them instead of undoing them. */
ZDT_TEST(zd_job, a_reload_takes_the_written_params_into_the_master)
{
    const uint16_t f16_two = 0x4000;
    const uint16_t *p;
    zd_step_out_t o;

    attach_f16();
    fill_f16(&params, 0, out.params_bytes / 2, f16_two);
    expect_status(zd_job_params_ready(job, &env, CONN_A, true, &ck_out, err, sizeof(err)), ZS_OK,
                  NULL);
    backward_f16(0); /* zero gradients: Adam moves nothing, the step recasts the master */
    o = step(CONN_A);
    cr_assert(!o.skipped);
    p = (const uint16_t *)params.addr;
    for (size_t i = 0; i < spec.numel[0]; i++) {
        cr_assert_eq(p[i], f16_two, "element %zu is 0x%04x after the step", i, p[i]);
    }
}

ZDT_TEST(zd_job, a_reload_before_the_parameters_is_refused)
{
    attach(CONN_A);
    expect_status(zd_job_params_ready(job, &env, CONN_A, true, &ck_out, err, sizeof(err)),
                  ZS_ERR_STATE, "no parameters to reload");
}

ZDT_TEST(zd_job, an_fp16_overflow_at_the_minimum_scale_is_an_error)
{
    zd_step_out_t o;

    zdt_expect_warn("already at its minimum");
    spec.dtype = ZS_DTYPE_F16;
    spec.config_json = "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, \"fp16\": "
                       "{\"enabled\": true, \"initial_scale_power\": 0, \"hysteresis\": 1}}";
    attach(CONN_A);
    fill_f16(&params, 0, out.params_bytes / 2, F16_ONE);
    params_ready(CONN_A);
    backward_f16(F16_INF);
    expect_status(zd_job_step(job, &env, CONN_A, NULL, 0, &o, err, sizeof(err)), ZS_ERR_LOSS_SCALE,
                  "fp16.min_loss_scale");
    cr_assert_eq(o.step, 0);
    cr_assert_eq(o.loss_scale, 1.0);
}
