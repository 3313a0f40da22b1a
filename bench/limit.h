/*
 * zk_bench memory limit: streaming kernels with exactly the read and written streams of the
 * kernel measured (same element widths, same vector width, stores either all regular or all
 * non-temporal), doing no arithmetic beyond keeping the data live, with or without a software
 * prefetch. The limit of a kernel is the fastest of the store types and prefetch distances
 * its kernels may use, so a kernel cannot look good by choosing an option its limit did not
 * try.
 */
#ifndef ZK_BENCH_LIMIT_H
#define ZK_BENCH_LIMIT_H

#include <stddef.h>

typedef enum zb_pattern {
    ZB_ADAM,       /* read master, m, v, acc (fp32); write them + dst (wsize bytes, 0 = none) */
    ZB_READ,       /* read x (fp32) */
    ZB_ACCUMULATE, /* read acc (fp32), src (rsize); write acc */
    ZB_REDUCE,     /* read a, b (rsize); write dst (rsize) */
    ZB_CAST,       /* read src (rsize); write dst (wsize) */
} zb_pattern_t;

typedef struct zb_limit_args {
    zb_pattern_t pattern;
    size_t rsize, wsize; /* element widths, 2 or 4 (wsize 0: ZB_ADAM without dst) */
    void *s[5];          /* streams, in the order listed above */
    int nt;              /* non-temporal stores */
    unsigned zero;       /* 0, opaque to the compiler */
    int keep_acc;        /* ZB_ADAM: acc is read, not written (the daemon's Adam) */
    unsigned pf;         /* software prefetch of each read stream, elements ahead (0: none) */
} zb_limit_args_t;

/* Run the pattern over elements [b, e) (whole vectors; e - b a multiple of 16). */
typedef void (*zb_limit_fn_t)(const zb_limit_args_t *a, size_t b, size_t e);

void zb_limit_avx512(const zb_limit_args_t *a, size_t b, size_t e);
void zb_limit_avx2(const zb_limit_args_t *a, size_t b, size_t e);

/* The 16-bit copy Adam writes of the new master (none for fp32 params). */
typedef enum zb_copy {
    ZB_COPY_NONE,
    ZB_COPY_BF16,
    ZB_COPY_F16,
    ZB_COPY_BF16_HW, /* internal to the floor: bf16 by the AVX512_BF16 instruction */
} zb_copy_t;

/* Adam's arithmetic floor: n elements of the exact formula (zk/elem.h) with the data in L1,
 * at the vector width of the variant, with the exact cast of the new master into its 16-bit
 * copy where the params have one; returns a value so that nothing is optimised away.
 * Exact Adam needs, per element, one square root, one division and about 20 other operations
 * (NaN made canonical included), and the cast a few more; with its data in cache no Adam can
 * go faster than this, so its limit is the lower of this and the streaming limit. */
float zb_formula_avx512(size_t n, zb_copy_t copy);
float zb_formula_avx2(size_t n, zb_copy_t copy);

/* The rounding floor of the cast to 16 bits: n fp32 elements rounded to nearest-even into
 * their 16-bit copy (BF16F, or the AVX512_BF16 instruction where the CPU has it; F16F), with
 * the kernels' NaN test once per two vectors, over ZB_L1_N elements kept in L1. The streaming
 * limit's own cast truncates (its values are arbitrary bits); with its data in cache no exact
 * cast can go faster than this, so its limit is the lower of this and the streaming limit. */
float zb_round_avx512(size_t n, zb_copy_t copy);
float zb_round_avx2(size_t n, zb_copy_t copy);

/* The order floor of the sum of squares (zk/kernels.h): each of its 16 lanes adds its
 * squares one after another, so n elements cost n / 16 dependent double additions per lane,
 * whatever the vector width (VL / 2 lanes per vector, 32 / VL chains); in registers, no
 * conversion, no memory. zk_sumsq cannot go faster than this with its data in L1. */
#define ZB_SUMSQ_LANES 16
double zb_chain_avx512(size_t n);
double zb_chain_avx2(size_t n);

#endif
