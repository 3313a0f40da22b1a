/*
 * `zeroctl trace`'s output (docs/trace.md): the spans the daemons gave (trace_cmd.c) as one
 * Trace Event JSON document, the format Chrome's and Perfetto's trace viewers read. One process
 * per rank, one thread per track (step, buckets, reduce-scatter, norm, adam, all-gather,
 * checkpoint), complete events ("X") in microseconds of Unix time from the earliest span, sorted
 * by time; a bucket's arrival is an instant event ("i").
 */
#define _GNU_SOURCE
#include "trace_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tracks of one rank (Trace Event "tid"), in display order. */
enum { TR_STEP = 1, TR_BUCKETS, TR_RS, TR_NORM, TR_ADAM, TR_AG, TR_CKPT, TR_REPLICA, TR_COUNT };
static const char *const trace_track_names[TR_COUNT] = {
    "", "step", "buckets", "reduce-scatter", "norm", "adam", "all-gather", "checkpoint", "replica"};

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
    case ZC_TRACE_REPLICA:
    case ZC_TRACE_RECOVER_AGREE:
    case ZC_TRACE_RECOVER_SHARD:
        return TR_REPLICA;
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
    case ZC_TRACE_REPLICA:
        return "replica";
    case ZC_TRACE_RECOVER_AGREE:
        return "recovery: agree";
    case ZC_TRACE_RECOVER_SHARD:
        return "recovery: shard from buddy";
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
    if (s->flags & ZC_TRACE_SPAN_BARRIER) {
        cJSON_AddTrueToObject(args, "barrier");
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

long zeroctl_trace_write(const trace_opts_t *o, const trace_daemon_t *d, int n)
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
