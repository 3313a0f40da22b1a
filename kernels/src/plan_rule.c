/*
 * The store plan's rules (stores.c): what a set of timings says of an option against the
 * current choice, with a margin the timings themselves set; how far down in size a choice of
 * non-temporal stores carries; how far ahead a family may prefetch. Pure functions of their
 * arguments, so that the tests can feed them timings as a noisy machine gives them.
 */
#include "zk/kernels.h"

#include <stdlib.h>
#include <string.h>

#define ZK_PLAN_MAX_SAMPLES 64

static const unsigned zk_pf_choices[ZK_PREFETCH_CHOICES] = {0, 512, 1024, 2048};

unsigned zk_prefetch_choice(int i)
{
    return i >= 0 && i < ZK_PREFETCH_CHOICES ? zk_pf_choices[i] : 0;
}

static int zk_plan_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x < y) - (x > y); /* descending */
}

/* Best of n samples, their median, and how far below the best the median lies, as a
 * fraction of the best. */
static double zk_plan_best_spread(const double *g, int n, double *median_p, double *spread_p)
{
    double s[ZK_PLAN_MAX_SAMPLES], best, median;

    n = n < ZK_PLAN_MAX_SAMPLES ? n : ZK_PLAN_MAX_SAMPLES;
    memcpy(s, g, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), zk_plan_cmp);
    best = s[0];
    median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    *median_p = median;
    *spread_p = best > 0 ? (best - median) / best : 1.0;
    return best;
}

zk_plan_verdict_t zk_plan_decide(const double *base, const double *opt, int n, double *margin_p)
{
    double sb, so, bb, bo, mb, mo, margin;

    if (n <= 0) {
        *margin_p = 1.0;
        return ZK_PLAN_TIES;
    }
    bb = zk_plan_best_spread(base, n, &mb, &sb);
    bo = zk_plan_best_spread(opt, n, &mo, &so);
    margin = sb > so ? sb : so;
    margin = margin > ZK_PLAN_MARGIN_MIN ? margin : ZK_PLAN_MARGIN_MIN;
    *margin_p = margin;
    if (bo > (1.0 + margin) * bb && mo > mb) {
        return ZK_PLAN_WINS;
    }
    if (bb > (1.0 + margin) * bo && mb > mo) {
        return ZK_PLAN_LOSES;
    }
    return ZK_PLAN_TIES;
}

int zk_plan_nt_extends(zk_plan_verdict_t v, size_t bytes, int apart)
{
    size_t tie_from = apart ? ZK_PREFETCH_MIN_BYTES : ZK_STORES_PLAN_MIN_BYTES;

    return v == ZK_PLAN_WINS || (v == ZK_PLAN_TIES && bytes >= tie_from);
}

int zk_plan_writes_apart(zk_store_family_t f)
{
    return f == ZK_STORE_OUT || f == ZK_STORE_CAST || f == ZK_STORE_WIDEN || f == ZK_STORE_COPY;
}

/* Streams each family's kernel reads or writes, in 4-byte elements at most: Adam's master, m,
 * v and accumulator and its 16-bit params; the reduce's two sources and its output; every
 * other family's source and destination (the sum of squares: its two super-blocks). */
static const unsigned zk_family_streams[ZK_STORE_FAMILIES] = {5, 2, 3, 2, 2, 2, 2};

/* The longest prefetch distance family f may take with an L1 of `l1` bytes: its streams'
 * lines from each one in use to the one prefetched must fit in half of it, or they evict each
 * other before use. On the AMD EPYC VM (48 KiB of L1) Adam's distances tied beyond the caches
 * (55.8/55.7/56.5 GB/s at 256 MiB) and the plan kept 2048 ahead; on data of 4-18 MiB, in the
 * last-level cache, that distance ran Adam at 4.1 Gelem/s where 1024, 512 and none ran at
 * 5.0-5.3 (its five streams sit at the same offsets of their pages and so share L1 sets). The
 * sum of squares, one or two streams, gains from 2048 there (56.1 against 47.7 GB/s at 64 MiB
 * with one super-block at a time). The shortest distance is always allowed. */
unsigned zk_plan_pf_max(zk_store_family_t f, size_t l1)
{
    unsigned max = zk_prefetch_choice(1);

    for (int i = 2; i < ZK_PREFETCH_CHOICES && (unsigned)f < ZK_STORE_FAMILIES; i++) {
        if ((size_t)zk_prefetch_choice(i) * 4 * zk_family_streams[f] <= l1 / 2) {
            max = zk_prefetch_choice(i);
        }
    }
    return max;
}

/* Where a distance that won at half the size measured (`measured` bytes) stops: the footprint
 * as far on a log scale from both, in whole MiB. */
size_t zk_plan_pf_band(size_t measured)
{
    return (size_t)((double)measured / 1.4142135623730951) >> 20 << 20; /* sqrt(2) */
}
