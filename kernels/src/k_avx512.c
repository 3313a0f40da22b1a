/*
 * zk AVX-512 variant (F/DQ/BW/VL; AVX512_BF16 for fp32 -> bf16 where present), 16 lanes.
 * Heads and tails use masked loads and stores; the main loop starts where the first written
 * stream is aligned, and uses non-temporal stores on every stream that is aligned there when
 * the caller asks for them (calls larger than the caches).
 * Head, body and tail are the same masked vector code, and round like the scalar variant
 * (zk/elem.h, "Rounding recipe"): every multiply and add separately, FMA only where the
 * formula writes it (the file is compiled with -ffp-contract=off), NaN results mapped to
 * ZK_NAN_BITS.
 * Compiled with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mavx2 -mfma -mf16c; called only after
 * zk_variant_supported(ZK_VARIANT_AVX512).
 */
#include "zk_int.h"

#include <immintrin.h>
#include <string.h>

typedef struct zk_k512 {
    __m512 grad_scale, wd_l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2,
        neg_step_size, neg_lr_wd;
} zk_k512_t;

/* The first n lanes (n < 16). */
static __mmask16 zk_mask(size_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

static int zk_have_bf16 = -1;

static int zk512_bf16_supported(void)
{
#if defined(ZK_HAVE_AVX512BF16)
    if (zk_have_bf16 < 0) {
        __builtin_cpu_init();
        zk_have_bf16 = __builtin_cpu_supports("avx512bf16") ? 1 : 0;
    }
    return zk_have_bf16;
#else
    return 0;
#endif
}

/* zk_nan_canon on 16 lanes. */
ZK_ALWAYS_INLINE __m512 zk512_canon(__m512 x)
{
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                              _mm512_castsi512_ps(_mm512_set1_epi32((int)ZK_NAN_BITS)));
}

/* fp32 -> bf16 RNE in integer arithmetic: the exact formula of zk_f32_to_bf16. */
ZK_ALWAYS_INLINE __m256i zk512_bf16_int(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));

    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

#if defined(ZK_HAVE_AVX512BF16)
/* VCVTNEPS2BF16 rounds to nearest even and quiets NaN like zk_f32_to_bf16, but flushes
 * subnormal inputs to zero: blocks holding a subnormal (one VFPCLASSPS finds them) take the
 * integer path. Executed only
 * when cpuid reports AVX512_BF16 (the file is compiled with -mavx512bf16 for this). */
ZK_ALWAYS_INLINE __m256i zk512_bf16_hw(__m512 x)
{
    __mmask16 sub = _mm512_fpclass_ps_mask(x, 0x20); /* subnormal */

    if (__builtin_expect(sub != 0, 0)) {
        return zk512_bf16_int(x);
    }
    return (__m256i)_mm512_cvtneps_pbh(x);
}
#else
#define zk512_bf16_hw(x) zk512_bf16_int(x)
#endif

ZK_ALWAYS_INLINE __m256i zk512_bf16(__m512 x, int hw)
{
    return hw ? zk512_bf16_hw(x) : zk512_bf16_int(x);
}

/* 16 elements of dtype dt at index i as fp32; `full` (a constant after inlining) selects the
 * unmasked path. */
ZK_ALWAYS_INLINE __m512 zk512_ld(const void *p, zs_dtype_t dt, size_t i, __mmask16 mk, int full)
{
    const uint16_t *h = (const uint16_t *)p + i;
    __m256i w;

    switch (dt) {
    case ZS_DTYPE_F16:
    case ZS_DTYPE_BF16:
        w = full ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(mk, h);
        if (dt == ZS_DTYPE_F16) {
            return _mm512_cvtph_ps(w);
        }
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16));
    default:
        return full ? _mm512_loadu_ps((const float *)p + i)
                    : _mm512_maskz_loadu_ps(mk, (const float *)p + i);
    }
}

ZK_ALWAYS_INLINE void zk512_st_f32(float *p, __m512 x, __mmask16 mk, int full, int nt)
{
    if (!full) {
        _mm512_mask_storeu_ps(p, mk, x);
    } else if (nt) {
        _mm512_stream_ps(p, x);
    } else {
        _mm512_storeu_ps(p, x);
    }
}

ZK_ALWAYS_INLINE void zk512_st(void *p, zs_dtype_t dt, size_t i, __m512 x, __mmask16 mk, int full,
                               int nt, int hw)
{
    uint16_t *h = (uint16_t *)p + i;
    __m256i w;

    switch (dt) {
    case ZS_DTYPE_F16:
    case ZS_DTYPE_BF16:
        w = dt == ZS_DTYPE_F16 ? _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT) : zk512_bf16(x, hw);
        if (!full) {
            _mm256_mask_storeu_epi16(h, mk, w);
        } else if (nt) {
            _mm256_stream_si256((__m256i *)h, w);
        } else {
            _mm256_storeu_si256((__m256i *)h, w);
        }
        break;
    default:
        zk512_st_f32((float *)p + i, x, mk, full, nt);
        break;
    }
}

/* ---- fused step ---- */

ZK_ALWAYS_INLINE void zk512_adam_block(const zk_k512_t *K, float *p, float *m, float *v, float *a,
                                       void *dst, zs_dtype_t dt, size_t i, __mmask16 mk, int full,
                                       unsigned ntf, int hw, size_t pf)
{
    if (pf != 0) {
        ZK_PREFETCH(p, 4, i, pf);
        ZK_PREFETCH(m, 4, i, pf);
        ZK_PREFETCH(v, 4, i, pf);
        ZK_PREFETCH(a, 4, i, pf);
    }
    __m512 P = zk512_ld(p, ZS_DTYPE_F32, i, mk, full);
    __m512 M = zk512_ld(m, ZS_DTYPE_F32, i, mk, full);
    __m512 V = zk512_ld(v, ZS_DTYPE_F32, i, mk, full);
    __m512 A = zk512_ld(a, ZS_DTYPE_F32, i, mk, full);

    ZK_ADAM_LANE(__m512, _mm512_sqrt_ps, _mm512_fmadd_ps, *K, A, P, M, V);
    /* one compare tests two vectors; the masked moves run only in a vector with a NaN */
    if (__builtin_expect(
            (_mm512_cmp_ps_mask(P, M, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(V, V, _CMP_UNORD_Q)) != 0,
            0)) {
        P = zk512_canon(P);
        M = zk512_canon(M);
        V = zk512_canon(V);
    }
    zk512_st_f32(p + i, P, mk, full, ntf & ZK_NT_P);
    zk512_st_f32(m + i, M, mk, full, ntf & ZK_NT_M);
    zk512_st_f32(v + i, V, mk, full, ntf & ZK_NT_V);
    if (!(ntf & ZK_KEEP_A)) {
        zk512_st_f32(a + i, _mm512_setzero_ps(), mk, full, ntf & ZK_NT_A);
    }
    if (dst != NULL) {
        zk512_st(dst, dt, i, P, mk, full, ntf & ZK_NT_DST, hw);
    }
}

/* The full vectors from i on: prefetching up to pe, then plain; returns where it stopped. */
ZK_ALWAYS_INLINE size_t zk512_adam_loop(const zk_k512_t *K, float *p, float *m, float *v, float *a,
                                        void *dst, zs_dtype_t dt, size_t i, size_t n, size_t pe,
                                        unsigned ntf, int hw, unsigned pf)
{
    for (; i + 16 <= pe; i += 16) {
        zk512_adam_block(K, p, m, v, a, dst, dt, i, 0, 1, ntf, hw, pf);
    }
    for (; i + 16 <= n; i += 16) {
        zk512_adam_block(K, p, m, v, a, dst, dt, i, 0, 1, ntf, hw, 0);
    }
    return i;
}

/* The common cases (regular stores, with or without the accumulator kept) each get a loop
 * with every flag a constant, so that no element pays a branch; other store mixes share one. */
static size_t zk512_adam_main(const zk_k512_t *K, float *p, float *m, float *v, float *a, void *dst,
                              zs_dtype_t dt, size_t i, size_t n, unsigned ntf, int hw, unsigned pf)
{
    size_t pe = zk_pf_end(i, n, pf);

#define ZK_L(D, DT, NTF, HW) zk512_adam_loop(K, p, m, v, a, D, DT, i, n, pe, NTF, HW, pf)
#define ZK_BY_DST(NTF)                                                                             \
    (dst == NULL          ? ZK_L(NULL, ZS_DTYPE_F32, NTF, 0)                                       \
     : dt == ZS_DTYPE_F32 ? ZK_L(dst, ZS_DTYPE_F32, NTF, 0)                                        \
     : dt == ZS_DTYPE_F16 ? ZK_L(dst, ZS_DTYPE_F16, NTF, 0)                                        \
     : hw                 ? ZK_L(dst, ZS_DTYPE_BF16, NTF, 1)                                       \
                          : ZK_L(dst, ZS_DTYPE_BF16, NTF, 0))
    if (ntf == ZK_KEEP_A) {
        return ZK_BY_DST(ZK_KEEP_A);
    }
    if (ntf == 0) {
        return ZK_BY_DST(0);
    }
    return ZK_L(dst, dt, ntf, hw);
#undef ZK_BY_DST
#undef ZK_L
}

static void zk512_adam(const zk_adam_k_t *k, float *p, float *m, float *v, float *a, void *dst,
                       zs_dtype_t dt, size_t n, zk_st_t st)
{
    zk_k512_t K = {
        .grad_scale = _mm512_set1_ps(k->grad_scale),
        .wd_l2 = _mm512_set1_ps(k->wd_l2),
        .beta1 = _mm512_set1_ps(k->beta1),
        .one_minus_beta1 = _mm512_set1_ps(k->one_minus_beta1),
        .beta2 = _mm512_set1_ps(k->beta2),
        .one_minus_beta2 = _mm512_set1_ps(k->one_minus_beta2),
        .eps = _mm512_set1_ps(k->eps),
        .inv_sqrt_bc2 = _mm512_set1_ps(k->inv_sqrt_bc2),
        .neg_step_size = _mm512_set1_ps(k->neg_step_size),
        .neg_lr_wd = _mm512_set1_ps(k->neg_lr_wd),
    };
    size_t dsize = dst != NULL ? zs_dtype_size(dt) : 0;
    size_t i = zk_head(p, 64, 4, n);
    int hw = dt == ZS_DTYPE_BF16 && zk512_bf16_supported();
    unsigned keep = k->keep_acc ? ZK_KEEP_A : 0;
    unsigned ntf = keep;

    if (i > 0) {
        zk512_adam_block(&K, p, m, v, a, dst, dt, 0, zk_mask(i), 0, keep, hw, 0);
    }
    if (st.nt) {
        ntf |= zk_aligned(p + i, 64) ? ZK_NT_P : 0;
        ntf |= zk_aligned(m + i, 64) ? ZK_NT_M : 0;
        ntf |= zk_aligned(v + i, 64) ? ZK_NT_V : 0;
        ntf |= zk_aligned(a + i, 64) ? ZK_NT_A : 0;
        ntf |= dst != NULL && zk_aligned((char *)dst + i * dsize, 16 * dsize) ? ZK_NT_DST : 0;
    }
    i = zk512_adam_main(&K, p, m, v, a, dst, dt, i, n, ntf, hw, st.pf);
    if (i < n) {
        zk512_adam_block(&K, p, m, v, a, dst, dt, i, zk_mask(n - i), 0, keep, hw, 0);
    }
    if (ntf & ~ZK_KEEP_A) {
        _mm_sfence();
    }
}

/* ---- sum of squares: zk_sumsq's order (zk/kernels.h), lanes 0-7 and 8-15 ---- */

/* Squares of x[0..16) added to lanes 0-7 and 8-15. A square of an fp32 value is exact in
 * double (24-bit significands), so the fused multiply-add rounds once, at the add, exactly as
 * a multiply and then an add. */
ZK_ALWAYS_INLINE void zk512_sq_add(__m512d *a, const float *x)
{
    /* two 256-bit loads, widened as they come: no extract for the upper half, one port-5
     * shuffle less per 16 elements (on the Xeon VM 8-10 % faster beyond the caches without a
     * prefetch, the same within noise with one) */
    __m512d d0 = _mm512_cvtps_pd(_mm256_loadu_ps(x));
    __m512d d1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + 8));

    a[0] = _mm512_fmadd_pd(d0, d0, a[0]);
    a[1] = _mm512_fmadd_pd(d1, d1, a[1]);
}

/* The lanes a[0..1] of a super-block with its scalar tail x[i..len) added, through the tree. */
ZK_ALWAYS_INLINE double zk512_sumsq_finish(const __m512d *a, const float *x, size_t i, size_t len)
{
    double lane[ZK_SUMSQ_LANES];

    _mm512_storeu_pd(lane, a[0]);
    _mm512_storeu_pd(lane + 8, a[1]);
    zk_sumsq_lanes_add(lane, x, i, len);
    return zk_sumsq_lanes_tree(lane);
}

/* Two whole super-blocks at once (part[0], part[1]): their lanes are independent, so four
 * chains of fused multiply-adds run where one block has two, with the same order and bits.
 * With two, a block's chains of 4-cycle adds hold the out-of-order window behind each miss;
 * on the Xeon VM beyond the caches two blocks at once read at the streaming limit (12.1-12.6
 * against 12.1-12.7 GB/s, 64 Mi elements), one block at a time at 0.85-0.9 of it. On an AMD
 * EPYC VM (Zen 5 class) it is the other way round: in three zk_bench runs of each, one block at
 * a time read at 0.93-0.95 of the limit at 64 Mi elements, two at once at 0.83-0.84. The
 * store plan chooses (st.nt: one at a time). */
static void zk512_sumsq_pair(const float *y, size_t rest, double *part, zk_st_t st)
{
    const float *z = y + ZK_SUMSQ_BLOCK;
    size_t pe = zk_pf_end(0, rest - ZK_SUMSQ_BLOCK, st.pf), i = 0;
    __m512d a[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    __m512d c[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};

    for (; i < ZK_SUMSQ_BLOCK && i < pe; i += ZK_SUMSQ_LANES) {
        ZK_PREFETCH(y, 4, i, st.pf);
        ZK_PREFETCH(z, 4, i, st.pf);
        zk512_sq_add(a, y + i);
        zk512_sq_add(c, z + i);
    }
    for (; i < ZK_SUMSQ_BLOCK; i += ZK_SUMSQ_LANES) {
        zk512_sq_add(a, y + i);
        zk512_sq_add(c, z + i);
    }
    part[0] = zk512_sumsq_finish(a, y, i, ZK_SUMSQ_BLOCK);
    part[1] = zk512_sumsq_finish(c, z, i, ZK_SUMSQ_BLOCK);
}

static void zk512_sumsq(const float *x, size_t n, double *part, zk_st_t st)
{
    size_t b = 0;

    for (; !st.nt && n - b >= 2 * ZK_SUMSQ_BLOCK; b += 2 * ZK_SUMSQ_BLOCK) {
        zk512_sumsq_pair(x + b, n - b, part + b / ZK_SUMSQ_BLOCK, st);
    }
    for (; b < n; b += ZK_SUMSQ_BLOCK) {
        const float *xb = x + b;
        size_t len = n - b < ZK_SUMSQ_BLOCK ? n - b : ZK_SUMSQ_BLOCK;
        size_t pe = zk_pf_end(0, n - b, st.pf), i = 0;
        __m512d a[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};

        for (; i + ZK_SUMSQ_LANES <= len && i + ZK_SUMSQ_LANES <= pe; i += ZK_SUMSQ_LANES) {
            ZK_PREFETCH(xb, 4, i, st.pf);
            zk512_sq_add(a, xb + i);
        }
        for (; i + ZK_SUMSQ_LANES <= len; i += ZK_SUMSQ_LANES) {
            zk512_sq_add(a, xb + i);
        }
        part[b / ZK_SUMSQ_BLOCK] = zk512_sumsq_finish(a, xb, i, len);
    }
}

/* ---- reduce of fp32 with the squares of its results: zk_reduce_sumsq_parts ---- */

/* x (16 results) squared into lanes 0-7 and 8-15, as zk512_sq_add would read them back. */
ZK_ALWAYS_INLINE void zk512_sq_add_reg(__m512d *a, __m512 x)
{
    __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d d1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));

    a[0] = _mm512_fmadd_pd(d0, d0, a[0]);
    a[1] = _mm512_fmadd_pd(d1, d1, a[1]);
}

ZK_ALWAYS_INLINE void zk512_redsq_block(float *d, const float *x, const float *y, size_t i,
                                        __m512d *a, int nt)
{
    __m512 s = zk512_canon(_mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));

    zk512_st_f32(d + i, s, 0, 1, nt);
    zk512_sq_add_reg(a, s);
}

/* A super-block at a time from dst (a super-block start); the tail of the last one in scalar,
 * its squares read back from dst by zk512_sumsq_finish. */
ZK_ALWAYS_INLINE void zk512_redsq_loop(float *dst, const float *a, const float *b, size_t n,
                                       double *part, unsigned pf, int nt)
{
    size_t pe = zk_pf_end(0, n, pf);

    for (size_t o = 0; o < n; o += ZK_SUMSQ_BLOCK) {
        size_t len = n - o < ZK_SUMSQ_BLOCK ? n - o : ZK_SUMSQ_BLOCK, i = 0;
        float *d = dst + o;
        const float *x = a + o, *y = b + o;
        __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};

        for (; i + 16 <= len && o + i + 16 <= pe; i += 16) {
            ZK_PREFETCH(x, 4, i, pf);
            ZK_PREFETCH(y, 4, i, pf);
            zk512_redsq_block(d, x, y, i, acc, nt);
        }
        for (; i + 16 <= len; i += 16) {
            zk512_redsq_block(d, x, y, i, acc, nt);
        }
        for (size_t j = i; j < len; j++) {
            d[j] = zk_reduce_elem(x[j], y[j]);
        }
        part[o / ZK_SUMSQ_BLOCK] = zk512_sumsq_finish(acc, d, i, len);
    }
}

static void zk512_reduce_sumsq(float *dst, const float *a, const float *b, size_t n, double *part,
                               zk_st_t st)
{
    /* a super-block is 64 KiB: an aligned start keeps every block aligned */
    if (st.nt && zk_aligned(dst, 64)) {
        zk512_redsq_loop(dst, a, b, n, part, st.pf, 1);
        _mm_sfence();
    } else {
        zk512_redsq_loop(dst, a, b, n, part, st.pf, 0);
    }
}

/* ---- accumulate ---- */

ZK_ALWAYS_INLINE void zk512_acc_block(float *acc, const void *src, zs_dtype_t dt, __m512 s,
                                      size_t i, __mmask16 mk, int full, int nt)
{
    __m512 a = zk512_ld(acc, ZS_DTYPE_F32, i, mk, full);
    __m512 x = zk512_ld(src, dt, i, mk, full);

    zk512_st_f32(acc + i, zk512_canon(_mm512_add_ps(a, _mm512_mul_ps(x, s))), mk, full, nt);
}

static void zk512_accumulate(float *acc, const void *src, zs_dtype_t dt, float s, size_t n,
                             zk_st_t st)
{
    __m512 S = _mm512_set1_ps(s);
    size_t i = zk_head(acc, 64, 4, n), pe, es = zs_dtype_size(dt);
    int nt;

    if (i > 0) {
        zk512_acc_block(acc, src, dt, S, 0, zk_mask(i), 0, 0);
    }
    nt = st.nt && zk_aligned(acc + i, 64);
    for (pe = zk_pf_end(i, n, st.pf); i + 16 <= pe; i += 16) {
        ZK_PREFETCH(acc, 4, i, st.pf);
        ZK_PREFETCH(src, es, i, st.pf);
        zk512_acc_block(acc, src, dt, S, i, 0, 1, nt);
    }
    for (; i + 16 <= n; i += 16) {
        zk512_acc_block(acc, src, dt, S, i, 0, 1, nt);
    }
    if (i < n) {
        zk512_acc_block(acc, src, dt, S, i, zk_mask(n - i), 0, 0);
    }
    if (nt) {
        _mm_sfence();
    }
}

/* ---- reduce and cast: dst = f(src...) with dst of any dtype ---- */

ZK_ALWAYS_INLINE void zk512_red_block(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                      size_t i, __mmask16 mk, int full, int nt, int hw)
{
    __m512 x =
        zk512_canon(_mm512_add_ps(zk512_ld(a, dt, i, mk, full), zk512_ld(b, dt, i, mk, full)));

    zk512_st(dst, dt, i, x, mk, full, nt, hw);
}

ZK_ALWAYS_INLINE size_t zk512_red_loop(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                       size_t i, size_t n, unsigned pf, int nt, int hw)
{
    size_t es = zs_dtype_size(dt), pe = zk_pf_end(i, n, pf);

    for (; i + 16 <= pe; i += 16) {
        ZK_PREFETCH(a, es, i, pf);
        ZK_PREFETCH(b, es, i, pf);
        zk512_red_block(dst, a, b, dt, i, 0, 1, nt, hw);
    }
    for (; i + 16 <= n; i += 16) {
        zk512_red_block(dst, a, b, dt, i, 0, 1, nt, hw);
    }
    return i;
}

/* Every (dtype, stores, conversion) gets its own loop, constants folded in. */
static size_t zk512_red_main(void *dst, const void *a, const void *b, zs_dtype_t dt, size_t i,
                             size_t n, unsigned pf, int nt, int hw)
{
#define ZK_L(DT, NT, HW) zk512_red_loop(dst, a, b, DT, i, n, pf, NT, HW)
#define ZK_BY_DT(NT)                                                                               \
    (dt == ZS_DTYPE_F32   ? ZK_L(ZS_DTYPE_F32, NT, 0)                                              \
     : dt == ZS_DTYPE_F16 ? ZK_L(ZS_DTYPE_F16, NT, 0)                                              \
     : hw                 ? ZK_L(ZS_DTYPE_BF16, NT, 1)                                             \
                          : ZK_L(ZS_DTYPE_BF16, NT, 0))
    return nt ? ZK_BY_DT(1) : ZK_BY_DT(0);
#undef ZK_BY_DT
#undef ZK_L
}

static void zk512_reduce(void *dst, const void *a, const void *b, zs_dtype_t dt, size_t n,
                         zk_st_t st)
{
    size_t es = zs_dtype_size(dt), w = 16 * es;
    size_t i = zk_head(dst, w, es, n);
    int hw = dt == ZS_DTYPE_BF16 && zk512_bf16_supported(), nt;

    if (i > 0) {
        zk512_red_block(dst, a, b, dt, 0, zk_mask(i), 0, 0, hw);
    }
    nt = st.nt && zk_aligned((char *)dst + i * es, w);
    i = zk512_red_main(dst, a, b, dt, i, n, st.pf, nt, hw);
    if (i < n) {
        zk512_red_block(dst, a, b, dt, i, zk_mask(n - i), 0, 0, hw);
    }
    if (nt) {
        _mm_sfence();
    }
}

ZK_ALWAYS_INLINE void zk512_cast_block(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                                       size_t i, __mmask16 mk, int full, int nt, int hw)
{
    zk512_st(dst, ddt, i, zk512_ld(src, sdt, i, mk, full), mk, full, nt, hw);
}

ZK_ALWAYS_INLINE size_t zk512_cast_loop(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                                        size_t i, size_t n, unsigned pf, int nt, int hw)
{
    size_t ses = zs_dtype_size(sdt), pe = zk_pf_end(i, n, pf);

    for (; i + 16 <= pe; i += 16) {
        ZK_PREFETCH(src, ses, i, pf);
        zk512_cast_block(dst, ddt, src, sdt, i, 0, 1, nt, hw);
    }
    for (; i + 16 <= n; i += 16) {
        zk512_cast_block(dst, ddt, src, sdt, i, 0, 1, nt, hw);
    }
    return i;
}

/* Every (dtype pair, stores, conversion) gets its own loop, constants folded in. */
static size_t zk512_cast_main(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t i,
                              size_t n, unsigned pf, int nt, int hw)
{
#define ZK_L(D, S, NT, HW) zk512_cast_loop(dst, D, src, S, i, n, pf, NT, HW)
#define ZK_BY_PAIR(NT)                                                                             \
    (ddt == ZS_DTYPE_F32   ? (sdt == ZS_DTYPE_F16 ? ZK_L(ZS_DTYPE_F32, ZS_DTYPE_F16, NT, 0)        \
                                                  : ZK_L(ZS_DTYPE_F32, ZS_DTYPE_BF16, NT, 0))      \
     : ddt == ZS_DTYPE_F16 ? (sdt == ZS_DTYPE_F32 ? ZK_L(ZS_DTYPE_F16, ZS_DTYPE_F32, NT, 0)        \
                                                  : ZK_L(ZS_DTYPE_F16, ZS_DTYPE_BF16, NT, 0))      \
     : sdt == ZS_DTYPE_F32 ? (hw ? ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F32, NT, 1)                        \
                                 : ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F32, NT, 0))                       \
                           : (hw ? ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F16, NT, 1)                        \
                                 : ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F16, NT, 0)))
    return nt ? ZK_BY_PAIR(1) : ZK_BY_PAIR(0);
#undef ZK_BY_PAIR
#undef ZK_L
}

static void zk512_cast(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n,
                       zk_st_t st)
{
    size_t es = zs_dtype_size(ddt), w = 16 * es;
    size_t i = zk_head(dst, w, es, n);
    int hw = ddt == ZS_DTYPE_BF16 && zk512_bf16_supported(), nt;

    if (i > 0) {
        zk512_cast_block(dst, ddt, src, sdt, 0, zk_mask(i), 0, 0, hw);
    }
    nt = st.nt && zk_aligned((char *)dst + i * es, w);
    i = zk512_cast_main(dst, ddt, src, sdt, i, n, st.pf, nt, hw);
    if (i < n) {
        zk512_cast_block(dst, ddt, src, sdt, i, zk_mask(n - i), 0, 0, hw);
    }
    if (nt) {
        _mm_sfence();
    }
}

/* 256 bytes a turn from a 64-byte aligned d; each source line prefetched `ahead` bytes on
 * (0: none) until the last `ahead` bytes. Returns the bytes copied. */
ZK_ALWAYS_INLINE size_t zk512_copy_loop(char *d, const char *s, size_t n, size_t ahead, int nt)
{
    size_t i = 0, pe = ahead != 0 && n > ahead ? n - ahead : 0;

    for (; i + 256 <= n; i += 256) {
        __m512i x0 = _mm512_loadu_si512((const void *)(s + i + 0));
        __m512i x1 = _mm512_loadu_si512((const void *)(s + i + 64));
        __m512i x2 = _mm512_loadu_si512((const void *)(s + i + 128));
        __m512i x3 = _mm512_loadu_si512((const void *)(s + i + 192));
        if (i < pe) {
            for (size_t l = 0; l < 256; l += 64) {
                __builtin_prefetch(s + i + l + ahead, 0, 3);
            }
        }
        if (nt) {
            _mm512_stream_si512((void *)(d + i + 0), x0);
            _mm512_stream_si512((void *)(d + i + 64), x1);
            _mm512_stream_si512((void *)(d + i + 128), x2);
            _mm512_stream_si512((void *)(d + i + 192), x3);
        } else {
            _mm512_store_si512((void *)(d + i + 0), x0);
            _mm512_store_si512((void *)(d + i + 64), x1);
            _mm512_store_si512((void *)(d + i + 128), x2);
            _mm512_store_si512((void *)(d + i + 192), x3);
        }
    }
    return i;
}

/* Regular stores without a prefetch are the C library's copy (as fast as any loop there);
 * else vector loops from the first 64-byte boundary of dst, streamed where st.nt. */
static void zk512_copy(void *dst, const void *src, size_t bytes, zk_st_t st)
{
    char *d = dst;
    const char *s = src;
    size_t h = (64 - (uintptr_t)d % 64) % 64, i;

    if ((!st.nt && st.pf == 0) || bytes < h + 256) {
        memcpy(dst, src, bytes);
        return;
    }
    memcpy(d, s, h);
    d += h;
    s += h;
    bytes -= h;
    i = st.nt ? zk512_copy_loop(d, s, bytes, (size_t)st.pf * 4, 1)
              : zk512_copy_loop(d, s, bytes, (size_t)st.pf * 4, 0);
    memcpy(d + i, s + i, bytes - i);
    if (st.nt) {
        _mm_sfence();
    }
}

const zk_ops_t zk_ops_avx512 = {
    .adam = zk512_adam,
    .sumsq = zk512_sumsq,
    .accumulate = zk512_accumulate,
    .reduce = zk512_reduce,
    .reduce_sumsq = zk512_reduce_sumsq,
    .cast = zk512_cast,
    .copy = zk512_copy,
    .sumsq_pairs = 1,
};
