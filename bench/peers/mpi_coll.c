/*
 * The Open MPI peer of coll_bench: MPI_Reduce_scatter_block and MPI_Allgather (in place) of
 * fp32 between the ranks of `mpirun -np 2`, timed as coll_bench times zd_coll_ucx: for each
 * total size S, warm-up, then iterations each started after MPI_Barrier; an iteration's time
 * is the slowest rank's; the median is reported. nccl-tests conventions: S = total bytes
 * (reduce-scatter: the whole send buffer, world x recvcount; all-gather: the whole receive
 * buffer), algbw = S / time, busbw = algbw x (n-1)/n, GB = 1e9 B. Rank 0 prints one JSON
 * line per (op, size).
 *
 *   mpirun -np 2 mpi_coll [--sizes 1,4,16,64,256] [--iters N]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_MAX_SIZES 8
#define MC_MAX_ITERS 64

static int mc_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The same counts as coll_bench: about 2 GiB per op and size, 8..40 iterations. */
static unsigned mc_iters_for(unsigned fixed, uint64_t bytes)
{
    uint64_t n = (2ull << 30) / bytes;

    if (fixed > 0) {
        return fixed;
    }
    return n < 8 ? 8 : n > 40 ? 40 : (unsigned)n;
}

int main(int argc, char **argv)
{
    unsigned sizes[MC_MAX_SIZES] = {1, 4, 16, 64, 256}, n_sizes = 5, fixed = 0;
    int rank, world, rc = 0;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Get_library_version(version, &vlen);
    for (int i = 0; i < vlen; i++) {
        if (version[i] == ',' || version[i] == '\n' || version[i] == '"') {
            version[i] = '\0';
            break;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            char *save = NULL;
            n_sizes = 0;
            for (char *t = strtok_r(argv[++i], ",", &save); t != NULL && n_sizes < MC_MAX_SIZES;
                 t = strtok_r(NULL, ",", &save)) {
                sizes[n_sizes++] = (unsigned)strtoul(t, NULL, 10);
            }
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            fixed = (unsigned)strtoul(argv[++i], NULL, 10);
            fixed = fixed > MC_MAX_ITERS ? MC_MAX_ITERS : fixed;
        } else {
            if (rank == 0) {
                fprintf(stderr, "mpi_coll: unknown argument '%s'\n", argv[i]);
            }
            MPI_Finalize();
            return 2;
        }
    }
    for (unsigned s = 0; s < n_sizes && rc == 0; s++) {
        uint64_t bytes = (uint64_t)sizes[s] << 20;
        uint64_t total = bytes / sizeof(float), slice = total / (uint64_t)world;
        unsigned iters = mc_iters_for(fixed, bytes), warm = bytes >= (64u << 20) ? 2 : 5;
        float *send = malloc(bytes), *recv = malloc(slice * sizeof(float)), *gbuf = malloc(bytes);
        double t[MC_MAX_ITERS];

        if (send == NULL || recv == NULL || gbuf == NULL || slice > INT32_MAX) {
            fprintf(stderr, "mpi_coll: out of memory at %llu bytes\n", (unsigned long long)bytes);
            rc = 1;
        }
        MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (rc != 0) {
            free(send);
            free(recv);
            free(gbuf);
            break;
        }
        for (uint64_t i = 0; i < total; i++) {
            send[i] = (float)(rank + 1) * (float)((i % 7) + 1) * 0.25f;
            gbuf[i] = (float)rank;
        }
        memset(recv, 0, slice * sizeof(float));
        for (int op = 0; op < 2; op++) {
            const char *name = op == 0 ? "reduce_scatter" : "all_gather";
            double med, algbw;

            for (unsigned it = 0; it < warm + iters; it++) {
                double t0, dt, mx;

                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
                if (op == 0) {
                    MPI_Reduce_scatter_block(send, recv, (int)slice, MPI_FLOAT, MPI_SUM,
                                             MPI_COMM_WORLD);
                } else {
                    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, gbuf, (int)slice, MPI_FLOAT,
                                  MPI_COMM_WORLD);
                }
                dt = MPI_Wtime() - t0;
                MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (it >= warm) {
                    t[it - warm] = mx;
                }
            }
            if (op == 0 && recv[0] != 0.25f * (float)(world * (world + 1) / 2) *
                                          (float)(((uint64_t)rank * slice) % 7 + 1)) {
                fprintf(stderr, "mpi_coll: rank %d: wrong reduce-scatter result %g\n", rank,
                        (double)recv[0]);
                rc = 1;
            }
            qsort(t, iters, sizeof(double), mc_cmp_double);
            med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
            algbw = (double)bytes / med / 1e9;
            if (rank == 0) {
                printf("{\"peer\": \"mpi\", \"impl\": \"%s\", \"op\": \"%s\", \"world\": %d, "
                       "\"dtype\": \"fp32\", \"bytes\": %llu, \"iters\": %u, \"time_us\": %.1f, "
                       "\"algbw_gbps\": %.3f, \"busbw_gbps\": %.3f}\n",
                       version, name, world, (unsigned long long)bytes, iters, med * 1e6, algbw,
                       algbw * (double)(world - 1) / (double)world);
                fflush(stdout);
            }
        }
        free(send);
        free(recv);
        free(gbuf);
    }
    MPI_Finalize();
    return rc;
}
