/* Included by limit_avx512.c and limit_avx2.c with the vector macros defined:
 * V4/V2 (vectors of VL 32-bit / 16-bit lanes), LD4/LD2, ST4/ST2 (regular), NT4/NT2
 * (non-temporal), OR4, AND4, SET4, NARROW (V4 -> V2), WIDEN (V2 -> V4), FN (function name);
 * ST_BF16X2 (two VF rounded to bf16 and stored, the cheapest exact way of the width) and
 * FN_ROUND for the cast's rounding floor;
 * VF (VL floats), SETF, SQRTF, LDF, STF, CANONF and FN_FORMULA for Adam's floor; VD (VL / 2
 * doubles), SETD, FMAD (x * x + a), FIRSTD and FN_CHAIN for the sum of squares' order floor. */

#define ZB_ST4(p, x, nt)                                                                           \
    do {                                                                                           \
        if (nt) {                                                                                  \
            NT4(p, x);                                                                             \
        } else {                                                                                   \
            ST4(p, x);                                                                             \
        }                                                                                          \
    } while (0)
#define ZB_ST2(p, x, nt)                                                                           \
    do {                                                                                           \
        if (nt) {                                                                                  \
            NT2(p, x);                                                                             \
        } else {                                                                                   \
            ST2(p, x);                                                                             \
        }                                                                                          \
    } while (0)

#define ZB_P4(k, i) ((char *)a->s[k] + 4 * (i))
#define ZB_P2(k, i) ((char *)a->s[k] + 2 * (i))
/* prefetch element i + a->pf of stream k (es-byte elements), as the kernels do */
#define ZB_PF(k, es, i)                                                                            \
    do {                                                                                           \
        if (a->pf != 0 && (i) + a->pf < e) {                                                       \
            _mm_prefetch((const char *)a->s[k] + ((i) + a->pf) * (es), _MM_HINT_T0);               \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void zb_adam(const zb_limit_args_t *a, size_t b,
                                                          size_t e, int nt, size_t ws)
{
    V4 z = SET4(a->zero);

    for (size_t i = b; i < e; i += VL) {
        ZB_PF(0, 4, i);
        ZB_PF(1, 4, i);
        ZB_PF(2, 4, i);
        ZB_PF(3, 4, i);
        V4 p = LD4(ZB_P4(0, i)), m = LD4(ZB_P4(1, i)), v = LD4(ZB_P4(2, i));
        V4 g = LD4(ZB_P4(3, i));
        ZB_ST4(ZB_P4(0, i), OR4(p, AND4(g, z)), nt);
        ZB_ST4(ZB_P4(1, i), OR4(m, z), nt);
        ZB_ST4(ZB_P4(2, i), OR4(v, z), nt);
        if (!a->keep_acc) {
            ZB_ST4(ZB_P4(3, i), z, nt);
        }
        if (ws == 4) {
            ZB_ST4(ZB_P4(4, i), p, nt);
        } else if (ws == 2) {
            ZB_ST2(ZB_P2(4, i), NARROW(p), nt);
        }
    }
}

static volatile unsigned zb_sink;

static inline __attribute__((always_inline)) void zb_read(const zb_limit_args_t *a, size_t b,
                                                          size_t e)
{
    V4 r0 = SET4(0), r1 = r0;

    for (size_t i = b; i + 2 * VL <= e; i += 2 * VL) {
        ZB_PF(0, 4, i);
        r0 = OR4(r0, LD4(ZB_P4(0, i)));
        r1 = OR4(r1, LD4(ZB_P4(0, i + VL)));
    }
    zb_sink = FIRST4(OR4(r0, r1));
}

static inline __attribute__((always_inline)) void zb_acc(const zb_limit_args_t *a, size_t b,
                                                         size_t e, int nt, size_t rs)
{
    V4 z = SET4(a->zero);

    for (size_t i = b; i < e; i += VL) {
        ZB_PF(0, 4, i);
        ZB_PF(1, rs, i);
        V4 s = rs == 4 ? LD4(ZB_P4(1, i)) : WIDEN(LD2(ZB_P2(1, i)));
        ZB_ST4(ZB_P4(0, i), OR4(LD4(ZB_P4(0, i)), AND4(s, z)), nt);
    }
}

static inline __attribute__((always_inline)) void zb_reduce(const zb_limit_args_t *a, size_t b,
                                                            size_t e, int nt, size_t rs)
{
    V4 z = SET4(a->zero);

    for (size_t i = b; i < e; i += VL) {
        ZB_PF(0, rs, i);
        ZB_PF(1, rs, i);
        if (rs == 4) {
            ZB_ST4(ZB_P4(2, i), OR4(LD4(ZB_P4(0, i)), AND4(LD4(ZB_P4(1, i)), z)), nt);
        } else {
            V4 x = OR4(WIDEN(LD2(ZB_P2(0, i))), AND4(WIDEN(LD2(ZB_P2(1, i))), z));
            ZB_ST2(ZB_P2(2, i), NARROW(x), nt);
        }
    }
}

static inline __attribute__((always_inline)) void zb_cast(const zb_limit_args_t *a, size_t b,
                                                          size_t e, int nt, size_t rs, size_t ws)
{
    for (size_t i = b; i < e; i += VL) {
        ZB_PF(0, rs, i);
        V4 x = rs == 4 ? LD4(ZB_P4(0, i)) : WIDEN(LD2(ZB_P2(0, i)));
        if (ws == 4) {
            ZB_ST4(ZB_P4(1, i), x, nt);
        } else {
            ZB_ST2(ZB_P2(1, i), NARROW(x), nt);
        }
    }
}

/* every (pattern, width, store type) gets its own loop with constants folded in */
#define ZB_NT(call)                                                                                \
    do {                                                                                           \
        if (a->nt) {                                                                               \
            call(1);                                                                               \
        } else {                                                                                   \
            call(0);                                                                               \
        }                                                                                          \
    } while (0)

void FN(const zb_limit_args_t *a, size_t b, size_t e)
{
    e = b + (e - b) / VL * VL;
    switch (a->pattern) {
    case ZB_ADAM:
#define ZB_C(nt)                                                                                   \
    (a->wsize == 4   ? zb_adam(a, b, e, nt, 4)                                                     \
     : a->wsize == 2 ? zb_adam(a, b, e, nt, 2)                                                     \
                     : zb_adam(a, b, e, nt, 0))
        ZB_NT(ZB_C);
#undef ZB_C
        break;
    case ZB_READ:
        zb_read(a, b, e);
        break;
    case ZB_ACCUMULATE:
#define ZB_C(nt) (a->rsize == 4 ? zb_acc(a, b, e, nt, 4) : zb_acc(a, b, e, nt, 2))
        ZB_NT(ZB_C);
#undef ZB_C
        break;
    case ZB_REDUCE:
#define ZB_C(nt) (a->rsize == 4 ? zb_reduce(a, b, e, nt, 4) : zb_reduce(a, b, e, nt, 2))
        ZB_NT(ZB_C);
#undef ZB_C
        break;
    case ZB_CAST:
#define ZB_C(nt)                                                                                   \
    (a->rsize == 4 ? (a->wsize == 4 ? zb_cast(a, b, e, nt, 4, 4) : zb_cast(a, b, e, nt, 4, 2))     \
                   : (a->wsize == 4 ? zb_cast(a, b, e, nt, 2, 4) : zb_cast(a, b, e, nt, 2, 2)))
        ZB_NT(ZB_C);
#undef ZB_C
        break;
    }
    if (a->nt) {
        _mm_sfence();
    }
}

/* Adam's arithmetic floor: the exact formula of zk/elem.h (ZK_ADAM_LANE, NaN results made
 * canonical the kernels' way: one test of the three results, blends only where one is NaN)
 * and the exact cast of the new master into its 16-bit copy (BF16F, F16F: the cheapest exact
 * conversion this vector width has) over ZB_L1_N elements per stream kept in L1, as the
 * daemon runs it (the accumulator read, not written), n elements in all. */
#define ZB_L1_N 512
typedef struct zb_fk {
    VF grad_scale, wd_l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2,
        neg_step_size, neg_lr_wd;
} zb_fk_t;

static inline __attribute__((always_inline)) void zb_formula_pass(const zb_fk_t *K, float *p,
                                                                  float *m, float *v,
                                                                  const float *a, uint16_t *h,
                                                                  zb_copy_t copy)
{
    for (size_t i = 0; i < ZB_L1_N; i += VL) {
        VF P = LDF(p + i), M = LDF(m + i), V = LDF(v + i), A = LDF(a + i);
        ZK_ADAM_LANE(VF, SQRTF, FMAF, *K, A, P, M, V);
        if (__builtin_expect(ANYNANF(P, M) || ANYNANF(V, V), 0)) {
            P = CANONF(P);
            M = CANONF(M);
            V = CANONF(V);
        }
        STF(p + i, P);
        STF(m + i, M);
        STF(v + i, V);
        if (copy == ZB_COPY_BF16_HW) {
            ST2(h + i, BF16HWF(P));
        } else if (copy == ZB_COPY_BF16) {
            ST2(h + i, BF16F(P));
        } else if (copy == ZB_COPY_F16) {
            ST2(h + i, F16F(P));
        }
    }
}

float FN_FORMULA(size_t n, zb_copy_t copy)
{
    /* read at run time, as the kernel gets them: constants the compiler could see would let it
     * drop the multiplies by 1 (grad_scale, inv_sqrt_bc2) and the FMAs by 0 (wd_l2, neg_lr_wd)
     * that the kernel must do, and the floor would be faster than the formula (13 % in the
     * unfused form, both variants, with the data in L1, on the project's AMD EPYC VM) */
    static volatile const float c[10] = {1.0f,   0.0f,  0.9f, 0.1f,   0.999f,
                                         0.001f, 1e-8f, 1.0f, -1e-6f, 0.0f};
    const zb_fk_t K = {SETF(c[0]), SETF(c[1]), SETF(c[2]), SETF(c[3]), SETF(c[4]),
                       SETF(c[5]), SETF(c[6]), SETF(c[7]), SETF(c[8]), SETF(c[9])};
    float p[ZB_L1_N] __attribute__((aligned(64))), m[ZB_L1_N] __attribute__((aligned(64)));
    float v[ZB_L1_N] __attribute__((aligned(64))), a[ZB_L1_N] __attribute__((aligned(64)));
    uint16_t h[ZB_L1_N] __attribute__((aligned(64))) = {0};

    for (size_t i = 0; i < ZB_L1_N; i++) {
        p[i] = 0.5f + 1e-4f * (float)i;
        m[i] = 1e-2f;
        v[i] = 1e-4f;
        a[i] = 1e-2f + 1e-6f * (float)i;
    }
    for (size_t done = 0; done < n; done += ZB_L1_N) {
        switch (copy) {
        case ZB_COPY_BF16:
            if (BF16_HW) {
                zb_formula_pass(&K, p, m, v, a, h, ZB_COPY_BF16_HW);
            } else {
                zb_formula_pass(&K, p, m, v, a, h, ZB_COPY_BF16);
            }
            break;
        case ZB_COPY_F16:
            zb_formula_pass(&K, p, m, v, a, h, ZB_COPY_F16);
            break;
        default:
            zb_formula_pass(&K, p, m, v, a, h, ZB_COPY_NONE);
            break;
        }
    }
    return p[n % ZB_L1_N] + (float)h[n % ZB_L1_N];
}

static inline __attribute__((always_inline)) void zb_round_pass(const float *p, uint16_t *h,
                                                                zb_copy_t copy)
{
    for (size_t i = 0; i < ZB_L1_N; i += 2 * VL) {
        VF x0 = LDF(p + i), x1 = LDF(p + i + VL);
        if (__builtin_expect(ANYNANF(x0, x1), 0)) {
            x0 = CANONF(x0);
            x1 = CANONF(x1);
        }
        if (copy == ZB_COPY_F16) {
            ST2(h + i, F16F(x0));
            ST2(h + i + VL, F16F(x1));
        } else if (copy == ZB_COPY_BF16_HW) {
            ST2(h + i, BF16HWF(x0));
            ST2(h + i + VL, BF16HWF(x1));
        } else {
            ST_BF16X2(h + i, x0, x1);
        }
    }
}

float FN_ROUND(size_t n, zb_copy_t copy)
{
    float p[ZB_L1_N] __attribute__((aligned(64)));
    uint16_t h[ZB_L1_N] __attribute__((aligned(64))) = {0};
    unsigned sum = 0;

    for (size_t i = 0; i < ZB_L1_N; i++) {
        p[i] = 0.5f + 1e-4f * (float)i;
    }
    for (size_t done = 0; done < n; done += ZB_L1_N) {
        if (copy == ZB_COPY_F16) {
            zb_round_pass(p, h, ZB_COPY_F16);
        } else if (BF16_HW) {
            zb_round_pass(p, h, ZB_COPY_BF16_HW);
        } else {
            zb_round_pass(p, h, ZB_COPY_BF16);
        }
        /* every pass reads p and writes h again: the same values, but the compiler may not
         * keep one pass for all */
        __asm__ __volatile__("" : : "r"(p), "r"(h) : "memory");
        sum += h[done % ZB_L1_N];
    }
    return (float)sum;
}

double FN_CHAIN(size_t n)
{
    VD a[32 / VL], x = SETD(1.0000001);
    double r = 0;

    for (int k = 0; k < 32 / VL; k++) {
        a[k] = SETD(0.0);
    }
    for (size_t i = 0; i < n; i += ZB_SUMSQ_LANES) {
#pragma GCC unroll 4
        for (int k = 0; k < 32 / VL; k++) {
            a[k] = FMAD(x, a[k]);
        }
    }
    for (int k = 0; k < 32 / VL; k++) {
        r += FIRSTD(a[k]);
    }
    return r;
}
