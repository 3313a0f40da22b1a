/*
 * zk_reduce_sumsq_parts: the fp32 reduce and the sum of squares of its results in one pass
 * must give the bits of zk_reduce and then zk_sumsq_parts on the result (the daemon's norm
 * takes either path and a step's bits may not depend on which), for every variant and stores,
 * at every head and tail length, with special values, on pools of 1-5 threads; and
 * zk_sumsq_total over the parts must be zk_sumsq's result and flag.
 */
#include "zk_test.h"

static size_t zt_parts(size_t n)
{
    return (n + ZK_SUMSQ_BLOCK - 1) / ZK_SUMSQ_BLOCK;
}

/* Both paths on a[0..n), b[0..n) (dst at offset `off` elements from 64-byte alignment), with
 * `ex` for the fused call and the scalar variant, one thread, for the reference. */
static void zt_redsq_check(zk_exec_t ex, const float *a, const float *b, size_t n, size_t off,
                           const char *what)
{
    zk_exec_t ref = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};
    size_t np = zt_parts(n) + 1;
    double *want = calloc(np, sizeof(double)), *got = calloc(np, sizeof(double));
    zt_buf_t bw, bg;
    float *dw = zt_alloc(&bw, 4 * n + 4, 4 * off), *dg = zt_alloc(&bg, 4 * n + 4, 4 * off);
    double total, sum;
    int flag = -1, want_flag = -1;
    size_t at;

    cr_assert(want != NULL && got != NULL);
    cr_assert_eq(zk_reduce(&ref, dw, a, b, ZS_DTYPE_F32, n), ZS_OK, "%s", zk_last_error());
    cr_assert_eq(zk_sumsq_parts(&ref, dw, n, want), ZS_OK, "%s", zk_last_error());
    got[np - 1] = want[np - 1] = 42.0; /* nothing written past the last part */
    cr_assert_eq(zk_reduce_sumsq_parts(&ex, dg, a, b, n, got), ZS_OK, "%s", zk_last_error());
    at = zt_first_diff(dw, dg, n, 4);
    cr_assert_eq(at, n, "%s n=%zu: result %zu is %08llx, want %08llx", what, n, at,
                 zt_elem_bits(dg, at, 4), zt_elem_bits(dw, at, 4));
    at = zt_first_diff(want, got, np, 8);
    cr_assert_eq(at, np, "%s n=%zu: part %zu is %.17g, want %.17g", what, n, at, got[at], want[at]);
    total = zk_sumsq_total(got, np - 1, &flag);
    cr_assert_eq(zk_sumsq(&ref, dw, n, &sum, &want_flag), ZS_OK);
    cr_assert(memcmp(&total, &sum, sizeof(sum)) == 0 && flag == want_flag,
              "%s n=%zu: total %.17g flag %d, zk_sumsq %.17g flag %d", what, n, total, flag, sum,
              want_flag);
    zt_free(&bw);
    zt_free(&bg);
    free(want);
    free(got);
}

static void zt_redsq_fill(float *a, float *b, size_t n, unsigned special_every)
{
    for (size_t i = 0; i < n; i++) {
        a[i] = zt_or_special(zt_logu(-20, 20), special_every);
        b[i] = zt_or_special(zt_logu(-20, 20), special_every);
    }
}

/* Every edge length at its misalignment of dst (the sources at others), finite values and then
 * one special value in about 50. */
static void zt_redsq_edges(zk_exec_t ex)
{
    for (size_t k = 0; k < ZT_N_EDGE_LENGTHS; k++) {
        size_t n = zt_edge_lengths[k], off = zt_edge_offset(k);
        zt_buf_t ba, bb;
        float *a = zt_alloc(&ba, 4 * n, 4 * ((off + 5) % 17));
        float *b = zt_alloc(&bb, 4 * n, 4 * ((off + 11) % 17));
        char what[64];

        snprintf(what, sizeof(what), "%s, dst offset %zu", zk_variant_name(ex.variant), off);
        zt_redsq_fill(a, b, n, 0xffffffffu);
        zt_redsq_check(ex, a, b, n, off, what);
        zt_redsq_fill(a, b, n, 50);
        zt_redsq_check(ex, a, b, n, off, what);
        zt_free(&ba);
        zt_free(&bb);
    }
}

ZT_VARIANT_TESTS(zk_reduce_sumsq, matches_reduce_then_sumsq, zt_redsq_edges)

/* Pools of 1, 2, 3 and 5 threads over several super-blocks, dst aligned and not. */
static void zt_redsq_pools(zk_exec_t ex)
{
    const size_t n = 5 * ZK_SUMSQ_BLOCK + 12345;
    zt_buf_t ba, bb;
    float *a = zt_alloc(&ba, 4 * n, 0), *b = zt_alloc(&bb, 4 * n, 12);

    zt_redsq_fill(a, b, n, 100000);
    for (size_t off = 0; off < 2; off++) {
        for (size_t ti = 0; ti < ZT_N_THREADS; ti++) {
            zk_exec_t pooled = {.variant = ex.variant,
                                .pool = zt_pool(zt_threads[ti]),
                                .stores = ex.stores,
                                .prefetch = ex.prefetch};
            char what[96];

            snprintf(what, sizeof(what), "%s, %u threads, dst offset %zu",
                     zk_variant_name(ex.variant), zt_threads[ti], off * 5);
            zt_redsq_check(pooled, a, b, n, off * 5, what);
            zk_pool_destroy(pooled.pool);
        }
    }
    zt_free(&ba);
    zt_free(&bb);
}

ZT_VARIANT_TESTS(zk_reduce_sumsq, pool_split_is_bit_identical, zt_redsq_pools)

Test(zk_reduce_sumsq, rejects_null_buffers)
{
    zk_exec_t ex = {.variant = ZK_VARIANT_DEFAULT, .pool = NULL};
    float x[4] = {1, 2, 3, 4};
    double part[1];

    cr_assert_eq(zk_reduce_sumsq_parts(&ex, NULL, x, x, 4, part), ZS_ERR_INVALID);
    cr_assert_eq(zk_reduce_sumsq_parts(&ex, x, x, x, 4, NULL), ZS_ERR_INVALID);
    cr_assert_eq(zk_sumsq_parts(&ex, NULL, 4, part), ZS_ERR_INVALID);
    cr_assert_eq(zk_reduce_sumsq_parts(&ex, NULL, NULL, NULL, 0, NULL), ZS_OK);
}
