/*
 * zk_bench: throughput of every zk kernel and CPU variant at sizes from inside the caches to
 * far beyond them, and its ratio to a memory limit measured in the same process, at the same
 * size and thread count, by a streaming kernel with the same read and written streams
 * (bench/limit.h), or, where lower, the kernel's arithmetic floor with its data in L1 (Adam:
 * its exact formula; the sum of squares: its fixed order; the cast to 16 bits: its rounding to
 * nearest-even, where the streaming limit's cast truncates). Prints each variant's plan
 * (zk_store_plan_variant: regular or non-temporal stores and the prefetch distance, as
 * measured) and what each call used; last, per kernel, the lowest ratio of the default variant
 * over the sizes against the target (0.9). adam_step runs
 * as the daemon runs it: the accumulator kept (its next reduce-scatter overwrites it), the
 * cast copy written only for 16-bit params (fp32 params are the master itself); reduce runs
 * in fp32, as the daemon's reduce-scatter does.
 *
 *   zk_bench [--n N[,N...]] [--threads 1,2] [--reps R] [--dtype bf16|fp16|fp32]
 *            [--variants scalar,avx2,avx512] [--kernels adam_step,sumsq,...]
 *            [--stores auto|regular|nt] [--prefetch D] [--peer FILE] [--limit-only] [--json]
 *
 * --peer pairs each peer line (bench/peers/torch_adamw.py) with adam_step at the peer's own size
 * and thread count; --limit-only times the limits alone (bench/ds_vs_zerod.py's floor).
 */
#include "zk_bench.h"
#include "limit.h"
#include "zk/kernels.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct zb_bufs {
    float *master, *m, *v, *acc; /* fp32 streams */
    void *h0, *h1;               /* dtype streams (dst, src, a/b) */
} zb_bufs_t;

typedef struct zb_ctx {
    const zb_opts_t *o;
    size_t n;
    unsigned reps;
    zb_bufs_t *b;
    zk_exec_t ex;
    zb_kernel_t kernel;
    zb_limit_fn_t limit;
    zb_limit_args_t largs;
    zk_adam_params_t adam;
} zb_ctx_t;

static double zb_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes one call reads and writes per element. */
static double zb_bytes_per_elem(zb_kernel_t k, size_t ds)
{
    switch (k) {
    case ZB_K_ADAM: /* master, m, v, acc read; master, m, v (+ the 16-bit copy) written */
        return 16.0 + 12.0 + (ds == 4 ? 0.0 : (double)ds);
    case ZB_K_SUMSQ:
        return 4.0;
    case ZB_K_ACCUMULATE:
        return 4.0 + (double)ds + 4.0;
    case ZB_K_REDUCE:
        return 3.0 * (double)ds;
    case ZB_K_CAST:
        return 4.0 + (double)ds; /* fp32 -> dtype */
    case ZB_K_WIDEN:
        return (double)ds + 4.0; /* dtype -> fp32: the daemon's first gradient of a bucket */
    case ZB_K_COPY:
        return 2.0 * (double)ds; /* dtype -> dtype: the all-gather's copy of a peer's slice */
    default:
        return 0.0;
    }
}

/* The dtype of kernel k's 16-bit-or-not streams: --dtype, but for reduce fp32, the one the
 * daemon runs (its reduce-scatter sums fp32 accumulators). */
static zs_dtype_t zb_dtype(const zb_opts_t *o, zb_kernel_t k)
{
    return k == ZB_K_REDUCE ? ZS_DTYPE_F32 : o->dtype;
}

static zs_status_t zb_run_kernel(zb_ctx_t *c)
{
    const zb_opts_t *o = c->o;
    zb_bufs_t *b = c->b;
    double s;
    int f;

    switch (c->kernel) {
    case ZB_K_ADAM:
        c->adam.step++;
        /* as the daemon runs it: acc kept, the cast copy only for 16-bit params */
        return zk_adam_step(&c->ex, &c->adam, b->master, b->m, b->v, b->acc,
                            o->dtype == ZS_DTYPE_F32 ? NULL : b->h0, o->dtype, c->n);
    case ZB_K_SUMSQ:
        return zk_sumsq(&c->ex, b->master, c->n, &s, &f);
    case ZB_K_ACCUMULATE:
        return zk_accumulate(&c->ex, b->acc, b->h0, o->dtype, 1e-30f, c->n);
    case ZB_K_REDUCE:
        return zk_reduce(&c->ex, b->acc, b->m, b->v, ZS_DTYPE_F32, c->n); /* out of place */
    case ZB_K_CAST:
        return zk_cast(&c->ex, b->h0, o->dtype, b->master, ZS_DTYPE_F32, c->n);
    case ZB_K_WIDEN:
        return zk_cast(&c->ex, b->acc, ZS_DTYPE_F32, b->h0, o->dtype, c->n);
    case ZB_K_COPY:
        return zk_cast(&c->ex, b->h1, o->dtype, b->h0, o->dtype, c->n);
    default:
        return ZS_ERR_INVALID;
    }
}

static void zb_limit_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    zb_ctx_t *c = arg;

    c->limit(&c->largs, b, e);
}

static void zb_limit_setup(zb_ctx_t *c)
{
    zb_bufs_t *b = c->b;
    size_t ds = zs_dtype_size(c->o->dtype);
    zb_limit_args_t *a = &c->largs;

    memset(a->s, 0, sizeof(a->s));
    a->zero = 0;
    switch (c->kernel) {
    case ZB_K_ADAM:
        *a = (zb_limit_args_t){
            ZB_ADAM, 4, ds == 4 ? 0 : ds, {b->master, b->m, b->v, b->acc, b->h0}, 0, 0, 1, 0};
        break;
    case ZB_K_SUMSQ:
        *a = (zb_limit_args_t){ZB_READ, 4, 0, {b->master}, 0, 0, 0, 0};
        break;
    case ZB_K_ACCUMULATE:
        *a = (zb_limit_args_t){ZB_ACCUMULATE, ds, 4, {b->acc, b->h0}, 0, 0, 0, 0};
        break;
    case ZB_K_REDUCE:
        *a = (zb_limit_args_t){ZB_REDUCE, 4, 4, {b->m, b->v, b->acc}, 0, 0, 0, 0};
        break;
    case ZB_K_CAST:
        *a = (zb_limit_args_t){ZB_CAST, 4, ds, {b->master, b->h0}, 0, 0, 0, 0};
        break;
    case ZB_K_WIDEN:
        *a = (zb_limit_args_t){ZB_CAST, ds, 4, {b->h0, b->acc}, 0, 0, 0, 0};
        break;
    case ZB_K_COPY:
        *a = (zb_limit_args_t){ZB_CAST, ds, ds, {b->h0, b->h1}, 0, 0, 0, 0};
        break;
    default:
        break;
    }
}

/* Best of `reps` timed runs after one warm-up. */
static double zb_time(zb_ctx_t *c, int limit)
{
    double best = INFINITY;

    for (unsigned r = 0; r <= c->reps; r++) {
        double t0, dt;
        zs_status_t st;

        /* Adam keeps acc (keep_acc, as the daemon runs it): the same gradient every run keeps m
         * and v normal. Refreshing acc from a copy before each run, as this did when Adam zeroed
         * it, read 4 MiB outside the working set at 1 Mi elements: 34 MiB against a 32 MiB
         * last-level cache (AMD EPYC VM), where the limit reads only its own 30 */
        t0 = zb_now();
        if (limit) {
            st = zk_pool_run(c->ex.pool, c->n, 1024, zb_limit_chunk, c);
        } else {
            st = zb_run_kernel(c);
        }
        dt = zb_now() - t0;
        if (st != ZS_OK) {
            fprintf(stderr, "zk_bench: %s: %s\n", zb_kernel_names[c->kernel], zk_last_error());
            exit(1);
        }
        if (r > 0 && dt < best) {
            best = dt;
        }
    }
    return best;
}

static void *zb_alloc(size_t bytes)
{
    void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);

    if (p == NULL) {
        fprintf(stderr, "zk_bench: out of memory for %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

static void zb_free_bufs(zb_bufs_t *b)
{
    free(b->master);
    free(b->m);
    free(b->v);
    free(b->acc);
    free(b->h0);
    free(b->h1);
}

static void zb_init_bufs(zb_bufs_t *b, size_t n, zs_dtype_t dt)
{
    uint64_t x = 88172645463325252ull;
    zk_exec_t ex = {.variant = ZK_VARIANT_DEFAULT, .stores = ZK_STORES_REGULAR};

    b->master = zb_alloc(4 * n);
    b->m = zb_alloc(4 * n);
    b->v = zb_alloc(4 * n);
    b->acc = zb_alloc(4 * n);
    b->h0 = zb_alloc(4 * n);
    b->h1 = zb_alloc(4 * n);
    for (size_t i = 0; i < n; i++) {
        float r;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r = (float)((double)(x >> 11) * 0x1.0p-53) - 0.5f;
        b->master[i] = r;
        b->m[i] = 1e-3f * r;
        b->v[i] = 1e-6f * (r * r + 0.1f);
        b->acc[i] = 1e-2f * r;
    }
    /* half-width buffers get valid values of dtype, fp32 ones fp32; with regular stores, since
     * the first call of the store plan's size would measure the plan (seconds, which
     * --limit-only need not spend; the kernels' first timed call measures it otherwise) */
    zk_cast(&ex, b->h0, dt, b->master, ZS_DTYPE_F32, n);
    zk_cast(&ex, b->h1, dt, b->m, ZS_DTYPE_F32, n);
}

/* Timed runs at n elements: as many as take about the time of `reps` runs at 64 Mi, between
 * 2 and 2000. */
static unsigned zb_reps(const zb_opts_t *o, size_t n)
{
    double r = (double)o->reps * (double)((size_t)64 << 20) / (double)n;

    return r < 2.0 ? 2u : r > 2000.0 ? 2000u : (unsigned)r;
}

/* The stores and prefetch zk uses for kernel k at n elements, as its dispatch decides. */
static const char *zb_stores_used(const zb_ctx_t *c)
{
    static const zk_store_family_t fam[ZB_K_COUNT] = {
        ZK_STORE_ADAM, ZK_STORE_READ,  ZK_STORE_ACCUMULATE, ZK_STORE_OUT,
        ZK_STORE_CAST, ZK_STORE_WIDEN, ZK_STORE_COPY};
    static char buf[32];
    size_t bytes = (size_t)(zb_bytes_per_elem(c->kernel, zs_dtype_size(zb_dtype(c->o, c->kernel))) *
                            (double)c->n);
    unsigned pf = zk_store_prefetch(&c->ex, fam[c->kernel], bytes);
    int nt = zk_store_nt(&c->ex, fam[c->kernel], bytes);
    /* the sum of squares: "1blk" where it reads one super-block at a time */
    const char *kind = c->kernel == ZB_K_SUMSQ ? (nt ? "1blk" : "") : nt ? "nt" : "regular";

    if (pf == 0) {
        return kind[0] != '\0' ? kind : "-";
    }
    snprintf(buf, sizeof(buf), "%s%spf%u", kind, kind[0] != '\0' ? "+" : "", pf);
    return buf;
}

typedef struct zb_result {
    double adam_eps[ZB_MAX_LIST][ZB_MAX_LIST]; /* by thread count and size: best adam_step
                                                * elements/s of the variants */
    double low[ZB_MAX_LIST][ZB_K_COUNT];       /* default variant's lowest ratio */
    size_t low_n[ZB_MAX_LIST][ZB_K_COUNT];     /* ... at this n */
} zb_result_t;

static volatile float zb_sink;

typedef struct zb_floor_job {
    int variant;
    int chain;      /* the sum of squares' order floor, not Adam's formula */
    int round;      /* the cast's rounding floor, not Adam's formula */
    zb_copy_t copy; /* Adam's 16-bit copy of the master; the cast's 16-bit type */
} zb_floor_job_t;

static void zb_floor_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zb_floor_job_t *j = arg;

    if (j->chain) {
        zb_sink = (float)(j->variant == ZK_VARIANT_AVX512 ? zb_chain_avx512(e - b)
                                                          : zb_chain_avx2(e - b));
        return;
    }
    if (j->round) {
        zb_sink = j->variant == ZK_VARIANT_AVX512 ? zb_round_avx512(e - b, j->copy)
                                                  : zb_round_avx2(e - b, j->copy);
        return;
    }
    zb_sink = j->variant == ZK_VARIANT_AVX512 ? zb_formula_avx512(e - b, j->copy)
                                              : zb_formula_avx2(e - b, j->copy);
}

/* Best time of Adam's formula floor (or, for the sum of squares, the order floor; for the
 * cast, the rounding floor; limit.h) for c->n elements at variant v's width, on the same
 * threads as the kernel. */
static double zb_floor_time(const zb_ctx_t *c, int v)
{
    zb_floor_job_t j = {.variant = v,
                        .chain = c->kernel == ZB_K_SUMSQ,
                        .round = c->kernel == ZB_K_CAST,
                        .copy = c->o->dtype == ZS_DTYPE_BF16  ? ZB_COPY_BF16
                                : c->o->dtype == ZS_DTYPE_F16 ? ZB_COPY_F16
                                                              : ZB_COPY_NONE};
    double best = INFINITY;

    for (unsigned r = 0; r <= c->reps; r++) {
        double t0 = zb_now(), dt;
        zk_pool_run(c->ex.pool, c->n, 1024, zb_floor_chunk, &j);
        dt = zb_now() - t0;
        if (r > 0 && dt < best) {
            best = dt;
        }
    }
    return best;
}

/* Kernels whose arithmetic has a floor of its own: Adam, the sum of squares, and the cast to
 * 16 bits (fp32 params cast nothing). */
static int zb_has_floor(const zb_ctx_t *c)
{
    return c->kernel == ZB_K_ADAM || c->kernel == ZB_K_SUMSQ ||
           (c->kernel == ZB_K_CAST && c->o->dtype != ZS_DTYPE_F32);
}

/* The limit options at c->n: both stores, and the prefetch distances where the plan is
 * consulted. */
static int zb_limit_options(double bytes)
{
    return 2 * (bytes >= (double)ZK_PREFETCH_MIN_BYTES ? ZK_PREFETCH_CHOICES : 1);
}

/* GB/s of the limit kernel with option j of zb_limit_options(). */
static double zb_limit_gbps(zb_ctx_t *c, double bytes, int j)
{
    c->largs.pf = zk_prefetch_choice(j / 2);
    c->largs.nt = j % 2;
    return bytes / zb_time(c, 1) / 1e9;
}

/* One variant's line. */
static void zb_print_row(const zb_ctx_t *c, int v, unsigned threads, double t, double lim_gbps,
                         const char *bound)
{
    double bytes =
        zb_bytes_per_elem(c->kernel, zs_dtype_size(zb_dtype(c->o, c->kernel))) * (double)c->n;
    double gbps = bytes / t / 1e9;

    if (c->o->json) {
        printf("{\"kernel\": \"%s\", \"variant\": \"%s\", \"threads\": %u, "
               "\"n\": %zu, \"dtype\": \"%s\", \"stores\": \"%s\", \"seconds\": %.6f, "
               "\"gbps\": %.2f, \"limit_gbps\": %.2f, \"bound\": \"%s\", \"ratio\": %.3f}\n",
               zb_kernel_names[c->kernel], zk_variant_name((zk_variant_t)v), threads, c->n,
               zs_dtype_name(zb_dtype(c->o, c->kernel)), zb_stores_used(c), t, gbps, lim_gbps,
               bound, gbps / lim_gbps);
    } else {
        printf("%-11s %-7s %7u %10zu %-14s %9.3f %10.3f %8.1f %8.1f %-8s %6.3f\n",
               zb_kernel_names[c->kernel], zk_variant_name((zk_variant_t)v), threads, c->n,
               zb_stores_used(c), (double)c->n / t / 1e9, t * 1e3, gbps, lim_gbps, bound,
               gbps / lim_gbps);
    }
    fflush(stdout);
}

/* The limit's line (--limit-only): its best option (stores, prefetch) and its rate. */
static void zb_print_limit(const zb_ctx_t *c, unsigned threads, double bytes, double gbps,
                           int best_j)
{
    unsigned pf = zk_prefetch_choice(best_j / 2);
    char stores[32];
    double t = bytes / gbps / 1e9;

    if (pf == 0) {
        snprintf(stores, sizeof(stores), "%s", best_j % 2 ? "nt" : "regular");
    } else {
        snprintf(stores, sizeof(stores), "%s+pf%u", best_j % 2 ? "nt" : "regular", pf);
    }
    if (c->o->json) {
        printf("{\"kernel\": \"%s\", \"variant\": \"limit\", \"threads\": %u, \"n\": %zu, "
               "\"dtype\": \"%s\", \"stores\": \"%s\", \"seconds\": %.6f, \"gbps\": %.2f, "
               "\"limit_gbps\": %.2f, \"bound\": \"memory\"}\n",
               zb_kernel_names[c->kernel], threads, c->n, zs_dtype_name(zb_dtype(c->o, c->kernel)),
               stores, t, gbps, gbps);
    } else {
        printf("%-11s %-7s %7u %10zu %-14s %9.3f %10.3f %8.1f %8.1f %-8s %6s\n",
               zb_kernel_names[c->kernel], "limit", threads, c->n, stores, (double)c->n / t / 1e9,
               t * 1e3, gbps, gbps, "memory", "-");
    }
    fflush(stdout);
}

/* One kernel at one size and thread count: the limit and each variant, in ZB_ROUNDS rounds
 * that alternate them (the best of each kept), so that a machine whose speed drifts over
 * seconds moves both sides alike; then one line per variant. */
#define ZB_ROUNDS 3
static void zb_measure(zb_ctx_t *c, unsigned ti, unsigned ni, unsigned threads, zb_result_t *res)
{
    const zb_opts_t *o = c->o;
    double bytes =
        zb_bytes_per_elem(c->kernel, zs_dtype_size(zb_dtype(o, c->kernel))) * (double)c->n;
    double stream_gbps = 0, t[ZK_VARIANT_COUNT], floor_t[ZK_VARIANT_COUNT];
    unsigned reps = c->reps;
    int best_j = 0;

    zb_limit_setup(c);
    c->reps = reps / ZB_ROUNDS > 1 ? reps / ZB_ROUNDS : 1;
    for (int v = 0; v < ZK_VARIANT_COUNT; v++) {
        t[v] = floor_t[v] = INFINITY;
    }
    for (int round = 0; round < ZB_ROUNDS; round++) {
        /* each limit option, each followed by one timing of every variant (and its floor):
         * the limit is the best of its options, and on a noisy machine the best of more
         * timings is a faster one, so every side gets as many timings as the limit */
        for (int j = 0; j < zb_limit_options(bytes); j++) {
            double gbps = zb_limit_gbps(c, bytes, j);
            if (gbps > stream_gbps) {
                stream_gbps = gbps;
                best_j = j;
            }
            for (int v = 0; v < ZK_VARIANT_COUNT && !o->limit_only; v++) {
                if (!o->variants[v] || !zk_variant_supported((zk_variant_t)v)) {
                    continue;
                }
                c->ex.variant = v;
                t[v] = fmin(t[v], zb_time(c, 0));
                if (zb_has_floor(c) && v != ZK_VARIANT_SCALAR) {
                    floor_t[v] = fmin(floor_t[v], zb_floor_time(c, v));
                }
            }
        }
    }
    c->reps = reps;
    if (o->limit_only) {
        zb_print_limit(c, threads, bytes, stream_gbps, best_j);
        return;
    }
    for (int v = 0; v < ZK_VARIANT_COUNT; v++) {
        double lim_gbps = stream_gbps, ratio;
        const char *bound = "memory";

        if (!o->variants[v] || !zk_variant_supported((zk_variant_t)v)) {
            continue;
        }
        /* the arithmetic's own floor, in L1 (Adam, the sum of squares) */
        if (isfinite(floor_t[v]) && bytes / floor_t[v] / 1e9 < lim_gbps) {
            lim_gbps = bytes / floor_t[v] / 1e9;
            bound = c->kernel == ZB_K_ADAM   ? "formula"
                    : c->kernel == ZB_K_CAST ? "rounding"
                                             : "order";
        }
        c->ex.variant = v;
        ratio = bytes / t[v] / 1e9 / lim_gbps;
        if (c->kernel == ZB_K_ADAM && (double)c->n / t[v] > res->adam_eps[ti][ni]) {
            res->adam_eps[ti][ni] = (double)c->n / t[v];
        }
        if (v == (int)zk_default_variant() && ratio < res->low[ti][c->kernel]) {
            res->low[ti][c->kernel] = ratio;
            res->low_n[ti][c->kernel] = c->n;
        }
        zb_print_row(c, v, threads, t[v], lim_gbps, bound);
    }
}

static void zb_verdict(const zb_opts_t *o, const zb_result_t *res)
{
    const char *dv = zk_variant_name(zk_default_variant());

    for (unsigned ti = 0; ti < o->n_threads; ti++) {
        for (int k = 0; k < ZB_K_COUNT; k++) {
            double low = res->low[ti][k];
            if (!o->kernels[k] || !o->variants[zk_default_variant()] || isinf(low)) {
                continue;
            }
            if (o->json) {
                printf("{\"verdict\": \"%s\", \"variant\": \"%s\", \"threads\": %u, "
                       "\"lowest_ratio\": %.3f, \"at_n\": %zu, \"target\": %.2f, \"ok\": %s}\n",
                       zb_kernel_names[k], dv, o->threads[ti], low, res->low_n[ti][k], ZB_TARGET,
                       low >= ZB_TARGET ? "true" : "false");
            } else {
                printf("%-11s %-7s %u thread%s: lowest ratio %.3f (at n = %zu), target %.2f: %s\n",
                       zb_kernel_names[k], dv, o->threads[ti], o->threads[ti] > 1 ? "s" : "", low,
                       res->low_n[ti][k], ZB_TARGET, low >= ZB_TARGET ? "ok" : "BELOW");
            }
        }
    }
}

/* The index of x in list[0, count), or -1. */
static int zb_index(const size_t *list, unsigned count, size_t x)
{
    for (unsigned i = 0; i < count; i++) {
        if (list[i] == x) {
            return (int)i;
        }
    }
    return -1;
}

/* adam_step against each peer line at the peer's own size and thread count: a peer's rate at
 * 4 Mi elements (in cache on some machines) says nothing of ours at 64 Mi. A peer line whose
 * size or thread count zk_bench did not run says so instead. */
static void zb_peers_compare(const zb_opts_t *o, const zb_result_t *res, const zb_peer_t *peers,
                             unsigned n_peers)
{
    size_t threads[ZB_MAX_LIST];

    for (unsigned ti = 0; ti < o->n_threads; ti++) {
        threads[ti] = o->threads[ti];
    }
    for (unsigned pi = 0; pi < n_peers && o->kernels[ZB_K_ADAM] && !o->limit_only; pi++) {
        const zb_peer_t *pe = &peers[pi];
        int ni = zb_index(o->ns, o->n_ns, pe->n);
        int ti = zb_index(threads, o->n_threads, pe->threads);
        double eps = ni >= 0 && ti >= 0 ? res->adam_eps[ti][ni] : 0.0;
        const char *s = pe->threads > 1 ? "s" : "";

        if (eps <= 0.0 && o->json) {
            printf("{\"kernel\": \"adam_step\", \"peer\": \"%s\", \"threads\": %u, \"n\": %zu, "
                   "\"elements_per_s\": null, \"peer_elements_per_s\": %.0f, \"speedup\": null, "
                   "\"ok\": null}\n",
                   pe->name, pe->threads, pe->n, pe->eps);
        } else if (eps <= 0.0) {
            printf("adam_step vs %s (%u thread%s, n = %zu): not compared, zk_bench ran no "
                   "adam_step at this size and thread count (--n, --threads)\n",
                   pe->name, pe->threads, s, pe->n);
        } else if (o->json) {
            printf("{\"kernel\": \"adam_step\", \"peer\": \"%s\", \"threads\": %u, \"n\": %zu, "
                   "\"elements_per_s\": %.0f, \"peer_elements_per_s\": %.0f, \"speedup\": %.2f, "
                   "\"ok\": %s}\n",
                   pe->name, pe->threads, pe->n, eps, pe->eps, eps / pe->eps,
                   eps >= pe->eps ? "true" : "false");
        } else {
            printf("adam_step vs %s (%u thread%s, n = %zu): %.3g vs %.3g elements/s = %.2fx: %s\n",
                   pe->name, pe->threads, s, pe->n, eps, pe->eps, eps / pe->eps,
                   eps >= pe->eps ? "ok" : "BELOW the peer");
        }
    }
}

/* The limit kernel has the vector width of the default variant (the widest this CPU runs, or
 * ZEROD_KERNELS): a CPU without AVX-512 measures its limit with AVX2, and ZEROD_KERNELS=avx2
 * judges the AVX2 kernels as such a CPU would. */
static zb_limit_fn_t zb_limit_kernel(const char **isa_p)
{
    if (zk_default_variant() == ZK_VARIANT_AVX512) {
        *isa_p = "avx512";
        return zb_limit_avx512;
    }
    if (zk_variant_supported(ZK_VARIANT_AVX2)) {
        *isa_p = "avx2";
        return zb_limit_avx2;
    }
    fprintf(stderr, "zk_bench: the memory-limit kernels need AVX2 at least\n");
    exit(1);
}

static void zb_header(const zb_opts_t *o, const char *limit_isa)
{
    const char *stores = o->stores == ZK_STORES_AUTO ? "auto"
                         : o->stores == ZK_STORES_NT ? "nt"
                                                     : "regular";

    if (!o->json) {
        printf("zk_bench: dtype %s, limit kernel %s, default variant %s\n", zs_dtype_name(o->dtype),
               limit_isa, zk_variant_name(zk_default_variant()));
    }
    for (int v = 0; v < ZK_VARIANT_COUNT; v++) { /* each variant measured has its own plan */
        const zk_store_plan_t *plan;
        if (!o->variants[v] || v == ZK_VARIANT_SCALAR || o->limit_only ||
            (plan = zk_store_plan_variant((zk_variant_t)v)) == NULL) {
            continue;
        }
        if (o->json) {
            printf("{\"variant\": \"%s\", \"store_plan\": \"%s\", \"nt_min_bytes\": %zu, "
                   "\"stores\": \"%s\", \"families\": {",
                   zk_variant_name((zk_variant_t)v), plan->how, plan->nt_min_bytes, stores);
            for (int f = 0; f < ZK_STORE_FAMILIES; f++) { /* SIZE_MAX (never) as -1 */
                printf("%s\"%s\": {\"nt\": %d, \"nt_from\": %lld, \"nt_to\": %lld, "
                       "\"prefetch\": [%u, %u], \"prefetch_from\": %lld}",
                       f > 0 ? ", " : "", zk_store_family_name((zk_store_family_t)f), plan->nt[f],
                       plan->nt_from[f] == SIZE_MAX ? -1LL : (long long)plan->nt_from[f],
                       plan->nt_to[f] == SIZE_MAX ? -1LL : (long long)plan->nt_to[f],
                       plan->prefetch[f][0], plan->prefetch[f][1],
                       plan->pf_from[f] == SIZE_MAX ? -1LL : (long long)plan->pf_from[f]);
            }
            printf("}}\n");
        } else {
            printf("plan %s: %s%s\n", zk_variant_name((zk_variant_t)v), plan->how,
                   o->stores == ZK_STORES_AUTO ? "" : " (overridden by --stores)");
        }
    }
    if (!o->json) {
        printf("%-11s %-7s %7s %10s %-14s %9s %10s %8s %8s %-8s %6s\n", "kernel", "variant",
               "threads", "n", "stores", "Gelem/s", "time [ms]", "GB/s", "limit", "bound", "ratio");
    }
}

int main(int argc, char **argv)
{
    zb_opts_t o;
    zb_bufs_t bufs;
    zb_result_t res = {0};
    zb_limit_fn_t limit;
    const char *limit_isa = NULL;
    zb_peer_t peers[ZB_MAX_PEERS];
    unsigned n_peers = 0;

    if (zb_parse(argc, argv, &o) != 0) {
        return 2;
    }
    if (o.peer != NULL) {
        n_peers = zb_peers_read(o.peer, peers);
    }
    limit = zb_limit_kernel(&limit_isa);
    o.n_max = 0;
    for (unsigned i = 0; i < o.n_ns; i++) {
        o.n_max = o.ns[i] > o.n_max ? o.ns[i] : o.n_max;
    }
    for (unsigned ti = 0; ti < ZB_MAX_LIST; ti++) {
        for (int k = 0; k < ZB_K_COUNT; k++) {
            res.low[ti][k] = INFINITY;
        }
    }
    zb_init_bufs(&bufs, o.n_max, o.dtype);
    zb_header(&o, limit_isa);
    for (unsigned ti = 0; ti < o.n_threads; ti++) {
        zk_pool_t *pool = NULL;

        if (o.threads[ti] > 1 && zk_pool_create(o.threads[ti], &pool) != ZS_OK) {
            fprintf(stderr, "zk_bench: zk_pool_create(%u): %s\n", o.threads[ti], zk_last_error());
            zb_free_bufs(&bufs);
            return 1;
        }
        for (int k = 0; k < ZB_K_COUNT; k++) {
            for (unsigned ni = 0; ni < o.n_ns && o.kernels[k]; ni++) {
                zb_ctx_t c = {.o = &o, .b = &bufs, .kernel = (zb_kernel_t)k, .limit = limit};
                c.n = o.ns[ni];
                c.reps = zb_reps(&o, c.n);
                c.ex.pool = pool;
                c.ex.stores = o.stores;
                c.ex.prefetch = o.prefetch;
                c.adam = (zk_adam_params_t){.lr = 1e-4f,
                                            .beta1 = 0.9f,
                                            .beta2 = 0.999f,
                                            .eps = 1e-8f,
                                            .weight_decay = 0.01f,
                                            .adam_w_mode = 1,
                                            .bias_correction = 1,
                                            .grad_scale = 1.0f,
                                            .keep_acc = 1};
                zb_measure(&c, ti, ni, o.threads[ti], &res);
            }
        }
        zk_pool_destroy(pool);
    }
    zb_verdict(&o, &res);
    zb_peers_compare(&o, &res, peers, n_peers);
    zb_free_bufs(&bufs);
    return 0;
}
