/*
 * train_mlp: a small MLP trained through libzc (the zerod client library).
 *
 * Model: x[16] -> h = tanh(W1 x + b1)[32] -> y = W2 h + b2[4], MSE loss, plain-C fp32
 * forward/backward. Data: a synthetic regression task whose targets come from a fixed random
 * "teacher" MLP. Each micro-batch is a pure function of (seed, RANK, optimizer step index,
 * micro-step): ranks draw different inputs, and a trainer that re-attaches to a job at step k
 * (after a crash) recomputes exactly the batch of step k+1.
 *
 * Environment (like torchrun): ZEROD_SOCKET, ZEROD_JOB (default "train_mlp"), RANK (0),
 * WORLD_SIZE (1), MASTER_ADDR and MASTER_PORT (rank 0's daemon listens on MASTER_PORT + 1,
 * WORLD_SIZE > 1; ZEROD_COORDINATOR=host:port overrides: zc_coordinator_from_env).
 *
 * Parameters are registered in reverse order (b2, W2, b1, W1), as a PyTorch binding does.
 * Each step prints `step N loss X grad_norm Y loss_scale Z`, N being the optimizer steps the
 * daemon has completed (a step skipped on fp16 overflow repeats N and adds "skipped"; its
 * batch is drawn again for the retry, since the step index did not move).
 *
 * Fault-injection and inspection options (used by tests/integration/kill_resume.sh):
 * --die-at STEP[:BUCKET] kills the process with SIGKILL during optimizer step STEP after
 * BUCKET bucket submissions; --keep detaches with end_job = 0 so the job lingers; --dump FILE
 * writes every final parameter value, one "%a" line each, in registration order.
 */
#define _GNU_SOURCE
#include <zerod/zc.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN  16
#define HID 32
#define OUT 4

/* Registration order: reverse of the forward order. */
enum { P_B2 = 0, P_W2 = 1, P_B1 = 2, P_W1 = 3, N_PARAMS = 4 };

static const uint64_t param_numel[N_PARAMS] = {OUT, (uint64_t)OUT *HID, HID, (uint64_t)HID *IN};
static const char *const param_name[N_PARAMS] = {"b2", "W2", "b1", "W1"};

/* All four tensors of one model, fp32, indexed by parameter id. */
typedef struct mlp {
    float b2[OUT];
    float w2[OUT * HID];
    float b1[HID];
    float w1[HID * IN];
} mlp_t;

static float *mlp_tensor(mlp_t *m, int id)
{
    switch (id) {
    case P_B2:
        return m->b2;
    case P_W2:
        return m->w2;
    case P_B1:
        return m->b1;
    default:
        return m->w1;
    }
}

typedef struct opts {
    int steps;
    int stage;
    zc_dtype_t dtype;
    int batch;
    int accum;
    double lr;
    uint64_t seed;
    long die_step;   /* 0: never; else raise(SIGKILL) during optimizer step die_step */
    long die_bucket; /* ... after this many bucket submissions (stage 1: micro-steps) */
    int keep;        /* detach with end_job = 0 */
    const char *dump;
    int resume; /* -1: not said (the daemon re-attaches a kept job); else a zc_resume_t */
} opts_t;

/* ---- random numbers (splitmix64) --------------------------------------------------- */

static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a). */
static float rng_uniform(uint64_t *state, float a)
{
    double u = (double)(rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)((2.0 * u - 1.0) * a);
}

/* The data stream of one micro-batch: a pure function of its coordinates. */
static uint64_t batch_rng(uint64_t seed, uint32_t rank, uint64_t step, uint32_t micro)
{
    uint64_t st = 0x5eed0000ull + seed * 1000003ull;

    st = rng_next(&st) ^ rank;
    st = rng_next(&st) ^ step;
    st = rng_next(&st) ^ micro;
    return rng_next(&st);
}

static void mlp_init(mlp_t *m, uint64_t seed)
{
    uint64_t st = seed;
    float a1 = 1.0f / sqrtf((float)IN), a2 = 1.0f / sqrtf((float)HID);

    for (int i = 0; i < HID * IN; i++) {
        m->w1[i] = rng_uniform(&st, a1);
    }
    for (int i = 0; i < HID; i++) {
        m->b1[i] = rng_uniform(&st, a1);
    }
    for (int i = 0; i < OUT * HID; i++) {
        m->w2[i] = rng_uniform(&st, a2);
    }
    for (int i = 0; i < OUT; i++) {
        m->b2[i] = rng_uniform(&st, a2);
    }
}

/* ---- fp16 / bf16 conversions (round to nearest even) ------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);

    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;

    if (abs > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (abs >= 0x477ff000u) {
        return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    }
    if (abs < 0x38800000u) {
        /* subnormal half (or zero): value = m * 2^-24, m = round(abs_value * 2^24) */
        float v = f32_from_bits(abs) * 16777216.0f; /* exact: power-of-two scaling */
        uint32_t m = (uint32_t)v;
        float frac = v - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1u))) {
            m++;
        }
        return (uint16_t)(sign | m);
    }
    /* normal: rebias exponent 127 -> 15, round the 13 dropped mantissa bits */
    abs -= 0x38000000u;
    abs += 0x0fffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | (abs >> 13));
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t man = (uint32_t)h & 0x3ffu;
    float v;

    if (exp == 0) {
        v = (float)man * (1.0f / 16777216.0f); /* 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) {
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    }
    return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static float load_elem(const void *base, uint64_t i, zc_dtype_t dtype)
{
    switch (dtype) {
    case ZC_DTYPE_F16:
        return f16_to_f32(((const uint16_t *)base)[i]);
    case ZC_DTYPE_BF16:
        return bf16_to_f32(((const uint16_t *)base)[i]);
    default:
        return ((const float *)base)[i];
    }
}

static void store_elem(void *base, uint64_t i, zc_dtype_t dtype, float v)
{
    switch (dtype) {
    case ZC_DTYPE_F16:
        ((uint16_t *)base)[i] = f32_to_f16(v);
        break;
    case ZC_DTYPE_BF16:
        ((uint16_t *)base)[i] = f32_to_bf16(v);
        break;
    default:
        ((float *)base)[i] = v;
        break;
    }
}

/* ---- forward / backward ------------------------------------------------------------ */

static void mlp_forward(const mlp_t *m, const float *x, float *h, float *y)
{
    for (int j = 0; j < HID; j++) {
        float a = m->b1[j];
        for (int i = 0; i < IN; i++) {
            a += m->w1[j * IN + i] * x[i];
        }
        h[j] = tanhf(a);
    }
    for (int k = 0; k < OUT; k++) {
        float a = m->b2[k];
        for (int j = 0; j < HID; j++) {
            a += m->w2[k * HID + j] * h[j];
        }
        y[k] = a;
    }
}

/* One micro-batch: returns the mean squared error and writes d(loss * scale)/d(params). */
static float mlp_loss_grad(const mlp_t *m, const mlp_t *teacher, uint64_t *rng, int batch,
                           float scale, mlp_t *g)
{
    float x[IN], h[HID], y[OUT], ht[HID], t[OUT], dy[OUT], dh[HID];
    float norm = 1.0f / (float)(batch * OUT);
    double loss = 0.0;

    memset(g, 0, sizeof(*g));
    for (int n = 0; n < batch; n++) {
        for (int i = 0; i < IN; i++) {
            x[i] = rng_uniform(rng, 1.0f);
        }
        mlp_forward(teacher, x, ht, t);
        mlp_forward(m, x, h, y);
        for (int k = 0; k < OUT; k++) {
            float d = y[k] - t[k];
            loss += (double)d * d;
            dy[k] = 2.0f * d * norm * scale;
        }
        for (int j = 0; j < HID; j++) {
            dh[j] = 0.0f;
        }
        for (int k = 0; k < OUT; k++) {
            g->b2[k] += dy[k];
            for (int j = 0; j < HID; j++) {
                g->w2[k * HID + j] += dy[k] * h[j];
                dh[j] += dy[k] * m->w2[k * HID + j];
            }
        }
        for (int j = 0; j < HID; j++) {
            float da = dh[j] * (1.0f - h[j] * h[j]);
            g->b1[j] += da;
            for (int i = 0; i < IN; i++) {
                g->w1[j * IN + i] += da * x[i];
            }
        }
    }
    return (float)(loss * norm);
}

/* ---- libzc plumbing ---------------------------------------------------------------- */

static int fail(const char *what, int status)
{
    fprintf(stderr, "train_mlp: %s failed: %s (%s)\n", what, zc_last_error(),
            zc_status_name(status));
    return 1;
}

static char *build_config(const opts_t *o)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *opt, *params, *zero, *fp16, *bf16;
    char *text;

    cJSON_AddNumberToObject(root, "train_micro_batch_size_per_gpu", o->batch);
    cJSON_AddNumberToObject(root, "gradient_accumulation_steps", o->accum);
    cJSON_AddNumberToObject(root, "gradient_clipping", 1.0);
    opt = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(opt, "type", "AdamW");
    params = cJSON_AddObjectToObject(opt, "params");
    cJSON_AddNumberToObject(params, "lr", o->lr);
    cJSON_AddNumberToObject(params, "weight_decay", 0.0);
    zero = cJSON_AddObjectToObject(root, "zero_optimization");
    cJSON_AddNumberToObject(zero, "stage", o->stage);
    /* b2, W2, b1 and W1 at 0, 16, 144 and 176 (aligned): 688 elements in buckets of 256, W1
     * split between all three. */
    cJSON_AddNumberToObject(zero, "reduce_bucket_size", 256);
    fp16 = cJSON_AddObjectToObject(root, "fp16");
    cJSON_AddBoolToObject(fp16, "enabled", o->dtype == ZC_DTYPE_F16);
    bf16 = cJSON_AddObjectToObject(root, "bf16");
    cJSON_AddBoolToObject(bf16, "enabled", o->dtype == ZC_DTYPE_BF16);
    text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* Flat element offset of a parameter: buckets are consecutive in the flat vector. */
static int param_flat_offset(zc_session_t *s, uint32_t id, uint64_t *off_p)
{
    zc_bucket_info_t bi;
    uint32_t bucket;
    uint64_t off, base = 0;
    int status;

    status = zc_session_param_bucket(s, id, &bucket, &off);
    for (uint32_t b = 0; status == ZC_OK && b < bucket; b++) {
        status = zc_session_bucket_info(s, b, &bi);
        base += bi.padded;
    }
    if (status == ZC_OK) {
        *off_p = base + off;
    }
    return status;
}

static void read_params(zc_session_t *s, mlp_t *m)
{
    zc_dtype_t dt = zc_session_dtype(s);

    for (uint32_t id = 0; id < N_PARAMS; id++) {
        const void *src = zc_session_param_ptr(s, id);
        float *dst = mlp_tensor(m, (int)id);
        for (uint64_t i = 0; i < param_numel[id]; i++) {
            dst[i] = load_elem(src, i, dt);
        }
    }
}

static void write_params(zc_session_t *s, mlp_t *m)
{
    zc_dtype_t dt = zc_session_dtype(s);

    for (uint32_t id = 0; id < N_PARAMS; id++) {
        void *dst = zc_session_param_ptr(s, id);
        const float *src = mlp_tensor(m, (int)id);
        for (uint64_t i = 0; i < param_numel[id]; i++) {
            store_elem(dst, i, dt, src[i]);
        }
    }
}

/* --die-at: the crash of a trainer in the middle of a step, with no chance to clean up. */
static void maybe_die(const opts_t *o, uint64_t step, long submitted)
{
    if (o->die_step > 0 && (uint64_t)o->die_step == step && submitted == o->die_bucket) {
        printf("dying at step %" PRIu64 " after %ld buckets\n", step, submitted);
        fflush(stdout);
        raise(SIGKILL);
    }
}

/* Stage 2: every bucket into a slot, in bucket order (the order backward completes them).
 * `step` (1-based, the optimizer step being computed) and *submitted serve --die-at. */
static int send_buckets(zc_session_t *s, const zc_attach_info_t *info, mlp_t *g,
                        uint32_t micro_step, const opts_t *o, uint64_t step, long *submitted)
{
    zc_dtype_t dt = zc_session_dtype(s);
    int status;

    for (uint32_t b = 0; b < info->n_buckets; b++) {
        zc_bucket_info_t bi;
        zc_slot_t slot;

        status = zc_session_bucket_info(s, b, &bi);
        if (status == ZC_OK) {
            status = zc_session_slot_acquire(s, b, -1, &slot);
        }
        if (status != ZC_OK) {
            return fail("slot_acquire", status);
        }
        for (uint32_t i = 0; i < bi.n_params; i++) {
            zc_bucket_piece_t pc; /* a parameter may be split between buckets */
            const float *src;

            status = zc_session_bucket_piece(s, b, i, &pc);
            if (status != ZC_OK) {
                return fail("bucket layout", status);
            }
            src = mlp_tensor(g, (int)pc.id) + pc.param_offset;
            for (uint64_t k = 0; k < pc.numel; k++) {
                store_elem(slot.data, pc.slot_offset + k, dt, src[k]);
            }
        }
        status = zc_session_slot_submit(s, &slot, micro_step);
        if (status != ZC_OK) {
            return fail("slot_submit", status);
        }
        maybe_die(o, step, ++*submitted);
    }
    return 0;
}

/* Stage 1: add this micro-step's gradients into the full-gradient region. */
static int add_grads(zc_session_t *s, mlp_t *g)
{
    zc_dtype_t dt = zc_session_dtype(s);
    void *grads = zc_session_grads_ptr(s);
    int status;

    if (grads == NULL) {
        return fail("grads_ptr", ZC_ERR_STATE);
    }
    for (uint32_t id = 0; id < N_PARAMS; id++) {
        const float *src = mlp_tensor(g, (int)id);
        uint64_t off;

        status = param_flat_offset(s, id, &off);
        if (status != ZC_OK) {
            return fail("param layout", status);
        }
        for (uint64_t k = 0; k < param_numel[id]; k++) {
            store_elem(grads, off + k, dt, load_elem(grads, off + k, dt) + src[k]);
        }
    }
    return 0;
}

/* ---- options ----------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: train_mlp [OPTIONS]\n"
            "Train a 16-32-4 MLP on a synthetic regression task through zerod (libzc).\n"
            "\n"
            "  --steps N         train until the daemon has completed N optimizer steps\n"
            "                    (default 50; a resumed job continues from its step)\n"
            "  --stage 1|2       ZeRO stage (default 2)\n"
            "  --dtype T         fp32|fp16|bf16 param/grad dtype (default fp32)\n"
            "  --batch B         samples per micro-batch (default 32)\n"
            "  --accum G         gradient accumulation steps (default 1)\n"
            "  --lr LR           AdamW learning rate (default 1e-2)\n"
            "  --seed S          initial weights and data seed (default 1)\n"
            "  --die-at STEP[:BUCKET]\n"
            "                    raise SIGKILL during optimizer step STEP (1-based) after\n"
            "                    BUCKET bucket submissions (default 0; stage 1: micro-steps)\n"
            "  --keep            detach with end_job = 0: the job lingers for a re-attach\n"
            "  --resume auto|never|must\n"
            "                    what to do with a job the daemon keeps (docs/design-notes.md\n"
            "                    \"A job's life\"); auto continues it only on a restart\n"
            "                    (TORCHELASTIC_RESTART_COUNT > 0); default: when it fits\n"
            "  --dump FILE       write every final parameter, one \"%%a\" line each\n"
            "  -h, --help        print this help and exit\n"
            "\n"
            "Environment: ZEROD_SOCKET, ZEROD_JOB (default train_mlp), RANK (0), WORLD_SIZE (1),\n"
            "MASTER_ADDR and MASTER_PORT (rank 0's daemon listens on MASTER_PORT + 1; or\n"
            "ZEROD_COORDINATOR=host:port; required when WORLD_SIZE > 1).\n");
}

static int parse_long(const char *arg, long lo, long hi, long *v_p)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);

    if (arg[0] == '\0' || end == arg || *end != '\0' || v < lo || v > hi) {
        return -1;
    }
    *v_p = v;
    return 0;
}

/* --resume: a zc_resume_t, or -1 (reported) */
static int parse_resume(const char *arg)
{
    if (strcmp(arg, "auto") == 0 || strcmp(arg, "never") == 0 || strcmp(arg, "must") == 0) {
        return arg[0] == 'a' ? ZC_RESUME_AUTO : arg[0] == 'n' ? ZC_RESUME_NEVER : ZC_RESUME_MUST;
    }
    fprintf(stderr, "train_mlp: --resume '%s' is not auto, never or must\n", arg);
    return -1;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option longopts[] = {
        {"steps", required_argument, NULL, 'n'},
        {"stage", required_argument, NULL, 'z'},
        {"dtype", required_argument, NULL, 'd'},
        {"batch", required_argument, NULL, 'b'},
        {"accum", required_argument, NULL, 'g'},
        {"lr", required_argument, NULL, 'l'},
        {"seed", required_argument, NULL, 's'},
        {"die-at", required_argument, NULL, 'k'},
        {"keep", no_argument, NULL, 'K'},
        {"dump", required_argument, NULL, 'D'},
        {"resume", required_argument, NULL, 'R'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long v;
    char *end;
    int c;

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_long(optarg, 0, 100000000L, &v) != 0) {
                fprintf(stderr, "train_mlp: --steps '%s' is not an integer >= 0\n", optarg);
                return 2;
            }
            o->steps = (int)v;
            break;
        case 'z':
            if (parse_long(optarg, 1, 2, &v) != 0) {
                fprintf(stderr, "train_mlp: --stage '%s' is not 1 or 2\n", optarg);
                return 2;
            }
            o->stage = (int)v;
            break;
        case 'd':
            if (strcmp(optarg, "fp32") == 0) {
                o->dtype = ZC_DTYPE_F32;
            } else if (strcmp(optarg, "fp16") == 0) {
                o->dtype = ZC_DTYPE_F16;
            } else if (strcmp(optarg, "bf16") == 0) {
                o->dtype = ZC_DTYPE_BF16;
            } else {
                fprintf(stderr, "train_mlp: --dtype '%s' is not fp32, fp16 or bf16\n", optarg);
                return 2;
            }
            break;
        case 'b':
            if (parse_long(optarg, 1, 1000000L, &v) != 0) {
                fprintf(stderr, "train_mlp: --batch '%s' is not an integer in 1..1000000\n",
                        optarg);
                return 2;
            }
            o->batch = (int)v;
            break;
        case 'g':
            if (parse_long(optarg, 1, 10000L, &v) != 0) {
                fprintf(stderr, "train_mlp: --accum '%s' is not an integer in 1..10000\n", optarg);
                return 2;
            }
            o->accum = (int)v;
            break;
        case 'l':
            o->lr = strtod(optarg, &end);
            if (end == optarg || *end != '\0' || !(o->lr > 0.0) || !isfinite(o->lr)) {
                fprintf(stderr, "train_mlp: --lr '%s' is not a positive number\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (parse_long(optarg, 0, 0x7fffffffL, &v) != 0) {
                fprintf(stderr, "train_mlp: --seed '%s' is not an integer >= 0\n", optarg);
                return 2;
            }
            o->seed = (uint64_t)v;
            break;
        case 'k': {
            char *colon = strchr(optarg, ':');
            if (colon != NULL) {
                *colon = '\0';
            }
            if (parse_long(optarg, 1, 100000000L, &o->die_step) != 0 ||
                (colon != NULL && parse_long(colon + 1, 0, 1000000L, &o->die_bucket) != 0)) {
                if (colon != NULL) {
                    *colon = ':';
                }
                fprintf(stderr, "train_mlp: --die-at '%s' is not STEP[:BUCKET] (STEP >= 1)\n",
                        optarg);
                return 2;
            }
            break;
        }
        case 'K':
            o->keep = 1;
            break;
        case 'D':
            o->dump = optarg;
            break;
        case 'R':
            if ((o->resume = parse_resume(optarg)) < 0) {
                return 2;
            }
            break;
        case 'h':
            usage(stdout);
            return -1;
        default:
            fprintf(stderr, "Try 'train_mlp --help'.\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "train_mlp: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return 0;
}

static int env_u32(const char *name, uint32_t def, uint32_t *v_p)
{
    const char *s = getenv(name);
    long v;

    if (s == NULL || s[0] == '\0') {
        *v_p = def;
        return 0;
    }
    if (parse_long(s, 0, 65536L, &v) != 0) {
        fprintf(stderr, "train_mlp: %s='%s' is not an integer in 0..65536\n", name, s);
        return 2;
    }
    *v_p = (uint32_t)v;
    return 0;
}

/* ---- main -------------------------------------------------------------------------- */

/* --dump: every final parameter, registration order, exactly ("%a"). */
static int dump_params(const char *path, mlp_t *m)
{
    FILE *f = fopen(path, "we");
    int bad;

    if (f == NULL) {
        fprintf(stderr, "train_mlp: cannot open --dump file '%s': %s\n", path, strerror(errno));
        return 1;
    }
    for (int id = 0; id < N_PARAMS; id++) {
        const float *t = mlp_tensor(m, id);
        for (uint64_t i = 0; i < param_numel[id]; i++) {
            fprintf(f, "%a\n", (double)t[i]);
        }
    }
    bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "train_mlp: writing --dump file '%s' failed: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

static int train(zc_session_t *s, const opts_t *o, uint32_t rank, const zc_attach_info_t *info)
{
    static mlp_t model, teacher, grad;
    double loss_scale = info->loss_scale > 0.0 ? info->loss_scale : 1.0;
    uint64_t step = info->step; /* optimizer steps the daemon has completed */
    zc_step_result_t res;
    int status;

    mlp_init(&teacher, 0x7eac4e5ull);
    while (step < (uint64_t)o->steps) {
        float scale = (o->dtype == ZC_DTYPE_F16) ? (float)loss_scale : 1.0f;
        double loss = 0.0;
        long submitted = 0;

        read_params(s, &model);
        maybe_die(o, step + 1, submitted);
        for (int micro = 0; micro < o->accum; micro++) {
            uint64_t rng = batch_rng(o->seed, rank, step, (uint32_t)micro);

            loss += mlp_loss_grad(&model, &teacher, &rng, o->batch, scale, &grad);
            if (o->stage == 2) {
                if (send_buckets(s, info, &grad, (uint32_t)micro, o, step + 1, &submitted) != 0) {
                    return 1;
                }
            } else if (add_grads(s, &grad) != 0) {
                return 1;
            } else {
                maybe_die(o, step + 1, ++submitted);
            }
        }
        status = zc_session_step(s, NULL, &res);
        if (status != ZC_OK) {
            return fail("step", status);
        }
        if (res.loss_scale > 0.0) {
            loss_scale = res.loss_scale;
        }
        step = res.step;
        printf("step %" PRIu64 " loss %.6f grad_norm %.6f loss_scale %g%s\n", res.step,
               loss / o->accum, res.grad_norm, res.loss_scale, res.skipped ? " skipped" : "");
        fflush(stdout);
    }

    /* The params region holds the final values: report them. */
    read_params(s, &model);
    if (o->dump != NULL && dump_params(o->dump, &model) != 0) {
        return 1;
    }
    {
        uint64_t eval_rng = 0xe7a1ull;
        float l = mlp_loss_grad(&model, &teacher, &eval_rng, 256, 1.0f, &grad);
        double sumsq = 0.0;
        for (int id = 0; id < N_PARAMS; id++) {
            const float *t = mlp_tensor(&model, id);
            for (uint64_t i = 0; i < param_numel[id]; i++) {
                sumsq += (double)t[i] * t[i];
            }
        }
        printf("final eval_loss %.6f param_norm %.6f\n", l, sqrt(sumsq));
    }
    return 0;
}

/* --resume: the policy, and whether the launcher says this process is a restart. */
static void attach_resume(const opts_t *o, zc_attach_params_t *ap)
{
    const char *count = getenv("TORCHELASTIC_RESTART_COUNT");

    if (o->resume < 0) {
        return;
    }
    ap->field_mask |= ZC_ATTACH_FIELD_RESUME;
    ap->resume = (zc_resume_t)o->resume;
    ap->restart = count != NULL && atoi(count) > 0;
}

int main(int argc, char **argv)
{
    opts_t o = {.steps = 50,
                .stage = 2,
                .dtype = ZC_DTYPE_F32,
                .batch = 32,
                .accum = 1,
                .lr = 1e-2,
                .seed = 1,
                .die_step = 0,
                .die_bucket = 0,
                .keep = 0,
                .dump = NULL,
                .resume = -1};
    uint32_t rank, world;
    const char *job;
    char coordinator[256] = "";
    char *config = NULL;
    zc_group_t group;
    zc_attach_params_t ap;
    zc_attach_info_t info;
    zc_session_t *s = NULL;
    static mlp_t init;
    int status;
    int rc;

    rc = parse_opts(argc, argv, &o);
    if (rc != 0) {
        return rc < 0 ? 0 : rc;
    }
    if (env_u32("RANK", 0, &rank) != 0 || env_u32("WORLD_SIZE", 1, &world) != 0) {
        return 2;
    }
    if (world == 0 || rank >= world) {
        fprintf(stderr, "train_mlp: RANK %u is not below WORLD_SIZE %u\n", rank, world);
        return 2;
    }
    job = getenv("ZEROD_JOB");
    if (job == NULL || job[0] == '\0') {
        job = "train_mlp";
    }
    if (world > 1 && zc_coordinator_from_env(coordinator, sizeof(coordinator)) != ZC_OK) {
        fprintf(stderr, "train_mlp: WORLD_SIZE %u needs rank 0's daemon: %s\n", world,
                zc_last_error());
        return 2;
    }
    config = build_config(&o);
    if (config == NULL) {
        fprintf(stderr, "train_mlp: out of memory\n");
        return 1;
    }

    status = zc_session_open(NULL, &s);
    if (status != ZC_OK) {
        rc = fail("open", status);
        goto out;
    }
    group.n_params = N_PARAMS;
    group.numel = param_numel;
    group.options_json = NULL;
    memset(&ap, 0, sizeof(ap));
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_RANK | ZC_ATTACH_FIELD_WORLD |
                    ZC_ATTACH_FIELD_DTYPE | ZC_ATTACH_FIELD_GROUPS | ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = job;
    ap.rank = rank;
    ap.world = world;
    if (world > 1) {
        ap.field_mask |= ZC_ATTACH_FIELD_COORDINATOR;
        ap.coordinator = coordinator;
    }
    ap.dtype = o.dtype;
    ap.n_groups = 1;
    ap.groups = &group;
    ap.config_json = config;
    attach_resume(&o, &ap);
    status = zc_session_attach(s, &ap, &info);
    if (status != ZC_OK) {
        rc = fail("attach", status);
        goto out;
    }
    if ((int)info.stage != o.stage) {
        fprintf(stderr, "train_mlp: asked for stage %d, the daemon runs stage %u\n", o.stage,
                info.stage);
        rc = 1;
        goto out;
    }
    printf("attached job %s rank %u/%u stage %u dtype %s: %u params (%s %s %s %s), %u buckets, "
           "%u slots, %" PRIu64 " elements, step %" PRIu64 "%s\n",
           job, rank, world, info.stage,
           o.dtype == ZC_DTYPE_F32 ? "fp32" : (o.dtype == ZC_DTYPE_F16 ? "fp16" : "bf16"),
           info.n_params, param_name[0], param_name[1], param_name[2], param_name[3],
           info.n_buckets, info.n_slots, info.total_numel, info.step,
           info.resumed ? " (resumed)" : "");
    if (!info.resumed) {
        mlp_init(&init, 0x1417ull + o.seed); /* same on every rank */
        write_params(s, &init);
        status = zc_session_params_ready(s);
        if (status != ZC_OK) {
            rc = fail("params_ready", status);
            goto out;
        }
    }
    rc = train(s, &o, rank, &info);
    if (rc == 0) {
        status = zc_session_detach(s, o.keep ? 0 : 1);
        if (status != ZC_OK) {
            rc = fail("detach", status);
        }
    }

out:
    zc_session_close(s);
    cJSON_free(config);
    return rc;
}
