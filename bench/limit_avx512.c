/* zk_bench memory limit, 512-bit vectors (compiled with the flags of kernels/src/k_avx512.c). */
#include "limit.h"
#include "zk/elem.h"

#include <immintrin.h>

/* fp32 -> bf16 RNE of a canonical result (no NaN but ZK_NAN_BITS), exact: VCVTNEPS2BF16 where
 * the CPU has it, with the AVX-512 kernel's test for subnormal inputs, which it flushes
 * (kernels/src/k_avx512.c, zk512_bf16); else the integer formula. */
static inline __m256i zb_bf16_int(__m512 x)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));

    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16));
}

#if defined(ZB_HAVE_AVX512BF16)
static int zb_hw_bf16(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}

static inline __m256i zb_bf16_hw(__m512 x)
{
    if (__builtin_expect(_mm512_fpclass_ps_mask(x, 0x20) == 0, 1)) {
        return (__m256i)_mm512_cvtneps_pbh(x);
    }
    return zb_bf16_int(x);
}
#else
#define zb_hw_bf16()  0
#define zb_bf16_hw(x) zb_bf16_int(x)
#endif

#define VL            16
#define V4            __m512i
#define V2            __m256i
#define LD4(p)        _mm512_loadu_si512((const void *)(p))
#define LD2(p)        _mm256_loadu_si256((const __m256i *)(p))
#define ST4(p, x)     _mm512_storeu_si512((void *)(p), x)
#define ST2(p, x)     _mm256_storeu_si256((__m256i *)(p), x)
#define NT4(p, x)     _mm512_stream_si512((void *)(p), x)
#define NT2(p, x)     _mm256_stream_si256((__m256i *)(p), x)
#define OR4(x, y)     _mm512_or_si512(x, y)
#define AND4(x, y)    _mm512_and_si512(x, y)
#define SET4(x)       _mm512_set1_epi32((int)(x))
#define FIRST4(x)     (unsigned)_mm_cvtsi128_si32(_mm512_castsi512_si128(x))
#define NARROW(x)     _mm512_cvtepi32_epi16(x)
#define WIDEN(x)      _mm512_cvtepu16_epi32(x)
#define FN            zb_limit_avx512
#define VF            __m512
#define SETF(x)       _mm512_set1_ps(x)
#define SQRTF(x)      _mm512_sqrt_ps(x)
#define FMAF(a, b, c) _mm512_fmadd_ps(a, b, c)
#define LDF(p)        _mm512_load_ps(p)
#define STF(p, x)     _mm512_store_ps(p, x)
#define CANONF(x)                                                                                  \
    _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),                                  \
                       _mm512_castsi512_ps(_mm512_set1_epi32((int)ZK_NAN_BITS)))
/* whether a lane of x or y is NaN (the kernels' test before they make NaN canonical) */
#define ANYNANF(x, y) (_mm512_cmp_ps_mask(x, y, _CMP_UNORD_Q) != 0)
#define BF16F(x)      zb_bf16_int(x)
#define BF16HWF(x)    zb_bf16_hw(x)
#define BF16_HW       zb_hw_bf16()
#define F16F(x)       _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)
#define FN_FORMULA    zb_formula_avx512
#define VD            __m512d
#define SETD(x)       _mm512_set1_pd(x)
#define FMAD(x, a)    _mm512_fmadd_pd(x, x, a)
#define FIRSTD(x)     _mm512_cvtsd_f64(x)
#define FN_CHAIN      zb_chain_avx512
#define FN_ROUND      zb_round_avx512
#define ST_BF16X2(p, x0, x1)                                                                       \
    do {                                                                                           \
        ST2(p, BF16F(x0));                                                                         \
        ST2((p) + VL, BF16F(x1));                                                                  \
    } while (0)

#include "limit_body.h"
