/*
 * zk_accumulate (acc += src * s) and zk_reduce (dst = a + b in fp32) against fp64.
 * accumulate: the kernel rounds the product and the sum at most once each (an FMA rounds
 * once in all), so |result - exact| <= 2^-24 (|src s| + |exact|) + subnormal slack.
 * reduce: a + b of two fp32 values is correctly rounded, and fp64 then fp32 rounding of a sum
 * of two floats is innocuous (53 >= 2 * 24 + 2), so the result must be bit-exact; fp16/bf16
 * add the reference RNE of that sum.
 */
#include "zk_test.h"

static float zt_to_f32(const void *p, zk_dtype_t dt, size_t i)
{
    uint16_t h;

    if (dt == ZK_DTYPE_F32) {
        return ((const float *)p)[i];
    }
    memcpy(&h, (const char *)p + 2 * i, 2);
    return dt == ZK_DTYPE_F16 ? (float)zt_f16_value(h) : zt_bits_f32((uint32_t)h << 16);
}

static void zt_put(void *p, zk_dtype_t dt, size_t i, float f)
{
    uint16_t h;

    if (dt == ZK_DTYPE_F32) {
        ((float *)p)[i] = f;
        return;
    }
    h = dt == ZK_DTYPE_F16 ? zt_ref_f16(f) : zt_ref_bf16(f);
    memcpy((char *)p + 2 * i, &h, 2);
}

static void zt_accumulate(zk_exec_t ex)
{
    unsigned k = 0;

    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        for (int dti = 0; dti < 3; dti++) {
            zk_dtype_t dt = (zk_dtype_t)dti;
            size_t n = zt_lengths[li], es = zk_dtype_size(dt);
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
                              zk_variant_name(ex.variant), zk_dtype_name(dt), n, i, (double)acc[i],
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
                zk_dtype_t dt = (zk_dtype_t)dti;
                size_t n = zt_lengths[li], es = zk_dtype_size(dt);
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
                    if (dt == ZK_DTYPE_F32) {
                        cr_assert_eq(zt_f32_bits(((float *)d)[i]), zt_f32_bits(want[i]),
                                     "%s n=%zu at %zu", zk_variant_name(ex.variant), n, i);
                    } else {
                        uint16_t got;
                        memcpy(&got, (char *)d + 2 * i, 2);
                        cr_assert_eq(
                            got, dt == ZK_DTYPE_F16 ? zt_ref_f16(want[i]) : zt_ref_bf16(want[i]),
                            "%s %s n=%zu at %zu", zk_variant_name(ex.variant), zk_dtype_name(dt), n,
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
