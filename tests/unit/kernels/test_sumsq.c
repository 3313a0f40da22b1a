/*
 * zk_sumsq: the double sum of squares against a long-double reference (relative 1e-12: the
 * squares are exact, and a term passes through at most 1024 additions in its lane, 4 in the
 * lane tree and one per super-block (62 for n = 10^6), each erring by at most 2^-53 of a
 * partial sum no larger than the total: about 1090 * 2^-53 = 1.2e-13 in the worst case), and
 * the non-finite flag for one NaN or inf anywhere, including head and tail. Then the order of
 * zk/kernels.h, exactly: against that order written out here, for every variant, thread count
 * and alignment.
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
    cr_assert_eq(zt_f64_bits(s1), zt_f64_bits(s2), "pool %a, one thread %a", s2, s1);
    zk_pool_destroy(pool);
    free(x);
}

/* The order of zk/kernels.h written out: lanes by index mod 16 within super-blocks of
 * ZK_SUMSQ_BLOCK, the fixed lane tree, super-block sums in order. */
static double zt_sumsq_order(const float *x, size_t n)
{
    double sum = 0.0;

    for (size_t b = 0; b < n; b += ZK_SUMSQ_BLOCK) {
        double l[ZK_SUMSQ_LANES] = {0}, t[8];

        for (size_t i = b; i < n && i < b + ZK_SUMSQ_BLOCK; i++) {
            l[(i - b) % ZK_SUMSQ_LANES] += (double)x[i] * (double)x[i];
        }
        for (int i = 0; i < 8; i++) {
            t[i] = l[i] + l[i + 8];
        }
        for (int i = 0; i < 4; i++) {
            t[i] = t[i] + t[i + 4];
        }
        sum += (t[0] + t[2]) + (t[1] + t[3]);
    }
    return sum;
}

/* Values whose squares carry up to 48 significant bits, of similar size: every addition
 * rounds, so any other order changes the last bits (a few wide-range ones mixed in). */
static float zt_sumsq_value(void)
{
    return zt_u64() % 8 == 0 ? zt_logu(-20, 20) : (float)zt_uniform(-2.0, 2.0);
}

static void zt_sumsq_check(zk_exec_t ex, const float *x, size_t n, double want, int want_flag,
                           const char *what)
{
    double got;
    int flag = -1;

    cr_assert_eq(zk_sumsq(&ex, x, n, &got, &flag), ZS_OK, "%s", zk_last_error());
    cr_assert_eq(flag, want_flag, "%s n=%zu: flag %d (seed %llu)", what, n, flag,
                 (unsigned long long)zt_seed);
    cr_assert_eq(zt_f64_bits(got), zt_f64_bits(want), "%s n=%zu: %a (%016llx), want %a (seed %llu)",
                 what, n, got, (unsigned long long)zt_f64_bits(got), want,
                 (unsigned long long)zt_seed);
}

/* Every variant sums in the documented order, at every length and misalignment; a NaN
 * anywhere gives the canonical double NaN, an inf (and no NaN) +inf. */
static void zt_sumsq_order_all(zk_exec_t ex)
{
    for (size_t li = 0; li < ZT_N_EDGE_LENGTHS; li++) {
        size_t n = zt_edge_lengths[li];
        zt_buf_t b;
        float *x = zt_alloc(&b, 4 * n, 4 * zt_edge_offset(li));
        char what[64];

        snprintf(what, sizeof(what), "%s offset %zu", zk_variant_name(ex.variant),
                 zt_edge_offset(li));
        for (size_t i = 0; i < n; i++) {
            x[i] = zt_sumsq_value();
        }
        zt_sumsq_check(ex, x, n, zt_sumsq_order(x, n), 0, what);
        if (n > 0) {
            x[zt_u64() % n] = zt_bits_f32(0xff800000u);
            zt_sumsq_check(ex, x, n, INFINITY, 1, what);
            x[zt_u64() % n] = zt_bits_f32(zt_u64() % 2 ? 0xff812345u : 0x7fc00001u);
            zt_sumsq_check(ex, x, n, NAN, 1, what);
        }
        zt_free(&b);
    }
}

ZT_VARIANT_TESTS(zk_sumsq, follows_the_documented_order, zt_sumsq_order_all)

/* A SIMD variant gives the scalar variant's bits, specials included. */
static void zt_sumsq_vs_scalar(zk_exec_t ex)
{
    const zk_exec_t ref = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};

    for (size_t li = 0; li < ZT_N_EDGE_LENGTHS; li++) {
        size_t n = zt_edge_lengths[li];
        for (int special = 0; special <= 1; special++) {
            zt_buf_t b;
            float *x = zt_alloc(&b, 4 * n, 4 * zt_edge_offset(li + (size_t)special));
            double want;
            int want_flag;

            for (size_t i = 0; i < n; i++) {
                x[i] = special ? zt_or_special(zt_sumsq_value(), 5000) : zt_sumsq_value();
            }
            cr_assert_eq(zk_sumsq(&ref, x, n, &want, &want_flag), ZS_OK);
            zt_sumsq_check(ex, x, n, want, want_flag, zk_variant_name(ex.variant));
            zt_free(&b);
        }
    }
}

ZT_SIMD_VARIANT_TESTS(zk_sumsq, matches_scalar_bit_for_bit, zt_sumsq_vs_scalar)

/* Pools of 1, 2, 3 and 5 threads, at misaligned addresses, give the bits of one thread. */
static void zt_sumsq_pool_split(zk_exec_t ex)
{
    static const size_t offs[] = {0, 1, 3, 7};
    const size_t n = 1000003;
    float *x0 = malloc(4 * n);
    double want;
    int want_flag;

    cr_assert_not_null(x0);
    for (size_t i = 0; i < n; i++) {
        x0[i] = zt_sumsq_value();
    }
    {
        zk_exec_t one = {.variant = ex.variant, .pool = NULL};
        cr_assert_eq(zk_sumsq(&one, x0, n, &want, &want_flag), ZS_OK);
    }
    for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
        zt_buf_t b;
        float *x = zt_alloc(&b, 4 * n, 4 * offs[oi]);

        memcpy(x, x0, 4 * n);
        for (size_t ti = 0; ti < ZT_N_THREADS; ti++) {
            zk_exec_t pooled = {.variant = ex.variant,
                                .pool = zt_pool(zt_threads[ti]),
                                .stores = ex.stores,
                                .prefetch = ex.prefetch};
            char what[96];

            snprintf(what, sizeof(what), "%s, %u threads, offset %zu", zk_variant_name(ex.variant),
                     zt_threads[ti], offs[oi]);
            zt_sumsq_check(pooled, x, n, want, want_flag, what);
            zk_pool_destroy(pooled.pool);
        }
        zt_free(&b);
    }
    free(x0);
}

ZT_VARIANT_TESTS(zk_sumsq, pool_split_is_bit_identical, zt_sumsq_pool_split)

/* A call longer than the front end's rounds (16 Mi elements) on a pool of 3 threads. */
Test(zk_sumsq, long_call_follows_the_documented_order)
{
    const size_t n = ((size_t)16 << 20) + 3 * ZK_SUMSQ_BLOCK + 5;
    float *x = malloc(4 * n);
    zk_exec_t ex = {.variant = ZK_VARIANT_DEFAULT, .pool = NULL};

    zt_seed_init();
    cr_assert_not_null(x);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(int32_t)(zt_u64() >> 40) * (float)(1 + i % 977); /* cheap, spread */
    }
    ex.pool = zt_pool(3);
    zt_sumsq_check(ex, x, n, zt_sumsq_order(x, n), 0, zk_variant_name(zk_default_variant()));
    zk_pool_destroy(ex.pool);
    free(x);
}
