/*
 * zeroctl trace: the spans of a job's last steps on every daemon asked, as one Chrome / Perfetto
 * trace (the Trace Event JSON format; docs/trace.md).
 *
 *   zeroctl [--json] trace [--steps N] [-o FILE] [--job JOB] [--wait SECONDS]
 *                          [-s SOCKET]... [--dir DIR] [-t MS]
 *
 * The daemons asked: every -s SOCKET (also one given before `trace`), else every socket in DIR
 * (default: the directory of $ZEROD_SOCKET, else /run/zerod). Those whose trace is of JOB (else
 * of the first job found) are kept; each gives its last N complete steps, then the ones ahead
 * are asked again up to the newest step they all have, so that every rank shows the same steps;
 * trace_json.c writes the document. Exit codes as zeroctl's: 0 ok, 1 a daemon returned an error
 * (or none holds a trace of the job), 2 usage, 7 a daemon unreachable.
 */
#define _GNU_SOURCE
#include "trace_cmd.h"
#include "trace_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACE_HELP          "zeroctl trace --help"
#define TRACE_TIMEOUT_MS    10000
#define TRACE_DEFAULT_STEPS 3
#define TRACE_MAX_STEPS     100000
#define TRACE_POLL_MS       200

static void trace_usage(FILE *out)
{
    fprintf(out,
            "Usage: zeroctl [--json] trace [--steps N] [-o FILE] [--job JOB] [--wait SECONDS]\n"
            "                              [-s SOCKET]... [--dir DIR] [-t MS]\n"
            "A Chrome / Perfetto trace (Trace Event JSON) of a job's last steps on every daemon\n"
            "asked: per rank the bucket arrivals, each collective, norm, Adam, all-gather and\n"
            "checkpoints on their own tracks. Open it in https://ui.perfetto.dev or\n"
            "chrome://tracing.\n"
            "\n"
            "  -n, --steps N       the last N complete steps (default %d); fewer when a daemon's\n"
            "                      trace_buffer holds fewer (said on stderr)\n"
            "  -o, --output FILE   where the trace goes (default trace.json; - for stdout)\n"
            "  --job JOB           the job to trace (default: the first job a daemon names)\n"
            "  --wait SECONDS      ask again until every rank has N steps, for at most SECONDS\n"
            "  -s, --socket PATH   a daemon to ask (repeat for several)\n"
            "  --dir DIR           ask every daemon socket in DIR (default: the directory of\n"
            "                      $ZEROD_SOCKET, else /run/zerod), when no -s is given\n"
            "  -t, --timeout MS    deadline of each daemon's answer (default 10000)\n"
            "  -h, --help          print this help and exit\n"
            "\n"
            "Exit status: 0 ok, 1 a daemon returned an error (or none holds a trace of the job),\n"
            "2 usage error, 7 a daemon unreachable.\n",
            TRACE_DEFAULT_STEPS);
}

/* ---- which daemons ------------------------------------------------------------------------ */

static int trace_targets(const trace_opts_t *o, trace_daemon_t *d, int *n_p)
{
    char(*sockets)[ZCTL_SOCKET_MAX] = NULL;
    char buf[4096];
    const char *dir = o->dir != NULL ? o->dir : zctl_default_dir(1, buf, sizeof(buf));
    int n = 0;

    *n_p = 0;
    for (int i = 0; i < o->n_sockets; i++) {
        snprintf(d[(*n_p)++].socket, sizeof(d->socket), "%s", o->sockets[i]);
    }
    if (o->n_sockets > 0 && o->dir == NULL) {
        return ZCTL_EXIT_OK;
    }
    sockets = calloc(TRACE_MAX_DAEMONS, ZCTL_SOCKET_MAX);
    n = sockets != NULL ? zctl_scan_dir(dir, sockets, TRACE_MAX_DAEMONS - *n_p) : -1;
    if (n < 0) {
        zctl_error(ZC_ERR_UNREACHABLE, "trace: cannot read the socket directory %s: %s", dir,
                   sockets != NULL ? strerror(errno) : "out of memory");
        free(sockets);
        return ZCTL_EXIT_UNREACHABLE;
    }
    for (int i = 0; i < n; i++) {
        memcpy(d[(*n_p)++].socket, sockets[i], ZCTL_SOCKET_MAX);
    }
    free(sockets);
    if (*n_p == 0) {
        zctl_error(ZC_ERR_UNREACHABLE,
                   "trace: no daemon socket in %s (give -s SOCKET or --dir DIR)", dir);
        return ZCTL_EXIT_UNREACHABLE;
    }
    return ZCTL_EXIT_OK;
}

/* ---- asking ------------------------------------------------------------------------------- */

/* d's trace of the last `steps` steps up to last_step (0: its newest), into d. */
static void trace_ask(trace_daemon_t *d, const trace_opts_t *o, uint64_t last_step)
{
    zc_open_params_t op = {.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS |
                                         ZC_OPEN_FIELD_CONTROL,
                           .socket_path = d->socket,
                           .timeout_ms = o->timeout_ms,
                           .control = 1};
    zc_trace_params_t tp = {.field_mask = ZC_TRACE_FIELD_STEPS | ZC_TRACE_FIELD_LAST_STEP,
                            .steps = o->steps,
                            .last_step = last_step};
    zc_session_t *s = NULL;

    free(d->spans);
    d->spans = NULL;
    memset(&d->info, 0, sizeof(d->info));
    d->info.field_mask = ZC_TRACE_INFO_FIELD_JOB | ZC_TRACE_INFO_FIELD_STEPS;
    d->status = zc_session_open(&op, &s);
    if (d->status == ZC_OK) {
        d->status = zc_session_trace(s, &tp, &d->info);
    }
    if (d->status == ZC_OK && d->info.n_spans > 0) {
        d->spans = calloc(d->info.n_spans, sizeof(*d->spans));
        d->status = d->spans != NULL ? ZC_OK : ZC_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; d->status == ZC_OK && i < d->info.n_spans; i++) {
        d->spans[i].field_mask = ZC_TRACE_SPAN_FIELD_ALL;
        d->status = zc_session_trace_span(s, i, &d->spans[i]);
    }
    if (d->status != ZC_OK) {
        snprintf(d->msg, sizeof(d->msg), "%s",
                 zc_last_error()[0] != '\0' ? zc_last_error() : "out of memory");
        d->info.n_spans = 0;
    } else {
        snprintf(d->job_id, sizeof(d->job_id), "%s", d->info.job_id); /* outlives the session */
    }
    zc_session_close(s);
}

/* Mark the daemons whose trace is of the job (o->job, else the first named); their count. */
static int trace_pick(const trace_opts_t *o, trace_daemon_t *d, int n)
{
    const char *job = o->job;
    int used = 0;

    for (int i = 0; i < n; i++) {
        int dup = 0;
        d[i].used = 0;
        if (d[i].status != ZC_OK || d[i].job_id[0] == '\0' ||
            strcmp(d[i].job_id, job != NULL ? job : d[i].job_id) != 0) {
            continue;
        }
        job = d[i].job_id;
        for (int k = 0; k < i; k++) {
            dup |= d[k].used && d[k].info.rank == d[i].info.rank;
        }
        if (dup) {
            fprintf(stderr, "zeroctl: trace: %s holds rank %u of job '%s' too; left out\n",
                    d[i].socket, d[i].info.rank, job);
            continue;
        }
        d[i].used = 1;
        used++;
    }
    return used;
}

/* Every rank the same steps: those ahead of the slowest are asked again up to its newest. */
static void trace_align(const trace_opts_t *o, trace_daemon_t *d, int n)
{
    uint64_t hi = UINT64_MAX;

    for (int i = 0; i < n; i++) {
        if (d[i].used && d[i].info.steps > 0 && d[i].info.last_step < hi) {
            hi = d[i].info.last_step;
        }
    }
    for (int i = 0; i < n && hi != UINT64_MAX; i++) {
        if (d[i].used && d[i].info.last_step > hi) {
            trace_ask(&d[i], o, hi);
            d[i].used = d[i].status == ZC_OK;
        }
    }
}

static int trace_complete(const trace_opts_t *o, const trace_daemon_t *d, int n)
{
    int used = 0;

    for (int i = 0; i < n; i++) {
        if (d[i].used && d[i].info.steps < o->steps) {
            return 0;
        }
        used += d[i].used != 0;
    }
    return used > 0;
}

static uint64_t trace_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Ask every daemon, pick the job's, align their steps; with --wait, again until every rank
 * has the steps asked or the deadline passes. Returns how many daemons are of the job. */
static int trace_collect(const trace_opts_t *o, trace_daemon_t *d, int n)
{
    uint64_t deadline = trace_now_ms() + (uint64_t)(o->wait_s * 1000.0);
    int used;

    for (;;) {
        for (int i = 0; i < n; i++) {
            trace_ask(&d[i], o, 0);
        }
        used = trace_pick(o, d, n);
        trace_align(o, d, n);
        if (o->wait_s <= 0 || trace_complete(o, d, n) || trace_now_ms() >= deadline) {
            return used;
        }
        nanosleep(&(struct timespec){0, TRACE_POLL_MS * 1000000L}, NULL);
    }
}

/* ---- what it says ------------------------------------------------------------------------- */

/* On stderr: failed daemons, ranks with fewer steps than asked, ranks not asked. */
static void trace_warn(const trace_opts_t *o, const trace_daemon_t *d, int n)
{
    const trace_daemon_t *f = trace_first(d, n);

    for (int i = 0; i < n; i++) {
        if (d[i].status != ZC_OK) {
            zctl_error(d[i].status, "%s: %s", d[i].socket, d[i].msg);
        } else if (d[i].used && d[i].info.steps < o->steps) {
            fprintf(stderr, "zeroctl: trace: rank %u (%s): %u of the %u steps asked: %s\n",
                    d[i].info.rank, d[i].socket, d[i].info.steps, o->steps,
                    d[i].info.recorded > d[i].info.capacity
                        ? "its trace_buffer holds no more (a larger one keeps more)"
                        : "no more are complete (--wait SECONDS waits for them)");
        }
    }
    for (uint32_t r = 0; f != NULL && r < f->info.world; r++) {
        int found = 0;
        for (int i = 0; i < n; i++) {
            found |= d[i].used && d[i].info.rank == r;
        }
        if (!found) {
            fprintf(stderr,
                    "zeroctl: trace: rank %u of job '%s' (world %u) is not among the "
                    "daemons asked (another host?)\n",
                    r, f->job_id, f->info.world);
        }
    }
}

static void trace_summary_table(FILE *out, const trace_opts_t *o, const trace_daemon_t *d, int n,
                                long events)
{
    const trace_daemon_t *f = trace_first(d, n);

    fprintf(out, "%-6s %6s %10s %10s %8s %10s  %s\n", "RANK", "STEPS", "FIRST", "LAST", "SPANS",
            "RECORDED", "SOCKET");
    for (int i = 0; i < n; i++) {
        if (d[i].used) {
            fprintf(out, "%-6u %6u %10" PRIu64 " %10" PRIu64 " %8u %10" PRIu64 "  %s\n",
                    d[i].info.rank, d[i].info.steps, d[i].info.first_step, d[i].info.last_step,
                    d[i].info.n_spans, d[i].info.recorded, d[i].socket);
        }
    }
    fprintf(out,
            "%s: job '%s' (world %u), %ld events; open it in https://ui.perfetto.dev or "
            "chrome://tracing\n",
            strcmp(o->out, "-") == 0 ? "stdout" : o->out, f->job_id, f->info.world, events);
}

/* --json: the summary as the command's JSON answer (not with -o -: stdout is the trace). */
static int trace_summary_json(const trace_opts_t *o, const trace_daemon_t *d, int n, long events)
{
    const trace_daemon_t *f = trace_first(d, n);
    cJSON *root = zctl_json_root("trace"), *ranks;

    cJSON_AddStringToObject(root, "output", o->out);
    cJSON_AddStringToObject(root, "job", f->job_id);
    cJSON_AddNumberToObject(root, "world", f->info.world);
    cJSON_AddNumberToObject(root, "steps_requested", o->steps);
    cJSON_AddNumberToObject(root, "events", (double)events);
    ranks = cJSON_AddArrayToObject(root, "ranks");
    for (int i = 0; i < n; i++) {
        cJSON *r;
        if (!d[i].used) {
            continue;
        }
        r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "rank", d[i].info.rank);
        cJSON_AddStringToObject(r, "socket", d[i].socket);
        cJSON_AddNumberToObject(r, "steps", d[i].info.steps);
        cJSON_AddNumberToObject(r, "first_step", (double)d[i].info.first_step);
        cJSON_AddNumberToObject(r, "last_step", (double)d[i].info.last_step);
        cJSON_AddNumberToObject(r, "spans", d[i].info.n_spans);
        cJSON_AddNumberToObject(r, "recorded", (double)d[i].info.recorded);
        cJSON_AddNumberToObject(r, "capacity", d[i].info.capacity);
        cJSON_AddItemToArray(ranks, r);
    }
    return zctl_print_json(root, 0);
}

/* The exit status of the calls made: 7 when a daemon was unreachable, 1 when one failed. */
static int trace_exit_of(const trace_daemon_t *d, int n)
{
    int rc = ZCTL_EXIT_OK;

    for (int i = 0; i < n && rc != ZCTL_EXIT_UNREACHABLE; i++) {
        int r = zctl_exit_of(d[i].status);
        rc = r > rc ? r : rc;
    }
    return rc;
}

static int trace_run(const trace_opts_t *o, trace_daemon_t *d, int n)
{
    int to_stdout = strcmp(o->out, "-") == 0;
    int rc, used = trace_collect(o, d, n);
    long events;

    trace_warn(o, d, n);
    rc = trace_exit_of(d, n);
    if (used == 0 && rc == ZCTL_EXIT_OK) { /* else the daemons' errors said why */
        zctl_error(ZC_ERR_NOT_FOUND, "trace: none of the %d daemon%s asked holds a trace of %s%s%s",
                   n, n == 1 ? "" : "s", o->job ? "job '" : "a job", o->job ? o->job : "",
                   o->job ? "'" : "");
        return ZCTL_EXIT_DAEMON;
    }
    if (used == 0) {
        return rc;
    }
    events = zeroctl_trace_write(o, d, n);
    if (events < 0) {
        return ZCTL_EXIT_DAEMON;
    }
    if (o->json && !to_stdout) {
        return trace_summary_json(o, d, n, events) != ZCTL_EXIT_OK ? ZCTL_EXIT_DAEMON : rc;
    }
    trace_summary_table(to_stdout ? stderr : stdout, o, d, n, events);
    return rc;
}

/* ---- command line -------------------------------------------------------------------------- */

/* A number in lo..hi from arg (--name); -1 when it is not one (reported). */
static int trace_number(const char *name, const char *arg, double lo, double hi, double *v_p)
{
    char *end = NULL;
    double v = strtod(arg, &end);

    if (end == arg || *end != '\0' || !(v >= lo && v <= hi)) {
        zctl_usage_error(TRACE_HELP, "trace: --%s '%s' is not a number in %g..%g", name, arg, lo,
                         hi);
        return -1;
    }
    *v_p = v;
    return 0;
}

/* One option c of `trace` with its argument into o; ZCTL_EXIT_USAGE when the value is wrong
 * (reported), else -1. */
static int trace_option(int c, const char *arg, trace_opts_t *o)
{
    double v = 0;

    switch (c) {
    case 'n':
        if (trace_number("steps", arg, 1, TRACE_MAX_STEPS, &v) != 0) {
            return ZCTL_EXIT_USAGE;
        }
        o->steps = (uint32_t)v;
        break;
    case 'w':
        return trace_number("wait", arg, 0, 3600, &o->wait_s) != 0 ? ZCTL_EXIT_USAGE : -1;
    case 't':
        if (trace_number("timeout", arg, 1, 3600000, &v) != 0) {
            return ZCTL_EXIT_USAGE;
        }
        o->timeout_ms = (int)v;
        break;
    case 's':
        if (o->n_sockets == TRACE_MAX_DAEMONS) {
            return zctl_usage_error(TRACE_HELP, "trace: more than %d -s", TRACE_MAX_DAEMONS);
        }
        o->sockets[o->n_sockets++] = arg;
        break;
    case 'o':
        o->out = arg;
        break;
    case 'J':
        o->job = arg;
        break;
    case 'd':
        o->dir = arg;
        break;
    default: /* 'j' */
        o->json = 1;
        break;
    }
    return -1;
}

/* Options after `trace`: into o; -1 to go on, else the exit status. */
static int trace_parse(int argc, char **argv, trace_opts_t *o)
{
    static const struct option longopts[] = {
        {"steps", required_argument, NULL, 'n'},   {"output", required_argument, NULL, 'o'},
        {"job", required_argument, NULL, 'J'},     {"wait", required_argument, NULL, 'w'},
        {"socket", required_argument, NULL, 's'},  {"dir", required_argument, NULL, 'd'},
        {"timeout", required_argument, NULL, 't'}, {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    int c, rc = -1;

    optind = 1;
    opterr = 0; /* zctl_getopt_error says it */
    while (rc < 0 && (c = getopt_long(argc, argv, ":n:o:s:t:jh", longopts, NULL)) != -1) {
        if (c == 'h') {
            trace_usage(stdout);
            return ZCTL_EXIT_OK;
        }
        rc = c == '?' || c == ':' ? zctl_getopt_error(c, argv, TRACE_HELP)
                                  : trace_option(c, optarg, o);
    }
    if (rc < 0 && optind < argc) {
        rc = zctl_usage_error(TRACE_HELP, "trace: unexpected argument '%s'", argv[optind]);
    }
    return rc;
}

int zeroctl_trace_main(int argc, char **argv, int json, const char *socket_path, int timeout_ms)
{
    trace_opts_t o = {.json = json,
                      .timeout_ms = timeout_ms > 0 ? timeout_ms : TRACE_TIMEOUT_MS,
                      .out = "trace.json",
                      .steps = TRACE_DEFAULT_STEPS};
    trace_daemon_t *d;
    int rc, n = 0;

    zctl_set_command("trace");
    zctl_set_json(json);
    if (socket_path != NULL) {
        o.sockets[o.n_sockets++] = socket_path;
    }
    rc = trace_parse(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    d = calloc(TRACE_MAX_DAEMONS, sizeof(*d));
    if (d == NULL) {
        zctl_error(ZC_ERR_NO_MEMORY, "out of memory");
        return ZCTL_EXIT_DAEMON;
    }
    rc = trace_targets(&o, d, &n);
    if (rc == ZCTL_EXIT_OK) {
        rc = trace_run(&o, d, n);
    }
    for (int i = 0; i < n; i++) {
        free(d[i].spans);
    }
    free(d);
    return rc;
}
