/*
 * World-1 check of the NCCL collectives (daemon/src/coll/coll_nccl.c) on a real GPU: the
 * zd_coll_ops_t reduce_scatter / all_gather / all_reduce / barrier against host arithmetic.
 * Exit: 0 ok, 1 mismatch or error, 3 no CUDA device.
 */
#include "coll/coll_nccl.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *err)
{
    printf("nccl_check: %s: %s\n", what, err);
    return 1;
}

int main(void)
{
    const uint64_t n = 1000003; /* odd, like the kernel checks */
    uint8_t id[ZD_NCCL_ID_BYTES];
    char err[512] = "";
    zd_coll_t *coll = NULL;
    float *h_src, *h_acc, *d_src, *d_acc;
    double vals[2] = {3.5, 1.0};
    static const zd_reduce_op_t ops[2] = {ZD_REDUCE_SUM, ZD_REDUCE_MAX};
    int ndev = 0;
    double worst = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("nccl_check: no CUDA device\n");
        return 3;
    }
    if (zd_coll_nccl_unique_id(id, err, sizeof(err)) != ZS_OK) {
        return fail("unique id", err);
    }
    if (zd_coll_nccl_create(0, 1, id, 0, 10ull * 1000000000ull, &coll, err, sizeof(err)) != ZS_OK) {
        return fail("create", err);
    }
    h_src = malloc(n * sizeof(float));
    h_acc = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++) {
        h_src[i] = (float)((double)(i % 977) / 977.0 - 0.5);
        h_acc[i] = (float)(i % 13);
    }
    cudaMalloc((void **)&d_src, n * sizeof(float));
    cudaMalloc((void **)&d_acc, n * sizeof(float));
    cudaMemcpy(d_src, h_src, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_acc, h_acc, n * sizeof(float), cudaMemcpyHostToDevice);

    /* world 1: acc += src */
    if (coll->ops->reduce_scatter(coll, d_src, ZS_DTYPE_F32, n, d_acc, 0, NULL, err, sizeof(err)) !=
        ZS_OK) {
        return fail("reduce_scatter", err);
    }
    {
        float *back = malloc(n * sizeof(float));
        cudaMemcpy(back, d_acc, n * sizeof(float), cudaMemcpyDeviceToHost);
        for (uint64_t i = 0; i < n; i++) {
            double want = (double)h_acc[i] + (double)h_src[i];
            worst = fmax(worst, fabs(back[i] - want));
        }
        free(back);
    }
    if (worst > 1e-6) {
        printf("nccl_check: reduce_scatter differs by %g\n", worst);
        return 1;
    }
    /* world 1, ZD_COLL_OVERWRITE: acc = src */
    if (coll->ops->reduce_scatter(coll, d_src, ZS_DTYPE_F32, n, d_acc, ZD_COLL_OVERWRITE, NULL, err,
                                  sizeof(err)) != ZS_OK) {
        return fail("reduce_scatter (overwrite)", err);
    }
    {
        float *back = malloc(n * sizeof(float));
        cudaMemcpy(back, d_acc, n * sizeof(float), cudaMemcpyDeviceToHost);
        for (uint64_t i = 0; i < n; i++) {
            if (back[i] != h_src[i]) {
                printf("nccl_check: reduce_scatter (overwrite) element %lu is %g, not %g\n",
                       (unsigned long)i, (double)back[i], (double)h_src[i]);
                free(back);
                return 1;
            }
        }
        free(back);
    }
    if (coll->ops->all_gather(coll, d_src, ZS_DTYPE_F32, n, err, sizeof(err)) != ZS_OK) {
        return fail("all_gather", err);
    }
    if (coll->ops->all_reduce(coll, vals, ops, 2, err, sizeof(err)) != ZS_OK) {
        return fail("all_reduce", err);
    }
    if (vals[0] != 3.5 || vals[1] != 1.0) {
        printf("nccl_check: all_reduce gave %g %g\n", vals[0], vals[1]);
        return 1;
    }
    if (coll->ops->barrier(coll, err, sizeof(err)) != ZS_OK) {
        return fail("barrier", err);
    }
    zd_coll_destroy(coll);
    printf("nccl_check: world-1 reduce_scatter/all_gather/all_reduce/barrier ok (n=%lu, worst "
           "%.3g)\n",
           (unsigned long)n, worst);
    return 0;
}
