/*
 * The step trace on the wire (ipc.proto TraceRequest; `zeroctl trace`, docs/trace.md): answered
 * at once on the loop from the trace's ring (obs/trace.c), like Status, whatever the runner is busy
 * with. Part of rpc.
 */
#include "obs/trace.h"
#include "rpc/rpc_int.h"

#include <stdlib.h>
#include <time.h>

_Static_assert(ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_STEP == (int)ZD_TRACE_STEP &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_BUCKET == (int)ZD_TRACE_BUCKET &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_REDUCE_SCATTER ==
                       (int)ZD_TRACE_REDUCE_SCATTER &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_NORM == (int)ZD_TRACE_NORM &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ALL_REDUCE == (int)ZD_TRACE_ALL_REDUCE &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ADAM == (int)ZD_TRACE_ADAM &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ALL_GATHER == (int)ZD_TRACE_ALL_GATHER &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_CHECKPOINT == (int)ZD_TRACE_CHECKPOINT,
               "ipc.proto TraceKind and zd_trace_kind_t differ");

/* CLOCK_REALTIME - CLOCK_MONOTONIC now: a span's start plus this is Unix time, so that the
 * spans of daemons on different hosts line up (as well as their clocks agree). */
static int64_t zd_rpc_clock_offset_ns(void)
{
    struct timespec mono, real;

    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    return ((int64_t)real.tv_sec - (int64_t)mono.tv_sec) * 1000000000 +
           ((int64_t)real.tv_nsec - (int64_t)mono.tv_nsec);
}

static zd_reply_t *zd_rpc_trace_pack(uint64_t seq, Zerod__Ipc__V1__TraceReply *tr)
{
    Zerod__Ipc__V1__Frame out = ZEROD__IPC__V1__FRAME__INIT;

    out.seq = seq;
    out.body_case = ZEROD__IPC__V1__FRAME__BODY_TRACE_REPLY;
    out.trace_reply = tr;
    return zd_rpc_pack(&out);
}

/* A refusal: tracing is off, or no memory for the copy. */
static zd_reply_t *zd_rpc_trace_error(uint64_t seq, zs_status_t st, const char *msg)
{
    Zerod__Ipc__V1__TraceReply tr = ZEROD__IPC__V1__TRACE_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(st, msg);

    tr.result = &r;
    return zd_rpc_trace_pack(seq, &tr);
}

/* The spans of o as messages (spans[i] pointing into msgs); false when out of memory. */
static bool zd_rpc_trace_spans(const zd_trace_out_t *o, Zerod__Ipc__V1__TraceSpan **msgs_p,
                               Zerod__Ipc__V1__TraceSpan ***spans_p)
{
    Zerod__Ipc__V1__TraceSpan *msgs = calloc(o->n_spans ? o->n_spans : 1, sizeof(*msgs));
    Zerod__Ipc__V1__TraceSpan **spans = calloc(o->n_spans ? o->n_spans : 1, sizeof(*spans));

    if (msgs == NULL || spans == NULL) {
        free(msgs);
        free(spans);
        return false;
    }
    for (size_t i = 0; i < o->n_spans; i++) {
        const zd_trace_span_t *s = &o->spans[i];
        zerod__ipc__v1__trace_span__init(&msgs[i]);
        msgs[i].kind = (Zerod__Ipc__V1__TraceKind)s->kind;
        msgs[i].start_ns = s->start_ns;
        msgs[i].dur_ns = s->dur_ns;
        msgs[i].step = s->step;
        msgs[i].bucket = s->bucket;
        msgs[i].bytes = s->bytes;
        msgs[i].micro_step = s->micro_step;
        msgs[i].flags = s->flags;
        spans[i] = &msgs[i];
    }
    *msgs_p = msgs;
    *spans_p = spans;
    return true;
}

zd_reply_t *zd_rpc_trace(const zd_rpc_t *rpc, const zd_frame_t *f)
{
    Zerod__Ipc__V1__TraceReply tr = ZEROD__IPC__V1__TRACE_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(ZS_OK, NULL);
    Zerod__Ipc__V1__TraceSpan *msgs = NULL, **spans = NULL;
    zd_trace_out_t o;
    zd_reply_t *reply;

    if (rpc->trace == NULL) {
        return zd_rpc_trace_error(f->seq, ZS_ERR_UNSUPPORTED,
                                  "this daemon records no trace (its trace_buffer is 0)");
    }
    if (zd_trace_read(rpc->trace, f->trace->steps, f->trace->last_step, &o) != ZS_OK ||
        !zd_rpc_trace_spans(&o, &msgs, &spans)) {
        zd_trace_out_free(&o);
        return zd_rpc_trace_error(f->seq, ZS_ERR_NO_MEMORY, "out of memory copying the trace");
    }
    tr.result = &r;
    tr.job_id = o.job_id;
    tr.rank = o.rank;
    tr.world = o.world;
    tr.clock_offset_ns = zd_rpc_clock_offset_ns();
    tr.steps = o.steps;
    tr.first_step = o.first_step;
    tr.last_step = o.last_step;
    tr.n_spans = o.n_spans;
    tr.spans = spans;
    tr.capacity = o.capacity;
    tr.recorded = o.recorded;
    reply = zd_rpc_trace_pack(f->seq, &tr);
    free(spans);
    free(msgs);
    zd_trace_out_free(&o);
    return reply;
}
