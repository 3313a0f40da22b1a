/*
 * zk front end: argument checks, the variant of a call (variant.c), the split of one
 * call over a zk_pool_t, and the coefficients of docs/semantics.md §4 step 6 computed once per
 * call, in fp32 as DeepSpeed's CPU Adam computes them.
 *
 * Determinism: a call's bits do not depend on the variant, the pool or where it cuts the call
 * (zk/elem.h, "Rounding recipe": FMA only where written, each operation rounded on its own,
 * one NaN). The element-wise kernels get that from the recipe alone; zk_sumsq, the one
 * reduction, cuts only at super-block boundaries and adds the super-block sums here, in order
 * (zk/kernels.h).
 */
#include "zk_int.h"

#include "zs/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Chunk starts are multiples of this many elements: 4 KiB of fp32, so every stream of every
 * dtype keeps the alignment of its base pointer in every chunk. */
#define ZK_GRAIN 1024

/* The ops and pool of one call. */
static zs_status_t zk_exec_resolve(const char *fn, const zk_exec_t *exec, const zk_ops_t **ops_p,
                                   zk_pool_t **pool_p)
{
    int v = exec != NULL ? exec->variant : ZK_VARIANT_DEFAULT;
    zs_status_t status;

    *ops_p = NULL;
    *pool_p = NULL;
    if (v == ZK_VARIANT_DEFAULT) {
        status = zk_init();
        if (status != ZS_OK) {
            return status;
        }
        v = (int)zk_default_variant();
    } else if (v < 0 || v >= ZK_VARIANT_COUNT) {
        return zk_error_set(ZS_ERR_INVALID, "%s: no kernel variant %d", fn, v);
    } else if (!zk_variant_supported((zk_variant_t)v)) {
        return zk_error_set(ZS_ERR_UNSUPPORTED,
                            "%s: kernel variant %s is not supported by this CPU", fn,
                            zk_variant_name((zk_variant_t)v));
    }
    *ops_p = zk_variant_ops(v);
    *pool_p = exec != NULL ? exec->pool : NULL;
    return ZS_OK;
}

static int zk_dtype_valid(zs_dtype_t dtype)
{
    return zs_dtype_size(dtype) != 0;
}

/* Largest n for which n * (bytes of all streams) cannot overflow a size_t. */
#define ZK_MAX_N (SIZE_MAX / 64)

/* beta^t as DeepSpeed's CPU Adam keeps it: t fp32 multiplications of 1 by beta, in order.
 * The walk stops early once 1 - beta^t rounds to 1 in fp32, after which every further factor
 * leaves the step's coefficients as they are (beta^t only falls). A small per-thread cache, one
 * entry per beta, continues from the last t it saw (a daemon stepping t, t + 1, ... multiplies
 * once) and starts over when t goes back. */
static float zk_beta_pow(float beta, uint64_t t)
{
    static _Thread_local struct {
        float beta;
        uint64_t t;
        float pow;
    } cache[4];
    static _Thread_local unsigned next;
    unsigned c = 0;

    while (c < 4 && cache[c].beta != beta) {
        c++;
    }
    if (c == 4) {
        c = next++ % 4;
        cache[c].beta = beta;
        cache[c].t = 0;
    }
    if (cache[c].t == 0 || cache[c].t > t) {
        cache[c].t = 0;
        cache[c].pow = 1.0f;
    }
    while (cache[c].t < t && 1.0f - cache[c].pow != 1.0f) {
        cache[c].pow *= beta;
        cache[c].t++;
    }
    return cache[c].pow;
}

zs_status_t zk_adam_k_init(const zk_adam_params_t *params, zk_adam_k_t *k)
{
    float bc1 = 1.0f;
    float bc2 = 1.0f;

    if (!(params->beta1 >= 0.0f && params->beta1 < 1.0f) ||
        !(params->beta2 >= 0.0f && params->beta2 < 1.0f)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_adam_step: betas must be in [0, 1), got (%g, %g)",
                            (double)params->beta1, (double)params->beta2);
    }
    if (!isfinite(params->lr) || !isfinite(params->weight_decay) || !(params->eps >= 0.0f) ||
        !isfinite(params->eps) || !isfinite(params->grad_scale)) {
        return zk_error_set(ZS_ERR_INVALID,
                            "zk_adam_step: lr, eps, weight_decay and grad_scale must be finite "
                            "(eps >= 0)");
    }
    if (params->bias_correction) {
        if (params->step == 0) {
            return zk_error_set(ZS_ERR_INVALID,
                                "zk_adam_step: step must be >= 1 with bias correction");
        }
        /* beta^t <= beta < 1, so neither can reach 0 */
        bc1 = 1.0f - zk_beta_pow(params->beta1, params->step);
        bc2 = 1.0f - zk_beta_pow(params->beta2, params->step);
    }
    /* every coefficient in fp32, operation by operation, as DeepSpeed's CPU Adam computes it */
    k->grad_scale = params->grad_scale;
    k->wd_l2 = params->adam_w_mode ? 0.0f : params->weight_decay;
    k->beta1 = params->beta1;
    k->one_minus_beta1 = 1.0f - params->beta1;
    k->beta2 = params->beta2;
    k->one_minus_beta2 = 1.0f - params->beta2;
    k->eps = params->eps;
    k->inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
    k->neg_step_size = -params->lr / bc1;
    k->neg_lr_wd = params->adam_w_mode ? -params->lr * params->weight_decay : 0.0f;
    k->keep_acc = params->keep_acc != 0;
    return ZS_OK;
}

/* ---- zk_adam_step ---- */

typedef struct zk_adam_job {
    const zk_ops_t *ops;
    const zk_adam_k_t *k;
    float *master, *m, *v, *acc;
    char *dst;
    zs_dtype_t dst_dtype;
    size_t dsize;
    zk_st_t st;
} zk_adam_job_t;

static void zk_adam_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zk_adam_job_t *j = (const zk_adam_job_t *)arg;

    j->ops->adam(j->k, j->master + b, j->m + b, j->v + b, j->acc + b,
                 j->dst != NULL ? j->dst + b * j->dsize : NULL, j->dst_dtype, e - b, j->st);
}

zs_status_t zk_adam_step(const zk_exec_t *exec, const zk_adam_params_t *params, float *master,
                         float *m, float *v, float *acc, void *dst, zs_dtype_t dst_dtype, size_t n)
{
    zk_adam_job_t job;
    zk_adam_k_t k;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_adam_step", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (params == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_adam_step: params is NULL");
    }
    if (dst != NULL && !zk_dtype_valid(dst_dtype)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_adam_step: bad dst dtype %d", (int)dst_dtype);
    }
    if (n > ZK_MAX_N) {
        return zk_error_set(ZS_ERR_INVALID, "zk_adam_step: n = %zu is too large", n);
    }
    status = zk_adam_k_init(params, &k);
    if (status != ZS_OK) {
        return status;
    }
    if (n == 0) {
        return ZS_OK;
    }
    if (master == NULL || m == NULL || v == NULL || acc == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_adam_step: NULL buffer with n = %zu", n);
    }
    job.k = &k;
    job.master = master;
    job.m = m;
    job.v = v;
    job.acc = acc;
    job.dst = (char *)dst;
    job.dst_dtype = dst_dtype;
    job.dsize = dst != NULL ? zs_dtype_size(dst_dtype) : 0;
    job.st = zk_store_st(exec, ZK_STORE_ADAM, n * (32 + job.dsize));
    return zk_pool_run(pool, n, ZK_GRAIN, zk_adam_chunk, &job);
}

/* ---- zk_sumsq ---- */

/* Super-block sums per round: the calling thread adds them in order after each round, so the
 * result is the order of zk/kernels.h whatever the pool (8 KiB on the stack; a round is
 * 16 Mi elements, so the extra pool dispatches cost well under 1 % of a large call). */
#define ZK_SUMSQ_ROUND_BLOCKS 1024
#define ZK_SUMSQ_ROUND        ((size_t)ZK_SUMSQ_ROUND_BLOCKS * ZK_SUMSQ_BLOCK)

typedef struct zk_sumsq_job {
    const zk_ops_t *ops;
    const float *x;
    zk_st_t st;
    double *out; /* part, or the caller's array (zk_sumsq_parts) */
    double part[ZK_SUMSQ_ROUND_BLOCKS];
} zk_sumsq_job_t;

static void zk_sumsq_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    zk_sumsq_job_t *j = (zk_sumsq_job_t *)arg;

    /* b is a multiple of the grain, ZK_SUMSQ_BLOCK: a super-block start */
    j->ops->sumsq(j->x + b, e - b, j->out + b / ZK_SUMSQ_BLOCK, j->st);
}

zs_status_t zk_sumsq(const zk_exec_t *exec, const float *x, size_t n, double *sumsq_p,
                     int *nonfinite_p)
{
    zk_sumsq_job_t job;
    zk_pool_t *pool;
    zs_status_t status;
    double sum = 0.0;

    status = zk_exec_resolve("zk_sumsq", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (sumsq_p == NULL || nonfinite_p == NULL || (x == NULL && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_sumsq: NULL argument");
    }
    job.st = zk_store_st(exec, ZK_STORE_READ, n * sizeof(float));
    for (size_t base = 0; base < n; base += ZK_SUMSQ_ROUND) {
        size_t len = n - base < ZK_SUMSQ_ROUND ? n - base : ZK_SUMSQ_ROUND;
        size_t blocks = (len + ZK_SUMSQ_BLOCK - 1) / ZK_SUMSQ_BLOCK;

        job.x = x + base;
        job.out = job.part;
        status = zk_pool_run(pool, len, ZK_SUMSQ_BLOCK, zk_sumsq_chunk, &job);
        if (status != ZS_OK) {
            return status;
        }
        for (size_t b = 0; b < blocks; b++) {
            sum += job.part[b];
        }
    }
    *sumsq_p = zk_sumsq_total(&sum, 1, nonfinite_p);
    return ZS_OK;
}

double zk_sumsq_total(const double *part, size_t nparts, int *nonfinite_p)
{
    double sum = 0.0;

    for (size_t b = 0; b < nparts; b++) {
        sum += part[b];
    }
    /* every term is a square of an fp32 value (< 2^256), so a finite input cannot overflow
     * the double sum: the sum is non-finite exactly when some input is inf or NaN */
    *nonfinite_p = !isfinite(sum);
    return isnan(sum) ? (double)NAN : sum; /* one NaN whatever the payloads met on the way */
}

zs_status_t zk_sumsq_parts(const zk_exec_t *exec, const float *x, size_t n, double *part)
{
    zk_sumsq_job_t job;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_sumsq_parts", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if ((x == NULL || part == NULL) && n != 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_sumsq_parts: NULL argument");
    }
    job.st = zk_store_st(exec, ZK_STORE_READ, n * sizeof(float));
    job.x = x;
    job.out = part;
    return zk_pool_run(pool, n, ZK_SUMSQ_BLOCK, zk_sumsq_chunk, &job);
}

/* ---- zk_reduce_sumsq_parts ---- */

typedef struct zk_redsq_job {
    const zk_ops_t *ops;
    float *dst;
    const float *a, *b;
    double *part;
    zk_st_t st;
} zk_redsq_job_t;

static void zk_redsq_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zk_redsq_job_t *j = (const zk_redsq_job_t *)arg;

    /* b is a multiple of the grain, ZK_SUMSQ_BLOCK: a super-block start */
    j->ops->reduce_sumsq(j->dst + b, j->a + b, j->b + b, e - b, j->part + b / ZK_SUMSQ_BLOCK,
                         j->st);
}

zs_status_t zk_reduce_sumsq_parts(const zk_exec_t *exec, float *dst, const float *a, const float *b,
                                  size_t n, double *part)
{
    zk_redsq_job_t job;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_reduce_sumsq_parts", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (n > ZK_MAX_N || ((dst == NULL || a == NULL || b == NULL || part == NULL) && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID,
                            "zk_reduce_sumsq_parts: NULL buffer or n = %zu too large", n);
    }
    job.dst = dst;
    job.a = a;
    job.b = b;
    job.part = part;
    /* the reduce's streams and stores: the squares are taken from registers */
    job.st = zk_store_st(exec, ZK_STORE_OUT, 3 * n * sizeof(float));
    return zk_pool_run(pool, n, ZK_SUMSQ_BLOCK, zk_redsq_chunk, &job);
}

/* ---- zk_accumulate ---- */

typedef struct zk_accumulate_job {
    const zk_ops_t *ops;
    float *acc;
    const char *src;
    zs_dtype_t dtype;
    size_t ssize;
    float s;
    zk_st_t st;
} zk_accumulate_job_t;

static void zk_accumulate_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zk_accumulate_job_t *j = (const zk_accumulate_job_t *)arg;

    j->ops->accumulate(j->acc + b, j->src + b * j->ssize, j->dtype, j->s, e - b, j->st);
}

zs_status_t zk_accumulate(const zk_exec_t *exec, float *acc, const void *src, zs_dtype_t src_dtype,
                          float s, size_t n)
{
    zk_accumulate_job_t job;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_accumulate", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (!zk_dtype_valid(src_dtype)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_accumulate: bad src dtype %d", (int)src_dtype);
    }
    if (n > ZK_MAX_N || ((acc == NULL || src == NULL) && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_accumulate: NULL buffer or n = %zu too large", n);
    }
    job.acc = acc;
    job.src = (const char *)src;
    job.dtype = src_dtype;
    job.ssize = zs_dtype_size(src_dtype);
    job.s = s;
    job.st = zk_store_st(exec, ZK_STORE_ACCUMULATE, n * (8 + zs_dtype_size(src_dtype)));
    return zk_pool_run(pool, n, ZK_GRAIN, zk_accumulate_chunk, &job);
}

/* ---- zk_reduce ---- */

typedef struct zk_reduce_job {
    const zk_ops_t *ops;
    char *dst;
    const char *a, *b;
    zs_dtype_t dtype;
    size_t size;
    zk_st_t st;
} zk_reduce_job_t;

static void zk_reduce_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zk_reduce_job_t *j = (const zk_reduce_job_t *)arg;
    size_t o = b * j->size;

    j->ops->reduce(j->dst + o, j->a + o, j->b + o, j->dtype, e - b, j->st);
}

zs_status_t zk_reduce(const zk_exec_t *exec, void *dst, const void *a, const void *b,
                      zs_dtype_t dtype, size_t n)
{
    zk_reduce_job_t job;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_reduce", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (!zk_dtype_valid(dtype)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_reduce: bad dtype %d", (int)dtype);
    }
    if (n > ZK_MAX_N || ((dst == NULL || a == NULL || b == NULL) && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_reduce: NULL buffer or n = %zu too large", n);
    }
    job.dst = (char *)dst;
    job.a = (const char *)a;
    job.b = (const char *)b;
    job.dtype = dtype;
    job.size = zs_dtype_size(dtype);
    job.st = zk_store_st(exec, ZK_STORE_OUT, 3 * n * job.size);
    return zk_pool_run(pool, n, ZK_GRAIN, zk_reduce_chunk, &job);
}

/* ---- zk_cast ---- */

typedef struct zk_cast_job {
    const zk_ops_t *ops;
    char *dst;
    const char *src;
    zs_dtype_t ddt, sdt;
    size_t dsize, ssize;
    zk_st_t st;
} zk_cast_job_t;

static void zk_cast_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    (void)worker;
    const zk_cast_job_t *j = (const zk_cast_job_t *)arg;

    if (j->ddt == j->sdt) {
        j->ops->copy(j->dst + b * j->dsize, j->src + b * j->ssize, (e - b) * j->dsize, j->st);
        return;
    }
    j->ops->cast(j->dst + b * j->dsize, j->ddt, j->src + b * j->ssize, j->sdt, e - b, j->st);
}

zs_status_t zk_cast(const zk_exec_t *exec, void *dst, zs_dtype_t dst_dtype, const void *src,
                    zs_dtype_t src_dtype, size_t n)
{
    zk_cast_job_t job;
    zk_pool_t *pool;
    zs_status_t status;

    status = zk_exec_resolve("zk_cast", exec, &job.ops, &pool);
    if (status != ZS_OK) {
        return status;
    }
    if (!zk_dtype_valid(dst_dtype) || !zk_dtype_valid(src_dtype)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cast: bad dtype (dst %d, src %d)", (int)dst_dtype,
                            (int)src_dtype);
    }
    if (n > ZK_MAX_N || ((dst == NULL || src == NULL) && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cast: NULL buffer or n = %zu too large", n);
    }
    job.dst = (char *)dst;
    job.src = (const char *)src;
    job.ddt = dst_dtype;
    job.sdt = src_dtype;
    job.dsize = zs_dtype_size(dst_dtype);
    job.ssize = zs_dtype_size(src_dtype);
    job.st = zk_store_st(exec,
                         dst_dtype == src_dtype  ? ZK_STORE_COPY
                         : job.dsize > job.ssize ? ZK_STORE_WIDEN
                                                 : ZK_STORE_CAST,
                         n * (job.dsize + job.ssize));
    return zk_pool_run(pool, n, ZK_GRAIN, zk_cast_chunk, &job);
}
