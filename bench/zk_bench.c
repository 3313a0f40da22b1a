/*
 * zk_bench: throughput of every zk kernel and CPU variant at a size beyond the caches, and
 * its ratio to a memory limit measured in the same process by a streaming kernel with the
 * same read and written streams (bench/limit.h).
 *
 *   zk_bench [--n N] [--threads 1,2] [--reps R] [--dtype bf16|fp16|fp32]
 *            [--variants scalar,avx2,avx512] [--kernels adam_step,sumsq,...]
 *            [--peer FILE] [--json]
 */
#include "limit.h"
#include "zk/kernels.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ZB_MAX_LIST 8

typedef enum zb_kernel {
    ZB_K_ADAM,
    ZB_K_SUMSQ,
    ZB_K_ACCUMULATE,
    ZB_K_REDUCE,
    ZB_K_CAST,
    ZB_K_COUNT
} zb_kernel_t;

static const char *const zb_kernel_names[ZB_K_COUNT] = {"adam_step", "sumsq", "accumulate",
                                                        "reduce", "cast"};

typedef struct zb_opts {
    size_t n;
    unsigned threads[ZB_MAX_LIST];
    unsigned n_threads;
    unsigned reps;
    zs_dtype_t dtype;
    int variants[ZK_VARIANT_COUNT]; /* selected */
    int kernels[ZB_K_COUNT];
    const char *peer;
    int json;
} zb_opts_t;

typedef struct zb_bufs {
    float *master, *m, *v, *acc; /* fp32 streams */
    void *h0, *h1;               /* dtype streams (dst, src, a/b) */
} zb_bufs_t;

typedef struct zb_ctx {
    const zb_opts_t *o;
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
    case ZB_K_ADAM:
        return 16.0 + 16.0 + (double)ds; /* master, m, v, acc read; same + dst written */
    case ZB_K_SUMSQ:
        return 4.0;
    case ZB_K_ACCUMULATE:
        return 4.0 + (double)ds + 4.0;
    case ZB_K_REDUCE:
        return 3.0 * (double)ds;
    case ZB_K_CAST:
        return 4.0 + (double)ds; /* fp32 -> dtype */
    default:
        return 0.0;
    }
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
        return zk_adam_step(&c->ex, &c->adam, b->master, b->m, b->v, b->acc, b->h0, o->dtype, o->n);
    case ZB_K_SUMSQ:
        return zk_sumsq(&c->ex, b->master, o->n, &s, &f);
    case ZB_K_ACCUMULATE:
        return zk_accumulate(&c->ex, b->acc, b->h0, o->dtype, 1e-30f, o->n);
    case ZB_K_REDUCE:
        return zk_reduce(&c->ex, b->h1, b->h0, b->h1, o->dtype, o->n);
    case ZB_K_CAST:
        return zk_cast(&c->ex, b->h0, o->dtype, b->master, ZS_DTYPE_F32, o->n);
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
        *a = (zb_limit_args_t){ZB_ADAM, 4, ds, {b->master, b->m, b->v, b->acc, b->h0}, 0, 0};
        break;
    case ZB_K_SUMSQ:
        *a = (zb_limit_args_t){ZB_READ, 4, 0, {b->master}, 0, 0};
        break;
    case ZB_K_ACCUMULATE:
        *a = (zb_limit_args_t){ZB_ACCUMULATE, ds, 4, {b->acc, b->h0}, 0, 0};
        break;
    case ZB_K_REDUCE:
        *a = (zb_limit_args_t){ZB_REDUCE, ds, ds, {b->h1, b->h0, b->h1}, 0, 0};
        break;
    case ZB_K_CAST:
        *a = (zb_limit_args_t){ZB_CAST, 4, ds, {b->master, b->h0}, 0, 0};
        break;
    default:
        break;
    }
}

/* Best of `reps` timed runs after one warm-up. */
static double zb_time(zb_ctx_t *c, int limit)
{
    double best = INFINITY;

    for (unsigned r = 0; r <= c->o->reps; r++) {
        double t0 = zb_now(), dt;
        zs_status_t st;

        if (limit) {
            st = zk_pool_run(c->ex.pool, c->o->n, 1024, zb_limit_chunk, c);
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

static void zb_init_bufs(zb_bufs_t *b, size_t n, zs_dtype_t dt)
{
    uint64_t x = 88172645463325252ull;

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
    /* half-width buffers get valid values of dtype, fp32 ones fp32 */
    zk_cast(NULL, b->h0, dt, b->master, ZS_DTYPE_F32, n);
    zk_cast(NULL, b->h1, dt, b->m, ZS_DTYPE_F32, n);
}

/* The peer's elements/s from bench/peers/torch_adamw.py's JSON line, or < 0. */
static double zb_peer_eps(const char *path, unsigned *threads_p)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    double eps = -1.0;

    if (f == NULL) {
        fprintf(stderr, "zk_bench: --peer %s: %m\n", path);
        exit(2);
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "\"elements_per_s\":");
        const char *t = strstr(line, "\"threads\":");
        if (p != NULL) {
            eps = strtod(p + strlen("\"elements_per_s\":"), NULL);
            *threads_p = t != NULL ? (unsigned)strtoul(t + strlen("\"threads\":"), NULL, 10) : 1;
        }
    }
    fclose(f);
    return eps;
}

static int zb_parse_list(const char *arg, const char *const *names, int count, int *sel)
{
    char buf[256];
    char *save = NULL;

    snprintf(buf, sizeof(buf), "%s", arg);
    memset(sel, 0, sizeof(int) * (size_t)count);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int i;
        for (i = 0; i < count && strcmp(tok, names[i]) != 0; i++) {
        }
        if (i == count) {
            fprintf(stderr, "zk_bench: unknown name '%s'\n", tok);
            return -1;
        }
        sel[i] = 1;
    }
    return 0;
}

static void zb_usage(FILE *out)
{
    fprintf(out, "usage: zk_bench [options]\n"
                 "  --n N            elements per call (default 67108864 = 64 Mi)\n"
                 "  --threads LIST   thread counts, e.g. 1,2 (default 1)\n"
                 "  --reps R         timed runs per measurement, best kept (default 5)\n"
                 "  --dtype T        param dtype: bf16 (default), fp16, fp32\n"
                 "  --variants LIST  scalar,avx2,avx512 (default: all this CPU supports)\n"
                 "  --kernels LIST   adam_step,sumsq,accumulate,reduce,cast (default all)\n"
                 "  --peer FILE      JSON line of bench/peers/torch_adamw.py: print the speedup\n"
                 "  --json           one JSON object per line\n"
                 "  --help           this text\n");
}

static int zb_parse(int argc, char **argv, zb_opts_t *o)
{
    static const struct option longopts[] = {
        {"n", required_argument, NULL, 'n'},        {"threads", required_argument, NULL, 't'},
        {"reps", required_argument, NULL, 'r'},     {"dtype", required_argument, NULL, 'd'},
        {"variants", required_argument, NULL, 'v'}, {"kernels", required_argument, NULL, 'k'},
        {"peer", required_argument, NULL, 'p'},     {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
    static const char *const vnames[ZK_VARIANT_COUNT] = {"scalar", "avx2", "avx512"};
    int c;

    *o = (zb_opts_t){
        .n = (size_t)64 << 20, .threads = {1}, .n_threads = 1, .reps = 5, .dtype = ZS_DTYPE_BF16};
    for (int v = 0; v < ZK_VARIANT_COUNT; v++) {
        o->variants[v] = 1;
    }
    for (int k = 0; k < ZB_K_COUNT; k++) {
        o->kernels[k] = 1;
    }
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'n':
            o->n = strtoull(optarg, &end, 0);
            if (*end != '\0' || o->n == 0) {
                fprintf(stderr, "zk_bench: --n wants a positive count, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 't': {
            char buf[128];
            char *save = NULL;
            snprintf(buf, sizeof(buf), "%s", optarg);
            o->n_threads = 0;
            for (char *tok = strtok_r(buf, ",", &save); tok != NULL;
                 tok = strtok_r(NULL, ",", &save)) {
                unsigned long t = strtoul(tok, &end, 10);
                if (*end != '\0' || t == 0 || t > 1024 || o->n_threads == ZB_MAX_LIST) {
                    fprintf(stderr, "zk_bench: bad --threads '%s'\n", optarg);
                    return -1;
                }
                o->threads[o->n_threads++] = (unsigned)t;
            }
            if (o->n_threads == 0) {
                fprintf(stderr, "zk_bench: empty --threads\n");
                return -1;
            }
            break;
        }
        case 'r':
            o->reps = (unsigned)strtoul(optarg, &end, 10);
            if (*end != '\0' || o->reps == 0) {
                fprintf(stderr, "zk_bench: --reps wants a positive count, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'd':
            if (strcmp(optarg, "bf16") == 0) {
                o->dtype = ZS_DTYPE_BF16;
            } else if (strcmp(optarg, "fp16") == 0) {
                o->dtype = ZS_DTYPE_F16;
            } else if (strcmp(optarg, "fp32") == 0) {
                o->dtype = ZS_DTYPE_F32;
            } else {
                fprintf(stderr, "zk_bench: --dtype wants bf16, fp16 or fp32, got '%s'\n", optarg);
                return -1;
            }
            break;
        case 'v':
            if (zb_parse_list(optarg, vnames, ZK_VARIANT_COUNT, o->variants) != 0) {
                return -1;
            }
            break;
        case 'k':
            if (zb_parse_list(optarg, zb_kernel_names, ZB_K_COUNT, o->kernels) != 0) {
                return -1;
            }
            break;
        case 'p':
            o->peer = optarg;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'h':
            zb_usage(stdout);
            exit(0);
        default:
            zb_usage(stderr);
            return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "zk_bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    zb_opts_t o;
    zb_bufs_t bufs;
    zb_limit_fn_t limit;
    const char *limit_isa;
    double adam_eps[ZB_MAX_LIST] = {0};
    double peer_eps = -1.0;
    unsigned peer_threads = 1;

    if (zb_parse(argc, argv, &o) != 0) {
        return 2;
    }
    if (o.peer != NULL) {
        peer_eps = zb_peer_eps(o.peer, &peer_threads);
    }
    if (zk_variant_supported(ZK_VARIANT_AVX512)) {
        limit = zb_limit_avx512;
        limit_isa = "avx512";
    } else if (zk_variant_supported(ZK_VARIANT_AVX2)) {
        limit = zb_limit_avx2;
        limit_isa = "avx2";
    } else {
        fprintf(stderr, "zk_bench: the memory-limit kernels need AVX2 at least\n");
        return 1;
    }
    zb_init_bufs(&bufs, o.n, o.dtype);
    if (!o.json) {
        printf("zk_bench: n = %zu elements, dtype %s, best of %u, limit kernel %s\n", o.n,
               zs_dtype_name(o.dtype), o.reps, limit_isa);
        printf("%-11s %-7s %7s %12s %10s %9s %12s %6s\n", "kernel", "variant", "threads", "Gelem/s",
               "time [ms]", "GB/s", "limit GB/s", "ratio");
    }
    for (unsigned ti = 0; ti < o.n_threads; ti++) {
        unsigned threads = o.threads[ti];
        zk_pool_t *pool = NULL;

        if (threads > 1 && zk_pool_create(threads, &pool) != ZS_OK) {
            fprintf(stderr, "zk_bench: zk_pool_create(%u): %s\n", threads, zk_last_error());
            return 1;
        }
        for (int k = 0; k < ZB_K_COUNT; k++) {
            zb_ctx_t c = {.o = &o, .b = &bufs, .kernel = (zb_kernel_t)k, .limit = limit};
            double bytes = zb_bytes_per_elem((zb_kernel_t)k, zs_dtype_size(o.dtype)) * (double)o.n;
            double lim_gbps;

            if (!o.kernels[k]) {
                continue;
            }
            c.ex.pool = pool;
            c.adam = (zk_adam_params_t){.lr = 1e-4f,
                                        .beta1 = 0.9f,
                                        .beta2 = 0.999f,
                                        .eps = 1e-8f,
                                        .weight_decay = 0.01f,
                                        .adam_w_mode = 1,
                                        .bias_correction = 1,
                                        .step = 0,
                                        .grad_scale = 1.0f};
            zb_limit_setup(&c);
            c.largs.nt = 0;
            lim_gbps = bytes / zb_time(&c, 1) / 1e9;
            c.largs.nt = 1;
            lim_gbps = fmax(lim_gbps, bytes / zb_time(&c, 1) / 1e9);

            for (int v = 0; v < ZK_VARIANT_COUNT; v++) {
                double t, gbps;

                if (!o.variants[v] || !zk_variant_supported((zk_variant_t)v)) {
                    continue;
                }
                c.ex.variant = v;
                t = zb_time(&c, 0);
                gbps = bytes / t / 1e9;
                if (k == ZB_K_ADAM && (double)o.n / t > adam_eps[ti]) {
                    adam_eps[ti] = (double)o.n / t;
                }
                if (o.json) {
                    printf("{\"kernel\": \"%s\", \"variant\": \"%s\", \"threads\": %u, "
                           "\"n\": %zu, \"dtype\": \"%s\", \"seconds\": %.6f, \"gbps\": %.2f, "
                           "\"limit_gbps\": %.2f, \"ratio\": %.3f}\n",
                           zb_kernel_names[k], zk_variant_name((zk_variant_t)v), threads, o.n,
                           zs_dtype_name(o.dtype), t, gbps, lim_gbps, gbps / lim_gbps);
                } else {
                    printf("%-11s %-7s %7u %12.3f %10.2f %9.1f %12.1f %6.3f\n", zb_kernel_names[k],
                           zk_variant_name((zk_variant_t)v), threads, (double)o.n / t / 1e9,
                           t * 1e3, gbps, lim_gbps, gbps / lim_gbps);
                }
                fflush(stdout);
            }
        }
        zk_pool_destroy(pool);
    }
    if (peer_eps > 0.0) {
        for (unsigned ti = 0; ti < o.n_threads; ti++) {
            if (adam_eps[ti] <= 0.0) {
                continue;
            }
            if (o.json) {
                printf("{\"kernel\": \"adam_step\", \"peer\": \"torch_adamw\", \"threads\": %u, "
                       "\"peer_threads\": %u, \"elements_per_s\": %.0f, "
                       "\"peer_elements_per_s\": %.0f, \"speedup\": %.1f}\n",
                       o.threads[ti], peer_threads, adam_eps[ti], peer_eps,
                       adam_eps[ti] / peer_eps);
            } else {
                printf("adam_step (%u thread%s) vs torch.optim.AdamW(foreach=True) (%u thread%s): "
                       "%.3g vs %.3g elements/s = %.1fx\n",
                       o.threads[ti], o.threads[ti] > 1 ? "s" : "", peer_threads,
                       peer_threads > 1 ? "s" : "", adam_eps[ti], peer_eps,
                       adam_eps[ti] / peer_eps);
            }
        }
    }
    return 0;
}
