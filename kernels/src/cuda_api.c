/*
 * zk CUDA entry points: argument checks and error mapping around the launchers of
 * kernels/cuda/zk_cuda.cu. Without CUDA every call returns ZS_ERR_UNSUPPORTED.
 */
#include "zk/kernels_cuda.h"
#include "zk_int.h"
#include "zs/thread.h"

#if defined(ZK_HAVE_CUDA)

#include "../cuda/zk_cu.h"

#include <cuda_runtime.h>

_Static_assert(ZK_CUDA_SUMSQ_WORDS == ZK_CU_SUMSQ_BLOCKS + 1, "sumsq buffer size");

static zs_status_t zk_cuda_status(const char *fn, int err)
{
    if (err == cudaSuccess) {
        return ZS_OK;
    }
    return zk_error_set(err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver
                            ? ZS_ERR_NO_DEVICE
                            : ZS_ERR_CUDA,
                        "%s: %s (%s)", fn, cudaGetErrorString((cudaError_t)err),
                        cudaGetErrorName((cudaError_t)err));
}

int zk_cuda_device_count(void)
{
    int count = 0;
    sigset_t old;
    int ok;

    /* the driver's own threads start here and inherit the mask (zs/thread.h) */
    zs_signals_block(&old);
    ok = cudaGetDeviceCount(&count) == cudaSuccess;
    zs_signals_restore(&old);
    return ok ? count : 0;
}

int zk_cuda_available(void)
{
    return zk_cuda_device_count() > 0;
}

zs_status_t zk_cuda_adam_step(const zk_adam_params_t *params, float *master, float *m, float *v,
                              float *acc, void *dst, zs_dtype_t dst_dtype, size_t n,
                              zk_cuda_stream_t stream)
{
    zk_adam_k_t k;
    zs_status_t status;

    if (params == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_adam_step: params is NULL");
    }
    if (dst != NULL && zs_dtype_size(dst_dtype) == 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_adam_step: bad dst dtype %d", (int)dst_dtype);
    }
    status = zk_adam_k_init(params, &k);
    if (status != ZS_OK || n == 0) {
        return status;
    }
    if (master == NULL || m == NULL || v == NULL || acc == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_adam_step: NULL buffer with n = %zu", n);
    }
    return zk_cuda_status("zk_cuda_adam_step",
                          zk_cu_adam(&k, master, m, v, acc, dst, dst_dtype, n, stream));
}

zs_status_t zk_cuda_sumsq(const float *x, size_t n, double *out, zk_cuda_stream_t stream)
{
    if (out == NULL || (x == NULL && n != 0)) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_sumsq: NULL argument");
    }
    return zk_cuda_status("zk_cuda_sumsq", zk_cu_sumsq(x, n, out, stream));
}

zs_status_t zk_cuda_accumulate(float *acc, const void *src, zs_dtype_t src_dtype, float s, size_t n,
                               zk_cuda_stream_t stream)
{
    if (zs_dtype_size(src_dtype) == 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_accumulate: bad src dtype %d", (int)src_dtype);
    }
    if (n == 0) {
        return ZS_OK;
    }
    if (acc == NULL || src == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_accumulate: NULL buffer");
    }
    return zk_cuda_status("zk_cuda_accumulate",
                          zk_cu_accumulate(acc, src, src_dtype, s, n, stream));
}

zs_status_t zk_cuda_reduce(void *dst, const void *a, const void *b, zs_dtype_t dtype, size_t n,
                           zk_cuda_stream_t stream)
{
    if (zs_dtype_size(dtype) == 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_reduce: bad dtype %d", (int)dtype);
    }
    if (n == 0) {
        return ZS_OK;
    }
    if (dst == NULL || a == NULL || b == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_reduce: NULL buffer");
    }
    return zk_cuda_status("zk_cuda_reduce", zk_cu_reduce(dst, a, b, dtype, n, stream));
}

zs_status_t zk_cuda_cast(void *dst, zs_dtype_t dst_dtype, const void *src, zs_dtype_t src_dtype,
                         size_t n, zk_cuda_stream_t stream)
{
    if (zs_dtype_size(dst_dtype) == 0 || zs_dtype_size(src_dtype) == 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_cast: bad dtype (dst %d, src %d)",
                            (int)dst_dtype, (int)src_dtype);
    }
    if (n == 0) {
        return ZS_OK;
    }
    if (dst == NULL || src == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_cast: NULL buffer");
    }
    if (dst_dtype == src_dtype) {
        return zk_cuda_status("zk_cuda_cast",
                              cudaMemcpyAsync(dst, src, n * zs_dtype_size(dst_dtype),
                                              cudaMemcpyDeviceToDevice, stream));
    }
    return zk_cuda_status("zk_cuda_cast", zk_cu_cast(dst, dst_dtype, src, src_dtype, n, stream));
}

#else /* !ZK_HAVE_CUDA */

#define ZK_NO_CUDA(fn)                                                                             \
    zk_error_set(ZS_ERR_UNSUPPORTED, "%s: zerod was built without CUDA (nvcc not found)", fn)

int zk_cuda_available(void)
{
    return 0;
}

int zk_cuda_device_count(void)
{
    return 0;
}

zs_status_t zk_cuda_adam_step(const zk_adam_params_t *params, float *master, float *m, float *v,
                              float *acc, void *dst, zs_dtype_t dst_dtype, size_t n,
                              zk_cuda_stream_t stream)
{
    (void)params, (void)master, (void)m, (void)v, (void)acc, (void)dst, (void)dst_dtype, (void)n;
    (void)stream;
    return ZK_NO_CUDA("zk_cuda_adam_step");
}

zs_status_t zk_cuda_sumsq(const float *x, size_t n, double *out, zk_cuda_stream_t stream)
{
    (void)x, (void)n, (void)out, (void)stream;
    return ZK_NO_CUDA("zk_cuda_sumsq");
}

zs_status_t zk_cuda_accumulate(float *acc, const void *src, zs_dtype_t src_dtype, float s, size_t n,
                               zk_cuda_stream_t stream)
{
    (void)acc, (void)src, (void)src_dtype, (void)s, (void)n, (void)stream;
    return ZK_NO_CUDA("zk_cuda_accumulate");
}

zs_status_t zk_cuda_reduce(void *dst, const void *a, const void *b, zs_dtype_t dtype, size_t n,
                           zk_cuda_stream_t stream)
{
    (void)dst, (void)a, (void)b, (void)dtype, (void)n, (void)stream;
    return ZK_NO_CUDA("zk_cuda_reduce");
}

zs_status_t zk_cuda_cast(void *dst, zs_dtype_t dst_dtype, const void *src, zs_dtype_t src_dtype,
                         size_t n, zk_cuda_stream_t stream)
{
    (void)dst, (void)dst_dtype, (void)src, (void)src_dtype, (void)n, (void)stream;
    return ZK_NO_CUDA("zk_cuda_cast");
}

#endif
