/*
 * step_bench: end-to-end optimizer step time at world 2 (or 1) on this host: real zerods (a
 * mesh over UCX, as tests/integration/mesh_test.sh starts them) and as many trainers (forked
 * processes using libzc), one fp32 job of 32 Mi parameters (4 x 8 Mi elements; --params: more
 * of them), AdamW, ZeRO stage 2, reduce_bucket_size 8 Mi elements (buckets of 32 MiB).
 *
 * One step, as a trainer does it: for each bucket, acquire a gradient slot (waits while the
 * daemon's slots are busy: back-pressure from the reduce-scatter), copy the bucket's synthetic
 * gradients into it (what a backward hook does), submit; then zc_session_step (waits for the
 * last reduce-scatters, then the shard's AdamW, the global norm, and the all-gather into the
 * params region). Reported: the median over the timed steps of the slower rank's step time,
 * parameters per second, and each rank's median breakdown (acquire wait, gradient copy, step
 * call). --own-slices: each trainer writes only its own slices of the initial values, as
 * zerod.torch does, and the daemons share one params region. Then each daemon's own view of the
 * timed steps (docs/metrics.md, scraped from its /metrics before and after them): the mean of each
 * step phase and its time per shard element, which stays flat as the shard grows when the daemon
 * runs at the memory's speed, and the CPU seconds and minor page faults the daemon took per step
 * (/proc/PID/stat).
 *
 *   step_bench [--zerod PATH] [--params MI] [--world N] [--own-slices] [--steps N] [--warmup N]
 *              [--json]
 */
#define _GNU_SOURCE
#include "bench_util.h"

#include <zerod/zc.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#define SB_WORLD      2u /* at most */
#define SB_PARAM_MI   8u
#define SB_PARAM_EL   ((uint64_t)SB_PARAM_MI << 20) /* elements per parameter */
#define SB_BUCKET_EL  (8ull << 20)                  /* reduce_bucket_size */
#define SB_MAX_PARAMS 128u                          /* 1 Gi elements */
#define SB_MAX_STEPS  100u

typedef struct sb_opts {
    const char *zerod;
    unsigned steps, warmup, world, n_params;
    int json, own_slices;
} sb_opts_t;

/* Phases of a step as the daemon measures them (docs/metrics.md "Step phases"), and the
 * reduce-scatter's transfer time (its wait for the other rank left out). */
enum { SB_RS, SB_RS_XFER, SB_NORM, SB_ADAM, SB_AG, SB_N_PHASES };

/* One daemon at one moment: its phase sums and counts, seconds on a core and runnable off one,
 * minor faults, and the kernels' store plan it logged. */
typedef struct sb_probe {
    double sum[SB_N_PHASES], count[SB_N_PHASES], cpu_s, wait_s, minflt;
    char stores[1024];
} sb_probe_t;

/* One timed step of one rank, sent to the parent. */
typedef struct sb_step {
    double total, acquire, fill, step;
} sb_step_t;

typedef struct sb_env {
    char dir[64];
    char token[128];
    char coord[32];
    zb_zerod_t daemon[SB_WORLD];
} sb_env_t;

/* ---- the daemons ----------------------------------------------------------------------- */

static int sb_daemon_start(const sb_opts_t *o, sb_env_t *e, unsigned i)
{
    char device[16];
    zb_zerod_t *z = &e->daemon[i];
    /* clang-format off */
    const char *const args[] = {
        "--device", device,
        "--token-file", e->token,
        "--mesh-timeout", "20s",
        "--collective-timeout", "60s",
        "--heartbeat-interval", "1s",
        "--threads", "1",
        "--max-shard-bytes", "8GiB",
        "--job-linger", "5s",
        NULL,
    };
    /* clang-format on */

    char dir[sizeof(e->dir)]; /* a copy: z is inside e, and snprintf's arguments are restrict */

    memcpy(dir, e->dir, sizeof(dir));
    z->prog = "step_bench";
    snprintf(z->name, sizeof(z->name), "zerod %u", (unsigned char)i); /* i < SB_WORLD */
    snprintf(z->sock, sizeof(z->sock), "%s/z%u.sock", dir, i);
    snprintf(z->log, sizeof(z->log), "%s/d%u.log", dir, i);
    z->tail_lines = 15;
    snprintf(device, sizeof(device), "cpu:%u", i);
    return zb_zerod_start(z, o->zerod, args);
}

/* SIGTERM each; every daemon must exit 0. Removes the directory. */
static int sb_daemons_stop(sb_env_t *e)
{
    int rc = 0;

    for (unsigned i = 0; i < SB_WORLD; i++) {
        if (e->daemon[i].prog != NULL && zb_zerod_stop(&e->daemon[i]) != 0) {
            rc = -1;
        }
    }
    unlink(e->token);
    rmdir(e->dir);
    return rc;
}

/* ---- one trainer ----------------------------------------------------------------------- */

static int sb_fail(unsigned rank, const char *what, int st)
{
    fprintf(stderr, "step_bench: trainer %u: %s: %s (%s)\n", rank, what, zc_last_error(),
            zc_status_name(st));
    return 1;
}

/* What the daemon's log says after "kernel stores: " into buf (its line's end cut); -1 when it
 * has not said it. */
static int sb_log_stores(const char *log, char *buf, size_t len)
{
    static const char key[] = "kernel stores: ";
    char line[4096], *at = NULL;
    FILE *f = fopen(log, "re");

    while (f != NULL && at == NULL && fgets(line, sizeof(line), f) != NULL) {
        at = strstr(line, key);
    }
    if (f != NULL) {
        fclose(f);
    }
    if (at == NULL) {
        return -1;
    }
    at[strcspn(at, "\r\n")] = '\0';
    snprintf(buf, len, "%s", at + sizeof(key) - 1);
    return 0;
}

/* Until the daemon has logged its kernels' store plan: it measures one on a thread of its own
 * at the first attach of a large shard, for seconds, and the steps meanwhile run beside it with
 * regular stores; the timed steps come after. At most 60 s. */
static void sb_wait_stores(const char *log)
{
    char plan[256];

    for (int i = 0; i < 1200; i++) {
        if (sb_log_stores(log, plan, sizeof(plan)) == 0) {
            return;
        }
        usleep(50000);
    }
    fprintf(stderr, "step_bench: %s logged no store plan in 60 s; timing anyway\n", log);
}

static int sb_trainer(const sb_opts_t *o, const sb_env_t *e, unsigned rank, int out_fd)
{
    uint64_t numel[SB_MAX_PARAMS];
    char config[256];
    zc_open_params_t op;
    zc_attach_params_t ap;
    zc_attach_info_t info;
    zc_group_t g;
    zc_session_t *s = NULL;
    float *grad = NULL;
    int st, rc = 1;

    for (unsigned i = 0; i < o->n_params; i++) {
        numel[i] = SB_PARAM_EL;
    }
    grad = malloc(SB_PARAM_EL * sizeof(float));
    if (grad == NULL) {
        fprintf(stderr, "step_bench: trainer %u: out of memory\n", rank);
        return 1;
    }
    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS;
    op.socket_path = e->daemon[rank].sock;
    op.timeout_ms = 120000;
    st = zc_session_open(&op, &s);
    if (st != ZC_OK) {
        rc = sb_fail(rank, "open", st);
        goto out;
    }
    snprintf(config, sizeof(config),
             "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, "
             "\"weight_decay\": 0.01}}, \"zero_optimization\": {\"stage\": 2, "
             "\"reduce_bucket_size\": %llu}}",
             (unsigned long long)SB_BUCKET_EL);
    g.n_params = o->n_params;
    g.numel = numel;
    g.options_json = NULL;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_RANK | ZC_ATTACH_FIELD_WORLD |
                    ZC_ATTACH_FIELD_COORDINATOR | ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS |
                    ZC_ATTACH_FIELD_CONFIG_JSON | ZC_ATTACH_FIELD_OWN_SLICES;
    ap.job_id = "step_bench";
    ap.rank = rank;
    ap.world = o->world;
    ap.coordinator = e->coord;
    ap.dtype = ZC_DTYPE_F32;
    ap.n_groups = 1;
    ap.groups = &g;
    ap.config_json = config;
    ap.own_slices_only = o->own_slices;
    st = zc_session_attach(s, &ap, &info);
    if (st != ZC_OK) {
        rc = sb_fail(rank, "attach", st);
        goto out_close;
    }
    if (rank == 0 && !o->json) {
        printf("job: %u params, %u buckets, %u slots, %llu elements (bucket-padded), stage %u\n",
               info.n_params, info.n_buckets, info.n_slots, (unsigned long long)info.total_numel,
               info.stage);
        fflush(stdout);
    }
    for (uint64_t k = 0; k < SB_PARAM_EL; k++) { /* the initial values, of every parameter */
        grad[k] = 0.02f * (float)((int)(k % 11) - 5);
    }
    for (uint32_t id = 0; id < o->n_params && st == ZC_OK; id++) {
        st = zc_session_init_param(s, id, grad);
    }
    for (uint64_t k = 0; k < SB_PARAM_EL; k++) {
        grad[k] = 1e-3f * (float)((int)((k * 2654435761u + rank) % 17) - 8);
    }
    if (st == ZC_OK) {
        st = zc_session_params_ready(s);
    }
    if (st != ZC_OK) {
        rc = sb_fail(rank, "init_param or params_ready", st);
        goto out_detach;
    }
    for (unsigned it = 0; it < o->warmup + o->steps; it++) {
        sb_step_t t = {0, 0, 0, 0};
        zc_step_result_t res;
        double t0, t1;

        if (it == (o->warmup > 0 ? o->warmup - 1 : 0)) { /* the last warm-up step lines up */
            sb_wait_stores(e->daemon[rank].log);
        }
        t0 = zs_time_now_s();

        for (uint32_t b = 0; b < info.n_buckets; b++) {
            zc_bucket_info_t bi;
            zc_slot_t slot;
            double ta = zs_time_now_s(), tb;

            st = zc_session_bucket_info(s, b, &bi);
            if (st == ZC_OK) {
                st = zc_session_slot_acquire(s, b, -1, &slot);
            }
            if (st != ZC_OK) {
                rc = sb_fail(rank, "slot_acquire", st);
                goto out_detach;
            }
            tb = zs_time_now_s();
            for (uint32_t i = 0; i < bi.n_params && st == ZC_OK; i++) {
                zc_bucket_piece_t pc;

                st = zc_session_bucket_piece(s, b, i, &pc);
                if (st == ZC_OK) {
                    memcpy((float *)slot.data + pc.slot_offset, grad + pc.param_offset,
                           pc.numel * sizeof(float));
                }
            }
            t1 = zs_time_now_s();
            if (st == ZC_OK) {
                st = zc_session_slot_submit(s, &slot, 0);
            }
            if (st != ZC_OK) {
                rc = sb_fail(rank, "slot_submit", st);
                goto out_detach;
            }
            t.acquire += tb - ta;
            t.fill += t1 - tb;
        }
        t1 = zs_time_now_s();
        st = zc_session_step(s, NULL, &res);
        if (st != ZC_OK || res.skipped) {
            rc = sb_fail(rank, res.skipped ? "step skipped" : "step", st);
            goto out_detach;
        }
        t.step = zs_time_now_s() - t1;
        t.total = zs_time_now_s() - t0;
        if (it >= o->warmup && zb_write_all(out_fd, &t, sizeof(t)) != 0) {
            fprintf(stderr, "step_bench: trainer %u: lost the parent\n", rank);
            goto out_detach;
        }
    }
    rc = 0;
out_detach:
    st = zc_session_detach(s, 1);
    if (st != ZC_OK && rc == 0) {
        rc = sb_fail(rank, "detach", st);
    }
out_close:
    zc_session_close(s);
out:
    free(grad);
    return rc;
}

/* ---- the daemons' own view ------------------------------------------------------------- */

/* Seconds on a core and waiting for one (runnable, another task on it) of all of pid's threads,
 * from their /proc/PID/task/TID/schedstat; its minor faults from /proc/PID/stat. */
static void sb_proc_stat(pid_t pid, sb_probe_t *p)
{
    char path[96], line[1024], *c;
    unsigned long long on = 0, wait = 0, minflt = 0;
    struct dirent *d;
    DIR *dir;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dir = opendir(path);
    while (dir != NULL && (d = readdir(dir)) != NULL) {
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", (int)pid, d->d_name);
        f = d->d_name[0] != '.' ? fopen(path, "re") : NULL;
        if (f != NULL && fscanf(f, "%llu %llu", &on, &wait) == 2) {
            p->cpu_s += (double)on * 1e-9;
            p->wait_s += (double)wait * 1e-9;
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    if (dir != NULL) {
        closedir(dir);
    }
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    c = f != NULL && fgets(line, sizeof(line), f) != NULL ? strrchr(line, ')') : NULL;
    /* after the name: state ppid pgrp session tty tpgid flags minflt */
    if (c != NULL && sscanf(c + 2, "%*c %*d %*d %*d %*d %*d %*u %llu", &minflt) == 1) {
        p->minflt = (double)minflt;
    }
    if (f != NULL) {
        fclose(f);
    }
}

static int sb_probe(const zb_zerod_t *z, sb_probe_t *p)
{
    static const char *const phase[SB_N_PHASES] = {"reduce_scatter", "", "norm", "adam",
                                                   "all_gather"};
    const char *h = "zerod_step_phase_duration_seconds";
    size_t cap = 1u << 20;
    char *buf = malloc(cap), label[64], name[96];

    if (buf == NULL || zb_zerod_metrics(z, buf, cap) != 0) {
        fprintf(stderr, "step_bench: cannot read %s's /metrics\n", z->name);
        free(buf);
        return -1;
    }
    for (int k = 0; k < SB_N_PHASES; k++) {
        if (k == SB_RS_XFER) {
            p->sum[k] = zb_metric(buf, "zerod_collective_transfer_seconds_total",
                                  "collective=\"reduce_scatter\"");
            continue;
        }
        snprintf(label, sizeof(label), "phase=\"%s\"", phase[k]);
        snprintf(name, sizeof(name), "%s_sum", h);
        p->sum[k] = zb_metric(buf, name, label);
        snprintf(name, sizeof(name), "%s_count", h);
        p->count[k] = zb_metric(buf, name, label);
    }
    p->count[SB_RS_XFER] = p->count[SB_RS];
    sb_proc_stat(z->pid, p);
    if (sb_log_stores(z->log, p->stores, sizeof(p->stores)) != 0) {
        snprintf(p->stores, sizeof(p->stores), "(none logged)");
    }
    free(buf);
    return 0;
}

/* ---- options and main ------------------------------------------------------------------ */

static void sb_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: step_bench [OPTIONS]\n"
        "Step time of an fp32 AdamW job (stage 2, buckets of 8 Mi) with 2 zerods and 2\n"
        "trainers on this host, and each daemon's phases per shard element.\n"
        "\n"
        "  --zerod PATH   daemon binary (default: ../daemon/zerod next to step_bench)\n"
        "  --params MI    parameters in Mi, a multiple of 8 up to 1024 (default 32)\n"
        "  --world N      ranks, 1 or 2 (default 2)\n"
        "  --own-slices   each trainer writes only its rank's slices, as zerod.torch does: the\n"
        "                 daemons then share one params region (the all-gather is a barrier)\n"
        "  --steps N      timed steps (default 10)\n"
        "  --warmup N     untimed steps first (default 3)\n"
        "  --json         one JSON object instead of the table\n"
        "  -h, --help     print this help and exit\n");
}

static int sb_parse(int argc, char **argv, sb_opts_t *o)
{
    static const struct option longopts[] = {
        {"zerod", required_argument, NULL, 'z'},
        {"steps", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'},
        {"params", required_argument, NULL, 'p'},
        {"world", required_argument, NULL, 'W'},
        {"json", no_argument, NULL, 'j'},
        {"own-slices", no_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    unsigned mi;
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'z':
            o->zerod = optarg;
            break;
        case 'n':
        case 'w':
            if (zb_parse_uint("step_bench", c == 'n' ? "steps" : "warmup", optarg, c == 'n',
                              SB_MAX_STEPS, c == 'n' ? &o->steps : &o->warmup) != 0) {
                return 2;
            }
            break;
        case 'p':
            if (zb_parse_uint("step_bench", "params", optarg, SB_PARAM_MI,
                              SB_MAX_PARAMS * SB_PARAM_MI, &mi) != 0) {
                return 2;
            }
            if (mi % SB_PARAM_MI != 0) {
                fprintf(stderr, "step_bench: --params %u is not a multiple of %u\n", mi,
                        SB_PARAM_MI);
                return 2;
            }
            o->n_params = mi / SB_PARAM_MI;
            break;
        case 'W':
            if (zb_parse_uint("step_bench", "world", optarg, 1, SB_WORLD, &o->world) != 0) {
                return 2;
            }
            break;
        case 'j':
            o->json = 1;
            break;
        case 'o':
            o->own_slices = 1;
            break;
        case 'h':
            sb_usage(stdout);
            return -1;
        default:
            return zb_usage_error("step_bench");
        }
    }
    if (zb_no_operands("step_bench", argc, argv) != 0 ||
        zb_zerod_locate("step_bench", &o->zerod) != 0) {
        return 2;
    }
    return 0;
}

/* Each daemon's timed steps: per phase, the mean (ms) and the time per shard element (ns);
 * CPU ms and minor faults per step. */
static void sb_report_daemons(const sb_opts_t *o, const sb_probe_t (*p)[2])
{
    static const char *const key[SB_N_PHASES] = {"reduce_scatter", "reduce_scatter_xfer", "norm",
                                                 "adam", "all_gather"};
    const double shard = (double)o->n_params * (double)SB_PARAM_EL / o->world;

    if (!o->json) {
        printf("\ndaemons over the timed steps (their /metrics): phase mean [ms] / per shard "
               "element [ns] (shard %.0f elements); rs_xfer = the reduce-scatter less its wait\n",
               shard);
        printf("%6s %17s %17s %17s %17s %17s %9s %9s %9s\n", "rank", "reduce_scatter", "rs_xfer",
               "norm", "adam", "all_gather", "cpu [ms]", "runq [ms]", "minflt");
    }
    for (unsigned r = 0; r < o->world; r++) {
        const sb_probe_t *a = &p[r][0], *b = &p[r][1];
        double steps = b->count[SB_ADAM] - a->count[SB_ADAM];

        steps = steps > 0 ? steps : 1;
        printf(o->json ? ", \"daemon%u\": {" : "%6u", r);
        for (int k = 0; k < SB_N_PHASES; k++) {
            double n = b->count[k] - a->count[k];
            double mean = n > 0 ? (b->sum[k] - a->sum[k]) / n : 0;
            if (o->json) {
                printf("\"%s_ms\": %.3f, \"%s_ns_per_el\": %.4f, ", key[k], mean * 1e3, key[k],
                       mean * 1e9 / shard);
            } else {
                printf(" %8.2f / %6.3f", mean * 1e3, mean * 1e9 / shard);
            }
        }
        printf(o->json ? "\"cpu_ms\": %.2f, \"runq_ms\": %.2f, \"minflt\": %.0f, "
                       : " %9.1f %9.1f %9.0f\n",
               (b->cpu_s - a->cpu_s) * 1e3 / steps, (b->wait_s - a->wait_s) * 1e3 / steps,
               (b->minflt - a->minflt) / steps);
        if (o->json) {
            printf("\"stores\": \"%s\"}", b->stores); /* the daemon's words: no quotes in them */
        }
    }
    if (!o->json) {
        printf("(per step, all the daemon's threads: cpu = on a core, runq = runnable but "
               "waiting for one)\n");
        for (unsigned r = 0; r < o->world; r++) {
            printf("daemon %u kernel stores: %s\n", r, p[r][1].stores);
        }
    }
}

static void sb_report(const sb_opts_t *o, sb_step_t (*t)[SB_MAX_STEPS], const sb_probe_t (*p)[2])
{
    double total[SB_MAX_STEPS] = {0}, part[SB_MAX_STEPS] = {0}, med[SB_WORLD][4], step_s, min_s;
    const double n = (double)o->n_params * (double)SB_PARAM_EL;

    for (unsigned i = 0; i < o->steps; i++) {
        total[i] = t[0][i].total;
        for (unsigned r = 1; r < o->world; r++) {
            total[i] = t[r][i].total > total[i] ? t[r][i].total : total[i];
        }
    }
    step_s = zb_median(total, o->steps);
    min_s = total[0];
    for (unsigned r = 0; r < o->world; r++) {
        for (int k = 0; k < 4; k++) {
            for (unsigned i = 0; i < o->steps; i++) {
                const sb_step_t *x = &t[r][i];
                part[i] = k == 0 ? x->total : k == 1 ? x->acquire : k == 2 ? x->fill : x->step;
            }
            med[r][k] = zb_median(part, o->steps);
        }
    }
    if (o->json) {
        printf("{\"bench\": \"step\", \"schema_version\": 2, \"world\": %u, \"params\": %.0f, "
               "\"dtype\": \"fp32\", \"optimizer\": \"AdamW\", \"stage\": 2, "
               "\"reduce_bucket_size\": %llu, \"steps\": %u, \"step_ms\": %.2f, "
               "\"min_step_ms\": %.2f, \"params_per_s\": %.4g, \"own_slices\": %s",
               o->world, n, (unsigned long long)SB_BUCKET_EL, o->steps, step_s * 1e3, min_s * 1e3,
               n / step_s, o->own_slices ? "true" : "false");
        for (unsigned r = 0; r < o->world; r++) {
            printf(", \"rank%u_ms\": {\"total\": %.2f, \"acquire\": %.2f, \"fill\": %.2f, "
                   "\"step\": %.2f}",
                   r, med[r][0] * 1e3, med[r][1] * 1e3, med[r][2] * 1e3, med[r][3] * 1e3);
        }
        sb_report_daemons(o, p);
        printf("}\n");
        return;
    }
    printf("\nstep time, median of %u steps (slowest rank), after %u warm-up steps\n", o->steps,
           o->warmup);
    printf("%10s %10s %14s\n", "step [ms]", "min [ms]", "params/s");
    printf("%10.2f %10.2f %14.4g\n", step_s * 1e3, min_s * 1e3, n / step_s);
    printf("\nper rank, medians [ms]: acquire = waiting for a free slot (reduce-scatter "
           "back-pressure), fill = copying gradients into slots,\nstep = zc_session_step "
           "(last reduce-scatters, AdamW on the shard, norm, all-gather)\n");
    printf("%6s %10s %10s %10s %10s %10s\n", "rank", "total", "acquire", "fill", "step", "rest");
    for (unsigned r = 0; r < o->world; r++) {
        printf("%6u %10.2f %10.2f %10.2f %10.2f %10.2f\n", r, med[r][0] * 1e3, med[r][1] * 1e3,
               med[r][2] * 1e3, med[r][3] * 1e3,
               (med[r][0] - med[r][1] - med[r][2] - med[r][3]) * 1e3);
    }
    printf("(rest = the submit calls and bookkeeping, by difference of the medians)\n");
    sb_report_daemons(o, p);
}

/* Reads the trainers' timed steps into t; each daemon probed once every rank ended its first
 * timed step and again after the last (p[r][0], p[r][1]): the steps between are the daemons'
 * timed steps. Returns 1 on a failure. */
static int sb_collect(const sb_opts_t *o, const sb_env_t *e, const int fds[],
                      sb_step_t (*t)[SB_MAX_STEPS], sb_probe_t (*p)[2])
{
    for (unsigned i = 0; i < o->steps; i++) {
        for (unsigned r = 0; r < o->world; r++) {
            if (zb_read_all(fds[r], &t[r][i], sizeof(sb_step_t)) != 0) {
                fprintf(stderr, "step_bench: trainer %u stopped early\n", r);
                return 1;
            }
        }
        for (unsigned r = 0; r < o->world && (i == 0 || i + 1 == o->steps); r++) {
            if (sb_probe(&e->daemon[r], &p[r][i == 0 ? 0 : 1]) != 0) {
                return 1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    sb_opts_t o = {.zerod = NULL, .steps = 10, .warmup = 3, .world = 2, .n_params = 4, .json = 0};
    sb_env_t e;
    pid_t tp[SB_WORLD] = {0, 0};
    int fds[SB_WORLD] = {-1, -1}, rc, port, failed = 0;
    sb_step_t(*t)[SB_MAX_STEPS] = NULL;
    sb_probe_t p[SB_WORLD][2];

    rc = sb_parse(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    signal(SIGPIPE, SIG_IGN);
    memset(&e, 0, sizeof(e));
    memset(p, 0, sizeof(p));
    port = zb_free_port();
    if (port < 0) {
        fprintf(stderr, "step_bench: no free port: %s\n", strerror(errno));
        return 1;
    }
    if (zb_tmpdir_create("step_bench", e.dir, sizeof(e.dir)) != 0) {
        return 1;
    }
    snprintf(e.coord, sizeof(e.coord), "127.0.0.1:%d", port);
    t = calloc(SB_WORLD, sizeof(*t));
    if (t == NULL || zb_token_create("step_bench", e.dir, e.token, sizeof(e.token)) != 0) {
        free(t);
        rmdir(e.dir);
        return 1;
    }
    if (!o.json) {
        char load[64];

        zb_loadavg(load, sizeof(load));
        printf("step_bench: zerod %s, world %u on this host (cpu:N), 1 kernel thread each; %u "
               "params x %llu fp32 elements, AdamW, stage 2, reduce_bucket_size %llu%s; load "
               "average %s\n",
               o.zerod, o.world, o.n_params, (unsigned long long)SB_PARAM_EL,
               (unsigned long long)SB_BUCKET_EL, o.own_slices ? ", own slices" : "", load);
        fflush(stdout);
    }
    for (unsigned i = 0; i < o.world && !failed; i++) {
        failed = sb_daemon_start(&o, &e, i) != 0;
    }
    for (unsigned r = 0; r < o.world && !failed; r++) {
        int out_fd = -1;

        tp[r] = zb_child_fork("step_bench", fds, r, &out_fd);
        if (tp[r] == 0) {
            _exit(sb_trainer(&o, &e, r, out_fd));
        }
        if (tp[r] < 0) {
            tp[r] = 0;
            failed = 1;
        }
    }
    failed = failed || sb_collect(&o, &e, fds, t, p);
    failed = zb_children_reap("step_bench", NULL, tp, fds, o.world, failed);
    if (failed) {
        for (unsigned i = 0; i < o.world; i++) {
            if (e.daemon[i].log[0] != '\0') {
                fprintf(stderr, "--- zerod %u log\n", i);
                zb_log_tail("step_bench", e.daemon[i].log, 15);
            }
        }
    }
    if (sb_daemons_stop(&e) != 0) {
        failed = 1;
    }
    if (!failed) {
        sb_report(&o, t, (const sb_probe_t(*)[2])p);
    }
    free(t);
    return failed ? 1 : 0;
}
