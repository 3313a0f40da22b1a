/*
 * How the kernels stream through memory for calls beyond the caches: regular or non-temporal
 * stores, and how far ahead a software prefetch runs on each read stream. The answers differ
 * from CPU to CPU (non-temporal stores save the read-for-ownership of each written line on
 * one machine and cost several times the time on another; a kernel with many instructions per
 * cache line leaves the hardware prefetcher behind on some), so they are measured, once per
 * process and variant, by the kernels themselves: each family (in-place Adam, in-place
 * accumulate, out-of-place reduce/cast, the read-only sum of squares) runs on scratch buffers
 * of twice the last-level cache (between 32 and 256 MiB of footprint), first with each kind of
 * store, then with the stores chosen and each prefetch distance.
 *
 * The rule (plan_rule.c) takes the machine's noise as the timings show it: two options are
 * timed in alternated rounds, one sample per round, and an option wins only where its best
 * beats the other's best by more than the spread of either side's samples (the best's distance
 * from their median, at least 1 %) and its median beats the other's median too. On a noisy
 * machine the margin grows and a tie stays a tie; on a steady one a 2 % gain is taken. A tie
 * between the stores at the size measured, with a margin above the least, is timed again in
 * longer rounds; one that remains goes to the hardware's lean: non-temporal stores for the
 * families that store into lines they do not read (they save the read for ownership, 25-40 %
 * of the traffic), regular ones for the rest. A tie at a smaller size is not a loss: going
 * down, only a loss stops non-temporal stores chosen at the size measured; a tie keeps them
 * from 32 MiB on, where either kind streams past the caches, and from 4 MiB on for the
 * families that write apart. A fixed 3 % margin once cost a process's AVX-512 reduce a quarter of
 * its speed for its whole life: a tie at 64 MiB (22.5 against 22.7 GB/s) stopped its non-temporal
 * stores there. Prefetch distances keep a fixed 3 % leaning to prefetching (zk_plan_prefetch), but
 * next to the non-temporal stores of the families that write apart, where a distance must win.
 * ZEROD_KERNEL_STORES=regular|nt|auto overrides the stores for the process (and turns prefetch
 * off); zk_exec_t.stores and .prefetch one call (the tests cover every path so). No choice ever
 * changes a result: all write the same bits.
 */
#include "zk_int.h"
#include "zs/thread.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ZK_MIB            ((size_t)1 << 20)
#define ZK_PLAN_MIN_BYTES ZK_STORES_PLAN_MIN_BYTES
#define ZK_PLAN_MAX_BYTES (256 * ZK_MIB)
#define ZK_PLAN_REPS      3
#define ZK_PLAN_ROUNDS    5    /* of the alternated kinds and distances (zk_plan_prefetch) */
#define ZK_PLAN_MARGIN    1.03 /* a prefetch distance's margin (the stores': zk_plan_decide) */

static zk_store_plan_t zk_plans[ZK_VARIANT_COUNT];
static int zk_plan_done[ZK_VARIANT_COUNT]; /* under zk_plan_lock */
static pthread_mutex_t zk_plan_lock = PTHREAD_MUTEX_INITIALIZER;
/* zk_store_plan_start: 1 while a background measurement of the default variant's plan runs
 * (calls meanwhile take regular stores and no prefetch instead of waiting for it) */
static atomic_int zk_plan_bg;

static const char *const zk_family_names[ZK_STORE_FAMILIES] = {
    "adam", "accumulate", "reduce", "cast", "widen", "copy", "sumsq"};

const char *zk_store_family_name(zk_store_family_t f)
{
    return (unsigned)f < ZK_STORE_FAMILIES ? zk_family_names[f] : "?";
}

/* A cache's size in bytes: sysconf's figure where it gives one, else sysfs index `idx` of
 * cpu0, else `dflt`. */
static size_t zk_cache_bytes(long sc, int idx, size_t dflt)
{
    char path[64];
    long s = sc;
    FILE *f;

    if (s > 0) {
        return (size_t)s;
    }
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
    f = fopen(path, "r");
    if (f != NULL) {
        char unit = 'K';
        if (fscanf(f, "%ld%c", &s, &unit) >= 1 && s > 0) {
            s *= unit == 'M' ? 1 << 20 : 1 << 10;
        }
        fclose(f);
    }
    return s > 0 ? (size_t)s : dflt;
}

/* The L1 data cache in bytes, or 32 KiB when nothing says. */
size_t zk_l1d_bytes(void)
{
    long s = -1;

#ifdef _SC_LEVEL1_DCACHE_SIZE
    s = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    return zk_cache_bytes(s, 0, 32 << 10);
}

/* The last-level cache in bytes (sysconf, then sysfs), or 32 MiB when neither says. */
size_t zk_llc_bytes(void)
{
    long s = -1;

#ifdef _SC_LEVEL3_CACHE_SIZE
    s = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (s <= 0) {
        s = sysconf(_SC_LEVEL2_CACHE_SIZE);
    }
#endif
    return zk_cache_bytes(s, 3, 32 * ZK_MIB);
}

static double zk_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct zk_scratch {
    float *s[5];
    double *part; /* sum of squares: one per super-block */
    size_t n;
} zk_scratch_t;

/* One call of a family's kernel over the scratch buffers. */
static void zk_plan_call(const zk_ops_t *ops, zk_store_family_t fam, zk_scratch_t *b, zk_st_t st)
{
    static const zk_adam_k_t k = {.grad_scale = 1.0f,
                                  .beta1 = 0.9f,
                                  .one_minus_beta1 = 0.1f,
                                  .beta2 = 0.999f,
                                  .one_minus_beta2 = 0.001f,
                                  .eps = 1e-8f,
                                  .inv_sqrt_bc2 = 1.0f,
                                  .neg_step_size = -1e-6f,
                                  .neg_lr_wd = 0.0f,
                                  .keep_acc = 1}; /* as the daemon runs it */

    switch (fam) {
    case ZK_STORE_ADAM:
        ops->adam(&k, b->s[0], b->s[1], b->s[2], b->s[3], b->s[4], ZS_DTYPE_BF16, b->n, st);
        break;
    case ZK_STORE_ACCUMULATE:
        ops->accumulate(b->s[0], b->s[1], ZS_DTYPE_F32, 1.0f, b->n, st);
        break;
    case ZK_STORE_READ: /* four buffers: one would fit in a large last-level cache */
        for (int i = 0; i < 4; i++) {
            ops->sumsq(b->s[i], b->n, b->part, st);
        }
        break;
    case ZK_STORE_CAST: /* the daemon's casts: fp32 params to bf16 ... */
        ops->cast(b->s[4], ZS_DTYPE_BF16, b->s[0], ZS_DTYPE_F32, b->n, st);
        break;
    case ZK_STORE_WIDEN: /* ... and bf16 gradients to fp32 */
        ops->cast(b->s[2], ZS_DTYPE_F32, b->s[4], ZS_DTYPE_BF16, b->n, st);
        break;
    case ZK_STORE_COPY: /* the all-gather's copy of a peer's fp32 slice, twice */
        ops->copy(b->s[1], b->s[0], b->n * sizeof(float), st);
        ops->copy(b->s[3], b->s[2], b->n * sizeof(float), st);
        break;
    default:
        ops->reduce(b->s[2], b->s[0], b->s[1], ZS_DTYPE_F32, b->n, st);
        break;
    }
}

/* Bytes one element of a family's measured call reads and writes. */
static double zk_plan_bytes(zk_store_family_t fam)
{
    switch (fam) {
    case ZK_STORE_ADAM:
        return 30.0; /* 16 read, 12 + 2 written */
    case ZK_STORE_READ:
        return 16.0; /* four buffers read */
    case ZK_STORE_CAST:
    case ZK_STORE_WIDEN:
        return 6.0;
    case ZK_STORE_COPY:
        return 16.0; /* two copies */
    default:
        return 12.0; /* accumulate, reduce: 8 read, 4 written */
    }
}

/* Bytes in MiB for the plan's line (1.5 for ZK_NT_MIN_BYTES). */
static double zk_mib(size_t bytes)
{
    return (double)bytes / (double)(1u << 20);
}

/* Best GB/s of `reps` calls after a warm-up (reps 0: one call, no warm-up). */
static double zk_plan_time_n(const zk_ops_t *ops, zk_store_family_t fam, zk_scratch_t *b,
                             zk_st_t st, int reps)
{
    double best = INFINITY;

    for (int r = 0; r <= reps; r++) {
        double t0 = zk_seconds(), dt;
        zk_plan_call(ops, fam, b, st);
        dt = zk_seconds() - t0;
        if ((r > 0 || reps == 0) && dt < best) {
            best = dt;
        }
    }
    return zk_plan_bytes(fam) * (double)b->n / best / 1e9;
}

static int zk_plan_env(zk_store_plan_t *plan, const char *env)
{
    int nt = strcasecmp(env, "nt") == 0;

    if (!nt && strcasecmp(env, "regular") != 0) {
        return 0;
    }
    for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
        plan->nt[f] = nt && f != ZK_STORE_READ;
        plan->nt_from[f] = plan->nt[f] ? 0 : SIZE_MAX; /* nt_to, pf_from: zk_plan_run */
    }
    plan->nt_min_bytes = nt ? 0 : SIZE_MAX;
    snprintf(plan->how, sizeof(plan->how),
             "%s stores and no prefetch for every call (ZEROD_KERNEL_STORES=%s)",
             nt ? "non-temporal" : "regular", env);
    return 1;
}

static void zk_plan_printf(zk_store_plan_t *plan, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void zk_plan_printf(zk_store_plan_t *plan, const char *fmt, ...)
{
    size_t len = strlen(plan->how);
    va_list ap;

    if (len + 1 < sizeof(plan->how)) {
        va_start(ap, fmt);
        vsnprintf(plan->how + len, sizeof(plan->how) - len, fmt, ap);
        va_end(ap);
    }
}

static zk_plan_verdict_t zk_plan_pair(zk_store_plan_t *plan, const zk_ops_t *ops,
                                      zk_store_family_t f, zk_scratch_t *b, size_t bytes,
                                      const zk_st_t st[2], double g[2]);

/* Elements of the plan's scratch for a plan measured at `bytes`: Adam's footprint, 4 fp32
 * streams and a bf16 one. */
static size_t zk_plan_scratch_n(size_t bytes)
{
    return bytes / 18 / 64 * 64;
}

size_t zk_plan_pf_measured(zk_store_family_t f, size_t plan_bytes)
{
    size_t own = (size_t)(zk_plan_bytes(f) * (double)zk_plan_scratch_n(plan_bytes));

    return own <= plan_bytes / 2 ? own : plan_bytes;
}

/* Where no prefetch won at the size measured, none against each distance the family may take
 * again at half that size, each pair alternated: of the distances the pair says win
 * (zk_plan_decide), the fastest is kept, for calls nearer that size than the one measured (on
 * a log scale: below the measured size over the square root of 2). A tie keeps none: the band
 * reaches down to the last-level cache, where a prefetch that gains nothing at half the plan's
 * size can cost a third (the AVX-512 accumulate: 2048 ahead tied at 128 MiB, 32.8 against
 * 32.5 GB/s, and its calls of 4 Mi elements, 48 MiB, then ran at 0.65 of the limit; pinned,
 * 0.63-0.72 with it and 0.97-1.13 without, in the same hour). Between the last-level cache and
 * the size measured a prefetch can still gain: with AVX2 on the AMD EPYC VM none won the
 * accumulate at 256 MiB (72.1 against 69.4 GB/s), and its calls at 16 Mi elements (160 MiB)
 * ran at 0.87 of the limit, where 2048 ahead gave 0.99. Each distance is tried, not only the
 * one fastest at 256 MiB: they differ there by noise, and 1024 lost at 64 MiB where 2048 won.
 * The band matters: the reduce's non-temporal stores gained from 2048 ahead at 64 MiB (88.6
 * against 75.4 GB/s) and lost with it at 192 and 768 MiB (0.84-0.89 of the limit, 0.94-1.0
 * without). The size measured is the family's own footprint on the scratch where that is at
 * most half the plan's (6 bytes an element for the cast and the widen: 85 MiB of a 256 MiB
 * scratch sized for Adam, so that half the plan's size was more than the scratch held and the
 * retry timed nothing); the others keep the plan's size, whose band the accumulate's calls at
 * 160 MiB needed. */
static void zk_plan_pf_again(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                             zk_scratch_t *b, int kind)
{
    double best = 0, g[2];
    size_t measured = zk_plan_pf_measured(f, plan->nt_min_bytes);
    int won = 0;

    for (int i = 1; i < ZK_PREFETCH_CHOICES && zk_prefetch_choice(i) <= plan->pf_max[f]; i++) {
        const zk_st_t st[2] = {{kind, 0}, {kind, zk_prefetch_choice(i)}};

        if (zk_plan_pair(plan, ops, f, b, measured / 2, st, g) == ZK_PLAN_WINS && g[1] > best) {
            best = g[1];
            won = i;
        }
    }
    if (best > 0) {
        plan->prefetch[f][kind] = zk_prefetch_choice(won);
        plan->pf_to[f][kind] = zk_plan_pf_band(measured);
        zk_plan_printf(plan, " -> %u below %zu MiB,", zk_prefetch_choice(won),
                       plan->pf_to[f][kind] >> 20);
    }
}

/* A distance chosen without winning (none within ZK_PLAN_MARGIN of the fastest distance, one
 * call a round) timed again against none, each a sample of consecutive calls after a warm-up as
 * the daemon makes them (zk_plan_pair): the distance is kept only where it wins there
 * (zk_plan_decide), none on a tie, as in zk_plan_pf_again. One call a round over the whole scratch
 * does not show what consecutive calls do: on the AMD EPYC VM the accumulate's none and 1024 ahead
 * tied at 256 MiB (32.6 against 31.1 GB/s; AVX2 27.0 against 26.8), the plan took 1024, and
 * zk_bench's calls of 4 to 64 Mi elements then ran at 0.73-0.87 of the limit with it and at
 * 0.97-1.15 without it (forced either way, both instruction sets, in the same hour); 2048 ahead ran
 * at 0.63-0.93. */
static void zk_plan_pf_confirm(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                               zk_scratch_t *b, int kind)
{
    const zk_st_t st[2] = {{kind, 0}, {kind, plan->prefetch[f][kind]}};
    double g[2];

    if (zk_plan_pair(plan, ops, f, b, (size_t)(zk_plan_bytes(f) * (double)b->n), st, g) !=
        ZK_PLAN_WINS) {
        plan->prefetch[f][kind] = 0;
        zk_plan_printf(plan, " -> 0,");
    }
}

/* The best prefetch distance of a family with each of its `kinds` of stores (1 or 2), timed
 * on the whole scratch (a quarter of it, 64 MiB, was tried: on a VM that reports a 300 MiB L3
 * it ran twice as fast as the whole and hid the prefetch's gain, so Adam ran without one at
 * 0.72 of the limit), every kind and distance alternated over ZK_PLAN_ROUNDS rounds of one call
 * each (beyond the caches a call needs no warm-up), so that a drift of the machine moves them
 * all alike (timed one kind after the other over three rounds, the AVX-512 sum of squares on
 * an AMD EPYC VM chose two super-blocks at once in two processes out of five, where one at a
 * time reads 10 % faster; the VM's speed moves by more than that). The fastest distance up to
 * zk_plan_pf_max's is kept, or the longest one up to it that the timings cannot tell from the
 * fastest (zk_plan_decide): the distances of the AVX-512 accumulate tied at 256 MiB, and at
 * 40 MiB, beyond a 32 MiB L3 but partly in it, 512 and 1024 ran at 0.76 of the limit, 2048 and
 * none at 1.0 (AVX2: 0.83, 0.92 and 1.21 for 512, 1024 and 2048, 1.24 without). Here none is
 * kept only where it is 3 % faster than the fastest distance, and a distance that did not win
 * by that much is then timed against none as consecutive calls (zk_plan_pf_confirm): a prefetch
 * costs a few instructions per cache line where it does not help, and where it does (Adam,
 * accumulate, the sum of squares) it gains 20-30 %, a gain this machine's noise can hide in one
 * measurement (a margin the other way threw it away in one run out of three; with none chosen on a
 * tie, the AVX-512 accumulate, timed while another process streamed, ran at 0.84 of the limit).
 * Next to the non-temporal stores of a family that writes apart (zk_plan_writes_apart) the lean is
 * the other way, a distance must win (zk_plan_decide): the AVX-512 reduce took 2048 ahead on a tie
 * (44.5 against 42.3 GB/s) and ran at 0.49-0.89 of the limit at 16 and 64 Mi elements on the AMD
 * EPYC VM, where without it it ran at 1.0 or more in the same hour. */
static void zk_plan_prefetch(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                             zk_scratch_t *b, int kinds,
                             double rounds[2][ZK_PREFETCH_CHOICES][ZK_PLAN_ROUNDS])
{
    for (int k = 0; k < kinds; k++) {
        for (int i = 0; i < ZK_PREFETCH_CHOICES; i++) {
            plan->pf_gbps[f][k][i] = 0;
        }
    }
    for (int r = 0; r < ZK_PLAN_ROUNDS; r++) {
        for (int k = 0; k < kinds; k++) {
            for (int i = 0; i < ZK_PREFETCH_CHOICES; i++) {
                double *g = &plan->pf_gbps[f][k][i];
                rounds[k][i][r] = zk_plan_time_n(ops, f, b, (zk_st_t){k, zk_prefetch_choice(i)}, 0);
                *g = fmax(*g, rounds[k][i][r]);
            }
        }
    }
    for (int k = 0; k < kinds; k++) {
        const double *g = plan->pf_gbps[f][k];
        double margin;
        int best = 1, top, fastest;

        for (int i = 2; i < ZK_PREFETCH_CHOICES && zk_prefetch_choice(i) <= plan->pf_max[f]; i++) {
            best = g[i] > g[best] ? i : best;
        }
        /* the longest distance the timings cannot tell from the fastest */
        for (top = best;
             top + 1 < ZK_PREFETCH_CHOICES && zk_prefetch_choice(top + 1) <= plan->pf_max[f];
             top++) {
        }
        for (; top > best; top--) {
            if (zk_plan_decide(rounds[k][best], rounds[k][top], ZK_PLAN_ROUNDS, &margin) !=
                ZK_PLAN_LOSES) {
                break;
            }
        }
        fastest = best;
        best = g[0] > ZK_PLAN_MARGIN * g[best] ? 0 : top;
        if (k == 1 && zk_plan_writes_apart(f) && best != 0 &&
            zk_plan_decide(rounds[1][0], rounds[1][best], ZK_PLAN_ROUNDS, &margin) !=
                ZK_PLAN_WINS) {
            best = 0;
        }
        plan->prefetch[f][k] = zk_prefetch_choice(best);
        zk_plan_printf(
            plan, " %s prefetch none %.1f, %.1f/%.1f/%.1f -> %u%s,", k == 0 ? "regular" : "nt",
            g[0], g[1], g[2], g[3], zk_prefetch_choice(best),
            plan->pf_max[f] < zk_prefetch_choice(ZK_PREFETCH_CHOICES - 1) ? " (L1 caps it)" : "");
        if (best != 0 && !(g[fastest] > ZK_PLAN_MARGIN * g[0])) {
            zk_plan_pf_confirm(plan, ops, f, b, k);
        }
        if (plan->prefetch[f][k] == 0) {
            zk_plan_pf_again(plan, ops, f, b, k);
        }
    }
}

/* GB/s of a family at `bytes` of footprint with stores x and y (g[], the best of each), timed
 * alternately (ZK_PAIR_ROUNDS rounds of `reps` calls, a sample per round), so that a
 * drift of the machine moves both alike; what zk_plan_decide says of y against x. A tie whose
 * best figures are further apart than ZK_PLAN_MARGIN_MIN gets as many rounds again, once: the
 * spread of more samples is the machine's, less often a moment's. Printed as
 * " at N MiB x/y," (with the margin, "(+-N%)", where it was more than the least). */
#define ZK_PAIR_ROUNDS 8
static zk_plan_verdict_t zk_plan_pair(zk_store_plan_t *plan, const zk_ops_t *ops,
                                      zk_store_family_t f, zk_scratch_t *b, size_t bytes,
                                      const zk_st_t st[2], double g[2])
{
    double s[2][2 * ZK_PAIR_ROUNDS], margin = 0;
    size_t n = b->n;
    int r = 0, want = ZK_PAIR_ROUNDS;
    /* a sample of at least ZK_PLAN_REPS calls of ZK_PLAN_MIN_BYTES: calls of a few MiB take
     * tens of microseconds, and the best of three of them moved by a third from round to round
     * on the AMD EPYC VM (the reduce's 21 % gain at 4 MiB was a tie so) */
    int reps = ZK_PLAN_REPS * (bytes < ZK_PLAN_MIN_BYTES ? (int)(ZK_PLAN_MIN_BYTES / bytes) : 1);
    zk_plan_verdict_t v = ZK_PLAN_TIES;

    b->n = (size_t)((double)bytes / zk_plan_bytes(f)) / 64 * 64;
    g[0] = g[1] = 0;
    while (r < want && b->n <= n) {
        for (; r < want; r++) {
            s[0][r] = zk_plan_time_n(ops, f, b, st[0], reps);
            s[1][r] = zk_plan_time_n(ops, f, b, st[1], reps);
            g[0] = fmax(g[0], s[0][r]);
            g[1] = fmax(g[1], s[1][r]);
        }
        v = zk_plan_decide(s[0], s[1], r, &margin);
        if (v == ZK_PLAN_TIES && want == ZK_PAIR_ROUNDS &&
            fabs(g[1] - g[0]) > ZK_PLAN_MARGIN_MIN * fmin(g[0], g[1])) {
            want = 2 * ZK_PAIR_ROUNDS;
        }
    }
    b->n = n;
    if (r > 0 && margin > ZK_PLAN_MARGIN_MIN) {
        zk_plan_printf(plan, " at %g MiB %.1f/%.1f (+-%.0f%%),", zk_mib(bytes), g[0], g[1],
                       100 * margin);
    } else {
        zk_plan_printf(plan, " at %g MiB %.1f/%.1f,", zk_mib(bytes), g[0], g[1]);
    }
    return v;
}

/* Where non-temporal stores won at the size measured, whether they hold at smaller sizes the
 * plan serves too (64, 32, 16, 4 and 2 MiB, then ZK_NT_MIN_BYTES: caches that large may keep
 * regular stores ahead there), down to the first size where they lose: the smallest footprint
 * from which the family uses them. A size takes them on a win, and from 32 MiB on on a tie too,
 * from 4 MiB on for a family that writes apart (zk_plan_nt_extends); a tie below that takes
 * them only where a smaller size wins. Timed on the AMD EPYC VM, shared with builds, the
 * AVX-512 cast to bf16 tied at 16 MiB (88.8 against 108.0 GB/s, +-27 %) and lost at 2 or 4
 * MiB in two processes out of two, and its calls of 24 MiB took regular stores at 0.68 of the
 * limit, where non-temporal ones ran at 1.0 the hour before. A tie
 * that stopped the walk cost the AVX-512 reduce on the Xeon VM a quarter of its speed for a
 * process's life: 22.5 against 22.7 GB/s at 64 MiB, short of the 3 % margin of the time, so
 * its calls of 64-256 MiB (16 Mi elements) took regular stores, at 0.733 of the limit where
 * non-temporal ones ran at 0.972 in the next process. The first size is for a VM that reports
 * a last-level cache bigger than it has: the plan is then measured at 256 MiB, and on an AMD
 * EPYC VM with 32 MiB the sum of squares read one super-block at a time faster at 256 MiB, two
 * at once faster at 32 MiB, so its calls at 64 MiB took two (0.87-1.02 of the limit in six
 * zk_bench runs, one block 1.01-1.20). The 16 MiB size is for calls in the last-level cache's
 * upper half: the AVX2 cast to bf16 of 4 Mi elements (24 MiB) ran with regular stores at 0.80
 * of the limit in two runs, its stores having tied at 4 MiB. The last, ZK_NT_MIN_BYTES, is
 * for data beyond the L2 but in the last-level cache: on the AMD EPYC VM (1 MiB of L2 a core)
 * the fp32 reduce of 256 Ki elements (3 MiB) ran at 0.81 of the limit with regular stores and
 * at 1.0 with non-temporal ones, which the limit took; the AVX-512 cast to bf16 of 256 Ki
 * elements (1.5 MiB) ran at 0.87-0.90 with regular stores (117-122 GB/s) and at 1.0 (136)
 * with non-temporal ones, a floor of 2 MiB keeping it from them. 2 MiB stays a size of its
 * own: on a CPU whose L2 holds 2 MiB the walk stops there. */
static size_t zk_plan_nt_from(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                              zk_scratch_t *b)
{
    static const size_t sizes[] = {2 * ZK_PLAN_MIN_BYTES,     ZK_PLAN_MIN_BYTES,
                                   ZK_PLAN_MIN_BYTES / 2,     ZK_PREFETCH_MIN_BYTES,
                                   ZK_PREFETCH_MIN_BYTES / 2, ZK_NT_MIN_BYTES};
    /* each kind with its own distance, as it was chosen and as its calls run (none below
     * ZK_PREFETCH_MIN_BYTES) */
    const zk_st_t st[2] = {{0, plan->prefetch[f][0]}, {1, plan->prefetch[f][1]}};
    const zk_st_t st0[2] = {{0, 0}, {1, 0}};
    size_t from = plan->nt_min_bytes;
    double g[2];

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        const zk_st_t *sti = sizes[i] < ZK_PREFETCH_MIN_BYTES ? st0 : st;
        zk_plan_verdict_t v;

        if (sizes[i] >= plan->nt_min_bytes) {
            continue;
        }
        v = zk_plan_pair(plan, ops, f, b, sizes[i], sti, g);
        if (v == ZK_PLAN_LOSES) {
            break;
        }
        from = zk_plan_nt_extends(v, sizes[i], zk_plan_writes_apart(f)) ? sizes[i] : from;
    }
    return from;
}

/* The smallest footprint from which a family prefetches with regular stores: where a distance
 * won beyond the caches, from ZK_PREFETCH_MIN_BYTES (the data may sit in the last-level cache
 * there) unless it loses to none at that size (zk_plan_decide); then from half
 * ZK_PLAN_MIN_BYTES unless it loses there too; else from ZK_PLAN_MIN_BYTES. The rule leans to
 * prefetching: the distance has already won where it was measured, and at these sizes the two
 * differ by less than this machine's noise more often than not. The middle size is for Adam
 * on the AMD EPYC VM: prefetching lost at 4 MiB (80 against 147 GB/s), so its calls at 1 Mi
 * elements (30 MiB, at the edge of the 32 MiB L3) ran without one at 0.74 of the limit, where
 * 512 elements ahead gave 0.82-0.89. */
static size_t zk_plan_pf_from(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                              zk_scratch_t *b)
{
    static const size_t sizes[2] = {ZK_PREFETCH_MIN_BYTES, ZK_PLAN_MIN_BYTES / 2};
    const zk_st_t st[2] = {{0, 0}, {0, plan->prefetch[f][0]}};
    double g[2];

    if (st[1].pf == 0) {
        return SIZE_MAX;
    }
    for (int i = 0; i < 2; i++) {
        if (zk_plan_pair(plan, ops, f, b, sizes[i], st, g) != ZK_PLAN_LOSES) {
            return sizes[i];
        }
    }
    return ZK_PLAN_MIN_BYTES;
}

/* Where non-temporal stores lost beyond the caches, whether they win in the band the plan
 * serves below ZK_STORES_PLAN_MIN_BYTES: data that large may still sit in a big last-level
 * cache, where streaming past it can be the faster way (fp32 to bf16 on AVX2 on this
 * project's Xeon VM: 28.6 against 24.4 GB/s at 4 MiB, a tie at 256 MiB). Timed against the
 * regular stores as that band would take them, prefetch included; non-temporal stores there
 * go without one, as measured. */
static void zk_plan_nt_mid(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                           zk_scratch_t *b)
{
    unsigned pf = plan->pf_from[f] <= ZK_PREFETCH_MIN_BYTES ? plan->prefetch[f][0] : 0;
    const zk_st_t st[2] = {{0, pf}, {1, 0}};
    double g[2];

    if (zk_plan_pair(plan, ops, f, b, ZK_PREFETCH_MIN_BYTES, st, g) == ZK_PLAN_WINS) {
        plan->nt_from[f] = ZK_PREFETCH_MIN_BYTES;
        plan->nt_to[f] = ZK_PLAN_MIN_BYTES;
        plan->prefetch[f][1] = 0;
        zk_plan_printf(plan, " nt from %zu to %zu MiB,", ZK_PREFETCH_MIN_BYTES >> 20,
                       ZK_PLAN_MIN_BYTES >> 20);
    }
}

/* The distance (index) of a family's best prefetch figure with stores nt, none included, up
 * to its pf_max. */
static int zk_plan_pf_best(const zk_store_plan_t *plan, zk_store_family_t f, int nt)
{
    int best = 0;

    for (int i = 1; i < ZK_PREFETCH_CHOICES && zk_prefetch_choice(i) <= plan->pf_max[f]; i++) {
        best = plan->pf_gbps[f][nt][i] > plan->pf_gbps[f][nt][best] ? i : best;
    }
    return best;
}

/* Whether non-temporal stores are chosen: zk_plan_decide on the rounds of each kind at its
 * best distance; a tie with a margin above the least is timed again on the whole scratch
 * (zk_plan_pair: more rounds, each the best of ZK_PLAN_REPS calls); a tie that remains goes to
 * the hardware's lean (zk_plan_writes_apart). With single calls on this AMD EPYC VM, shared
 * with builds, the margin reached 50 %, and the reduce's 54.4 against 36.4 GB/s was a tie. */
static int zk_plan_nt_wins(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                           zk_scratch_t *b, double rounds[2][ZK_PREFETCH_CHOICES][ZK_PLAN_ROUNDS])
{
    int pr = zk_plan_pf_best(plan, f, 0), pn = zk_plan_pf_best(plan, f, 1);
    const zk_st_t st[2] = {{0, zk_prefetch_choice(pr)}, {1, zk_prefetch_choice(pn)}};
    zk_plan_verdict_t v;
    double g[2];

    v = zk_plan_decide(rounds[0][pr], rounds[1][pn], ZK_PLAN_ROUNDS, &plan->nt_margin[f]);
    if (v == ZK_PLAN_TIES && plan->nt_margin[f] > ZK_PLAN_MARGIN_MIN) {
        v = zk_plan_pair(plan, ops, f, b, (size_t)(zk_plan_bytes(f) * (double)b->n), st, g);
    }
    return v == ZK_PLAN_WINS || (v == ZK_PLAN_TIES && zk_plan_writes_apart(f));
}

/* One family: each store kind without a prefetch (printed), then each with every prefetch
 * distance; the stores are chosen on the best of each, prefetch included (the accumulate
 * with AVX2 on the Xeon VM: non-temporal 13.0 against 12.4 GB/s without a prefetch, 18.7
 * against 24.4 with the best distance of each; chosen on the first figures it ran at 0.78 of
 * the limit at 64 Mi elements). Calls below nt_from use regular stores whatever the plan;
 * last, from which size it prefetches. */
static void zk_plan_family(zk_store_plan_t *plan, const zk_ops_t *ops, zk_store_family_t f,
                           zk_scratch_t *b)
{
    /* the sum of squares stores nothing: its second kind is one super-block at a time, where
     * the variant can read two at once */
    int read = f == ZK_STORE_READ, two = !read || ops->sumsq_pairs;
    const char *kind = read ? "one block" : "nt";
    double rounds[2][ZK_PREFETCH_CHOICES][ZK_PLAN_ROUNDS];

    /* nt_from, nt_to: never, until a choice says otherwise */
    zk_plan_printf(plan, " %s%s:", zk_family_names[f], read && two ? " (nt: one block)" : "");
    zk_plan_prefetch(plan, ops, f, b, 1 + two, rounds);
    for (int k = 0; k < 1 + two; k++) {
        plan->gbps[f][k] = plan->pf_gbps[f][k][0];
    }
    if (two) {
        plan->nt[f] = zk_plan_nt_wins(plan, ops, f, b, rounds);
        zk_plan_printf(plan, " -> %s (+-%.0f%%),",
                       plan->nt[f] ? kind
                       : read      ? "two blocks"
                                   : "regular",
                       100 * plan->nt_margin[f]);
        if (plan->nt[f]) {
            plan->nt_from[f] = zk_plan_nt_from(plan, ops, f, b);
        }
    }
    plan->pf_from[f] = zk_plan_pf_from(plan, ops, f, b);
    if (plan->nt[f]) {
        zk_plan_printf(plan, " %s from %g MiB,", kind, zk_mib(plan->nt_from[f]));
    } else if (!read) {
        zk_plan_nt_mid(plan, ops, f, b);
    }
    if (plan->pf_from[f] != SIZE_MAX) {
        zk_plan_printf(plan, " prefetch%s from %zu MiB,",
                       plan->nt_from[f] == SIZE_MAX ? ""
                       : read                       ? " with two blocks"
                                                    : " with regular stores",
                       plan->pf_from[f] >> 20);
    }
    plan->how[strlen(plan->how) - 1] = ';';
}

/* Values in the scratch as a step has them: never all zero. A CPU (an AMD EPYC VM of this
 * project) writes lines of zeros with non-temporal stores twice as fast as any other: timed on
 * zeroed scratch, they won at 4 MiB (bf16 to fp32, 121.8 against 91.8 GB/s) where on real
 * values they run at 60 against 90 and the widen at 1 Mi elements fell to 0.58 of the limit.
 * fp32 buffers hold [0.5, 1.5): positive, so that Adam's second moment and every sum stay
 * normal however many calls the plan makes; the 16-bit one (s[4]) bf16 values in [0.5, 1). */
static void zk_plan_fill(zk_scratch_t *b)
{
    void *half = b->s[4]; /* the 16-bit stream */
    uint16_t *h = half;

    for (size_t j = 0; j < b->n; j++) {
        uint32_t r = (uint32_t)j * 2654435761u;
        for (int i = 0; i < 4; i++) {
            b->s[i][j] = 0.5f + (float)((r >> (8 + 2 * i)) & 0xffffu) * 0x1.0p-16f;
        }
        h[2 * j] = (uint16_t)(0x3f00u + (r >> 25));
        h[2 * j + 1] = (uint16_t)(0x3f00u + ((r >> 18) & 0x7fu));
    }
}

static void zk_plan_measure(zk_store_plan_t *plan, zk_variant_t v)
{
    const zk_ops_t *ops = zk_variant_ops(v);
    size_t target = 2 * zk_llc_bytes();
    zk_scratch_t b = {0};
    int any = 0;

    target = target < ZK_PLAN_MIN_BYTES ? ZK_PLAN_MIN_BYTES : target;
    target = target > ZK_PLAN_MAX_BYTES ? ZK_PLAN_MAX_BYTES : target;
    b.n = zk_plan_scratch_n(target);
    /* mapped, not from the heap: freed, they go back to the kernel whatever malloc's
     * thresholds have become (a heap kept up to 284 MiB of them in a daemon) */
    for (int i = 0; i < 5; i++) {
        void *p = mmap(NULL, b.n * 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b.s[i] = p != MAP_FAILED ? p : NULL;
        any |= b.s[i] == NULL;
    }
    if (!any) {
        zk_plan_fill(&b);
    }
    b.part = malloc((b.n / ZK_SUMSQ_BLOCK + 1) * sizeof(double));
    any |= b.part == NULL;
    plan->nt_min_bytes = target;
    if (any) {
        zk_plan_printf(plan, "regular stores, no prefetch: no memory for %zu MiB of scratch",
                       target >> 20);
    } else {
        zk_plan_printf(plan,
                       "measured at %zu MiB (%s), GB/s regular/non-temporal and with prefetch "
                       "%u/%u/%u elements ahead:",
                       target >> 20, zk_variant_name(v), zk_prefetch_choice(1),
                       zk_prefetch_choice(2), zk_prefetch_choice(3));
        for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
            zk_plan_family(plan, ops, (zk_store_family_t)f, &b);
        }
        zk_plan_printf(plan, " from %zu MiB of footprint", target >> 20);
    }
    for (int i = 0; i < 5; i++) {
        if (b.s[i] != NULL) {
            munmap(b.s[i], b.n * 4);
        }
    }
    free(b.part);
}

static void zk_plan_run(zk_store_plan_t *plan, zk_variant_t v)
{
    const char *env = getenv("ZEROD_KERNEL_STORES");
    size_t l1 = zk_l1d_bytes();

    plan->variant = (int)v;
    for (int f = 0; f < ZK_STORE_FAMILIES; f++) { /* until a choice says otherwise */
        plan->nt_from[f] = plan->nt_to[f] = plan->pf_from[f] = SIZE_MAX;
        plan->pf_max[f] = zk_plan_pf_max((zk_store_family_t)f, l1);
        plan->pf_to[f][0] = plan->pf_to[f][1] = SIZE_MAX;
    }
    if (env != NULL && *env != '\0' && strcasecmp(env, "auto") != 0 && zk_plan_env(plan, env)) {
        return;
    }
    if (v == ZK_VARIANT_SCALAR) { /* one element at a time: nothing to choose, nothing to time */
        plan->nt_min_bytes = SIZE_MAX;
        snprintf(plan->how, sizeof(plan->how),
                 "regular stores, no prefetch: the scalar variant has neither, not measured");
        return;
    }
    if (env != NULL && *env != '\0' && strcasecmp(env, "auto") != 0) {
        snprintf(plan->how, sizeof(plan->how),
                 "ZEROD_KERNEL_STORES=%.40s is not regular, nt or auto: measured instead; ", env);
    }
    zk_plan_measure(plan, v);
}

const zk_store_plan_t *zk_store_plan_variant(zk_variant_t v)
{
    if ((unsigned)v >= ZK_VARIANT_COUNT || !zk_variant_supported(v)) {
        return NULL;
    }
    pthread_mutex_lock(&zk_plan_lock); /* one measurement at a time, each once */
    if (!zk_plan_done[v]) {
        zk_plan_run(&zk_plans[v], v);
        zk_plan_done[v] = 1;
    }
    pthread_mutex_unlock(&zk_plan_lock);
    return &zk_plans[v];
}

/* Variant v's plan if it has been measured, else NULL: never measures, and never waits for a
 * measurement under way on another thread. */
static const zk_store_plan_t *zk_store_plan_ready(zk_variant_t v)
{
    int done;

    if (pthread_mutex_trylock(&zk_plan_lock) != 0) {
        return NULL;
    }
    done = zk_plan_done[v];
    pthread_mutex_unlock(&zk_plan_lock);
    return done ? &zk_plans[v] : NULL;
}

int zk_store_plan_install(const zk_store_plan_t *plan)
{
    zk_variant_t v = zk_default_variant();
    int taken = 0;

    if (plan->variant != (int)v || atomic_load(&zk_plan_bg) != 0) {
        return 0; /* another variant's, or a measurement is on its way already */
    }
    pthread_mutex_lock(&zk_plan_lock);
    if (!zk_plan_done[v]) {
        zk_plans[v] = *plan;
        zk_plans[v].how[sizeof(zk_plans[v].how) - 1] = '\0';
        zk_plan_done[v] = 1;
        taken = 1;
    }
    pthread_mutex_unlock(&zk_plan_lock);
    return taken;
}

const zk_store_plan_t *zk_store_plan_measured(void)
{
    return zk_store_plan_ready(zk_default_variant());
}

const zk_store_plan_t *zk_store_plan(void)
{
    return zk_store_plan_variant(zk_default_variant());
}

typedef struct zk_plan_bg_arg {
    zk_store_plan_done_fn done;
    void *arg;
} zk_plan_bg_arg_t;

static void *zk_plan_bg_main(void *p)
{
    zk_plan_bg_arg_t a = *(zk_plan_bg_arg_t *)p;
    const zk_store_plan_t *plan;

    free(p);
    plan = zk_store_plan();
    if (a.done != NULL) { /* before the calls take the plan: what they use is said first */
        a.done(plan, a.arg);
    }
    atomic_store(&zk_plan_bg, 0);
    return NULL;
}

int zk_store_plan_start(zk_store_plan_done_fn done, void *arg)
{
    zk_variant_t v = zk_default_variant();
    zk_plan_bg_arg_t *a;
    pthread_t t;
    int measured, expected = 0, rc;

    pthread_mutex_lock(&zk_plan_lock);
    measured = zk_plan_done[v];
    pthread_mutex_unlock(&zk_plan_lock);
    if (measured || !atomic_compare_exchange_strong(&zk_plan_bg, &expected, 1)) {
        return 0; /* there already, or on its way */
    }
    a = malloc(sizeof(*a));
    if (a == NULL) {
        atomic_store(&zk_plan_bg, 0);
        return -1;
    }
    a->done = done;
    a->arg = arg;
    rc = zs_thread_start(&t, true, zk_plan_bg_main, a);
    if (rc != 0) {
        free(a);
        atomic_store(&zk_plan_bg, 0);
        return -1;
    }
    return 1;
}

zk_st_t zk_store_st(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint)
{
    int mode = exec != NULL ? exec->stores : ZK_STORES_AUTO;
    int pf = exec != NULL ? exec->prefetch : 0;
    int dv = (int)zk_default_variant();
    int v = exec != NULL && exec->variant != ZK_VARIANT_DEFAULT ? exec->variant : dv;
    const zk_store_plan_t *plan = NULL;
    zk_st_t st = {0, 0};

    /* below the smallest scratch size the answer is regular stores on every CPU: measure only
     * for calls that could use the others, and let smaller ones prefetch only as a plan
     * already measured says; a plan being measured in the background is not waited for */
    if (mode == ZK_STORES_AUTO && footprint >= ZK_NT_MIN_BYTES &&
        !(v == dv && atomic_load(&zk_plan_bg) != 0)) {
        plan = footprint >= ZK_PLAN_MIN_BYTES ? zk_store_plan_variant((zk_variant_t)v)
                                              : zk_store_plan_ready((zk_variant_t)v);
    }
    if (mode == ZK_STORES_NT) {
        st.nt = 1; /* the sum of squares: one super-block at a time */
    } else if (plan != NULL) {
        zk_store_plan_choice(plan, fam, footprint, &st.nt, &st.pf);
    }
    if (pf != 0) { /* the caller's distance, or none (< 0), instead of the plan's */
        st.pf = pf > 0 ? (unsigned)pf : 0;
    }
    return st;
}

void zk_store_plan_choice(const zk_store_plan_t *plan, zk_store_family_t fam, size_t footprint,
                          int *nt, unsigned *pf)
{
    *nt = 0;
    *pf = 0;
    if (plan == NULL || (unsigned)fam >= ZK_STORE_FAMILIES || footprint < ZK_NT_MIN_BYTES) {
        return;
    }
    *nt = footprint >= plan->nt_from[fam] && footprint < plan->nt_to[fam];
    if (footprint >= ZK_PREFETCH_MIN_BYTES && (*nt || footprint >= plan->pf_from[fam]) &&
        footprint < plan->pf_to[fam][*nt]) {
        *pf = plan->prefetch[fam][*nt];
    }
}

int zk_store_nt(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint)
{
    return zk_store_st(exec, fam, footprint).nt;
}

unsigned zk_store_prefetch(const zk_exec_t *exec, zk_store_family_t fam, size_t footprint)
{
    return zk_store_st(exec, fam, footprint).pf;
}
