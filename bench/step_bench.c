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
#include <zerod/zc.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
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
    char sock[SB_WORLD][128];
    char log[SB_WORLD][128];
    char coord[32];
    pid_t daemon[SB_WORLD];
} sb_env_t;

static double sb_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int sb_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static double sb_median(double *v, unsigned n)
{
    qsort(v, n, sizeof(double), sb_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int sb_io_all(int fd, void *buf, size_t len, int writing)
{
    char *p = buf;

    while (len > 0) {
        ssize_t n = writing ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int sb_free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

    if (fd < 0) {
        return -1;
    }
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

static void sb_log_tail(const char *path)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "tail -n 15 '%s' >&2", path);
    if (system(cmd) != 0) {
        fprintf(stderr, "step_bench: (no log at %s)\n", path);
    }
}

/* ---- the daemons ----------------------------------------------------------------------- */

static int sb_write_token(sb_env_t *e)
{
    unsigned char raw[32];
    char hex[65];
    FILE *f = fopen("/dev/urandom", "rb");
    int fd;

    if (f == NULL || fread(raw, 1, sizeof(raw), f) != sizeof(raw)) {
        fprintf(stderr, "step_bench: /dev/urandom: %s\n", strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    fclose(f);
    for (size_t i = 0; i < sizeof(raw); i++) {
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    }
    snprintf(e->token, sizeof(e->token), "%s/token", e->dir);
    fd = open(e->token, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || sb_io_all(fd, hex, 64, 1) != 0) {
        fprintf(stderr, "step_bench: writing %s: %s\n", e->token, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    close(fd);
    return 0;
}

static int sb_daemon_start(const sb_opts_t *o, sb_env_t *e, unsigned i)
{
    char device[16];
    zc_open_params_t op;
    double deadline;

    snprintf(e->sock[i], sizeof(e->sock[i]), "%s/z%u.sock", e->dir, i);
    snprintf(e->log[i], sizeof(e->log[i]), "%s/d%u.log", e->dir, i);
    snprintf(device, sizeof(device), "cpu:%u", i);
    fflush(NULL);
    e->daemon[i] = fork();
    if (e->daemon[i] < 0) {
        fprintf(stderr, "step_bench: fork: %s\n", strerror(errno));
        e->daemon[i] = 0;
        return -1;
    }
    if (e->daemon[i] == 0) {
        FILE *log = freopen(e->log[i], "w", stdout);
        if (log == NULL || dup2(fileno(stdout), STDERR_FILENO) < 0) {
            _exit(127);
        }
        execl(o->zerod, o->zerod, "--socket", e->sock[i], "--device", device, "--token-file",
              e->token, "--mesh-timeout", "20s", "--collective-timeout", "60s",
              "--heartbeat-interval", "1s", "--threads", "1", "--max-shard-bytes", "8GiB",
              "--job-linger", "5s", (char *)NULL);
        fprintf(stderr, "step_bench: exec %s: %s\n", o->zerod, strerror(errno));
        _exit(127);
    }
    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS;
    op.socket_path = e->sock[i];
    op.timeout_ms = 5000;
    deadline = sb_now() + 10.0;
    while (sb_now() < deadline) {
        zc_session_t *s = NULL;
        int wst;

        if (zc_session_open(&op, &s) == ZC_OK) {
            zc_session_close(s);
            return 0;
        }
        if (waitpid(e->daemon[i], &wst, WNOHANG) == e->daemon[i]) {
            fprintf(stderr, "step_bench: zerod %u exited before it was ready:\n", i);
            sb_log_tail(e->log[i]);
            e->daemon[i] = 0;
            return -1;
        }
        usleep(10000);
    }
    fprintf(stderr, "step_bench: zerod %u not ready within 10 s\n", i);
    sb_log_tail(e->log[i]);
    return -1;
}

/* SIGTERM each; every daemon must exit 0. Removes the directory. */
static int sb_daemons_stop(sb_env_t *e)
{
    int rc = 0;

    for (unsigned i = 0; i < SB_WORLD; i++) {
        int wst = 0;

        if (e->daemon[i] <= 0) {
            continue;
        }
        kill(e->daemon[i], SIGTERM);
        if (waitpid(e->daemon[i], &wst, 0) != e->daemon[i] || !WIFEXITED(wst) ||
            WEXITSTATUS(wst) != 0) {
            fprintf(stderr, "step_bench: zerod %u did not exit cleanly (status 0x%x):\n", i, wst);
            sb_log_tail(e->log[i]);
            rc = -1;
        }
        e->daemon[i] = 0;
    }
    for (unsigned i = 0; i < SB_WORLD; i++) {
        unlink(e->sock[i]);
        unlink(e->log[i]);
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
    op.socket_path = e->sock[rank];
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
        double t0 = sb_now(), t1;

        for (uint32_t b = 0; b < info.n_buckets; b++) {
            zc_bucket_info_t bi;
            zc_slot_t slot;
            double ta = sb_now(), tb;

            st = zc_session_bucket_info(s, b, &bi);
            if (st == ZC_OK) {
                st = zc_session_slot_acquire(s, b, -1, &slot);
            }
            if (st != ZC_OK) {
                rc = sb_fail(rank, "slot_acquire", st);
                goto out_detach;
            }
            tb = sb_now();
            for (uint32_t i = 0; i < bi.n_params && st == ZC_OK; i++) {
                uint32_t id, pb;
                uint64_t off;

                st = zc_session_bucket_param(s, b, i, &id);
                if (st == ZC_OK) {
                    st = zc_session_param_bucket(s, id, &pb, &off);
                }
                if (st == ZC_OK) {
                    memcpy((float *)slot.data + off, grad,
                           zc_session_param_numel(s, id) * sizeof(float));
                }
            }
            t1 = sb_now();
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
        t1 = sb_now();
        st = zc_session_step(s, NULL, &res);
        if (st != ZC_OK || res.skipped) {
            rc = sb_fail(rank, res.skipped ? "step skipped" : "step", st);
            goto out_detach;
        }
        t.step = sb_now() - t1;
        t.total = sb_now() - t0;
        if (it >= o->warmup && sb_io_all(out_fd, &t, sizeof(t), 1) != 0) {
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
    static char self_zerod[PATH_MAX];
    char *end;
    long v;
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'z':
            o->zerod = optarg;
            break;
        case 'n':
        case 'w':
            v = strtol(optarg, &end, 10);
            if (end == optarg || *end != '\0' || v < (c == 'n') || v > (long)SB_MAX_STEPS) {
                fprintf(stderr, "step_bench: --%s '%s' is not in %d..%u\n",
                        c == 'n' ? "steps" : "warmup", optarg, c == 'n', SB_MAX_STEPS);
                return 2;
            }
            *(c == 'n' ? &o->steps : &o->warmup) = (unsigned)v;
            break;
        case 'j':
            o->json = 1;
            break;
        case 'h':
            sb_usage(stdout);
            return -1;
        default:
            fprintf(stderr, "Try 'step_bench --help'.\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "step_bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->zerod == NULL) {
        ssize_t len = readlink("/proc/self/exe", self_zerod, sizeof(self_zerod) - 1);
        char *slash;

        if (len > 0) {
            self_zerod[len] = '\0';
            slash = strrchr(self_zerod, '/');
            if (slash != NULL && (size_t)(slash - self_zerod) + 20 < sizeof(self_zerod)) {
                strcpy(slash, "/../daemon/zerod");
                o->zerod = self_zerod;
            }
        }
    }
    if (o->zerod == NULL || access(o->zerod, X_OK) != 0) {
        fprintf(stderr, "step_bench: no zerod binary at '%s' (use --zerod PATH)\n",
                o->zerod ? o->zerod : "?");
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
    step_s = sb_median(total, o->steps);
    min_s = total[0];
    for (unsigned r = 0; r < SB_WORLD; r++) {
        for (int k = 0; k < 4; k++) {
            for (unsigned i = 0; i < o->steps; i++) {
                const sb_step_t *x = &t[r][i];
                part[i] = k == 0 ? x->total : k == 1 ? x->acquire : k == 2 ? x->fill : x->step;
            }
            med[r][k] = sb_median(part, o->steps);
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
    snprintf(e.dir, sizeof(e.dir), "/tmp/step_bench.XXXXXX");
    port = sb_free_port();
    if (port < 0 || mkdtemp(e.dir) == NULL) {
        fprintf(stderr, "step_bench: no free port or temp directory: %s\n", strerror(errno));
        return 1;
    }
    snprintf(e.coord, sizeof(e.coord), "127.0.0.1:%d", port);
    t = calloc(SB_WORLD, sizeof(*t));
    if (t == NULL || sb_write_token(&e) != 0) {
        free(t);
        rmdir(e.dir);
        return 1;
    }
    if (!o.json) {
        char load[64] = "?";
        FILE *f = fopen("/proc/loadavg", "r");
        if (f != NULL) {
            if (fgets(load, sizeof(load), f) != NULL) {
                load[strcspn(load, "\n")] = '\0';
            }
            fclose(f);
        }
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
    fflush(NULL);
    for (unsigned r = 0; r < SB_WORLD && !failed; r++) {
        int p[2];

        if (pipe2(p, O_CLOEXEC) != 0 || (tp[r] = fork()) < 0) {
            fprintf(stderr, "step_bench: pipe/fork: %s\n", strerror(errno));
            tp[r] = 0;
            failed = 1;
            break;
        }
        if (tp[r] == 0) {
            close(p[0]);
            for (unsigned q = 0; q < r; q++) {
                close(fds[q]);
            }
            _exit(sb_trainer(&o, &e, r, p[1]));
        }
        close(p[1]);
        fds[r] = p[0];
    }
    for (unsigned i = 0; i < o.steps && !failed; i++) {
        for (unsigned r = 0; r < SB_WORLD; r++) {
            if (sb_io_all(fds[r], &t[r][i], sizeof(sb_step_t), 0) != 0) {
                fprintf(stderr, "step_bench: trainer %u stopped early\n", r);
                failed = 1;
                break;
            }
        }
    }
    for (unsigned r = 0; r < SB_WORLD; r++) {
        int wst = 0;

        if (fds[r] >= 0) {
            close(fds[r]);
        }
        if (tp[r] > 0) {
            if (failed) {
                kill(tp[r], SIGTERM);
            }
            if (waitpid(tp[r], &wst, 0) != tp[r] || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
                failed = 1;
            }
        }
    }
    if (failed) {
        for (unsigned i = 0; i < SB_WORLD; i++) {
            if (e.log[i][0] != '\0') {
                fprintf(stderr, "--- zerod %u log\n", i);
                sb_log_tail(e.log[i]);
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
