/*
 * step_bench: end-to-end optimizer step time at world 2 on this host: 2 real zerods (a mesh
 * over UCX, as tests/integration/mesh_test.sh starts them) and 2 trainers (forked processes
 * using libzc), one fp32 job of 32 Mi parameters (4 x 8 Mi elements), AdamW, ZeRO stage 2,
 * reduce_bucket_size 8 Mi elements (4 buckets of 32 MiB).
 *
 * One step, as a trainer does it: for each bucket, acquire a gradient slot (waits while the
 * daemon's slots are busy: back-pressure from the reduce-scatter), copy the bucket's synthetic
 * gradients into it (what a backward hook does), submit; then zc_session_step (waits for the
 * last reduce-scatters, then the shard's AdamW, the global norm, and the all-gather into the
 * params region). Reported: the median over the timed steps of the slower rank's step time,
 * parameters per second, and each rank's median breakdown (acquire wait, gradient copy, step
 * call).
 *
 *   step_bench [--zerod PATH] [--steps N] [--warmup N] [--json]
 */
#define _GNU_SOURCE
#include "bench_util.h"

#include <zerod/zc.h>

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define SB_WORLD     2u
#define SB_N_PARAMS  4u
#define SB_PARAM_EL  (8ull << 20) /* elements per parameter */
#define SB_BUCKET_EL (8ull << 20) /* reduce_bucket_size */
#define SB_MAX_STEPS 100u

typedef struct sb_opts {
    const char *zerod;
    unsigned steps, warmup;
    int json;
} sb_opts_t;

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

    z->prog = "step_bench";
    snprintf(z->name, sizeof(z->name), "zerod %u", i);
    snprintf(z->sock, sizeof(z->sock), "%s/z%u.sock", e->dir, i);
    snprintf(z->log, sizeof(z->log), "%s/d%u.log", e->dir, i);
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

static int sb_trainer(const sb_opts_t *o, const sb_env_t *e, unsigned rank, int out_fd)
{
    uint64_t numel[SB_N_PARAMS];
    char config[256];
    zc_open_params_t op;
    zc_attach_params_t ap;
    zc_attach_info_t info;
    zc_group_t g;
    zc_session_t *s = NULL;
    float *grad = NULL;
    int st, rc = 1;

    for (unsigned i = 0; i < SB_N_PARAMS; i++) {
        numel[i] = SB_PARAM_EL;
    }
    grad = malloc(SB_PARAM_EL * sizeof(float));
    if (grad == NULL) {
        fprintf(stderr, "step_bench: trainer %u: out of memory\n", rank);
        return 1;
    }
    for (uint64_t k = 0; k < SB_PARAM_EL; k++) {
        grad[k] = 1e-3f * (float)((int)((k * 2654435761u + rank) % 17) - 8);
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
    g.n_params = SB_N_PARAMS;
    g.numel = numel;
    g.options_json = NULL;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_RANK | ZC_ATTACH_FIELD_WORLD |
                    ZC_ATTACH_FIELD_COORDINATOR | ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS |
                    ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = "step_bench";
    ap.rank = rank;
    ap.world = SB_WORLD;
    ap.coordinator = e->coord;
    ap.dtype = ZC_DTYPE_F32;
    ap.n_groups = 1;
    ap.groups = &g;
    ap.config_json = config;
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
    for (uint32_t id = 0; id < SB_N_PARAMS; id++) {
        float *p = zc_session_param_ptr(s, id);
        for (uint64_t k = 0; k < SB_PARAM_EL; k++) {
            p[k] = 0.02f * (float)((int)(k % 11) - 5);
        }
    }
    st = zc_session_params_ready(s);
    if (st != ZC_OK) {
        rc = sb_fail(rank, "params_ready", st);
        goto out_detach;
    }
    for (unsigned it = 0; it < o->warmup + o->steps; it++) {
        sb_step_t t = {0, 0, 0, 0};
        zc_step_result_t res;
        double t0 = zs_time_now_s(), t1;

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

/* ---- options and main ------------------------------------------------------------------ */

static void sb_usage(FILE *out)
{
    fprintf(out,
            "Usage: step_bench [OPTIONS]\n"
            "Step time of a 32 Mi-parameter fp32 AdamW job (stage 2, 4 buckets of 8 Mi) with 2\n"
            "zerods and 2 trainers on this host.\n"
            "\n"
            "  --zerod PATH   daemon binary (default: ../daemon/zerod next to step_bench)\n"
            "  --steps N      timed steps (default 10)\n"
            "  --warmup N     untimed steps first (default 3)\n"
            "  --json         one JSON object instead of the table\n"
            "  -h, --help     print this help and exit\n");
}

static int sb_parse(int argc, char **argv, sb_opts_t *o)
{
    static const struct option longopts[] = {
        {"zerod", required_argument, NULL, 'z'},  {"steps", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, 'w'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
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
        case 'j':
            o->json = 1;
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

static void sb_report(const sb_opts_t *o, sb_step_t (*t)[SB_MAX_STEPS])
{
    double total[SB_MAX_STEPS] = {0}, part[SB_MAX_STEPS] = {0}, med[SB_WORLD][4], step_s, min_s;
    const double n = (double)SB_N_PARAMS * (double)SB_PARAM_EL;

    for (unsigned i = 0; i < o->steps; i++) {
        total[i] = t[0][i].total > t[1][i].total ? t[0][i].total : t[1][i].total;
    }
    step_s = zb_median(total, o->steps);
    min_s = total[0];
    for (unsigned r = 0; r < SB_WORLD; r++) {
        for (int k = 0; k < 4; k++) {
            for (unsigned i = 0; i < o->steps; i++) {
                const sb_step_t *x = &t[r][i];
                part[i] = k == 0 ? x->total : k == 1 ? x->acquire : k == 2 ? x->fill : x->step;
            }
            med[r][k] = zb_median(part, o->steps);
        }
    }
    if (o->json) {
        printf("{\"bench\": \"step\", \"schema_version\": 1, \"world\": %u, \"params\": %.0f, "
               "\"dtype\": \"fp32\", \"optimizer\": \"AdamW\", \"stage\": 2, "
               "\"reduce_bucket_size\": %llu, \"steps\": %u, \"step_ms\": %.2f, "
               "\"min_step_ms\": %.2f, \"params_per_s\": %.4g",
               SB_WORLD, n, (unsigned long long)SB_BUCKET_EL, o->steps, step_s * 1e3, min_s * 1e3,
               n / step_s);
        for (unsigned r = 0; r < SB_WORLD; r++) {
            printf(", \"rank%u_ms\": {\"total\": %.2f, \"acquire\": %.2f, \"fill\": %.2f, "
                   "\"step\": %.2f}",
                   r, med[r][0] * 1e3, med[r][1] * 1e3, med[r][2] * 1e3, med[r][3] * 1e3);
        }
        printf("}\n");
        return;
    }
    printf("\nstep time, median of %u steps (slower rank), after %u warm-up steps\n", o->steps,
           o->warmup);
    printf("%10s %10s %14s\n", "step [ms]", "min [ms]", "params/s");
    printf("%10.2f %10.2f %14.4g\n", step_s * 1e3, min_s * 1e3, n / step_s);
    printf("\nper rank, medians [ms]: acquire = waiting for a free slot (reduce-scatter "
           "back-pressure), fill = copying gradients into slots,\nstep = zc_session_step "
           "(last reduce-scatters, AdamW on the shard, norm, all-gather)\n");
    printf("%6s %10s %10s %10s %10s %10s\n", "rank", "total", "acquire", "fill", "step", "rest");
    for (unsigned r = 0; r < SB_WORLD; r++) {
        printf("%6u %10.2f %10.2f %10.2f %10.2f %10.2f\n", r, med[r][0] * 1e3, med[r][1] * 1e3,
               med[r][2] * 1e3, med[r][3] * 1e3,
               (med[r][0] - med[r][1] - med[r][2] - med[r][3]) * 1e3);
    }
    printf("(rest = the submit calls and bookkeeping, by difference of the medians)\n");
}

int main(int argc, char **argv)
{
    sb_opts_t o = {.zerod = NULL, .steps = 10, .warmup = 3, .json = 0};
    sb_env_t e;
    pid_t tp[SB_WORLD] = {0, 0};
    int fds[SB_WORLD] = {-1, -1}, rc, port, failed = 0;
    sb_step_t(*t)[SB_MAX_STEPS] = NULL;

    rc = sb_parse(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    signal(SIGPIPE, SIG_IGN);
    memset(&e, 0, sizeof(e));
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
        printf("step_bench: zerod %s, world %u on this host (cpu:0, cpu:1), 1 kernel thread "
               "each; %u params x %llu fp32 elements, AdamW, stage 2, reduce_bucket_size %llu; "
               "load average %s\n",
               o.zerod, SB_WORLD, SB_N_PARAMS, (unsigned long long)SB_PARAM_EL,
               (unsigned long long)SB_BUCKET_EL, load);
        fflush(stdout);
    }
    for (unsigned i = 0; i < SB_WORLD && !failed; i++) {
        failed = sb_daemon_start(&o, &e, i) != 0;
    }
    for (unsigned r = 0; r < SB_WORLD && !failed; r++) {
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
    for (unsigned i = 0; i < o.steps && !failed; i++) {
        for (unsigned r = 0; r < SB_WORLD; r++) {
            if (zb_read_all(fds[r], &t[r][i], sizeof(sb_step_t)) != 0) {
                fprintf(stderr, "step_bench: trainer %u stopped early\n", r);
                failed = 1;
                break;
            }
        }
    }
    failed = zb_children_reap("step_bench", NULL, tp, fds, SB_WORLD, failed);
    if (failed) {
        for (unsigned i = 0; i < SB_WORLD; i++) {
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
        sb_report(&o, t);
    }
    free(t);
    return failed ? 1 : 0;
}
