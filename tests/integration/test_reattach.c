/*
 * A lingering job (docs/architecture.md): the trainer goes away without ending the job; a re-attach
 * with the same job id and layout resumes at the last completed step with the same values;
 * a different layout or config is refused naming both hashes; another job is busy.
 */
#include "harness.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static const char *cfg_a = "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 64},"
                           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}";
static const char *cfg_b = "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 64},"
                           " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.02}}}";

static th_model_t model(uint64_t last)
{
    th_model_t m = {.n_groups = 1, .gnp = {3}, .numel = {40, 7, last}, .n_params = 3};
    m.total = 40 + 7 + last;
    return m;
}

Test(zerod_reattach, resumes_and_refuses_other_layouts_configs_and_jobs)
{
    th_model_t ma = model(20), mb = model(21);
    th_session_t ts, other;
    float *init = calloc(ma.total, sizeof(float));
    float *grads = calloc(ma.total, sizeof(float));
    float *before = calloc(ma.total, sizeof(float));
    float *after = calloc(ma.total, sizeof(float));
    uint64_t seed = 7;
    zc_step_result_t res;
    int st;

    for (uint64_t i = 0; i < ma.total; i++) {
        init[i] = (float)th_rand_unit(&seed);
        grads[i] = (float)th_rand_unit(&seed) * 0.1f;
    }
    th_attach(&ts, "linger", &ma, ZC_DTYPE_F32, cfg_a);
    th_init_params(&ts, init);
    for (int s = 0; s < 2; s++) {
        th_submit(&ts, grads, 0);
        cr_assert_eq(th_step(&ts, &res), ZC_OK, "%s", zc_last_error());
    }
    th_read_params(&ts, before);
    /* the trainer goes away without ending the job */
    zc_session_close(ts.s);
    ts.s = NULL;

    st = th_try_attach(&other, "linger", &mb, ZC_DTYPE_F32, cfg_a);
    cr_assert_eq(st, ZC_ERR_LAYOUT_MISMATCH, "got %s", zc_status_name(st));
    cr_assert(strstr(zc_last_error(), "layout hash 0x") != NULL &&
                  strstr(zc_last_error(), "but the job has layout hash 0x") != NULL,
              "message must name both hashes: %s", zc_last_error());

    st = th_try_attach(&other, "linger", &ma, ZC_DTYPE_F32, cfg_b);
    cr_assert_eq(st, ZC_ERR_CONFIG, "got %s", zc_status_name(st));
    cr_assert(strstr(zc_last_error(), "config hash") != NULL, "%s", zc_last_error());

    st = th_try_attach_once(&other, "another-job", &ma, ZC_DTYPE_F32, cfg_a);
    cr_assert_eq(st, ZC_ERR_BUSY, "got %s", zc_status_name(st));
    cr_assert(strstr(zc_last_error(), "linger") != NULL, "%s", zc_last_error());

    th_attach(&ts, "linger", &ma, ZC_DTYPE_F32, cfg_a);
    cr_assert_eq(ts.info.resumed, 1);
    cr_assert_eq(ts.info.step, 2);
    th_read_params(&ts, after);
    cr_assert_eq(memcmp(before, after, ma.total * sizeof(float)), 0,
                 "a resumed job shows its parameters as they were");
    th_submit(&ts, grads, 0);
    cr_assert_eq(th_step(&ts, &res), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(res.step, 3);
    th_end(&ts);
    free(init);
    free(grads);
    free(before);
    free(after);
}

/* A trainer that re-attaches in place (zerod.torch with replication = buddy): after a
 * disconnect the old session's regions stay mapped and a held slot can still be copied out;
 * a new session then re-attaches the job at its step. At world 1 the job keeps no replica. */
Test(zerod_reattach, disconnect_keeps_the_regions_for_a_reattach_in_place)
{
    th_model_t m = model(20);
    th_session_t ts, again;
    float *init = calloc(m.total, sizeof(float));
    float *before = calloc(m.total, sizeof(float));
    float *kept = NULL;
    const float *p0;
    zc_bucket_info_t bi;
    zc_slot_t slot;
    zc_step_result_t res;

    for (uint64_t i = 0; i < m.total; i++) {
        init[i] = (float)i * 0.25f;
    }
    th_attach(&ts, "inplace", &m, ZC_DTYPE_F32, cfg_a);
    th_init_params(&ts, init);
    cr_assert_eq(zc_session_replicated(ts.s), 0, "world 1 keeps no replica");
    cr_assert_eq(zc_session_bucket_info(ts.s, 0, &bi), ZC_OK, "%s", zc_last_error());
    kept = calloc(bi.padded, sizeof(float));
    cr_assert_eq(zc_session_slot_acquire(ts.s, 0, -1, &slot), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_slot_fill(ts.s, &slot, 0, init, bi.numel), ZC_OK, "%s",
                 zc_last_error());
    cr_assert_eq(zc_session_slot_copy_out(ts.s, &slot, NULL), ZC_ERR_INVALID);
    th_read_params(&ts, before);
    p0 = zc_session_param_ptr(ts.s, 0);

    zc_session_disconnect(ts.s);
    cr_assert_eq(zc_session_slot_copy_out(ts.s, &slot, kept), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(memcmp(kept, init, bi.numel * sizeof(float)), 0, "the slot's bucket copied out");
    cr_assert_eq(memcmp(p0, before, m.numel[0] * sizeof(float)), 0,
                 "the params region stays mapped after a disconnect");
    cr_assert_eq(zc_session_step(ts.s, NULL, &res), ZC_ERR_CLOSED,
                 "a disconnected session "
                 "talks to no daemon");

    cr_assert_eq(th_try_attach(&again, "inplace", &m, ZC_DTYPE_F32, cfg_a), ZC_OK, "%s",
                 zc_last_error());
    cr_assert_eq(again.info.resumed, 1);
    cr_assert_eq(again.info.step, 0);
    zc_session_close(ts.s);
    th_end(&again);
    free(init);
    free(before);
    free(kept);
}
