/* zd_live_fuzz: valid frames of every request, random content, and their mutations. */
#include "live_fuzz.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- byte buffers --------------------------------------------------------------------- */

void lf_buf_reserve(lf_buf_t *b, size_t more)
{
    if (b->len + more > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        uint8_t *np;

        while (cap < b->len + more) {
            cap *= 2;
        }
        np = realloc(b->p, cap);
        if (np == NULL) {
            fprintf(stderr, "live_fuzz: out of memory for %zu bytes\n", cap);
            abort();
        }
        b->p = np;
        b->cap = cap;
    }
}

void lf_buf_put(lf_buf_t *b, const void *data, size_t n)
{
    lf_buf_reserve(b, n);
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

/* Length header + packed frame. */
void lf_buf_frame(lf_buf_t *b, const lf_frame_t *f)
{
    lf_buf_reserve(b, rf_frame_size(f));
    b->len += rf_frame_pack(f, b->p + b->len);
}

/* ---- valid frames of every message ---------------------------------------------------- */

void lf_buf_hello(lf_buf_t *b, uint64_t seq, uint32_t protocol, const char *version)
{
    lf_frame_t f;
    Zerod__Ipc__V1__Hello h;

    rf_hello_init(&f, &h, protocol, version, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    f.seq = seq;
    lf_buf_frame(b, &f);
}

void lf_buf_attach(lf_buf_t *b, uint64_t seq, const char *id, const lf_job_t *j, const char *config)
{
    lf_frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group grp = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *pg = &grp;

    grp.n_numel = j->n;
    grp.numel = (uint64_t *)j->numel;
    at.job_id = (char *)id;
    at.world = 1;
    at.dtype = j->dtype;
    at.n_groups = 1;
    at.groups = &pg;
    if (config != NULL) {
        at.config_json = (char *)config;
    }
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    f.attach = &at;
    lf_buf_frame(b, &f);
}

const lf_job_t lf_jobs[LF_N_JOBS] = {
    {"fz-a",
     {100, 37},
     2,
     ZEROD__IPC__V1__DTYPE__DTYPE_F32,
     "{\"zero_optimization\": {\"reduce_bucket_size\": 64}}"},
    {"fz-b",
     {300, 5, 64},
     3,
     ZEROD__IPC__V1__DTYPE__DTYPE_F32,
     "{\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 128}}"},
    {"fz-c",
     {50, 50},
     2,
     ZEROD__IPC__V1__DTYPE__DTYPE_F16,
     "{\"fp16\": {\"enabled\": true, \"initial_scale_power\": 4}, \"gradient_accumulation_steps\":"
     " 3, \"zero_optimization\": {\"reduce_bucket_size\": 40}}"},
    {"fz-d",
     {7, 1000},
     2,
     ZEROD__IPC__V1__DTYPE__DTYPE_BF16,
     "{\"bf16\": {\"enabled\": true}, \"gradient_clipping\": 1.0, \"zero_optimization\": "
     "{\"reduce_bucket_size\": 256, \"round_robin_gradients\": true}}"},
};

static const char *const lf_configs[] = {
    "",
    "{}",
    "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 16}}",
    "{\"zero_optimization\": {\"stage\": 3}}",
    "{\"zero_optimization\": {\"reduce_bucket_size\": 0}}",
    "{\"zero_optimization\": {\"reduce_bucket_size\": -1}}",
    "{\"zero_optimization\": {\"reduce_bucket_size\": 1e300}}",
    "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}",
    "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": 7}}}",
    "{\"gradient_accumulation_steps\": 0}",
    "{\"gradient_accumulation_steps\": 4294967297}",
    "{\"gradient_accumulation_steps\": 2.5}",
    "{\"gradient_allreduce_op\": \"max\"}",
    "{\"optimizer\": {\"type\": \"SGD\"}}",
    "{\"optimizer\": {\"params\": {\"lr\": -0.1}}}",
    "{\"optimizer\": {\"params\": {\"lr\": \"fast\"}}}",
    "{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}",
    "{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.5, 3]}}}",
    "{\"optimizer\": {\"params\": {\"eps\": 0}}}",
    "{\"fp16\": {\"enabled\": true, \"initial_scale_power\": 4000}}",
    "{\"fp16\": {\"enabled\": true, \"loss_scale_window\": -3}}",
    "{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
    "{\"bf16\": {\"enabled\": \"yes\"}}",
    "{",
    "[]",
    "null",
    "\"zero\"",
    "{\"a\": {\"b\": {\"c\": {\"d\": {\"e\": {\"f\": [[[[[[[[[[1]]]]]]]]]]}}}}}}",
    "{\"zero_optimization\": {\"stage\": 2}, \"zero_optimization\": {\"stage\": 1}}",
    "{\"\xff\xfe\": 1}",
};
#define LF_N_CONFIGS (sizeof(lf_configs) / sizeof(lf_configs[0]))

static const char *const lf_options[] = {
    "{\"lr\": 0.5}",
    "{\"weight_decay\": 0.1, \"betas\": [0.8, 0.9]}",
    "{\"lr\": \"x\"}",
    "{\"eps\": -1}",
    "{\"adam_w_mode\": false, \"bias_correction\": false}",
    "{\"unknown\": 1}",
    "{",
    "7",
};
#define LF_N_OPTIONS (sizeof(lf_options) / sizeof(lf_options[0]))

const char *const lf_odd_strings[LF_N_ODD] = {
    "",
    "job\nWARN fake log line\n",
    "%s%s%s%n%p",
    "\xff\xfe\xc0\x80 not utf-8",
    "\x1b[31mred\x1b[0m",
    "../../etc/passwd",
    "a\tb\rc",
};

/* A random string: from the odd list, printable, raw bytes, or long. */
static const char *lf_gen_string(lf_gen_t *gn, char *out, size_t cap)
{
    uint64_t *r = gn->rng;
    size_t n;

    switch (lf_below(r, 4)) {
    case 0:
        return lf_odd_strings[lf_below(r, LF_N_ODD)];
    case 1:
        n = 1 + lf_below(r, 24);
        for (size_t i = 0; i < n && i + 1 < cap; i++) {
            out[i] = (char)(' ' + lf_below(r, 95));
        }
        break;
    case 2:
        n = 1 + lf_below(r, 40);
        for (size_t i = 0; i < n && i + 1 < cap; i++) {
            out[i] = (char)(1 + lf_below(r, 255)); /* no NUL: pack uses strlen */
        }
        break;
    default:
        n = cap - 1 - lf_below(r, (uint32_t)(cap / 2));
        memset(out, 'j', n);
        break;
    }
    out[n < cap ? n : cap - 1] = '\0';
    return out;
}

static uint64_t lf_gen_numel(uint64_t *r)
{
    static const uint64_t odd[] = {0,          1,       UINT64_MAX, 1ull << 62, 1ull << 32,
                                   (1u << 24), 4194305, 1u << 20,   3,          65536 * 17};

    return lf_chance(r, 85) ? 1 + lf_below(r, 400) : odd[lf_below(r, 10)];
}

static void lf_gen_attach(lf_gen_t *gn, Zerod__Ipc__V1__Attach *at)
{
    uint64_t *r = gn->rng;

    if (lf_chance(r, 60)) { /* a sane job, sometimes with one field off */
        const lf_job_t *j = &lf_jobs[lf_below(r, LF_N_JOBS)];

        zerod__ipc__v1__group__init(&gn->groups[0]);
        memcpy(gn->numel[0], j->numel, j->n * sizeof(uint64_t));
        gn->groups[0].n_numel = j->n;
        gn->groups[0].numel = gn->numel[0];
        gn->pgroups[0] = &gn->groups[0];
        at->job_id = (char *)j->id;
        at->world = 1;
        at->dtype = j->dtype;
        at->n_groups = 1;
        at->groups = gn->pgroups;
        at->config_json = (char *)j->config;
        switch (lf_below(r, 8)) {
        case 0: /* another layout for the same job id: a re-attach refused */
            gn->numel[0][0] += 1 + lf_below(r, 3);
            break;
        case 1: /* another config */
            at->config_json = (char *)lf_configs[lf_below(r, LF_N_CONFIGS)];
            break;
        case 2:
            at->rank = lf_below(r, 3);
            at->world = lf_below(r, 3);
            break;
        default:
            break;
        }
        return;
    }
    at->job_id = (char *)lf_gen_string(gn, gn->job, sizeof(gn->job));
    at->rank = lf_chance(r, 80) ? 0 : (uint32_t)lf_rand(r);
    at->world = lf_chance(r, 80) ? 1 : lf_below(r, 5);
    if (lf_chance(r, 20)) {
        at->coordinator = (char *)lf_gen_string(gn, gn->text[2], 256);
    }
    at->dtype = (Zerod__Ipc__V1__DType)(lf_chance(r, 90) ? lf_below(r, 3) : lf_rand(r));
    if (lf_chance(r, 3)) { /* more groups than ZS_LAYOUT_MAX_GROUPS, all empty */
        zerod__ipc__v1__group__init(&gn->groups[0]);
        at->n_groups = 4097 + lf_below(r, 800);
        for (size_t i = 0; i < at->n_groups; i++) {
            gn->pgroups[i] = &gn->groups[0];
        }
    } else {
        at->n_groups = lf_chance(r, 5) ? 0 : 1 + lf_below(r, 3);
        for (size_t gi = 0; gi < at->n_groups; gi++) {
            Zerod__Ipc__V1__Group *grp = &gn->groups[gi];

            zerod__ipc__v1__group__init(grp);
            grp->n_numel = lf_chance(r, 5) ? 0 : 1 + lf_below(r, 6);
            if (lf_chance(r, 3)) {
                grp->n_numel = 64;
            }
            for (size_t i = 0; i < grp->n_numel; i++) {
                gn->numel[gi][i] = lf_gen_numel(r);
            }
            grp->numel = gn->numel[gi];
            if (lf_chance(r, 25)) {
                grp->options_json = (char *)lf_options[lf_below(r, LF_N_OPTIONS)];
            }
            gn->pgroups[gi] = grp;
        }
    }
    at->groups = gn->pgroups;
    switch (lf_below(r, 4)) {
    case 0:
        at->config_json = (char *)lf_jobs[lf_below(r, LF_N_JOBS)].config;
        break;
    case 1: { /* a sane config with a few bytes changed */
        const char *src = lf_jobs[lf_below(r, LF_N_JOBS)].config;
        size_t n = strlen(src);

        memcpy(gn->text[1], src, n + 1);
        for (uint32_t k = 1 + lf_below(r, 3); k > 0; k--) {
            gn->text[1][lf_below(r, (uint32_t)n)] = (char)(1 + lf_below(r, 255));
        }
        at->config_json = gn->text[1];
        break;
    }
    case 2: { /* nested deeper than any sane parser should recurse */
        size_t depth = 200 + lf_below(r, 800);

        memset(gn->text[1], '[', depth);
        gn->text[1][depth] = '\0';
        at->config_json = gn->text[1];
        break;
    }
    default:
        at->config_json = (char *)lf_configs[lf_below(r, LF_N_CONFIGS)];
        break;
    }
}

static const char *const lf_kind_name[LF_N_KINDS] = {
    "hello(trainer)", "hello(control)", "hello(odd)", "attach",     "params_ready", "bucket_ready",
    "step",           "detach",         "status",     "shard_info", "reply-type",   "empty"};

/* One valid frame of `kind` appended to b. */
void lf_gen_frame(lf_gen_t *gn, lf_kind_t kind, uint64_t seq, lf_buf_t *b)
{
    uint64_t *r = gn->rng;
    lf_frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    Zerod__Ipc__V1__Step sp = ZEROD__IPC__V1__STEP__INIT;
    Zerod__Ipc__V1__Detach dt = ZEROD__IPC__V1__DETACH__INIT;
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;
    Zerod__Ipc__V1__ShardInfoRequest si = ZEROD__IPC__V1__SHARD_INFO_REQUEST__INIT;
    Zerod__Ipc__V1__Result res = ZEROD__IPC__V1__RESULT__INIT;
    Zerod__Ipc__V1__HelloReply hr = ZEROD__IPC__V1__HELLO_REPLY__INIT;
    Zerod__Ipc__V1__SlotFree sf = ZEROD__IPC__V1__SLOT_FREE__INIT;
    Zerod__Ipc__V1__ErrorReply er = ZEROD__IPC__V1__ERROR_REPLY__INIT;

    f.seq = lf_chance(r, 95) ? seq : lf_rand(r);
    switch (kind) {
    case LF_HELLO_TRAINER:
    case LF_HELLO_CONTROL:
    case LF_HELLO_ODD:
        h.protocol = 1;
        h.version = (char *)"live_fuzz";
        h.role = kind == LF_HELLO_TRAINER ? ZEROD__IPC__V1__ROLE__ROLE_TRAINER
                                          : ZEROD__IPC__V1__ROLE__ROLE_CONTROL;
        if (kind == LF_HELLO_ODD) {
            h.protocol = lf_chance(r, 50) ? 1 : (uint32_t)lf_rand(r);
            h.role = (Zerod__Ipc__V1__Role)(lf_chance(r, 50) ? lf_below(r, 4) : lf_rand(r));
            h.version = (char *)lf_gen_string(gn, gn->version, sizeof(gn->version));
        }
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
        f.hello = &h;
        break;
    case LF_ATTACH:
        lf_gen_attach(gn, &at);
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
        f.attach = &at;
        break;
    case LF_PARAMS_READY:
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY;
        f.params_ready = &pr;
        break;
    case LF_BUCKET_READY:
        /* mostly near the range of the sane jobs (2 slots by default, a few buckets) */
        br.slot = lf_chance(r, 85) ? lf_below(r, 4) : (uint32_t)lf_rand(r) >> lf_below(r, 32);
        br.bucket = lf_chance(r, 85) ? lf_below(r, 6) : (uint32_t)lf_rand(r);
        br.micro_step = lf_chance(r, 85) ? lf_below(r, 3) : (uint32_t)lf_rand(r);
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
        f.bucket_ready = &br;
        break;
    case LF_STEP:
        if (lf_chance(r, 30)) {
            static const double odd[] = {0.01, 0.0, -1.0, 1e308, 5e-324};
            sp.n_group_lr = lf_chance(r, 70) ? 1 : lf_below(r, 8);
            for (size_t i = 0; i < sp.n_group_lr; i++) {
                switch (lf_below(r, 4)) {
                case 0:
                    gn->lr[i] = NAN;
                    break;
                case 1:
                    gn->lr[i] = lf_chance(r, 50) ? INFINITY : -INFINITY;
                    break;
                default:
                    gn->lr[i] = odd[lf_below(r, 5)];
                    break;
                }
            }
            sp.group_lr = gn->lr;
        }
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
        f.step = &sp;
        break;
    case LF_DETACH:
        dt.end_job = lf_chance(r, 50);
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH;
        f.detach = &dt;
        break;
    case LF_STATUS:
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS;
        f.status = &sr;
        break;
    case LF_SHARD_INFO:
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO;
        f.shard_info = &si;
        break;
    case LF_REPLY_TYPE:
        res.message = (char *)"a client sends a reply";
        switch (lf_below(r, 3)) {
        case 0:
            hr.result = &res;
            f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY;
            f.hello_reply = &hr;
            break;
        case 1:
            sf.result = lf_chance(r, 50) ? &res : NULL;
            f.body_case = ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE;
            f.slot_free = &sf;
            break;
        default:
            er.result = &res;
            f.body_case = ZEROD__IPC__V1__FRAME__BODY_ERROR;
            f.error = &er;
            break;
        }
        break;
    default:
        break; /* LF_EMPTY: seq only */
    }
    lf_buf_frame(b, &f);
    if (lf_g.trace) {
        printf("  -> %s seq %" PRIu64 ", %zu bytes\n", lf_kind_name[kind], f.seq,
               zerod__ipc__v1__frame__get_packed_size(&f) + 4);
    }
}

/* ---- mutations of one packed frame (header + body) ------------------------------------ */

/* Mutates the frame at b->p[off..b->len); returns true when it changed it. */
bool lf_mutate(uint64_t *r, lf_buf_t *b, size_t off)
{
    static const uint8_t interesting[] = {0x00, 0xff, 0x80, 0x7f, 0x01, 0x0a, 0x12, 0x08};
    static const uint32_t lens[] = {0,           1,          2, 5, LF_MAX_FRAME, LF_MAX_FRAME + 1u,
                                    0x7fffffffu, 0xffffffffu};
    size_t n = b->len - off - 4; /* body length */
    uint8_t *body = b->p + off + 4;

    switch (lf_below(r, 10)) {
    case 0: /* bit flips */
        for (uint32_t k = 1 + lf_below(r, 8); k > 0 && n > 0; k--) {
            body[lf_below(r, (uint32_t)n)] ^= (uint8_t)(1u << lf_below(r, 8));
        }
        return n > 0;
    case 1: /* interesting bytes */
        for (uint32_t k = 1 + lf_below(r, 4); k > 0 && n > 0; k--) {
            body[lf_below(r, (uint32_t)n)] = interesting[lf_below(r, sizeof(interesting))];
        }
        return n > 0;
    case 2: /* body cut short, header still promising the whole: misaligns the stream */
        if (n > 0) {
            b->len -= 1 + lf_below(r, (uint32_t)n);
        }
        return true;
    case 3: /* body cut short, header fixed: an undecodable frame */
        if (n > 1) {
            b->len -= 1 + lf_below(r, (uint32_t)n - 1);
            rf_put_le32(b->p + off, (uint32_t)(b->len - off - 4));
        }
        return true;
    case 4: /* a wrong length */
        if (lf_chance(r, 50)) {
            rf_put_le32(b->p + off, lens[lf_below(r, 8)]);
        } else {
            rf_put_le32(b->p + off, (uint32_t)((int64_t)n + (int64_t)lf_below(r, 9) - 4));
        }
        return true;
    case 5: /* garbage of a plausible length */
        b->len = off;
        n = lf_below(r, 64);
        lf_buf_reserve(b, n + 4);
        rf_put_le32(b->p + off, (uint32_t)n);
        for (size_t i = 0; i < n; i++) {
            b->p[off + 4 + i] = (uint8_t)lf_rand(r);
        }
        b->len = off + 4 + n;
        return true;
    case 6: { /* random bytes inserted, header fixed */
        uint32_t k = 1 + lf_below(r, 16);
        size_t at = n ? lf_below(r, (uint32_t)n + 1) : 0;

        lf_buf_reserve(b, k);
        body = b->p + off + 4;
        memmove(body + at + k, body + at, n - at);
        for (uint32_t i = 0; i < k; i++) {
            body[at + i] = (uint8_t)lf_rand(r);
        }
        b->len += k;
        rf_put_le32(b->p + off, (uint32_t)(n + k));
        return true;
    }
    case 7: { /* an unknown field: tag 31..2^29, varint or length-delimited */
        uint8_t extra[16];
        size_t k = 0;
        uint64_t tag = ((31 + (lf_rand(r) % ((1u << 29) - 31))) << 3) | (lf_chance(r, 50) ? 0 : 2);

        while (tag >= 0x80) {
            extra[k++] = (uint8_t)(tag | 0x80);
            tag >>= 7;
        }
        extra[k++] = (uint8_t)tag;
        extra[k++] = (uint8_t)lf_below(r, 4); /* varint value, or a short length */
        extra[k++] = 0x2a;
        extra[k++] = 0x2a;
        extra[k++] = 0x2a;
        lf_buf_put(b, extra, k);
        rf_put_le32(b->p + off, (uint32_t)(n + k));
        return true;
    }
    case 8: { /* the frame twice */
        size_t whole = b->len - off;

        lf_buf_reserve(b, whole);
        memcpy(b->p + b->len, b->p + off, whole);
        b->len += whole;
        return false; /* two valid frames */
    }
    default: /* header alone, or header and a few bytes */
        b->len = off + 4 + (n ? lf_below(r, (uint32_t)n) : 0);
        return true;
    }
}
