/*
 * zk_adam_step against fp64 references of docs/semantics.md §4 steps 6-7: one step on fresh random
 * data at every length, misalignment, destination dtype, AdamW/L2 and bias correction on/off;
 * ten steps against torch.optim.AdamW's formula; bit for bit DeepSpeed's CPU Adam arithmetic.
 * Tolerances come from the error model of zk_test.h (every fp32 rounding of the kernel's operation
 * order, propagated), not from tuning.
 */
#include "zk_test.h"

#define ZT_NONE  (-1) /* no destination buffer */
#define ZT_GUARD 16   /* sentinel fp32 elements after each buffer */

static zk_adam_params_t zt_random_params(int adam_w_mode, int bias_correction)
{
    zk_adam_params_t p = {
        .lr = (float)exp2(zt_uniform(-17, -6)),
        .beta1 = (float)zt_uniform(0.8, 0.95),
        .beta2 = (float)zt_uniform(0.99, 0.9999),
        .eps = (zt_u64() & 1) ? 1e-8f : 1e-6f,
        .weight_decay = (float)zt_uniform(0.0, 0.1),
        .adam_w_mode = adam_w_mode,
        .bias_correction = bias_correction,
        .step = 1 + zt_u64() % 2000,
        .grad_scale = (float)exp2(zt_uniform(-16, 0)),
    };
    return p;
}

/* A coefficient the kernel got as the fp32 value c, whose exact value is x. */
static zt_ev_t zt_kcoef(double x, float c)
{
    return (zt_ev_t){x, fabs((double)c - x)};
}

/* beta^t as docs/semantics.md §4 step 6 defines it: t fp32 multiplications, in order */
static float zt_fpow(float beta, uint64_t t)
{
    float x = 1.0f;

    for (uint64_t i = 0; i < t; i++) {
        x *= beta;
    }
    return x;
}

/* The step's coefficients in fp32 as docs/semantics.md writes them (DeepSpeed's CPU Adam):
 * -lr / bc1, 1 / sqrt(bc2) and -lr * wd (AdamW; 0 otherwise), bc from the fp32 beta^t. */
typedef struct zt_coef32 {
    float neg_step_size, inv_sqrt_bc2, neg_lr_wd;
} zt_coef32_t;

static zt_coef32_t zt_coef32(const zk_adam_params_t *P)
{
    float bc1 = P->bias_correction ? 1.0f - zt_fpow(P->beta1, P->step) : 1.0f;
    float bc2 = P->bias_correction ? 1.0f - zt_fpow(P->beta2, P->step) : 1.0f;

    return (zt_coef32_t){-P->lr / bc1, 1.0f / sqrtf(bc2),
                         P->adam_w_mode ? -P->lr * P->weight_decay : 0.0f};
}

/* One step's coefficients, computed once per step and shared by every element: the exact
 * (fp64) values, and the fp32 ones the kernel uses, each carrying its distance from the exact
 * value in the error model. zt_fpow loops `step` times, so it must never run per element. */
typedef struct zt_adam_ref {
    double bc1, bc2; /* exact bias corrections */
    zt_ev_t gs, wdl2, b1, omb1, b2, omb2, isb2, nss, nlrwd, eps;
} zt_adam_ref_t;

static zt_adam_ref_t zt_adam_ref(const zk_adam_params_t *P)
{
    double bc1 = P->bias_correction ? 1.0 - pow(P->beta1, (double)P->step) : 1.0;
    double bc2 = P->bias_correction ? 1.0 - pow(P->beta2, (double)P->step) : 1.0;
    double wd = P->weight_decay;
    zt_coef32_t k = zt_coef32(P);

    return (zt_adam_ref_t){
        .bc1 = bc1,
        .bc2 = bc2,
        .gs = zt_ev(P->grad_scale),
        .wdl2 = zt_ev(P->adam_w_mode ? 0.0 : wd),
        .b1 = zt_ev(P->beta1),
        .omb1 = zt_kcoef(1.0 - P->beta1, 1.0f - P->beta1),
        .b2 = zt_ev(P->beta2),
        .omb2 = zt_kcoef(1.0 - P->beta2, 1.0f - P->beta2),
        .isb2 = zt_kcoef(1.0 / sqrt(bc2), k.inv_sqrt_bc2),
        .nss = zt_kcoef(-P->lr / bc1, k.neg_step_size),
        .nlrwd = zt_kcoef(P->adam_w_mode ? -(double)P->lr * wd : 0.0, k.neg_lr_wd),
        .eps = zt_ev(P->eps),
    };
}

/* The kernel's operation order (zk/elem.h ZK_ADAM_LANE) in the error model, with the step's
 * coefficients R = zt_adam_ref(P). */
static void zt_adam_chain(const zt_adam_ref_t *R, zt_ev_t acc, zt_ev_t *p, zt_ev_t *m, zt_ev_t *v)
{
    zt_ev_t g = zt_fma(*p, R->wdl2, zt_mul(acc, R->gs));

    *m = zt_fma(g, R->omb1, zt_mul(R->b1, *m));
    *v = zt_fma(zt_mul(g, g), R->omb2, zt_mul(R->b2, *v));
    *p = zt_fma(*p, R->nlrwd, *p);
    *p = zt_fma(zt_div(*m, zt_fma(zt_sqrt(*v), R->isb2, R->eps)), R->nss, *p);
}

/* docs/semantics.md §4 step 6 verbatim in fp64 (bias corrections from R) */
static void zt_adam_semantics(const zk_adam_params_t *P, const zt_adam_ref_t *R, double acc,
                              double *p, double *m, double *v)
{
    double wd = P->weight_decay;
    double g = acc * P->grad_scale;

    if (!P->adam_w_mode) {
        g = g + wd * *p;
    }
    *m = P->beta1 * *m + (1.0 - P->beta1) * g;
    *v = P->beta2 * *v + (1.0 - P->beta2) * g * g;
    *p = *p -
         P->lr * ((*m / R->bc1) / (sqrt(*v / R->bc2) + P->eps) + (P->adam_w_mode ? wd * *p : 0.0));
}

/* ZT_GUARD * 4 bytes of 0xa5 after the n elements of a buffer; the kernels must not touch them */
static void zt_fill_guard(void *p, size_t n, size_t esize)
{
    memset((char *)p + n * esize, 0xa5, ZT_GUARD * 4);
}

static void zt_check_guard(const void *p, size_t n, size_t esize, const char *what)
{
    const unsigned char *g = (const unsigned char *)p + n * esize;

    for (size_t i = 0; i < ZT_GUARD * 4; i++) {
        cr_assert_eq(g[i], 0xa5, "%s: byte %zu past the end was written (n %zu, seed %llu)", what,
                     i, n, (unsigned long long)zt_seed);
    }
}

static void zt_adam_case(zk_exec_t ex, size_t n, size_t off, int dst_dtype, int adam_w_mode,
                         int bias_correction)
{
    zk_adam_params_t P = zt_random_params(adam_w_mode, bias_correction);
    zt_adam_ref_t R = zt_adam_ref(&P);
    size_t dsize = dst_dtype == ZT_NONE ? 4 : zs_dtype_size((zs_dtype_t)dst_dtype);
    zt_buf_t bp, bm, bv, ba, bd;
    float *p = zt_alloc(&bp, 4 * (n + ZT_GUARD), 4 * off);
    float *m = zt_alloc(&bm, 4 * (n + ZT_GUARD), 4 * ((off * 3) % 16));
    float *v = zt_alloc(&bv, 4 * (n + ZT_GUARD), 4 * ((off * 5) % 16));
    float *a = zt_alloc(&ba, 4 * (n + ZT_GUARD), 4 * ((off * 7) % 16));
    void *d = zt_alloc(&bd, 4 * (n + ZT_GUARD), dsize * ((off * 11) % 16));
    float *p0 = malloc(4 * (n + 1)), *m0 = malloc(4 * (n + 1)), *v0 = malloc(4 * (n + 1));
    float *a0 = malloc(4 * (n + 1));
    zs_status_t st;

    cr_assert(p0 && m0 && v0 && a0);
    for (size_t i = 0; i < n; i++) {
        p0[i] = p[i] = (i % 97 == 5) ? 0.0f : zt_logu(-10, 2);
        m0[i] = m[i] = zt_logu(-14, -2);
        /* Adam keeps |m| / sqrt(v) of order one; v = 0 with m = 0 also occurs */
        v0[i] = v[i] = (i % 89 == 3) ? (m0[i] = m[i] = 0.0f, 0.0f)
                                     : m[i] * m[i] * (float)zt_uniform(1.0, 100.0);
        a0[i] = a[i] = (i % 83 == 7) ? 0.0f : zt_logu(-12, 8);
    }
    zt_fill_guard(p, n, 4);
    zt_fill_guard(m, n, 4);
    zt_fill_guard(v, n, 4);
    zt_fill_guard(a, n, 4);
    zt_fill_guard(d, n, dsize);

    st = zk_adam_step(&ex, &P, p, m, v, a, dst_dtype == ZT_NONE ? NULL : d,
                      dst_dtype == ZT_NONE ? ZS_DTYPE_F32 : (zs_dtype_t)dst_dtype, n);
    cr_assert_eq(st, ZS_OK, "zk_adam_step: %s: %s", zs_status_name(st), zk_last_error());

    for (size_t i = 0; i < n; i++) {
        zt_ev_t ep = zt_ev(p0[i]), em = zt_ev(m0[i]), ev = zt_ev(v0[i]);
        double rp = p0[i], rm = m0[i], rv = v0[i];
        zt_adam_chain(&R, zt_ev(a0[i]), &ep, &em, &ev);
        zt_adam_semantics(&P, &R, a0[i], &rp, &rm, &rv);
        cr_assert_leq(fabs(p[i] - rp), ep.e,
                      "%s n=%zu off=%zu dst=%d adamw=%d bc=%d: master[%zu] = %a, fp64 %a, "
                      "|diff| %g > bound %g (seed %llu)",
                      zk_variant_name(ex.variant), n, off, dst_dtype, adam_w_mode, bias_correction,
                      i, (double)p[i], rp, fabs(p[i] - rp), ep.e, (unsigned long long)zt_seed);
        cr_assert_leq(fabs(m[i] - rm), em.e, "m[%zu] = %a, fp64 %a (seed %llu)", i, (double)m[i],
                      rm, (unsigned long long)zt_seed);
        cr_assert_leq(fabs(v[i] - rv), ev.e, "v[%zu] = %a, fp64 %a (seed %llu)", i, (double)v[i],
                      rv, (unsigned long long)zt_seed);
        cr_assert_eq(zt_f32_bits(a[i]), 0u, "acc[%zu] not zeroed", i);
        switch (dst_dtype) {
        case ZS_DTYPE_F32:
            cr_assert_eq(zt_f32_bits(((float *)d)[i]), zt_f32_bits(p[i]), "dst[%zu]", i);
            break;
        case ZS_DTYPE_F16:
            cr_assert_eq(((uint16_t *)d)[i], zt_ref_f16(p[i]), "dst[%zu] for %a", i, (double)p[i]);
            break;
        case ZS_DTYPE_BF16:
            cr_assert_eq(((uint16_t *)d)[i], zt_ref_bf16(p[i]), "dst[%zu] for %a", i, (double)p[i]);
            break;
        default:
            break;
        }
    }
    zt_check_guard(p, n, 4, "master");
    zt_check_guard(m, n, 4, "m");
    zt_check_guard(v, n, 4, "v");
    zt_check_guard(a, n, 4, "acc");
    if (dst_dtype != ZT_NONE) {
        zt_check_guard(d, n, dsize, "dst");
    }
    free(p0);
    free(m0);
    free(v0);
    free(a0);
    zt_free(&bp);
    zt_free(&bm);
    zt_free(&bv);
    zt_free(&ba);
    zt_free(&bd);
}

static void zt_adam_all(zk_exec_t ex)
{
    static const int dsts[] = {ZT_NONE, ZS_DTYPE_F32, ZS_DTYPE_F16, ZS_DTYPE_BF16};
    unsigned k = 0;

    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        for (size_t di = 0; di < 4; di++) {
            for (int adamw = 0; adamw <= 1; adamw++) {
                for (int bc = 0; bc <= 1; bc++) {
                    zt_adam_case(ex, zt_lengths[li], zt_offsets[k++ % ZT_N_OFFSETS], dsts[di],
                                 adamw, bc);
                }
            }
        }
    }
}

ZT_VARIANT_TESTS(zk_adam, matches_fp64_reference, zt_adam_all)

/* Ten steps against torch.optim.AdamW (adamw.py, single-tensor path) in fp64:
 *   p *= 1 - lr wd; m.lerp_(g, 1 - b1); v = v b2 + (1 - b2) g g;
 *   p -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
 * with g = acc * grad_scale, fresh accumulators every step. Errors carried from step to step
 * by the error model. */
static void zt_adam_ten_steps(zk_exec_t ex)
{
    const size_t n = 4099;
    zk_adam_params_t P = zt_random_params(1, 1);
    float *p = malloc(4 * n), *m = calloc(n, 4), *v = calloc(n, 4), *a = malloc(4 * n);
    uint16_t *d = malloc(2 * n);
    double *tp = malloc(8 * n), *tm = calloc(n, 8), *tv = calloc(n, 8);
    zt_ev_t *cp = malloc(sizeof(zt_ev_t) * n), *cm = malloc(sizeof(zt_ev_t) * n);
    zt_ev_t *cv = malloc(sizeof(zt_ev_t) * n);
    float *p_first = malloc(4 * n);
    double worst_ulps = 0.0;

    cr_assert(p && m && v && a && d && tp && tm && tv && cp && cm && cv && p_first);
    P.lr = 1e-3f;
    P.weight_decay = 0.01f;
    for (size_t i = 0; i < n; i++) {
        p_first[i] = p[i] = zt_logu(-8, 1);
        tp[i] = p[i];
        cp[i] = zt_ev(p[i]);
        cm[i] = cv[i] = zt_ev(0.0);
    }
    for (uint64_t t = 1; t <= 10; t++) {
        zs_status_t st;
        double bc1 = 1.0 - pow(P.beta1, (double)t);
        double bc2 = 1.0 - pow(P.beta2, (double)t);
        zt_adam_ref_t R;

        P.step = t;
        R = zt_adam_ref(&P);
        for (size_t i = 0; i < n; i++) {
            a[i] = zt_logu(-10, 6);
        }
        for (size_t i = 0; i < n; i++) {
            double g = (double)a[i] * P.grad_scale;
            double denom;

            zt_adam_chain(&R, zt_ev(a[i]), &cp[i], &cm[i], &cv[i]);
            tp[i] *= 1.0 - (double)P.lr * P.weight_decay;
            tm[i] += (1.0 - P.beta1) * (g - tm[i]);
            tv[i] = tv[i] * P.beta2 + (1.0 - P.beta2) * g * g;
            denom = sqrt(tv[i]) / sqrt(bc2) + P.eps;
            tp[i] += -(P.lr / bc1) * tm[i] / denom;
        }
        st = zk_adam_step(&ex, &P, p, m, v, a, d, ZS_DTYPE_BF16, n);
        cr_assert_eq(st, ZS_OK, "%s", zk_last_error());
    }
    for (size_t i = 0; i < n; i++) {
        /* the bound in ulps of the largest master value along the way */
        double ulp = ldexp(1.0, ilogb(fmax(fabs(tp[i]), fabs(p_first[i]))) - 23);

        cr_assert_leq(fabs(p[i] - tp[i]), cp[i].e,
                      "%s: after 10 steps p[%zu] = %a, torch fp64 %a, bound %g (seed %llu)",
                      zk_variant_name(ex.variant), i, (double)p[i], tp[i], cp[i].e,
                      (unsigned long long)zt_seed);
        cr_assert_leq(fabs(m[i] - tm[i]), cm[i].e, "m[%zu] = %a, torch %a", i, (double)m[i], tm[i]);
        cr_assert_leq(fabs(v[i] - tv[i]), cv[i].e, "v[%zu] = %a, torch %a", i, (double)v[i], tv[i]);
        cr_assert_eq(d[i], zt_ref_bf16(p[i]));
        if (cp[i].e / ulp > worst_ulps) {
            worst_ulps = cp[i].e / ulp;
        }
    }
    cr_log_info("%s: 10 steps, bound at most %.2f ulp of master", zk_variant_name(ex.variant),
                worst_ulps);
    free(p);
    free(m);
    free(v);
    free(a);
    free(d);
    free(tp);
    free(tm);
    free(tv);
    free(cp);
    free(cm);
    free(cv);
    free(p_first);
}

ZT_VARIANT_TESTS(zk_adam, ten_steps_match_torch_adamw_fp64, zt_adam_ten_steps)

/* ---- determinism: the same bits for every thread count, alignment and variant ---- */

/* The inputs of one call (master, m, v, acc), kept so that every run starts from the same bits. */
typedef struct zt_adam_in {
    size_t n;
    float *s[4];
} zt_adam_in_t;

/* Values as in zt_adam_case; one in `special_every` is a special (NaN, inf, 0, subnormal,
 * huge, negative v...). */
static void zt_adam_in_fill(zt_adam_in_t *in, size_t n, unsigned special_every)
{
    in->n = n;
    for (int k = 0; k < 4; k++) {
        in->s[k] = malloc(4 * n + 4);
        cr_assert_not_null(in->s[k]);
    }
    for (size_t i = 0; i < n; i++) {
        float m = zt_logu(-14, -2);

        in->s[0][i] = zt_or_special(zt_logu(-10, 2), special_every);
        in->s[1][i] = zt_or_special(m, special_every);
        in->s[2][i] = zt_or_special(m * m * (float)zt_uniform(1.0, 100.0), special_every);
        in->s[3][i] = zt_or_special(zt_logu(-12, 8), special_every);
    }
}

static void zt_adam_in_free(zt_adam_in_t *in)
{
    for (int k = 0; k < 4; k++) {
        free(in->s[k]);
    }
}

/* The results of one call: the four streams and the cast copy. */
typedef struct zt_adam_out {
    float *s[4];
    uint16_t *dst16;
    float *dst32;
} zt_adam_out_t;

static void zt_adam_out_init(zt_adam_out_t *out, size_t n)
{
    for (int k = 0; k < 4; k++) {
        out->s[k] = malloc(4 * n + 4);
        cr_assert_not_null(out->s[k]);
    }
    out->dst16 = malloc(2 * n + 2);
    out->dst32 = malloc(4 * n + 4);
    cr_assert(out->dst16 != NULL && out->dst32 != NULL);
}

static void zt_adam_out_cleanup(zt_adam_out_t *out)
{
    for (int k = 0; k < 4; k++) {
        free(out->s[k]);
    }
    free(out->dst16);
    free(out->dst32);
}

/* One zk_adam_step on copies of `in`, each stream `off` elements (times a per-stream factor)
 * past a 64-byte boundary; the results land in `out`. */
static void zt_adam_run(zk_exec_t ex, const zk_adam_params_t *P, const zt_adam_in_t *in, size_t off,
                        int dst_dtype, zt_adam_out_t *out)
{
    static const size_t mul[5] = {1, 3, 5, 7, 11};
    size_t n = in->n;
    size_t dsize = dst_dtype == ZT_NONE ? 4 : zs_dtype_size((zs_dtype_t)dst_dtype);
    zt_buf_t b[5];
    float *s[4];
    void *d;
    zs_status_t st;

    for (int k = 0; k < 4; k++) {
        s[k] = zt_alloc(&b[k], 4 * n, 4 * ((off * mul[k]) % 17));
        memcpy(s[k], in->s[k], 4 * n);
    }
    d = zt_alloc(&b[4], dsize * n, dsize * ((off * mul[4]) % 17));
    st = zk_adam_step(&ex, P, s[0], s[1], s[2], s[3], dst_dtype == ZT_NONE ? NULL : d,
                      dst_dtype == ZT_NONE ? ZS_DTYPE_F32 : (zs_dtype_t)dst_dtype, n);
    cr_assert_eq(st, ZS_OK, "zk_adam_step: %s", zk_last_error());
    for (int k = 0; k < 4; k++) {
        memcpy(out->s[k], s[k], 4 * n);
        zt_free(&b[k]);
    }
    if (dst_dtype == ZS_DTYPE_F32) {
        memcpy(out->dst32, d, 4 * n);
    } else if (dst_dtype != ZT_NONE) {
        memcpy(out->dst16, d, 2 * n);
    }
    zt_free(&b[4]);
}

static void zt_adam_same(const zt_adam_out_t *got, const zt_adam_out_t *want, size_t n,
                         int dst_dtype, const char *what)
{
    static const char *const names[4] = {"master", "m", "v", "acc"};

    for (int k = 0; k < 4; k++) {
        zt_assert_same_bits(got->s[k], want->s[k], n, 4, "%s: stream %s differs", what, names[k]);
    }
    if (dst_dtype == ZS_DTYPE_F32) {
        zt_assert_same_bits(got->dst32, want->dst32, n, 4, "%s: dst differs", what);
    } else if (dst_dtype != ZT_NONE) {
        zt_assert_same_bits(got->dst16, want->dst16, n, 2, "%s: dst differs", what);
    }
}

static const int zt_adam_dsts[] = {ZT_NONE, ZS_DTYPE_F32, ZS_DTYPE_F16, ZS_DTYPE_BF16};

/* A pool splits the call into chunks whose heads and tails the SIMD variants run apart from
 * their vector bodies: every thread count and misalignment must give the bits of one thread
 * at offset 0, with the stores of ex (the _nt tests: non-temporal). */
static void zt_adam_pool_split(zk_exec_t ex)
{
    static const size_t offs[] = {0, 1, 3, 7};
    const size_t n = 524309;
    zt_adam_in_t in;
    zt_adam_out_t want, got;

    zt_adam_in_fill(&in, n, 997);
    zt_adam_out_init(&want, n);
    zt_adam_out_init(&got, n);
    for (size_t di = 0; di < 4; di++) {
        zk_adam_params_t P = zt_random_params((int)(di & 1), 1);
        zk_exec_t one = {.variant = ex.variant, .pool = NULL};

        zt_adam_run(one, &P, &in, 0, zt_adam_dsts[di], &want);
        for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
            for (size_t ti = 0; ti < ZT_N_THREADS; ti++) {
                zk_exec_t pooled = {.variant = ex.variant,
                                    .pool = zt_pool(zt_threads[ti]),
                                    .stores = ex.stores,
                                    .prefetch = ex.prefetch};
                char what[128];

                zt_adam_run(pooled, &P, &in, offs[oi], zt_adam_dsts[di], &got);
                snprintf(what, sizeof(what), "%s, %u threads, offset %zu, dst %d",
                         zk_variant_name(ex.variant), zt_threads[ti], offs[oi], zt_adam_dsts[di]);
                zt_adam_same(&got, &want, n, zt_adam_dsts[di], what);
                zk_pool_destroy(pooled.pool);
            }
        }
    }
    zt_adam_out_cleanup(&want);
    zt_adam_out_cleanup(&got);
    zt_adam_in_free(&in);
}

ZT_VARIANT_TESTS(zk_adam, pool_split_is_bit_identical, zt_adam_pool_split)

/* keep_acc changes nothing but the accumulator, which keeps its input instead of zeros, for
 * every destination and misalignment (heads, bodies and tails of the SIMD loops). */
static void zt_adam_keep_acc(zk_exec_t ex)
{
    for (size_t li = 0; li <= ZT_N_EDGE_LENGTHS; li++) {
        size_t n = li < ZT_N_EDGE_LENGTHS ? zt_edge_lengths[li] : 100003;
        zt_adam_in_t in;
        zt_adam_out_t zeroed, kept;

        zt_adam_in_fill(&in, n, 11);
        zt_adam_out_init(&zeroed, n);
        zt_adam_out_init(&kept, n);
        for (size_t di = 0; di < 4; di++) {
            zk_adam_params_t P = zt_random_params((int)(di & 1), 1);
            char what[96];

            zt_adam_run(ex, &P, &in, zt_edge_offset(li), zt_adam_dsts[di], &zeroed);
            P.keep_acc = 1;
            zt_adam_run(ex, &P, &in, zt_edge_offset(li), zt_adam_dsts[di], &kept);
            for (size_t i = 0; i < n; i++) {
                cr_assert_eq(zt_f32_bits(zeroed.s[3][i]), 0u, "acc[%zu] not zeroed", i);
            }
            memcpy(zeroed.s[3], in.s[3], 4 * n); /* what keep_acc must leave */
            snprintf(what, sizeof(what), "%s n=%zu dst %d keep_acc", zk_variant_name(ex.variant), n,
                     zt_adam_dsts[di]);
            zt_adam_same(&kept, &zeroed, n, zt_adam_dsts[di], what);
        }
        zt_adam_out_cleanup(&zeroed);
        zt_adam_out_cleanup(&kept);
        zt_adam_in_free(&in);
    }
}

ZT_VARIANT_TESTS(zk_adam, keep_acc_leaves_the_accumulator_and_nothing_else, zt_adam_keep_acc)

/* A SIMD variant gives the scalar reference's bits for every destination dtype, mode, length
 * and misalignment, with special values mixed in (NaN results are the canonical NaN). */
static void zt_adam_vs_scalar(zk_exec_t ex)
{
    const zk_exec_t ref = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};

    for (size_t li = 0; li <= ZT_N_EDGE_LENGTHS; li++) {
        /* the last case: a length beyond the small-size edges (ex.stores picks the stores) */
        size_t n = li < ZT_N_EDGE_LENGTHS ? zt_edge_lengths[li] : 524309;
        size_t off = zt_edge_offset(li);
        zt_adam_in_t in;
        zt_adam_out_t want, got;

        zt_adam_in_fill(&in, n, 7);
        zt_adam_out_init(&want, n);
        zt_adam_out_init(&got, n);
        for (size_t di = 0; di < 4; di++) {
            for (int mode = 0; mode < 4; mode++) {
                zk_adam_params_t P = zt_random_params(mode & 1, mode >> 1);
                char what[128];

                if (zt_u64() % 4 == 0) {
                    P.eps = 0.0f; /* 0 / 0 where v = 0 */
                }
                zt_adam_run(ref, &P, &in, off, zt_adam_dsts[di], &want);
                zt_adam_run(ex, &P, &in, off, zt_adam_dsts[di], &got);
                snprintf(what, sizeof(what), "%s vs scalar, n %zu, offset %zu, dst %d, mode %d",
                         zk_variant_name(ex.variant), n, off, zt_adam_dsts[di], mode);
                zt_adam_same(&got, &want, n, zt_adam_dsts[di], what);
            }
        }
        zt_adam_out_cleanup(&want);
        zt_adam_out_cleanup(&got);
        zt_adam_in_free(&in);
    }
}

ZT_SIMD_VARIANT_TESTS(zk_adam, matches_scalar_bit_for_bit, zt_adam_vs_scalar)

/* Arithmetic NaN results are stored as the canonical quiet NaN, whatever NaN payloads went in
 * (x86 would pass on one of them, CUDA makes its own). */
static void zt_adam_nan_canon(zk_exec_t ex)
{
    const size_t n = 37;
    zk_adam_params_t P = zt_random_params(1, 1);
    zt_adam_in_t in;
    zt_adam_out_t out;

    zt_adam_in_fill(&in, n, 1000000);
    for (size_t i = 0; i < n; i++) {
        in.s[i % 4][i] = zt_bits_f32(i % 2 ? 0xff812345u : 0x7fd55555u);
    }
    zt_adam_out_init(&out, n);
    zt_adam_run(ex, &P, &in, 3, ZS_DTYPE_BF16, &out);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = zt_f32_bits(out.s[0][i]);

        cr_assert(isnan(out.s[0][i]), "%s: master[%zu] = %a, a NaN went in",
                  zk_variant_name(ex.variant), i, (double)out.s[0][i]);
        cr_assert_eq(p, ZK_NAN_BITS, "%s: master[%zu] = %08x", zk_variant_name(ex.variant), i, p);
        cr_assert_eq(out.dst16[i], 0x7fc0, "%s: dst[%zu] = %04x", zk_variant_name(ex.variant), i,
                     out.dst16[i]);
        if (isnan(out.s[1][i])) {
            cr_assert_eq(zt_f32_bits(out.s[1][i]), ZK_NAN_BITS, "m[%zu]", i);
        }
        if (isnan(out.s[2][i])) {
            cr_assert_eq(zt_f32_bits(out.s[2][i]), ZK_NAN_BITS, "v[%zu]", i);
        }
    }
    zt_adam_out_cleanup(&out);
    zt_adam_in_free(&in);
}

ZT_VARIANT_TESTS(zk_adam, nan_results_are_canonical, zt_adam_nan_canon)

Test(zk_adam, rejects_bad_parameters)
{
    zk_adam_params_t P = {.lr = 1e-3f,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .adam_w_mode = 1,
                          .bias_correction = 1,
                          .step = 0,
                          .grad_scale = 1};
    float x = 0.0f;

    cr_assert_eq(zk_adam_step(NULL, &P, &x, &x, &x, &x, NULL, ZS_DTYPE_F32, 1), ZS_ERR_INVALID);
    cr_assert_neq(strstr(zk_last_error(), "step"), NULL, "message: %s", zk_last_error());
    P.step = 1;
    P.beta2 = 1.0f;
    cr_assert_eq(zk_adam_step(NULL, &P, &x, &x, &x, &x, NULL, ZS_DTYPE_F32, 1), ZS_ERR_INVALID);
    P.beta2 = 0.999f;
    cr_assert_eq(zk_adam_step(NULL, &P, NULL, &x, &x, &x, NULL, ZS_DTYPE_F32, 1), ZS_ERR_INVALID);
    cr_assert_eq(zk_adam_step(NULL, &P, NULL, NULL, NULL, NULL, NULL, ZS_DTYPE_F32, 0), ZS_OK);
    cr_assert_eq(zk_adam_step(NULL, &P, &x, &x, &x, &x, &x, (zs_dtype_t)7, 1), ZS_ERR_INVALID);
    cr_assert_eq(zk_adam_step(NULL, NULL, &x, &x, &x, &x, NULL, ZS_DTYPE_F32, 1), ZS_ERR_INVALID);
}

/* The scalar variant's FMA without an FMA instruction (zk/elem.h zk_fmaf_soft) against libm's
 * fmaf, which is correctly rounded: random bit patterns (every exponent, specials), products
 * that cancel against the addend to the last bits (where a double rounding would show), and
 * sums that land on float ties. */
Test(zk_adam, soft_fma_rounds_once)
{
#if defined(__FMA__)
    cr_skip_test("this file is built with FMA; the soft FMA is not compiled in");
#else
    zt_seed_init();
    for (uint64_t i = 0; i < 6000000; i++) {
        float a, b, c, want, got;
        uint32_t ua = (uint32_t)zt_u64(), ub = (uint32_t)zt_u64(), uc = (uint32_t)zt_u64();

        switch (i % 3) {
        case 0: /* any bits */
            memcpy(&a, &ua, 4);
            memcpy(&b, &ub, 4);
            memcpy(&c, &uc, 4);
            if (i % 97 == 0) {
                a = zt_special();
                c = zt_special();
            }
            break;
        case 1: /* c cancels a * b up to its last bits */
            a = zt_logu(-30, 30) * ((ua & 1) ? -1.0f : 1.0f);
            b = zt_logu(-30, 30);
            c = -(a * b) * (1.0f + (float)((int)(uc % 64) - 32) * 0x1p-23f);
            break;
        default: /* a * b a half float ulp (or near it) from c's grid */
            a = 1.0f + (float)(ua & 0xfff) * 0x1p-23f;
            b = 1.0f + (float)(ub & 0xfff) * 0x1p-23f;
            c = ldexpf((float)(uc & 0xffffff), -(int)(ub % 40));
            break;
        }
        want = fmaf(a, b, c);
        got = zk_fmaf_soft(a, b, c);
        if (isnan(want)) {
            cr_assert(isnan(got), "fma(%a, %a, %a): %a, libm NaN", (double)a, (double)b, (double)c,
                      (double)got);
        } else {
            cr_assert_eq(zt_f32_bits(got), zt_f32_bits(want),
                         "fma(%a, %a, %a): %a, libm %a (seed %llu)", (double)a, (double)b,
                         (double)c, (double)got, (double)want, (unsigned long long)zt_seed);
        }
    }
#endif
}

/* Bit for bit the arithmetic of DeepSpeed's CPU Adam (cpu_adam.h, Step_AVX: fma for m, v, the
 * denominator, the decay and the update; coefficients in fp32 with beta^t a running product),
 * written here with libm's fmaf, against every variant: steps in random order (the kernel's
 * beta^t cache continues, restarts and stops early), head, body and tail lengths. */
static void zt_adam_ds_bits(zk_exec_t ex)
{
    enum { N = 37 };
    float p[N], m[N], v[N], a[N], ep[N], em[N], ev[N];

    for (int draw = 0; draw < 60; draw++) {
        zk_adam_params_t P = zt_random_params(draw & 1, (draw % 7) != 3);
        P.step = 1 + zt_u64() % (draw % 5 == 0 ? 40000 : 300);
        if (draw % 11 == 4) {
            P.beta2 = 0.9999f; /* a long running product */
        }
        zt_coef32_t k = zt_coef32(&P);
        float wd_l2 = P.adam_w_mode ? 0.0f : P.weight_decay;

        for (int i = 0; i < N; i++) {
            p[i] = zt_logu(-10, 2) * ((zt_u64() & 1) ? -1.0f : 1.0f);
            m[i] = zt_logu(-14, -2) * ((zt_u64() & 1) ? -1.0f : 1.0f);
            v[i] = m[i] * m[i] * (float)zt_uniform(1.0, 100.0);
            a[i] = zt_logu(-12, 8) * ((zt_u64() & 1) ? -1.0f : 1.0f);
            float g = fmaf(p[i], wd_l2, a[i] * P.grad_scale);
            em[i] = fmaf(g, 1.0f - P.beta1, P.beta1 * m[i]);
            ev[i] = fmaf(g * g, 1.0f - P.beta2, P.beta2 * v[i]);
            ep[i] = fmaf(p[i], k.neg_lr_wd, p[i]);
            ep[i] = fmaf(em[i] / fmaf(sqrtf(ev[i]), k.inv_sqrt_bc2, P.eps), k.neg_step_size, ep[i]);
        }
        zs_status_t st = zk_adam_step(&ex, &P, p, m, v, a, NULL, ZS_DTYPE_F32, N);
        cr_assert_eq(st, ZS_OK, "%s", zk_last_error());
        for (int i = 0; i < N; i++) {
            cr_assert(zt_f32_bits(p[i]) == zt_f32_bits(ep[i]) &&
                          zt_f32_bits(m[i]) == zt_f32_bits(em[i]) &&
                          zt_f32_bits(v[i]) == zt_f32_bits(ev[i]),
                      "%s draw %d step %llu [%d]: p %a m %a v %a, DeepSpeed's arithmetic p %a m %a "
                      "v %a (seed %llu)",
                      zk_variant_name(ex.variant), draw, (unsigned long long)P.step, i,
                      (double)p[i], (double)m[i], (double)v[i], (double)ep[i], (double)em[i],
                      (double)ev[i], (unsigned long long)zt_seed);
        }
    }
}

ZT_VARIANT_TESTS(zk_adam, bits_of_deepspeed_cpu_adam, zt_adam_ds_bits)
