/* The NCCL collectives (daemon/src/coll/coll_nccl.c), which no daemon path calls yet: built and
 * linked whenever CMake finds CUDA and NCCL, even on a machine with no GPU (cmake/ZerodCuda.cmake).
 * Without a device, creating one must fail at once with a status and a message that say why;
 * with one, a world-1 communicator runs each collective on device memory. A build without CUDA
 * has no coll/coll_nccl.c: its tests skip saying so. */
#include "zd_test.h"

#include <criterion/criterion.h>

#ifdef ZD_HAVE_NCCL
#include "coll/coll_nccl.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#define TIMEOUT_NS (30ull * 1000000000ull)

/* The number of CUDA devices; *why: CUDA's reason when there are none. */
static int device_count(const char **why)
{
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);

    *why = ce == cudaSuccess ? "no device" : cudaGetErrorString(ce);
    return ce == cudaSuccess ? n : 0;
}

ZDT_TEST(zd_coll_nccl, create_without_a_device_fails_saying_why)
{
    uint8_t id[ZD_NCCL_ID_BYTES] = {0}; /* never reached: the device is checked first */
    zd_coll_t *coll = NULL;
    char err[256] = "";
    const char *why;
    zs_status_t st;
    int n = device_count(&why);

    if (n > 0) {
        cr_skip_test("%d CUDA device(s) present: the no-device path cannot be taken here", n);
    }
    st = zd_coll_nccl_create(0, 1, id, 0, TIMEOUT_NS, &coll, err, sizeof(err));
    cr_assert_eq(st, ZS_ERR_NO_DEVICE, "%s (%s)", zs_status_name(st), err);
    cr_assert_null(coll, "a failed create wrote its output");
    cr_assert(strstr(err, "CUDA device 0 unusable") != NULL, "no device named in: %s", err);
    cr_assert(strstr(err, why) != NULL, "CUDA's reason '%s' not in: %s", why, err);
}

/* Values 1..n and their doubles are exact in fp32, so results compare with ==. */
ZDT_TEST(zd_coll_nccl, world_1_collectives_run_on_the_device_cuda)
{
    static const zd_reduce_op_t ops[2] = {ZD_REDUCE_SUM, ZD_REDUCE_MAX};
    enum { N = 1000 };
    static float host[N], back[N];
    double vals[2] = {3.0, -5.0};
    uint8_t id[ZD_NCCL_ID_BYTES];
    zd_coll_t *coll = NULL;
    float *src = NULL, *acc = NULL;
    char err[256] = "";
    const char *why;

    if (device_count(&why) == 0) {
        cr_skip_test("no CUDA device: %s", why);
    }
    for (int i = 0; i < N; i++) {
        host[i] = (float)(i + 1);
    }
    cr_assert_eq(zd_coll_nccl_unique_id(id, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(zd_coll_nccl_create(0, 1, id, 0, TIMEOUT_NS, &coll, err, sizeof(err)), ZS_OK, "%s",
                 err);
    cr_assert_str_eq(coll->ops->name, "nccl");
    cr_assert_eq(coll->rank, 0);
    cr_assert_eq(coll->world, 1);
    cr_assert_eq(cudaMalloc((void **)&src, sizeof(host)), cudaSuccess);
    cr_assert_eq(cudaMalloc((void **)&acc, sizeof(host)), cudaSuccess);
    cr_assert_eq(cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);

    /* acc = src, then acc += src (the landing buffer and the accumulate kernel) */
    cr_assert_eq(coll->ops->reduce_scatter(coll, src, ZS_DTYPE_F32, N, acc, ZD_COLL_OVERWRITE, NULL,
                                           err, sizeof(err)),
                 ZS_OK, "%s", err);
    cr_assert_eq(cudaMemcpy(back, acc, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(memcmp(back, host, sizeof(back)) == 0, "reduce_scatter (overwrite) at world 1");
    cr_assert_eq(
        coll->ops->reduce_scatter(coll, src, ZS_DTYPE_F32, N, acc, 0, NULL, err, sizeof(err)),
        ZS_OK, "%s", err);
    cr_assert_eq(cudaMemcpy(back, acc, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(back[i], 2 * host[i], "acc[%d] = %g after two reduce_scatters", i, back[i]);
    }

    cr_assert_eq(coll->ops->all_gather(coll, src, ZS_DTYPE_F32, N, err, sizeof(err)), ZS_OK, "%s",
                 err);
    cr_assert_eq(cudaMemcpy(back, src, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(memcmp(back, host, sizeof(back)) == 0, "all_gather in place at world 1");
    cr_assert_eq(coll->ops->all_reduce(coll, vals, ops, 2, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(vals[0], 3.0);
    cr_assert_eq(vals[1], -5.0);
    cr_assert_eq(coll->ops->barrier(coll, err, sizeof(err)), ZS_OK, "%s", err);
    cudaFree(src);
    cudaFree(acc);
    zd_coll_destroy(coll);
}

#else

ZDT_TEST(zd_coll_nccl, create_without_a_device_fails_saying_why)
{
    cr_skip_test("built without CUDA (ZEROD_WITH_CUDA=OFF, or nvcc/NCCL not found): no "
                 "coll_nccl.c to test");
}

ZDT_TEST(zd_coll_nccl, world_1_collectives_run_on_the_device_cuda)
{
    cr_skip_test("built without CUDA (ZEROD_WITH_CUDA=OFF, or nvcc/NCCL not found): no "
                 "coll_nccl.c to test");
}

#endif
