/* zk module-internal: the per-variant operation tables and the error helper. */
#ifndef ZK_INT_H
#define ZK_INT_H

#include "zk/elem.h"
#include "zk/kernels.h"

#include <stddef.h>
#include <stdint.h>

/* One element of a `dt` array as a float, and back (RNE): the scalar path of every variant,
 * including the heads and tails of the SIMD loops. */
static inline float zk_load_elem(const void *p, zs_dtype_t dt, size_t i)
{
    switch (dt) {
    case ZS_DTYPE_F16:
        return zk_f16_to_f32(((const uint16_t *)p)[i]);
    case ZS_DTYPE_BF16:
        return zk_bf16_to_f32(((const uint16_t *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

static inline void zk_store_elem(void *p, zs_dtype_t dt, size_t i, float x)
{
    switch (dt) {
    case ZS_DTYPE_F16:
        ((uint16_t *)p)[i] = zk_f32_to_f16(x);
        break;
    case ZS_DTYPE_BF16:
        ((uint16_t *)p)[i] = zk_f32_to_bf16(x);
        break;
    default:
        ((float *)p)[i] = x;
        break;
    }
}

/* Elements of size `esize` before p reaches an `align`-byte boundary (at most n; 0 when p is
 * not even element-aligned, so that the SIMD loop takes unaligned loads from the start). */
static inline size_t zk_head(const void *p, size_t align, size_t esize, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    size_t h;

    if (a % esize != 0) {
        return 0;
    }
    h = ((align - a % align) % align) / esize;
    return h < n ? h : n;
}

static inline int zk_aligned(const void *p, size_t align)
{
    return ((uintptr_t)p % align) == 0;
}

/* Squares of x[b..e) added to the lanes of zk_sumsq's order (lane = index mod 16, relative to
 * the super-block start x): the scalar path of every variant, and the tails of the SIMD ones. */
static inline void zk_sumsq_lanes_add(double lane[ZK_SUMSQ_LANES], const float *x, size_t b,
                                      size_t e)
{
    for (size_t i = b; i < e; i++) {
        double d = x[i];
        lane[i % ZK_SUMSQ_LANES] += d * d;
    }
}

/* The fixed tree that combines the 16 lanes of one super-block (zk/kernels.h). */
static inline double zk_sumsq_lanes_tree(const double lane[ZK_SUMSQ_LANES])
{
    double a[8], b[4];

    for (int i = 0; i < 8; i++) {
        a[i] = lane[i] + lane[i + 8];
    }
    for (int i = 0; i < 4; i++) {
        b[i] = a[i] + a[i + 4];
    }
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* How one call streams through memory (stores.c decides, per variant and family): `nt` asks
 * for non-temporal stores where the pointers allow it, `pf` for a software prefetch of each
 * read stream pf elements ahead (0: none). Both are for calls beyond the caches; neither
 * changes a result. */
typedef struct zk_st {
    int nt; /* the sum of squares, which stores nothing: one super-block at a time, not two */
    unsigned pf;
} zk_st_t;

/* Each operation runs on one contiguous range on the calling thread. */
typedef struct zk_ops {
    void (*adam)(const zk_adam_k_t *k, float *master, float *m, float *v, float *acc, void *dst,
                 zs_dtype_t dst_dtype, size_t n, zk_st_t st);
    /* zk_sumsq's super-block sums (zk/kernels.h) of x[0..n), x at a super-block start:
     * part[b] for each of the ceil(n / ZK_SUMSQ_BLOCK) super-blocks (st.nt: one super-block
     * at a time, where the variant reads two otherwise: sumsq_pairs) */
    void (*sumsq)(const float *x, size_t n, double *part, zk_st_t st);
    void (*accumulate)(float *acc, const void *src, zs_dtype_t src_dtype, float s, size_t n,
                       zk_st_t st);
    void (*reduce)(void *dst, const void *a, const void *b, zs_dtype_t dtype, size_t n, zk_st_t st);
    /* reduce of fp32 and sumsq of its result in one pass, dst at a super-block start: the
     * bits of the two (zk_reduce_sumsq_parts) */
    void (*reduce_sumsq)(float *dst, const float *a, const float *b, size_t n, double *part,
                         zk_st_t st);
    /* dst_dtype != src_dtype (same-type copies are `copy`) */
    void (*cast)(void *dst, zs_dtype_t dst_dtype, const void *src, zs_dtype_t src_dtype, size_t n,
                 zk_st_t st);
    /* `bytes` bytes from src to dst (not overlapping); st.pf counts 4-byte elements */
    void (*copy)(void *dst, const void *src, size_t bytes, zk_st_t st);
    int sumsq_pairs; /* sumsq reads two super-blocks at once unless st.nt: the plan chooses */
} zk_ops_t;

/* How a call of family `fam` touching `footprint` bytes streams (stores.c): exec->stores,
 * else the plan of the call's variant (measuring it if need be). */
zk_st_t zk_store_st(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint);

/* Prefetch element i + ahead of a stream of `es`-byte elements (zk_st_t.pf) into every cache
 * level, once per 64 bytes of the stream (the SIMD loops step by fewer bytes on 16-bit
 * streams, and by 32 bytes in AVX2). */
#define ZK_PREFETCH(ptr, es, i, ahead)                                                             \
    do {                                                                                           \
        if ((((i) * (es)) & 63) == 0) {                                                            \
            __builtin_prefetch((const char *)(ptr) + ((i) + (ahead)) * (es), 0, 3);                \
        }                                                                                          \
    } while (0)

/* ---- shared by the SIMD variants (k_avx2.c, k_avx512.c) ---- */

#define ZK_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Adam's streams with non-temporal stores (a loop's constant flags) */
#define ZK_NT_P   1u
#define ZK_NT_M   2u
#define ZK_NT_V   4u
#define ZK_NT_A   8u
#define ZK_NT_DST 16u
#define ZK_KEEP_A 32u /* not a store kind: leave acc as it is (zk_adam_k_t.keep_acc) */

/* L(DT, NT) with DT the constant of dtype dt: one instance of a loop per dtype, so that no
 * element re-tests it. */
#define ZK_BY_DTYPE(dt, L, NT)                                                                     \
    ((dt) == ZS_DTYPE_F32   ? L(ZS_DTYPE_F32, NT)                                                  \
     : (dt) == ZS_DTYPE_F16 ? L(ZS_DTYPE_F16, NT)                                                  \
                            : L(ZS_DTYPE_BF16, NT))

/* Where a prefetching loop stops: the last pf elements are not prefetched past (nothing
 * beyond the call is fetched). */
static inline size_t zk_pf_end(size_t i, size_t n, unsigned pf)
{
    return pf != 0 && n > pf ? n - pf : i;
}

extern const zk_ops_t zk_ops_scalar;
#if defined(ZK_HAVE_X86_VARIANTS)
extern const zk_ops_t zk_ops_avx2;
extern const zk_ops_t zk_ops_avx512;
#endif

/* Record the message for zk_last_error() and return `status`. */
zs_status_t zk_error_set(zs_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Coefficients of docs/semantics.md §4 step 6 for one call, computed in double. */
zs_status_t zk_adam_k_init(const zk_adam_params_t *params, zk_adam_k_t *k);

/* The ops of variant v (supported: checked by the caller). */
const zk_ops_t *zk_variant_ops(int v);

/* The caches a store plan is sized by (stores.c): the L1 data cache (prefetch distances) and
 * the last-level one (the scratch it times on), from sysconf or sysfs. */
size_t zk_l1d_bytes(void);
size_t zk_llc_bytes(void);

/* `plan` (read from a file: plan_file.c) as the default variant's, unless one is measured or
 * being measured already, or it is another variant's: 1 when taken, 0 when not. */
int zk_store_plan_install(const zk_store_plan_t *plan);

#endif
