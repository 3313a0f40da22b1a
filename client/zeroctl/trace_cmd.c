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
 * are asked again up to the newest step they all have, so that every rank shows the same steps.
 * One process per rank, one thread per track (step, buckets, reduce-scatter, norm, adam,
 * all-gather, checkpoint), complete events ("X") in microseconds of Unix time from the earliest
 * span, sorted by time. Exit codes as zeroctl's: 0 ok, 1 a daemon returned an error (or none
 * holds a trace of the job), 2 usage, 7 a daemon unreachable.
 */
#define _GNU_SOURCE
#include "trace_cmd.h"

#include "cli.h"
#include "zerod/zc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACE_HELP          "zeroctl trace --help"
#define TRACE_MAX_DAEMONS   ZCTL_MAX_DAEMONS
#define TRACE_TIMEOUT_MS    10000
#define TRACE_DEFAULT_STEPS 3
#define TRACE_MAX_STEPS     100000
#define TRACE_POLL_MS       200

/* The tracks of one rank (Trace Event "tid"), in display order. */
enum { TR_STEP = 1, TR_BUCKETS, TR_RS, TR_NORM, TR_ADAM, TR_AG, TR_CKPT, TR_COUNT };
static const char *const trace_track_names[TR_COUNT] = {
    "", "step", "buckets", "reduce-scatter", "norm", "adam", "all-gather", "checkpoint"};

/* One daemon: its socket and what its trace said. */
typedef struct trace_daemon {
    char socket[ZCTL_SOCKET_MAX];
    int status; /* of the last call: ZC_OK, or the failure (msg) */
    char msg[512];
    char job_id[128];
    zc_trace_info_t info;
    zc_trace_span_t *spans; /* [info.n_spans] */
    int used;               /* its trace is of the job written */
} trace_daemon_t;

typedef struct trace_opts {
    int json;
    int timeout_ms;
    const char *dir;
    const char *sockets[TRACE_MAX_DAEMONS];
    int n_sockets;
    const char *out; /* "-": stdout */
    const char *job; /* NULL: the first found */
    uint32_t steps;
    double wait_s;
} trace_opts_t;

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

/* ---- the Trace Event JSON ----------------------------------------------------------------- */

/* One event before it is written: its span, and where and when it goes. */
typedef struct trace_ev {
    int64_t ts_ns; /* since the earliest span of the trace (Unix time) */
    uint32_t pid;  /* the rank */
    int tid;       /* TR_* */
    const zc_trace_span_t *s;
} trace_ev_t;

static int trace_track_of(zc_trace_kind_t kind)
{
    switch (kind) {
    case ZC_TRACE_STEP:
        return TR_STEP;
    case ZC_TRACE_BUCKET:
        return TR_BUCKETS;
    case ZC_TRACE_REDUCE_SCATTER:
        return TR_RS;
    case ZC_TRACE_NORM:
    case ZC_TRACE_ALL_REDUCE:
        return TR_NORM;
    case ZC_TRACE_ADAM:
        return TR_ADAM;
    case ZC_TRACE_ALL_GATHER:
        return TR_AG;
    case ZC_TRACE_CHECKPOINT:
        return TR_CKPT;
    }
    return 0; /* a newer daemon's kind: left out */
}

static const char *trace_event_name(zc_trace_kind_t kind)
{
    switch (kind) {
    case ZC_TRACE_BUCKET:
        return "bucket ready";
    case ZC_TRACE_REDUCE_SCATTER:
        return "reduce-scatter";
    case ZC_TRACE_NORM:
        return "norm";
    case ZC_TRACE_ALL_REDUCE:
        return "all-reduce";
    case ZC_TRACE_ADAM:
        return "adam";
    case ZC_TRACE_ALL_GATHER:
        return "all-gather";
    case ZC_TRACE_CHECKPOINT:
        return "checkpoint";
    default:
        return "step";
    }
}

/* Time, then rank and track, then the longer first (a span before the spans inside it). */
static int trace_ev_cmp(const void *pa, const void *pb)
{
    const trace_ev_t *a = pa, *b = pb;

    if (a->ts_ns != b->ts_ns) {
        return a->ts_ns < b->ts_ns ? -1 : 1;
    }
    if (a->pid != b->pid) {
        return a->pid < b->pid ? -1 : 1;
    }
    if (a->tid != b->tid) {
        return a->tid < b->tid ? -1 : 1;
    }
    return a->s->dur_ns > b->s->dur_ns ? -1 : a->s->dur_ns < b->s->dur_ns;
}

/* The events of the daemons used, sorted; *origin_p: the earliest span's Unix time (ns). */
static trace_ev_t *trace_events(const trace_daemon_t *d, int n, size_t *n_p, int64_t *origin_p)
{
    size_t total = 0, k = 0;
    int64_t origin = INT64_MAX;
    trace_ev_t *ev;

    for (int i = 0; i < n; i++) {
        for (uint32_t j = 0; d[i].used && j < d[i].info.n_spans; j++) {
            int64_t t = (int64_t)d[i].spans[j].start_ns + d[i].info.clock_offset_ns;
            origin = t < origin ? t : origin;
            total++;
        }
    }
    ev = calloc(total ? total : 1, sizeof(*ev));
    for (int i = 0; ev != NULL && i < n; i++) {
        for (uint32_t j = 0; d[i].used && j < d[i].info.n_spans; j++) {
            const zc_trace_span_t *s = &d[i].spans[j];
            int tid = trace_track_of(s->kind);
            if (tid != 0) {
                ev[k++] = (trace_ev_t){(int64_t)s->start_ns + d[i].info.clock_offset_ns - origin,
                                       d[i].info.rank, tid, s};
            }
        }
    }
    if (ev != NULL) {
        qsort(ev, k, sizeof(*ev), trace_ev_cmp);
    }
    *n_p = k;
    *origin_p = origin == INT64_MAX ? 0 : origin;
    return ev;
}

static void trace_event_args(cJSON *args, const zc_trace_span_t *s)
{
    cJSON_AddNumberToObject(args, "step", (double)s->step);
    if (s->kind == ZC_TRACE_BUCKET || s->kind == ZC_TRACE_REDUCE_SCATTER ||
        s->kind == ZC_TRACE_ALL_GATHER) {
        cJSON_AddNumberToObject(args, "bucket", s->bucket);
    }
    if (s->kind == ZC_TRACE_REDUCE_SCATTER || s->kind == ZC_TRACE_ALL_GATHER) {
        cJSON_AddNumberToObject(args, "bytes", (double)s->bytes);
    }
    if (s->kind == ZC_TRACE_BUCKET) {
        cJSON_AddNumberToObject(args, "micro_step", s->micro_step);
        cJSON_AddNumberToObject(args, "queued_us", (double)s->dur_ns / 1e3);
    }
    if (s->flags & ZC_TRACE_SPAN_SKIPPED) {
        cJSON_AddTrueToObject(args, "skipped");
    }
    if (s->flags & ZC_TRACE_SPAN_FAILED) {
        cJSON_AddTrueToObject(args, "failed");
    }
    if (s->flags & ZC_TRACE_SPAN_REFRESH) {
        cJSON_AddTrueToObject(args, "outside_a_step");
    }
}

/* A bucket's arrival is an instant on its track ("i"); every other span a complete event. */
static cJSON *trace_event_json(const trace_ev_t *e)
{
    const zc_trace_span_t *s = e->s;
    cJSON *o = cJSON_CreateObject();
    char name[64];

    if (s->kind == ZC_TRACE_STEP) {
        snprintf(name, sizeof(name), "step %" PRIu64 "%s", s->step,
                 (s->flags & ZC_TRACE_SPAN_SKIPPED) ? " (skipped)" : "");
    } else {
        snprintf(name, sizeof(name), "%s", trace_event_name(s->kind));
    }
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "cat", "zerod");
    cJSON_AddStringToObject(o, "ph", s->kind == ZC_TRACE_BUCKET ? "i" : "X");
    if (s->kind == ZC_TRACE_BUCKET) {
        cJSON_AddStringToObject(o, "s", "t");
    }
    cJSON_AddNumberToObject(o, "ts", (double)e->ts_ns / 1e3);
    if (s->kind != ZC_TRACE_BUCKET) {
        cJSON_AddNumberToObject(o, "dur", (double)s->dur_ns / 1e3);
    }
    cJSON_AddNumberToObject(o, "pid", e->pid);
    cJSON_AddNumberToObject(o, "tid", e->tid);
    trace_event_args(cJSON_AddObjectToObject(o, "args"), s);
    return o;
}

/* A metadata event ("M"): NAME of the process pid (tid 0) or of its thread tid. */
static void trace_meta(cJSON *events, const char *name, uint32_t pid, int tid, const char *key,
                       const char *text, double number)
{
    cJSON *o = cJSON_CreateObject(), *args;

    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "ph", "M");
    cJSON_AddNumberToObject(o, "ts", 0);
    cJSON_AddNumberToObject(o, "pid", pid);
    cJSON_AddNumberToObject(o, "tid", tid);
    args = cJSON_AddObjectToObject(o, "args");
    if (text != NULL) {
        cJSON_AddStringToObject(args, key, text);
    } else {
        cJSON_AddNumberToObject(args, key, number);
    }
    cJSON_AddItemToArray(events, o);
}

/* Each rank a process "rank R", each of its tracks that has events a thread. */
static void trace_metadata(cJSON *events, const trace_daemon_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        unsigned tracks = 0;
        char pname[32];
        if (!d[i].used) {
            continue;
        }
        snprintf(pname, sizeof(pname), "rank %u", d[i].info.rank);
        trace_meta(events, "process_name", d[i].info.rank, 0, "name", pname, 0);
        trace_meta(events, "process_sort_index", d[i].info.rank, 0, "sort_index", NULL,
                   d[i].info.rank);
        for (uint32_t j = 0; j < d[i].info.n_spans; j++) {
            tracks |= 1u << trace_track_of(d[i].spans[j].kind);
        }
        for (int t = TR_STEP; t < TR_COUNT; t++) {
            if (tracks & (1u << t)) {
                trace_meta(events, "thread_name", d[i].info.rank, t, "name", trace_track_names[t],
                           0);
                trace_meta(events, "thread_sort_index", d[i].info.rank, t, "sort_index", NULL, t);
            }
        }
    }
}

/* The first daemon used (the job's id and world); NULL when none. */
static const trace_daemon_t *trace_first(const trace_daemon_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (d[i].used) {
            return &d[i];
        }
    }
    return NULL;
}

static void trace_other_data(cJSON *root, const trace_opts_t *o, const trace_daemon_t *d, int n,
                             int64_t origin)
{
    const trace_daemon_t *f = trace_first(d, n);
    cJSON *other = cJSON_AddObjectToObject(root, "otherData");
    char ranks[1024] = "", num[32];
    size_t len = 0;

    for (int i = 0; i < n; i++) {
        if (d[i].used && len + 12 < sizeof(ranks)) {
            len += (size_t)snprintf(ranks + len, sizeof(ranks) - len, "%s%u", len ? "," : "",
                                    d[i].info.rank);
        }
    }
    snprintf(num, sizeof(num), "%" PRId64, origin);
    cJSON_AddStringToObject(other, "job", f->job_id);
    cJSON_AddNumberToObject(other, "world", f->info.world);
    cJSON_AddStringToObject(other, "ranks", ranks);
    cJSON_AddNumberToObject(other, "steps_requested", o->steps);
    cJSON_AddStringToObject(other, "origin_unix_ns", num); /* ts 0; a string: beyond 2^53 */
    cJSON_AddStringToObject(other, "zeroctl", zc_version());
}

/* The whole document, written to o->out; the number of events, or -1 (reported). */
static long trace_write(const trace_opts_t *o, const trace_daemon_t *d, int n)
{
    cJSON *root = cJSON_CreateObject(), *events = cJSON_AddArrayToObject(root, "traceEvents");
    size_t n_ev = 0;
    int64_t origin = 0;
    trace_ev_t *ev = trace_events(d, n, &n_ev, &origin);
    char *text = NULL;
    FILE *out = NULL;
    long rc = -1;

    if (ev != NULL && events != NULL) {
        trace_metadata(events, d, n);
        for (size_t i = 0; i < n_ev; i++) {
            cJSON_AddItemToArray(events, trace_event_json(&ev[i]));
        }
        cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
        trace_other_data(root, o, d, n, origin);
        text = cJSON_PrintUnformatted(root);
    }
    if (text == NULL) {
        zctl_error(ZC_ERR_NO_MEMORY, "trace: out of memory building the trace");
    } else if ((out = strcmp(o->out, "-") == 0 ? stdout : fopen(o->out, "we")) == NULL) {
        zctl_error(ZC_ERR_IO, "trace: cannot write %s: %s", o->out, strerror(errno));
    } else {
        int bad = fputs(text, out) < 0 || fputc('\n', out) == EOF || fflush(out) != 0;
        bad |= out != stdout && fclose(out) != 0;
        if (bad) {
            zctl_error(ZC_ERR_IO, "trace: writing %s failed: %s", o->out, strerror(errno));
        } else {
            rc = (long)n_ev;
        }
    }
    cJSON_free(text);
    cJSON_Delete(root);
    free(ev);
    return rc;
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
    events = trace_write(o, d, n);
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
