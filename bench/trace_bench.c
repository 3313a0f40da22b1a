/*
 * trace_bench: what the always-on step trace (daemon/src/obs/trace.c, docs/trace.md) costs the
 * engine thread: nanoseconds per recorded span (one zd_trace_add: the ring's mutex and a
 * 48-byte copy), alone and with a reader asking for the last steps (a `zeroctl trace`) in a
 * loop beside it, and what one TraceRequest's read of a full ring takes. Reported: the median
 * of 9 runs of N spans each. docs/trace.md multiplies ns/span by the spans of a step.
 *
 *   trace_bench [--spans N] [--capacity C]
 */
#define _GNU_SOURCE
#include "bench_util.h"
#include "obs/trace.h"

#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define TB_RUNS     9u
#define TB_PER_STEP 16u /* spans per step of the synthetic steps recorded */

typedef struct tb_reader {
    zd_trace_t *t;
    atomic_bool stop;
    unsigned long reads;
} tb_reader_t;

static void *tb_read_loop(void *arg)
{
    tb_reader_t *r = arg;

    while (!atomic_load(&r->stop)) {
        zd_trace_out_t o;
        if (zd_trace_read(r->t, 3, 0, &o) == ZS_OK) {
            r->reads++;
        }
        zd_trace_out_free(&o);
    }
    return NULL;
}

/* ns per span of `spans` zd_trace_add calls (steps of TB_PER_STEP spans). */
static double tb_record(zd_trace_t *t, unsigned long spans)
{
    double t0 = zs_time_now_s();

    for (unsigned long i = 0; i < spans; i++) {
        zd_trace_span_t s = {.start_ns = i,
                             .dur_ns = 1,
                             .step = i / TB_PER_STEP,
                             .bucket = (uint32_t)(i % TB_PER_STEP),
                             .bytes = 1u << 20,
                             .kind = (uint16_t)(i % TB_PER_STEP == TB_PER_STEP - 1
                                                    ? ZD_TRACE_STEP
                                                    : ZD_TRACE_REDUCE_SCATTER)};
        zd_trace_add(t, &s);
    }
    return (zs_time_now_s() - t0) * 1e9 / (double)spans;
}

static double tb_median_record(zd_trace_t *t, unsigned long spans, int with_reader,
                               unsigned long *reads_p)
{
    double v[TB_RUNS];
    tb_reader_t r = {.t = t};
    pthread_t th;

    atomic_init(&r.stop, false);
    if (with_reader && pthread_create(&th, NULL, tb_read_loop, &r) != 0) {
        fprintf(stderr, "trace_bench: cannot start the reader thread\n");
        return -1;
    }
    for (unsigned i = 0; i < TB_RUNS; i++) {
        v[i] = tb_record(t, spans);
    }
    if (with_reader) {
        atomic_store(&r.stop, true);
        pthread_join(th, NULL);
        *reads_p = r.reads;
    }
    return zb_median(v, TB_RUNS);
}

/* ns of one zs_time_now_ns() (CLOCK_MONOTONIC through the vDSO): a span takes one or two that
 * the metrics did not take already. */
static double tb_clock_ns(unsigned long n)
{
    volatile uint64_t sink = 0;
    double t0 = zs_time_now_s();

    for (unsigned long i = 0; i < n; i++) {
        sink += zs_time_now_ns();
    }
    (void)sink;
    return (zs_time_now_s() - t0) * 1e9 / (double)n;
}

/* µs of one read of the last 3 steps and of every step of a full ring. */
static void tb_read_cost(zd_trace_t *t, double *us3_p, double *us_all_p)
{
    double v3[TB_RUNS], vall[TB_RUNS];

    for (unsigned i = 0; i < TB_RUNS; i++) {
        zd_trace_out_t o;
        double t0 = zs_time_now_s();
        (void)zd_trace_read(t, 3, 0, &o);
        v3[i] = (zs_time_now_s() - t0) * 1e6;
        zd_trace_out_free(&o);
        t0 = zs_time_now_s();
        (void)zd_trace_read(t, 1000000, 0, &o);
        vall[i] = (zs_time_now_s() - t0) * 1e6;
        zd_trace_out_free(&o);
    }
    *us3_p = zb_median(v3, TB_RUNS);
    *us_all_p = zb_median(vall, TB_RUNS);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {{"spans", required_argument, NULL, 'n'},
                                       {"capacity", required_argument, NULL, 'c'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    unsigned long spans = 2000000, capacity = 8192, reads = 0;
    double alone, contended, us3, us_all, clock_ns;
    zd_trace_t *t = NULL;
    int c;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        if (c == 'n' || c == 'c') {
            unsigned long v = strtoul(optarg, NULL, 10);
            *(c == 'n' ? &spans : &capacity) = v;
        } else if (c == 'h') {
            printf("Usage: trace_bench [--spans N] [--capacity C]\n");
            return 0;
        } else {
            return zb_usage_error("trace_bench");
        }
    }
    if (spans == 0 || capacity == 0 || capacity > ZD_TRACE_MAX_SPANS ||
        zd_trace_create((uint32_t)capacity, &t) != ZS_OK) {
        fprintf(stderr, "trace_bench: --spans >= 1 and --capacity in 1..%u\n", ZD_TRACE_MAX_SPANS);
        return 2;
    }
    zd_trace_begin(t, "bench", 0, 1);
    alone = tb_median_record(t, spans, 0, NULL);
    contended = tb_median_record(t, spans, 1, &reads);
    tb_read_cost(t, &us3, &us_all);
    clock_ns = tb_clock_ns(spans);
    printf("trace_bench: ring of %lu spans (%zu bytes each), %lu spans a run, median of %u\n",
           capacity, sizeof(zd_trace_span_t), spans, TB_RUNS);
    printf("  record, alone:                      %7.1f ns/span\n", alone);
    printf("  record, a reader reading beside it: %7.1f ns/span (%lu reads)\n", contended, reads);
    printf("  zs_time_now_ns():                   %7.1f ns\n", clock_ns);
    printf("  read of the last 3 steps:           %7.1f us\n", us3);
    printf("  read of the whole ring:             %7.1f us\n", us_all);
    zd_trace_destroy(t);
    return 0;
}
