#include "zs/log.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static char last_line[4096];
static int n_lines;

static void capture(zs_log_level_t level, zs_log_subsys_t sub, const char *line, void *arg)
{
    (void)level;
    (void)sub;
    (void)arg;
    snprintf(last_line, sizeof(last_line), "%s", line);
    n_lines++;
}

static void setup(void)
{
    n_lines = 0;
    last_line[0] = '\0';
    zs_log_set_sink(capture, NULL);
    zs_log_set_level(ZS_LOG_INFO);
    zs_log_set_subsys("all");
    zs_log_set_rank(-1);
    zs_log_set_journal(0);
    zs_log_reset_counts();
}

static void teardown(void)
{
    zs_log_set_sink(NULL, NULL);
}

TestSuite(zs_log, .init = setup, .fini = teardown);

Test(zs_log, honours_level)
{
    zs_debug(ZS_SUB_IPC, "hidden %d", 1);
    cr_assert_eq(n_lines, 0);
    zs_info(ZS_SUB_IPC, "shown %d", 2);
    cr_assert_eq(n_lines, 1);
    cr_assert(strstr(last_line, "INFO test_log.c:") != NULL, "%s", last_line);
    cr_assert(strstr(last_line, "shown 2") != NULL);
    zs_log_set_level(ZS_LOG_TRACE);
    zs_trace(ZS_SUB_IPC, "now shown");
    cr_assert_eq(n_lines, 2);
    zs_log_set_level(ZS_LOG_ERROR);
    zs_warn(ZS_SUB_IPC, "hidden");
    cr_assert_eq(n_lines, 2);
    cr_assert_eq(zs_log_count(ZS_LOG_WARN), 0);
    cr_assert_eq(zs_log_count(ZS_LOG_INFO), 1);
}

Test(zs_log, honours_subsystem_filter_but_always_shows_errors)
{
    cr_assert_eq(zs_log_set_subsys("mesh,coll"), 0);
    zs_info(ZS_SUB_IPC, "hidden");
    cr_assert_eq(n_lines, 0);
    zs_info(ZS_SUB_MESH, "shown");
    zs_warn(ZS_SUB_COLL, "shown");
    cr_assert_eq(n_lines, 2);
    zs_error(ZS_SUB_IPC, "errors always pass");
    cr_assert_eq(n_lines, 3);
    cr_assert_eq(zs_log_count(ZS_LOG_ERROR), 1);
    cr_assert_eq(zs_log_set_subsys("mesh,bogus"), -1);
    zs_info(ZS_SUB_MESH, "filter unchanged after a bad list");
    cr_assert_eq(n_lines, 4);
}

Test(zs_log, prefix_has_rank_and_journal_priority)
{
    zs_log_set_rank(3);
    zs_warn(ZS_SUB_IPC, "peer closed");
    cr_assert(strstr(last_line, " [rank 3] WARN test_log.c:") != NULL, "%s", last_line);
    zs_log_set_journal(1);
    zs_warn(ZS_SUB_IPC, "peer closed");
    cr_assert_eq(strncmp(last_line, "<4>", 3), 0, "%s", last_line);
    zs_error(ZS_SUB_IPC, "x");
    cr_assert_eq(strncmp(last_line, "<3>", 3), 0, "%s", last_line);
}

Test(zs_log, percent_m_prints_errno)
{
    errno = ENOENT;
    zs_info(ZS_SUB_MAIN, "open: %m");
    cr_assert(strstr(last_line, "No such file or directory") != NULL, "%s", last_line);
}

Test(zs_log, reads_level_and_subsystems_from_env)
{
    setenv("ZEROD_LOG_LEVEL", "debug", 1);
    setenv("ZEROD_LOG_SUBSYS", "engine", 1);
    zs_log_init_from_env();
    cr_assert_eq(zs_log_get_level(), ZS_LOG_DEBUG);
    zs_debug(ZS_SUB_ENGINE, "shown");
    zs_debug(ZS_SUB_IPC, "hidden");
    cr_assert_eq(n_lines, 1);
    setenv("ZEROD_LOG_LEVEL", "loud", 1);
    zs_log_init_from_env();
    cr_assert_eq(zs_log_get_level(), ZS_LOG_DEBUG, "a bad level keeps the previous one");
    unsetenv("ZEROD_LOG_LEVEL");
    unsetenv("ZEROD_LOG_SUBSYS");
}

Test(zs_log, control_characters_cannot_forge_a_line)
{
    const char *job = "a\nINFO forged line\r\x01\x7f\tz";

    zs_warn(ZS_SUB_ENGINE, "attach of job '%s' refused", job);
    cr_assert_eq(n_lines, 1);
    cr_assert_null(strchr(last_line, '\n'), "%s", last_line);
    cr_assert_null(strchr(last_line, '\r'), "%s", last_line);
    cr_assert(strstr(last_line, "job 'a\\nINFO forged line\\r\\x01\\x7f\\tz' refused") != NULL,
              "%s", last_line);
}

Test(zs_log, rate_limited_warnings_count_what_was_suppressed)
{
    zs_ratelimit_t rl = ZS_RATELIMIT_INIT(60ull * 1000000000ull, 3);

    for (int i = 0; i < 10; i++) {
        zs_warn_limited(&rl, ZS_SUB_IPC, "bad frame %d", i);
    }
    cr_assert_eq(n_lines, 3, "a burst of 3, then silence: %d lines", n_lines);
    cr_assert(strstr(last_line, "bad frame 2") != NULL, "%s", last_line);
    /* the next interval: first a line counting the 7 suppressed, then the message */
    rl.begin_ns -= rl.interval_ns;
    zs_warn_limited(&rl, ZS_SUB_IPC, "bad frame %d", 10);
    cr_assert_eq(n_lines, 5);
    cr_assert(strstr(last_line, "bad frame 10") != NULL, "%s", last_line);
    rl.begin_ns -= rl.interval_ns;
    n_lines = 0;
    zs_warn_limited(&rl, ZS_SUB_IPC, "bad frame %d", 11);
    cr_assert_eq(n_lines, 1, "nothing was suppressed: no count line");
}

static char all_lines[8][4096];
static int n_all;

static void capture_all(zs_log_level_t level, zs_log_subsys_t sub, const char *line, void *arg)
{
    (void)level;
    (void)sub;
    (void)arg;
    if (n_all < 8) {
        snprintf(all_lines[n_all], sizeof(all_lines[0]), "%s", line);
    }
    n_all++;
}

Test(zs_log, suppressed_count_line_names_the_number)
{
    zs_ratelimit_t rl = ZS_RATELIMIT_INIT(60ull * 1000000000ull, 1);

    zs_warn_limited(&rl, ZS_SUB_IPC, "first");
    for (int i = 0; i < 41; i++) {
        zs_warn_limited(&rl, ZS_SUB_IPC, "again");
    }
    cr_assert_eq(n_lines, 1);
    rl.begin_ns -= rl.interval_ns;
    n_all = 0;
    zs_log_set_sink(capture_all, NULL);
    zs_warn_limited(&rl, ZS_SUB_IPC, "later");
    cr_assert_eq(n_all, 2);
    cr_assert(strstr(all_lines[0], "WARN test_log.c:") != NULL, "%s", all_lines[0]);
    cr_assert(strstr(all_lines[0], "41 similar warnings suppressed (at most 1 per 60 s)") != NULL,
              "%s", all_lines[0]);
    cr_assert(strstr(all_lines[1], "later") != NULL, "%s", all_lines[1]);
}
