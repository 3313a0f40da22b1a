/* Independent fp64 model of docs/semantics.md §4 and IEEE 16-bit conversions, shared by the
 * Criterion tests and the multi-rank test trainer (no Criterion here). */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

th_model_t th_model_by_name(const char *name)
{
    th_model_t m;

    memset(&m, 0, sizeof(m));
    if (strcmp(name, "tiny") == 0) {
        /* 5 elements: smaller than one slice at world 3 (16 elements): empty slices */
        m.n_groups = 1;
        m.gnp[0] = 2;
        m.numel[0] = 3;
        m.numel[1] = 2;
        m.n_params = 2;
    } else if (strcmp(name, "large") == 0) {
        /* 3.5 M elements in 2 groups, buckets of 4 Mi (slices of MiBs: kernel threads and
         * streaming stores in the collectives), sizes that divide nothing */
        m.n_groups = 2;
        m.gnp[0] = 1;
        m.gnp[1] = 1;
        m.numel[0] = 3000017;
        m.numel[1] = 500009;
        m.n_params = 2;
        m.group_json[1] = "{\"lr\": 0.005, \"weight_decay\": 0.1}";
    } else if (strcmp(name, "other") == 0) {
        m.n_groups = 1;
        m.gnp[0] = 1;
        m.numel[0] = 99;
        m.n_params = 1;
    } else {
        /* two groups, sizes that divide nothing, several buckets at reduce_bucket_size 64 */
        m.n_groups = 2;
        m.gnp[0] = 3;
        m.gnp[1] = 2;
        m.numel[0] = 37;
        m.numel[1] = 100;
        m.numel[2] = 5;
        m.numel[3] = 64;
        m.numel[4] = 3;
        m.n_params = 5;
        m.group_json[1] = "{\"lr\": 0.005, \"weight_decay\": 0.1}";
    }
    for (uint32_t i = 0; i < m.n_params; i++) {
        m.total += m.numel[i];
    }
    return m;
}

const char *th_config_json(const char *model, unsigned stage, bool bf16, unsigned accum)
{
    static char buf[1024];

    snprintf(buf, sizeof(buf),
             "{\"zero_optimization\": {\"stage\": %u, \"reduce_bucket_size\": %u},"
             " \"bf16\": {\"enabled\": %s}, \"gradient_accumulation_steps\": %u,"
             " \"gradient_clipping\": 1.0, \"optimizer\": {\"type\": \"AdamW\","
             " \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}}",
             stage, strcmp(model, "large") == 0 ? 4194304u : 64u, bf16 ? "true" : "false", accum);
    return buf;
}
