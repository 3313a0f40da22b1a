/*
 * coll_bench: zerod's host-memory collectives (zd_coll_ucx: ring reduce-scatter and all-gather
 * over UCX) between 2 daemons' meshes on this host, against memcpy and peers measured in the
 * same run (bench/ prints ratios, never asserts wall time).
 *
 * It forks 2 ranks; each forms a real mesh (zd_mesh_create: rank 0 listens on
 * 127.0.0.1:<free port>, token from a 0600 temp file) and a zd_coll_ucx, offers its buffers as
 * shared memfd regions (as a daemon offers its params and slots), and times, for each size S:
 * reduce_scatter (fp32 bucket of world x slice elements -> fp32 accumulator slice =, as
 * nccl-tests' ReduceScatter and the first contribution of an accumulation window in zerod)
 * and all_gather (fp32, in place, world x slice elements). fp32 everywhere, as the MPI and
 * gloo peers. --algo ring times the ring (the algorithm between hosts) instead of the direct
 * path between co-located daemons.
 *
 * Conventions of nccl-tests (doc/PERFORMANCE.md): S = total bytes of the collective:
 * reduce_scatter: the whole input (world x slice x 4 B); all_gather: the whole output
 * (world x slice x 4 B); all_reduce (the gloo stand-in for reduce_scatter): the buffer.
 * algbw = S / time; busbw = algbw x (n-1)/n (all_reduce: x 2(n-1)/n). GB = 1e9 B.
 * time = median over iterations of the slowest rank's time, each iteration started right
 * after a barrier (the peers time the same way). memcpy: one memcpy of S bytes in this
 * process before and after the ranks run (best of both, median of repetitions): GB/s = S/t.
 *
 * Targets at S >= 16 MiB: busbw >= 0.5 x memcpy bandwidth, and busbw >= the best peer's busbw
 * for the same operation (gloo has no reduce_scatter: its all_reduce stands in).
 *
 *   coll_bench [--sizes 1,4,16,64,256] [--iters N] [--algo direct|ring] [--peer FILE]...
 *              [--json]
 */
#define _GNU_SOURCE
#include "bench_util.h"
#include "coll/coll.h"
#include "mesh/mesh.h"
#include "zk/kernels.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define CB_WORLD        2u
#define CB_MAX_SIZES    8u
#define CB_MAX_ITERS    64u
#define CB_MAX_PEERS    4u
#define CB_MAX_PEER_ROW 64u
#define CB_TARGET_MIB   16u
#define CB_TARGET_MEM   0.5
#define CB_BYTES_PER_OP (2ull << 30) /* bytes timed per op and size, for the default count */

enum { CB_OP_RS = 0, CB_OP_AG = 1, CB_N_OPS = 2 };
static const char *const cb_op_name[CB_N_OPS] = {"reduce_scatter", "all_gather"};

typedef struct cb_opts {
    unsigned sizes_mib[CB_MAX_SIZES];
    unsigned n_sizes;
    unsigned iters; /* 0: by size */
    const char *peers[CB_MAX_PEERS];
    unsigned n_peers;
    int json;
    int ring; /* --algo ring */
} cb_opts_t;

/* What a rank sends to the parent for one (size, op). */
typedef struct cb_rec {
    uint32_t op, n;
    uint64_t bytes;
    double t[CB_MAX_ITERS];
    char algo[160]; /* zd_coll_t.algo */
} cb_rec_t;

/* One peer measurement (a JSON line of bench/peers/). */
typedef struct cb_peer_row {
    char peer[16], op[24];
    uint64_t bytes;
    double time_us, busbw;
} cb_peer_row_t;

static cb_peer_row_t cb_peer_rows[CB_MAX_PEER_ROW];
static unsigned cb_n_peer_rows;

static unsigned cb_iters_for(const cb_opts_t *o, uint64_t bytes)
{
    uint64_t n = CB_BYTES_PER_OP / bytes;

    if (o->iters > 0) {
        return o->iters;
    }
    return n < 8 ? 8 : n > 40 ? 40 : (unsigned)n;
}

/* ---- one rank -------------------------------------------------------------------------- */

typedef struct cb_rank {
    uint32_t rank;
    zd_mesh_t *mesh;
    zd_coll_t *coll;
    int out_fd;
    char err[512];
} cb_rank_t;

static int cb_rank_fail(cb_rank_t *R, const char *what, zs_status_t st)
{
    fprintf(stderr, "coll_bench: rank %u: %s: %s (%s)\n", R->rank, what, R->err,
            zs_status_name(st));
    return 1;
}

/* Correctness once per size, then warm-up and timed iterations of both ops. */
static int cb_rank_size(cb_rank_t *R, const cb_opts_t *o, uint64_t bytes)
{
    const uint64_t total = bytes / sizeof(float), slice = total / CB_WORLD;
    const uint32_t r = R->rank;
    unsigned iters = cb_iters_for(o, bytes), warm = bytes >= (64u << 20) ? 2 : 5;
    zs_region_t src_region = ZS_REGION_INIT, gbuf_region = ZS_REGION_INIT;
    const zs_region_t *regions[2] = {&src_region, &gbuf_region};
    float *src = NULL, *acc = NULL, *gbuf = NULL;
    zs_status_t st = ZS_OK;
    int rc = 1;

    /* the buffers a daemon would hand over: memfd regions shared with its trainer */
    if (zs_region_create("zerod-bench-src", bytes, &src_region) != ZS_OK ||
        zs_region_create("zerod-bench-gather", bytes, &gbuf_region) != ZS_OK ||
        posix_memalign((void **)&acc, 64, slice * sizeof(float)) != 0) {
        fprintf(stderr, "coll_bench: rank %u: out of memory at %llu bytes\n", r,
                (unsigned long long)bytes);
        goto out;
    }
    src = src_region.addr;
    gbuf = gbuf_region.addr;
    R->err[0] = '\0';
    st = zd_coll_share(R->coll, regions, 2, NULL, R->err, sizeof(R->err));
    if (st != ZS_OK) {
        rc = cb_rank_fail(R, "share", st);
        goto out;
    }
    /* values exact in fp32, so that the sums are exact */
    for (uint64_t i = 0; i < total; i++) {
        src[i] = (float)(r + 1) * (float)((i % 7) + 1) * 0.25f;
        gbuf[i] = i / slice == r ? (float)(r + 1) + (float)(i % 5) : -1.0f;
    }
    for (uint64_t j = 0; j < slice; j++) {
        acc[j] = 1e30f; /* overwritten, not added to */
    }
    R->err[0] = '\0';
    st = R->coll->ops->reduce_scatter(R->coll, src, ZS_DTYPE_F32, slice, acc, ZD_COLL_OVERWRITE,
                                      NULL, R->err, sizeof(R->err));
    if (st == ZS_OK) { /* and once accumulating: acc = 2 x the sum */
        st = R->coll->ops->reduce_scatter(R->coll, src, ZS_DTYPE_F32, slice, acc, 0, NULL, R->err,
                                          sizeof(R->err));
    }
    if (st != ZS_OK) {
        rc = cb_rank_fail(R, "reduce_scatter", st);
        goto out;
    }
    st = R->coll->ops->all_gather(R->coll, gbuf, ZS_DTYPE_F32, slice, R->err, sizeof(R->err));
    if (st != ZS_OK) {
        rc = cb_rank_fail(R, "all_gather", st);
        goto out;
    }
    for (uint64_t j = 0; j < slice; j++) {
        float want = 6.0f * (float)(((r * slice + j) % 7) + 1) * 0.25f;
        if (acc[j] != want) {
            fprintf(stderr, "coll_bench: rank %u: reduce_scatter element %llu is %g, not %g\n", r,
                    (unsigned long long)j, (double)acc[j], (double)want);
            goto out;
        }
    }
    for (uint64_t i = 0; i < total; i++) {
        float want = (float)(i / slice + 1) + (float)(i % 5);
        if (gbuf[i] != want) {
            fprintf(stderr, "coll_bench: rank %u: all_gather element %llu is %g, not %g\n", r,
                    (unsigned long long)i, (double)gbuf[i], (double)want);
            goto out;
        }
    }

    for (int op = 0; op < CB_N_OPS; op++) {
        cb_rec_t rec;

        memset(&rec, 0, sizeof(rec));
        rec.op = (uint32_t)op;
        rec.n = iters;
        rec.bytes = bytes;
        snprintf(rec.algo, sizeof(rec.algo), "%s", R->coll->algo);
        for (unsigned it = 0; it < warm + iters; it++) {
            double t0;

            st = R->coll->ops->barrier(R->coll, R->err, sizeof(R->err));
            if (st != ZS_OK) {
                rc = cb_rank_fail(R, "barrier", st);
                goto out;
            }
            t0 = zs_time_now_s();
            if (op == CB_OP_RS) {
                st = R->coll->ops->reduce_scatter(R->coll, src, ZS_DTYPE_F32, slice, acc,
                                                  ZD_COLL_OVERWRITE, NULL, R->err, sizeof(R->err));
            } else {
                st = R->coll->ops->all_gather(R->coll, gbuf, ZS_DTYPE_F32, slice, R->err,
                                              sizeof(R->err));
            }
            if (st != ZS_OK) {
                rc = cb_rank_fail(R, cb_op_name[op], st);
                goto out;
            }
            if (it >= warm) {
                rec.t[it - warm] = zs_time_now_s() - t0;
            }
        }
        if (zb_write_all(R->out_fd, &rec, sizeof(rec)) != 0) {
            fprintf(stderr, "coll_bench: rank %u: lost the parent: %s\n", r, strerror(errno));
            goto out;
        }
    }
    rc = 0;
out:
    zs_region_cleanup(&src_region);
    zs_region_cleanup(&gbuf_region);
    free(acc);
    return rc;
}

static int cb_rank_main(uint32_t rank, const char *coordinator, const char *token_path,
                        const cb_opts_t *o, int out_fd)
{
    uint8_t token[ZD_TOKEN_MAX];
    size_t token_len = 0;
    zd_mesh_params_t mp;
    zk_exec_t exec = {.variant = ZK_VARIANT_DEFAULT, .pool = NULL};
    cb_rank_t R;
    zs_status_t st;
    int rc = 1;

    memset(&R, 0, sizeof(R));
    R.rank = rank;
    R.out_fd = out_fd;
    st = zd_mesh_read_token(token_path, token, &token_len, R.err, sizeof(R.err));
    if (st != ZS_OK) {
        return cb_rank_fail(&R, "token", st);
    }
    memset(&mp, 0, sizeof(mp));
    mp.job_id = "coll_bench";
    mp.rank = rank;
    mp.world = CB_WORLD;
    mp.coordinator = coordinator;
    mp.token = token;
    mp.token_len = token_len;
    mp.mesh_timeout_ns = 20 * ZS_NSEC_PER_SEC;
    mp.collective_timeout_ns = 60 * ZS_NSEC_PER_SEC;
    mp.heartbeat_interval_ns = 1 * ZS_NSEC_PER_SEC;
    st = zd_mesh_create(&mp, &R.mesh, R.err, sizeof(R.err));
    if (st != ZS_OK) {
        return cb_rank_fail(&R, "zd_mesh_create", st);
    }
    st = zd_coll_ucx_create(R.mesh, &exec, !o->ring, &R.coll);
    if (st != ZS_OK) {
        snprintf(R.err, sizeof(R.err), "cannot create the collectives");
        cb_rank_fail(&R, "zd_coll_ucx_create", st);
        goto out_mesh;
    }
    for (unsigned i = 0; i < o->n_sizes; i++) {
        if (cb_rank_size(&R, o, (uint64_t)o->sizes_mib[i] << 20) != 0) {
            goto out_coll;
        }
    }
    /* both ranks are done before either closes its endpoints */
    st = R.coll->ops->barrier(R.coll, R.err, sizeof(R.err));
    if (st != ZS_OK) {
        cb_rank_fail(&R, "final barrier", st);
        goto out_coll;
    }
    rc = 0;
out_coll:
    zd_coll_destroy(R.coll);
out_mesh:
    zd_mesh_destroy(R.mesh);
    return rc;
}

/* ---- the parent ------------------------------------------------------------------------ */

static int cb_load_peer(const char *path)
{
    char line[1024];
    FILE *f = fopen(path, "r");

    if (f == NULL) {
        fprintf(stderr, "coll_bench: peer file %s: %s\n", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL && cb_n_peer_rows < CB_MAX_PEER_ROW) {
        cJSON *j = cJSON_Parse(line);
        cJSON *peer, *op, *bytes, *time_us, *busbw;

        if (j == NULL) {
            continue; /* not a result line */
        }
        peer = cJSON_GetObjectItemCaseSensitive(j, "peer");
        op = cJSON_GetObjectItemCaseSensitive(j, "op");
        bytes = cJSON_GetObjectItemCaseSensitive(j, "bytes");
        time_us = cJSON_GetObjectItemCaseSensitive(j, "time_us");
        busbw = cJSON_GetObjectItemCaseSensitive(j, "busbw_gbps");
        if (cJSON_IsString(peer) && cJSON_IsString(op) && cJSON_IsNumber(bytes) &&
            cJSON_IsNumber(time_us) && cJSON_IsNumber(busbw)) {
            cb_peer_row_t *p = &cb_peer_rows[cb_n_peer_rows++];
            snprintf(p->peer, sizeof(p->peer), "%s", peer->valuestring);
            snprintf(p->op, sizeof(p->op), "%s", op->valuestring);
            p->bytes = (uint64_t)bytes->valuedouble;
            p->time_us = time_us->valuedouble;
            p->busbw = busbw->valuedouble;
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return 0;
}

/* A peer's busbw for (op, bytes), or a negative value when it has none. */
static double cb_peer_busbw(const char *peer, const char *op, uint64_t bytes)
{
    for (unsigned i = 0; i < cb_n_peer_rows; i++) {
        const cb_peer_row_t *p = &cb_peer_rows[i];
        if (strcmp(p->peer, peer) == 0 && strcmp(p->op, op) == 0 && p->bytes == bytes) {
            return p->busbw;
        }
    }
    return -1.0;
}

static void cb_fmt_opt(char *buf, size_t len, double v, const char *fmt)
{
    if (v < 0) {
        snprintf(buf, len, "-");
    } else {
        snprintf(buf, len, fmt, v);
    }
}

static void cb_json_num(char *buf, size_t len, double v)
{
    if (v < 0) {
        snprintf(buf, len, "null");
    } else {
        snprintf(buf, len, "%.3f", v);
    }
}

typedef struct cb_summary {
    unsigned checked, met_mem, met_peer, peer_checked;
} cb_summary_t;

static void cb_report(const cb_opts_t *o, const cb_rec_t *r0, const cb_rec_t *r1, double mem_gbps,
                      cb_summary_t *sum)
{
    double t[CB_MAX_ITERS] = {0};
    double time_s, algbw, busbw, ratio_mem, mpi, gloo, best, ratio_peer = -1.0;
    const char *op = cb_op_name[r0->op];
    const char *gloo_op = r0->op == CB_OP_RS ? "all_reduce" : "all_gather";
    int checked = r0->bytes >= ((uint64_t)CB_TARGET_MIB << 20), ok_mem, ok_peer = 1;
    char s_mpi[16], s_gloo[16], s_best[16], s_rp[16], verdict[48];

    for (unsigned i = 0; i < r0->n; i++) {
        t[i] = r0->t[i] > r1->t[i] ? r0->t[i] : r1->t[i];
    }
    time_s = zb_median(t, r0->n);
    algbw = (double)r0->bytes / time_s / 1e9;
    busbw = algbw * (double)(CB_WORLD - 1) / (double)CB_WORLD;
    ratio_mem = busbw / mem_gbps;
    mpi = cb_peer_busbw("mpi", op, r0->bytes);
    gloo = cb_peer_busbw("gloo", r0->op == CB_OP_RS ? "reduce_scatter" : "all_gather", r0->bytes);
    if (gloo >= 0 && r0->op == CB_OP_RS) {
        gloo_op = "reduce_scatter";
    } else if (r0->op == CB_OP_RS) {
        gloo = cb_peer_busbw("gloo", "all_reduce", r0->bytes);
    }
    best = mpi > gloo ? mpi : gloo;
    if (best > 0) {
        ratio_peer = busbw / best;
        ok_peer = ratio_peer >= 1.0;
    }
    ok_mem = ratio_mem >= CB_TARGET_MEM;
    if (checked) {
        sum->checked++;
        sum->met_mem += ok_mem;
        if (best > 0) {
            sum->peer_checked++;
            sum->met_peer += ok_peer;
        }
        snprintf(verdict, sizeof(verdict), "%s", ok_mem && ok_peer ? "met" : "NOT met");
        if (!(ok_mem && ok_peer)) {
            snprintf(verdict, sizeof(verdict), "NOT met (%s%s%s)", ok_mem ? "" : "memcpy",
                     !ok_mem && !ok_peer ? ", " : "", ok_peer ? "" : "peer");
        }
    } else {
        snprintf(verdict, sizeof(verdict), "(< %u MiB)", CB_TARGET_MIB);
    }
    if (o->json) {
        char j_mpi[16], j_gloo[16], j_best[16], j_rp[16];
        cb_json_num(j_mpi, sizeof(j_mpi), mpi);
        cb_json_num(j_gloo, sizeof(j_gloo), gloo);
        cb_json_num(j_best, sizeof(j_best), best);
        cb_json_num(j_rp, sizeof(j_rp), ratio_peer);
        printf("{\"bench\": \"coll\", \"schema_version\": 1, \"impl\": \"zd_coll_ucx\", "
               "\"algo\": \"%s\", "
               "\"op\": \"%s\", \"world\": %u, \"dtype\": \"fp32\", \"bytes\": %llu, "
               "\"bytes_convention\": \"nccl-tests: total bytes (%s)\", \"iters\": %u, "
               "\"time_us\": %.1f, \"algbw_gbps\": %.3f, \"busbw_gbps\": %.3f, "
               "\"memcpy_gbps\": %.3f, \"ratio_busbw_memcpy\": %.3f, "
               "\"mpi_busbw_gbps\": %s, \"gloo_busbw_gbps\": %s, \"gloo_op\": \"%s\", "
               "\"best_peer_busbw_gbps\": %s, \"ratio_busbw_best_peer\": %s, "
               "\"target_checked\": %s, \"target_memcpy_ratio\": %.1f, "
               "\"target_memcpy_met\": %s, \"target_peer_met\": %s}\n",
               r0->algo[0] == 'd' ? "direct" : "ring", op, CB_WORLD, (unsigned long long)r0->bytes,
               r0->op == CB_OP_RS ? "the whole input bucket" : "the whole output buffer", r0->n,
               time_s * 1e6, algbw, busbw, mem_gbps, ratio_mem, j_mpi, j_gloo, gloo_op, j_best,
               j_rp, checked ? "true" : "false", CB_TARGET_MEM, ok_mem ? "true" : "false",
               best > 0 ? (ok_peer ? "true" : "false") : "null");
    } else {
        cb_fmt_opt(s_mpi, sizeof(s_mpi), mpi, "%.2f");
        cb_fmt_opt(s_gloo, sizeof(s_gloo), gloo, "%.2f");
        if (gloo >= 0 && strcmp(gloo_op, "all_reduce") == 0) {
            strncat(s_gloo, "*", sizeof(s_gloo) - strlen(s_gloo) - 1);
        }
        cb_fmt_opt(s_best, sizeof(s_best), best, "%.2f");
        cb_fmt_opt(s_rp, sizeof(s_rp), ratio_peer, "%.3f");
        printf("%-14s %10llu %10.1f %8.2f %8.2f %8.2f %8.3f %8s %8s %8s %8s  %s\n", op,
               (unsigned long long)r0->bytes, time_s * 1e6, algbw, busbw, mem_gbps, ratio_mem,
               s_mpi, s_gloo, s_best, s_rp, verdict);
    }
    fflush(stdout);
}

static void cb_usage(FILE *out)
{
    fprintf(out,
            "Usage: coll_bench [OPTIONS]\n"
            "Reduce-scatter and all-gather of zd_coll_ucx between 2 forked ranks on this host,\n"
            "against memcpy and the peers' JSON lines (bench/coll_bench.sh runs the peers).\n"
            "\n"
            "  --sizes LIST   total sizes S in MiB (default 1,4,16,64,256)\n"
            "  --iters N      timed iterations per op and size (default by size, 8..40)\n"
            "  --algo A       direct (default: co-located ranks read each other's regions)\n"
            "                 or ring (the algorithm between hosts)\n"
            "  --peer FILE    JSON lines of a peer (bench/peers/mpi_coll.c, gloo_coll.py);\n"
            "                 repeatable\n"
            "  --json         one JSON object per line instead of the table\n"
            "  -h, --help     print this help and exit\n");
}

static int cb_parse(int argc, char **argv, cb_opts_t *o)
{
    static const struct option longopts[] = {
        {"sizes", required_argument, NULL, 's'},
        {"iters", required_argument, NULL, 'n'},
        {"peer", required_argument, NULL, 'p'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {"algo", required_argument, NULL, 'a'},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            o->n_sizes = zb_parse_sizes("coll_bench", optarg, o->sizes_mib, CB_MAX_SIZES);
            if (o->n_sizes == 0) {
                return 2;
            }
            break;
        case 'n':
            if (zb_parse_uint("coll_bench", "iters", optarg, 1, CB_MAX_ITERS, &o->iters) != 0) {
                return 2;
            }
            break;
        case 'p':
            if (o->n_peers == CB_MAX_PEERS) {
                fprintf(stderr, "coll_bench: at most %u --peer files\n", CB_MAX_PEERS);
                return 2;
            }
            o->peers[o->n_peers++] = optarg;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'a':
            if (strcmp(optarg, "direct") != 0 && strcmp(optarg, "ring") != 0) {
                fprintf(stderr, "coll_bench: --algo '%s' is not direct or ring\n", optarg);
                return 2;
            }
            o->ring = strcmp(optarg, "ring") == 0;
            break;
        case 'h':
            cb_usage(stdout);
            return -1;
        default:
            return zb_usage_error("coll_bench");
        }
    }
    return zb_no_operands("coll_bench", argc, argv);
}

int main(int argc, char **argv)
{
    cb_opts_t o = {.sizes_mib = {1, 4, 16, 64, 256}, .n_sizes = 5};
    double mem[CB_MAX_SIZES];
    char token[64], coord[32];
    pid_t pid[CB_WORLD] = {0, 0};
    int fds[CB_WORLD] = {-1, -1}, rc, port, failed = 0;
    cb_summary_t sum = {0, 0, 0, 0};
    cb_rec_t(*recs)[CB_N_OPS][CB_WORLD];

    rc = cb_parse(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    signal(SIGPIPE, SIG_IGN);
    recs = calloc(CB_MAX_SIZES, sizeof(*recs));
    if (recs == NULL) {
        return 1;
    }
    for (unsigned i = 0; i < o.n_peers; i++) {
        if (cb_load_peer(o.peers[i]) != 0) {
            free(recs);
            return 2;
        }
    }
    /* memcpy before the ranks exist; again after they are gone (the best of both) */
    for (unsigned i = 0; i < o.n_sizes; i++) {
        uint64_t bytes = (uint64_t)o.sizes_mib[i] << 20;
        mem[i] = zb_memcpy_gbps("coll_bench", bytes, cb_iters_for(&o, bytes));
    }
    port = zb_free_port();
    if (port < 0 || zb_token_create("coll_bench", NULL, token, sizeof(token)) != 0) {
        fprintf(stderr, "coll_bench: no free port or token file\n");
        free(recs);
        return 1;
    }
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", port);
    for (uint32_t r = 0; r < CB_WORLD; r++) {
        int out_fd = -1;

        pid[r] = zb_child_fork("coll_bench", fds, r, &out_fd);
        if (pid[r] == 0) {
            _exit(cb_rank_main(r, coord, token, &o, out_fd));
        }
        if (pid[r] < 0) {
            pid[r] = 0;
            failed = 1;
            break;
        }
    }

    for (unsigned i = 0; i < o.n_sizes && !failed; i++) {
        for (int op = 0; op < CB_N_OPS && !failed; op++) {
            for (uint32_t r = 0; r < CB_WORLD; r++) {
                cb_rec_t *x = &recs[i][op][r];
                if (zb_read_all(fds[r], x, sizeof(*x)) != 0 || x->n == 0 || x->n > CB_MAX_ITERS ||
                    x->op != (uint32_t)op || x->bytes != (uint64_t)o.sizes_mib[i] << 20) {
                    fprintf(stderr, "coll_bench: rank %u stopped early\n", r);
                    failed = 1;
                    break;
                }
            }
        }
    }
    failed = zb_children_reap("coll_bench", "rank", pid, fds, CB_WORLD, failed);
    unlink(token);
    if (failed) {
        free(recs);
        return 1;
    }
    for (unsigned i = 0; i < o.n_sizes; i++) {
        uint64_t bytes = (uint64_t)o.sizes_mib[i] << 20;
        double again = zb_memcpy_gbps("coll_bench", bytes, cb_iters_for(&o, bytes));
        mem[i] = again > mem[i] ? again : mem[i];
    }

    if (!o.json) {
        char load[64];

        zb_loadavg(load, sizeof(load));
        printf("coll_bench: zd_coll_ucx: %s; UCX %s, UCX_TLS=%s; %u ranks forked on this "
               "host, 1 thread each, fp32; %ld CPUs, load average %s\n",
               recs[0][0][0].algo, ucp_get_version_string(),
               getenv("UCX_TLS") ? getenv("UCX_TLS") : "(default)", CB_WORLD,
               sysconf(_SC_NPROCESSORS_ONLN), load);
        printf("nccl-tests conventions: bytes = S = total bytes (reduce_scatter: the whole input "
               "bucket, world x slice fp32, out = sum; all_gather: the whole output buffer);\n"
               "algbw = S/time; "
               "busbw = algbw x (n-1)/n; GB = 1e9 B. time = median over iterations of the "
               "slowest rank, each started after a barrier.\nmemcpy = one memcpy of S bytes in "
               "this process (median; best of before and after the ranks ran). Peers time the "
               "same way.\ngloo has no reduce_scatter: '*' = its all_reduce (busbw = algbw x "
               "2(n-1)/n) stands in. Targets at S >= %u MiB: busbw >= %.1f x memcpy, and >= the "
               "best peer.\n\n",
               CB_TARGET_MIB, CB_TARGET_MEM);
        printf("%-14s %10s %10s %8s %8s %8s %8s %8s %8s %8s %8s  %s\n", "op", "bytes", "time_us",
               "algbw", "busbw", "memcpy", "bus/mem", "mpi bus", "gloo bus", "best pr", "bus/peer",
               "targets");
        printf("%-14s %10s %10s %8s %8s %8s %8s %8s %8s %8s %8s\n", "", "", "", "GB/s", "GB/s",
               "GB/s", "", "GB/s", "GB/s", "GB/s", "");
    }
    for (unsigned i = 0; i < o.n_sizes; i++) {
        for (int op = 0; op < CB_N_OPS; op++) {
            cb_rec_t *x = recs[i][op];
            x[0].n = x[0].n < x[1].n ? x[0].n : x[1].n;
            cb_report(&o, &x[0], &x[1], mem[i], &sum);
        }
    }
    if (!o.json) {
        printf("\ntargets at S >= %u MiB: busbw >= %.1f x memcpy in %u of %u rows; >= the best "
               "peer in %u of %u rows with a peer\n",
               CB_TARGET_MIB, CB_TARGET_MEM, sum.met_mem, sum.checked, sum.met_peer,
               sum.peer_checked);
    }
    free(recs);
    return 0;
}
