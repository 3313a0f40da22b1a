/* zk_bench memory limit, 512-bit vectors (compiled with -mavx512f -mavx512bw -mavx512vl). */
#include "limit.h"
#include "zk/elem.h"

#include <immintrin.h>

#define VL         16
#define V4         __m512i
#define V2         __m256i
#define LD4(p)     _mm512_loadu_si512((const void *)(p))
#define LD2(p)     _mm256_loadu_si256((const __m256i *)(p))
#define ST4(p, x)  _mm512_storeu_si512((void *)(p), x)
#define ST2(p, x)  _mm256_storeu_si256((__m256i *)(p), x)
#define NT4(p, x)  _mm512_stream_si512((void *)(p), x)
#define NT2(p, x)  _mm256_stream_si256((__m256i *)(p), x)
#define OR4(x, y)  _mm512_or_si512(x, y)
#define AND4(x, y) _mm512_and_si512(x, y)
#define SET4(x)    _mm512_set1_epi32((int)(x))
#define FIRST4(x)  (unsigned)_mm_cvtsi128_si32(_mm512_castsi512_si128(x))
#define NARROW(x)  _mm512_cvtepi32_epi16(x)
#define WIDEN(x)   _mm512_cvtepu16_epi32(x)
#define FN         zb_limit_avx512
#define VF         __m512
#define SETF(x)    _mm512_set1_ps(x)
#define SQRTF(x)   _mm512_sqrt_ps(x)
#define LDF(p)     _mm512_load_ps(p)
#define STF(p, x)  _mm512_store_ps(p, x)
#define CANONF(x)                                                                                  \
    _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),                                  \
                       _mm512_castsi512_ps(_mm512_set1_epi32((int)ZK_NAN_BITS)))
/* whether a lane of x or y is NaN (the kernels' test before they make NaN canonical) */
#define ANYNANF(x, y) (_mm512_cmp_ps_mask(x, y, _CMP_UNORD_Q) != 0)
#define FN_FORMULA    zb_formula_avx512
#define VD            __m512d
#define SETD(x)       _mm512_set1_pd(x)
#define FMAD(x, a)    _mm512_fmadd_pd(x, x, a)
#define FIRSTD(x)     _mm512_cvtsd_f64(x)
#define FN_CHAIN      zb_chain_avx512

#include "limit_body.h"
