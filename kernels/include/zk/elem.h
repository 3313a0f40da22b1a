/*
 * zk per-element math: the one place where the formulas of docs/semantics.md §4 steps 6-7 and the
 * fp16/bf16 conversions are written. Included by the scalar, AVX2 and AVX-512 C kernels and
 * by the CUDA kernels (ZK_HD marks functions __host__ __device__ under nvcc).
 *
 * The Adam update is the macro ZK_ADAM_LANE, written with ordinary C operators and an FMA
 * argument so that one text serves `float` (scalar C, CUDA) and the SIMD vector types of
 * GCC/clang (__m256, __m512 support + - * / as vector extensions; FMA is fmaf or vfmadd). Only
 * loads, stores and conversions differ between variants.
 *
 * Rounding recipe (docs/design-notes.md, "Kernel rounding"): every result is bit-identical
 * whatever the variant (scalar, AVX2, AVX-512, CUDA), the thread count and where a call is
 * cut into head, vector body and tail. So:
 *   - every + - * / and sqrt rounds on its own, in the order written here, and a fused
 *     multiply-add appears exactly where the formula spells FMA (IEEE fusedMultiplyAdd, one
 *     rounding: fmaf in C and CUDA, vfmadd in the SIMD kernels) and nowhere else: the build
 *     sets -ffp-contract=off for C and --fmad=false for nvcc so that the compiler fuses
 *     nothing on its own; sqrt and / are the IEEE correctly rounded operations on every
 *     target; subnormals are kept (no FTZ/DAZ);
 *   - an arithmetic result that is NaN is stored as the one quiet NaN ZK_NAN_BITS (x86 passes
 *     on the payload of whichever NaN operand the compiler happened to put first, CUDA makes
 *     its own), see zk_nan_canon;
 *   - conversions are exact integer formulas (below), and reductions (zk_sumsq) follow one
 *     order defined by element index (zk/kernels.h).
 *
 * NaN policy of the conversions (IEEE 754 §6.2, and what F16C/AVX-512 do in hardware): a NaN
 * keeps its sign and the top bits of its payload and comes out quiet. fp32 -> fp16/bf16 round
 * to nearest, ties to even; overflow goes to inf; fp16 subnormals are produced and read.
 * bf16 -> fp32 is the exact bit widening (no operation, so no quieting).
 */
#ifndef ZK_ELEM_H
#define ZK_ELEM_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define ZK_HD __host__ __device__
#else
#define ZK_HD
#endif

/* Coefficients of one fused step, all fp32, computed once per call (in double) by the host.
 * The same field names are used by the SIMD kernels with broadcast vector fields. */
typedef struct zk_adam_k {
    float grad_scale;      /* g = acc * grad_scale (unscale x average x clip) */
    float wd_l2;           /* L2 mode: weight_decay; AdamW: 0 */
    float beta1;           /* m = beta1 m + (1 - beta1) g */
    float one_minus_beta1; /* (float)(1 - beta1), exact in double first */
    float beta2;
    float one_minus_beta2;
    float eps;
    float inv_sqrt_bc2;  /* 1 / sqrt(1 - beta2^t), 1 without bias correction */
    float neg_step_size; /* -lr / (1 - beta1^t), -lr without bias correction */
    float neg_lr_wd;     /* AdamW: -lr * weight_decay; L2: 0 */
    int keep_acc;        /* 1: leave acc as it is (the caller overwrites it before reading it) */
} zk_adam_k_t;

/* The quiet NaN that every arithmetic NaN result becomes (fp16 0x7e00, bf16 0x7fc0). */
#define ZK_NAN_BITS 0x7fc00000u

/*
 * docs/semantics.md §4 step 6 for one lane (T = float) or one vector of lanes (T = __m256, __m512):
 *   g = FMA(p, wd_l2, acc * grad_scale)            L2 mode adds wd * p; AdamW: wd_l2 = 0
 *   m = FMA(g, 1 - beta1, beta1 * m)
 *   v = FMA(g * g, 1 - beta2, beta2 * v)
 *   p = FMA(p, -lr wd, p)                          AdamW's decay; L2: -lr wd = 0
 *   p = FMA(m / FMA(sqrt(v), 1 / sqrt(bc2), eps), -lr / bc1, p)
 * FMA(a, b, c) = a * b + c rounded once. This is the arithmetic of DeepSpeed's CPU Adam
 * (DeepSpeedCPUAdam, and FusedAdam on the CPU accelerator), operation for operation, and equals
 * p - lr (m^ / (sqrt(v^) + eps) + wd p) of §3.6 up to fp32 rounding. K holds the coefficients
 * as T (a zk_adam_k_t for floats, a struct of broadcast vectors for SIMD). The caller then maps
 * NaN lanes of p, m and v to ZK_NAN_BITS (zk_nan_canon and its SIMD forms).
 */
#define ZK_ADAM_LANE(T, SQRT, FMA, K, acc, p, m, v)                                                \
    do {                                                                                           \
        T zk_g_ = FMA((p), (K).wd_l2, (acc) * (K).grad_scale);                                     \
        (m) = FMA(zk_g_, (K).one_minus_beta1, (K).beta1 * (m));                                    \
        (v) = FMA(zk_g_ * zk_g_, (K).one_minus_beta2, (K).beta2 * (v));                            \
        (p) = FMA((p), (K).neg_lr_wd, (p));                                                        \
        (p) = FMA((m) / FMA(SQRT(v), (K).inv_sqrt_bc2, (K).eps), (K).neg_step_size, (p));          \
    } while (0)

#if !defined(__CUDA_ARCH__) && !defined(__FMA__)
/* fmaf without an FMA instruction (the baseline x86-64 scalar variant), correctly rounded,
 * without libm's call and rounding-mode switches: a * b is exact in double (24-bit
 * significands), the double sum is made round-to-odd (its exact error from TwoSum decides the
 * last bit), and round-to-odd at 53 bits followed by the conversion to 24 bits rounds as one
 * rounding would (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved
 * algorithms using rounding to odd", 2008). */
static inline double zk_f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static inline float zk_fmaf_soft(float a, float b, float c)
{
    double p = (double)a * (double)b;
    double s = p + (double)c;
    double t = s - p;
    double err = (p - (s - t)) + ((double)c - t);
    uint64_t u;

    memcpy(&u, &s, sizeof(u));
    /* inexact, finite and even: one ulp toward the exact value, which makes it odd. (A
     * branchless form measured 2.8x slower: the branch lets the core run ahead of the chain.) */
    if (err != 0.0 && (u & 1) == 0 && s - s == 0.0) {
        u += ((err > 0.0) == (s > 0.0)) ? 1 : (uint64_t)-1;
        s = zk_f64_from_bits(u);
    }
    return (float)s;
}
#endif

#if defined(__CUDA_ARCH__)
#define ZK_SQRTF(x)      sqrtf(x)
#define ZK_FMAF(a, b, c) __fmaf_rn(a, b, c)
#elif defined(__FMA__)
#define ZK_SQRTF(x)      __builtin_sqrtf(x)
#define ZK_FMAF(a, b, c) __builtin_fmaf(a, b, c) /* one instruction */
#else
#define ZK_SQRTF(x)      __builtin_sqrtf(x)
#define ZK_FMAF(a, b, c) zk_fmaf_soft(a, b, c)
#endif

static inline ZK_HD uint32_t zk_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

static inline ZK_HD float zk_f32_from_bits(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

/* x, or the canonical NaN when x is a NaN (a rare, well-predicted branch: cheaper in the
 * scalar loops than a select through an integer register). */
static inline ZK_HD float zk_nan_canon(float x)
{
    if (__builtin_expect(x != x, 0)) {
        x = zk_f32_from_bits(ZK_NAN_BITS);
    }
    return x;
}

/* One element of the fused step; returns the new master value (m and v updated in place). */
static inline ZK_HD float zk_adam_elem(const zk_adam_k_t *k, float acc, float p, float *m_p,
                                       float *v_p)
{
    float m = *m_p;
    float v = *v_p;
    ZK_ADAM_LANE(float, ZK_SQRTF, ZK_FMAF, *k, acc, p, m, v);
    /* one rare branch for the three results instead of three */
    if (__builtin_expect((p != p) | (m != m) | (v != v), 0)) {
        p = zk_nan_canon(p);
        m = zk_nan_canon(m);
        v = zk_nan_canon(v);
    }
    *m_p = m;
    *v_p = v;
    return p;
}

/* zk_accumulate of one element: acc + x * s, the product rounded before the sum. */
static inline ZK_HD float zk_accumulate_elem(float acc, float x, float s)
{
    return zk_nan_canon(acc + x * s);
}

/* zk_reduce of one element, in fp32. */
static inline ZK_HD float zk_reduce_elem(float a, float b)
{
    return zk_nan_canon(a + b);
}

/* fp32 -> bf16, round to nearest even; NaN -> quiet NaN with the same sign. */
static inline ZK_HD uint16_t zk_f32_to_bf16(float f)
{
    uint32_t u = zk_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    /* adding 0x7fff (+1 when the kept lsb is odd) carries into the kept bits exactly when the
     * dropped half is above (or at, for odd) one half; the carry into the exponent gives inf
     * for values at or above the bf16 overflow threshold */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 -> fp32: exact. */
static inline ZK_HD float zk_bf16_to_f32(uint16_t h)
{
    return zk_f32_from_bits((uint32_t)h << 16);
}

/* fp32 -> fp16, round to nearest even, subnormals produced, overflow to inf, NaN quiet. */
static inline ZK_HD uint16_t zk_f32_to_f16(float f)
{
    uint32_t x = zk_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) { /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u |
                          (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    if (ax >= 0x477ff000u) { /* >= 65520 = max half + half an ulp: rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (ax >= 0x38800000u) { /* normal half: rebias the exponent, round the 13 dropped bits */
        ax += 0xc8000fffu + ((ax >> 13) & 1u); /* (15 - 127) << 23, mod 2^32 */
        return (uint16_t)(sign | (ax >> 13));
    }
    if (ax <= 0x33000000u) { /* <= 2^-25: half of the smallest subnormal, ties to 0 */
        return (uint16_t)sign;
    }
    {
        /* subnormal half: value = mant * 2^(e - 150) = k * 2^-24, k = mant >> (126 - e) */
        uint32_t e = ax >> 23;
        uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
        uint32_t shift = 126u - e; /* 14 .. 24 */
        uint32_t k = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (k & 1u))) {
            k++; /* may become 0x400, the smallest normal: still the right encoding */
        }
        return (uint16_t)(sign | k);
    }
}

/* fp16 -> fp32: exact for numbers; NaN quiet with the payload kept. */
static inline ZK_HD float zk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;

    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant ? 0x00400000u | (mant << 13) : 0u);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* subnormal: normalise; mant * 2^-24 = 1.f * 2^(k - 24) with k the top set bit */
        exp = 113u;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    return zk_f32_from_bits(bits);
}

#endif
