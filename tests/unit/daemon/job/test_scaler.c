/* The loss scaler (daemon/src/job/scaler.c) against docs/semantics.md §4 step 3, which is
 * DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py): an overflow
 * spends hysteresis, then halves the scale down to min_loss_scale; a window of good steps doubles
 * it.
 *
 * Every scale here is a power of two times min_loss_scale, and halving or doubling one is exact
 * in a double, so scales are compared with ==. */
#include "job/scaler.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zd_train_config_t config(const char *json)
{
    zd_train_config_t cfg;
    char err[512] = "";
    zs_status_t st = zd_train_config_parse(json, &cfg, NULL, 0, err, sizeof(err));

    cr_assert_eq(st, ZS_OK, "%s: %s", json, err);
    return cfg;
}

/* A dynamic fp16 scaler starting at 2^power. */
static zd_scaler_t dynamic(int power, unsigned window, unsigned hysteresis, bool consecutive,
                           double min_scale)
{
    char json[512];
    zd_train_config_t cfg;
    zd_scaler_t s;

    snprintf(json, sizeof(json),
             "{\"fp16\": {\"enabled\": true, \"initial_scale_power\": %d, \"loss_scale_window\": "
             "%u, \"hysteresis\": %u, \"consecutive_hysteresis\": %s, \"min_loss_scale\": %g}}",
             power, window, hysteresis, consecutive ? "true" : "false", min_scale);
    cfg = config(json);
    zd_scaler_init(&s, &cfg);
    return s;
}

static void update_ok(zd_scaler_t *s, bool overflow)
{
    cr_assert_eq(zd_scaler_update(s, overflow), ZS_OK, "update(%d) at scale %g", overflow,
                 s->cur_scale);
}

/* n good steps, the scale after each given in expect[]. */
static void good_steps(zd_scaler_t *s, int n, const double *expect)
{
    for (int i = 0; i < n; i++) {
        update_ok(s, false);
        cr_assert_eq(s->cur_scale, expect[i], "good step %d: scale %g, expected %g", i + 1,
                     s->cur_scale, expect[i]);
    }
}

Test(zd_scaler, fp16_dynamic_starts_at_two_to_the_initial_scale_power)
{
    zd_train_config_t cfg = config("{\"fp16\": {\"enabled\": true}}");
    zd_scaler_t s;

    zd_scaler_init(&s, &cfg);
    cr_assert(s.dynamic);
    cr_assert_eq(s.cur_scale, 65536.0, "default initial_scale_power 16: got %g", s.cur_scale);
    cr_assert_eq(s.cur_hysteresis, 2);
    s = dynamic(5, 10, 1, false, 1);
    cr_assert_eq(s.cur_scale, 32.0);
}

Test(zd_scaler, bf16_and_fp32_scale_by_one_and_ignore_overflows)
{
    static const char *const json[] = {"{}", "{\"bf16\": {\"enabled\": true}}"};

    for (int i = 0; i < 2; i++) {
        zd_train_config_t cfg = config(json[i]);
        zd_scaler_t s;

        zd_scaler_init(&s, &cfg);
        cr_assert(!s.dynamic, "%s", json[i]);
        cr_assert_eq(s.cur_scale, 1.0, "%s", json[i]);
        for (int k = 0; k < 5; k++) {
            update_ok(&s, true);
        }
        cr_assert_eq(s.cur_scale, 1.0, "%s: an overflow changed the scale", json[i]);
    }
}

Test(zd_scaler, static_fp16_scale_never_changes)
{
    zd_train_config_t cfg = config("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128}}");
    zd_scaler_t s;

    zd_scaler_init(&s, &cfg);
    cr_assert(!s.dynamic);
    cr_assert_eq(s.cur_scale, 128.0);
    for (int k = 0; k < 3000; k++) {
        update_ok(&s, k % 7 == 0);
    }
    cr_assert_eq(s.cur_scale, 128.0);
}

Test(zd_scaler, overflow_halves_the_scale_when_hysteresis_is_one)
{
    zd_scaler_t s = dynamic(10, 1000, 1, false, 1);

    update_ok(&s, true);
    cr_assert_eq(s.cur_scale, 512.0);
    update_ok(&s, true);
    cr_assert_eq(s.cur_scale, 256.0);
}

Test(zd_scaler, hysteresis_absorbs_overflows_before_halving)
{
    zd_scaler_t s = dynamic(10, 1000, 3, false, 1);

    update_ok(&s, true); /* hysteresis 3 -> 2 */
    cr_assert_eq(s.cur_scale, 1024.0);
    update_ok(&s, true); /* 2 -> 1 */
    cr_assert_eq(s.cur_scale, 1024.0);
    update_ok(&s, true); /* spent: halve */
    cr_assert_eq(s.cur_scale, 512.0);
    update_ok(&s, true); /* stays spent until a window of good steps refills it */
    cr_assert_eq(s.cur_scale, 256.0);
}

/* DeepSpeed counts the stable interval as cur_iter - last_overflow_iter - 1 and doubles when it
 * is a positive multiple of the window: with no overflow yet (last_overflow_iter = -1) the
 * first doubling comes on good step window + 1, then every window steps. */
Test(zd_scaler, scale_doubles_after_each_window_of_good_steps)
{
    zd_scaler_t s = dynamic(4, 3, 2, false, 1);
    static const double expect[] = {16, 16, 16, 32, 32, 32, 64, 64, 64, 128};

    good_steps(&s, 10, expect);
}

Test(zd_scaler, an_overflow_restarts_the_growth_window)
{
    zd_scaler_t s = dynamic(4, 3, 1, false, 1);
    static const double before[] = {16, 16};
    /* iters 3, 4, 5 are stable intervals 0, 1, 2; iter 6 is 3 = window: double; iter 9 too */
    static const double after[] = {8, 8, 8, 16, 16, 16, 32};

    good_steps(&s, 2, before); /* iters 0, 1: stable 0, 1, short of the window */
    update_ok(&s, true);       /* iter 2: 16 -> 8, last_overflow_iter = 2 */
    cr_assert_eq(s.cur_scale, 8.0);
    good_steps(&s, 7, after);
}

Test(zd_scaler, a_window_of_good_steps_refills_hysteresis)
{
    zd_scaler_t s = dynamic(8, 2, 2, false, 1);

    update_ok(&s, true); /* iter 0: hysteresis 2 -> 1, scale kept */
    cr_assert_eq(s.cur_scale, 256.0);
    update_ok(&s, false); /* iter 1: stable 0 */
    update_ok(&s, false); /* iter 2: stable 1: hysteresis still spent */
    cr_assert_eq(s.cur_hysteresis, 1);
    update_ok(&s, false); /* iter 3: stable 2 = window: double, refill */
    cr_assert_eq(s.cur_scale, 512.0);
    cr_assert_eq(s.cur_hysteresis, 2);
    update_ok(&s, true); /* the refilled hysteresis absorbs this one */
    cr_assert_eq(s.cur_scale, 512.0);
}

Test(zd_scaler, without_a_full_window_an_overflow_after_good_steps_halves)
{
    zd_scaler_t s = dynamic(8, 100, 2, false, 1);

    update_ok(&s, true); /* hysteresis 2 -> 1 */
    for (int k = 0; k < 50; k++) {
        update_ok(&s, false);
    }
    cr_assert_eq(s.cur_hysteresis, 1, "good steps short of a window refilled hysteresis");
    update_ok(&s, true);
    cr_assert_eq(s.cur_scale, 128.0);
}

Test(zd_scaler, consecutive_hysteresis_refills_on_every_good_step)
{
    zd_scaler_t s = dynamic(8, 1000, 2, true, 1);

    update_ok(&s, true); /* 2 -> 1 */
    update_ok(&s, false);
    cr_assert_eq(s.cur_hysteresis, 2);
    update_ok(&s, true); /* 2 -> 1 again: no halving */
    cr_assert_eq(s.cur_scale, 256.0);
    update_ok(&s, true); /* two in a row: halve */
    cr_assert_eq(s.cur_scale, 128.0);
}

Test(zd_scaler, halving_stops_at_min_loss_scale)
{
    zd_scaler_t s = dynamic(2, 1000, 1, false, 1.5);

    update_ok(&s, true); /* 4 -> 2 */
    cr_assert_eq(s.cur_scale, 2.0);
    update_ok(&s, true); /* max(1, 1.5) */
    cr_assert_eq(s.cur_scale, 1.5);
}

Test(zd_scaler, overflow_at_min_scale_with_hysteresis_spent_is_an_error)
{
    zd_scaler_t s = dynamic(1, 1000, 1, false, 1);
    zd_scaler_t before;

    update_ok(&s, true); /* 2 -> 1 = min */
    cr_assert_eq(s.cur_scale, 1.0);
    before = s;
    cr_assert_eq(zd_scaler_update(&s, true), ZS_ERR_LOSS_SCALE);
    cr_assert(memcmp(&before, &s, sizeof(s)) == 0, "a refused update changed the scaler");
}

Test(zd_scaler, overflow_at_min_scale_spends_hysteresis_first)
{
    zd_scaler_t s = dynamic(0, 1000, 2, false, 1); /* starts at the minimum, 2^0 */

    update_ok(&s, true); /* hysteresis 2 -> 1: no error yet */
    cr_assert_eq(s.cur_scale, 1.0);
    cr_assert_eq(zd_scaler_update(&s, true), ZS_ERR_LOSS_SCALE);
}

/* ---- against the pseudo-code of docs/semantics.md §4 step 3, transcribed literally
 * ------------------- */

typedef struct ref_scaler {
    double cur_scale, min_scale;
    int64_t window, hysteresis_cfg, cur_hysteresis, cur_iter, last_overflow_iter;
    bool consecutive;
} ref_scaler_t;

static bool ref_update(ref_scaler_t *r, bool overflow)
{
    if (overflow) {
        if (r->hysteresis_cfg == 1 || r->cur_hysteresis == 1) {
            if (r->cur_scale == r->min_scale) {
                return false; /* error "loss scale already at minimum" */
            }
            r->cur_scale = fmax(r->cur_scale / 2, r->min_scale);
        } else {
            r->cur_hysteresis -= 1;
        }
        r->last_overflow_iter = r->cur_iter;
    } else {
        int64_t stable;
        if (r->consecutive) {
            r->cur_hysteresis = r->hysteresis_cfg;
        }
        stable = r->cur_iter - r->last_overflow_iter - 1;
        if (stable > 0 && stable % r->window == 0) {
            if (!r->consecutive) {
                r->cur_hysteresis = r->hysteresis_cfg;
            }
            r->cur_scale *= 2;
        }
    }
    r->cur_iter += 1;
    return true;
}

Test(zd_scaler, follows_semantics_md_on_random_overflow_sequences)
{
    unsigned seed = 12345;

    for (int trial = 0; trial < 200; trial++) {
        int power = 4 + (int)(rand_r(&seed) % 12);
        unsigned window = 1 + rand_r(&seed) % 6;
        unsigned hyst = 1 + rand_r(&seed) % 4;
        bool consecutive = rand_r(&seed) % 2;
        double min_scale = rand_r(&seed) % 2 ? 1.0 : 4.0;
        unsigned overflow_pct = 10 + rand_r(&seed) % 60;
        zd_scaler_t s = dynamic(power, window, hyst, consecutive, min_scale);
        ref_scaler_t r = {ldexp(1.0, power), min_scale, window, hyst, hyst, 0, -1, consecutive};

        for (int k = 0; k < 300; k++) {
            bool overflow = rand_r(&seed) % 100u < overflow_pct;
            bool ok = ref_update(&r, overflow);
            zs_status_t st = zd_scaler_update(&s, overflow);

            cr_assert_eq(st == ZS_OK, ok,
                         "trial %d (2^%d window %u hysteresis %u consecutive %d min %g), "
                         "update %d (overflow %d): status %d, reference %s",
                         trial, power, window, hyst, consecutive, min_scale, k, overflow, st,
                         ok ? "ok" : "error");
            if (!ok) {
                break;
            }
            cr_assert_eq(s.cur_scale, r.cur_scale,
                         "trial %d (2^%d window %u hysteresis %u consecutive %d min %g), "
                         "update %d (overflow %d): scale %g, reference %g",
                         trial, power, window, hyst, consecutive, min_scale, k, overflow,
                         s.cur_scale, r.cur_scale);
        }
    }
}
