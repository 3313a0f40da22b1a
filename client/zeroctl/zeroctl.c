/*
 * zeroctl: inspect a zerod daemon over its socket (control role).
 *
 *   zeroctl [-s SOCKET] [--json] [--timeout MS] status|shard
 *   zeroctl [--json] checkpoint ls|verify|export ...   (files only: ckpt_cmd.c)
 *   zeroctl export --checkpoint CKPT ... OUT
 *
 * Exit codes (conventions.md): 0 ok, 1 the daemon returned an error, 2 usage, 7 daemon
 * unreachable. --json prints one object with "schema_version" (the stable interface); the
 * human output is a table with units in the header.
 */
#define _GNU_SOURCE
#include "ckpt_cmd.h"
#include "job_cmd.h"
#include "zerod/zc.h" /* the public API only: zeroctl is a client like any other */

#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZEROCTL_SCHEMA_VERSION 1

enum {
    ZEROCTL_EXIT_OK = 0,
    ZEROCTL_EXIT_DAEMON = 1,
    ZEROCTL_EXIT_USAGE = 2,
    ZEROCTL_EXIT_UNREACHABLE = 7,
    ZEROCTL_EXIT_CONTINUE = -1, /* zeroctl_parse_args: no exit yet */
};

typedef struct zeroctl_opts {
    const char *socket_path;
    int json;
    int timeout_ms;
    const char *cmd; /* "status" or "shard" */
} zeroctl_opts_t;

static void zeroctl_usage(FILE *out)
{
    fprintf(out,
            "Usage: zeroctl [OPTIONS] COMMAND\n"
            "Inspect a zerod daemon.\n"
            "\n"
            "Commands:\n"
            "  status             daemon, job, step, collectives and memory by category\n"
            "  shard              this rank's shard ranges per parameter group\n"
            "  config             the job's training config as resolved, with each value's source\n"
            "                     (config, default or derived)\n"
            "  checkpoint ls|verify|export ...  checkpoint directories (no daemon; see\n"
            "                     'zeroctl checkpoint --help')\n"
            "  export --checkpoint CKPT OUT     one safetensors file of the model\n"
            "  job ls|end ...     the daemons' jobs; end one on every daemon that holds it\n"
            "                     (see 'zeroctl job --help')\n"
            "\n"
            "Options:\n"
            "  -s, --socket PATH  daemon socket (default: $ZEROD_SOCKET, else %s)\n"
            "  -j, --json         print one JSON object (stable; has \"schema_version\")\n"
            "  -t, --timeout MS   deadline for the daemon's answer (default 10000)\n"
            "  -h, --help         print this help and exit\n"
            "  -V, --version      print the version and exit\n"
            "\n"
            "Exit status: 0 ok, 1 the daemon returned an error, 2 usage error, 7 daemon "
            "unreachable.\n",
            ZC_DEFAULT_SOCKET);
}

static void zeroctl_hex64(uint64_t v, char *buf, size_t len)
{
    snprintf(buf, len, "0x%016" PRIx64, v);
}

/* A failed call: libzc's message, or ours when it kept none (out of memory here). */
static void zeroctl_fail(int status)
{
    if (status == ZC_ERR_NO_MEMORY && zc_last_error()[0] == '\0') {
        fprintf(stderr, "zeroctl: out of memory\n");
    } else {
        fprintf(stderr, "zeroctl: %s\n", zc_last_error());
    }
}

/* Print the JSON object and free it. */
static int zeroctl_print_json(cJSON *root)
{
    char *text;

    if (root == NULL) {
        fprintf(stderr, "zeroctl: out of memory building the JSON output\n");
        return ZEROCTL_EXIT_DAEMON;
    }
    text = cJSON_Print(root);
    cJSON_Delete(root);
    if (text == NULL) {
        fprintf(stderr, "zeroctl: out of memory printing the JSON output\n");
        return ZEROCTL_EXIT_DAEMON;
    }
    printf("%s\n", text);
    cJSON_free(text);
    return ZEROCTL_EXIT_OK;
}

/* ---- status ------------------------------------------------------------------------ */

/* What `zeroctl status` shows: the status and its memory terms. */
typedef struct zeroctl_status {
    zc_daemon_status_t st;
    zc_memory_term_t *memory; /* [st.n_memory] */
} zeroctl_status_t;

static cJSON *zeroctl_status_json(const zeroctl_status_t *z)
{
    const zc_daemon_status_t *r = &z->st;
    cJSON *root = cJSON_CreateObject();
    cJSON *job, *mem;
    char hash[32];

    cJSON_AddNumberToObject(root, "schema_version", ZEROCTL_SCHEMA_VERSION);
    cJSON_AddStringToObject(root, "command", "status");
    cJSON_AddStringToObject(root, "version", r->version);
    cJSON_AddNumberToObject(root, "pid", r->pid);
    cJSON_AddStringToObject(root, "device", r->device);
    cJSON_AddStringToObject(root, "socket", r->socket);
    cJSON_AddNumberToObject(root, "uptime_s", r->uptime_s);
    cJSON_AddNumberToObject(root, "heap_in_use_bytes", (double)r->heap_in_use);
    if (r->activity[0] != '\0') {
        cJSON_AddStringToObject(root, "activity", r->activity);
        cJSON_AddNumberToObject(root, "activity_s", r->activity_s);
    } else {
        cJSON_AddNullToObject(root, "activity");
        cJSON_AddNumberToObject(root, "activity_s", 0);
    }
    cJSON_AddBoolToObject(root, "has_job", r->has_job);
    if (r->has_job) {
        job = cJSON_AddObjectToObject(root, "job");
        cJSON_AddStringToObject(job, "id", r->job_id);
        cJSON_AddNumberToObject(job, "rank", r->rank);
        cJSON_AddNumberToObject(job, "world", r->world);
        cJSON_AddNumberToObject(job, "stage", r->stage);
        cJSON_AddStringToObject(job, "dtype", zc_dtype_name(r->dtype));
        cJSON_AddNumberToObject(job, "step", (double)r->step);
        cJSON_AddNumberToObject(job, "skipped_steps", (double)r->skipped_steps);
        cJSON_AddNumberToObject(job, "loss_scale", r->loss_scale);
        cJSON_AddNumberToObject(job, "grad_norm", r->grad_norm);
        cJSON_AddBoolToObject(job, "trainer_attached", r->trainer_attached);
        cJSON_AddNumberToObject(job, "param_numel", (double)r->param_numel);
        /* a 64-bit identifier: a string, since JSON numbers are doubles */
        zeroctl_hex64(r->layout_hash, hash, sizeof(hash));
        cJSON_AddStringToObject(job, "layout_hash", hash);
        cJSON_AddStringToObject(job, "collectives", r->collectives);
    } else {
        cJSON_AddNullToObject(root, "job");
    }
    mem = cJSON_AddArrayToObject(root, "memory");
    for (uint32_t i = 0; i < r->n_memory; i++) {
        const zc_memory_term_t *t = &z->memory[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t->name);
        cJSON_AddNumberToObject(o, "bytes", (double)t->bytes);
        cJSON_AddNumberToObject(o, "formula_bytes", (double)t->formula_bytes);
        cJSON_AddStringToObject(o, "formula", t->formula);
        cJSON_AddItemToArray(mem, o);
    }
    return root;
}

static void zeroctl_status_job_table(const zc_daemon_status_t *r)
{
    char hash[32];

    zeroctl_hex64(r->layout_hash, hash, sizeof(hash));
    printf("%-20s %s\n", "job", r->job_id);
    printf("%-20s %u/%u\n", "rank/world", r->rank, r->world);
    printf("%-20s %u\n", "stage", r->stage);
    printf("%-20s %s\n", "dtype", zc_dtype_name(r->dtype));
    printf("%-20s %s\n", "trainer", r->trainer_attached ? "attached" : "detached");
    printf("%-20s %" PRIu64 "\n", "step", r->step);
    printf("%-20s %" PRIu64 "\n", "skipped steps", r->skipped_steps);
    printf("%-20s %g\n", "loss scale", r->loss_scale);
    if (r->grad_norm < 0) {
        printf("%-20s %s\n", "last grad norm", "not finite");
    } else {
        printf("%-20s %.6g\n", "last grad norm", r->grad_norm);
    }
    printf("%-20s %" PRIu64 "\n", "params (elements)", r->param_numel);
    printf("%-20s %s\n", "layout hash", hash);
    printf("%-20s %s\n", "collectives", r->collectives);
}

static void zeroctl_status_memory_table(const zeroctl_status_t *z)
{
    uint64_t total = 0, total_formula = 0;

    if (z->st.n_memory == 0) {
        return;
    }
    printf("\n%-12s %16s %16s %10s  %s\n", "MEMORY", "MEASURED (B)", "FORMULA (B)", "MEAS (MiB)",
           "FORMULA");
    for (uint32_t i = 0; i < z->st.n_memory; i++) {
        const zc_memory_term_t *t = &z->memory[i];
        printf("%-12s %16" PRIu64 " %16" PRIu64 " %10.2f  %s\n", t->name, t->bytes,
               t->formula_bytes, (double)t->bytes / (1024.0 * 1024.0), t->formula);
        total += t->bytes;
        total_formula += t->formula_bytes;
    }
    printf("%-12s %16" PRIu64 " %16" PRIu64 " %10.2f\n", "total", total, total_formula,
           (double)total / (1024.0 * 1024.0));
}

static void zeroctl_status_table(const zeroctl_status_t *z)
{
    const zc_daemon_status_t *r = &z->st;

    printf("%-20s %s\n", "FIELD", "VALUE");
    printf("%-20s %s\n", "version", r->version);
    printf("%-20s %d\n", "pid", r->pid);
    printf("%-20s %s\n", "device", r->device);
    printf("%-20s %s\n", "socket", r->socket);
    printf("%-20s %.1f\n", "uptime (s)", r->uptime_s);
    printf("%-20s %" PRIu64 "\n", "heap in use (B)", r->heap_in_use);
    if (r->activity[0] != '\0') {
        printf("%-20s %s (%.1f s)\n", "busy with", r->activity, r->activity_s);
    } else {
        printf("%-20s %s\n", "busy with", "nothing (waiting for work)");
    }
    if (!r->has_job) {
        printf("%-20s %s\n", "job", "-");
    } else {
        zeroctl_status_job_table(r);
    }
    zeroctl_status_memory_table(z);
}

/* The daemon's status and every memory term, into z (z->memory: the caller frees). */
static int zeroctl_status_fetch(zc_session_t *s, int timeout_ms, zeroctl_status_t *z)
{
    int status;

    z->st.field_mask = ZC_DAEMON_STATUS_FIELD_DAEMON | ZC_DAEMON_STATUS_FIELD_ACTIVITY |
                       ZC_DAEMON_STATUS_FIELD_JOB | ZC_DAEMON_STATUS_FIELD_MEMORY;
    status = zc_session_daemon_status(s, timeout_ms, &z->st);
    if (status != ZC_OK) {
        return status;
    }
    z->memory = calloc(z->st.n_memory > 0 ? z->st.n_memory : 1, sizeof(*z->memory));
    if (z->memory == NULL) {
        return ZC_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < z->st.n_memory; i++) {
        z->memory[i].field_mask = ZC_MEMORY_TERM_FIELD_MEASURED | ZC_MEMORY_TERM_FIELD_FORMULA;
        status = zc_session_memory_term(s, i, &z->memory[i]);
        if (status != ZC_OK) {
            return status;
        }
    }
    return ZC_OK;
}

static int zeroctl_status(zc_session_t *s, const zeroctl_opts_t *o)
{
    zeroctl_status_t z = {.memory = NULL};
    int status;
    int rc;

    status = zeroctl_status_fetch(s, o->timeout_ms, &z);
    if (status != ZC_OK) {
        zeroctl_fail(status);
        rc = ZEROCTL_EXIT_DAEMON;
    } else if (o->json) {
        rc = zeroctl_print_json(zeroctl_status_json(&z));
    } else {
        zeroctl_status_table(&z);
        rc = ZEROCTL_EXIT_OK;
    }
    free(z.memory);
    return rc;
}

/* ---- shard ------------------------------------------------------------------------- */

/* What `zeroctl shard` shows: the shard and its groups. */
typedef struct zeroctl_shard {
    zc_shard_info_t info;
    zc_group_shard_t *groups; /* [info.n_groups] */
} zeroctl_shard_t;

static cJSON *zeroctl_shard_json(const zeroctl_shard_t *z)
{
    const zc_shard_info_t *r = &z->info;
    cJSON *root = cJSON_CreateObject();
    cJSON *groups;
    char hash[32];

    zeroctl_hex64(r->layout_hash, hash, sizeof(hash));
    cJSON_AddNumberToObject(root, "schema_version", ZEROCTL_SCHEMA_VERSION);
    cJSON_AddStringToObject(root, "command", "shard");
    cJSON_AddStringToObject(root, "job_id", r->job_id);
    cJSON_AddNumberToObject(root, "rank", r->rank);
    cJSON_AddNumberToObject(root, "world", r->world);
    cJSON_AddNumberToObject(root, "total_numel", (double)r->total_numel);
    cJSON_AddNumberToObject(root, "param_numel", (double)r->param_numel);
    cJSON_AddNumberToObject(root, "shard_numel", (double)r->shard_numel);
    cJSON_AddNumberToObject(root, "n_buckets", r->n_buckets);
    cJSON_AddNumberToObject(root, "max_bucket_numel", (double)r->max_bucket_numel);
    cJSON_AddNumberToObject(root, "bucket_size", (double)r->bucket_size);
    cJSON_AddStringToObject(root, "layout_hash", hash);
    cJSON_AddNumberToObject(root, "master_sumsq", r->master_sumsq);
    groups = cJSON_AddArrayToObject(root, "groups");
    for (uint32_t i = 0; i < r->n_groups; i++) {
        const zc_group_shard_t *g = &z->groups[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "group", g->group);
        cJSON_AddNumberToObject(o, "n_params", g->n_params);
        cJSON_AddNumberToObject(o, "n_buckets", g->n_buckets);
        cJSON_AddNumberToObject(o, "flat_offset", (double)g->flat_offset);
        cJSON_AddNumberToObject(o, "flat_numel", (double)g->flat_numel);
        cJSON_AddNumberToObject(o, "shard_offset", (double)g->shard_offset);
        cJSON_AddNumberToObject(o, "shard_numel", (double)g->shard_numel);
        cJSON_AddNumberToObject(o, "lr", g->lr);
        cJSON_AddNumberToObject(o, "weight_decay", g->weight_decay);
        cJSON_AddItemToArray(groups, o);
    }
    return root;
}

static void zeroctl_shard_table(const zeroctl_shard_t *z)
{
    const zc_shard_info_t *r = &z->info;
    char hash[32];

    zeroctl_hex64(r->layout_hash, hash, sizeof(hash));
    printf("%-26s %s\n", "FIELD", "VALUE");
    printf("%-26s %s\n", "job", r->job_id);
    printf("%-26s %u/%u\n", "rank/world", r->rank, r->world);
    printf("%-26s %" PRIu64 "\n", "total (elements)", r->total_numel);
    printf("%-26s %" PRIu64 "\n", "params (elements)", r->param_numel);
    printf("%-26s %" PRIu64 "\n", "shard (elements)", r->shard_numel);
    printf("%-26s %u\n", "buckets", r->n_buckets);
    printf("%-26s %" PRIu64 "\n", "largest bucket (elements)", r->max_bucket_numel);
    printf("%-26s %" PRIu64 "\n", "bucket size (elements)", r->bucket_size);
    printf("%-26s %s\n", "layout hash", hash);
    printf("%-26s %.9g\n", "master sum of squares", r->master_sumsq);
    printf("\n%5s %7s %7s %14s %14s %14s %14s %10s %10s\n", "GROUP", "PARAMS", "BUCKETS",
           "FLAT OFF (el)", "FLAT LEN (el)", "SHARD OFF (el)", "SHARD LEN (el)", "LR", "WD");
    for (uint32_t i = 0; i < r->n_groups; i++) {
        const zc_group_shard_t *g = &z->groups[i];
        printf("%5u %7u %7u %14" PRIu64 " %14" PRIu64 " %14" PRIu64 " %14" PRIu64
               " %10.4g %10.4g\n",
               g->group, g->n_params, g->n_buckets, g->flat_offset, g->flat_numel, g->shard_offset,
               g->shard_numel, g->lr, g->weight_decay);
    }
}

/* This rank's shard and every group, into z (z->groups: the caller frees). */
static int zeroctl_shard_fetch(zc_session_t *s, int timeout_ms, zeroctl_shard_t *z)
{
    int status;

    z->info.field_mask =
        ZC_SHARD_INFO_FIELD_LAYOUT | ZC_SHARD_INFO_FIELD_MASTER | ZC_SHARD_INFO_FIELD_GROUPS;
    status = zc_session_shard_info(s, timeout_ms, &z->info);
    if (status != ZC_OK) {
        return status;
    }
    z->groups = calloc(z->info.n_groups > 0 ? z->info.n_groups : 1, sizeof(*z->groups));
    if (z->groups == NULL) {
        return ZC_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < z->info.n_groups; i++) {
        z->groups[i].field_mask = ZC_GROUP_SHARD_FIELD_RANGES | ZC_GROUP_SHARD_FIELD_OPTIONS;
        status = zc_session_group_shard(s, i, &z->groups[i]);
        if (status != ZC_OK) {
            return status;
        }
    }
    return ZC_OK;
}

static int zeroctl_shard(zc_session_t *s, const zeroctl_opts_t *o)
{
    zeroctl_shard_t z = {.groups = NULL};
    int status;
    int rc;

    status = zeroctl_shard_fetch(s, o->timeout_ms, &z);
    if (status != ZC_OK) {
        zeroctl_fail(status);
        rc = ZEROCTL_EXIT_DAEMON;
    } else if (o->json) {
        rc = zeroctl_print_json(zeroctl_shard_json(&z));
    } else {
        zeroctl_shard_table(&z);
        rc = ZEROCTL_EXIT_OK;
    }
    free(z.groups);
    return rc;
}

/* ---- config ------------------------------------------------------------------------ */

/* The job's resolved training config, key by key, and where each value came from. */
static int zeroctl_config(zc_session_t *s, const zeroctl_opts_t *o)
{
    zc_shard_info_t info = {.field_mask = ZC_SHARD_INFO_FIELD_LAYOUT};
    const char *text;
    cJSON *rows, *root;
    const cJSON *row;

    int status = zc_session_shard_info(s, o->timeout_ms, &info);

    if (status != ZC_OK) {
        zeroctl_fail(status);
        return ZEROCTL_EXIT_DAEMON;
    }
    text = zc_session_training_config(s);
    rows = cJSON_Parse(text != NULL && *text != '\0' ? text : "[]");
    if (rows == NULL) {
        fprintf(stderr, "zeroctl: the daemon sent a training config that is not JSON\n");
        return ZEROCTL_EXIT_DAEMON;
    }
    if (o->json) {
        root = cJSON_CreateObject();
        cJSON_AddNumberToObject(root, "schema_version", ZEROCTL_SCHEMA_VERSION);
        cJSON_AddStringToObject(root, "command", "config");
        cJSON_AddStringToObject(root, "job_id", info.job_id);
        cJSON_AddNumberToObject(root, "rank", info.rank);
        cJSON_AddNumberToObject(root, "world", info.world);
        cJSON_AddItemToObject(root, "keys", rows);
        return zeroctl_print_json(root);
    }
    printf("job %s, rank %u of %u\n%-50s %-24s %s\n", info.job_id, info.rank, info.world, "KEY",
           "VALUE", "SOURCE");
    cJSON_ArrayForEach(row, rows)
    {
        char *v = cJSON_PrintUnformatted(cJSON_GetObjectItem(row, "value"));
        printf("%-50s %-24s %s\n", cJSON_GetStringValue(cJSON_GetObjectItem(row, "key")),
               v != NULL ? v : "?", cJSON_GetStringValue(cJSON_GetObjectItem(row, "source")));
        cJSON_free(v);
    }
    cJSON_Delete(rows);
    return ZEROCTL_EXIT_OK;
}

/* ---- main -------------------------------------------------------------------------- */

static int zeroctl_parse_timeout(const char *arg, int *ms_p)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);

    if (end == arg || *end != '\0' || v <= 0 || v > 3600L * 1000L) {
        return -1;
    }
    *ms_p = (int)v;
    return 0;
}

/* The command line into o; ZEROCTL_EXIT_CONTINUE, or the exit code when there is nothing more to
 * do (--help, a usage error, reported). */
static int zeroctl_parse_args(int argc, char **argv, zeroctl_opts_t *o)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'}, /* "zeroctl X.Y.Z", as zerod and zerorun print */
        {NULL, 0, NULL, 0},
    };
    int c;

    while ((c = getopt_long(argc, argv, "s:jt:hV", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            o->socket_path = optarg;
            break;
        case 'j':
            o->json = 1;
            break;
        case 't':
            if (zeroctl_parse_timeout(optarg, &o->timeout_ms) != 0) {
                fprintf(stderr,
                        "zeroctl: --timeout '%s' is not a number of milliseconds in "
                        "1..3600000\n",
                        optarg);
                return ZEROCTL_EXIT_USAGE;
            }
            break;
        case 'h':
            zeroctl_usage(stdout);
            return ZEROCTL_EXIT_OK;
        case 'V':
            printf("zeroctl %s\n", zc_version()); /* ZS_VERSION (zs/version.h) */
            return ZEROCTL_EXIT_OK;
        default:
            fprintf(stderr, "Try 'zeroctl --help'.\n");
            return ZEROCTL_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "zeroctl: missing COMMAND (status or shard); try 'zeroctl --help'\n");
        return ZEROCTL_EXIT_USAGE;
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "zeroctl: unexpected argument '%s' after COMMAND '%s'\n", argv[optind + 1],
                argv[optind]);
        return ZEROCTL_EXIT_USAGE;
    }
    o->cmd = argv[optind];
    if (strcmp(o->cmd, "status") != 0 && strcmp(o->cmd, "shard") != 0 &&
        strcmp(o->cmd, "config") != 0) {
        fprintf(stderr, "zeroctl: unknown command '%s' (expected status, shard or config)\n",
                o->cmd);
        return ZEROCTL_EXIT_USAGE;
    }
    return ZEROCTL_EXIT_CONTINUE;
}

/* A control session on the daemon; on failure, reported, the exit code. */
static int zeroctl_open(const zeroctl_opts_t *o, zc_session_t **s_p)
{
    zc_open_params_t op;
    int status;

    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_TIMEOUT_MS | ZC_OPEN_FIELD_CONTROL;
    op.timeout_ms = o->timeout_ms;
    op.control = 1;
    if (o->socket_path != NULL) {
        op.field_mask |= ZC_OPEN_FIELD_SOCKET_PATH;
        op.socket_path = o->socket_path;
    }
    status = zc_session_open(&op, s_p);
    if (status == ZC_OK) {
        return ZEROCTL_EXIT_OK;
    }
    fprintf(stderr, "zeroctl: %s\n", zc_last_error());
    if (status == ZC_ERR_UNREACHABLE || status == ZC_ERR_PERMISSION) {
        return ZEROCTL_EXIT_UNREACHABLE;
    }
    return (status == ZC_ERR_INVALID) ? ZEROCTL_EXIT_USAGE : ZEROCTL_EXIT_DAEMON;
}

int main(int argc, char **argv)
{
    zeroctl_opts_t o = {.socket_path = NULL, .json = 0, .timeout_ms = 10000, .cmd = NULL};
    zc_session_t *s = NULL;
    const char *sock = NULL;
    int rc, json = 0, tmo = 600000;

    for (int i = 1; i < argc; i++) { /* checkpoint, export, job: what follows is theirs */
        if (strcmp(argv[i], "checkpoint") == 0 || strcmp(argv[i], "export") == 0) {
            return zeroctl_checkpoint_main(argc - i, argv + i, json, sock, tmo);
        }
        if (strcmp(argv[i], "job") == 0) {
            return zeroctl_job_main(argc - i, argv + i, json, sock, tmo == 600000 ? 0 : tmo);
        }
        if (strcmp(argv[i], "-j") == 0 || strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if ((strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--socket") == 0) &&
                   i + 1 < argc) {
            sock = argv[++i];
        } else if ((strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--timeout") == 0) &&
                   i + 1 < argc) {
            if (zeroctl_parse_timeout(argv[++i], &tmo) != 0) {
                break; /* zeroctl_parse_args reports it */
            }
        } else if (argv[i][0] != '-') {
            break; /* the command is the daemon's */
        }
    }
    rc = zeroctl_parse_args(argc, argv, &o);
    if (rc != ZEROCTL_EXIT_CONTINUE) {
        return rc;
    }
    rc = zeroctl_open(&o, &s);
    if (rc != ZEROCTL_EXIT_OK) {
        return rc;
    }
    if (strcmp(o.cmd, "status") == 0) {
        rc = zeroctl_status(s, &o);
    } else if (strcmp(o.cmd, "config") == 0) {
        rc = zeroctl_config(s, &o);
    } else {
        rc = zeroctl_shard(s, &o);
    }
    zc_session_close(s);
    return rc;
}
