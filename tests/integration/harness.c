#include "harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- sessions ---- */

const char *th_socket(void)
{
    const char *s = getenv("ZEROD_TEST_SOCKET");
    cr_assert_not_null(s, "ZEROD_TEST_SOCKET is not set (run through ctest)");
    return s;
}

int th_try_attach_once(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
                       const char *config_json)
{
    zc_open_params_t op = {0};
    zc_attach_params_t ap = {0};
    zc_group_t groups[TH_MAX_GROUPS];
    uint32_t k = 0;
    int st;

    memset(ts, 0, sizeof(*ts));
    ts->model = *model;
    ts->dtype = dtype;
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS;
    op.socket_path = th_socket();
    op.timeout_ms = 20000;
    st = zc_session_open(&op, &ts->s);
    if (st != ZC_OK) {
        return st;
    }
    for (uint32_t g = 0; g < model->n_groups; g++) {
        groups[g].n_params = model->gnp[g];
        groups[g].numel = &ts->model.numel[k];
        groups[g].options_json = model->group_json[g];
        k += model->gnp[g];
    }
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS |
                    ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = job;
    ap.dtype = dtype;
    ap.n_groups = model->n_groups;
    ap.groups = groups;
    ap.config_json = config_json;
    st = zc_session_attach(ts->s, &ap, &ts->info);
    if (st != ZC_OK) {
        zc_session_close(ts->s);
        ts->s = NULL;
    }
    return st;
}

/* A test that failed before detaching leaves its job to linger (the fixtures use a short
 * job_linger): retry while the daemon answers busy, up to 10 s. */
int th_try_attach(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
                  const char *config_json)
{
    int st;
    for (int i = 0; i < 100; i++) {
        st = th_try_attach_once(ts, job, model, dtype, config_json);
        if (st != ZC_ERR_BUSY) {
            break;
        }
        usleep(100000);
    }
    return st;
}

void th_attach(th_session_t *ts, const char *job, const th_model_t *model, zc_dtype_t dtype,
               const char *config_json)
{
    int st = th_try_attach(ts, job, model, dtype, config_json);
    cr_assert_eq(st, ZC_OK, "attach '%s': %s: %s", job, zc_status_name(st), zc_last_error());
}

void th_init_params(th_session_t *ts, const float *init)
{
    uint64_t k = 0;
    int st;
    for (uint32_t id = 0; id < ts->model.n_params; id++) {
        void *p = zc_session_param_ptr(ts->s, id);
        cr_assert_not_null(p);
        for (uint64_t i = 0; i < ts->model.numel[id]; i++) {
            th_store(ts->dtype, p, i, init[k++]);
        }
    }
    st = zc_session_params_ready(ts->s);
    cr_assert_eq(st, ZC_OK, "params_ready: %s", zc_last_error());
}

void th_submit(th_session_t *ts, const float *grads, uint32_t micro_step)
{
    uint64_t starts[TH_MAX_PARAMS];
    uint64_t k = 0;

    for (uint32_t id = 0; id < ts->model.n_params; id++) {
        starts[id] = k;
        k += ts->model.numel[id];
    }
    if (ts->info.stage == 1) {
        /* add into the full-gradient region, which has the layout of the params region */
        for (uint32_t id = 0; id < ts->model.n_params; id++) {
            void *gp = zc_session_param_grad_ptr(ts->s, id);
            cr_assert_not_null(gp, "param_grad_ptr(%u): %s", id, zc_last_error());
            for (uint64_t i = 0; i < ts->model.numel[id]; i++) {
                float cur = th_load(ts->dtype, gp, i);
                th_store(ts->dtype, gp, i, cur + grads[starts[id] + i]);
            }
        }
        return;
    }
    for (uint32_t b = 0; b < ts->info.n_buckets; b++) {
        zc_bucket_info_t bi;
        zc_slot_t slot;
        int st;

        cr_assert_eq(zc_session_bucket_info(ts->s, b, &bi), ZC_OK);
        st = zc_session_slot_acquire(ts->s, b, -1, &slot);
        cr_assert_eq(st, ZC_OK, "slot_acquire: %s", zc_last_error());
        for (uint32_t i = 0; i < bi.n_params; i++) {
            zc_bucket_piece_t pc;
            cr_assert_eq(zc_session_bucket_piece(ts->s, b, i, &pc), ZC_OK);
            for (uint64_t e = 0; e < pc.numel; e++) {
                th_store(ts->dtype, slot.data, pc.slot_offset + e,
                         grads[starts[pc.id] + pc.param_offset + e]);
            }
        }
        st = zc_session_slot_submit(ts->s, &slot, micro_step);
        cr_assert_eq(st, ZC_OK, "slot_submit: %s", zc_last_error());
    }
}

int th_step(th_session_t *ts, zc_step_result_t *res)
{
    return zc_session_step(ts->s, NULL, res);
}

void th_read_params(th_session_t *ts, float *out)
{
    uint64_t k = 0;
    for (uint32_t id = 0; id < ts->model.n_params; id++) {
        const void *p = zc_session_param_ptr(ts->s, id);
        for (uint64_t i = 0; i < ts->model.numel[id]; i++) {
            out[k++] = th_load(ts->dtype, p, i);
        }
    }
}

void th_end(th_session_t *ts)
{
    if (ts->s != NULL) {
        int st = zc_session_detach(ts->s, 1);
        cr_assert_eq(st, ZC_OK, "detach: %s", zc_last_error());
        zc_session_close(ts->s);
        ts->s = NULL;
    }
}
