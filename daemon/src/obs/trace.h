/*
 * The step trace (docs/trace.md, `zeroctl trace`): a fixed ring of spans -- a bucket's arrival,
 * each collective, the norm, Adam, the all-gather, a checkpoint save, the step itself -- that
 * the runner thread records always (trace_buffer spans; 0 turns it off), and that a
 * TraceRequest reads on the loop thread (rpc/rpc_trace.c). One mutex guards the ring: the writer
 * holds it for one span's copy, a reader for one pass over the ring, so neither waits long on
 * the other. The ring holds the job this daemon last attached, from its attach on: a new job
 * empties it, a re-attach of the same job keeps it.
 *
 * A span belongs to an optimizer step: the one in progress (the job's step + 1) while the
 * daemon builds it, the step just committed for its all-gather and the checkpoint after it. A
 * step is complete once its STEP span is recorded; a reader asks for the last N complete steps.
 */
#ifndef ZD_TRACE_H
#define ZD_TRACE_H

#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

/* The kinds of span; their values go on the wire (ipc.proto TraceKind) and never change. */
typedef enum zd_trace_kind {
    ZD_TRACE_STEP = 1,           /* a Step request: the whole pipeline */
    ZD_TRACE_BUCKET = 2,         /* a BucketReady arrived; dur: its wait for the runner */
    ZD_TRACE_REDUCE_SCATTER = 3, /* one bucket into the accumulator */
    ZD_TRACE_NORM = 4,           /* overflow check, global sum of squares, loss scaler */
    ZD_TRACE_ALL_REDUCE = 5,     /* the norm's all-reduce of two scalars (inside NORM) */
    ZD_TRACE_ADAM = 6,           /* Adam on the shard and the cast into the params region */
    ZD_TRACE_ALL_GATHER = 7,     /* one bucket's new slices into every params region */
    ZD_TRACE_CHECKPOINT = 8,     /* a checkpoint save (async: until the copy is staged) */
    ZD_TRACE_REPLICA = 9,        /* the gradient (and at times the shard) to the buddy */
    ZD_TRACE_RECOVER_AGREE = 10, /* a mesh formed: the ranks' replica states gathered */
    ZD_TRACE_RECOVER_SHARD = 11, /* a fresh rank's shard from its buddy's replica */
} zd_trace_kind_t;

#define ZD_TRACE_KIND_MAX 11

/* Span flags (ipc.proto TraceSpan.flags). */
enum {
    ZD_TRACE_SKIPPED = 1u << 0, /* STEP: skipped on overflow */
    ZD_TRACE_FAILED = 1u << 1,  /* the operation failed (a lost peer, a kernel error) */
    ZD_TRACE_REFRESH = 1u << 2, /* ALL_GATHER outside a step: parameters loaded, a mesh re-formed */
    ZD_TRACE_BARRIER = 1u << 3, /* ALL_GATHER of a shared params region: a barrier, no bytes */
};

/* The largest ring trace_buffer allows: a TraceReply of it stays far below the frame limit. */
#define ZD_TRACE_MAX_SPANS (128u * 1024u)
#define ZD_TRACE_JOB_MAX   128

typedef struct zd_trace_span {
    uint64_t start_ns; /* CLOCK_MONOTONIC */
    uint64_t dur_ns;
    uint64_t step;       /* the optimizer step it belongs to */
    uint64_t bytes;      /* collectives: world x slice x element size */
    uint32_t bucket;     /* BUCKET, REDUCE_SCATTER, ALL_GATHER */
    uint32_t micro_step; /* BUCKET */
    uint16_t kind;       /* zd_trace_kind_t */
    uint16_t flags;      /* ZD_TRACE_* */
} zd_trace_span_t;

typedef struct zd_trace zd_trace_t;

/* capacity 0: *trace_p is NULL (tracing off; every call below takes NULL as a no-op).
 * ZS_ERR_INVALID above ZD_TRACE_MAX_SPANS; ZS_ERR_NO_MEMORY (logged) when the ring cannot be
 * mapped. */
zs_status_t zd_trace_create(uint32_t capacity, zd_trace_t **trace_p);
/* After every writer and reader stopped. NULL is a no-op. */
void zd_trace_destroy(zd_trace_t *trace);

/* ---- the writer: the runner thread ------------------------------------------------------- */

/* A new job: the ring empties and is this job's. */
void zd_trace_begin(zd_trace_t *trace, const char *job_id, uint32_t rank, uint32_t world);
void zd_trace_add(zd_trace_t *trace, const zd_trace_span_t *span);

/* A span of kind from start_ns to end_ns. */
static inline void zd_trace_span(zd_trace_t *trace, zd_trace_kind_t kind, uint64_t step,
                                 uint64_t start_ns, uint64_t end_ns, uint16_t flags)
{
    zd_trace_span_t s = {.start_ns = start_ns,
                         .dur_ns = end_ns > start_ns ? end_ns - start_ns : 0,
                         .step = step,
                         .kind = (uint16_t)kind,
                         .flags = flags};

    if (trace != NULL) {
        zd_trace_add(trace, &s);
    }
}

/* ---- the reader: any thread -------------------------------------------------------------- */

typedef struct zd_trace_out {
    char job_id[ZD_TRACE_JOB_MAX]; /* "" when the daemon never held a job */
    uint32_t rank, world;
    uint32_t steps;                 /* complete steps in spans: fewer than asked when the ring
                                       holds fewer */
    uint64_t first_step, last_step; /* 0 when steps is 0 */
    zd_trace_span_t *spans;         /* in recording order; malloc'd, zd_trace_out_free */
    size_t n_spans;
    uint32_t capacity;
    uint64_t recorded; /* spans recorded since the job began; beyond capacity, overwritten */
} zd_trace_out_t;

/* The spans of the last `steps` complete steps (0: 1) up to last_step (0: the newest), and
 * after them what belongs to the newest of them (its checkpoint). ZS_ERR_NO_MEMORY only. */
zs_status_t zd_trace_read(zd_trace_t *trace, uint32_t steps, uint64_t last_step,
                          zd_trace_out_t *out);
void zd_trace_out_free(zd_trace_out_t *out);

#endif
