/*
 * coll_ceiling: what this machine's memory allows the direct collectives at world 2, measured
 * without UCX, without the mesh and without any message: two forked processes, the buffers of
 * both in shared memfd mappings, a process-shared barrier before each iteration, and the very
 * kernels zd_coll_ucx runs in its direct algorithm:
 *   reduce_scatter: rank r: acc_r = src_0[r half] + src_1[r half]   (zk_reduce, fp32)
 *   all_gather:     rank r: dst_r[other half] = dst_other[other half] (zk_cast, fp32 copy)
 * Sizes, busbw and memcpy follow coll_bench exactly (nccl-tests: S = total bytes, busbw =
 * S/time x (n-1)/n; time = median over iterations of the slower rank; memcpy = one memcpy of S
 * in this process, best of before and after). The gap between coll_bench's direct rows and
 * these is the cost of zerod's protocol; these rows are the machine's ceiling for the
 * algorithm. Prints ratios; asserts nothing.
 *
 *   coll_ceiling [--sizes 16,64,256] [--iters N]
 */
#define _GNU_SOURCE
#include "bench_util.h"
#include "zk/kernels.h"
#include "zs/mem.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define CC_MAX_SIZES 8u
#define CC_MAX_ITERS 40u

enum { CC_RS = 0, CC_AG = 1, CC_N_OPS = 2 };

/* shared between the two processes (one anonymous shared mapping) */
typedef struct cc_shared {
    pthread_barrier_t barrier;
    double t[CC_N_OPS][2][CC_MAX_ITERS];
    int failed[2];
} cc_shared_t;

static unsigned cc_iters(uint64_t bytes, unsigned forced)
{
    uint64_t n = (2ull << 30) / bytes;

    if (forced > 0) {
        return forced;
    }
    return n < 8 ? 8 : n > CC_MAX_ITERS ? CC_MAX_ITERS : (unsigned)n;
}

/* One rank's iterations of both operations; times into sh->t. */
static int cc_rank(cc_shared_t *sh, unsigned r, const zs_region_t src[2], const zs_region_t dst[2],
                   float *acc, uint64_t slice, unsigned iters)
{
    const zk_exec_t one = {.variant = ZK_VARIANT_DEFAULT, .pool = NULL};
    const float *s0 = src[0].addr, *s1 = src[1].addr;
    float *mine = dst[r].addr;
    const float *other = dst[1 - r].addr;
    const uint64_t half = (uint64_t)(1 - r) * slice; /* the other rank's half */
    const unsigned warm = 2;

    for (int op = 0; op < CC_N_OPS; op++) {
        for (unsigned it = 0; it < warm + iters; it++) {
            zs_status_t st;
            double t0;

            pthread_barrier_wait(&sh->barrier);
            t0 = zs_time_now_s();
            if (op == CC_RS) {
                st = zk_reduce(&one, acc, s0 + (uint64_t)r * slice, s1 + (uint64_t)r * slice,
                               ZS_DTYPE_F32, slice);
            } else {
                st = zk_cast(&one, mine + half, ZS_DTYPE_F32, other + half, ZS_DTYPE_F32, slice);
            }
            if (st != ZS_OK) {
                fprintf(stderr, "coll_ceiling: rank %u: %s\n", r, zk_last_error());
                sh->failed[r] = 1;
            }
            if (it >= warm) {
                sh->t[op][r][it - warm] = zs_time_now_s() - t0;
            }
        }
    }
    return sh->failed[r];
}

/* One size: regions created before the fork, so both ranks map all of them. time_s: per op,
 * the median over iterations of the slower rank. */
static int cc_size(uint64_t bytes, unsigned forced_iters, double time_s[CC_N_OPS])
{
    const uint64_t slice = bytes / sizeof(float) / 2;
    const unsigned iters = cc_iters(bytes, forced_iters);
    zs_region_t src[2] = {ZS_REGION_INIT, ZS_REGION_INIT},
                dst[2] = {ZS_REGION_INIT, ZS_REGION_INIT};
    float *acc = NULL;
    cc_shared_t *sh;
    pthread_barrierattr_t ba;
    pid_t pid;
    int status = 0, rc = 1;

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "coll_ceiling: mmap: %s\n", strerror(errno));
        return 1;
    }
    memset(sh, 0, sizeof(*sh));
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&sh->barrier, &ba, 2);
    for (int i = 0; i < 2; i++) {
        if (zs_region_create("zerod-ceiling-src", bytes, &src[i]) != ZS_OK ||
            zs_region_create("zerod-ceiling-dst", bytes, &dst[i]) != ZS_OK) {
            fprintf(stderr, "coll_ceiling: cannot create %llu-byte regions\n",
                    (unsigned long long)bytes);
            goto out;
        }
        for (uint64_t j = 0; j < 2 * slice; j++) {
            ((float *)src[i].addr)[j] = (float)(i + 1) * (float)(j % 7);
            ((float *)dst[i].addr)[j] = (float)(j % 5);
        }
    }
    if (zs_aligned_alloc(slice * sizeof(float), ZS_CACHE_LINE, (void **)&acc) != ZS_OK) {
        fprintf(stderr, "coll_ceiling: out of memory\n");
        goto out;
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "coll_ceiling: fork: %s\n", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        _exit(cc_rank(sh, 1, src, dst, acc, slice, iters));
    }
    cc_rank(sh, 0, src, dst, acc, slice, iters);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        sh->failed[0] || sh->failed[1]) {
        fprintf(stderr, "coll_ceiling: a rank failed\n");
        goto out;
    }
    /* the sums are exact: check one rank's result */
    for (uint64_t j = 0; j < slice; j++) {
        if (acc[j] != 3.0f * (float)(j % 7)) {
            fprintf(stderr, "coll_ceiling: reduce_scatter element %llu is %g\n",
                    (unsigned long long)j, (double)acc[j]);
            goto out;
        }
    }
    for (int op = 0; op < CC_N_OPS; op++) {
        double t[CC_MAX_ITERS];
        for (unsigned i = 0; i < iters; i++) {
            t[i] = sh->t[op][0][i] > sh->t[op][1][i] ? sh->t[op][0][i] : sh->t[op][1][i];
        }
        time_s[op] = zb_median(t, iters);
    }
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        zs_region_cleanup(&src[i]);
        zs_region_cleanup(&dst[i]);
    }
    zs_aligned_free(acc);
    pthread_barrier_destroy(&sh->barrier);
    munmap(sh, sizeof(*sh));
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"sizes", required_argument, NULL, 's'},
        {"iters", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    unsigned sizes[CC_MAX_SIZES] = {16, 64, 256}, n_sizes = 3, iters = 0;
    double mem[CC_MAX_SIZES], times[CC_MAX_SIZES][CC_N_OPS];
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            n_sizes = zb_parse_sizes("coll_ceiling", optarg, sizes, CC_MAX_SIZES);
            if (n_sizes == 0) {
                return 2;
            }
            break;
        case 'n':
            if (zb_parse_uint("coll_ceiling", "iters", optarg, 1, CC_MAX_ITERS, &iters) != 0) {
                return 2;
            }
            break;
        case 'h':
            printf("Usage: coll_ceiling [--sizes 16,64,256] [--iters N]\n"
                   "The direct collectives' kernels between 2 forked processes over shared\n"
                   "memfds, with no UCX and no messages: this machine's ceiling for coll_bench.\n");
            return 0;
        default:
            return zb_usage_error("coll_ceiling");
        }
    }
    if (zb_no_operands("coll_ceiling", argc, argv) != 0) {
        return 2;
    }
    if (zk_init() != ZS_OK) {
        fprintf(stderr, "coll_ceiling: %s\n", zk_last_error());
        return 1;
    }
    for (unsigned i = 0; i < n_sizes; i++) {
        uint64_t bytes = (uint64_t)sizes[i] << 20;
        mem[i] = zb_memcpy_gbps("coll_ceiling", bytes, cc_iters(bytes, iters));
    }
    for (unsigned i = 0; i < n_sizes; i++) {
        if (cc_size((uint64_t)sizes[i] << 20, iters, times[i]) != 0) {
            return 1;
        }
    }
    printf("coll_ceiling: the direct collectives' kernels (zk %s) between 2 forked processes, "
           "shared memfds, a shared barrier, no UCX, no messages; fp32;\nS, busbw, time and "
           "memcpy (best of before and after) as coll_bench\n\n",
           zk_variant_name(zk_default_variant()));
    printf("%-14s %10s %10s %8s %8s %8s\n", "op", "bytes", "time_us", "busbw", "memcpy", "bus/mem");
    printf("%-14s %10s %10s %8s %8s\n", "", "", "", "GB/s", "GB/s");
    for (unsigned i = 0; i < n_sizes; i++) {
        uint64_t bytes = (uint64_t)sizes[i] << 20;
        double again = zb_memcpy_gbps("coll_ceiling", bytes, cc_iters(bytes, iters));
        mem[i] = again > mem[i] ? again : mem[i];
        for (int op = 0; op < CC_N_OPS; op++) {
            double busbw = (double)bytes / times[i][op] / 1e9 / 2.0;
            printf("%-14s %10llu %10.1f %8.2f %8.2f %8.3f\n",
                   op == CC_RS ? "reduce_scatter" : "all_gather", (unsigned long long)bytes,
                   times[i][op] * 1e6, busbw, mem[i], busbw / mem[i]);
        }
    }
    return 0;
}
