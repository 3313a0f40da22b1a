/* zk scalar variant: the portable reference, one element at a time through zk/elem.h. */
#include "zk_int.h"

#include <string.h>

static void zk_scalar_adam(const zk_adam_k_t *k, float *master, float *m, float *v, float *acc,
                           void *dst, zs_dtype_t dt, size_t n, zk_st_t st)
{
    (void)st;
    for (size_t i = 0; i < n; i++) {
        float p = zk_adam_elem(k, acc[i], master[i], &m[i], &v[i]);
        master[i] = p;
        if (!k->keep_acc) {
            acc[i] = 0.0f;
        }
        if (dst != NULL) {
            zk_store_elem(dst, dt, i, p);
        }
    }
}

/* zk_sumsq's order (zk/kernels.h) written out: 16 lanes in an array, one super-block at a time. */
static void zk_scalar_sumsq(const float *x, size_t n, double *part, zk_st_t st)
{
    (void)st;
    for (size_t b = 0; b < n; b += ZK_SUMSQ_BLOCK) {
        const float *xb = x + b;
        size_t len = n - b < ZK_SUMSQ_BLOCK ? n - b : ZK_SUMSQ_BLOCK;
        double lane[ZK_SUMSQ_LANES] = {0};
        size_t i;

        for (i = 0; i + ZK_SUMSQ_LANES <= len; i += ZK_SUMSQ_LANES) {
            for (size_t l = 0; l < ZK_SUMSQ_LANES; l++) {
                double d = xb[i + l];
                lane[l] += d * d;
            }
        }
        zk_sumsq_lanes_add(lane, xb, i, len);
        part[b / ZK_SUMSQ_BLOCK] = zk_sumsq_lanes_tree(lane);
    }
}

/* The reduce of fp32 and zk_sumsq's order of its results, a super-block at a time. */
static void zk_scalar_reduce_sumsq(float *dst, const float *a, const float *b, size_t n,
                                   double *part, zk_st_t st)
{
    (void)st;
    for (size_t o = 0; o < n; o += ZK_SUMSQ_BLOCK) {
        size_t len = n - o < ZK_SUMSQ_BLOCK ? n - o : ZK_SUMSQ_BLOCK;
        double lane[ZK_SUMSQ_LANES] = {0};

        for (size_t i = 0; i < len; i++) {
            float x = zk_reduce_elem(a[o + i], b[o + i]);
            double d = x;

            dst[o + i] = x;
            lane[i % ZK_SUMSQ_LANES] += d * d;
        }
        part[o / ZK_SUMSQ_BLOCK] = zk_sumsq_lanes_tree(lane);
    }
}

/* The loops below are written once and instantiated per dtype (a constant after inlining), so
 * that no dtype switch is left inside them. */

ZK_ALWAYS_INLINE void zk_scalar_acc_loop(float *acc, const void *src, zs_dtype_t dt, float s,
                                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        acc[i] = zk_accumulate_elem(acc[i], zk_load_elem(src, dt, i), s);
    }
}

static void zk_scalar_accumulate(float *acc, const void *src, zs_dtype_t dt, float s, size_t n,
                                 zk_st_t st)
{
    (void)st;
    switch (dt) {
    case ZS_DTYPE_F16:
        zk_scalar_acc_loop(acc, src, ZS_DTYPE_F16, s, n);
        break;
    case ZS_DTYPE_BF16:
        zk_scalar_acc_loop(acc, src, ZS_DTYPE_BF16, s, n);
        break;
    default:
        zk_scalar_acc_loop(acc, src, ZS_DTYPE_F32, s, n);
        break;
    }
}

ZK_ALWAYS_INLINE void zk_scalar_red_loop(void *dst, const void *a, const void *b, zs_dtype_t dt,
                                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zk_store_elem(dst, dt, i, zk_reduce_elem(zk_load_elem(a, dt, i), zk_load_elem(b, dt, i)));
    }
}

static void zk_scalar_reduce(void *dst, const void *a, const void *b, zs_dtype_t dt, size_t n,
                             zk_st_t st)
{
    (void)st;
    switch (dt) {
    case ZS_DTYPE_F16:
        zk_scalar_red_loop(dst, a, b, ZS_DTYPE_F16, n);
        break;
    case ZS_DTYPE_BF16:
        zk_scalar_red_loop(dst, a, b, ZS_DTYPE_BF16, n);
        break;
    default:
        zk_scalar_red_loop(dst, a, b, ZS_DTYPE_F32, n);
        break;
    }
}

static void zk_scalar_cast(void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt, size_t n,
                           zk_st_t st)
{
    (void)st;
    for (size_t i = 0; i < n; i++) {
        zk_store_elem(dst, ddt, i, zk_load_elem(src, sdt, i));
    }
}

static void zk_scalar_copy(void *dst, const void *src, size_t bytes, zk_st_t st)
{
    (void)st;
    memcpy(dst, src, bytes);
}

const zk_ops_t zk_ops_scalar = {
    .adam = zk_scalar_adam,
    .sumsq = zk_scalar_sumsq,
    .accumulate = zk_scalar_accumulate,
    .reduce = zk_scalar_reduce,
    .reduce_sumsq = zk_scalar_reduce_sumsq,
    .cast = zk_scalar_cast,
    .copy = zk_scalar_copy,
};
