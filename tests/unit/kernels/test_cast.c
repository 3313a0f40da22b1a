/*
 * zk_cast and the conversions of zk/elem.h against independent references (value-based
 * binary search for fp16, neighbour comparison for bf16): every fp16/bf16 pattern, and
 * fp32 inputs around every rounding boundary (ties, overflow, subnormals, NaN). Then every
 * pair bit for bit against the scalar variant and across thread counts and alignments.
 */
#include "zk_test.h"

/* NaN policy (IEEE 754 §6.2, F16C/AVX-512 hardware): sign and payload kept, quiet bit set */
static uint32_t zt_ref_f16_to_f32_bits(uint16_t h)
{
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
        return ((uint32_t)(h & 0x8000) << 16) | 0x7fc00000u | ((uint32_t)(h & 0x3ff) << 13);
    }
    return zt_f32_bits((float)zt_f16_value(h));
}

static int zt_f16_is_nan(uint16_t h)
{
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

static int zt_bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

/* All 65 536 patterns of dt to fp32 and back, at a misaligned address. */
static void zt_roundtrip(zk_exec_t ex, zs_dtype_t dt)
{
    const size_t n = 65536;
    zt_buf_t bh, bf, bb;
    uint16_t *h = zt_alloc(&bh, 2 * n, 2 * 3);
    float *f = zt_alloc(&bf, 4 * n, 4 * 5);
    uint16_t *back = zt_alloc(&bb, 2 * n, 2 * 1);

    for (size_t i = 0; i < n; i++) {
        h[i] = (uint16_t)i;
    }
    cr_assert_eq(zk_cast(&ex, f, ZS_DTYPE_F32, h, dt, n), ZS_OK, "%s", zk_last_error());
    cr_assert_eq(zk_cast(&ex, back, dt, f, ZS_DTYPE_F32, n), ZS_OK, "%s", zk_last_error());
    for (size_t i = 0; i < n; i++) {
        uint16_t x = (uint16_t)i;
        uint32_t want = dt == ZS_DTYPE_F16 ? zt_ref_f16_to_f32_bits(x) : (uint32_t)x << 16;
        int nan = dt == ZS_DTYPE_F16 ? zt_f16_is_nan(x) : zt_bf16_is_nan(x);
        uint16_t quiet = dt == ZS_DTYPE_F16 ? 0x0200 : 0x0040;

        cr_assert_eq(zt_f32_bits(f[i]), want, "%s %s %04zx -> fp32 %08x, want %08x",
                     zk_variant_name(ex.variant), zs_dtype_name(dt), i, zt_f32_bits(f[i]), want);
        /* numbers and quiet NaNs come back exactly; a signalling NaN comes back quieted */
        cr_assert_eq(back[i], nan ? (uint16_t)(x | quiet) : x, "%s %s %04zx came back as %04x",
                     zk_variant_name(ex.variant), zs_dtype_name(dt), i, back[i]);
    }
    zt_free(&bh);
    zt_free(&bf);
    zt_free(&bb);
}

static void zt_roundtrip_both(zk_exec_t ex)
{
    zt_roundtrip(ex, ZS_DTYPE_F16);
    zt_roundtrip(ex, ZS_DTYPE_BF16);
}

ZT_VARIANT_TESTS(zk_cast, all_half_patterns_round_trip, zt_roundtrip_both)

/* fp32 inputs: every top-16-bit pattern with low halves at and around the bf16 tie, plus
 * every fp16 midpoint (ties, including the subnormal and overflow ones) and its neighbours,
 * plus random patterns. Shuffled so that subnormals share vectors with normal values only
 * sometimes. */
static float *zt_f32_probe(size_t *n_p)
{
    static const uint16_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001,
                                    0xffff, 0x1000, 0x0fff, 0x1001};
    size_t cap = 65536 * 9 + 65536 * 6 + 65536, n = 0;
    float *x = malloc(cap * sizeof(float));

    cr_assert_not_null(x);
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (size_t l = 0; l < sizeof(lows) / sizeof(lows[0]); l++) {
            x[n++] = zt_bits_f32((hi << 16) | lows[l]);
        }
    }
    for (uint32_t h = 0; h < 0x7c00; h++) { /* midpoint between h and h + 1, both signs */
        double mid = (zt_f16_value((uint16_t)h) + zt_f16_value((uint16_t)(h + 1))) / 2;
        if (h == 0x7bff) {
            mid = 65520.0; /* max + half an ulp: rounds to inf */
        }
        float f = (float)mid; /* exact: 12 significant bits */
        x[n++] = f;
        x[n++] = -f;
        x[n++] = nextafterf(f, 0.0f);
        x[n++] = nextafterf(f, INFINITY);
        x[n++] = -nextafterf(f, 0.0f);
        x[n++] = -nextafterf(f, INFINITY);
    }
    for (int i = 0; i < 65536; i++) {
        x[n++] = zt_bits_f32((uint32_t)zt_u64());
    }
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = zt_u64() % (i + 1);
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    *n_p = n;
    return x;
}

static void zt_from_f32(zk_exec_t ex)
{
    size_t n;
    float *src = zt_f32_probe(&n);
    zt_buf_t bs, bd;

    for (int dti = 1; dti <= 2; dti++) {
        zs_dtype_t dt = (zs_dtype_t)dti;
        for (size_t k = 0; k < ZT_N_OFFSETS; k++) {
            float *s = zt_alloc(&bs, 4 * n, 4 * zt_offsets[k]);
            uint16_t *d = zt_alloc(&bd, 2 * n, 2 * zt_offsets[(k + 2) % ZT_N_OFFSETS]);
            size_t len = k == 0 ? n : 1 + zt_u64() % 5000; /* short calls too */

            memcpy(s, src, 4 * len);
            cr_assert_eq(zk_cast(&ex, d, dt, s, ZS_DTYPE_F32, len), ZS_OK);
            for (size_t i = 0; i < len; i++) {
                uint16_t want = dt == ZS_DTYPE_F16 ? zt_ref_f16(s[i]) : zt_ref_bf16(s[i]);
                cr_assert_eq(d[i], want, "%s fp32 %08x (%a) -> %s %04x, want %04x",
                             zk_variant_name(ex.variant), zt_f32_bits(s[i]), (double)s[i],
                             zs_dtype_name(dt), d[i], want);
            }
            zt_free(&bs);
            zt_free(&bd);
        }
    }
    free(src);
}

ZT_VARIANT_TESTS(zk_cast, f32_to_half_rounds_to_nearest_even, zt_from_f32)

/* The scalar formulas of zk/elem.h are what the CUDA kernels run: check them directly. */
Test(zk_cast, elem_formulas_match_references)
{
    size_t n;
    float *x;

    zt_seed_init();
    x = zt_f32_probe(&n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(zk_f32_to_f16(x[i]), zt_ref_f16(x[i]), "%08x", zt_f32_bits(x[i]));
        cr_assert_eq(zk_f32_to_bf16(x[i]), zt_ref_bf16(x[i]), "%08x", zt_f32_bits(x[i]));
    }
    for (uint32_t h = 0; h < 65536; h++) {
        cr_assert_eq(zt_f32_bits(zk_f16_to_f32((uint16_t)h)), zt_ref_f16_to_f32_bits((uint16_t)h));
        cr_assert_eq(zt_f32_bits(zk_bf16_to_f32((uint16_t)h)), h << 16);
    }
    free(x);
}

/* half <-> half through fp32, same-type copies, lengths 0..: every pair the API accepts */
static void zt_all_pairs(zk_exec_t ex)
{
    for (size_t li = 0; li < ZT_N_LENGTHS; li++) {
        size_t n = zt_lengths[li] > 5000 ? 5000 : zt_lengths[li];
        for (int s = 0; s < 3; s++) {
            for (int d = 0; d < 3; d++) {
                zt_buf_t bs, bd;
                size_t ss = zs_dtype_size((zs_dtype_t)s), ds = zs_dtype_size((zs_dtype_t)d);
                unsigned char *src = zt_alloc(&bs, ss * n, ss * zt_offsets[li % ZT_N_OFFSETS]);
                unsigned char *dst = zt_alloc(&bd, ds * n, ds);

                for (size_t i = 0; i < n; i++) {
                    float f = zt_logu(-20, 10);
                    if (s == 0) {
                        memcpy(src + 4 * i, &f, 4);
                    } else {
                        uint16_t h = s == 1 ? zt_ref_f16(f) : zt_ref_bf16(f);
                        memcpy(src + 2 * i, &h, 2);
                    }
                }
                cr_assert_eq(zk_cast(&ex, dst, (zs_dtype_t)d, src, (zs_dtype_t)s, n), ZS_OK);
                for (size_t i = 0; i < n; i++) {
                    float f;
                    uint16_t h, got16;
                    float got32;
                    if (s == 0) {
                        memcpy(&f, src + 4 * i, 4);
                    } else {
                        memcpy(&h, src + 2 * i, 2);
                        f = s == 1 ? (float)zt_f16_value(h) : zt_bits_f32((uint32_t)h << 16);
                    }
                    if (d == 0) {
                        memcpy(&got32, dst + 4 * i, 4);
                        cr_assert_eq(zt_f32_bits(got32), zt_f32_bits(f));
                    } else {
                        memcpy(&got16, dst + 2 * i, 2);
                        cr_assert_eq(got16, d == 1 ? zt_ref_f16(f) : zt_ref_bf16(f),
                                     "%d -> %d at %zu", s, d, i);
                    }
                }
                zt_free(&bs);
                zt_free(&bd);
            }
        }
    }
}

ZT_VARIANT_TESTS(zk_cast, every_dtype_pair_and_length, zt_all_pairs)

/* Same-type copies (the all-gather's): with and without a prefetch, at misaligned addresses,
 * on one thread and on a pool, every length around the copy loop's 256-byte turns gives the
 * source's bytes and writes nothing past the end. */
static void zt_copy_paths(zk_exec_t ex)
{
    static const size_t lens[] = {0, 1, 63, 64, 65, 129, 200, 1000, 4099, 100003};

    for (int dt = 0; dt < 3; dt++) {
        size_t es = zs_dtype_size((zs_dtype_t)dt);
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
            size_t n = lens[li], bytes = es * n;
            unsigned char *want = malloc(bytes + 1);

            cr_assert_not_null(want);
            for (size_t i = 0; i < bytes; i++) {
                want[i] = (unsigned char)zt_u64();
            }
            for (int k = 0; k < 2 * 2 * (int)ZT_N_OFFSETS; k++) {
                size_t off = zt_offsets[k % ZT_N_OFFSETS];
                int pf = (k / ZT_N_OFFSETS) % 2, pooled = k / (2 * ZT_N_OFFSETS);
                zk_exec_t e = {.variant = ex.variant,
                               .pool = pooled ? zt_pool(3) : NULL,
                               .stores = ex.stores,
                               .prefetch = pf ? ZT_PREFETCH : -1};
                zt_buf_t bs, bd;
                unsigned char *src = zt_alloc(&bs, bytes, es * off);
                unsigned char *dst = zt_alloc(&bd, bytes + 8, es * ((off * 5) % 17));

                memcpy(src, want, bytes);
                memset(dst, 0xa5, bytes + 8);
                cr_assert_eq(zk_cast(&e, dst, (zs_dtype_t)dt, src, (zs_dtype_t)dt, n), ZS_OK, "%s",
                             zk_last_error());
                cr_assert(bytes == 0 || memcmp(dst, want, bytes) == 0,
                          "%s %s copy of %zu, offset %zu, prefetch %d, pool %d differs",
                          zk_variant_name(ex.variant), zs_dtype_name((zs_dtype_t)dt), n, off, pf,
                          pooled);
                for (size_t i = bytes; i < bytes + 8; i++) {
                    cr_assert_eq(dst[i], 0xa5, "copy of %zu wrote byte %zu past its end", n,
                                 i - bytes);
                }
                zt_free(&bs);
                zt_free(&bd);
                zk_pool_destroy(e.pool);
            }
            free(want);
        }
    }
}

ZT_VARIANT_TESTS(zk_cast, same_type_copy_every_path, zt_copy_paths)

/* ---- determinism: the same bits for every thread count, alignment and variant ---- */

/* n random elements of dt (fp32 values with specials, rounded by the kernels' conversion) */
static void *zt_cast_src(zs_dtype_t dt, size_t n)
{
    size_t es = zs_dtype_size(dt);
    unsigned char *p = malloc(es * n + 4);

    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++) {
        float f = zt_u64() % 4 == 0 ? zt_bits_f32((uint32_t)zt_u64())
                                    : zt_or_special(zt_logu(-30, 20), 9);
        if (dt == ZS_DTYPE_F32) {
            memcpy(p + 4 * i, &f, 4);
        } else {
            uint16_t h = dt == ZS_DTYPE_F16 ? zk_f32_to_f16(f) : zk_f32_to_bf16(f);
            memcpy(p + 2 * i, &h, 2);
        }
    }
    return p;
}

/* dst = cast(src) on copies at misalignments derived from `off`; the result lands in out */
static void zt_cast_run(zk_exec_t ex, zs_dtype_t ddt, zs_dtype_t sdt, const void *src0, size_t n,
                        size_t off, void *out)
{
    size_t ds = zs_dtype_size(ddt), ss = zs_dtype_size(sdt);
    zt_buf_t bs, bd;
    void *src = zt_alloc(&bs, ss * n, ss * off);
    void *dst = zt_alloc(&bd, ds * n, ds * ((off * 5) % 17));

    memcpy(src, src0, ss * n);
    cr_assert_eq(zk_cast(&ex, dst, ddt, src, sdt, n), ZS_OK, "%s", zk_last_error());
    memcpy(out, dst, ds * n);
    zt_free(&bs);
    zt_free(&bd);
}

/* A SIMD variant gives the scalar variant's bits for every pair, length and misalignment. */
static void zt_cast_vs_scalar(zk_exec_t ex)
{
    const zk_exec_t ref = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};

    for (size_t li = 0; li <= ZT_N_EDGE_LENGTHS; li++) {
        /* the last case: a length beyond the small-size edges (ex.stores picks the stores) */
        size_t n = li < ZT_N_EDGE_LENGTHS ? zt_edge_lengths[li] : ((size_t)4 << 20) + 9;
        size_t off = zt_edge_offset(li);

        for (int s = 0; s < 3; s++) {
            void *src = zt_cast_src((zs_dtype_t)s, n);
            void *want = malloc(4 * n + 4), *got = malloc(4 * n + 4);

            cr_assert(want != NULL && got != NULL);
            for (int d = 0; d < 3; d++) {
                zt_cast_run(ref, (zs_dtype_t)d, (zs_dtype_t)s, src, n, off, want);
                zt_cast_run(ex, (zs_dtype_t)d, (zs_dtype_t)s, src, n, off, got);
                zt_assert_same_bits(got, want, n, zs_dtype_size((zs_dtype_t)d),
                                    "%s vs scalar, %s -> %s, n %zu, off %zu",
                                    zk_variant_name(ex.variant), zs_dtype_name((zs_dtype_t)s),
                                    zs_dtype_name((zs_dtype_t)d), n, off);
            }
            free(src);
            free(want);
            free(got);
        }
    }
}

ZT_SIMD_VARIANT_TESTS(zk_cast, matches_scalar_bit_for_bit, zt_cast_vs_scalar)

/* Pools of 1, 2, 3 and 5 threads at misaligned addresses give the bits of one thread. */
static void zt_cast_pool_split(zk_exec_t ex)
{
    static const size_t offs[] = {0, 1, 3, 7};
    const size_t n = ((size_t)1 << 20) + 21;
    void *want = malloc(4 * n), *got = malloc(4 * n);

    cr_assert(want != NULL && got != NULL);
    for (int s = 0; s < 3; s++) {
        void *src = zt_cast_src((zs_dtype_t)s, n);

        for (int d = 0; d < 3; d++) {
            zk_exec_t one = {.variant = ex.variant, .pool = NULL};

            if (d == s) {
                continue; /* a copy */
            }
            zt_cast_run(one, (zs_dtype_t)d, (zs_dtype_t)s, src, n, 0, want);
            for (size_t oi = 0; oi < sizeof(offs) / sizeof(offs[0]); oi++) {
                for (size_t ti = 0; ti < ZT_N_THREADS; ti++) {
                    zk_exec_t pooled = {.variant = ex.variant,
                                        .pool = zt_pool(zt_threads[ti]),
                                        .stores = ex.stores,
                                        .prefetch = ex.prefetch};

                    zt_cast_run(pooled, (zs_dtype_t)d, (zs_dtype_t)s, src, n, offs[oi], got);
                    zt_assert_same_bits(got, want, n, zs_dtype_size((zs_dtype_t)d),
                                        "%s, %s -> %s, %u threads, offset %zu",
                                        zk_variant_name(ex.variant), zs_dtype_name((zs_dtype_t)s),
                                        zs_dtype_name((zs_dtype_t)d), zt_threads[ti], offs[oi]);
                    zk_pool_destroy(pooled.pool);
                }
            }
        }
        free(src);
    }
    free(want);
    free(got);
}

ZT_VARIANT_TESTS(zk_cast, pool_split_is_bit_identical, zt_cast_pool_split)
