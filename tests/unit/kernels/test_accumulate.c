/*
 * zk_accumulate (acc += src * s) and zk_reduce (dst = a + b in fp32) against fp64, then bit
 * for bit against the scalar variant and across thread counts and alignments.
 * accumulate: the kernel rounds the product and then the sum (no FMA, zk/elem.h), so
 * |result - exact| <= 2^-24 (|src s| + |exact|) + subnormal slack.
 * reduce: a + b of two fp32 values is correctly rounded, and fp64 then fp32 rounding of a sum
 * of two floats is innocuous (53 >= 2 * 24 + 2), so the result must be bit-exact; fp16/bf16
 * add the reference RNE of that sum.
 */
#include "zk_test.h"

static float zt_to_f32(const void *p, zs_dtype_t dt, size_t i)
{
    uint16_t h;

    if (dt == ZS_DTYPE_F32) {
        return ((const float *)p)[i];
    }
    memcpy(&h, (const char *)p + 2 * i, 2);
    return dt == ZS_DTYPE_F16 ? (float)zt_f16_value(h) : zt_bits_f32((uint32_t)h << 16);
}

static void zt_put(void *p, zs_dtype_t dt, size_t i, float f)
{
    uint16_t h;

    if (dt == ZS_DTYPE_F32) {
        ((float *)p)[i] = f;
        return;
    }
    h = dt == ZS_DTYPE_F16 ? zt_ref_f16(f) : zt_ref_bf16(f);
    memcpy((char *)p + 2 * i, &h, 2);
}

static void zt_accumulate(zk_exec_t ex)
{
    unsigned k = 0;

    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        for (int dti = 0; dti < 3; dti++) {
            zs_dtype_t dt = (zs_dtype_t)dti;
            size_t n = zt_lengths[li], es = zs_dtype_size(dt);
            size_t off = zt_offsets[k++ % ZT_N_OFFSETS];
            zt_buf_t ba, bs;
            float *acc = zt_alloc(&ba, 4 * n, 4 * off);
            void *src = zt_alloc(&bs, es * n, es * ((off * 3) % 16));
            float *acc0 = malloc(4 * n + 4);
            float s = (float)zt_uniform(0.1, 2.0);

            cr_assert_not_null(acc0);
            for (size_t i = 0; i < n; i++) {
                acc0[i] = acc[i] = zt_logu(-12, 8);
                zt_put(src, dt, i, zt_logu(-12, 8));
            }
            cr_assert_eq(zk_accumulate(&ex, acc, src, dt, s, n), ZS_OK, "%s", zk_last_error());
            for (size_t i = 0; i < n; i++) {
                double prod = (double)zt_to_f32(src, dt, i) * s;
                double exact = acc0[i] + prod;
                double bound = 0x1.0p-24 * (fabs(prod) + fabs(exact)) + 0x1.0p-148;
                cr_assert_leq(fabs(acc[i] - exact), bound,
                              "%s %s n=%zu: acc[%zu] = %a, exact %a (seed %llu)",
                              zk_variant_name(ex.variant), zs_dtype_name(dt), n, i, (double)acc[i],
                              exact, (unsigned long long)zt_seed);
            }
            free(acc0);
            zt_free(&ba);
            zt_free(&bs);
        }
    }
}

ZT_VARIANT_TESTS(zk_accumulate, matches_fp64_reference, zt_accumulate)

static void zt_reduce(zk_exec_t ex)
{
    unsigned k = 0;

    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        for (int dti = 0; dti < 3; dti++) {
            for (int alias = 0; alias <= 1; alias++) {
                zs_dtype_t dt = (zs_dtype_t)dti;
                size_t n = zt_lengths[li], es = zs_dtype_size(dt);
                size_t off = zt_offsets[k++ % ZT_N_OFFSETS];
                zt_buf_t ba, bb, bd = {NULL, NULL};
                void *a = zt_alloc(&ba, es * n, es * off);
                void *b = zt_alloc(&bb, es * n, es * ((off * 5) % 16));
                void *d = alias ? a : zt_alloc(&bd, es * n, es * ((off * 7) % 16));
                float *want = malloc(4 * n + 4);

                cr_assert_not_null(want);
                for (size_t i = 0; i < n; i++) {
                    zt_put(a, dt, i, zt_logu(-12, 12));
                    zt_put(b, dt, i, zt_logu(-12, 12));
                    want[i] = (float)((double)zt_to_f32(a, dt, i) + (double)zt_to_f32(b, dt, i));
                }
                cr_assert_eq(zk_reduce(&ex, d, a, b, dt, n), ZS_OK, "%s", zk_last_error());
                for (size_t i = 0; i < n; i++) {
                    if (dt == ZS_DTYPE_F32) {
                        cr_assert_eq(zt_f32_bits(((float *)d)[i]), zt_f32_bits(want[i]),
                                     "%s n=%zu at %zu", zk_variant_name(ex.variant), n, i);
                    } else {
                        uint16_t got;
                        memcpy(&got, (char *)d + 2 * i, 2);
                        cr_assert_eq(
                            got, dt == ZS_DTYPE_F16 ? zt_ref_f16(want[i]) : zt_ref_bf16(want[i]),
                            "%s %s n=%zu at %zu", zk_variant_name(ex.variant), zs_dtype_name(dt), n,
                            i);
                    }
                }
                free(want);
                zt_free(&ba);
                zt_free(&bb);
                if (!alias) {
                    zt_free(&bd);
                }
            }
        }
    }
}

ZT_VARIANT_TESTS(zk_reduce, matches_fp32_reference, zt_reduce)

/* ---- determinism: the same bits for every thread count, alignment and variant ---- */

/* `n` elements of dt at random, one in `special_every` a special value (NaN, inf, ...). */
static void *zt_random_elems(zs_dtype_t dt, size_t n, unsigned special_every)
{
    size_t es = zs_dtype_size(dt);
    void *p = malloc(es * n + 4);

    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) {
        float f = zt_or_special(zt_logu(-20, 20), special_every);
        if (dt == ZS_DTYPE_F32) {
            memcpy((char *)p + 4 * i, &f, 4);
        } else {
            /* the kernels' own conversion: NaN payloads kept, as the half types carry them */
            uint16_t h = dt == ZS_DTYPE_F16 ? zk_f32_to_f16(f) : zk_f32_to_bf16(f);
            memcpy((char *)p + 2 * i, &h, 2);
        }
    }
    return p;
}

/* acc += src * s on copies at misalignment `off` (acc) and a derived one (src); the resulting
 * accumulator lands in `out`. */
static void zt_acc_run(zk_exec_t ex, const float *acc0, const void *src0, zs_dtype_t dt, float s,
                       size_t n, size_t off, float *out)
{
    size_t es = zs_dtype_size(dt);
    zt_buf_t ba, bs;
    float *acc = zt_alloc(&ba, 4 * n, 4 * off);
    void *src = zt_alloc(&bs, es * n, es * ((off * 5) % 17));

    memcpy(acc, acc0, 4 * n);
    memcpy(src, src0, es * n);
    cr_assert_eq(zk_accumulate(&ex, acc, src, dt, s, n), ZS_OK, "%s", zk_last_error());
    memcpy(out, acc, 4 * n);
    zt_free(&ba);
    zt_free(&bs);
}

/* dst = a + b on copies at misalignments derived from `off`; alias: dst is a. */
static void zt_red_run(zk_exec_t ex, const void *a0, const void *b0, zs_dtype_t dt, size_t n,
                       size_t off, int alias, void *out)
{
    size_t es = zs_dtype_size(dt);
    zt_buf_t ba, bb, bd = {NULL, NULL};
    void *a = zt_alloc(&ba, es * n, es * off);
    void *b = zt_alloc(&bb, es * n, es * ((off * 3) % 17));
    void *d = alias ? a : zt_alloc(&bd, es * n, es * ((off * 11) % 17));

    memcpy(a, a0, es * n);
    memcpy(b, b0, es * n);
    cr_assert_eq(zk_reduce(&ex, d, a, b, dt, n), ZS_OK, "%s", zk_last_error());
    memcpy(out, d, es * n);
    zt_free(&ba);
    zt_free(&bb);
    if (!alias) {
        zt_free(&bd);
    }
}

/* A SIMD variant gives the scalar variant's bits: every dtype, every edge length and
 * misalignment, specials mixed in (NaN results are the canonical NaN). op 0: accumulate,
 * 1: reduce. */
static void zt_vs_scalar(zk_exec_t ex, int op)
{
    const zk_exec_t ref = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};

    for (size_t li = 0; li <= ZT_N_EDGE_LENGTHS; li++) {
        /* the last case: a length beyond the small-size edges (ex.stores picks the stores) */
        size_t n = li < ZT_N_EDGE_LENGTHS ? zt_edge_lengths[li] : ((size_t)4 << 20) + 9;
        size_t off = zt_edge_offset(li);

        for (int dti = 0; dti < 3; dti++) {
            zs_dtype_t dt = (zs_dtype_t)dti;
            size_t es = zs_dtype_size(dt);
            float *acc0 = zt_random_elems(ZS_DTYPE_F32, n, 11);
            void *a = zt_random_elems(dt, n, 11), *b = zt_random_elems(dt, n, 13);
            float s = zt_u64() % 8 == 0 ? zt_special() : (float)zt_uniform(-4.0, 4.0);
            void *want = malloc(4 * n + 4), *got = malloc(4 * n + 4);

            cr_assert(want != NULL && got != NULL);
            if (op == 0) {
                zt_acc_run(ref, acc0, a, dt, s, n, off, want);
                zt_acc_run(ex, acc0, a, dt, s, n, off, got);
                zt_assert_same_bits(got, want, n, 4, "%s vs scalar, %s src, s %a, n %zu, off %zu",
                                    zk_variant_name(ex.variant), zs_dtype_name(dt), (double)s, n,
                                    off);
            }
            for (int alias = 0; op == 1 && alias <= 1; alias++) {
                zt_red_run(ref, a, b, dt, n, off, alias, want);
                zt_red_run(ex, a, b, dt, n, off, alias, got);
                zt_assert_same_bits(got, want, n, es, "%s vs scalar, %s, n %zu, off %zu, alias %d",
                                    zk_variant_name(ex.variant), zs_dtype_name(dt), n, off, alias);
            }
            free(acc0);
            free(a);
            free(b);
            free(want);
            free(got);
        }
    }
}

static void zt_acc_vs_scalar(zk_exec_t ex)
{
    zt_vs_scalar(ex, 0);
}

static void zt_red_vs_scalar(zk_exec_t ex)
{
    zt_vs_scalar(ex, 1);
}

ZT_SIMD_VARIANT_TESTS(zk_accumulate, matches_scalar_bit_for_bit, zt_acc_vs_scalar)
ZT_SIMD_VARIANT_TESTS(zk_reduce, matches_scalar_bit_for_bit, zt_red_vs_scalar)

/* Pools of 1, 2, 3 and 5 threads at misaligned addresses give the bits of one thread, with
 * the stores of ex (the _nt tests: non-temporal). */
static void zt_pool_split(zk_exec_t ex, int op)
{
    static const size_t offs[] = {0, 1, 3, 7};
    const size_t n = ((size_t)2 << 20) + 13;
    float *want = malloc(4 * n), *got = malloc(4 * n);

    cr_assert(want != NULL && got != NULL);
    for (int dti = 0; dti < 3; dti++) {
        zs_dtype_t dt = (zs_dtype_t)dti;
        size_t es = op == 0 ? 4 : zs_dtype_size(dt);
        float *acc0 = zt_random_elems(ZS_DTYPE_F32, n, 1009);
        void *a = zt_random_elems(dt, n, 1013), *b = zt_random_elems(dt, n, 1019);
        float s = (float)zt_uniform(-4.0, 4.0);
        zk_exec_t one = {.variant = ex.variant, .pool = NULL};

        if (op == 0) {
            zt_acc_run(one, acc0, a, dt, s, n, 0, want);
        } else {
            zt_red_run(one, a, b, dt, n, 0, 0, want);
        }
        for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
            for (size_t ti = 0; ti < ZT_N_THREADS; ti++) {
                zk_exec_t pooled = {.variant = ex.variant,
                                    .pool = zt_pool(zt_threads[ti]),
                                    .stores = ex.stores,
                                    .prefetch = ex.prefetch};

                if (op == 0) {
                    zt_acc_run(pooled, acc0, a, dt, s, n, offs[oi], got);
                } else {
                    zt_red_run(pooled, a, b, dt, n, offs[oi], 0, got);
                }
                zt_assert_same_bits(got, want, n, es, "%s, %s, %u threads, offset %zu",
                                    zk_variant_name(ex.variant), zs_dtype_name(dt), zt_threads[ti],
                                    offs[oi]);
                zk_pool_destroy(pooled.pool);
            }
        }
        free(acc0);
        free(a);
        free(b);
    }
    free(want);
    free(got);
}

static void zt_acc_pool_split(zk_exec_t ex)
{
    zt_pool_split(ex, 0);
}

static void zt_red_pool_split(zk_exec_t ex)
{
    zt_pool_split(ex, 1);
}

ZT_VARIANT_TESTS(zk_accumulate, pool_split_is_bit_identical, zt_acc_pool_split)
ZT_VARIANT_TESTS(zk_reduce, pool_split_is_bit_identical, zt_red_pool_split)

/* NaN results are the canonical NaN, whatever the payloads of the NaNs that met. */
static void zt_acc_nan_canon(zk_exec_t ex)
{
    float acc[45], a[45], out[45];

    for (size_t i = 0; i < 45; i++) {
        acc[i] = zt_bits_f32(i % 2 ? 0xff812345u : 0x7fd55555u);
        a[i] = zt_bits_f32(i % 3 ? 0x7fa00001u : 0xffc00000u);
    }
    zt_acc_run(ex, acc, a, ZS_DTYPE_F32, 2.0f, 45, 1, out);
    for (size_t i = 0; i < 45; i++) {
        cr_assert_eq(zt_f32_bits(out[i]), ZK_NAN_BITS, "%s: acc[%zu] = %08x",
                     zk_variant_name(ex.variant), i, zt_f32_bits(out[i]));
    }
}

ZT_VARIANT_TESTS(zk_accumulate, nan_results_are_canonical, zt_acc_nan_canon)

static void zt_red_nan_canon(zk_exec_t ex)
{
    float a[45], b[45], out[45];

    for (size_t i = 0; i < 45; i++) {
        a[i] = zt_bits_f32(i % 3 ? 0x7fa00001u : 0xffc00000u);
        b[i] = i % 5 ? zt_bits_f32(0xff812345u) : 1.0f;
    }
    zt_red_run(ex, a, b, ZS_DTYPE_F32, 45, 2, 0, out);
    for (size_t i = 0; i < 45; i++) {
        cr_assert_eq(zt_f32_bits(out[i]), ZK_NAN_BITS, "%s: dst[%zu] = %08x",
                     zk_variant_name(ex.variant), i, zt_f32_bits(out[i]));
    }
}

ZT_VARIANT_TESTS(zk_reduce, nan_results_are_canonical, zt_red_nan_canon)
