/*
 * zk_sumsq: the double sum of squares against a long-double reference (relative 1e-12: a
 * double sum of n positive terms errs by at most about n * 2^-53 in the worst case and by
 * about sqrt(n) * 2^-53 typically; 1e-12 covers n = 10^6 with the SIMD variants' 16 partial
 * sums), and the non-finite flag for one NaN or inf anywhere, including head and tail.
 */
#include "zk_test.h"

static void zt_sumsq_values(zk_exec_t ex)
{
    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        for (size_t k = 0; k < ZT_N_OFFSETS; k++) {
            size_t n = zt_lengths[li];
            zt_buf_t b;
            float *x = zt_alloc(&b, 4 * n, 4 * zt_offsets[k]);
            long double ref = 0.0L;
            double got = -1.0;
            int flag = -1;

            for (size_t i = 0; i < n; i++) {
                x[i] = zt_logu(-30, 30);
                ref += (long double)x[i] * x[i];
            }
            if (n > 2) {
                x[n / 2] = 3.4e38f; /* FLT_MAX^2 is finite in double: no false flag */
                ref = 0.0L;
                for (size_t i = 0; i < n; i++) {
                    ref += (long double)x[i] * x[i];
                }
            }
            cr_assert_eq(zk_sumsq(&ex, x, n, &got, &flag), ZS_OK, "%s", zk_last_error());
            cr_assert_eq(flag, 0, "%s n=%zu: flag set on finite data", zk_variant_name(ex.variant),
                         n);
            cr_assert_leq(fabsl((long double)got - ref), 1e-12L * ref,
                          "%s n=%zu off=%zu: %.17g vs %.17Lg (seed %llu)",
                          zk_variant_name(ex.variant), n, zt_offsets[k], got, ref,
                          (unsigned long long)zt_seed);
            zt_free(&b);
        }
    }
}

ZT_VARIANT_TESTS(zk_sumsq, matches_fp64_reference, zt_sumsq_values)

static void zt_sumsq_flag(zk_exec_t ex)
{
    static const uint32_t bad[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u};

    for (size_t li = 1; li < ZT_N_LENGTHS; li++) {
        size_t n = zt_lengths[li];
        size_t pos[] = {0, n / 2, n - 1, n > 20 ? n - 9 : 0, zt_u64() % n};
        zt_buf_t b;
        float *x = zt_alloc(&b, 4 * n, 4 * zt_offsets[li % ZT_N_OFFSETS]);

        for (size_t i = 0; i < n; i++) {
            x[i] = zt_logu(-10, 10);
        }
        for (size_t pi = 0; pi < sizeof(pos) / sizeof(pos[0]); pi++) {
            for (size_t bi = 0; bi < sizeof(bad) / sizeof(bad[0]); bi++) {
                float keep = x[pos[pi]];
                double s;
                int flag = 0;

                x[pos[pi]] = zt_bits_f32(bad[bi]);
                cr_assert_eq(zk_sumsq(&ex, x, n, &s, &flag), ZS_OK);
                cr_assert_eq(flag, 1, "%s n=%zu: %08x at %zu not flagged",
                             zk_variant_name(ex.variant), n, bad[bi], pos[pi]);
                x[pos[pi]] = keep;
            }
        }
        zt_free(&b);
    }
}

ZT_VARIANT_TESTS(zk_sumsq, flags_one_nonfinite_anywhere, zt_sumsq_flag)

Test(zk_sumsq, pool_matches_one_thread)
{
    const size_t n = 1000003;
    float *x = malloc(4 * n);
    zk_pool_t *pool;
    double s1, s2;
    int f1, f2;

    zt_seed_init();
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++) {
        x[i] = zt_logu(-10, 10);
    }
    cr_assert_eq(zk_pool_create(2, &pool), ZS_OK);
    {
        zk_exec_t ex = {.variant = ZK_VARIANT_DEFAULT, .pool = pool};
        cr_assert_eq(zk_sumsq(NULL, x, n, &s1, &f1), ZS_OK);
        cr_assert_eq(zk_sumsq(&ex, x, n, &s2, &f2), ZS_OK);
        float keep = x[n - 1];
        x[n - 1] = NAN;
        cr_assert_eq(zk_sumsq(&ex, x, n, &s2, &f2), ZS_OK);
        cr_assert_eq(f2, 1);
        x[n - 1] = keep;
        cr_assert_eq(zk_sumsq(&ex, x, n, &s2, &f2), ZS_OK);
    }
    cr_assert_eq(f1, 0);
    cr_assert_eq(f2, 0);
    cr_assert_leq(fabs(s1 - s2), 1e-12 * s1);
    zk_pool_destroy(pool);
    free(x);
}
