/*
 * zk_gpu_check: the CUDA kernels against the CPU scalar reference on random data (odd sizes,
 * NaN/inf injected), then fused Adam timed against a device-to-device copy of the same byte
 * count. Exit 0: all checks passed; 1: a mismatch or CUDA error; 3: no GPU.
 * Run by bench/gpu/check.sh.
 */
#include "zk/elem.h"
#include "zk/kernels.h"
#include "zk/kernels_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "zk_gpu_check: %s: %s\n", #call, cudaGetErrorString(e_));              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define ZK(call)                                                                                   \
    do {                                                                                           \
        zs_status_t s_ = (call);                                                                   \
        if (s_ != ZS_OK) {                                                                         \
            fprintf(stderr, "zk_gpu_check: %s: %s\n", #call, zk_last_error());                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng = 0x2545f4914f6cdd1dull;
static int failures;

static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static float lrand(int lo, int hi)
{
    float m = (float)exp2(lo + (hi - lo) * urand());
    return urand() < 0.5 ? -m : m;
}

static void *dev(size_t bytes)
{
    void *p = NULL;

    CK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void fail(const char *what, size_t n, size_t i, double got, double want)
{
    if (failures++ < 20) {
        fprintf(stderr, "MISMATCH %s n=%zu at %zu: gpu %.9g cpu %.9g\n", what, n, i, got, want);
    }
}

/* off: the arrays start that many elements into their allocations (1: not 16-byte aligned,
 * the kernel's one-element path; 0: its four-element path) */
static void check_adam(size_t n, int dt, int adamw, size_t off)
{
    zk_exec_t cpu = {.variant = ZK_VARIANT_SCALAR, .pool = NULL};
    zk_adam_params_t P = {.lr = 1e-3f,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = 0.01f,
                          .adam_w_mode = adamw,
                          .bias_correction = 1,
                          .step = 7,
                          .grad_scale = 0.5f};
    size_t ds = dt < 0 ? 4 : zs_dtype_size((zs_dtype_t)dt);
    float *h[4], *g[4], *d_[4];
    void *hd = calloc(n + 1, 4), *gd = calloc(n + 1, 4), *dd0 = dev(4 * n + 16);
    void *dd = (char *)dd0 + off * ds;
    float *dp[4];
    char what[64];

    for (int s = 0; s < 4; s++) {
        h[s] = malloc(4 * n + 4);
        g[s] = malloc(4 * n + 4);
        d_[s] = dev(4 * n + 16);
        dp[s] = d_[s] + off;
    }
    for (size_t i = 0; i < n; i++) {
        h[0][i] = lrand(-8, 1);
        h[1][i] = lrand(-12, -3);
        h[2][i] = h[1][i] * h[1][i] * (float)(1.0 + 50.0 * urand());
        h[3][i] = lrand(-10, 4);
    }
    for (int s = 0; s < 4; s++) {
        CK(cudaMemcpy(dp[s], h[s], 4 * n, cudaMemcpyHostToDevice));
    }
    ZK(zk_cuda_adam_step(&P, dp[0], dp[1], dp[2], dp[3], dt < 0 ? NULL : dd,
                         dt < 0 ? ZS_DTYPE_F32 : (zs_dtype_t)dt, n, NULL));
    CK(cudaDeviceSynchronize());
    ZK(zk_adam_step(&cpu, &P, h[0], h[1], h[2], h[3], dt < 0 ? NULL : hd,
                    dt < 0 ? ZS_DTYPE_F32 : (zs_dtype_t)dt, n));
    for (int s = 0; s < 4; s++) {
        CK(cudaMemcpy(g[s], dp[s], 4 * n, cudaMemcpyDeviceToHost));
    }
    CK(cudaMemcpy(gd, dd, ds * n, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof(what), "adam dst=%d adamw=%d off=%zu", dt, adamw, off);
    for (size_t i = 0; i < n; i++) {
        /* nvcc contracts to FMA, the scalar C build does not: both are within a few fp32
         * roundings of each term (tests/unit/kernels), hence 1e-6 of the largest term */
        double scale = fabs(h[0][i]) + 10.0 * P.lr;
        if (fabs(g[0][i] - h[0][i]) > 1e-6 * scale) {
            fail(what, n, i, g[0][i], h[0][i]);
        }
        if (fabs(g[1][i] - h[1][i]) > 1e-6 * fabs(h[1][i]) + 1e-30) {
            fail("adam m", n, i, g[1][i], h[1][i]);
        }
        if (fabs(g[2][i] - h[2][i]) > 1e-6 * fabs(h[2][i]) + 1e-30) {
            fail("adam v", n, i, g[2][i], h[2][i]);
        }
        if (g[3][i] != 0.0f) {
            fail("adam acc not zeroed", n, i, g[3][i], 0.0);
        }
        if (dt == ZS_DTYPE_BF16 && ((uint16_t *)gd)[i] != zk_f32_to_bf16(g[0][i])) {
            fail("adam dst bf16 != cast(master)", n, i, ((uint16_t *)gd)[i], g[0][i]);
        }
        if (dt == ZS_DTYPE_F16 && ((uint16_t *)gd)[i] != zk_f32_to_f16(g[0][i])) {
            fail("adam dst fp16 != cast(master)", n, i, ((uint16_t *)gd)[i], g[0][i]);
        }
    }
    for (int s = 0; s < 4; s++) {
        free(h[s]);
        free(g[s]);
        CK(cudaFree(d_[s]));
    }
    free(hd);
    free(gd);
    CK(cudaFree(dd0));
}

static void check_sumsq(size_t n, int inject)
{
    float *h = malloc(4 * n + 4);
    float *d = dev(4 * n);
    double *out = dev(8 * ZK_CUDA_SUMSQ_WORDS);
    double gs, cs;
    int cf;

    for (size_t i = 0; i < n; i++) {
        h[i] = lrand(-20, 20);
    }
    if (inject && n > 0) {
        h[inject == 1 ? n - 1 : (size_t)(urand() * (double)n)] = inject == 1 ? NAN : -INFINITY;
    }
    CK(cudaMemcpy(d, h, 4 * n, cudaMemcpyHostToDevice));
    ZK(zk_cuda_sumsq(d, n, out, NULL));
    CK(cudaMemcpy(&gs, out, 8, cudaMemcpyDeviceToHost));
    ZK(zk_sumsq(NULL, h, n, &cs, &cf));
    if (inject && n > 0) {
        if (isfinite(gs) || !cf) {
            fail("sumsq non-finite flag", n, 0, gs, cs);
        }
    } else if (fabs(gs - cs) > 1e-12 * cs || cf) {
        fail("sumsq", n, 0, gs, cs);
    }
    free(h);
    CK(cudaFree(d));
    CK(cudaFree(out));
}

/* accumulate, reduce and cast for one dtype; specials injected */
static void check_elementwise(size_t n, zs_dtype_t dt)
{
    size_t es = zs_dtype_size(dt);
    float *f = malloc(4 * n + 4), *acc = malloc(4 * n + 4), *gacc = malloc(4 * n + 4);
    unsigned char *a = malloc(es * n + 4), *b = malloc(es * n + 4);
    unsigned char *cr = malloc(4 * n + 4), *gr = malloc(4 * n + 4);
    void *df = dev(4 * n), *dacc = dev(4 * n), *da = dev(es * n), *db = dev(es * n);
    void *dr = dev(4 * n);
    static const float specials[] = {INFINITY, -INFINITY, NAN, 0x1.0p-140f, -0.0f, 65520.0f};

    for (size_t i = 0; i < n; i++) {
        f[i] = (i % 101 == 0) ? specials[(i / 101) % 6] : lrand(-30, 16);
        acc[i] = lrand(-10, 10);
    }
    ZK(zk_cast(NULL, a, dt, f, ZS_DTYPE_F32, n));
    for (size_t i = 0; i < n; i++) {
        float x = lrand(-10, 10);
        memcpy(b + es * i,
               es == 4
                   ? (void *)&x
                   : (void *)&(uint16_t){dt == ZS_DTYPE_F16 ? zk_f32_to_f16(x) : zk_f32_to_bf16(x)},
               es);
    }
    CK(cudaMemcpy(df, f, 4 * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dacc, acc, 4 * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(da, a, es * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, es * n, cudaMemcpyHostToDevice));

    /* cast fp32 -> dt and back: bit-exact (same elem.h formulas) */
    ZK(zk_cuda_cast(dr, dt, df, ZS_DTYPE_F32, n, NULL));
    CK(cudaMemcpy(gr, dr, es * n, cudaMemcpyDeviceToHost));
    if (memcmp(gr, a, es * n) != 0) {
        fail("cast fp32 -> dtype", n, 0, 0, 0);
    }
    ZK(zk_cuda_cast(dr, ZS_DTYPE_F32, da, dt, n, NULL));
    CK(cudaMemcpy(gr, dr, 4 * n, cudaMemcpyDeviceToHost));
    ZK(zk_cast(NULL, cr, ZS_DTYPE_F32, a, dt, n));
    if (memcmp(gr, cr, 4 * n) != 0) {
        fail("cast dtype -> fp32", n, 0, 0, 0);
    }
    /* reduce: one fp32 add, correctly rounded on both sides: bit-exact */
    ZK(zk_cuda_reduce(dr, da, db, dt, n, NULL));
    CK(cudaMemcpy(gr, dr, es * n, cudaMemcpyDeviceToHost));
    ZK(zk_reduce(NULL, cr, a, b, dt, n));
    for (size_t i = 0; i < n; i++) {
        if (memcmp(gr + es * i, cr + es * i, es) != 0) {
            float x, y;
            memcpy(&x, gr + es * i, 4);
            memcpy(&y, cr + es * i, 4);
            if (!(es == 4 && isnan(x) && isnan(y))) {
                fail("reduce", n, i, x, y);
            }
        }
    }
    /* accumulate from b: FMA on the GPU, maybe not on the CPU: 2^-23 of the terms */
    ZK(zk_cuda_accumulate(dacc, db, dt, 0.25f, n, NULL));
    CK(cudaMemcpy(gacc, dacc, 4 * n, cudaMemcpyDeviceToHost));
    {
        float *c = malloc(4 * n + 4);
        memcpy(c, acc, 4 * n);
        ZK(zk_accumulate(NULL, c, b, dt, 0.25f, n));
        for (size_t i = 0; i < n; i++) {
            if (fabs(gacc[i] - c[i]) > 0x1.0p-22 * (fabs(acc[i]) + fabs(c[i]) + 1e-30)) {
                fail("accumulate", n, i, gacc[i], c[i]);
            }
        }
        free(c);
    }
    CK(cudaDeviceSynchronize());
    free(f);
    free(acc);
    free(gacc);
    free(a);
    free(b);
    free(cr);
    free(gr);
    CK(cudaFree(df));
    CK(cudaFree(dacc));
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dr));
}

static void timing(size_t n)
{
    zk_adam_params_t P = {.lr = 1e-4f,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = 0.01f,
                          .adam_w_mode = 1,
                          .bias_correction = 1,
                          .step = 1,
                          .grad_scale = 1.0f};
    float *s[4];
    void *dst = dev(2 * n);
    size_t bytes = 34 * n; /* 16 read + 16 written + 2 (bf16) written per element */
    void *c0 = dev(bytes / 2), *c1 = dev(bytes / 2);
    cudaEvent_t e0, e1;
    float ms_adam = 0, ms_copy = 0;
    const int reps = 20;

    for (int i = 0; i < 4; i++) {
        s[i] = dev(4 * n);
        CK(cudaMemset(s[i], 0, 4 * n));
    }
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    ZK(zk_cuda_adam_step(&P, s[0], s[1], s[2], s[3], dst, ZS_DTYPE_BF16, n, NULL));
    CK(cudaEventRecord(e0, NULL));
    for (int r = 0; r < reps; r++) {
        P.step++;
        ZK(zk_cuda_adam_step(&P, s[0], s[1], s[2], s[3], dst, ZS_DTYPE_BF16, n, NULL));
    }
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms_adam, e0, e1));
    /* a copy of bytes/2 reads bytes/2 and writes bytes/2: the same traffic */
    CK(cudaMemcpyAsync(c1, c0, bytes / 2, cudaMemcpyDeviceToDevice, NULL));
    CK(cudaEventRecord(e0, NULL));
    for (int r = 0; r < reps; r++) {
        CK(cudaMemcpyAsync(c1, c0, bytes / 2, cudaMemcpyDeviceToDevice, NULL));
    }
    CK(cudaEventRecord(e1, NULL));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms_copy, e0, e1));
    ms_adam /= reps;
    ms_copy /= reps;
    printf("\n%-28s %12s %10s %9s %7s\n", "operation", "bytes", "time [ms]", "GB/s", "ratio");
    printf("n = %zu Mi elements (%s)\n", n >> 20,
           n >= ((size_t)1 << 30) ? "the shard update of a 1 B-parameter bf16 model at world 1"
                                  : "one 64 Mi shard");
    printf("%-28s %12zu %10.3f %9.1f %7.3f\n", "zk_cuda_adam_step (bf16 dst)", bytes, ms_adam,
           bytes / ms_adam / 1e6, (double)ms_copy / ms_adam);
    printf("%-28s %12zu %10.3f %9.1f %7.3f\n", "cudaMemcpy D2D (same bytes)", bytes, ms_copy,
           bytes / ms_copy / 1e6, 1.0);
    printf("SUMMARY adam_over_copy n=%zu %.3f (target >= 0.8)\n", n, (double)ms_copy / ms_adam);
    for (int i = 0; i < 4; i++) {
        CK(cudaFree(s[i]));
    }
    CK(cudaFree(dst));
    CK(cudaFree(c0));
    CK(cudaFree(c1));
}

int main(void)
{
    static const size_t sizes[] = {0, 1, 15, 17, 1023, 65537, 1000003, 16777259};
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    struct cudaDeviceProp prop;

    if (err != cudaSuccess || count == 0) {
        fprintf(stderr, "zk_gpu_check: no CUDA device (%s); nothing to check\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count 0");
        return 3;
    }
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("zk_gpu_check: %s (sm_%d%d), %d device(s)\n", prop.name, prop.major, prop.minor, count);
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        for (int dt = -1; dt <= 2; dt++) {
            check_adam(n, dt, 1, 0);
            check_adam(n, dt, 1, 1);
        }
        check_adam(n, ZS_DTYPE_BF16, 0, 0);
        check_sumsq(n, 0);
        check_sumsq(n, 1);
        check_sumsq(n, 2);
        for (int dt = 0; dt <= 2; dt++) {
            check_elementwise(n, (zs_dtype_t)dt);
        }
        printf("  n = %-9zu %s\n", n, failures ? "FAILED" : "ok");
    }
    if (failures) {
        fprintf(stderr, "zk_gpu_check: %d mismatches\n", failures);
        return 1;
    }
    timing((size_t)64 << 20);
    timing((size_t)1 << 30); /* 1 Gi elements: 52 GiB of device memory */
    return 0;
}
