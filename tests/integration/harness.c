#include "harness.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- conversions: written from the IEEE definitions, independent of kernels/ ---- */

uint16_t th_f32_to_f16(float f)
{
    uint32_t x;
    uint32_t sign, exp, mant;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (x >> 23) & 0xffu;
    mant = x & 0x7fffffu;
    if (exp == 0xff) {
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    }
    {
        double v = fabs((double)f);
        double scaled;
        int e;
        if (v == 0) {
            return (uint16_t)sign;
        }
        e = (int)floor(log2(v));
        if (e < -14) {
            e = -14; /* subnormal spacing 2^-24 */
        }
        scaled = v / ldexp(1.0, e - 10); /* in units of the ulp at this exponent */
        scaled = nearbyint(scaled);      /* RNE under the default rounding mode */
        v = scaled * ldexp(1.0, e - 10);
        if (v >= 65520.0 || v > 65504.0) {
            return (uint16_t)(sign | 0x7c00u);
        }
        /* re-encode exactly */
        if (v < ldexp(1.0, -14)) {
            return (uint16_t)(sign | (uint32_t)(v / ldexp(1.0, -24)));
        }
        e = (int)floor(log2(v));
        return (uint16_t)(sign | (uint32_t)(e + 15) << 10 |
                          ((uint32_t)(v / ldexp(1.0, e - 10)) & 0x3ffu));
    }
}

float th_f16_to_f32(uint16_t h)
{
    uint32_t sign = (h & 0x8000u) ? 1 : 0;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    double v;
    if (exp == 0x1f) {
        return mant ? NAN : (sign ? -INFINITY : INFINITY);
    }
    v = exp == 0 ? ldexp((double)mant, -24) : ldexp(1024.0 + mant, (int)exp - 25);
    return (float)(sign ? -v : v);
}

uint16_t th_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu)) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float th_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

float th_round(zc_dtype_t dt, float f)
{
    switch (dt) {
    case ZC_DTYPE_F16:
        return th_f16_to_f32(th_f32_to_f16(f));
    case ZC_DTYPE_BF16:
        return th_bf16_to_f32(th_f32_to_bf16(f));
    default:
        return f;
    }
}

void th_store(zc_dtype_t dt, void *base, uint64_t i, float f)
{
    switch (dt) {
    case ZC_DTYPE_F16:
        ((uint16_t *)base)[i] = th_f32_to_f16(f);
        break;
    case ZC_DTYPE_BF16:
        ((uint16_t *)base)[i] = th_f32_to_bf16(f);
        break;
    default:
        ((float *)base)[i] = f;
        break;
    }
}

float th_load(zc_dtype_t dt, const void *base, uint64_t i)
{
    switch (dt) {
    case ZC_DTYPE_F16:
        return th_f16_to_f32(((const uint16_t *)base)[i]);
    case ZC_DTYPE_BF16:
        return th_bf16_to_f32(((const uint16_t *)base)[i]);
    default:
        return ((const float *)base)[i];
    }
}

double th_ulp(zc_dtype_t dt, double x)
{
    int mant_bits = dt == ZC_DTYPE_F32 ? 23 : (dt == ZC_DTYPE_F16 ? 10 : 7);
    int min_exp = dt == ZC_DTYPE_F16 ? -14 : -126;
    int e;
    x = fabs(x);
    e = x > 0 ? (int)floor(log2(x)) : min_exp;
    if (e < min_exp) {
        e = min_exp;
    }
    return ldexp(1.0, e - mant_bits);
}

/* ---- sessions ---- */

const char *th_socket(void)
{
    const char *s = getenv("ZEROD_TEST_SOCKET");
    cr_assert_not_null(s, "ZEROD_TEST_SOCKET is not set (run through ctest)");
    return s;
}

static int th_try_attach_once(th_session_t *ts, const char *job, const th_model_t *model,
                              zc_dtype_t dtype, const char *config_json)
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
            uint32_t id, b2;
            uint64_t in_b;
            cr_assert_eq(zc_session_bucket_param(ts->s, b, i, &id), ZC_OK);
            cr_assert_eq(zc_session_param_bucket(ts->s, id, &b2, &in_b), ZC_OK);
            cr_assert_eq(b2, b);
            for (uint64_t e = 0; e < ts->model.numel[id]; e++) {
                th_store(ts->dtype, slot.data, in_b + e, grads[starts[id] + e]);
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

/* ---- fp64 reference ---- */

void th_ref_init(th_ref_t *r, const th_model_t *model, zc_dtype_t dtype, const float *init)
{
    memset(r, 0, sizeof(*r));
    r->model = model;
    r->dtype = dtype;
    r->check_overflow = dtype != ZC_DTYPE_F32;
    r->clipping = 1.0;
    r->G = 1;
    r->world = 1;
    r->mean = true;
    r->dynamic = dtype == ZC_DTYPE_F16;
    r->scale = dtype == ZC_DTYPE_F16 ? 65536.0 : 1.0;
    r->min_scale = 1;
    r->window = 1000;
    r->hyst_cfg = r->cur_hyst = 2;
    r->last_overflow = -1;
    for (int g = 0; g < TH_MAX_GROUPS; g++) {
        r->opts[g] = (th_opts_t){1e-3, 0.9, 0.999, 1e-8, 0, true, true};
    }
    r->p = calloc(model->total, sizeof(double));
    r->m = calloc(model->total, sizeof(double));
    r->v = calloc(model->total, sizeof(double));
    r->acc = calloc(model->total, sizeof(double));
    for (uint64_t i = 0; i < model->total; i++) {
        r->p[i] = th_round(dtype, init[i]); /* the daemon loads its master from the region */
    }
}

void th_ref_free(th_ref_t *r)
{
    free(r->p);
    free(r->m);
    free(r->v);
    free(r->acc);
}

void th_ref_accumulate(th_ref_t *r, const float *grads)
{
    for (uint64_t i = 0; i < r->model->total; i++) {
        r->acc[i] += (double)grads[i];
    }
}

bool th_ref_step(th_ref_t *r)
{
    const th_model_t *md = r->model;
    double sumsq = 0, S = r->scale, scaled_norm, c, nav, gs;
    bool nonfinite = false, overflow;
    uint64_t k = 0, t;

    for (uint64_t i = 0; i < md->total; i++) {
        if (!isfinite(r->acc[i])) {
            nonfinite = true;
        }
        sumsq += r->acc[i] * r->acc[i];
    }
    overflow = r->check_overflow && nonfinite;
    if (r->dynamic) {
        if (overflow) {
            if (r->hyst_cfg == 1 || r->cur_hyst == 1) {
                if (r->scale == r->min_scale) {
                    memset(r->acc, 0, md->total * sizeof(double));
                    return false;
                }
                r->scale = fmax(r->scale / 2, r->min_scale);
            } else {
                r->cur_hyst--;
            }
            r->last_overflow = r->cur_iter;
        } else {
            int64_t stable;
            if (r->consecutive) {
                r->cur_hyst = r->hyst_cfg;
            }
            stable = r->cur_iter - r->last_overflow - 1;
            if (stable > 0 && stable % r->window == 0) {
                if (!r->consecutive) {
                    r->cur_hyst = r->hyst_cfg;
                }
                r->scale *= 2;
            }
        }
        r->cur_iter++;
    }
    if (overflow) {
        memset(r->acc, 0, md->total * sizeof(double));
        r->skipped++;
        r->last_skipped = true;
        r->last_norm = -1;
        return true;
    }
    r->last_skipped = false;
    nav = r->mean ? r->world : 1;
    scaled_norm = sqrt(sumsq) / (nav * r->G);
    r->last_norm = isfinite(scaled_norm) ? scaled_norm / S : -1;
    c = S;
    if (r->clipping > 0) {
        c = fmax(1.0, (scaled_norm / S + 1e-6) / r->clipping) * S;
    }
    gs = 1.0 / (nav * r->G) / c;
    t = ++r->step;
    for (uint32_t g = 0; g < md->n_groups; g++) {
        const th_opts_t *o = &r->opts[g];
        double bc1 = o->bias_correction ? 1 - pow(o->beta1, (double)t) : 1;
        double bc2 = o->bias_correction ? 1 - pow(o->beta2, (double)t) : 1;
        for (uint32_t j = 0; j < md->gnp[g]; j++) {
            uint32_t id = 0;
            uint64_t n;
            for (uint32_t gg = 0; gg < g; gg++) {
                id += md->gnp[gg];
            }
            n = md->numel[id + j];
            for (uint64_t e = 0; e < n; e++, k++) {
                double gr = r->acc[k] * gs;
                double upd;
                if (!o->adam_w_mode) {
                    gr += o->wd * r->p[k];
                }
                r->m[k] = o->beta1 * r->m[k] + (1 - o->beta1) * gr;
                r->v[k] = o->beta2 * r->v[k] + (1 - o->beta2) * gr * gr;
                upd = (r->m[k] / bc1) / (sqrt(r->v[k] / bc2) + o->eps);
                if (o->adam_w_mode) {
                    upd += o->wd * r->p[k];
                }
                r->p[k] -= o->lr * upd;
                r->acc[k] = 0;
            }
        }
    }
    return true;
}

uint64_t th_rand_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double th_rand_unit(uint64_t *s)
{
    return (double)(th_rand_u64(s) >> 11) * 0x1.0p-52 - 1.0;
}
