#define _GNU_SOURCE
#include "zs/config.h"

#include "zs/log.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One row of every parser type. */
typedef struct tcfg {
    uint64_t max_bytes;
    uint64_t linger_ns;
    int verbose;
    int mode;
    char *socket;
    char *token;
    char *label;
    int64_t workers;
    double ratio;
} tcfg_t;

static const char *const mode_names[] = {"fast", "safe", "paranoid", NULL};
static const zs_config_range_t workers_range = {1, 64};
static const zs_config_range_t ratio_range = {0.0, 1.0};

static const zs_config_row_t rows[] = {
    {"max_bytes", "512MiB", "largest shard", offsetof(tcfg_t, max_bytes), &zs_config_size, NULL, 0},
    {"linger", "10min", "keep a job this long", offsetof(tcfg_t, linger_ns), &zs_config_duration,
     NULL, ZS_CONFIG_RELOAD},
    {"verbose", "off", "chatty logs", offsetof(tcfg_t, verbose), &zs_config_bool, NULL, 0},
    {"mode", "safe", "checking mode", offsetof(tcfg_t, mode), &zs_config_enum, mode_names, 0},
    {"socket", "/run/zerod/zerod.sock", "control socket", offsetof(tcfg_t, socket), &zs_config_path,
     NULL, 0},
    {"token", "", "shared secret", offsetof(tcfg_t, token), &zs_config_string, NULL,
     ZS_CONFIG_SECRET},
    {"label", "", "free text", offsetof(tcfg_t, label), &zs_config_string, NULL, 0},
    {"workers", "4", "worker threads", offsetof(tcfg_t, workers), &zs_config_int, &workers_range,
     0},
    {"ratio", "0.5", "a fraction", offsetof(tcfg_t, ratio), &zs_config_double, &ratio_range, 0},
};

static const zs_config_table_t table = {"zerod", rows, ZS_ARRAY_SIZE(rows)};

static int n_warn;
static char last_warn[1024];

static void capture(zs_log_level_t level, zs_log_subsys_t sub, const char *line, void *arg)
{
    (void)sub;
    (void)arg;
    if (level == ZS_LOG_WARN) {
        n_warn++;
        snprintf(last_warn, sizeof(last_warn), "%s", line);
    }
}

static void setup(void)
{
    n_warn = 0;
    last_warn[0] = '\0';
    zs_log_set_sink(capture, NULL);
    zs_log_set_level(ZS_LOG_INFO);
    zs_log_set_subsys("all");
}

static void teardown(void)
{
    zs_log_set_sink(NULL, NULL);
}

TestSuite(zs_config, .init = setup, .fini = teardown);

static void init_cfg(tcfg_t *c)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    zs_status_t st;

    memset(c, 0xa5, sizeof(*c)); /* init must not read what was there */
    st = zs_config_init(&table, c, err, sizeof(err));
    cr_assert_eq(st, ZS_OK, "init: %s", err);
}

/* Write `text` to a fresh temporary file; the caller unlinks and frees the name. */
static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/zs_test_config_XXXXXX");
    int fd;
    size_t len = strlen(text);

    cr_assert_not_null(path);
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

/* Set key from a flag and expect status; on failure the message names the key and value. */
static void expect_set(tcfg_t *c, const char *key, const char *value, zs_status_t want)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    char want_prefix[256];
    zs_status_t st = zs_config_set(&table, c, key, value, ZS_CONFIG_SRC_FLAG, err, sizeof(err));

    cr_assert_eq(st, want, "%s=%s: got %s want %s (%s)", key, value, zs_status_name(st),
                 zs_status_name(want), err);
    if (want != ZS_OK) {
        snprintf(want_prefix, sizeof(want_prefix), "config key '%s' (from --", key);
        cr_assert(strncmp(err, want_prefix, strlen(want_prefix)) == 0, "%s", err);
        snprintf(want_prefix, sizeof(want_prefix), "invalid value '%s': ", value);
        cr_assert(strstr(err, want_prefix) != NULL, "%s", err);
    }
}

Test(zs_config, init_fills_every_default)
{
    tcfg_t c;

    init_cfg(&c);
    cr_assert_eq(c.max_bytes, 512ull << 20);
    cr_assert_eq(c.linger_ns, 600ull * 1000000000ull);
    cr_assert_eq(c.verbose, 0);
    cr_assert_eq(c.mode, 1);
    cr_assert_str_eq(c.socket, "/run/zerod/zerod.sock");
    cr_assert_str_eq(c.token, "");
    cr_assert_eq(c.workers, 4);
    cr_assert_float_eq(c.ratio, 0.5, 0.0);
    cr_assert_str_eq(zs_config_source_name(ZS_CONFIG_SRC_ENV), "env");
    zs_config_cleanup(&table, &c);
}

Test(zs_config, bad_default_fails_init_naming_key)
{
    static const zs_config_row_t bad_rows[] = {
        {"a", "x", "", 0, &zs_config_string, NULL, 0},
        {"b", "nope", "", sizeof(char *), &zs_config_bool, NULL, 0},
    };
    static const zs_config_table_t bad = {NULL, bad_rows, ZS_ARRAY_SIZE(bad_rows)};
    struct {
        char *a;
        int b;
    } obj;
    char err[ZS_CONFIG_ERRLEN] = "";

    cr_assert_eq(zs_config_init(&bad, &obj, err, sizeof(err)), ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'b' (from default): invalid value 'nope': expected "
                          "true/false, yes/no, on/off or 1/0");
    cr_assert_null(obj.a); /* released: nothing left to clean up */
}

Test(zs_config, size_accepts_good_forms)
{
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {
        {"512MiB", 512ull << 20},
        {"4k", 4096},
        {"4K", 4096},
        {"4KiB", 4096},
        {"1GB", 1000000000ull},
        {"1gb", 1000000000ull},
        {"1G", 1ull << 30},
        {"2TiB", 2ull << 40},
        {"3TB", 3000000000000ull},
        {"1PiB", 1ull << 50},
        {"123", 123},
        {"123B", 123},
        {"0", 0},
        {"5e8", 500000000ull},
        {"1.5KiB", 1536},
        {"0.5k", 512},
        {"1.1k", 1126}, /* 1126.4 rounded down */
        {" 1 GiB ", 1ull << 30},
        {"18446744073709551615", UINT64_MAX},
        {"0.0000000000000000000000000000000000000000001TiB", 0},
    };
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(good); i++) {
        uint64_t v = 0;
        cr_assert_eq(zs_parse_size(good[i].s, &v), ZS_OK, "%s", good[i].s);
        cr_assert_eq(v, good[i].v, "%s: %llu", good[i].s, (unsigned long long)v);
        expect_set(&c, "max_bytes", good[i].s, ZS_OK);
        cr_assert_eq(c.max_bytes, good[i].v, "%s", good[i].s);
    }
    zs_config_cleanup(&table, &c);
}

Test(zs_config, size_rejects_bad_forms_naming_key)
{
    static const char *const bad[] = {"",    "  ",  "-1",   "-1MiB", "12 parsecs", "1.2.3",
                                      "k",   "4kk", "0x10", "4 k b", "1EiB",       "nan",
                                      "inf", "+4k", "4k!",  "1e",    ".",          "4 MiB x"};
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(bad); i++) {
        uint64_t v = 7;
        cr_assert_eq(zs_parse_size(bad[i], &v), ZS_ERR_INVALID, "'%s'", bad[i]);
        cr_assert_eq(v, 7, "output written on failure");
        expect_set(&c, "max_bytes", bad[i], ZS_ERR_INVALID);
        cr_assert_eq(c.max_bytes, 512ull << 20);
    }
    zs_config_cleanup(&table, &c);
}

Test(zs_config, size_overflow_is_rejected)
{
    static const char *const big[] = {"18446744073709551616",
                                      "16384PiB",
                                      "1e20",
                                      "20000000TB",
                                      "99999999999999999999999999999999999999999999",
                                      "1e999999999"};
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(big); i++) {
        uint64_t v = 7;
        cr_assert_eq(zs_parse_size(big[i], &v), ZS_ERR_OVERFLOW, "%s", big[i]);
        cr_assert_eq(v, 7);
        expect_set(&c, "max_bytes", big[i], ZS_ERR_OVERFLOW);
    }
    cr_assert_eq(
        zs_config_set(&table, &c, "max_bytes", "16384PiB", ZS_CONFIG_SRC_ENV, err, sizeof(err)),
        ZS_ERR_OVERFLOW);
    cr_assert_str_eq(err, "config key 'max_bytes' (from ZEROD_MAX_BYTES): invalid value "
                          "'16384PiB': a size must be below 16EiB (2^64 bytes)");
    cr_assert_eq(c.max_bytes, 512ull << 20);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, duration_accepts_good_forms)
{
    static const struct {
        const char *s;
        uint64_t ns;
    } good[] = {
        {"60s", 60000000000ull},
        {"250ms", 250000000ull},
        {"10min", 600000000000ull},
        {"1h", 3600000000000ull},
        {"500us", 500000ull},
        {"2d", 172800000000000ull},
        {"5", 5000000000ull},
        {"1.5s", 1500000000ull},
        {"100ns", 100},
        {"1h30min", 5400000000000ull},
        {"1h 30min 5s", 5405000000000ull},
        {"0", 0},
        {"10 min", 600000000000ull},
        {"1w", 604800000000000ull},
        {"3\xc2\xb5s", 3000},
        {"2H", 7200000000000ull},
        {"1e3ms", 1000000000ull},
        {"0.5", 500000000ull},
    };
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(good); i++) {
        uint64_t v = 0;
        cr_assert_eq(zs_parse_duration(good[i].s, &v), ZS_OK, "%s", good[i].s);
        cr_assert_eq(v, good[i].ns, "%s: %llu", good[i].s, (unsigned long long)v);
        expect_set(&c, "linger", good[i].s, ZS_OK);
        cr_assert_eq(c.linger_ns, good[i].ns);
    }
    zs_config_cleanup(&table, &c);
}

Test(zs_config, duration_rejects_bad_forms_naming_key)
{
    static const char *const bad[] = {"",   "10 parsecs", "-1s", "1h30", "s",   "5x",
                                      ".s", "ms5",        "1h,", "1 2",  "nan", "1e"};
    static const char *const big[] = {"1000000d", "18446744073709551616ns", "584y"};
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(bad); i++) {
        uint64_t v = 7;
        cr_assert_eq(zs_parse_duration(bad[i], &v), ZS_ERR_INVALID, "'%s'", bad[i]);
        cr_assert_eq(v, 7);
        expect_set(&c, "linger", bad[i], ZS_ERR_INVALID);
        cr_assert_eq(c.linger_ns, 600000000000ull);
    }
    cr_assert_eq(zs_parse_duration(big[0], &(uint64_t){0}), ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_parse_duration(big[1], &(uint64_t){0}), ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_parse_duration(big[2], &(uint64_t){0}), ZS_ERR_INVALID);
    expect_set(&c, "linger", big[0], ZS_ERR_OVERFLOW);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, bool_accepts_all_spellings)
{
    static const char *const yes[] = {"true", "TRUE", "yes", "Yes", "on", "ON", "1", " on "};
    static const char *const no[] = {"false", "False", "no", "NO", "off", "Off", "0"};
    static const char *const bad[] = {"", "2", "y", "n", "onn", "truee", "enable", "-1"};
    tcfg_t c;

    init_cfg(&c);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(yes); i++) {
        c.verbose = 0;
        expect_set(&c, "verbose", yes[i], ZS_OK);
        cr_assert_eq(c.verbose, 1, "%s", yes[i]);
    }
    for (size_t i = 0; i < ZS_ARRAY_SIZE(no); i++) {
        c.verbose = 1;
        expect_set(&c, "verbose", no[i], ZS_OK);
        cr_assert_eq(c.verbose, 0, "%s", no[i]);
    }
    for (size_t i = 0; i < ZS_ARRAY_SIZE(bad); i++) {
        int b = 7;
        cr_assert_eq(zs_parse_bool(bad[i], &b), ZS_ERR_INVALID, "%s", bad[i]);
        cr_assert_eq(b, 7);
        expect_set(&c, "verbose", bad[i], ZS_ERR_INVALID);
        cr_assert_eq(c.verbose, 0);
    }
    zs_config_cleanup(&table, &c);
}

Test(zs_config, enum_accepts_names_and_lists_them_on_error)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    init_cfg(&c);
    expect_set(&c, "mode", "fast", ZS_OK);
    cr_assert_eq(c.mode, 0);
    expect_set(&c, "mode", "PARANOID", ZS_OK);
    cr_assert_eq(c.mode, 2);
    expect_set(&c, "mode", "", ZS_ERR_INVALID);
    expect_set(&c, "mode", "0", ZS_ERR_INVALID);
    cr_assert_eq(zs_config_set(&table, &c, "mode", "turbo", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'mode' (from --mode): invalid value 'turbo': expected one "
                          "of: fast, safe, paranoid");
    cr_assert_eq(c.mode, 2);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, path_must_be_non_empty)
{
    tcfg_t c;

    init_cfg(&c);
    expect_set(&c, "socket", "relative/dir/s.sock", ZS_OK);
    cr_assert_str_eq(c.socket, "relative/dir/s.sock");
    expect_set(&c, "socket", "/abs/s.sock", ZS_OK);
    cr_assert_str_eq(c.socket, "/abs/s.sock");
    expect_set(&c, "socket", "", ZS_ERR_INVALID);
    cr_assert_str_eq(c.socket, "/abs/s.sock");
    zs_config_cleanup(&table, &c);
}

Test(zs_config, string_takes_any_text)
{
    tcfg_t c;

    init_cfg(&c);
    expect_set(&c, "label", "hello world", ZS_OK);
    cr_assert_str_eq(c.label, "hello world");
    expect_set(&c, "label", "", ZS_OK);
    cr_assert_str_eq(c.label, "");
    zs_config_cleanup(&table, &c);
}

Test(zs_config, int_checks_form_range_and_overflow)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    init_cfg(&c);
    expect_set(&c, "workers", "64", ZS_OK);
    cr_assert_eq(c.workers, 64);
    expect_set(&c, "workers", "+1", ZS_OK);
    cr_assert_eq(c.workers, 1);
    expect_set(&c, "workers", " 8 ", ZS_OK);
    cr_assert_eq(c.workers, 8);
    expect_set(&c, "workers", "", ZS_ERR_INVALID);
    expect_set(&c, "workers", "12abc", ZS_ERR_INVALID);
    expect_set(&c, "workers", "1.5", ZS_ERR_INVALID);
    expect_set(&c, "workers", "0x10", ZS_ERR_INVALID);
    expect_set(&c, "workers", "-", ZS_ERR_INVALID);
    expect_set(&c, "workers", "0", ZS_ERR_INVALID);
    expect_set(&c, "workers", "65", ZS_ERR_INVALID);
    expect_set(&c, "workers", "99999999999999999999", ZS_ERR_OVERFLOW);
    expect_set(&c, "workers", "-99999999999999999999", ZS_ERR_OVERFLOW);
    cr_assert_eq(zs_config_set(&table, &c, "workers", "100", ZS_CONFIG_SRC_ENV, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'workers' (from ZEROD_WORKERS): invalid value '100': out of "
                          "range [1, 64]");
    cr_assert_eq(c.workers, 8);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, double_rejects_nan_inf_garbage_and_range)
{
    tcfg_t c;

    init_cfg(&c);
    expect_set(&c, "ratio", "0.25", ZS_OK);
    cr_assert_float_eq(c.ratio, 0.25, 0.0);
    expect_set(&c, "ratio", "1e-3", ZS_OK);
    cr_assert_float_eq(c.ratio, 1e-3, 0.0);
    expect_set(&c, "ratio", "1", ZS_OK);
    cr_assert_float_eq(c.ratio, 1.0, 0.0);
    expect_set(&c, "ratio", "nan", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "NaN", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "inf", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "0.5x", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "1.0000001", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "-0.1", ZS_ERR_INVALID);
    expect_set(&c, "ratio", "1e999", ZS_ERR_OVERFLOW);
    cr_assert_float_eq(c.ratio, 1.0, 0.0);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, set_accepts_dashes_and_rejects_unknown_keys)
{
    static const zs_config_row_t r[] = {
        {"job_linger", "1s", "", 0, &zs_config_duration, NULL, 0},
    };
    static const zs_config_table_t t = {NULL, r, 1};
    uint64_t v;
    char err[ZS_CONFIG_ERRLEN] = "";

    cr_assert_eq(zs_config_init(&t, &v, err, sizeof(err)), ZS_OK);
    cr_assert_eq(zs_config_find(&t, "job-linger"), &r[0]);
    cr_assert_null(zs_config_find(&t, "job"));
    cr_assert_eq(zs_config_set(&t, &v, "job-linger", "2s", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
                 ZS_OK);
    cr_assert_eq(v, 2000000000ull);
    cr_assert_eq(
        zs_config_set(&t, &v, "job-linger", "10 parsecs", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'job_linger' (from --job-linger): invalid value '10 "
                          "parsecs': expected a duration such as 60s, 250ms, 10min");
    cr_assert_eq(zs_config_set(&t, &v, "nope", "1", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
                 ZS_ERR_NOT_FOUND);
    cr_assert_str_eq(err, "unknown config key 'nope' (from --nope)");
    cr_assert_eq(v, 2000000000ull);
}

Test(zs_config, set_failure_keeps_old_value)
{
    tcfg_t c;
    char *before;

    init_cfg(&c);
    expect_set(&c, "socket", "/a/b", ZS_OK);
    before = c.socket;
    expect_set(&c, "socket", "", ZS_ERR_INVALID);
    cr_assert_eq(c.socket, before, "pointer replaced on failure");
    cr_assert_str_eq(c.socket, "/a/b");
    expect_set(&c, "max_bytes", "1GiB", ZS_OK);
    expect_set(&c, "max_bytes", "1GiBx", ZS_ERR_INVALID);
    expect_set(&c, "max_bytes", "99999PiB", ZS_ERR_OVERFLOW);
    cr_assert_eq(c.max_bytes, 1ull << 30);
    expect_set(&c, "ratio", "0.75", ZS_OK);
    expect_set(&c, "ratio", "nan", ZS_ERR_INVALID);
    cr_assert_float_eq(c.ratio, 0.75, 0.0);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, precedence_is_file_then_env_then_flag)
{
    char *path = write_tmp("# test config\n"
                           "max_bytes = 1GiB\n"
                           "[zerod]\n"
                           "linger = 1h\n"
                           "workers = 2\n"
                           "label = from-file\n");
    char *envp[] = {"HOME=/root", "ZEROD_LINGER=30s", "ZEROD_WORKERS=3", "PATH=/bin", NULL};
    const zs_config_flag_t flags[] = {{"--workers", "5"}, {"mode=fast", NULL}};
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;
    zs_status_t st;

    memset(&c, 0, sizeof(c));
    st =
        zs_config_load(&table, &c, path, envp, NULL, flags, ZS_ARRAY_SIZE(flags), err, sizeof(err));
    cr_assert_eq(st, ZS_OK, "%s", err);
    cr_assert_eq(c.max_bytes, 1ull << 30);               /* file */
    cr_assert_eq(c.linger_ns, 30000000000ull);           /* file < env */
    cr_assert_eq(c.workers, 5);                          /* file < env < flag */
    cr_assert_eq(c.mode, 0);                             /* flag */
    cr_assert_str_eq(c.label, "from-file");              /* file */
    cr_assert_str_eq(c.socket, "/run/zerod/zerod.sock"); /* default */
    cr_assert_eq(n_warn, 0, "%s", last_warn);
    zs_config_cleanup(&table, &c);
    unlink(path);
    free(path);
}

Test(zs_config, unknown_env_variable_warns_once_each)
{
    char *envp[] = {
        "ZEROD_FOO=1",     "ZEROD_LOG_LEVEL=debug", "ZEROD_WORKERS=7",   "ZEROD_BAR_BAZ=x",
        "ZEROD_workers=9", "NOT_ZEROD_FOO=1",       "ZEROD_VERBOSE=yes", NULL};
    const char *const ignore[] = {"LOG_LEVEL", "LOG_SUBSYS", NULL};
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    init_cfg(&c);
    cr_assert_eq(zs_config_load_env(&table, &c, envp, ignore, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(n_warn, 3, "%d warnings, last: %s", n_warn, last_warn);
    cr_assert(strstr(last_warn, "unknown environment variable ZEROD_workers") != NULL, "%s",
              last_warn);
    cr_assert_eq(c.workers, 7);
    cr_assert_eq(c.verbose, 1);

    n_warn = 0;
    char *one[] = {"ZEROD_FOO=1", NULL};
    cr_assert_eq(zs_config_load_env(&table, &c, one, NULL, err, sizeof(err)), ZS_OK);
    cr_assert_eq(n_warn, 1);
    cr_assert(strstr(last_warn, "WARN") != NULL, "%s", last_warn);
    cr_assert(strstr(last_warn, "unknown environment variable ZEROD_FOO ") != NULL, "%s",
              last_warn);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, bad_env_value_names_variable)
{
    char *envp[] = {"ZEROD_LINGER=10 parsecs", NULL};
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    memset(&c, 0, sizeof(c));
    cr_assert_eq(zs_config_load(&table, &c, NULL, envp, NULL, NULL, 0, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'linger' (from ZEROD_LINGER): invalid value '10 parsecs': "
                          "expected a duration such as 60s, 250ms, 10min");
    cr_assert_null(c.socket, "failed load must leave nothing to clean up");
    cr_assert_eq(n_warn, 0, "%s", last_warn);
}

Test(zs_config, bad_flag_names_flag)
{
    const zs_config_flag_t bad_value[] = {{"max-bytes", "-4k"}};
    const zs_config_flag_t unknown[] = {{"--max-byte", "4k"}};
    const zs_config_flag_t no_value[] = {{"--verbose", NULL}};
    char *envp[] = {NULL};
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    cr_assert_eq(zs_config_load(&table, &c, NULL, envp, NULL, bad_value, 1, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'max_bytes' (from --max-bytes): invalid value '-4k': a "
                          "size cannot be negative");
    cr_assert_eq(zs_config_load(&table, &c, NULL, envp, NULL, unknown, 1, err, sizeof(err)),
                 ZS_ERR_NOT_FOUND);
    cr_assert_str_eq(err, "unknown config key 'max-byte' (from --max-byte)");
    cr_assert_eq(zs_config_load(&table, &c, NULL, envp, NULL, no_value, 1, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'verbose' (from --verbose): missing value");
    cr_assert_eq(n_warn, 0, "%s", last_warn);
}

static zs_status_t load_text(const char *text, tcfg_t *c, char *err, char **path_p)
{
    char *path = write_tmp(text);
    zs_status_t st;

    init_cfg(c);
    st = zs_config_load_file(&table, c, path, err, ZS_CONFIG_ERRLEN);
    unlink(path);
    *path_p = path;
    return st;
}

static void expect_file_error(const char *text, zs_status_t want, const char *want_fmt)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    char want_msg[ZS_CONFIG_ERRLEN];
    char *path = NULL;
    tcfg_t c;

    cr_assert_eq(load_text(text, &c, err, &path), want, "%s", err);
    snprintf(want_msg, sizeof(want_msg), want_fmt, path);
    cr_assert_str_eq(err, want_msg);
    zs_config_cleanup(&table, &c);
    free(path);
}

Test(zs_config, unknown_key_in_file_names_file_line_and_key)
{
    expect_file_error("workers = 2\n\nfoo = 1\nverbose = on\n", ZS_ERR_CONFIG,
                      "%s:3: unknown config key 'foo'");
}

Test(zs_config, file_errors_name_file_and_line)
{
    expect_file_error("; c\nlinger = 10 parsecs\n", ZS_ERR_INVALID,
                      "config key 'linger' (from %s:2): invalid value '10 parsecs': expected a "
                      "duration such as 60s, 250ms, 10min");
    expect_file_error("workers = 2\n[other]\nworkers = 3\n", ZS_ERR_CONFIG,
                      "%s:3: unknown section '[other]' (key 'workers')");
    expect_file_error("workers = 2\njust words\n", ZS_ERR_CONFIG,
                      "%s:2: expected 'key = value' or '[section]'");
    expect_file_error("[zerod\nworkers = 2\n", ZS_ERR_CONFIG, "%s:1: unterminated section header");
    expect_file_error("max_bytes = 99999999PiB\n", ZS_ERR_OVERFLOW,
                      "config key 'max_bytes' (from %s:1): invalid value '99999999PiB': a size "
                      "must be below 16EiB (2^64 bytes)");
    expect_file_error("socket =\n", ZS_ERR_INVALID,
                      "config key 'socket' (from %s:1): invalid value '': expected a non-empty "
                      "path");
}

Test(zs_config, overlong_file_line_is_an_error)
{
    char text[400];

    snprintf(text, sizeof(text), "workers = 2\nlabel = %0300d\n", 1);
    expect_file_error(text, ZS_ERR_CONFIG, "%s:2: line too long (at most 197 characters)");
}

Test(zs_config, file_accepts_comments_indent_and_sections)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    char *path = NULL;
    tcfg_t c;

    cr_assert_eq(load_text("\xef\xbb\xbf# leading comment\n"
                           "; another\n"
                           "  workers = 9   # trailing comment\n"
                           "\tverbose: yes ; inih comment\n"
                           "\n"
                           "[zerod]\n"
                           "    job-x = 1\n",
                           &c, err, &path),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, ":7: unknown config key 'job-x'") != NULL, "%s", err);
    cr_assert_eq(c.workers, 9);
    cr_assert_eq(c.verbose, 1);
    free(path);
    zs_config_cleanup(&table, &c);

    cr_assert_eq(load_text("[zerod]\nmax-bytes = 2k\nlabel = a#b\n", &c, err, &path), ZS_OK, "%s",
                 err);
    cr_assert_eq(c.max_bytes, 2048);
    cr_assert_str_eq(c.label, "a#b");
    free(path);
    zs_config_cleanup(&table, &c);
}

Test(zs_config, missing_file_is_not_found)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    tcfg_t c;

    init_cfg(&c);
    cr_assert_eq(zs_config_load_file(&table, &c, "/nonexistent/zerod.conf", err, sizeof(err)),
                 ZS_ERR_NOT_FOUND);
    cr_assert(strstr(err, "/nonexistent/zerod.conf") != NULL, "%s", err);
    zs_config_cleanup(&table, &c);
}

static void set_unusual_values(tcfg_t *c)
{
    expect_set(c, "max_bytes", "1536", ZS_OK);
    expect_set(c, "linger", "1h30min", ZS_OK);
    expect_set(c, "verbose", "yes", ZS_OK);
    expect_set(c, "mode", "paranoid", ZS_OK);
    expect_set(c, "socket", "rel/zerod.sock", ZS_OK);
    expect_set(c, "token", "s3cret", ZS_OK);
    expect_set(c, "label", "two words", ZS_OK);
    expect_set(c, "workers", "63", ZS_OK);
    expect_set(c, "ratio", "0.1", ZS_OK);
}

static void assert_same(const tcfg_t *a, const tcfg_t *b)
{
    cr_assert_eq(a->max_bytes, b->max_bytes);
    cr_assert_eq(a->linger_ns, b->linger_ns);
    cr_assert_eq(a->verbose, b->verbose);
    cr_assert_eq(a->mode, b->mode);
    cr_assert_str_eq(a->socket, b->socket);
    cr_assert_str_eq(a->label, b->label);
    cr_assert_eq(a->workers, b->workers);
    cr_assert(a->ratio == b->ratio, "%.17g != %.17g", a->ratio, b->ratio); /* bit-exact */
}

Test(zs_config, format_round_trips_every_type)
{
    static const struct {
        const char *key;
        const char *value;
        const char *formatted;
    } cases[] = {
        {"max_bytes", "512MiB", "512MiB"},
        {"max_bytes", "1.5KiB", "1536"}, /* no binary unit divides it */
        {"max_bytes", "3072KiB", "3MiB"},
        {"max_bytes", "1GB", "1000000000"},
        {"max_bytes", "0", "0"},
        {"max_bytes", "18446744073709551615", "18446744073709551615"},
        {"linger", "90min", "90min"},
        {"linger", "1.5s", "1500ms"},
        {"linger", "2d", "2d"},
        {"linger", "0", "0"},
        {"linger", "18446744073709551615ns", "18446744073709551615ns"},
        {"verbose", "on", "true"},
        {"mode", "FAST", "fast"},
        {"socket", "/x y/z", "/x y/z"},
        {"label", "", ""},
        {"workers", "+07", "7"},
        {"ratio", "0.1", "0.1"},
        {"ratio", "0.30000000000000004", "0.30000000000000004"},
        {"ratio", "1e-300", "1e-300"},
        {"token", "s3cret", "<hidden>"},
    };
    char buf[256];
    tcfg_t a;
    tcfg_t b;

    init_cfg(&a);
    init_cfg(&b);
    for (size_t i = 0; i < ZS_ARRAY_SIZE(cases); i++) {
        const zs_config_row_t *row = zs_config_find(&table, cases[i].key);
        expect_set(&a, cases[i].key, cases[i].value, ZS_OK);
        zs_config_format(&table, &a, cases[i].key, buf, sizeof(buf));
        cr_assert_str_eq(buf, cases[i].formatted, "%s", cases[i].value);
        if (row->flags & ZS_CONFIG_SECRET) {
            continue;
        }
        /* the row's own formatter reads back to the same field */
        row->parser->format(row, (const char *)&a + row->offset, buf, sizeof(buf));
        expect_set(&b, cases[i].key, buf, ZS_OK);
        assert_same(&a, &b);
    }
    zs_config_format(&table, &a, "no_such_key", buf, sizeof(buf));
    cr_assert_str_eq(buf, "");
    zs_config_cleanup(&table, &a);
    zs_config_cleanup(&table, &b);
}

Test(zs_config, print_hides_secrets_aligns_and_loads_back)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    char err[ZS_CONFIG_ERRLEN] = "";
    char *path;
    long hash_col = -1;
    tcfg_t a;
    tcfg_t b;

    cr_assert_not_null(out);
    init_cfg(&a);
    set_unusual_values(&a);
    zs_config_print(&table, &a, out);
    fclose(out);

    cr_assert(strstr(text, "s3cret") == NULL, "%s", text);
    cr_assert(strstr(text, "token     = <hidden>") != NULL, "%s", text);
    cr_assert(strstr(text, "max_bytes = 1536") != NULL, "%s", text);
    cr_assert(strstr(text, "linger    = 90min") != NULL, "%s", text);
    for (const char *line = text; *line != '\0'; line = strchr(line, '\n') + 1) {
        const char *eq = strchr(line, '=');
        const char *hash = strstr(line, "  # ");
        cr_assert_eq(eq - line, 10, "'=' not aligned: %s", line);
        cr_assert_not_null(hash, "%s", line);
        if (hash_col < 0) {
            hash_col = hash - line;
        }
        cr_assert_eq(hash - line, hash_col, "'#' not aligned: %s", line);
    }

    path = write_tmp(text);
    init_cfg(&b);
    cr_assert_eq(zs_config_load_file(&table, &b, path, err, sizeof(err)), ZS_OK, "%s\n%s", err,
                 text);
    assert_same(&a, &b);
    cr_assert_str_eq(b.token, "<hidden>"); /* secrets do not survive printing */
    unlink(path);
    free(path);
    free(text);
    zs_config_cleanup(&table, &a);
    zs_config_cleanup(&table, &b);
}

/* A parser defined outside config.c: a fixed char[8] field, lower-case letters only. */
static zs_status_t word_parse(const zs_config_row_t *row, const char *value, void *field, char *err,
                              size_t errlen)
{
    (void)row;
    size_t n = strlen(value);

    if (n == 0 || n >= 8 || strspn(value, "abcdefghijklmnopqrstuvwxyz") != n) {
        snprintf(err, errlen, "expected a short lower-case word");
        return ZS_ERR_INVALID;
    }
    memcpy(field, value, n + 1);
    return ZS_OK;
}

static void word_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    (void)row;
    snprintf(buf, len, "%s", (const char *)field);
}

static const zs_config_parser_t word_parser = {"word", word_parse, word_format, NULL};

Test(zs_config, custom_parser_keeps_old_value_on_failure)
{
    static const zs_config_row_t r[] = {
        {"word", "abc", "", 0, &word_parser, NULL, 0},
    };
    static const zs_config_table_t t = {NULL, r, 1};
    char field[8];
    char err[ZS_CONFIG_ERRLEN] = "";
    char buf[16];

    cr_assert_eq(zs_config_init(&t, field, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_str_eq(field, "abc");
    cr_assert_eq(zs_config_set(&t, field, "word", "Nope", ZS_CONFIG_SRC_ENV, err, sizeof(err)),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'word' (from ZEROD_WORD): invalid value 'Nope': expected a "
                          "short lower-case word");
    cr_assert_str_eq(field, "abc");
    cr_assert_eq(zs_config_set(&t, field, "word", "xyz", ZS_CONFIG_SRC_ENV, err, sizeof(err)),
                 ZS_OK);
    zs_config_format(&t, field, "word", buf, sizeof(buf));
    cr_assert_str_eq(buf, "xyz");
    zs_config_cleanup(&t, field);
}

/* Sizes and durations take a range too; the message prints its bounds in the row's form. */
typedef struct rcfg {
    uint64_t bytes;
    uint64_t timeout_ns;
} rcfg_t;

static const zs_config_range_t bytes_range = {1 << 20, 1ull << 40};
static const zs_config_range_t timeout_range = {100e6, 3600e9};
static const zs_config_row_t ranged_rows[] = {
    {"bytes", "1GiB", "a bounded size", offsetof(rcfg_t, bytes), &zs_config_size, &bytes_range, 0},
    {"timeout", "10s", "a bounded duration", offsetof(rcfg_t, timeout_ns), &zs_config_duration,
     &timeout_range, 0},
};
static const zs_config_table_t ranged_table = {NULL, ranged_rows, ZS_ARRAY_SIZE(ranged_rows)};

Test(zs_config, size_and_duration_ranges_name_their_bounds)
{
    char err[ZS_CONFIG_ERRLEN] = "";
    rcfg_t c;

    cr_assert_eq(zs_config_init(&ranged_table, &c, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "bytes", "0", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'bytes' (from --bytes): invalid value '0': out of range "
                          "[1MiB, 1TiB]");
    cr_assert_eq(c.bytes, 1ull << 30, "a refused value keeps the old one");
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "bytes", "2TiB", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_ERR_INVALID);
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "bytes", "1MiB", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_OK, "%s", err);
    cr_assert_eq(c.bytes, 1u << 20);
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "timeout", "0", ZS_CONFIG_SRC_ENV, err, sizeof(err)),
        ZS_ERR_INVALID);
    cr_assert_str_eq(err, "config key 'timeout' (from ZEROD_TIMEOUT): invalid value '0': out of "
                          "range [100ms, 1h]");
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "timeout", "99ms", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_ERR_INVALID);
    cr_assert_eq(
        zs_config_set(&ranged_table, &c, "timeout", "1h", ZS_CONFIG_SRC_FLAG, err, sizeof(err)),
        ZS_OK, "%s", err);
    cr_assert_eq(c.timeout_ns, 3600ull * 1000000000ull);
    zs_config_cleanup(&ranged_table, &c);
}

Test(zs_config, allowed_values_are_written_in_each_rows_own_form)
{
    static const zs_config_range_t linger_range = {1e8, 3.6e12};
    static const zs_config_row_t linger = {"linger",      "10s", "", 0, &zs_config_duration,
                                           &linger_range, 0};
    char buf[128];

    zs_config_allowed(&linger, buf, sizeof(buf));
    cr_assert_str_eq(buf, "[100ms, 1h]");
    zs_config_allowed(&rows[7], buf, sizeof(buf)); /* workers */
    cr_assert_str_eq(buf, "[1, 64]");
    zs_config_allowed(&rows[8], buf, sizeof(buf)); /* ratio */
    cr_assert_str_eq(buf, "[0, 1]");
    zs_config_allowed(&rows[3], buf, sizeof(buf)); /* mode */
    cr_assert_str_eq(buf, "fast | safe | paranoid");
    zs_config_allowed(&rows[0], buf, sizeof(buf)); /* a size without a range */
    cr_assert_str_eq(buf, "");
    zs_config_allowed(&rows[3], buf, 8); /* cut short, still a string */
    cr_assert_str_eq(buf, "fast | ");
}
