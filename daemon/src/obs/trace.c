/*
 * The step trace's ring (obs/trace.h, docs/trace.md). The runner thread adds spans under the ring's
 * mutex; a reader finds the last complete steps and copies their spans under it. The ring's
 * pages are made resident when it is created (MAP_POPULATE), so that the daemon's memory does
 * not grow as the ring fills (tests/integration/leak_check.sh holds RSS to two pages).
 */
#define _GNU_SOURCE
#include "obs/trace.h"

#include "zs/log.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct zd_trace {
    pthread_mutex_t lock;
    uint32_t capacity;
    /* under lock */
    uint64_t count; /* spans added since zd_trace_begin; ring[count % capacity] is the next */
    char job_id[ZD_TRACE_JOB_MAX];
    uint32_t rank, world;
    zd_trace_span_t *ring; /* [capacity], mmap'd */
};

static size_t zd_trace_ring_bytes(uint32_t capacity)
{
    return (size_t)capacity * sizeof(zd_trace_span_t);
}

zs_status_t zd_trace_create(uint32_t capacity, zd_trace_t **trace_p)
{
    zd_trace_t *t;

    if (capacity == 0) {
        *trace_p = NULL;
        return ZS_OK;
    }
    if (capacity > ZD_TRACE_MAX_SPANS) { /* trace_buffer's range keeps it below */
        return ZS_ERR_INVALID;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    t->ring = mmap(NULL, zd_trace_ring_bytes(capacity), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (t->ring == MAP_FAILED) {
        zs_error(ZS_SUB_ENGINE, "mmap of the step trace's %zu bytes: %m",
                 zd_trace_ring_bytes(capacity));
        free(t);
        return ZS_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->capacity = capacity;
    *trace_p = t;
    return ZS_OK;
}

void zd_trace_destroy(zd_trace_t *t)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_destroy(&t->lock);
    munmap(t->ring, zd_trace_ring_bytes(t->capacity));
    free(t);
}

void zd_trace_begin(zd_trace_t *t, const char *job_id, uint32_t rank, uint32_t world)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->count = 0;
    snprintf(t->job_id, sizeof(t->job_id), "%s", job_id != NULL ? job_id : "");
    t->rank = rank;
    t->world = world;
    pthread_mutex_unlock(&t->lock);
}

void zd_trace_add(zd_trace_t *t, const zd_trace_span_t *span)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->lock);
    t->ring[t->count % t->capacity] = *span;
    t->count++;
    pthread_mutex_unlock(&t->lock);
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Span p of the n retained, oldest first (under lock). */
static const zd_trace_span_t *zd_trace_at(const zd_trace_t *t, uint64_t n, uint64_t p)
{
    return &t->ring[(t->count - n + p) % t->capacity];
}

/* Where the last complete steps lie among the n retained spans. */
typedef struct zd_trace_window {
    uint32_t steps;  /* complete steps taken */
    uint64_t lo, hi; /* their step numbers */
    uint64_t from;   /* the first position of the oldest step taken */
    uint64_t end;    /* the STEP span of the newest step taken */
} zd_trace_window_t;

/* Newest to oldest over the STEP spans (up to last_step): a step is taken when its STEP span is
 * seen first (the attempts of one step -- skipped, failed, committed -- are one step), and the
 * STEP span of the step before the oldest taken bounds it. Running off the oldest span, that
 * step is whole only when nothing was overwritten yet; else it is dropped. */
static void zd_trace_window(const zd_trace_t *t, uint64_t n, uint32_t want, uint64_t last_step,
                            zd_trace_window_t *w)
{
    uint64_t closing = 0, newer_lo = 0;

    memset(w, 0, sizeof(*w));
    for (uint64_t i = n; i-- > 0;) {
        const zd_trace_span_t *s = zd_trace_at(t, n, i);

        if (s->kind != ZD_TRACE_STEP || (last_step != 0 && s->step > last_step) ||
            (w->steps > 0 && s->step == w->lo)) {
            continue;
        }
        if (w->steps == want) {
            w->from = i + 1; /* after the STEP span of the step before */
            return;
        }
        if (w->steps == 0) {
            w->end = i;
            w->hi = s->step;
        }
        newer_lo = w->lo;
        w->lo = s->step;
        closing = i;
        w->steps++;
    }
    if (t->count > n && w->steps > 0) { /* the oldest step's first spans may be overwritten */
        w->steps--;
        w->lo = newer_lo;
        w->from = closing + 1; /* after its newest STEP span */
    }
}

/* Copy the window's spans into out->spans (room for n): every span from its first position to
 * the newest step's STEP span, and after that those of the newest step or older. */
static void zd_trace_copy(const zd_trace_t *t, uint64_t n, const zd_trace_window_t *w,
                          zd_trace_out_t *out)
{
    out->n_spans = 0;
    if (w->steps == 0) {
        return;
    }
    for (uint64_t i = w->from; i < n; i++) {
        const zd_trace_span_t *s = zd_trace_at(t, n, i);
        if (i <= w->end || s->step <= w->hi) {
            out->spans[out->n_spans++] = *s;
        }
    }
}

zs_status_t zd_trace_read(zd_trace_t *t, uint32_t steps, uint64_t last_step, zd_trace_out_t *out)
{
    zd_trace_window_t w;
    uint64_t n;

    memset(out, 0, sizeof(*out));
    if (t == NULL) {
        return ZS_OK;
    }
    out->spans = malloc((size_t)t->capacity * sizeof(*out->spans));
    if (out->spans == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&t->lock);
    n = t->count < t->capacity ? t->count : t->capacity;
    zd_trace_window(t, n, steps != 0 ? steps : 1, last_step, &w);
    zd_trace_copy(t, n, &w, out);
    memcpy(out->job_id, t->job_id, sizeof(out->job_id));
    out->rank = t->rank;
    out->world = t->world;
    out->recorded = t->count;
    pthread_mutex_unlock(&t->lock);
    out->capacity = t->capacity;
    out->steps = w.steps;
    out->first_step = w.steps > 0 ? w.lo : 0;
    out->last_step = w.steps > 0 ? w.hi : 0;
    return ZS_OK;
}

void zd_trace_out_free(zd_trace_out_t *out)
{
    if (out != NULL) {
        free(out->spans);
        out->spans = NULL;
        out->n_spans = 0;
    }
}
