/*
 * Device regions and interprocess events (zk/cuda_share.h) without a GPU: the granularity
 * arithmetic both sides of a region share, and the errors a machine without a device (or a
 * build without CUDA) gets -- a status and a message, never a crash. The calls on a GPU are
 * checked by bench/gpu/share_check.c (bench/gpu/check.sh).
 */
#include "zk/cuda_share.h"
#include "zk_test.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

Test(zk_cuda_share, rounds_up_to_the_granularity)
{
    size_t out = 0;

    cr_assert_eq(zk_cuda_round_granularity(1, 2u << 20, &out), ZS_OK);
    cr_assert_eq(out, 2u << 20);
    cr_assert_eq(zk_cuda_round_granularity(2u << 20, 2u << 20, &out), ZS_OK);
    cr_assert_eq(out, 2u << 20, "an exact multiple stays");
    cr_assert_eq(zk_cuda_round_granularity((2u << 20) + 1, 2u << 20, &out), ZS_OK);
    cr_assert_eq(out, 4u << 20);
    cr_assert_eq(zk_cuda_round_granularity(67108892, 2097152, &out), ZS_OK);
    cr_assert_eq(out, 69206016u, "the size the H200 run reported");
}

Test(zk_cuda_share, refuses_bad_sizes_and_granularities)
{
    size_t out = 7;

    cr_assert_eq(zk_cuda_round_granularity(0, 4096, &out), ZS_ERR_INVALID);
    cr_assert(strstr(zk_last_error(), "size 0") != NULL, "%s", zk_last_error());
    cr_assert_eq(zk_cuda_round_granularity(100, 0, &out), ZS_ERR_INVALID);
    cr_assert_eq(zk_cuda_round_granularity(100, 3000, &out), ZS_ERR_INVALID);
    cr_assert(strstr(zk_last_error(), "3000") != NULL, "%s", zk_last_error());
    cr_assert_eq(zk_cuda_round_granularity(SIZE_MAX - 10, 4096, &out), ZS_ERR_OVERFLOW);
    cr_assert_eq(out, 7u, "no result on failure");
}

/* Without a device every call fails with a status that says so and leaves the region empty. */
Test(zk_cuda_share, no_device_is_a_clear_error)
{
    zk_cuda_region_t r = ZK_CUDA_REGION_INIT;
    zk_cuda_event_t e;
    unsigned char handle[ZK_CUDA_EVENT_HANDLE_BYTES] = {0};
    int fds[2];
    zs_status_t st;

    if (zk_cuda_available()) {
        cr_skip_test("a CUDA device is present: bench/gpu/check.sh checks the real calls");
    }
    st = zk_cuda_region_create(0, 1 << 20, &r);
    cr_assert(st == ZS_ERR_NO_DEVICE || st == ZS_ERR_UNSUPPORTED, "create: %d", (int)st);
    cr_assert(strlen(zk_last_error()) > 0);
    cr_assert_eq(r.fd, -1);
    cr_assert_eq(r.ptr, 0);
    cr_assert_eq(pipe(fds), 0);
    st = zk_cuda_region_import(0, fds[0], 1 << 20, &r);
    cr_assert(st == ZS_ERR_NO_DEVICE || st == ZS_ERR_UNSUPPORTED, "import: %d", (int)st);
    cr_assert_neq(fcntl(fds[0], F_GETFD), -1, "a failed import leaves the fd to the caller");
    close(fds[0]);
    close(fds[1]);
    cr_assert_neq(zk_cuda_event_create(0, &e), ZS_OK);
    cr_assert_neq(zk_cuda_event_open(0, handle, &e), ZS_OK);
    zk_cuda_region_cleanup(&r); /* safe on an empty region */
}

Test(zk_cuda_share, import_refuses_a_bad_fd)
{
    zk_cuda_region_t r;

    cr_assert_eq(zk_cuda_region_import(0, -1, 4096, &r), ZS_ERR_INVALID);
    cr_assert(strstr(zk_last_error(), "fd -1") != NULL, "%s", zk_last_error());
}
