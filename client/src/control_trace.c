/*
 * The daemon's step trace (zerod/zc_control.h "the step trace", docs/trace.md; `zeroctl
 * trace`). The session keeps the reply (zc_session_keep), so that the job id handed out stays
 * valid and the spans can be read by index until the next trace call.
 */
#include "zc_int.h"

#include <stdio.h>

#define ZC_TRACE_INFO_FIELDS (ZC_TRACE_INFO_FIELD_JOB | ZC_TRACE_INFO_FIELD_STEPS)

/* ipc.proto TraceKind carries zc_trace_kind_t's values */
_Static_assert(ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_STEP == (int)ZC_TRACE_STEP &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_BUCKET == (int)ZC_TRACE_BUCKET &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_REDUCE_SCATTER ==
                       (int)ZC_TRACE_REDUCE_SCATTER &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_NORM == (int)ZC_TRACE_NORM &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ALL_REDUCE == (int)ZC_TRACE_ALL_REDUCE &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ADAM == (int)ZC_TRACE_ADAM &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_ALL_GATHER == (int)ZC_TRACE_ALL_GATHER &&
                   ZEROD__IPC__V1__TRACE_KIND__TRACE_KIND_CHECKPOINT == (int)ZC_TRACE_CHECKPOINT,
               "ipc.proto TraceKind and zc_trace_kind_t differ");

static void zc_trace_fill(const Zerod__Ipc__V1__TraceReply *r, zc_trace_info_t *info)
{
    uint64_t want = info->field_mask & ZC_TRACE_INFO_FIELDS;

    if (want & ZC_TRACE_INFO_FIELD_JOB) {
        info->job_id = r->job_id != NULL ? r->job_id : "";
        info->rank = r->rank;
        info->world = r->world;
    }
    if (want & ZC_TRACE_INFO_FIELD_STEPS) {
        info->steps = r->steps;
        info->first_step = r->first_step;
        info->last_step = r->last_step;
        info->n_spans = (uint32_t)r->n_spans;
        info->clock_offset_ns = r->clock_offset_ns;
        info->capacity = r->capacity;
        info->recorded = r->recorded;
    }
    info->field_mask = want;
}

ZC_API int zc_session_trace(zc_session_t *session, const zc_trace_params_t *params,
                            zc_trace_info_t *info_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__TraceRequest tr = ZEROD__IPC__V1__TRACE_REQUEST__INIT;
    uint64_t mask = params != NULL ? params->field_mask : 0;
    zc_frame_t *reply = NULL;
    int status;

    zc_error_clear();
    if (session == NULL || info_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "trace: %s is NULL", session == NULL ? "session" : "info_p");
    }
    tr.steps = (mask & ZC_TRACE_FIELD_STEPS) ? params->steps : 1;
    tr.last_step = (mask & ZC_TRACE_FIELD_LAST_STEP) ? params->last_step : 0;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_TRACE;
    req.trace = &tr;
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_TRACE_REPLY,
                             (mask & ZC_TRACE_FIELD_TIMEOUT_MS) ? params->timeout_ms : -1, "trace",
                             &reply);
    if (status != ZC_OK) {
        return status;
    }
    zc_session_keep(session, ZC_KEPT_TRACE, reply);
    zc_trace_fill(reply->trace_reply, info_p);
    return ZC_OK;
}

ZC_API int zc_session_trace_span(zc_session_t *session, uint32_t i, zc_trace_span_t *span_p)
{
    const Zerod__Ipc__V1__TraceSpan *s;
    const zc_frame_t *kept;

    if (session == NULL || span_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "trace span: %s is NULL",
                       session == NULL ? "session" : "span_p");
    }
    kept = zc_session_kept(session, ZC_KEPT_TRACE);
    if (kept == NULL) {
        return zc_fail(ZC_ERR_STATE, "trace span: no zc_session_trace() yet");
    }
    if (i >= kept->trace_reply->n_spans) {
        return zc_fail(ZC_ERR_INVALID, "trace span: span %u is not below %zu", i,
                       kept->trace_reply->n_spans);
    }
    s = kept->trace_reply->spans[i];
    if (span_p->field_mask & ZC_TRACE_SPAN_FIELD_ALL) {
        span_p->kind = (zc_trace_kind_t)s->kind;
        span_p->start_ns = s->start_ns;
        span_p->dur_ns = s->dur_ns;
        span_p->step = s->step;
        span_p->bucket = s->bucket;
        span_p->bytes = s->bytes;
        span_p->micro_step = s->micro_step;
        span_p->flags = s->flags;
    }
    span_p->field_mask &= ZC_TRACE_SPAN_FIELD_ALL;
    return ZC_OK;
}
