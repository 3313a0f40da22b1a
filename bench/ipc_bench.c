/*
 * ipc_bench: the trainer <-> zerod gradient path through libzc, against peers measured in the
 * same run (bench/ prints ratios, never asserts wall time).
 *
 *   (a) round trip BucketReady -> SlotFree with a tiny (16-element fp32) bucket and one slot:
 *       submit, then acquire the same slot again (which returns once its SlotFree is in);
 *       p50 / p99 over many iterations. Target: p50 <= 20 us.
 *   (b) throughput of gradient bytes through submit -> SlotFree at bucket sizes 16, 64 and
 *       256 MiB (fp32, 2 slots in flight), against zk_accumulate on the same size in this
 *       process (the daemon's own work per bucket) and memcpy. Target: >= 0.8 x accumulate.
 *
 * It starts its own zerod (fork + exec; the binary given by --zerod, else ../daemon/zerod next
 * to this program) on a socket in a mkdtemp directory, and stops it with SIGTERM.
 *
 *   ipc_bench [--zerod PATH] [--threads T] [--iters N] [--sizes 16,64,256] [--json]
 */
#define _GNU_SOURCE
#include "bench_util.h"
#include "zk/kernels.h"

#include <zerod/zc.h>

#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define IB_MAX_SIZES    8
#define IB_TINY_NUMEL   16
#define IB_TARGET_P50   20e-6
#define IB_TARGET_RATIO 0.8
#define IB_BYTES_PER_SZ (1ull << 30) /* gradient bytes per round and size */
#define IB_ROUNDS       3            /* alternating rounds; the best of each is reported */

typedef struct ib_opts {
    const char *zerod;
    unsigned threads;
    unsigned iters;
    unsigned sizes_mib[IB_MAX_SIZES];
    unsigned n_sizes;
    int json;
} ib_opts_t;

typedef struct ib_daemon {
    char dir[64];
    zb_zerod_t z;
} ib_daemon_t;

/* ---- the daemon ---------------------------------------------------------------------- */

/* Start zerod with `slots` gradient slots in a fresh temp directory; returns once it is
 * ready. */
static int ib_daemon_start(const ib_opts_t *o, unsigned slots, ib_daemon_t *d)
{
    char slots_s[16], threads_s[16];
    /* clang-format off */
    const char *const args[] = {
        "--device", "cpu",
        "--bucket-slots", slots_s,
        "--threads", threads_s,
        "--max-shard-bytes", "8GiB",
        "--job-linger", "5s",
        NULL,
    };
    /* clang-format on */

    memset(d, 0, sizeof(*d));
    if (zb_tmpdir_create("ipc_bench", d->dir, sizeof(d->dir)) != 0) {
        return -1;
    }
    d->z.prog = "ipc_bench";
    snprintf(d->z.name, sizeof(d->z.name), "zerod");
    snprintf(d->z.sock, sizeof(d->z.sock), "%s/zerod.sock", d->dir);
    snprintf(d->z.log, sizeof(d->z.log), "%s/zerod.log", d->dir);
    d->z.tail_lines = 20;
    snprintf(slots_s, sizeof(slots_s), "%u", slots);
    snprintf(threads_s, sizeof(threads_s), "%u", o->threads);
    if (zb_zerod_start(&d->z, o->zerod, args) != 0) {
        zb_zerod_stop(&d->z);
        rmdir(d->dir);
        return -1;
    }
    return 0;
}

/* SIGTERM; the daemon must exit 0. Removes the directory. */
static int ib_daemon_stop(ib_daemon_t *d)
{
    int rc = zb_zerod_stop(&d->z);

    rmdir(d->dir);
    return rc;
}

/* ---- sessions ------------------------------------------------------------------------ */

static int ib_fail(const char *what, int status)
{
    fprintf(stderr, "ipc_bench: %s: %s (%s)\n", what, zc_last_error(), zc_status_name(status));
    return -1;
}

/* A fresh fp32 job of one parameter of n elements, one bucket; params loaded. */
static int ib_attach(const ib_daemon_t *d, const char *job, uint64_t n, zc_session_t **s_p)
{
    zc_open_params_t op;
    zc_attach_params_t ap;
    zc_attach_info_t info;
    zc_group_t g;
    char config[160];
    zc_session_t *s = NULL;
    int st;

    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS;
    op.socket_path = d->z.sock;
    op.timeout_ms = 60000;
    st = zc_session_open(&op, &s);
    if (st != ZC_OK) {
        return ib_fail("open", st);
    }
    snprintf(config, sizeof(config),
             "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": %llu}}",
             (unsigned long long)(n < 16 ? 16 : n));
    g.n_params = 1;
    g.numel = &n;
    g.options_json = NULL;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS |
                    ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = job;
    ap.dtype = ZC_DTYPE_F32;
    ap.n_groups = 1;
    ap.groups = &g;
    ap.config_json = config;
    st = zc_session_attach(s, &ap, &info);
    if (st == ZC_OK && info.n_buckets != 1) {
        fprintf(stderr, "ipc_bench: expected one bucket, the layout has %u\n", info.n_buckets);
        st = ZC_ERR_STATE;
    }
    if (st == ZC_OK) {
        memset(zc_session_param_ptr(s, 0), 0, (size_t)n * sizeof(float));
        st = zc_session_params_ready(s);
    }
    if (st != ZC_OK) {
        ib_fail("attach", st);
        zc_session_close(s);
        return -1;
    }
    *s_p = s;
    return 0;
}

static void ib_detach(zc_session_t *s)
{
    int st = zc_session_detach(s, 1);

    if (st != ZC_OK) {
        ib_fail("detach", st);
    }
    zc_session_close(s);
}

/* ---- (a) round trip ------------------------------------------------------------------ */

typedef struct ib_rtt {
    double p50, p99, mean, min;
} ib_rtt_t;

static int ib_measure_rtt(const ib_opts_t *o, const ib_daemon_t *d, ib_rtt_t *out)
{
    unsigned warm = o->iters / 10 + 100;
    double *t = calloc(o->iters, sizeof(double));
    double sum = 0;
    zc_session_t *s = NULL;
    zc_slot_t slot;
    int st, rc = -1;

    if (t == NULL || ib_attach(d, "ipc_bench_rtt", IB_TINY_NUMEL, &s) != 0) {
        goto out;
    }
    st = zc_session_slot_acquire(s, 0, -1, &slot);
    if (st != ZC_OK) {
        ib_fail("slot_acquire", st);
        goto out_detach;
    }
    for (uint32_t i = 0; i < IB_TINY_NUMEL; i++) {
        ((float *)slot.data)[i] = 1e-3f;
    }
    for (unsigned i = 0; i < warm + o->iters; i++) {
        double t0 = zs_time_now_s();

        st = zc_session_slot_submit(s, &slot, 0);
        if (st == ZC_OK) {
            /* one slot: acquire returns when its SlotFree arrived */
            st = zc_session_slot_acquire(s, 0, -1, &slot);
        }
        if (st != ZC_OK) {
            ib_fail("round trip", st);
            goto out_detach;
        }
        if (i >= warm) {
            t[i - warm] = zs_time_now_s() - t0;
        }
    }
    /* the last acquired slot is never submitted: detach does not need it */
    zb_sort(t, o->iters);
    for (unsigned i = 0; i < o->iters; i++) {
        sum += t[i];
    }
    out->p50 = t[o->iters / 2];
    out->p99 = t[(size_t)((double)o->iters * 0.99)];
    out->mean = sum / o->iters;
    out->min = t[0];
    rc = 0;
out_detach:
    ib_detach(s);
out:
    free(t);
    return rc;
}

/* ---- (b) throughput ------------------------------------------------------------------ */

typedef struct ib_tput {
    unsigned mib;
    double ipc_gbps, acc_gbps, memcpy_gbps; /* best round of each */
} ib_tput_t;

/* Local peers and the daemon, measured in alternating rounds so that a noisy neighbour hits
 * them alike; each reports its best round. */
typedef struct ib_size_ctx {
    size_t bytes, n;
    unsigned reps, slots;
    zk_exec_t ex;
    float *acc, *src, *dst;
    zc_session_t *s;
    zc_slot_t held[64]; /* slots acquired back at the end of a round, submitted first next */
    unsigned n_held;
} ib_size_ctx_t;

static double ib_round_local(ib_size_ctx_t *c, double *memcpy_gbps_p)
{
    double t0 = zs_time_now_s(), acc_gbps;

    for (unsigned r = 0; r < c->reps; r++) {
        zk_accumulate(&c->ex, c->acc, c->src, ZS_DTYPE_F32, 1.0f, c->n);
    }
    acc_gbps = (double)c->bytes * c->reps / (zs_time_now_s() - t0) / 1e9;
    t0 = zs_time_now_s();
    for (unsigned r = 0; r < c->reps; r++) {
        c->src[r % c->n] = (float)r; /* keep the copies from being folded */
        memcpy(c->dst, c->src, c->bytes);
    }
    *memcpy_gbps_p = (double)c->bytes * c->reps / (zs_time_now_s() - t0) / 1e9;
    return acc_gbps;
}

/* reps buckets submit -> SlotFree, every slot kept busy; ends with every slot back. */
static int ib_round_ipc(ib_size_ctx_t *c, double *gbps_p)
{
    zc_slot_t slot;
    double t0 = zs_time_now_s();
    int st = ZC_OK;

    for (unsigned r = 0; r < c->reps && st == ZC_OK; r++) {
        if (c->n_held > 0) {
            slot = c->held[--c->n_held];
        } else {
            st = zc_session_slot_acquire(c->s, 0, -1, &slot);
        }
        if (st == ZC_OK) {
            st = zc_session_slot_submit(c->s, &slot, 0);
        }
    }
    /* drain: acquiring every slot returns once each SlotFree is in */
    while (st == ZC_OK && c->n_held < c->slots) {
        st = zc_session_slot_acquire(c->s, 0, -1, &c->held[c->n_held]);
        c->n_held += st == ZC_OK;
    }
    if (st != ZC_OK) {
        return ib_fail("bucket round", st);
    }
    *gbps_p = (double)c->bytes * c->reps / (zs_time_now_s() - t0) / 1e9;
    return 0;
}

static int ib_measure_size(const ib_opts_t *o, const ib_daemon_t *d, unsigned slots, size_t bytes,
                           ib_tput_t *out)
{
    ib_size_ctx_t c;
    zk_pool_t *pool = NULL;
    int rc = -1;

    memset(&c, 0, sizeof(c));
    c.bytes = bytes;
    c.n = bytes / sizeof(float);
    c.reps = (unsigned)(IB_BYTES_PER_SZ / bytes) < 4 ? 4 : (unsigned)(IB_BYTES_PER_SZ / bytes);
    c.slots = slots;
    c.ex.variant = ZK_VARIANT_DEFAULT;
    if (o->threads > 1) {
        if (zk_pool_create(o->threads, &pool) != ZS_OK) {
            fprintf(stderr, "ipc_bench: zk_pool_create(%u): %s\n", o->threads, zk_last_error());
            return -1;
        }
        c.ex.pool = pool;
    }
    if (posix_memalign((void **)&c.acc, 64, bytes) != 0 ||
        posix_memalign((void **)&c.src, 64, bytes) != 0 ||
        posix_memalign((void **)&c.dst, 64, bytes) != 0) {
        fprintf(stderr, "ipc_bench: out of memory for 3 x %zu bytes\n", bytes);
        goto out_free;
    }
    for (size_t i = 0; i < c.n; i++) {
        c.acc[i] = 0.0f;
        c.src[i] = 1e-3f;
        c.dst[i] = 0.0f;
    }
    if (zk_accumulate(&c.ex, c.acc, c.src, ZS_DTYPE_F32, 1.0f, c.n) != ZS_OK) {
        fprintf(stderr, "ipc_bench: zk_accumulate: %s\n", zk_last_error());
        goto out_free;
    }
    if (ib_attach(d, "ipc_bench_tput", c.n, &c.s) != 0) {
        goto out_free;
    }
    /* warm-up: the trainer writes every slot once (as backward would), the daemon faults in
     * its accumulator; the rounds then send the slots as they are */
    while (c.n_held < slots) {
        int st = zc_session_slot_acquire(c.s, 0, -1, &c.held[c.n_held]);
        if (st != ZC_OK) {
            ib_fail("warm-up", st);
            goto out_detach;
        }
        for (size_t k = 0; k < c.n; k++) {
            ((float *)c.held[c.n_held].data)[k] = 1e-3f;
        }
        c.n_held++;
    }
    {
        unsigned reps = c.reps;
        double g;
        c.reps = slots;
        if (ib_round_ipc(&c, &g) != 0) {
            goto out_detach;
        }
        c.reps = reps;
    }
    for (unsigned round = 0; round < IB_ROUNDS; round++) {
        double acc_gbps, memcpy_gbps, ipc_gbps;

        acc_gbps = ib_round_local(&c, &memcpy_gbps);
        if (ib_round_ipc(&c, &ipc_gbps) != 0) {
            goto out_detach;
        }
        out->acc_gbps = fmax(out->acc_gbps, acc_gbps);
        out->memcpy_gbps = fmax(out->memcpy_gbps, memcpy_gbps);
        out->ipc_gbps = fmax(out->ipc_gbps, ipc_gbps);
    }
    if (c.dst[0] < 0.0f || !(c.acc[c.n - 1] > 0.0f)) {
        fprintf(stderr, "ipc_bench: impossible local result\n");
        goto out_detach;
    }
    rc = 0;
out_detach:
    ib_detach(c.s); /* held slots need no submit: detach only waits for submitted ones */
out_free:
    free(c.acc);
    free(c.src);
    free(c.dst);
    zk_pool_destroy(pool);
    return rc;
}

/* ---- options and main ---------------------------------------------------------------- */

static void ib_usage(FILE *out)
{
    fprintf(out,
            "Usage: ipc_bench [OPTIONS]\n"
            "Round trip and throughput of gradient buckets through libzc and a zerod it starts.\n"
            "\n"
            "  --zerod PATH      daemon binary (default: ../daemon/zerod next to ipc_bench)\n"
            "  --threads T       kernel threads of the daemon and of the local peer (default 1)\n"
            "  --iters N         round trips timed (default 20000)\n"
            "  --sizes LIST      bucket sizes in MiB (default 16,64,256)\n"
            "  --json            one JSON object per line instead of the table\n"
            "  -h, --help        print this help and exit\n");
}

static int ib_parse(int argc, char **argv, ib_opts_t *o)
{
    static const struct option longopts[] = {
        {"zerod", required_argument, NULL, 'z'},
        {"threads", required_argument, NULL, 't'},
        {"iters", required_argument, NULL, 'n'},
        {"sizes", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'z':
            o->zerod = optarg;
            break;
        case 't':
            if (zb_parse_uint("ipc_bench", "threads", optarg, 1, 256, &o->threads) != 0) {
                return 2;
            }
            break;
        case 'n':
            if (zb_parse_uint("ipc_bench", "iters", optarg, 100, 10000000, &o->iters) != 0) {
                return 2;
            }
            break;
        case 's':
            o->n_sizes = zb_parse_sizes("ipc_bench", optarg, o->sizes_mib, IB_MAX_SIZES);
            if (o->n_sizes == 0) {
                return 2;
            }
            break;
        case 'j':
            o->json = 1;
            break;
        case 'h':
            ib_usage(stdout);
            return -1;
        default:
            return zb_usage_error("ipc_bench");
        }
    }
    if (zb_no_operands("ipc_bench", argc, argv) != 0 ||
        zb_zerod_locate("ipc_bench", &o->zerod) != 0) {
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    ib_opts_t o = {.zerod = NULL,
                   .threads = 1,
                   .iters = 20000,
                   .sizes_mib = {16, 64, 256},
                   .n_sizes = 3,
                   .json = 0};
    const unsigned tput_slots = 2;
    ib_daemon_t d;
    ib_rtt_t rtt = {0, 0, 0, 0};
    int rc;

    rc = ib_parse(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    signal(SIGPIPE, SIG_IGN);

    /* (a) one slot, so that acquiring it again waits for its SlotFree */
    if (ib_daemon_start(&o, 1, &d) != 0) {
        return 1;
    }
    rc = ib_measure_rtt(&o, &d, &rtt);
    if (ib_daemon_stop(&d) != 0 || rc != 0) {
        return 1;
    }
    if (o.json) {
        printf("{\"bench\": \"ipc\", \"metric\": \"round_trip\", \"numel\": %d, \"iters\": %u, "
               "\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"min_us\": %.2f, "
               "\"target_p50_us\": %.0f, \"p50_vs_target\": %.3f}\n",
               IB_TINY_NUMEL, o.iters, rtt.p50 * 1e6, rtt.p99 * 1e6, rtt.mean * 1e6, rtt.min * 1e6,
               IB_TARGET_P50 * 1e6, rtt.p50 / IB_TARGET_P50);
    } else {
        printf("ipc_bench: zerod %s, cpu, %u kernel thread%s, variant %s\n", o.zerod, o.threads,
               o.threads > 1 ? "s" : "", zk_variant_name(zk_default_variant()));
        printf("\nround trip BucketReady -> SlotFree, %d fp32 elements, 1 slot, %u iterations\n",
               IB_TINY_NUMEL, o.iters);
        printf("%10s %10s %10s %10s %14s %8s\n", "p50 [us]", "p99 [us]", "mean [us]", "min [us]",
               "target p50", "p50/tgt");
        printf("%10.2f %10.2f %10.2f %10.2f %11s %2.0f %8.3f  %s\n", rtt.p50 * 1e6, rtt.p99 * 1e6,
               rtt.mean * 1e6, rtt.min * 1e6, "<=", IB_TARGET_P50 * 1e6, rtt.p50 / IB_TARGET_P50,
               rtt.p50 <= IB_TARGET_P50 ? "met" : "NOT met");
        printf("\nthroughput, fp32 gradient bytes submit -> SlotFree, %u slots, vs the same "
               "run's zk_accumulate and memcpy (best of %d alternating rounds)\n",
               tput_slots, IB_ROUNDS);
        printf("%12s %10s %12s %12s %10s %10s %8s\n", "bucket [MiB]", "ipc GB/s", "accum GB/s",
               "memcpy GB/s", "ipc/accum", "ipc/memcpy", "target");
    }
    fflush(stdout);

    /* (b) one size at a time, to bound memory: 3 local buffers + the job's regions */
    if (ib_daemon_start(&o, tput_slots, &d) != 0) {
        return 1;
    }
    for (unsigned i = 0; i < o.n_sizes && rc == 0; i++) {
        size_t bytes = (size_t)o.sizes_mib[i] << 20;
        ib_tput_t t = {.mib = o.sizes_mib[i]};
        double ratio;

        rc = ib_measure_size(&o, &d, tput_slots, bytes, &t);
        if (rc != 0) {
            break;
        }
        ratio = t.ipc_gbps / t.acc_gbps;
        if (o.json) {
            printf("{\"bench\": \"ipc\", \"metric\": \"throughput\", \"bucket_mib\": %u, "
                   "\"slots\": %u, \"threads\": %u, \"ipc_gbps\": %.3f, "
                   "\"accumulate_gbps\": %.3f, \"memcpy_gbps\": %.3f, "
                   "\"ratio_vs_accumulate\": %.3f, \"ratio_vs_memcpy\": %.3f, "
                   "\"target_ratio\": %.1f}\n",
                   t.mib, tput_slots, o.threads, t.ipc_gbps, t.acc_gbps, t.memcpy_gbps, ratio,
                   t.ipc_gbps / t.memcpy_gbps, IB_TARGET_RATIO);
        } else {
            printf("%12u %10.2f %12.2f %12.2f %10.3f %10.3f %5s%.1f  %s\n", t.mib, t.ipc_gbps,
                   t.acc_gbps, t.memcpy_gbps, ratio, t.ipc_gbps / t.memcpy_gbps,
                   ">=", IB_TARGET_RATIO, ratio >= IB_TARGET_RATIO ? "met" : "NOT met");
        }
        fflush(stdout);
    }
    if (ib_daemon_stop(&d) != 0) {
        return 1;
    }
    return rc == 0 ? 0 : 1;
}
