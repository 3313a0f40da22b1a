/*
 * zk AVX2 variant (AVX2 + FMA + F16C), 8 lanes. Heads (up to the alignment of the first
 * written stream) and tails run the scalar formula of zk/elem.h; the main loop uses
 * non-temporal stores on every aligned stream when the caller asks for them.
 * Head, body and tail round identically (zk/elem.h, "Rounding recipe"): the body spells
 * every multiply and add separately, and vfmadd exactly where the scalar formula calls fmaf,
 * and maps NaN to ZK_NAN_BITS like zk_nan_canon; the file is compiled with
 * -ffp-contract=off, so the compiler fuses nothing else.
 * Compiled with -mavx2 -mfma -mf16c; called only after zk_variant_supported(ZK_VARIANT_AVX2).
 */
#include "zk_int.h"

#include <immintrin.h>
#include <string.h>

typedef struct zk_k256 {
    __m256 grad_scale, wd_l2, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, inv_sqrt_bc2,
        neg_step_size, neg_lr_wd;
} zk_k256_t;

/* zk_nan_canon on 8 lanes. */
ZK_ALWAYS_INLINE __m256 zk256_canon(__m256 x)
{
    return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)ZK_NAN_BITS)),
                            _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Whether any lane of x or y is NaN: one compare tests two vectors, and the blends of
 * zk256_canon (three uops each on recent Intel cores) run only in the rare vector that has a
 * NaN, behind a branch that is otherwise always predicted. */
ZK_ALWAYS_INLINE int zk256_any_nan(__m256 x, __m256 y)
{
    return __builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(x, y, _CMP_UNORD_Q)) != 0, 0);
}

ZK_ALWAYS_INLINE __m256 zk256_canon1(__m256 x)
{
    return zk256_any_nan(x, x) ? zk256_canon(x) : x;
}

/* fp32 -> bf16 RNE in the high half of each 32-bit lane, for lanes that are not NaN or are
 * ZK_NAN_BITS (a canonical result): the rounding add then cannot carry a NaN into another
 * value, so this is zk_f32_to_bf16 without its NaN test (ZK_NAN_BITS rounds to 0x7fc0, as
 * zk_f32_to_bf16 quiets it). */
ZK_ALWAYS_INLINE __m256i zk256_bf16_rne(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));

    return _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}

/* The high 16 bits of each 32-bit lane of r, in order: a byte shuffle gathers each 128-bit
 * lane's four into its low 8 bytes, a permute joins the two halves. */
ZK_ALWAYS_INLINE __m128i zk256_narrow(__m256i r)
{
    const __m256i pick =
        _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6, 7, 10,
                         11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);

    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, pick), 0x08));
}

/* fp32 -> bf16 RNE, the integer formula of zk_f32_to_bf16 on 8 lanes, NaN inputs included. */
ZK_ALWAYS_INLINE __m128i zk256_bf16_any(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i r = zk256_bf16_rne(x);
    /* |u| > inf bits, as signed compare: both sides are below 2^31 */
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));

    return zk256_narrow(
        _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan));
}

/* fp32 -> bf16 RNE on 8 lanes; `canon`: x holds no NaN but ZK_NAN_BITS (a constant after
 * inlining), else the NaN path is taken only by a vector that has one. */
ZK_ALWAYS_INLINE __m128i zk256_bf16(__m256 x, int canon)
{
    if (!canon && zk256_any_nan(x, x)) {
        return zk256_bf16_any(x);
    }
    return zk256_narrow(zk256_bf16_rne(x));
}

ZK_ALWAYS_INLINE __m256 zk256_ld(const void *p, zs_dtype_t dt, size_t i)
{
    const uint16_t *h = (const uint16_t *)p + i;

    switch (dt) {
    case ZS_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    case ZS_DTYPE_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16));
    default:
        return _mm256_loadu_ps((const float *)p + i);
    }
}

ZK_ALWAYS_INLINE void zk256_st_f32(float *p, __m256 x, int nt)
{
    if (nt) {
        _mm256_stream_ps(p, x);
    } else {
        _mm256_storeu_ps(p, x);
    }
}

/* x to 8 elements of dtype dt at p[i]; `canon`: x is a canonical result (zk256_bf16). */
ZK_ALWAYS_INLINE void zk256_st(void *p, zs_dtype_t dt, size_t i, __m256 x, int nt, int canon)
{
    __m128i *h = (__m128i *)((uint16_t *)p + i);
    __m128i w;

    switch (dt) {
    case ZS_DTYPE_F16:
    case ZS_DTYPE_BF16:
        w = dt == ZS_DTYPE_F16 ? _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
                               : zk256_bf16(x, canon);
        if (nt) {
            _mm_stream_si128(h, w);
        } else {
            _mm_storeu_si128(h, w);
        }
        break;
    default:
        zk256_st_f32((float *)p + i, x, nt);
        break;
    }
}

/* ---- fused step ---- */

static void zk256_adam_scalar(const zk_adam_k_t *k, float *p, float *m, float *v, float *a,
                              void *dst, zs_dtype_t dt, size_t b, size_t e)
{
    for (size_t i = b; i < e; i++) {
        float x = zk_adam_elem(k, a[i], p[i], &m[i], &v[i]);
        p[i] = x;
        if (!k->keep_acc) {
            a[i] = 0.0f;
        }
        if (dst != NULL) {
            zk_store_elem(dst, dt, i, x);
        }
    }
}

ZK_ALWAYS_INLINE void zk256_adam_block(const zk_k256_t *K, float *p, float *m, float *v, float *a,
                                       void *dst, zs_dtype_t dt, size_t i, unsigned ntf, size_t pf)
{
    if (pf != 0) {
        ZK_PREFETCH(p, 4, i, pf);
        ZK_PREFETCH(m, 4, i, pf);
        ZK_PREFETCH(v, 4, i, pf);
        ZK_PREFETCH(a, 4, i, pf);
    }
    __m256 P = _mm256_loadu_ps(p + i);
    __m256 M = _mm256_loadu_ps(m + i);
    __m256 V = _mm256_loadu_ps(v + i);
    __m256 A = _mm256_loadu_ps(a + i);

    ZK_ADAM_LANE(__m256, _mm256_sqrt_ps, _mm256_fmadd_ps, *K, A, P, M, V);
    if (zk256_any_nan(P, M) || zk256_any_nan(V, V)) {
        P = zk256_canon(P);
        M = zk256_canon(M);
        V = zk256_canon(V);
    }
    zk256_st_f32(p + i, P, ntf & ZK_NT_P);
    zk256_st_f32(m + i, M, ntf & ZK_NT_M);
    zk256_st_f32(v + i, V, ntf & ZK_NT_V);
    if (!(ntf & ZK_KEEP_A)) {
        zk256_st_f32(a + i, _mm256_setzero_ps(), ntf & ZK_NT_A);
    }
    if (dst != NULL) {
        zk256_st(dst, dt, i, P, ntf & ZK_NT_DST, 1);
    }
}

/* The full vectors from i on: prefetching up to pe, then plain; returns where it stopped. */
ZK_ALWAYS_INLINE size_t zk256_adam_loop(const zk_k256_t *K, float *p, float *m, float *v, float *a,
                                        void *dst, zs_dtype_t dt, size_t i, size_t n, size_t pe,
                                        unsigned ntf, unsigned pf)
{
    for (; i + 8 <= pe; i += 8) {
        zk256_adam_block(K, p, m, v, a, dst, dt, i, ntf, pf);
    }
    for (; i + 8 <= n; i += 8) {
        zk256_adam_block(K, p, m, v, a, dst, dt, i, ntf, 0);
    }
    return i;
}

/* The common cases (regular stores, with or without the accumulator kept) each get a loop
 * with every flag a constant, so that no element pays a branch; other store mixes share one. */
static size_t zk256_adam_main(const zk_k256_t *K, float *p, float *m, float *v, float *a, void *dst,
                              zs_dtype_t dt, size_t i, size_t n, unsigned ntf, unsigned pf)
{
    size_t pe = zk_pf_end(i, n, pf);

#define ZK_L(D, DT, NTF) zk256_adam_loop(K, p, m, v, a, D, DT, i, n, pe, NTF, pf)
#define ZK_BY_DST(NTF)                                                                             \
    (dst == NULL          ? ZK_L(NULL, ZS_DTYPE_F32, NTF)                                          \
     : dt == ZS_DTYPE_F32 ? ZK_L(dst, ZS_DTYPE_F32, NTF)                                           \
     : dt == ZS_DTYPE_F16 ? ZK_L(dst, ZS_DTYPE_F16, NTF)                                           \
                          : ZK_L(dst, ZS_DTYPE_BF16, NTF))
    if (ntf == ZK_KEEP_A) {
        return ZK_BY_DST(ZK_KEEP_A);
    }
    if (ntf == 0) {
        return ZK_BY_DST(0);
    }
    return ZK_L(dst, dt, ntf);
#undef ZK_BY_DST
#undef ZK_L
}

static void zk256_adam(const zk_adam_k_t *k, float *p, float *m, float *v, float *a, void *dst,
                       zs_dtype_t dt, size_t n, zk_st_t st)
{
    zk_k256_t K = {
        .grad_scale = _mm256_set1_ps(k->grad_scale),
        .wd_l2 = _mm256_set1_ps(k->wd_l2),
        .beta1 = _mm256_set1_ps(k->beta1),
        .one_minus_beta1 = _mm256_set1_ps(k->one_minus_beta1),
        .beta2 = _mm256_set1_ps(k->beta2),
        .one_minus_beta2 = _mm256_set1_ps(k->one_minus_beta2),
        .eps = _mm256_set1_ps(k->eps),
        .inv_sqrt_bc2 = _mm256_set1_ps(k->inv_sqrt_bc2),
        .neg_step_size = _mm256_set1_ps(k->neg_step_size),
        .neg_lr_wd = _mm256_set1_ps(k->neg_lr_wd),
    };
    size_t dsize = dst != NULL ? zs_dtype_size(dt) : 0;
    size_t i = zk_head(p, 32, 4, n);
    unsigned ntf = k->keep_acc ? ZK_KEEP_A : 0;

    zk256_adam_scalar(k, p, m, v, a, dst, dt, 0, i);
    if (st.nt) {
        ntf |= zk_aligned(p + i, 32) ? ZK_NT_P : 0;
        ntf |= zk_aligned(m + i, 32) ? ZK_NT_M : 0;
        ntf |= zk_aligned(v + i, 32) ? ZK_NT_V : 0;
        ntf |= zk_aligned(a + i, 32) ? ZK_NT_A : 0;
        ntf |= dst != NULL && zk_aligned((char *)dst + i * dsize, 8 * dsize) ? ZK_NT_DST : 0;
    }
    i = zk256_adam_main(&K, p, m, v, a, dst, dt, i, n, ntf, st.pf);
    zk256_adam_scalar(k, p, m, v, a, dst, dt, i, n);
    if (ntf & ~ZK_KEEP_A) {
        _mm_sfence();
    }
}

/* ---- sum of squares: zk_sumsq's order (zk/kernels.h), lanes 0-3, 4-7, 8-11, 12-15 ---- */

/* Squares of x[0..4) added to a (lanes of 4). A square of an fp32 value is exact in double,
 * so the fused multiply-add rounds once, at the add, exactly as a multiply and then an add. */
ZK_ALWAYS_INLINE __m256d zk256_sq_add(__m256d a, const float *x)
{
    __m256d d = _mm256_cvtps_pd(_mm_loadu_ps(x));

    return _mm256_fmadd_pd(d, d, a);
}

/* The lanes a[0..3] of a super-block with its scalar tail x[i..len) added, through the tree. */
ZK_ALWAYS_INLINE double zk256_sumsq_finish(const __m256d *a, const float *x, size_t i, size_t len)
{
    double lane[ZK_SUMSQ_LANES];

    for (int k = 0; k < 4; k++) {
        _mm256_storeu_pd(lane + 4 * k, a[k]);
    }
    zk_sumsq_lanes_add(lane, x, i, len);
    return zk_sumsq_lanes_tree(lane);
}

ZK_ALWAYS_INLINE void zk256_sq_add16(__m256d *a, const float *x)
{
    a[0] = zk256_sq_add(a[0], x);
    a[1] = zk256_sq_add(a[1], x + 4);
    a[2] = zk256_sq_add(a[2], x + 8);
    a[3] = zk256_sq_add(a[3], x + 12);
}

static void zk256_sumsq(const float *x, size_t n, double *part, zk_st_t st)
{
    for (size_t b = 0; b < n; b += ZK_SUMSQ_BLOCK) {
        const float *xb = x + b;
        size_t len = n - b < ZK_SUMSQ_BLOCK ? n - b : ZK_SUMSQ_BLOCK;
        size_t pe = zk_pf_end(0, n - b, st.pf), i = 0;
        __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                        _mm256_setzero_pd()};

        for (; i + ZK_SUMSQ_LANES <= len && i + ZK_SUMSQ_LANES <= pe; i += ZK_SUMSQ_LANES) {
            ZK_PREFETCH(xb, 4, i, st.pf);
            zk256_sq_add16(a, xb + i);
        }
        for (; i + ZK_SUMSQ_LANES <= len; i += ZK_SUMSQ_LANES) {
            zk256_sq_add16(a, xb + i);
        }
        part[b / ZK_SUMSQ_BLOCK] = zk256_sumsq_finish(a, xb, i, len);
    }
}

/* ---- reduce of fp32 with the squares of its results: zk_reduce_sumsq_parts ---- */

/* x (8 results, lanes `l` to l + 7) squared into a[l / 4] and a[l / 4 + 1]. */
ZK_ALWAYS_INLINE void zk256_sq_add_reg(__m256d *a, __m256 x)
{
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));

    a[0] = _mm256_fmadd_pd(lo, lo, a[0]);
    a[1] = _mm256_fmadd_pd(hi, hi, a[1]);
}

ZK_ALWAYS_INLINE void zk256_redsq_block(float *d, const float *x, const float *y, size_t i,
                                        __m256d *a, int nt)
{
    __m256 s0 = zk256_canon1(_mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    __m256 s1 = zk256_canon1(_mm256_add_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8)));

    zk256_st_f32(d + i, s0, nt);
    zk256_st_f32(d + i + 8, s1, nt);
    zk256_sq_add_reg(a, s0);
    zk256_sq_add_reg(a + 2, s1);
}

/* A super-block at a time from dst (a super-block start); the tail of the last one in scalar,
 * its squares read back from dst by zk256_sumsq_finish. */
ZK_ALWAYS_INLINE void zk256_redsq_loop(float *dst, const float *a, const float *b, size_t n,
                                       double *part, unsigned pf, int nt)
{
    size_t pe = zk_pf_end(0, n, pf);

    for (size_t o = 0; o < n; o += ZK_SUMSQ_BLOCK) {
        size_t len = n - o < ZK_SUMSQ_BLOCK ? n - o : ZK_SUMSQ_BLOCK, i = 0;
        float *d = dst + o;
        const float *x = a + o, *y = b + o;
        __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                          _mm256_setzero_pd()};

        for (; i + 16 <= len && o + i + 16 <= pe; i += 16) {
            ZK_PREFETCH(x, 4, i, pf);
            ZK_PREFETCH(y, 4, i, pf);
            zk256_redsq_block(d, x, y, i, acc, nt);
        }
        for (; i + 16 <= len; i += 16) {
            zk256_redsq_block(d, x, y, i, acc, nt);
        }
        for (size_t j = i; j < len; j++) {
            d[j] = zk_reduce_elem(x[j], y[j]);
        }
        part[o / ZK_SUMSQ_BLOCK] = zk256_sumsq_finish(acc, d, i, len);
    }
}

static void zk256_reduce_sumsq(float *dst, const float *a, const float *b, size_t n, double *part,
                               zk_st_t st)
{
    /* a super-block is 64 KiB: an aligned start keeps every block aligned */
    if (st.nt && zk_aligned(dst, 32)) {
        zk256_redsq_loop(dst, a, b, n, part, st.pf, 1);
        _mm_sfence();
    } else {
        zk256_redsq_loop(dst, a, b, n, part, st.pf, 0);
    }
}

/* ---- accumulate ---- */

ZK_ALWAYS_INLINE void zk256_acc_block(float *acc, const void *src, zs_dtype_t dt, __m256 S,
                                      size_t i, int nt)
{
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(zk256_ld(src, dt, i), S));

    zk256_st_f32(acc + i, zk256_canon1(x), nt);
}

/* Two vectors at once: one compare and one branch test both for NaN. */
ZK_ALWAYS_INLINE void zk256_acc_pair(float *acc, const void *src, zs_dtype_t dt, __m256 S, size_t i,
                                     int nt)
{
    __m256 x = _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(zk256_ld(src, dt, i), S));
    __m256 y =
        _mm256_add_ps(_mm256_loadu_ps(acc + i + 8), _mm256_mul_ps(zk256_ld(src, dt, i + 8), S));

    if (zk256_any_nan(x, y)) {
        x = zk256_canon(x);
        y = zk256_canon(y);
    }
    zk256_st_f32(acc + i, x, nt);
    zk256_st_f32(acc + i + 8, y, nt);
}

ZK_ALWAYS_INLINE size_t zk256_acc_loop(float *acc, const void *src, zs_dtype_t dt, __m256 S,
                                       size_t i, size_t n, unsigned pf, int nt)
{
    size_t es = zs_dtype_size(dt), pe = zk_pf_end(i, n, pf);

    for (; i + 16 <= pe; i += 16) {
        ZK_PREFETCH(acc, 4, i, pf);
        ZK_PREFETCH(src, es, i, pf);
        zk256_acc_pair(acc, src, dt, S, i, nt);
    }
    for (; i + 16 <= n; i += 16) {
        zk256_acc_pair(acc, src, dt, S, i, nt);
    }
    for (; i + 8 <= n; i += 8) {
        zk256_acc_block(acc, src, dt, S, i, nt);
    }
    return i;
}

/* Every (dtype, stores) gets its own loop, constants folded in. */
static size_t zk256_acc_main(float *acc, const void *src, zs_dtype_t dt, __m256 S, size_t i,
                             size_t n, unsigned pf, int nt)
{
#define ZK_L(DT, NT) zk256_acc_loop(acc, src, DT, S, i, n, pf, NT)
    return nt ? ZK_BY_DTYPE(dt, ZK_L, 1) : ZK_BY_DTYPE(dt, ZK_L, 0);
#undef ZK_L
}

static void zk256_accumulate(float *acc, const void *src, zs_dtype_t dt, float s, size_t n,
                             zk_st_t st)
{
    size_t i = zk_head(acc, 32, 4, n);
    int nt;

    for (size_t j = 0; j < i; j++) {
        acc[j] = zk_accumulate_elem(acc[j], zk_load_elem(src, dt, j), s);
    }
    nt = st.nt && zk_aligned(acc + i, 32);
    i = zk256_acc_main(acc, src, dt, _mm256_set1_ps(s), i, n, st.pf, nt);
    for (; i < n; i++) {
        acc[i] = zk_accumulate_elem(acc[i], zk_load_elem(src, dt, i), s);
    }
    if (nt) {
        _mm_sfence();
    }
}

/* ---- reduce and cast ---- */

ZK_ALWAYS_INLINE void zk256_red_block(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                      size_t i, int nt)
{
    zk256_st(dst, dt, i, zk256_canon1(_mm256_add_ps(zk256_ld(a, dt, i), zk256_ld(b, dt, i))), nt,
             1);
}

/* Two vectors at once: one NaN test for both (zk256_any_nan) and one prefetch of each stream
 * per 16 elements, without ZK_PREFETCH's test of the line. */
ZK_ALWAYS_INLINE void zk256_red_block2(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                       size_t i, int nt)
{
    __m256 x = _mm256_add_ps(zk256_ld(a, dt, i), zk256_ld(b, dt, i));
    __m256 y = _mm256_add_ps(zk256_ld(a, dt, i + 8), zk256_ld(b, dt, i + 8));

    if (zk256_any_nan(x, y)) {
        x = zk256_canon(x);
        y = zk256_canon(y);
    }
    zk256_st(dst, dt, i, x, nt, 1);
    zk256_st(dst, dt, i + 8, y, nt, 1);
}

ZK_ALWAYS_INLINE size_t zk256_red_loop(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                       size_t i, size_t n, unsigned pf, int nt)
{
    size_t es = zs_dtype_size(dt), pe = zk_pf_end(i, n, pf);

    for (; i + 16 <= pe; i += 16) {
        __builtin_prefetch((const char *)a + (i + pf) * es, 0, 3);
        __builtin_prefetch((const char *)b + (i + pf) * es, 0, 3);
        zk256_red_block2(dst, a, b, dt, i, nt);
    }
    for (; i + 16 <= n; i += 16) {
        zk256_red_block2(dst, a, b, dt, i, nt);
    }
    for (; i + 8 <= n; i += 8) {
        zk256_red_block(dst, a, b, dt, i, nt);
    }
    return i;
}

/* Every (dtype, stores) gets its own loop, constants folded in. */
static size_t zk256_red_main(void *dst, const void *a, const void *b, zs_dtype_t dt, size_t i,
                             size_t n, unsigned pf, int nt)
{
#define ZK_L(DT, NT) zk256_red_loop(dst, a, b, DT, i, n, pf, NT)
    return nt ? ZK_BY_DTYPE(dt, ZK_L, 1) : ZK_BY_DTYPE(dt, ZK_L, 0);
#undef ZK_L
}

static void zk256_reduce(void *dst, const void *a, const void *b, zs_dtype_t dt, size_t n,
                         zk_st_t st)
{
    size_t es = zs_dtype_size(dt);
    size_t i = zk_head(dst, 8 * es, es, n);
    int nt;

    for (size_t j = 0; j < i; j++) {
        zk_store_elem(dst, dt, j, zk_reduce_elem(zk_load_elem(a, dt, j), zk_load_elem(b, dt, j)));
    }
    nt = st.nt && zk_aligned((char *)dst + i * es, 8 * es);
    i = zk256_red_main(dst, a, b, dt, i, n, st.pf, nt);
    for (; i < n; i++) {
        zk_store_elem(dst, dt, i, zk_reduce_elem(zk_load_elem(a, dt, i), zk_load_elem(b, dt, i)));
    }
    if (nt) {
        _mm_sfence();
    }
}

/* 16 fp32 elements to bf16 with one 256-bit store: the two halves' rounded high words are
 * packed by one VPACKUSDW and put in order by one permute, half the shuffles and stores of two
 * zk256_st (the shuffle port bounds this cast in cache). Same bits as zk256_bf16. */
ZK_ALWAYS_INLINE void zk256_bf16x16(void *dst, size_t i, __m256 x0, __m256 x1, int nt)
{
    __m256i *h = (__m256i *)((uint16_t *)dst + i);
    __m256i w;

    if (zk256_any_nan(x0, x1)) {
        w = _mm256_set_m128i(zk256_bf16_any(x1), zk256_bf16_any(x0));
    } else {
        /* the rounded high words are below 2^16: the signed saturation never acts */
        w = _mm256_packus_epi32(_mm256_srli_epi32(zk256_bf16_rne(x0), 16),
                                _mm256_srli_epi32(zk256_bf16_rne(x1), 16));
        w = _mm256_permute4x64_epi64(w, 0xd8);
    }
    if (nt) {
        _mm256_stream_si256(h, w);
    } else {
        _mm256_storeu_si256(h, w);
    }
}

ZK_ALWAYS_INLINE size_t zk256_cast_loop(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                                        size_t i, size_t n, unsigned pf, int nt)
{
    size_t ses = zs_dtype_size(sdt), pe = zk_pf_end(i, n, pf);

    if (ddt == ZS_DTYPE_BF16 && sdt == ZS_DTYPE_F32) {
        const float *s = src;

        for (; i + 16 <= pe; i += 16) {
            ZK_PREFETCH(src, ses, i, pf);
            ZK_PREFETCH(src, ses, i + 8, pf);
            zk256_bf16x16(dst, i, _mm256_loadu_ps(s + i), _mm256_loadu_ps(s + i + 8), nt);
        }
        for (; i + 16 <= n; i += 16) {
            zk256_bf16x16(dst, i, _mm256_loadu_ps(s + i), _mm256_loadu_ps(s + i + 8), nt);
        }
        /* at most 8 left for the 8-wide loop: its 128-bit stores are aligned too */
    }
    for (; i + 8 <= pe; i += 8) {
        ZK_PREFETCH(src, ses, i, pf);
        zk256_st(dst, ddt, i, zk256_ld(src, sdt, i), nt, 0);
    }
    for (; i + 8 <= n; i += 8) {
        zk256_st(dst, ddt, i, zk256_ld(src, sdt, i), nt, 0);
    }
    return i;
}

/* Every (dtype pair, stores) gets its own loop, constants folded in. */
static size_t zk256_cast_main(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t i,
                              size_t n, unsigned pf, int nt)
{
#define ZK_L(D, S, NT) zk256_cast_loop(dst, D, src, S, i, n, pf, NT)
#define ZK_BY_PAIR(NT)                                                                             \
    (ddt == ZS_DTYPE_F32   ? (sdt == ZS_DTYPE_F16 ? ZK_L(ZS_DTYPE_F32, ZS_DTYPE_F16, NT)           \
                                                  : ZK_L(ZS_DTYPE_F32, ZS_DTYPE_BF16, NT))         \
     : ddt == ZS_DTYPE_F16 ? (sdt == ZS_DTYPE_F32 ? ZK_L(ZS_DTYPE_F16, ZS_DTYPE_F32, NT)           \
                                                  : ZK_L(ZS_DTYPE_F16, ZS_DTYPE_BF16, NT))         \
     : sdt == ZS_DTYPE_F32 ? ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F32, NT)                                 \
                           : ZK_L(ZS_DTYPE_BF16, ZS_DTYPE_F16, NT))
    return nt ? ZK_BY_PAIR(1) : ZK_BY_PAIR(0);
#undef ZK_BY_PAIR
#undef ZK_L
}

static void zk256_cast(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n,
                       zk_st_t st)
{
    size_t es = zs_dtype_size(ddt);
    /* the bytes of one store: fp32 to bf16 stores 16 elements at a time (zk256_bf16x16) */
    size_t vb = (ddt == ZS_DTYPE_BF16 && sdt == ZS_DTYPE_F32 ? 16 : 8) * es;
    size_t i = zk_head(dst, vb, es, n);
    int nt;

    for (size_t j = 0; j < i; j++) {
        zk_store_elem(dst, ddt, j, zk_load_elem(src, sdt, j));
    }
    nt = st.nt && zk_aligned((char *)dst + i * es, vb);
    i = zk256_cast_main(dst, ddt, src, sdt, i, n, st.pf, nt);
    for (; i < n; i++) {
        zk_store_elem(dst, ddt, i, zk_load_elem(src, sdt, i));
    }
    if (nt) {
        _mm_sfence();
    }
}

/* 256 bytes a turn from a 64-byte aligned d; each source line prefetched `ahead` bytes on
 * (0: none) until the last `ahead` bytes. Returns the bytes copied. */
ZK_ALWAYS_INLINE size_t zk256_copy_loop(char *d, const char *s, size_t n, size_t ahead, int nt)
{
    size_t i = 0, pe = ahead != 0 && n > ahead ? n - ahead : 0;

    for (; i + 256 <= n; i += 256) {
        __m256i x0 = _mm256_loadu_si256((const void *)(s + i + 0));
        __m256i x1 = _mm256_loadu_si256((const void *)(s + i + 32));
        __m256i x2 = _mm256_loadu_si256((const void *)(s + i + 64));
        __m256i x3 = _mm256_loadu_si256((const void *)(s + i + 96));
        __m256i x4 = _mm256_loadu_si256((const void *)(s + i + 128));
        __m256i x5 = _mm256_loadu_si256((const void *)(s + i + 160));
        __m256i x6 = _mm256_loadu_si256((const void *)(s + i + 192));
        __m256i x7 = _mm256_loadu_si256((const void *)(s + i + 224));
        if (i < pe) {
            for (size_t l = 0; l < 256; l += 64) {
                __builtin_prefetch(s + i + l + ahead, 0, 3);
            }
        }
        if (nt) {
            _mm256_stream_si256((void *)(d + i + 0), x0);
            _mm256_stream_si256((void *)(d + i + 32), x1);
            _mm256_stream_si256((void *)(d + i + 64), x2);
            _mm256_stream_si256((void *)(d + i + 96), x3);
            _mm256_stream_si256((void *)(d + i + 128), x4);
            _mm256_stream_si256((void *)(d + i + 160), x5);
            _mm256_stream_si256((void *)(d + i + 192), x6);
            _mm256_stream_si256((void *)(d + i + 224), x7);
        } else {
            _mm256_store_si256((void *)(d + i + 0), x0);
            _mm256_store_si256((void *)(d + i + 32), x1);
            _mm256_store_si256((void *)(d + i + 64), x2);
            _mm256_store_si256((void *)(d + i + 96), x3);
            _mm256_store_si256((void *)(d + i + 128), x4);
            _mm256_store_si256((void *)(d + i + 160), x5);
            _mm256_store_si256((void *)(d + i + 192), x6);
            _mm256_store_si256((void *)(d + i + 224), x7);
        }
    }
    return i;
}

/* Regular stores without a prefetch are the C library's copy (as fast as any loop there);
 * else vector loops from the first 64-byte boundary of dst, streamed where st.nt. */
static void zk256_copy(void *dst, const void *src, size_t bytes, zk_st_t st)
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
    i = st.nt ? zk256_copy_loop(d, s, bytes, (size_t)st.pf * 4, 1)
              : zk256_copy_loop(d, s, bytes, (size_t)st.pf * 4, 0);
    memcpy(d + i, s + i, bytes - i);
    if (st.nt) {
        _mm_sfence();
    }
}

const zk_ops_t zk_ops_avx2 = {
    .adam = zk256_adam,
    .sumsq = zk256_sumsq,
    .accumulate = zk256_accumulate,
    .reduce = zk256_reduce,
    .reduce_sumsq = zk256_reduce_sumsq,
    .cast = zk256_cast,
    .copy = zk256_copy,
};
