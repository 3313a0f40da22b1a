/*
 * Which stores the kernels use for calls beyond the caches: regular or non-temporal. The
 * answer differs from CPU to CPU (non-temporal stores save the read-for-ownership of each
 * written line on one machine and cost several times the time on another), so it is
 * measured, once per process, by the kernels themselves: each store-mix family (in-place
 * Adam, in-place accumulate, out-of-place reduce/cast) runs on scratch buffers of twice the
 * last-level cache (between 32 and 256 MiB of footprint) with each kind of store, and keeps
 * the faster, by at least 3 %, or regular stores. ZEROD_KERNEL_STORES=regular|nt|auto
 * overrides it for the process; zk_exec_t.stores for one call (tests cover both paths so).
 * The choice never changes a result: both store kinds write the same bits.
 */
#include "zk_int.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define ZK_MIB            ((size_t)1 << 20)
#define ZK_PLAN_MIN_BYTES ZK_STORES_PLAN_MIN_BYTES
#define ZK_PLAN_MAX_BYTES (256 * ZK_MIB)
#define ZK_PLAN_REPS      3
#define ZK_PLAN_MARGIN    1.03 /* non-temporal must be this much faster to be chosen */

static zk_store_plan_t zk_plan;
static pthread_once_t zk_plan_once = PTHREAD_ONCE_INIT;

static const char *const zk_family_names[ZK_STORE_FAMILIES] = {"adam", "accumulate", "reduce/cast"};

const char *zk_store_family_name(zk_store_family_t f)
{
    return (unsigned)f < ZK_STORE_FAMILIES ? zk_family_names[f] : "?";
}

/* The last-level cache in bytes (sysconf, then sysfs), or 32 MiB when neither says. */
static size_t zk_llc_bytes(void)
{
    long s = -1;
    FILE *f;

#ifdef _SC_LEVEL3_CACHE_SIZE
    s = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (s <= 0) {
        s = sysconf(_SC_LEVEL2_CACHE_SIZE);
    }
#endif
    if (s > 0) {
        return (size_t)s;
    }
    f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f != NULL) {
        char unit = 'K';
        if (fscanf(f, "%ld%c", &s, &unit) >= 1 && s > 0) {
            s *= unit == 'M' ? 1 << 20 : 1 << 10;
        }
        fclose(f);
    }
    return s > 0 ? (size_t)s : 32 * ZK_MIB;
}

static double zk_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct zk_scratch {
    float *s[5];
    size_t n;
} zk_scratch_t;

/* One call of a family's kernel over the scratch buffers with the given stores. */
static void zk_plan_call(const zk_ops_t *ops, zk_store_family_t fam, zk_scratch_t *b, int nt)
{
    static const zk_adam_k_t k = {.grad_scale = 1.0f,
                                  .beta1 = 0.9f,
                                  .one_minus_beta1 = 0.1f,
                                  .beta2 = 0.999f,
                                  .one_minus_beta2 = 0.001f,
                                  .eps = 1e-8f,
                                  .inv_sqrt_bc2 = 1.0f,
                                  .step_size = 1e-6f,
                                  .decay = 1.0f,
                                  .keep_acc = 1}; /* as the daemon runs it */

    switch (fam) {
    case ZK_STORE_ADAM:
        ops->adam(&k, b->s[0], b->s[1], b->s[2], b->s[3], b->s[4], ZS_DTYPE_BF16, b->n, nt);
        break;
    case ZK_STORE_ACCUMULATE:
        ops->accumulate(b->s[0], b->s[1], ZS_DTYPE_F32, 1.0f, b->n, nt);
        break;
    default:
        ops->reduce(b->s[2], b->s[0], b->s[1], ZS_DTYPE_F32, b->n, nt);
        break;
    }
}

/* Bytes one element of a family's measured call reads and writes. */
static double zk_plan_bytes(zk_store_family_t fam)
{
    return fam == ZK_STORE_ADAM ? 30.0 : 12.0; /* Adam: 16 read, 12 + 2 written; else 8 + 4 */
}

/* Best GB/s of ZK_PLAN_REPS calls after a warm-up. */
static double zk_plan_time(const zk_ops_t *ops, zk_store_family_t fam, zk_scratch_t *b, int nt)
{
    double best = INFINITY;

    for (int r = 0; r <= ZK_PLAN_REPS; r++) {
        double t0 = zk_seconds(), dt;
        zk_plan_call(ops, fam, b, nt);
        dt = zk_seconds() - t0;
        if (r > 0 && dt < best) {
            best = dt;
        }
    }
    return zk_plan_bytes(fam) * (double)b->n / best / 1e9;
}

static int zk_plan_env(const char *env)
{
    int nt = strcasecmp(env, "nt") == 0;

    if (!nt && strcasecmp(env, "regular") != 0) {
        return 0;
    }
    for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
        zk_plan.nt[f] = nt;
    }
    zk_plan.nt_min_bytes = nt ? 0 : SIZE_MAX;
    snprintf(zk_plan.how, sizeof(zk_plan.how), "%s stores for every call (ZEROD_KERNEL_STORES=%s)",
             nt ? "non-temporal" : "regular", env);
    return 1;
}

static void zk_plan_measure(void)
{
    const zk_ops_t *ops = zk_variant_ops(zk_default_variant());
    size_t target = 2 * zk_llc_bytes();
    zk_scratch_t b = {0};
    size_t len = 0;
    int any = 0;

    target = target < ZK_PLAN_MIN_BYTES ? ZK_PLAN_MIN_BYTES : target;
    target = target > ZK_PLAN_MAX_BYTES ? ZK_PLAN_MAX_BYTES : target;
    b.n = target / 18 / 64 * 64; /* Adam's footprint: 4 fp32 streams and a bf16 one */
    for (int i = 0; i < 5; i++) {
        b.s[i] = aligned_alloc(64, b.n * 4);
        if (b.s[i] != NULL) {
            memset(b.s[i], 0, b.n * 4);
        }
        any |= b.s[i] == NULL;
    }
    zk_plan.nt_min_bytes = target;
    if (any) {
        snprintf(zk_plan.how + strlen(zk_plan.how), sizeof(zk_plan.how) - strlen(zk_plan.how),
                 "regular stores: no memory for %zu MiB of scratch to measure", target >> 20);
    } else {
        len = strlen(zk_plan.how);
        len +=
            (size_t)snprintf(zk_plan.how + len, sizeof(zk_plan.how) - len,
                             "measured at %zu MiB (%s), GB/s regular/non-temporal:", target >> 20,
                             zk_variant_name(zk_default_variant()));
        for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
            zk_plan.gbps[f][0] = zk_plan_time(ops, (zk_store_family_t)f, &b, 0);
            zk_plan.gbps[f][1] = zk_plan_time(ops, (zk_store_family_t)f, &b, 1);
            zk_plan.nt[f] = zk_plan.gbps[f][1] > ZK_PLAN_MARGIN * zk_plan.gbps[f][0];
            if (len < sizeof(zk_plan.how)) {
                len +=
                    (size_t)snprintf(zk_plan.how + len, sizeof(zk_plan.how) - len,
                                     " %s %.1f/%.1f -> %s", zk_family_names[f], zk_plan.gbps[f][0],
                                     zk_plan.gbps[f][1], zk_plan.nt[f] ? "nt" : "regular");
            }
        }
    }
    for (int i = 0; i < 5; i++) {
        free(b.s[i]);
    }
}

static void zk_plan_run(void)
{
    const char *env = getenv("ZEROD_KERNEL_STORES");

    if (env != NULL && *env != '\0' && strcasecmp(env, "auto") != 0 && zk_plan_env(env)) {
        return;
    }
    if (env != NULL && *env != '\0' && strcasecmp(env, "auto") != 0) {
        snprintf(zk_plan.how, sizeof(zk_plan.how),
                 "ZEROD_KERNEL_STORES=%.40s is not regular, nt or auto: measured instead; ", env);
    }
    zk_plan_measure();
}

const zk_store_plan_t *zk_store_plan(void)
{
    pthread_once(&zk_plan_once, zk_plan_run);
    return &zk_plan;
}

int zk_store_nt(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint)
{
    int mode = exec != NULL ? exec->stores : ZK_STORES_AUTO;
    const zk_store_plan_t *plan;

    if (mode == ZK_STORES_REGULAR) {
        return 0;
    }
    if (mode == ZK_STORES_NT) {
        return 1;
    }
    /* below the smallest scratch size the answer is regular on every CPU: measure only for
     * calls that could use the other */
    if (footprint < ZK_PLAN_MIN_BYTES) {
        return 0;
    }
    plan = zk_store_plan();
    return plan->nt[fam] && footprint >= plan->nt_min_bytes;
}
