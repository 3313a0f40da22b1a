/*
 * The store plan's rule (kernels/src/plan_rule.c) on timings as a noisy machine gives them:
 * a tie within the noise never flips the choice, a clear or steady win is taken, one lucky
 * sample is not a win, and a tie carries non-temporal stores down only beyond the caches.
 */
#include "zk_test.h"

#define ZT_MIB ((size_t)1 << 20)

/* The Xeon VM's start-up figures at 64 MiB (22.5 against 22.7 GB/s at best), each side with
 * the spread that VM shows from round to round: a tie both ways round. */
Test(zk_plan_rule, noisy_tie_is_a_tie)
{
    const double reg[5] = {22.5, 21.0, 22.1, 20.2, 21.8};
    const double nt[5] = {22.7, 20.6, 21.9, 19.4, 22.2};
    double margin;

    cr_assert_eq(zk_plan_decide(reg, nt, 5, &margin), ZK_PLAN_TIES);
    cr_assert_gt(margin, 0.02); /* the median lies 3 % below the best */
    cr_assert_eq(zk_plan_decide(nt, reg, 5, &margin), ZK_PLAN_TIES);
}

Test(zk_plan_rule, clear_win_and_loss_are_taken)
{
    const double reg[5] = {22.5, 22.3, 22.4, 21.9, 22.2};
    const double nt[5] = {29.1, 28.8, 29.0, 28.2, 28.9};
    double margin;

    cr_assert_eq(zk_plan_decide(reg, nt, 5, &margin), ZK_PLAN_WINS);
    cr_assert_eq(zk_plan_decide(nt, reg, 5, &margin), ZK_PLAN_LOSES);
}

/* On a quiet machine the least margin applies: 2 % is a win, 0.5 % is not. */
Test(zk_plan_rule, steady_small_gain_is_a_win)
{
    const double reg[8] = {50.0, 49.98, 50.0, 49.97, 49.99, 50.0, 49.98, 49.99};
    const double two[8] = {51.0, 50.98, 51.0, 50.97, 50.99, 51.0, 50.98, 50.99};
    const double half[8] = {50.25, 50.23, 50.25, 50.22, 50.24, 50.25, 50.23, 50.24};
    double margin;

    cr_assert_eq(zk_plan_decide(reg, two, 8, &margin), ZK_PLAN_WINS);
    cr_assert_eq(margin, ZK_PLAN_MARGIN_MIN); /* the very value, assigned */
    cr_assert_eq(zk_plan_decide(reg, half, 8, &margin), ZK_PLAN_TIES);
}

/* One round that caught the machine idle (30 against 22) is not a win: that side's median
 * lies a quarter below its best, and the margin with it. */
Test(zk_plan_rule, one_lucky_sample_is_not_a_win)
{
    const double reg[5] = {22.3, 22.2, 22.1, 22.3, 22.2};
    const double nt[5] = {30.0, 22.0, 22.1, 21.9, 22.0};
    double margin;

    cr_assert_eq(zk_plan_decide(reg, nt, 5, &margin), ZK_PLAN_TIES);
    cr_assert_gt(margin, 0.25);
}

/* Nothing timed (a size the scratch cannot hold) decides nothing. */
Test(zk_plan_rule, no_samples_tie)
{
    const double g[1] = {0};
    double margin;

    cr_assert_eq(zk_plan_decide(g, g, 0, &margin), ZK_PLAN_TIES);
}

/* Non-temporal stores chosen at the size measured carry down through a tie from 32 MiB on
 * (the size the plan serves from), from 4 MiB on for a family that writes apart, and through
 * a win only below that; a loss stops them. */
Test(zk_plan_rule, tie_carries_nt_down_only_beyond_the_caches)
{
    cr_assert(zk_plan_nt_extends(ZK_PLAN_TIES, 64 * ZT_MIB, 0));
    cr_assert(zk_plan_nt_extends(ZK_PLAN_TIES, ZK_STORES_PLAN_MIN_BYTES, 0));
    cr_assert_not(zk_plan_nt_extends(ZK_PLAN_TIES, ZK_STORES_PLAN_MIN_BYTES / 2, 0));
    cr_assert(zk_plan_nt_extends(ZK_PLAN_TIES, ZK_STORES_PLAN_MIN_BYTES / 2, 1));
    cr_assert(zk_plan_nt_extends(ZK_PLAN_TIES, ZK_PREFETCH_MIN_BYTES, 1));
    cr_assert_not(zk_plan_nt_extends(ZK_PLAN_TIES, ZK_NT_MIN_BYTES, 1));
    cr_assert(zk_plan_nt_extends(ZK_PLAN_WINS, ZK_NT_MIN_BYTES, 0));
    cr_assert_not(zk_plan_nt_extends(ZK_PLAN_LOSES, 64 * ZT_MIB, 1));
}

/* The families whose stores go to lines the call does not read lean to non-temporal stores;
 * the in-place ones and the sum of squares do not. */
Test(zk_plan_rule, only_families_that_write_apart_lean_to_nt)
{
    cr_assert(zk_plan_writes_apart(ZK_STORE_OUT));
    cr_assert(zk_plan_writes_apart(ZK_STORE_CAST));
    cr_assert(zk_plan_writes_apart(ZK_STORE_WIDEN));
    cr_assert(zk_plan_writes_apart(ZK_STORE_COPY));
    cr_assert_not(zk_plan_writes_apart(ZK_STORE_ADAM));
    cr_assert_not(zk_plan_writes_apart(ZK_STORE_ACCUMULATE));
    cr_assert_not(zk_plan_writes_apart(ZK_STORE_READ));
}

/* A plan whose non-temporal stores held down to ZK_NT_MIN_BYTES gives them to calls from that
 * size on, and a prefetch only from ZK_PREFETCH_MIN_BYTES on; smaller calls take neither. */
Test(zk_plan_rule, nt_from_the_l2_prefetch_from_4_mib)
{
    static zk_store_plan_t plan;
    unsigned pf;
    int nt;

    for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
        plan.nt_from[f] = plan.nt_to[f] = plan.pf_from[f] = SIZE_MAX;
        plan.pf_to[f][0] = plan.pf_to[f][1] = SIZE_MAX;
    }
    plan.nt[ZK_STORE_OUT] = 1;
    plan.nt_from[ZK_STORE_OUT] = ZK_NT_MIN_BYTES;
    plan.prefetch[ZK_STORE_OUT][1] = 512;
    zk_store_plan_choice(&plan, ZK_STORE_OUT, ZK_NT_MIN_BYTES - 1, &nt, &pf);
    cr_assert(nt == 0 && pf == 0);
    zk_store_plan_choice(&plan, ZK_STORE_OUT, ZK_NT_MIN_BYTES, &nt, &pf);
    cr_assert(nt == 1 && pf == 0);
    zk_store_plan_choice(&plan, ZK_STORE_OUT, ZK_PREFETCH_MIN_BYTES, &nt, &pf);
    cr_assert(nt == 1 && pf == 512);
    zk_store_plan_choice(&plan, ZK_STORE_CAST, ZK_PREFETCH_MIN_BYTES, &nt, &pf);
    cr_assert(nt == 0 && pf == 0);
}
