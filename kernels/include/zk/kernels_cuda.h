/*
 * zk CUDA entry points: the operations of zk/kernels.h on device memory, enqueued on a
 * stream (asynchronous; errors of the launch are returned, errors of execution surface at the
 * next synchronisation). Same per-element math and rounding recipe as the CPU kernels
 * (zk/elem.h), so the same bits for adam, accumulate, reduce and cast.
 * Built when CMake finds nvcc (sm_90 + PTX); otherwise every call returns ZS_ERR_UNSUPPORTED.
 * Never prints; zk_last_error() holds the message of a failed call.
 */
#ifndef ZK_KERNELS_CUDA_H
#define ZK_KERNELS_CUDA_H

#include "zk/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t; NULL is the legacy default stream. */
typedef struct CUstream_st *zk_cuda_stream_t;

/* 1 when zk was built with CUDA and a device is visible, else 0. */
int zk_cuda_available(void);
/* The number of visible devices (0 without CUDA in the build or without a driver). */
int zk_cuda_device_count(void);

zs_status_t zk_cuda_adam_step(const zk_adam_params_t *params, float *master, float *m, float *v,
                              float *acc, void *dst, zs_dtype_t dst_dtype, size_t n,
                              zk_cuda_stream_t stream);

/* Doubles that the `out` buffer of zk_cuda_sumsq must hold (result + per-block partials). */
#define ZK_CUDA_SUMSQ_WORDS 1025

/* out[0] = sum of squares of x in double, deterministic for a given n (fixed block count and
 * order; not the order of zk_sumsq, so not always its last bits). A NaN sum is the canonical
 * double NaN. Non-finite flag = !isfinite(out[0]): squares of finite fp32 values cannot overflow
 * a double sum, so the sum is inf or NaN exactly when some x[i] is. out: device memory of
 * ZK_CUDA_SUMSQ_WORDS doubles. */
zs_status_t zk_cuda_sumsq(const float *x, size_t n, double *out, zk_cuda_stream_t stream);

zs_status_t zk_cuda_accumulate(float *acc, const void *src, zs_dtype_t src_dtype, float s, size_t n,
                               zk_cuda_stream_t stream);

zs_status_t zk_cuda_reduce(void *dst, const void *a, const void *b, zs_dtype_t dtype, size_t n,
                           zk_cuda_stream_t stream);

zs_status_t zk_cuda_cast(void *dst, zs_dtype_t dst_dtype, const void *src, zs_dtype_t src_dtype,
                         size_t n, zk_cuda_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
