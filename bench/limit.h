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

/* Adam's arithmetic floor: n elements of the exact formula (zk/elem.h) with the data in L1,
 * at the vector width of the variant; returns a value so that nothing is optimised away.
 * Exact Adam needs, per element, one square root, one division and about 20 other operations
 * (NaN made canonical included); with its data in cache no Adam can go faster than this, so
 * its limit is the lower of this and the streaming limit. */
float zb_formula_avx512(size_t n);
float zb_formula_avx2(size_t n);

/* The order floor of the sum of squares (zk/kernels.h): each of its 16 lanes adds its
 * squares one after another, so n elements cost n / 16 dependent double additions per lane,
 * whatever the vector width (VL / 2 lanes per vector, 32 / VL chains); in registers, no
 * conversion, no memory. zk_sumsq cannot go faster than this with its data in L1. */
#define ZB_SUMSQ_LANES 16
double zb_chain_avx512(size_t n);
double zb_chain_avx2(size_t n);

#endif
