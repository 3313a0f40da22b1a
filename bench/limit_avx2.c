/* zk_bench memory limit, 256-bit vectors (compiled with -mavx2 -mfma -mf16c). */
#include "limit.h"
#include "zk/elem.h"

#include <immintrin.h>

/* 8 x 32-bit -> 8 x 16-bit (values of the limit kernel are arbitrary bits: truncate) */
static inline __m128i zb_narrow(__m256i x)
{
    __m256i s = _mm256_shuffle_epi8(x, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1,
                                                        -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13,
                                                        -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(s, 0x08));
}

/* fp32 -> bf16 RNE of a canonical result (no NaN but ZK_NAN_BITS, which rounds to 0x7fc0) in
 * the high half of each lane: the AVX2 kernel's conversion (kernels/src/k_avx2.c, zk256_bf16). */
static inline __m256i zb_bf16_rne(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));

    return _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
}

static inline __m128i zb_bf16(__m256 x)
{
    __m256i s = _mm256_shuffle_epi8(zb_bf16_rne(x),
                                    _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1,
                                                     -1, -1, -1, 2, 3, 6, 7, 10, 11, 14, 15, -1, -1,
                                                     -1, -1, -1, -1, -1, -1));
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(s, 0x08));
}

/* 16 fp32 -> bf16 RNE in one vector: the two halves' rounded high words packed and put in
 * order, as the AVX2 kernel's cast does (kernels/src/k_avx2.c, zk256_bf16x16) */
static inline __m256i zb_bf16x2(__m256 x0, __m256 x1)
{
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(zb_bf16_rne(x0), 16),
                                                        _mm256_srli_epi32(zb_bf16_rne(x1), 16)),
                                    0xd8);
}

#define VL            8
#define V4            __m256i
#define V2            __m128i
#define LD4(p)        _mm256_loadu_si256((const __m256i *)(p))
#define LD2(p)        _mm_loadu_si128((const __m128i *)(p))
#define ST4(p, x)     _mm256_storeu_si256((__m256i *)(p), x)
#define ST2(p, x)     _mm_storeu_si128((__m128i *)(p), x)
#define NT4(p, x)     _mm256_stream_si256((__m256i *)(p), x)
#define NT2(p, x)     _mm_stream_si128((__m128i *)(p), x)
#define OR4(x, y)     _mm256_or_si256(x, y)
#define AND4(x, y)    _mm256_and_si256(x, y)
#define SET4(x)       _mm256_set1_epi32((int)(x))
#define FIRST4(x)     (unsigned)_mm_cvtsi128_si32(_mm256_castsi256_si128(x))
#define NARROW(x)     zb_narrow(x)
#define WIDEN(x)      _mm256_cvtepu16_epi32(x)
#define FN            zb_limit_avx2
#define VF            __m256
#define SETF(x)       _mm256_set1_ps(x)
#define SQRTF(x)      _mm256_sqrt_ps(x)
#define FMAF(a, b, c) _mm256_fmadd_ps(a, b, c)
#define LDF(p)        _mm256_load_ps(p)
#define STF(p, x)     _mm256_store_ps(p, x)
#define CANONF(x)                                                                                  \
    _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)ZK_NAN_BITS)),                  \
                     _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
/* whether a lane of x or y is NaN (the kernels' test before they make NaN canonical) */
#define ANYNANF(x, y)        (_mm256_movemask_ps(_mm256_cmp_ps(x, y, _CMP_UNORD_Q)) != 0)
#define BF16F(x)             zb_bf16(x)
#define BF16HWF(x)           zb_bf16(x)
#define BF16_HW              0
#define F16F(x)              _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
#define FN_FORMULA           zb_formula_avx2
#define VD                   __m256d
#define SETD(x)              _mm256_set1_pd(x)
#define FMAD(x, a)           _mm256_fmadd_pd(x, x, a)
#define FIRSTD(x)            _mm256_cvtsd_f64(x)
#define FN_CHAIN             zb_chain_avx2
#define FN_ROUND             zb_round_avx2
#define ST_BF16X2(p, x0, x1) ST4(p, zb_bf16x2(x0, x1))

#include "limit_body.h"
