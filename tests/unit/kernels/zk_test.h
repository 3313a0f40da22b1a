/*
 * Helpers of the kernel tests: fresh random data (seed printed, ZEROD_TEST_SEED replays it),
 * buffers at a chosen misalignment, one test per variant that skips with a reason when this
 * CPU cannot run it, and the fp64 error model used to argue tolerances.
 */
#ifndef ZK_TEST_H
#define ZK_TEST_H

#include "zk/elem.h"
#include "zk/kernels.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- random numbers: splitmix64, seeded per test ---- */

static uint64_t zt_state;
static uint64_t zt_seed;

static inline void zt_seed_init(void)
{
    const char *env = getenv("ZEROD_TEST_SEED");
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    zt_seed = env != NULL ? strtoull(env, NULL, 0)
                          : ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec;
    zt_state = zt_seed;
    cr_log_info("random seed %llu (replay with ZEROD_TEST_SEED=%llu)", (unsigned long long)zt_seed,
                (unsigned long long)zt_seed);
}

static inline uint64_t zt_u64(void)
{
    uint64_t z = (zt_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline double zt_uniform(double lo, double hi)
{
    return lo + (hi - lo) * (double)(zt_u64() >> 11) * 0x1.0p-53;
}

/* signed, log-uniform magnitude in [2^lo_exp, 2^hi_exp) */
static inline float zt_logu(int lo_exp, int hi_exp)
{
    double mag = exp2(zt_uniform(lo_exp, hi_exp));
    return (float)((zt_u64() & 1) ? -mag : mag);
}

/* ---- buffers: 64-byte aligned base + `off` bytes ---- */

typedef struct zt_buf {
    void *base;
    void *p;
} zt_buf_t;

static inline void *zt_alloc(zt_buf_t *b, size_t bytes, size_t off)
{
    b->base = aligned_alloc(64, ((bytes + off + 64) + 63) / 64 * 64);
    cr_assert_not_null(b->base);
    b->p = (char *)b->base + off;
    return b->p;
}

static inline void zt_free(zt_buf_t *b)
{
    free(b->base);
    b->base = NULL;
    b->p = NULL;
}

/* ---- variants ---- */

/* The _nt tests also prefetch (ZT_PREFETCH elements ahead, short enough that the lengths
 * below run both the prefetching loop and the plain one after it). */
#define ZT_PREFETCH 64
static inline zk_exec_t zt_exec_for(zk_variant_t v, zk_stores_t stores)
{
    zk_exec_t ex = {.variant = (int)v,
                    .pool = NULL,
                    .stores = (int)stores,
                    .prefetch = stores == ZK_STORES_NT ? ZT_PREFETCH : 0};

    if (!zk_variant_supported(v)) {
        cr_skip_test(
            "variant %s: this CPU lacks the instructions it needs (%s)", zk_variant_name(v),
            v == ZK_VARIANT_AVX2 ? "AVX2, FMA, F16C" : "AVX-512 F/DQ/BW/VL, AVX2, FMA, F16C");
    }
    return ex;
}

/* Test(suite, name) calling fn(exec) with variant v's exec and the given stores. */
#define ZT_VARIANT_TEST(suite, name, fn, v, stores)                                                \
    Test(suite, name)                                                                              \
    {                                                                                              \
        zt_seed_init();                                                                            \
        fn(zt_exec_for(v, stores));                                                                \
    }

/* Test(suite, name_avx2), Test(suite, name_avx512): fn(exec) for each SIMD variant, for the
 * tests that compare a variant with the scalar reference (skipped, with the reason, where the
 * CPU lacks the variant); each once with regular stores and once (name_avx2_nt, ...) with
 * non-temporal ones and a software prefetch at every size, so every path runs whatever this
 * CPU's plan says. */
#define ZT_SIMD_VARIANT_TESTS(suite, name, fn)                                                     \
    ZT_VARIANT_TEST(suite, name##_avx2, fn, ZK_VARIANT_AVX2, ZK_STORES_REGULAR)                    \
    ZT_VARIANT_TEST(suite, name##_avx2_nt, fn, ZK_VARIANT_AVX2, ZK_STORES_NT)                      \
    ZT_VARIANT_TEST(suite, name##_avx512, fn, ZK_VARIANT_AVX512, ZK_STORES_REGULAR)                \
    ZT_VARIANT_TEST(suite, name##_avx512_nt, fn, ZK_VARIANT_AVX512, ZK_STORES_NT)

/* Test(suite, name_scalar), Test(suite, name_avx2), Test(suite, name_avx512) calling
 * fn(exec) with the variant's exec. */
#define ZT_VARIANT_TESTS(suite, name, fn)                                                          \
    ZT_VARIANT_TEST(suite, name##_scalar, fn, ZK_VARIANT_SCALAR, ZK_STORES_AUTO)                   \
    ZT_SIMD_VARIANT_TESTS(suite, name, fn)

/* The lengths every kernel is tried at, and the misalignments (in elements) cycled over. */
static const size_t zt_lengths[] = {0, 1, 15, 17, 1023, 1000003};
#define ZT_N_LENGTHS (sizeof(zt_lengths) / sizeof(zt_lengths[0]))
static const size_t zt_offsets[] = {0, 1, 3, 7, 13};
#define ZT_N_OFFSETS (sizeof(zt_offsets) / sizeof(zt_offsets[0]))

/* ---- determinism: thread counts, edge lengths, special values, bitwise comparison ---- */

/* Pool sizes every pool-split test runs with (1 = a pool of one, the calling thread). */
static const unsigned zt_threads[] = {1, 2, 3, 5};
#define ZT_N_THREADS (sizeof(zt_threads) / sizeof(zt_threads[0]))

/* Lengths around the vector widths (8, 16), the unrolled loops, the 1024-element pool grain and
 * zk_sumsq's super-block; with the offsets of zt_edge_offset they put every head and tail
 * length in front of every variant. */
static const size_t zt_edge_lengths[] = {
    0,   1,   2,    3,    5,    7,    8,     9,     13,    15,    16,    17,    23,
    24,  31,  32,   33,   47,   48,   63,    64,    65,    127,   128,   129,   255,
    256, 257, 1023, 1024, 1025, 2047, 16383, 16384, 16385, 32768, 49169, 100003};
#define ZT_N_EDGE_LENGTHS (sizeof(zt_edge_lengths) / sizeof(zt_edge_lengths[0]))

/* the misalignment (elements) used with the k-th edge case: 0 .. 16, so 64-byte heads of every
 * length for fp32 and 32-byte ones for 16-bit types */
static inline size_t zt_edge_offset(size_t k)
{
    return (k * 7) % 17;
}

/* fp32 values that exercise every path of an operation: NaNs (quiet, signalling, either sign,
 * several payloads), infinities, zeros, subnormals, the extremes of the normal range. */
static const uint32_t zt_special_bits[] = {
    0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fd55555u, 0x7fffffffu,
    0x7f800000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu,
    0x00400000u, 0x00800000u, 0x80800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f000000u,
    0x0d800000u, 0x33800000u, 0x477fe000u, 0x477ff000u, 0xc77fffffu, 0x38800000u};
#define ZT_N_SPECIALS (sizeof(zt_special_bits) / sizeof(zt_special_bits[0]))

static inline float zt_special(void)
{
    uint32_t u = zt_special_bits[zt_u64() % ZT_N_SPECIALS];
    float f;

    memcpy(&f, &u, 4);
    return f;
}

/* with probability 1/every a special value, else x */
static inline float zt_or_special(float x, unsigned every)
{
    return zt_u64() % every == 0 ? zt_special() : x;
}

/* The index of the first element (of size esize) where a and b differ, or n when none does. */
static inline size_t zt_first_diff(const void *a, const void *b, size_t n, size_t esize)
{
    if (memcmp(a, b, n * esize) == 0) {
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        if (memcmp((const char *)a + i * esize, (const char *)b + i * esize, esize) != 0) {
            return i;
        }
    }
    return n;
}

/* the bits of element i of an array of esize-byte elements (esize 2, 4 or 8) */
static inline unsigned long long zt_elem_bits(const void *p, size_t i, size_t esize)
{
    uint64_t u64 = 0;
    uint32_t u32 = 0;
    uint16_t u16 = 0;

    switch (esize) {
    case 2:
        memcpy(&u16, (const char *)p + 2 * i, 2);
        return u16;
    case 4:
        memcpy(&u32, (const char *)p + 4 * i, 4);
        return u32;
    default:
        memcpy(&u64, (const char *)p + 8 * i, 8);
        return u64;
    }
}

/* Assert got[0..n) == want[0..n) bit for bit, naming the first element that differs. */
#define zt_assert_same_bits(got, want, n, esize, ...)                                              \
    do {                                                                                           \
        size_t zt_i_ = zt_first_diff((got), (want), (n), (esize));                                 \
        if (zt_i_ != (n)) {                                                                        \
            cr_log_error(__VA_ARGS__);                                                             \
            cr_assert_fail("element %zu of %zu: %0*llx, want %0*llx (seed %llu)", zt_i_,           \
                           (size_t)(n), (int)(2 * (esize)), zt_elem_bits((got), zt_i_, (esize)),   \
                           (int)(2 * (esize)), zt_elem_bits((want), zt_i_, (esize)),               \
                           (unsigned long long)zt_seed);                                           \
        }                                                                                          \
    } while (0)

static inline zk_pool_t *zt_pool(unsigned threads)
{
    zk_pool_t *pool = NULL;

    cr_assert_eq(zk_pool_create(threads, &pool), ZS_OK, "%s", zk_last_error());
    return pool;
}

/* ---- fp64 error model ----
 * A zt_ev_t carries the exact (fp64) value x of a quantity and a bound e on how far the
 * kernel's fp32 value of it can be from x. Each fp32 operation rounds once, to within half an
 * ulp: |fl(z) - z| <= 2^-24 |z| for normal results, plus 2^-150 absolute for subnormal ones;
 * errors of the operands propagate by the operation's derivative (second-order terms kept
 * for products and quotients). A fused multiply-add rounds less than the separate operations,
 * so a bound for the separate ones holds for it too; zt_fma models the one rounding. ZT_U also
 * absorbs the fp64 reference's own rounding (2^-53 per operation). */
#define ZT_U (0x1.0p-24 + 0x1.0p-52)
#define ZT_A 0x1.0p-150

typedef struct zt_ev {
    double x;
    double e;
} zt_ev_t;

static inline zt_ev_t zt_ev(double x)
{
    return (zt_ev_t){x, 0.0};
}

/* a coefficient the kernel rounds from an fp64 value to fp32 */
static inline zt_ev_t zt_coef(double x)
{
    return (zt_ev_t){x, fabs((double)(float)x - x)};
}

static inline zt_ev_t zt_round(double x, double e)
{
    return (zt_ev_t){x, e + ZT_U * fabs(x) + ZT_A};
}

static inline zt_ev_t zt_add(zt_ev_t a, zt_ev_t b)
{
    return zt_round(a.x + b.x, a.e + b.e);
}

static inline zt_ev_t zt_sub(zt_ev_t a, zt_ev_t b)
{
    return zt_round(a.x - b.x, a.e + b.e);
}

static inline zt_ev_t zt_mul(zt_ev_t a, zt_ev_t b)
{
    return zt_round(a.x * b.x, fabs(a.x) * b.e + fabs(b.x) * a.e + a.e * b.e);
}

/* a * b + c rounded once (IEEE fusedMultiplyAdd) */
static inline zt_ev_t zt_fma(zt_ev_t a, zt_ev_t b, zt_ev_t c)
{
    return zt_round(a.x * b.x + c.x, fabs(a.x) * b.e + fabs(b.x) * a.e + a.e * b.e + c.e);
}

static inline zt_ev_t zt_div(zt_ev_t a, zt_ev_t b)
{
    double x = a.x / b.x;
    double lo = fabs(b.x) - b.e; /* smallest |denominator| the kernel can see */

    cr_assert_gt(lo, 0.0, "error model: denominator may vanish");
    return zt_round(x, (a.e + fabs(x) * b.e) / lo);
}

static inline zt_ev_t zt_sqrt(zt_ev_t a)
{
    double x = sqrt(a.x);
    double lo = a.x > a.e ? sqrt(a.x - a.e) : 0.0;
    double e = sqrt(a.e); /* |sqrt(y) - sqrt(x)| <= sqrt(|y - x|) */

    if (x + lo > 0.0 && a.e / (x + lo) < e) {
        e = a.e / (x + lo);
    }
    return zt_round(x, e);
}

/* ---- independent conversion references (binary search / candidate comparison) ---- */

/* exact value of an fp16 pattern (NaN patterns excluded by the callers) */
static inline double zt_f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    int m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

/* fp32 -> fp16 round to nearest even, from the values: the two neighbours, the closer wins,
 * a tie goes to the even pattern; at or beyond 65520 (max + half ulp) the result is inf. */
static inline uint16_t zt_ref_f16(float f)
{
    uint32_t u;
    uint16_t sign, lo = 0, hi = 0x7c00;
    double a;

    memcpy(&u, &f, 4);
    sign = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(f)) {
        return (uint16_t)(sign | 0x7e00 | ((u & 0x7fffff) >> 13));
    }
    a = fabs((double)f);
    if (a >= 65520.0) {
        return sign | 0x7c00;
    }
    while (hi - lo > 1) { /* largest pattern with value <= a */
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (zt_f16_value(mid) <= a) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if (zt_f16_value(lo) == a) {
        return sign | lo;
    }
    {
        double dl = a - zt_f16_value(lo);
        double dh = zt_f16_value(hi) - a;
        if (dl < dh || (dl == dh && (lo & 1) == 0)) {
            return sign | lo;
        }
        return sign | hi;
    }
}

static inline uint16_t zt_ref_bf16(float f)
{
    uint32_t u, t;
    float lo, hi;
    double dl, dh;

    memcpy(&u, &f, 4);
    if (isnan(f)) {
        return (uint16_t)((u >> 16) | 0x40);
    }
    t = u & 0xffff0000u; /* toward zero */
    memcpy(&lo, &t, 4);
    if (t == u) {
        return (uint16_t)(u >> 16);
    }
    t += 0x10000u; /* next away from zero (max finite -> inf) */
    memcpy(&hi, &t, 4);
    dl = fabs((double)f - (double)lo);
    /* hi = inf: RNE rounds as if the exponent were unbounded, toward 2^128 */
    dh = isinf(hi) ? 0x1.0p128 - fabs((double)f) : fabs((double)hi - (double)f);
    if (dl < dh || (dl == dh && ((u >> 16) & 1) == 0)) {
        return (uint16_t)(u >> 16);
    }
    return (uint16_t)(t >> 16);
}

static inline float zt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t zt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline uint64_t zt_f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

#endif
