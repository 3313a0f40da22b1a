/*
 * Helpers of the daemon's unit tests: the log check (a test fails on a WARN or ERROR it did not
 * expect).
 *
 * Criterion ignores a failure in a suite's .fini, and the log sink runs under the log's lock
 * (no assertion may jump out of it), so the sink only records, and ZDT_TEST(suite, name) is a
 * Test whose body is followed by the check: any ERROR, or a WARN that holds none of the
 * needles given to zdt_expect_warn(), fails the test; so does an expected WARN that never came.
 */
#ifndef ZD_TEST_H
#define ZD_TEST_H

#include "zs/log.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define ZDT_MAX_EXPECT 8

static char zdt_expected[ZDT_MAX_EXPECT][128];
static int zdt_expected_seen[ZDT_MAX_EXPECT];
static int zdt_n_expected;
static int zdt_n_unexpected;
static char zdt_unexpected[1024];

/* Called under the log's lock, from whichever thread logs. */
static void zdt_log_sink(zs_log_level_t level, zs_log_subsys_t sub, const char *line, void *arg)
{
    (void)sub;
    (void)arg;
    if (level > ZS_LOG_WARN) {
        return;
    }
    for (int i = 0; level == ZS_LOG_WARN && i < zdt_n_expected; i++) {
        if (strstr(line, zdt_expected[i]) != NULL) {
            zdt_expected_seen[i]++;
            return;
        }
    }
    if (zdt_n_unexpected++ == 0) {
        snprintf(zdt_unexpected, sizeof(zdt_unexpected), "%s", line);
    }
}

/* A WARN holding `needle` must come (any number of times) before the test ends. */
static inline void zdt_expect_warn(const char *needle)
{
    cr_assert_lt(zdt_n_expected, ZDT_MAX_EXPECT);
    cr_assert_lt(strlen(needle), sizeof(zdt_expected[0]));
    zdt_expected_seen[zdt_n_expected] = 0;
    snprintf(zdt_expected[zdt_n_expected++], sizeof(zdt_expected[0]), "%s", needle);
}

/* How many WARN lines held `needle` so far. */
static inline int zdt_warned(const char *needle)
{
    for (int i = 0; i < zdt_n_expected; i++) {
        if (strcmp(zdt_expected[i], needle) == 0) {
            return zdt_expected_seen[i];
        }
    }
    return 0;
}

static inline void zdt_log_begin(void)
{
    zdt_n_expected = 0;
    zdt_n_unexpected = 0;
    zdt_unexpected[0] = '\0';
    zs_log_set_level(ZS_LOG_INFO);
    zs_log_set_subsys("all");
    zs_log_set_sink(zdt_log_sink, NULL);
}

static inline void zdt_log_end(void)
{
    zs_log_set_sink(NULL, NULL);
    cr_assert_eq(zdt_n_unexpected, 0, "%d unexpected WARN/ERROR lines, the first: %s",
                 zdt_n_unexpected, zdt_unexpected);
    for (int i = 0; i < zdt_n_expected; i++) {
        cr_assert_gt(zdt_expected_seen[i], 0, "no WARN holding '%s' came", zdt_expected[i]);
    }
}

/* Test(suite, name) with the log checked after its body. */
#define ZDT_TEST(suite, name)                                                                      \
    static void suite##_##name##_body(void);                                                       \
    Test(suite, name)                                                                              \
    {                                                                                              \
        zdt_log_begin();                                                                           \
        suite##_##name##_body();                                                                   \
        zdt_log_end();                                                                             \
    }                                                                                              \
    static void suite##_##name##_body(void)

#endif
