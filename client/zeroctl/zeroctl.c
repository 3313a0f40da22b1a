/*
 * zeroctl: inspect a zerod daemon over its socket (control role).
 *
 *   zeroctl [-s SOCKET] [--json] [--timeout MS] status|shard|config
 *   zeroctl [--dir DIR] [--json] [--timeout MS] status [-l SECONDS]   every daemon of the host
 *                                                                     (status_cmd.c)
 *   zeroctl [--json] checkpoint ls|verify|export ...   (files only: ckpt_cmd.c)
 *   zeroctl export --checkpoint CKPT ... OUT
 *
 * Exit codes: 0 ok, 1 the daemon returned an error, 2 usage, 7 daemon unreachable (cli.h).
 * --json prints one object with "schema_version" (the stable interface), also for an error
 * (cli.h); the human output is a table with units in the header.
 */
#define _GNU_SOURCE
#include "ckpt_cmd.h"
#include "cli.h"
#include "job_cmd.h"
#include "status_cmd.h"
#include "trace_cmd.h"
#include "zerod/zc.h" /* the public API only: zeroctl is a client like any other */

#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZEROCTL_SCHEMA_VERSION ZCTL_SCHEMA_VERSION

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
    int timeout_given; /* -t (status: else each command's default) */
    const char *dir;   /* status: --dir */
    int loop_s;        /* status: -l */
    const char *cmd;   /* "status", "shard" or "config" */
} zeroctl_opts_t;

static void zeroctl_usage(FILE *out)
{
    fprintf(out,
            "Usage: zeroctl [OPTIONS] COMMAND\n"
            "Inspect zerod daemons.\n"
            "\n"
            "Commands:\n"
            "  status             daemon, job, step, steps/s, samples/s, bus bandwidth, memory\n"
            "                     by category; without -s or $ZEROD_SOCKET one row per daemon\n"
            "                     of --dir (socket, device, job, rank, state, step, rates,\n"
            "                     memory, trainer pid); an unreachable one is a row with its\n"
            "                     error\n"
            "  shard              this rank's shard ranges per parameter group\n"
            "  config             the job's training config as resolved, with each value's source\n"
            "                     (config, default or derived)\n"
            "  checkpoint ls|verify|export ...  checkpoint directories (no daemon; see\n"
            "                     'zeroctl checkpoint --help')\n"
            "  export --checkpoint CKPT OUT     one safetensors file of the model\n"
            "  job ls|end ...     the daemons' jobs; end one on every daemon that holds it\n"
            "                     (see 'zeroctl job --help')\n"
            "  trace [-n N] [-o FILE] ...  a Chrome / Perfetto trace of a job's last N steps on\n"
            "                     every daemon (see 'zeroctl trace --help')\n"
            "\n"
            "Options:\n"
            "  -s, --socket PATH  daemon socket (default: $ZEROD_SOCKET, else %s;\n"
            "                     status: else the table of every daemon of --dir)\n"
            "  -j, --json         print one JSON object (stable; has \"schema_version\")\n"
            "  -t, --timeout MS   deadline for the daemon's answer (default 10000; each daemon\n"
            "                     of the status table: 5000)\n"
            "      --dir DIR      status: the table of every daemon socket in DIR (default\n"
            "                     /run/zerod), even with $ZEROD_SOCKET set\n"
            "  -l, --loop SECONDS\n"
            "                     status: redraw every SECONDS (1..86400) until SIGINT or\n"
            "                     SIGTERM, the screen cleared before each; with --json one\n"
            "                     object per line\n"
            "  -h, --help         print this help and exit\n"
            "  -V, --version      print the version and exit\n"
            "\n"
            "With --json an error is an object too: {\"schema_version\", \"command\", \"error\":\n"
            "{\"status\", \"message\"}}.\n"
            "\n"
            "Exit status: 0 ok, 1 the daemon returned an error, 2 usage error, 7 daemon "
            "unreachable\n"
            "(the status table: 7 when a daemon was unreachable or DIR holds none, else 1 when\n"
            "one failed).\n",
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
        zctl_error(status, "out of memory");
    } else {
        zctl_error(status, "%s", zc_last_error());
    }
}

/* Print the JSON object and free it. */
static int zeroctl_print_json(cJSON *root)
{
    return zctl_print_json(root, 0);
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
        zctl_error(ZC_ERR_PROTOCOL, "the daemon sent a training config that is not JSON");
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

/* -l SECONDS: 1..86400 */
static int zeroctl_parse_loop(const char *arg, int *s_p)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);

    if (end == arg || *end != '\0' || v <= 0 || v > 86400L) {
        return zctl_usage_error("zeroctl --help",
                                "--loop '%s' is not a number of seconds in 1..86400", arg);
    }
    *s_p = (int)v;
    return ZEROCTL_EXIT_CONTINUE;
}

/* One option into o; ZEROCTL_EXIT_CONTINUE, or the exit code. */
static int zeroctl_parse_opt(int c, char **argv, zeroctl_opts_t *o)
{
    switch (c) {
    case 's':
        o->socket_path = optarg;
        return ZEROCTL_EXIT_CONTINUE;
    case 'j':
        o->json = 1;
        return ZEROCTL_EXIT_CONTINUE;
    case 't':
        o->timeout_given = 1;
        if (zeroctl_parse_timeout(optarg, &o->timeout_ms) != 0) {
            return zctl_usage_error("zeroctl --help",
                                    "--timeout '%s' is not a number of milliseconds in 1..3600000",
                                    optarg);
        }
        return ZEROCTL_EXIT_CONTINUE;
    case 'd':
        o->dir = optarg;
        return ZEROCTL_EXIT_CONTINUE;
    case 'l':
        return zeroctl_parse_loop(optarg, &o->loop_s);
    case 'h':
        zeroctl_usage(stdout);
        return ZEROCTL_EXIT_OK;
    case 'V':
        printf("zeroctl %s\n", zc_version()); /* ZS_VERSION (zs/version.h) */
        return ZEROCTL_EXIT_OK;
    default:
        return zctl_getopt_error(c, argv, "zeroctl --help");
    }
}

/* The command and what only status takes; ZEROCTL_EXIT_CONTINUE, or the exit code. */
static int zeroctl_check_cmd(int argc, char **argv, zeroctl_opts_t *o)
{
    if (optind >= argc) {
        return zctl_usage_error("zeroctl --help", "missing COMMAND (status, shard or config)");
    }
    o->cmd = argv[optind];
    if (strcmp(o->cmd, "status") != 0 && strcmp(o->cmd, "shard") != 0 &&
        strcmp(o->cmd, "config") != 0) {
        return zctl_usage_error("zeroctl --help",
                                "unknown command '%s' (expected status, shard or config)", o->cmd);
    }
    zctl_set_command(o->cmd);
    if (optind + 1 < argc) {
        return zctl_usage_error("zeroctl --help", "unexpected argument '%s' after COMMAND '%s'",
                                argv[optind + 1], argv[optind]);
    }
    if (strcmp(o->cmd, "status") != 0 && (o->dir != NULL || o->loop_s > 0)) {
        return zctl_usage_error("zeroctl --help", "%s is an option of status only",
                                o->dir != NULL ? "--dir" : "--loop");
    }
    if (o->socket_path != NULL && o->dir != NULL) {
        return zctl_usage_error("zeroctl --help",
                                "-s SOCKET (one daemon) and --dir DIR (every daemon of DIR) "
                                "exclude each other");
    }
    return ZEROCTL_EXIT_CONTINUE;
}

/* The command line into o; ZEROCTL_EXIT_CONTINUE, or the exit code when there is nothing more to
 * do (--help, a usage error, reported). */
static int zeroctl_parse_args(int argc, char **argv, zeroctl_opts_t *o)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"timeout", required_argument, NULL, 't'},
        {"dir", required_argument, NULL, 'd'},
        {"loop", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'}, /* "zeroctl X.Y.Z", as zerod and zerorun print */
        {NULL, 0, NULL, 0},
    };
    int c, rc;

    opterr = 0; /* zctl_getopt_error says it, under --json as JSON too */
    while ((c = getopt_long(argc, argv, ":s:jt:l:hV", longopts, NULL)) != -1) {
        rc = zeroctl_parse_opt(c, argv, o);
        if (rc != ZEROCTL_EXIT_CONTINUE) {
            return rc;
        }
    }
    zctl_set_json(o->json);
    return zeroctl_check_cmd(argc, argv, o);
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
    zctl_error(status, "%s", zc_last_error());
    if (status == ZC_ERR_UNREACHABLE || status == ZC_ERR_PERMISSION) {
        return ZEROCTL_EXIT_UNREACHABLE;
    }
    return (status == ZC_ERR_INVALID) ? ZEROCTL_EXIT_USAGE : ZEROCTL_EXIT_DAEMON;
}

/* Errors in JSON under --json anywhere (cli.h), naming the command even when a usage error
 * comes before zeroctl_check_cmd sees it. */
static void zeroctl_error_setup(int argc, char **argv)
{
    static const char *const cmds[] = {"status", "shard", "config"};
    int named = 0;

    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        zctl_set_json(strcmp(argv[i], "-j") == 0 || strcmp(argv[i], "--json") == 0);
        for (size_t k = 0; k < sizeof(cmds) / sizeof(cmds[0]) && !named; k++) {
            named = strcmp(argv[i], cmds[k]) == 0;
            if (named) {
                zctl_set_command(cmds[k]);
            }
        }
    }
}

int main(int argc, char **argv)
{
    zeroctl_opts_t o = {.socket_path = NULL, .json = 0, .timeout_ms = 10000, .cmd = NULL};
    zc_session_t *s = NULL;
    const char *sock = NULL;
    int rc, json = 0, tmo = 600000;

    zeroctl_error_setup(argc, argv);
    for (int i = 1; i < argc; i++) { /* checkpoint, export, job, trace: what follows is theirs */
        if (strcmp(argv[i], "checkpoint") == 0 || strcmp(argv[i], "export") == 0) {
            return zctl_finish(zeroctl_checkpoint_main(argc - i, argv + i, json, sock, tmo));
        }
        if (strcmp(argv[i], "job") == 0) {
            return zctl_finish(
                zeroctl_job_main(argc - i, argv + i, json, sock, tmo == 600000 ? 0 : tmo));
        }
        if (strcmp(argv[i], "trace") == 0) {
            return zctl_finish(
                zeroctl_trace_main(argc - i, argv + i, json, sock, tmo == 600000 ? 0 : tmo));
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
        return zctl_finish(rc);
    }
    if (strcmp(o.cmd, "status") == 0) {
        zeroctl_status_opts_t so = {.socket_path = o.socket_path,
                                    .dir = o.dir,
                                    .json = o.json,
                                    .timeout_ms = o.timeout_given ? o.timeout_ms : 0,
                                    .loop_s = o.loop_s};
        return zctl_finish(zeroctl_status_main(&so));
    }
    rc = zeroctl_open(&o, &s);
    if (rc != ZEROCTL_EXIT_OK) {
        return zctl_finish(rc);
    }
    if (strcmp(o.cmd, "config") == 0) {
        rc = zeroctl_config(s, &o);
    } else {
        rc = zeroctl_shard(s, &o);
    }
    zc_session_close(s);
    return zctl_finish(rc);
}
