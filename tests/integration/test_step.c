/*
 * One daemon, one trainer (world 1): the step of docs/semantics.md §4 against an independent
 * fp64 model, stage 1 vs 2, accumulation, skipped steps, the loss scaler, clipping.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Two groups, sizes that divide nothing, several buckets (reduce_bucket_size 64). */
static th_model_t model_two_groups(void)
{
    th_model_t m = {.n_groups = 2, .gnp = {3, 2}, .numel = {37, 100, 5, 64, 3}, .n_params = 5};
    m.group_json[1] = "{\"lr\": 0.005, \"weight_decay\": 0.1}";
    m.total = 37 + 100 + 5 + 64 + 3;
    return m;
}

static void ref_opts_two_groups(th_ref_t *r)
{
    r->opts[0] = (th_opts_t){1e-2, 0.9, 0.999, 1e-8, 0.01, true, true};
    r->opts[1] = (th_opts_t){5e-3, 0.9, 0.999, 1e-8, 0.1, true, true};
}

static const char *config_for(zc_dtype_t dt, unsigned stage, unsigned G)
{
    static char buf[1024];
    snprintf(buf, sizeof(buf),
             "{\"zero_optimization\": {\"stage\": %u, \"reduce_bucket_size\": 64},"
             " \"fp16\": {\"enabled\": %s, \"initial_scale_power\": 12},"
             " \"bf16\": {\"enabled\": %s},"
             " \"gradient_accumulation_steps\": %u, \"gradient_clipping\": 1.0,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01,"
             " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.01}},"
             " \"train_micro_batch_size_per_gpu\": 4}",
             stage, dt == ZC_DTYPE_F16 ? "true" : "false", dt == ZC_DTYPE_BF16 ? "true" : "false",
             G);
    return buf;
}

/* Gradients for (step, micro): some steps large enough that clipping engages. */
static void make_grads(uint64_t seed, uint64_t step, uint32_t micro, const th_model_t *m,
                       double scale, zc_dtype_t dt, float *out)
{
    uint64_t st = seed * 1000003u + step * 97u + micro;
    double mag = (step % 4 == 3) ? 0.3 : 0.02;
    for (uint64_t i = 0; i < m->total; i++) {
        out[i] = th_round(dt, (float)(th_rand_unit(&st) * mag * scale));
    }
}

static void make_init(const th_model_t *m, float *out)
{
    uint64_t st = 42;
    for (uint64_t i = 0; i < m->total; i++) {
        out[i] = (float)th_rand_unit(&st);
    }
}

/*
 * Tolerance. The daemon keeps an fp32 master; the reference fp64. Per step the fp32 update
 * p - lr * (m̂ / (sqrt(v̂) + eps) + wd * p) rounds the master once (0.5 ulp) and the update
 * term carries a relative error of a few fp32 ulp (scale product, m and v recurrences, sqrt,
 * division: <= 8 ulp together), i.e. <= 8 * 2^-24 * lr in absolute terms since |m̂/sqrt(v̂)|
 * <= ~1. Over n steps the errors add: n * (0.5 ulp32(p) + 8 * 2^-24 * (lr + wd)). A 16-bit
 * param is the master rounded to the dtype, so it may sit one dtype ulp from the rounded
 * reference when the two masters straddle a rounding boundary.
 */
static double tolerance(zc_dtype_t dt, double p, unsigned n_steps)
{
    double t = n_steps * (0.5 * th_ulp(ZC_DTYPE_F32, p) + 8 * 0x1p-24 * (1e-2 + 0.1));
    if (dt != ZC_DTYPE_F32) {
        t += th_ulp(dt, p);
    }
    return t;
}

static void run_vs_reference(zc_dtype_t dt, unsigned stage, unsigned G, const char *job)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    th_ref_t ref;
    float *init = calloc(m.total, sizeof(float));
    float *grads = calloc(m.total, sizeof(float));
    float *params = calloc(m.total, sizeof(float));
    const unsigned steps = 20;
    unsigned clipped = 0, skipped = 0;

    make_init(&m, init);
    th_attach(&ts, job, &m, dt, config_for(dt, stage, G));
    cr_assert_eq(ts.info.resumed, 0);
    cr_assert_eq(ts.info.stage, stage);
    th_init_params(&ts, init);
    th_ref_init(&ref, &m, dt, init);
    ref_opts_two_groups(&ref);
    ref.G = G;
    if (dt == ZC_DTYPE_F16) {
        ref.scale = 4096; /* initial_scale_power 12 */
    }
    cr_assert_eq(ts.info.loss_scale, ref.scale);

    for (unsigned s = 0; s < steps; s++) {
        zc_step_result_t res;
        int st;
        for (unsigned g = 0; g < G; g++) {
            make_grads(1, s, g, &m, ref.scale, dt, grads);
            th_submit(&ts, grads, g);
            th_ref_accumulate(&ref, grads);
        }
        st = th_step(&ts, &res);
        cr_assert_eq(st, ZC_OK, "step %u: %s", s, zc_last_error());
        cr_assert(th_ref_step(&ref));
        cr_assert_eq(res.skipped, ref.last_skipped, "step %u: skipped %d, reference %d", s,
                     res.skipped, ref.last_skipped);
        cr_assert_eq(res.loss_scale, ref.scale, "step %u: loss scale %g, reference %g", s,
                     res.loss_scale, ref.scale);
        cr_assert_eq(res.step, ref.step);
        if (!ref.last_skipped) {
            /* the norm is a sum of squares: fp32 accumulation vs fp64, relative 1e-5 */
            cr_assert(fabs(res.grad_norm - ref.last_norm) <= 1e-5 * ref.last_norm,
                      "step %u: grad_norm %.9g, reference %.9g", s, res.grad_norm, ref.last_norm);
            clipped += ref.last_norm > 1.0;
        } else {
            skipped++;
            cr_assert_eq(res.grad_norm, -1);
        }
    }
    th_read_params(&ts, params);
    for (uint64_t i = 0; i < m.total; i++) {
        double tol = tolerance(dt, ref.p[i], steps);
        cr_assert(fabs((double)params[i] - ref.p[i]) <= tol,
                  "%s stage %u G %u: element %lu = %.9g, reference %.9g (tolerance %.3g)",
                  dt == ZC_DTYPE_F32 ? "fp32" : (dt == ZC_DTYPE_F16 ? "fp16" : "bf16"), stage, G, i,
                  params[i], ref.p[i], tol);
    }
    cr_assert_gt(clipped, 0, "no step engaged clipping: the test lost its point");
    cr_log_info("%s: %u steps, %u clipped, %u skipped", job, steps, clipped, skipped);
    th_end(&ts);
    th_ref_free(&ref);
    free(init);
    free(grads);
    free(params);
}

Test(zerod_step, fp32_matches_fp64_reference)
{
    run_vs_reference(ZC_DTYPE_F32, 2, 1, "step-fp32");
}

Test(zerod_step, fp16_dynamic_scale_matches_fp64_reference)
{
    run_vs_reference(ZC_DTYPE_F16, 2, 1, "step-fp16");
}

Test(zerod_step, bf16_matches_fp64_reference)
{
    run_vs_reference(ZC_DTYPE_BF16, 2, 1, "step-bf16");
}

Test(zerod_step, stage1_matches_fp64_reference)
{
    run_vs_reference(ZC_DTYPE_F32, 1, 1, "step-stage1");
}

Test(zerod_step, accumulation_matches_fp64_reference)
{
    run_vs_reference(ZC_DTYPE_F32, 2, 3, "step-accum");
}

/* Run `steps` steps of a job and return its params (caller frees). */
static float *run_job(const char *job, unsigned stage, unsigned G, unsigned steps, bool fold)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    float *init = calloc(m.total, sizeof(float));
    float *grads = calloc(m.total, sizeof(float));
    double *sum = calloc(m.total, sizeof(double));
    float *params = calloc(m.total, sizeof(float));

    make_init(&m, init);
    th_attach(&ts, job, &m, ZC_DTYPE_F32, config_for(ZC_DTYPE_F32, stage, fold ? 1 : G));
    th_init_params(&ts, init);
    for (unsigned s = 0; s < steps; s++) {
        zc_step_result_t res;
        if (fold) {
            /* one big batch: the mean of the G micro-batch gradients */
            memset(sum, 0, m.total * sizeof(double));
            for (unsigned g = 0; g < G; g++) {
                make_grads(7, s, g, &m, 1, ZC_DTYPE_F32, grads);
                for (uint64_t i = 0; i < m.total; i++) {
                    sum[i] += grads[i];
                }
            }
            for (uint64_t i = 0; i < m.total; i++) {
                grads[i] = (float)(sum[i] / G);
            }
            th_submit(&ts, grads, 0);
        } else {
            for (unsigned g = 0; g < G; g++) {
                make_grads(7, s, g, &m, 1, ZC_DTYPE_F32, grads);
                th_submit(&ts, grads, g);
            }
        }
        cr_assert_eq(th_step(&ts, &res), ZC_OK, "%s step %u: %s", job, s, zc_last_error());
    }
    th_read_params(&ts, params);
    th_end(&ts);
    free(init);
    free(grads);
    free(sum);
    return params;
}

Test(zerod_step, stage1_equals_stage2)
{
    th_model_t m = model_two_groups();
    float *p1 = run_job("s1", 1, 2, 10, false);
    float *p2 = run_job("s2", 2, 2, 10, false);

    /* World 1 in fp32: stage 2 sums micro-steps into the fp32 accumulator, stage 1 sums them
     * in the fp32 grads region and adds that to a zero accumulator: the same additions in
     * the same order, so the results are bit-identical. */
    cr_assert_eq(memcmp(p1, p2, m.total * sizeof(float)), 0, "stage 1 and 2 differ");
    free(p1);
    free(p2);
}

Test(zerod_step, micro_steps_equal_one_big_batch)
{
    th_model_t m = model_two_groups();
    float *pa = run_job("accum4", 2, 4, 10, false);
    float *pb = run_job("big1", 2, 4, 10, true);

    /* fp32, relative 1e-6 after 10 steps (docs/semantics.md) */
    for (uint64_t i = 0; i < m.total; i++) {
        double d = fabs((double)pa[i] - pb[i]);
        cr_assert(d <= 1e-6 * fmax(1.0, fabs(pb[i])), "element %lu: %.9g vs %.9g", i, pa[i], pb[i]);
    }
    free(pa);
    free(pb);
}

Test(zerod_step, inf_gradient_skips_and_leaves_everything_bit_identical)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    th_ref_t ref;
    float *init = calloc(m.total, sizeof(float));
    float *grads = calloc(m.total, sizeof(float));
    float *before = calloc(m.total, sizeof(float));
    float *after = calloc(m.total, sizeof(float));
    zc_step_result_t res;

    make_init(&m, init);
    th_attach(&ts, "skip", &m, ZC_DTYPE_F16, config_for(ZC_DTYPE_F16, 2, 1));
    th_init_params(&ts, init);
    th_ref_init(&ref, &m, ZC_DTYPE_F16, init);
    ref_opts_two_groups(&ref);
    ref.scale = 4096;
    for (unsigned s = 0; s < 3; s++) {
        make_grads(3, s, 0, &m, ref.scale, ZC_DTYPE_F16, grads);
        th_submit(&ts, grads, 0);
        th_ref_accumulate(&ref, grads);
        cr_assert_eq(th_step(&ts, &res), ZC_OK);
        th_ref_step(&ref);
    }
    th_read_params(&ts, before);
    /* one inf in the last element of the last bucket (the tail of the shard) */
    make_grads(3, 3, 0, &m, ref.scale, ZC_DTYPE_F16, grads);
    grads[m.total - 1] = INFINITY;
    th_submit(&ts, grads, 0);
    cr_assert_eq(th_step(&ts, &res), ZC_OK);
    cr_assert_eq(res.skipped, 1);
    cr_assert_eq(res.step, 3, "a skipped step does not count");
    cr_assert_eq(res.skipped_steps, 1);
    cr_assert_eq(res.grad_norm, -1);
    th_read_params(&ts, after);
    cr_assert_eq(memcmp(before, after, m.total * sizeof(float)), 0, "params changed on a skip");
    th_ref_accumulate(&ref, grads);
    th_ref_step(&ref);
    cr_assert(ref.last_skipped);
    cr_assert_eq(res.loss_scale, ref.scale);

    /* m, v and the step count are untouched too: the following steps still match a
     * reference in which the skipped step only moved the scaler */
    for (unsigned s = 4; s < 8; s++) {
        make_grads(3, s, 0, &m, ref.scale, ZC_DTYPE_F16, grads);
        th_submit(&ts, grads, 0);
        th_ref_accumulate(&ref, grads);
        cr_assert_eq(th_step(&ts, &res), ZC_OK);
        th_ref_step(&ref);
        cr_assert_eq(res.step, ref.step);
    }
    th_read_params(&ts, after);
    for (uint64_t i = 0; i < m.total; i++) {
        cr_assert(fabs((double)after[i] - ref.p[i]) <= tolerance(ZC_DTYPE_F16, ref.p[i], 8),
                  "element %lu: %.9g vs %.9g", i, after[i], ref.p[i]);
    }
    th_end(&ts);
    th_ref_free(&ref);
    free(init);
    free(grads);
    free(before);
    free(after);
}

Test(zerod_step, loss_scaler_follows_semantics)
{
    /* window 3, hysteresis 2, scale 2^4, floor 2: the sequence below halves, waits out
     * hysteresis, doubles after the window, and ends at the floor with an error. */
    static const char *cfg =
        "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 64},"
        " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 4, \"loss_scale_window\": 3,"
        " \"hysteresis\": 2, \"min_loss_scale\": 2}, \"gradient_clipping\": 0}";
    /* 1 = overflow */
    static const int seq[] = {1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    th_model_t m = model_two_groups();
    th_session_t ts;
    th_ref_t ref;
    float *init = calloc(m.total, sizeof(float));
    float *grads = calloc(m.total, sizeof(float));
    bool saw_double = false, saw_floor_error = false;

    make_init(&m, init);
    th_attach(&ts, "scaler", &m, ZC_DTYPE_F16, cfg);
    th_init_params(&ts, init);
    th_ref_init(&ref, &m, ZC_DTYPE_F16, init);
    ref.scale = 16;
    ref.window = 3;
    ref.min_scale = 2;
    ref.clipping = 0;
    for (size_t s = 0; s < sizeof(seq) / sizeof(seq[0]); s++) {
        zc_step_result_t res;
        double prev = ref.scale;
        bool ok;
        int st;
        make_grads(5, s, 0, &m, ref.scale, ZC_DTYPE_F16, grads);
        if (seq[s]) {
            grads[s % m.total] = NAN;
        }
        th_submit(&ts, grads, 0);
        th_ref_accumulate(&ref, grads);
        st = th_step(&ts, &res);
        ok = th_ref_step(&ref);
        if (!ok) {
            cr_assert_eq(st, ZC_ERR_LOSS_SCALE, "step %zu: expected the floor error", s);
            cr_assert(strstr(zc_last_error(), "min_loss_scale") != NULL, "%s", zc_last_error());
            saw_floor_error = true;
            break;
        }
        cr_assert_eq(st, ZC_OK, "step %zu: %s", s, zc_last_error());
        cr_assert_eq(res.skipped, seq[s], "step %zu", s);
        cr_assert_eq(res.loss_scale, ref.scale, "step %zu: scale %g, reference %g", s,
                     res.loss_scale, ref.scale);
        saw_double |= ref.scale > prev;
    }
    cr_assert(saw_double, "the sequence never doubled the scale");
    cr_assert(saw_floor_error, "the sequence never reached the floor");
    th_end(&ts);
    th_ref_free(&ref);
    free(init);
    free(grads);
}

Test(zerod_step, clipping_engages_and_reports_the_norm)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    float *init = calloc(m.total, sizeof(float));
    float *grads = calloc(m.total, sizeof(float));
    zc_step_result_t res;
    double norm = 0;

    make_init(&m, init);
    th_attach(&ts, "clip", &m, ZC_DTYPE_F32, config_for(ZC_DTYPE_F32, 2, 1));
    th_init_params(&ts, init);
    for (uint64_t i = 0; i < m.total; i++) {
        grads[i] = (float)(i % 7) - 3.0f;
        norm += (double)grads[i] * grads[i];
    }
    norm = sqrt(norm);
    th_submit(&ts, grads, 0);
    cr_assert_eq(th_step(&ts, &res), ZC_OK);
    cr_assert_gt(norm, 1.0, "the gradient must exceed gradient_clipping = 1");
    cr_assert(fabs(res.grad_norm - norm) <= 1e-6 * norm, "grad_norm %.9g, want %.9g", res.grad_norm,
              norm);
    th_end(&ts);
    free(init);
    free(grads);
}

/* Weights written into the params region after ParamsReady reach the master: fp32's region is
 * the master itself; a 16-bit write is followed by zc_session_params_reload. A step with zero
 * gradients (Adam moves nothing; the weight decay scales by at most 1 - 5e-4) then keeps the
 * written values, 0.5 away from the ones the master held. */
static void written_params_reach_the_master(zc_dtype_t dt, const char *job)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    float *init = calloc(m.total, sizeof(float));
    float *zero = calloc(m.total, sizeof(float));
    float *got = calloc(m.total, sizeof(float));
    zc_step_result_t res;
    uint64_t k = 0;

    cr_assert(init != NULL && zero != NULL && got != NULL);
    make_init(&m, init);
    th_attach(&ts, job, &m, dt, config_for(dt, 2, 1));
    th_init_params(&ts, init);
    for (uint32_t id = 0; id < m.n_params; id++) {
        void *p = zc_session_param_ptr(ts.s, id);
        for (uint64_t i = 0; i < m.numel[id]; i++, k++) {
            init[k] = th_round(dt, init[k] + 0.5f);
            th_store(dt, p, i, init[k]);
        }
    }
    cr_assert_eq(zc_session_params_reload(ts.s), ZC_OK, "%s", zc_last_error());
    th_submit(&ts, zero, 0);
    cr_assert_eq(th_step(&ts, &res), ZC_OK, "%s", zc_last_error());
    th_read_params(&ts, got);
    for (k = 0; k < m.total; k++) {
        cr_assert(fabsf(got[k] - init[k]) <= 0.01f,
                  "%s element %llu: %g after the step, %g written", job, (unsigned long long)k,
                  got[k], init[k]);
    }
    th_end(&ts);
    free(init);
    free(zero);
    free(got);
}

Test(zerod_step, fp32_params_written_after_ready_are_the_master)
{
    written_params_reach_the_master(ZC_DTYPE_F32, "w_fp32");
}

Test(zerod_step, bf16_params_written_after_ready_reach_the_master_on_reload)
{
    written_params_reach_the_master(ZC_DTYPE_BF16, "w_bf16");
}

Test(zerod_step, fp16_params_written_after_ready_reach_the_master_on_reload)
{
    written_params_reach_the_master(ZC_DTYPE_F16, "w_fp16");
}

/* zc_session_init_param at world 1 (no shared region): the whole parameter goes in, and once
 * the parameters are the daemon's it is refused. */
Test(zerod_step, init_param_writes_the_whole_parameter_until_ready)
{
    th_model_t m = model_two_groups();
    th_session_t ts;
    float *init = calloc(m.total, sizeof(float));
    const float *p;
    uint64_t k = 0;

    cr_assert_not_null(init);
    make_init(&m, init);
    th_attach(&ts, "init_param", &m, ZC_DTYPE_F32, config_for(ZC_DTYPE_F32, 2, 1));
    cr_assert_eq(zc_session_params_shared(ts.s), 0, "world 1 has no shared params region");
    for (uint32_t id = 0; id < m.n_params; k += m.numel[id], id++) {
        cr_assert_eq(zc_session_init_param(ts.s, id, init + k), ZC_OK, "%s", zc_last_error());
        p = zc_session_param_ptr(ts.s, id);
        cr_assert_eq(memcmp(p, init + k, m.numel[id] * sizeof(float)), 0, "parameter %u", id);
    }
    cr_assert_eq(zc_session_init_param(ts.s, m.n_params, init), ZC_ERR_INVALID);
    cr_assert_eq(zc_session_params_ready(ts.s), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_init_param(ts.s, 0, init), ZC_ERR_STATE);
    cr_assert(strstr(zc_last_error(), "init_param") != NULL, "%s", zc_last_error());
    th_end(&ts);
    free(init);
}
