/* Launchers in zk_cuda.cu, called by kernels/src/cuda_api.c after its argument checks.
 * Each returns a cudaError_t (0 = success). dtype: the zs_dtype_t value. */
#ifndef ZK_CU_H
#define ZK_CU_H

#include "zk/elem.h"

#include <stddef.h>

/* sumsq: at most this many blocks, each leaving one partial in out[1..] */
#define ZK_CU_SUMSQ_BLOCKS 1024

#ifdef __cplusplus
extern "C" {
#endif

int zk_cu_adam(const zk_adam_k_t *k, float *master, float *m, float *v, float *acc, void *dst,
               int dtype, size_t n, void *stream);
int zk_cu_sumsq(const float *x, size_t n, double *out, void *stream);
int zk_cu_accumulate(float *acc, const void *src, int dtype, float s, size_t n, void *stream);
int zk_cu_reduce(void *dst, const void *a, const void *b, int dtype, size_t n, void *stream);
int zk_cu_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
