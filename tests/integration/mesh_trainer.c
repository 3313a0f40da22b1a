/*
 * A test trainer for multi-rank jobs (no Criterion: the mesh tests run N of these at once
 * from mesh_test.sh). Each rank feeds its own deterministic gradients (a function of seed,
 * rank, step, micro-step only, so a restarted trainer recomputes the same ones) and, with
 * --verify, checks its final parameters against a single-process fp64 reference that sums the
 * gradients of every rank (docs/semantics.md §4: relative error <= 1e-6 in fp32).
 *
 * --ckpt OP (repeatable; run in order after the steps, --ckpt-repeat times): save:DIR[:TAG]
 * (with a small trainer state), wait, load:DIR[:TAG]. Each prints "rank R: ckpt OP: ok PATH" or
 * "rank R: ckpt OP: ERR_NAME: message", with the call's time, and the next one runs either way
 * (the checkpoint tests probe what the daemon refuses).
 *
 * Exit codes: 0 ok; 3 verification failed; 4 a libzc call failed (the line
 * "rank R: ERR_NAME: message" is printed first); 2 usage.
 */
#include "reference.h"

#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    unsigned steps, stage, accum, hang_at, sleep_ms;
    int verify;
    int keep;           /* detach without ending the job (it lingers for a re-attach) */
    unsigned die_step;  /* --die-at STEP:POINT */
    const char *die_at; /* "bucket": after the first BucketReady of step STEP went out;
                           "detach": after the final detach (socket still open) */
    int die_close;      /* --die-how close: close the session and exit 0, else SIGKILL */
    int own_slices;     /* --own-slices: attach with own_slices_only, write with init_param */
    const char *model;
    zc_dtype_t dtype;
    double tol;
    const char *ckpt[16]; /* --ckpt OPs */
    unsigned n_ckpt, ckpt_repeat;
} opts_t;

static int rank_;

/* models larger than this get gradients whose sums are exact (see grads_for) */
#define TH_EXACT_SUMS_ABOVE 100000u

static int fail(const char *what, int st)
{
    printf("rank %d: %s: %s: %s\n", rank_, what, zc_status_name(st), zc_last_error());
    fflush(stdout);
    return 4;
}

/* Leave at a die point: close the session and exit 0, or SIGKILL with the socket open. */
static void die(const opts_t *o, zc_session_t *s, const char *what, uint64_t step,
                const char *point)
{
    printf("rank %d: dying at %s %lu after %s (%s)\n", rank_, what, (unsigned long)step, point,
           o->die_close ? "close" : "kill");
    fflush(stdout);
    if (o->die_close) {
        zc_session_close(s);
        exit(0);
    }
    raise(SIGKILL);
}

static void grads_for(uint32_t rank, uint64_t step, uint32_t micro, const th_model_t *m,
                      zc_dtype_t dt, float *out)
{
    uint64_t st = 0x5eed + rank * 1000003ull + step * 7919ull + micro * 104729ull;
    double mag = (step % 3 == 2) ? 0.4 : 0.03; /* some steps clip */
    for (uint64_t i = 0; i < m->total; i++) {
        double g = th_rand_unit(&st) * mag;
        if (m->total > TH_EXACT_SUMS_ABOVE) {
            /* multiples of 2^-12: the ranks' sums are exact in fp32 in any order, so millions
             * of elements can be held to 1e-6 (a near-cancelling fp32 sum would not be) */
            g = nearbyint(g * 4096.0) / 4096.0;
        }
        out[i] = th_round(dt, (float)g);
    }
}

static void init_for(const th_model_t *m, float *out)
{
    uint64_t st = 42;
    for (uint64_t i = 0; i < m->total; i++) {
        out[i] = (float)th_rand_unit(&st);
    }
}

static int submit(zc_session_t *s, const zc_attach_info_t *info, const th_model_t *m, zc_dtype_t dt,
                  const float *g, uint32_t micro, unsigned max_buckets)
{
    uint64_t starts[TH_MAX_PARAMS], k = 0;
    int st;

    for (uint32_t id = 0; id < m->n_params; id++) {
        starts[id] = k;
        k += m->numel[id];
    }
    if (info->stage == 1) {
        for (uint32_t id = 0; id < m->n_params; id++) {
            void *gp = zc_session_param_grad_ptr(s, id);
            if (gp == NULL) {
                return fail("param_grad_ptr", ZC_ERR_STATE);
            }
            for (uint64_t i = 0; i < m->numel[id]; i++) {
                th_store(dt, gp, i, th_load(dt, gp, i) + g[starts[id] + i]);
            }
        }
        return 0;
    }
    for (uint32_t b = 0; b < info->n_buckets && b < max_buckets; b++) {
        zc_bucket_info_t bi;
        zc_slot_t slot;
        if ((st = zc_session_bucket_info(s, b, &bi)) != ZC_OK) {
            return fail("bucket_info", st);
        }
        if ((st = zc_session_slot_acquire(s, b, -1, &slot)) != ZC_OK) {
            return fail("slot_acquire", st);
        }
        for (uint32_t i = 0; i < bi.n_params; i++) {
            zc_bucket_piece_t pc;
            zc_session_bucket_piece(s, b, i, &pc);
            for (uint64_t e = 0; e < pc.numel; e++) {
                th_store(dt, slot.data, pc.slot_offset + e, g[starts[pc.id] + pc.param_offset + e]);
            }
        }
        if ((st = zc_session_slot_submit(s, &slot, micro)) != ZC_OK) {
            return fail("slot_submit", st);
        }
    }
    return 0;
}

static const char *config_json(const opts_t *o)
{
    return th_config_json(o->model, o->stage, o->dtype == ZC_DTYPE_BF16, o->accum);
}

static int verify(const opts_t *o, const th_model_t *m, uint32_t world, zc_session_t *s)
{
    th_ref_t ref;
    float *init = calloc(m->total, sizeof(float));
    float *g = calloc(m->total, sizeof(float));
    double worst = 0;
    uint64_t k = 0;
    int bad = 0;

    init_for(m, init);
    th_ref_init(&ref, m, o->dtype, init);
    ref.G = o->accum;
    ref.world = world;
    ref.opts[0] = (th_opts_t){1e-2, 0.9, 0.999, 1e-8, 0.01, true, true};
    ref.opts[1] = (th_opts_t){5e-3, 0.9, 0.999, 1e-8, 0.1, true, true};
    for (unsigned step = 0; step < o->steps; step++) {
        for (uint32_t micro = 0; micro < o->accum; micro++) {
            for (uint32_t q = 0; q < world; q++) {
                grads_for(q, step, micro, m, o->dtype, g);
                th_ref_accumulate(&ref, g);
            }
        }
        th_ref_step(&ref);
    }
    for (uint32_t id = 0; id < m->n_params; id++) {
        const void *p = zc_session_param_ptr(s, id);
        for (uint64_t i = 0; i < m->numel[id]; i++, k++) {
            double v = th_load(o->dtype, p, i);
            double d = fabs(v - ref.p[k]);
            double tol = o->tol * fmax(1.0, fabs(ref.p[k]));
            if (o->dtype != ZC_DTYPE_F32) {
                tol += th_ulp(o->dtype, ref.p[k]);
            }
            worst = fmax(worst, d / fmax(1.0, fabs(ref.p[k])));
            if (d > tol && bad++ < 5) {
                printf("rank %d: param %u[%lu] = %.9g, reference %.9g\n", rank_, id, i, v,
                       ref.p[k]);
            }
        }
    }
    printf("rank %d: verify %s: worst relative difference %.3g over %lu elements (tolerance "
           "%.1g)\n",
           rank_, bad ? "FAILED" : "ok", worst, (unsigned long)m->total, o->tol);
    th_ref_free(&ref);
    free(init);
    free(g);
    return bad ? 3 : 0;
}

/* A fresh job's initial values: written in place, or (--own-slices) with init_param, which
 * writes only this rank's slices when the daemons share one params region. */
static int write_init(zc_session_t *s, const th_model_t *m, const opts_t *o)
{
    float *init = calloc(m->total, sizeof(float));
    void *buf = calloc(m->total, sizeof(float));
    uint64_t k = 0;
    int st = ZC_OK;

    if (init == NULL || buf == NULL) {
        st = fail("init", ZC_ERR_NO_MEMORY);
    }
    if (st == ZC_OK) {
        init_for(m, init);
    }
    for (uint32_t id = 0; id < m->n_params && st == ZC_OK; id++) {
        void *p = o->own_slices ? buf : zc_session_param_ptr(s, id);
        for (uint64_t i = 0; i < m->numel[id]; i++) {
            th_store(o->dtype, p, i, init[k++]);
        }
        if (o->own_slices && (st = zc_session_init_param(s, id, buf)) != ZC_OK) {
            st = fail("init_param", st);
        }
    }
    free(buf);
    free(init);
    return st;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* One --ckpt OP: "save:DIR[:TAG]", "wait" or "load:DIR[:TAG]"; its outcome printed. */
static void ckpt_op(zc_session_t *s, const char *op)
{
    static const char state[] = "trainer state of the test";
    char buf[4096], *dir = NULL, *tag = NULL;
    double t0;
    zc_checkpoint_params_t cp = {0};
    zc_checkpoint_info_t info;
    int st;

    snprintf(buf, sizeof(buf), "%s", op);
    if (strncmp(buf, "save:", 5) == 0 || strncmp(buf, "load:", 5) == 0) {
        dir = buf + 5;
        tag = strchr(dir, ':');
        if (tag != NULL) {
            *tag++ = '\0';
        }
    }
    cp.dir = dir;
    cp.tag = tag;
    cp.timeout_ms = 60000;
    memset(&info, 0, sizeof(info));
    t0 = now_ms();
    if (strncmp(op, "save:", 5) == 0) {
        cp.trainer_state = state;
        cp.trainer_state_len = sizeof(state);
        st = zc_checkpoint_save(s, &cp, &info);
    } else if (strncmp(op, "load:", 5) == 0) {
        cp.load_optimizer_states = 1;
        st = zc_checkpoint_load(s, &cp, &info);
    } else if (strcmp(op, "wait") == 0) {
        st = zc_checkpoint_wait(s, 60000, &info);
    } else {
        printf("rank %d: ckpt %s: not save:DIR[:TAG], wait or load:DIR[:TAG]\n", rank_, op);
        fflush(stdout);
        return;
    }
    if (st == ZC_OK) {
        printf("rank %d: ckpt %s: ok %s (%.0f ms)\n", rank_, op, info.path, now_ms() - t0);
    } else {
        printf("rank %d: ckpt %s: %s: %s (%.0f ms)\n", rank_, op, zc_status_name(st),
               zc_last_error(), now_ms() - t0);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"steps", required_argument, NULL, 's'},       {"stage", required_argument, NULL, 'S'},
        {"accum", required_argument, NULL, 'a'},       {"hang-at", required_argument, NULL, 'H'},
        {"sleep-ms", required_argument, NULL, 'z'},    {"verify", no_argument, NULL, 'v'},
        {"model", required_argument, NULL, 'm'},       {"bf16", no_argument, NULL, 'b'},
        {"tol", required_argument, NULL, 't'},         {"keep", no_argument, NULL, 'k'},
        {"die-at", required_argument, NULL, 'D'},      {"die-how", required_argument, NULL, 'W'},
        {"own-slices", no_argument, NULL, 'O'},        {"ckpt", required_argument, NULL, 'C'},
        {"ckpt-repeat", required_argument, NULL, 'R'}, {NULL, 0, NULL, 0}};
    opts_t o = {
        .steps = 10, .stage = 2, .accum = 1, .model = "mixed", .tol = 1e-6, .ckpt_repeat = 1};
    const char *env;
    char coord[300] = "";
    uint32_t world;
    th_model_t m;
    zc_open_params_t op = {0};
    zc_attach_params_t ap = {0};
    zc_attach_info_t info;
    zc_group_t groups[TH_MAX_GROUPS];
    zc_session_t *s = NULL;
    float *g;
    int c, st;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 's':
            o.steps = (unsigned)atoi(optarg);
            break;
        case 'S':
            o.stage = (unsigned)atoi(optarg);
            break;
        case 'a':
            o.accum = (unsigned)atoi(optarg);
            break;
        case 'H':
            o.hang_at = (unsigned)atoi(optarg);
            break;
        case 'z':
            o.sleep_ms = (unsigned)atoi(optarg);
            break;
        case 'v':
            o.verify = 1;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'b':
            o.dtype = ZC_DTYPE_BF16;
            break;
        case 't':
            o.tol = atof(optarg);
            break;
        case 'k':
            o.keep = 1;
            break;
        case 'O':
            o.own_slices = 1;
            break;
        case 'C':
            if (o.n_ckpt == sizeof(o.ckpt) / sizeof(o.ckpt[0])) {
                fprintf(stderr, "at most 16 --ckpt\n");
                return 2;
            }
            o.ckpt[o.n_ckpt++] = optarg;
            break;
        case 'R':
            o.ckpt_repeat = (unsigned)atoi(optarg);
            break;
        case 'D': {
            static char point[16];
            if (sscanf(optarg, "%u:%15s", &o.die_step, point) != 2 ||
                (strcmp(point, "bucket") != 0 && strcmp(point, "detach") != 0)) {
                fprintf(stderr, "--die-at STEP:bucket|detach\n");
                return 2;
            }
            o.die_at = point;
            break;
        }
        case 'W':
            if (strcmp(optarg, "close") != 0 && strcmp(optarg, "kill") != 0) {
                fprintf(stderr, "--die-how close|kill\n");
                return 2;
            }
            o.die_close = strcmp(optarg, "close") == 0;
            break;
        default:
            return 2;
        }
    }
    rank_ = atoi(getenv("RANK") ? getenv("RANK") : "0");
    world = (uint32_t)atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
    (void)zc_coordinator_from_env(coord, sizeof(coord)); /* empty when none: world 1 */
    m = th_model_by_name(o.model);
    g = calloc(m.total, sizeof(float));
    if (g == NULL) {
        printf("rank %d: out of memory\n", rank_);
        return 4;
    }

    op.field_mask = ZC_OPEN_FIELD_TIMEOUT_MS;
    op.timeout_ms = 30000;
    if ((st = zc_session_open(&op, &s)) != ZC_OK) {
        st = fail("open", st);
        goto out_free_g;
    }
    for (uint32_t gi = 0, k = 0; gi < m.n_groups; k += m.gnp[gi], gi++) {
        groups[gi].n_params = m.gnp[gi];
        groups[gi].numel = &m.numel[k];
        groups[gi].options_json = m.group_json[gi];
    }
    env = getenv("ZEROD_JOB");
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_RANK | ZC_ATTACH_FIELD_WORLD |
                    ZC_ATTACH_FIELD_COORDINATOR | ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS |
                    ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = env ? env : "mesh-test";
    ap.rank = (uint32_t)rank_;
    ap.world = world;
    ap.coordinator = coord;
    ap.dtype = o.dtype;
    ap.n_groups = m.n_groups;
    ap.groups = groups;
    ap.config_json = config_json(&o);
    if (o.own_slices) {
        ap.field_mask |= ZC_ATTACH_FIELD_OWN_SLICES;
        ap.own_slices_only = 1;
    }
    if ((st = zc_session_attach(s, &ap, &info)) != ZC_OK) {
        st = fail("attach", st);
        goto out_close;
    }
    printf("rank %d: attached at step %lu%s%s\n", rank_, (unsigned long)info.step,
           info.resumed ? " (resumed)" : "",
           zc_session_params_shared(s) ? " (params region shared)" : "");
    fflush(stdout);
    if (!info.resumed) {
        if ((st = write_init(s, &m, &o)) != ZC_OK) {
            goto out_close;
        }
        if ((st = zc_session_params_ready(s)) != ZC_OK) {
            st = fail("params_ready", st);
            goto out_close;
        }
    }
    for (uint64_t step = info.step; step < o.steps; step++) {
        zc_step_result_t res;
        for (uint32_t micro = 0; micro < o.accum; micro++) {
            unsigned max_b = UINT32_MAX;
            grads_for((uint32_t)rank_, step, micro, &m, o.dtype, g);
            if (o.die_at != NULL && strcmp(o.die_at, "bucket") == 0 && step + 1 == o.die_step) {
                max_b = 1;
            }
            if (o.hang_at && step + 1 == o.hang_at) {
                max_b = 1; /* mid-step: one bucket out, then wait to be killed */
                printf("rank %d: hanging in step %lu\n", rank_, (unsigned long)step + 1);
                fflush(stdout);
            }
            if ((st = submit(s, &info, &m, o.dtype, g, micro, max_b)) != 0) {
                goto out_close;
            }
            if (max_b == 1 && o.die_at != NULL) {
                die(&o, s, "step", step + 1, "bucket");
            }
            if (max_b == 1) {
                for (;;) {
                    pause();
                }
            }
        }
        if ((st = zc_session_step(s, NULL, &res)) != ZC_OK) {
            st = fail("step", st);
            goto out_close;
        }
        printf("rank %d: step %lu grad_norm %.9g\n", rank_, (unsigned long)res.step, res.grad_norm);
        fflush(stdout);
        if (o.sleep_ms) {
            usleep(o.sleep_ms * 1000);
        }
    }
    for (unsigned r = 0; r < o.ckpt_repeat; r++) {
        for (unsigned i = 0; i < o.n_ckpt; i++) {
            ckpt_op(s, o.ckpt[i]);
        }
    }
    st = o.verify ? verify(&o, &m, world, s) : 0;
    zc_session_detach(s, o.keep ? 0 : 1);
    if (o.die_at != NULL && strcmp(o.die_at, "detach") == 0) {
        die(&o, s, "step", o.steps, "detach");
    }

out_close:
    zc_session_close(s);
out_free_g:
    free(g);
    return st;
}
