/*
 * The kernels' leaf: the per-thread last error (zk_error_set, zk_last_error) and the variant
 * registry -- which variants this CPU runs (cpuid), their ops tables, and the default chosen once
 * from ZEROD_KERNELS or the widest supported. Every other file of kernels/ calls down into it;
 * it calls only the ops tables of k_scalar.c, k_avx2.c and k_avx512.c.
 */
#include "zk_int.h"

#include "zs/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* zk_last_error(): the kernels' own message per thread, apart from libzc's */
static _Thread_local zs_lasterr_t zk_lasterr;

static pthread_once_t zk_init_once = PTHREAD_ONCE_INIT;
static zs_status_t zk_init_status = ZS_OK;
static char zk_init_msg[ZS_ERRMSG_LEN];
static volatile int zk_default = ZK_VARIANT_SCALAR;

zs_status_t zk_error_set(zs_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    status = zs_lasterr_vset(&zk_lasterr, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *zk_last_error(void)
{
    return zs_lasterr_get(&zk_lasterr);
}

static const char *const zk_variant_names[ZK_VARIANT_COUNT] = {"scalar", "avx2", "avx512"};

const char *zk_variant_name(zk_variant_t v)
{
    if ((unsigned)v >= ZK_VARIANT_COUNT) {
        return "unknown";
    }
    return zk_variant_names[v];
}

int zk_variant_supported(zk_variant_t v)
{
    switch (v) {
    case ZK_VARIANT_SCALAR:
        return 1;
#if defined(ZK_HAVE_X86_VARIANTS)
    case ZK_VARIANT_AVX2:
        /* libgcc/compiler-rt also check that the OS saves the AVX state (xgetbv) */
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    case ZK_VARIANT_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
#endif
    default:
        return 0;
    }
}

const zk_ops_t *zk_variant_ops(int v)
{
    switch (v) {
#if defined(ZK_HAVE_X86_VARIANTS)
    case ZK_VARIANT_AVX2:
        return &zk_ops_avx2;
    case ZK_VARIANT_AVX512:
        return &zk_ops_avx512;
#endif
    default:
        return &zk_ops_scalar;
    }
}

static void zk_init_run(void)
{
    const char *env = getenv("ZEROD_KERNELS");
    int v;

    if (env == NULL || *env == '\0') {
        for (v = ZK_VARIANT_COUNT - 1; v > ZK_VARIANT_SCALAR; v--) {
            if (zk_variant_supported((zk_variant_t)v)) {
                break;
            }
        }
        zk_default = v;
        return;
    }
    for (v = 0; v < ZK_VARIANT_COUNT; v++) {
        if (strcasecmp(env, zk_variant_names[v]) == 0) {
            break;
        }
    }
    if (v == ZK_VARIANT_COUNT) {
        zk_init_status =
            zs_errf(zk_init_msg, sizeof(zk_init_msg), ZS_ERR_INVALID,
                    "ZEROD_KERNELS=%s names no kernel variant (scalar, avx2, avx512)", env);
        return;
    }
    if (!zk_variant_supported((zk_variant_t)v)) {
        zk_init_status = zs_errf(zk_init_msg, sizeof(zk_init_msg), ZS_ERR_UNSUPPORTED,
                                 "ZEROD_KERNELS=%s: this CPU cannot run the %s kernels (needs %s)",
                                 env, zk_variant_names[v],
                                 v == ZK_VARIANT_AVX2 ? "AVX2, FMA and F16C"
                                                      : "AVX-512 F/DQ/BW/VL, AVX2, FMA and F16C");
        return;
    }
    zk_default = v;
}

zs_status_t zk_init(void)
{
    pthread_once(&zk_init_once, zk_init_run);
    if (zk_init_status != ZS_OK) {
        return zk_error_set(zk_init_status, "%s", zk_init_msg);
    }
    return ZS_OK;
}

zs_status_t zk_set_default_variant(zk_variant_t v)
{
    pthread_once(&zk_init_once, zk_init_run);
    if ((unsigned)v >= ZK_VARIANT_COUNT) {
        return zk_error_set(ZS_ERR_INVALID, "zk_set_default_variant: no variant %d", (int)v);
    }
    if (!zk_variant_supported(v)) {
        return zk_error_set(ZS_ERR_UNSUPPORTED, "kernel variant %s is not supported by this CPU",
                            zk_variant_names[v]);
    }
    zk_default = v;
    zk_init_status = ZS_OK; /* an explicit choice overrides a bad ZEROD_KERNELS */
    return ZS_OK;
}

zk_variant_t zk_default_variant(void)
{
    pthread_once(&zk_init_once, zk_init_run);
    return (zk_variant_t)zk_default;
}
