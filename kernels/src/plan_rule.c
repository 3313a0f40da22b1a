/*
 * The store plan's rule (stores.c): what a set of timings says of an option against the
 * current choice, with a margin the timings themselves set, and how far down in size a
 * choice of non-temporal stores carries. Pure functions of their arguments, so that the tests
 * can feed them timings as a noisy machine gives them.
 */
#include "zk/kernels.h"

#include <stdlib.h>
#include <string.h>

#define ZK_PLAN_MAX_SAMPLES 64

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

int zk_plan_nt_extends(zk_plan_verdict_t v, size_t bytes)
{
    return v == ZK_PLAN_WINS || (v == ZK_PLAN_TIES && bytes >= ZK_STORES_PLAN_MIN_BYTES);
}

int zk_plan_writes_apart(zk_store_family_t f)
{
    return f == ZK_STORE_OUT || f == ZK_STORE_CAST || f == ZK_STORE_WIDEN || f == ZK_STORE_COPY;
}
