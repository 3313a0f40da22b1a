/*
 * Config tables: see zs/config.h.
 *
 * Value forms (all parsers trim surrounding blanks except path and string):
 *   size      <number>[ ][unit], unit case-insensitive: B; K/KiB, M/MiB, G/GiB, T/TiB, P/PiB are
 *             1024-based; KB/MB/GB/TB/PB are 1000-based. The number may have a fraction or an
 *             exponent (1.5GiB, 5e8); a fractional byte count is rounded down. No sign.
 *   duration  one or more <number><unit> (1h30min), unit ns, us/µs, ms, s/sec, m/min, h/hr,
 *             d/day/days, w (case-insensitive); a bare number is seconds. Stored as nanoseconds.
 *   bool      true/false, yes/no, on/off, 1/0 (case-insensitive).
 *   enum      one of the row's names (case-insensitive); stored as the index.
 *   path      any non-empty text, absolute or relative. string: any text, empty allowed.
 *   int       decimal int64 with optional sign; double: finite number. Both checked against
 *             the row's optional zs_config_range_t.
 * Every parser but string rejects an empty value. Overflow of the storage type returns
 * ZS_ERR_OVERFLOW, any other bad value ZS_ERR_INVALID. format() prints a form parse() reads back
 * to the same value.
 *
 * Statuses of the table calls: a bad value returns the parser's status; an unknown key given to
 * zs_config_set() or as a flag returns ZS_ERR_NOT_FOUND; a syntax error, an unknown key or an
 * unknown section in a file returns ZS_ERR_CONFIG; a file that cannot be opened returns
 * ZS_ERR_NOT_FOUND (ENOENT) or ZS_ERR_IO.
 *
 * zs_config_load() starts with zs_config_init(), so obj must not hold values yet; on failure it
 * holds nothing (no cleanup needed), on success the caller owes zs_config_cleanup(). A reload
 * therefore loads into a fresh struct and swaps it in whole.
 *
 * In files, besides inih's `;` comments, `#` starts a comment at the start of a line or after a
 * blank, so that zs_config_print() output loads back. Lines may be indented (inih's multi-line
 * continuation is not used); a line holds at most 197 characters (inih's buffer). Environment
 * names match the key upper-cased exactly (ZEROD_JOB_LINGER); flag names may carry leading dashes
 * and `=value`. A failed zs_config_set() leaves the old value in place; a secret's value is never
 * echoed in an error. A parser defined outside this file gets its field validated in a 256-byte
 * scratch first, so its field must not be larger.
 */
#define _GNU_SOURCE
#include "zs/config.h"

#include "zs/error.h"
#include "zs/log.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

extern char **environ;

#define ZS_CONFIG_ENV_PREFIX "ZEROD_"
#define ZS_CONFIG_NAME_MAX   128
/* Scratch for validating a value before the field is touched; a custom parser's field must fit. */
#define ZS_CONFIG_FIELD_MAX  256
#define ZS_CONFIG_REASON_LEN 256

typedef unsigned __int128 zs_u128_t;

#define ZS_U128_MAX (~(zs_u128_t)0)

/* ------------------------------------------------------------------------------------------ */
/* Numbers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int zs_is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Copy s without surrounding blanks into buf; -1 if it does not fit. */
static int zs_trim_copy(const char *s, char *buf, size_t len)
{
    size_t n;

    while (zs_is_blank(*s)) {
        s++;
    }
    n = strlen(s);
    while (n > 0 && zs_is_blank(s[n - 1])) {
        n--;
    }
    if (n >= len) {
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    return 0;
}

/* Unsigned decimal `digits[.digits][e[+-]digits]` as D * 10^E. Digits beyond the 128-bit range
 * are dropped (far below the precision of a 64-bit result). Returns the end, or NULL when there
 * is no digit. */
static const char *zs_parse_decimal(const char *s, zs_u128_t *d_p, long *e_p)
{
    zs_u128_t d = 0;
    long e = 0;
    int ndigits = 0;

    for (; isdigit((unsigned char)*s); s++, ndigits++) {
        if (d <= (ZS_U128_MAX - 9) / 10) {
            d = d * 10 + (zs_u128_t)(*s - '0');
        } else {
            e++;
        }
    }
    if (*s == '.') {
        for (s++; isdigit((unsigned char)*s); s++, ndigits++) {
            if (d <= (ZS_U128_MAX - 9) / 10) {
                d = d * 10 + (zs_u128_t)(*s - '0');
                e--;
            }
        }
    }
    if (ndigits == 0) {
        return NULL;
    }
    if (*s == 'e' || *s == 'E') {
        const char *p = s + 1;
        int neg = 0;
        long x = 0;

        if (*p == '+' || *p == '-') {
            neg = (*p == '-');
            p++;
        }
        if (isdigit((unsigned char)*p)) {
            for (; isdigit((unsigned char)*p); p++) {
                if (x < 100000) {
                    x = x * 10 + (*p - '0');
                }
            }
            e += neg ? -x : x;
            s = p;
        }
    }
    *d_p = d;
    *e_p = e;
    return s;
}

/* floor(d * 10^e * mult) into a uint64_t. */
static zs_status_t zs_scale_u64(zs_u128_t d, long e, uint64_t mult, uint64_t *v_p)
{
    zs_u128_t v;
    zs_u128_t p10 = 1;

    if (d == 0 || mult == 0) {
        *v_p = 0;
        return ZS_OK;
    }
    /* Drop low digits until d * mult and 10^-e fit in 128 bits (38 digits are plenty). */
    while (e < 0 && (e < -38 || d > ZS_U128_MAX / mult)) {
        d /= 10;
        e++;
    }
    if (d == 0) {
        *v_p = 0;
        return ZS_OK;
    }
    if (d > ZS_U128_MAX / mult) {
        return ZS_ERR_OVERFLOW;
    }
    v = d * mult;
    for (; e > 0; e--) {
        if (v > UINT64_MAX) {
            return ZS_ERR_OVERFLOW;
        }
        v *= 10;
    }
    for (; e < 0; e++) {
        p10 *= 10;
    }
    v /= p10;
    if (v > UINT64_MAX) {
        return ZS_ERR_OVERFLOW;
    }
    *v_p = (uint64_t)v;
    return ZS_OK;
}

typedef struct zs_unit {
    const char *name;
    uint64_t mult;
} zs_unit_t;

/* clang-format off */
static const zs_unit_t zs_size_units[] = {
    {"", 1},                          {"b", 1},
    {"k", UINT64_C(1) << 10},         {"kib", UINT64_C(1) << 10},
    {"m", UINT64_C(1) << 20},         {"mib", UINT64_C(1) << 20},
    {"g", UINT64_C(1) << 30},         {"gib", UINT64_C(1) << 30},
    {"t", UINT64_C(1) << 40},         {"tib", UINT64_C(1) << 40},
    {"p", UINT64_C(1) << 50},         {"pib", UINT64_C(1) << 50},
    {"kb", UINT64_C(1000)},           {"mb", UINT64_C(1000000)},
    {"gb", UINT64_C(1000000000)},     {"tb", UINT64_C(1000000000000)},
    {"pb", UINT64_C(1000000000000000)},
};
/* clang-format on */

#define ZS_NS_US  UINT64_C(1000)
#define ZS_NS_MS  UINT64_C(1000000)
#define ZS_NS_S   UINT64_C(1000000000)
#define ZS_NS_MIN (60 * ZS_NS_S)
#define ZS_NS_H   (60 * ZS_NS_MIN)
#define ZS_NS_D   (24 * ZS_NS_H)
static const zs_unit_t zs_duration_units[] = {
    {"ns", 1},        {"us", ZS_NS_US}, {"\xc2\xb5s", ZS_NS_US}, {"ms", ZS_NS_MS},  {"s", ZS_NS_S},
    {"sec", ZS_NS_S}, {"m", ZS_NS_MIN}, {"min", ZS_NS_MIN},      {"h", ZS_NS_H},    {"hr", ZS_NS_H},
    {"d", ZS_NS_D},   {"day", ZS_NS_D}, {"days", ZS_NS_D},       {"w", 7 * ZS_NS_D}};
static const zs_unit_t zs_duration_seconds = {"s", ZS_NS_S};

/* Longest run of letters (and the UTF-8 micro sign) at s, matched case-insensitively. */
static const zs_unit_t *zs_unit_find(const zs_unit_t *units, size_t n, const char **s_p)
{
    const char *s = *s_p;
    size_t len = 0;

    while (isalpha((unsigned char)s[len]) || (unsigned char)s[len] >= 0x80) {
        len++;
    }
    for (size_t i = 0; i < n; i++) {
        if (strlen(units[i].name) == len && strncasecmp(units[i].name, s, len) == 0) {
            *s_p = s + len;
            return &units[i];
        }
    }
    return NULL;
}

zs_status_t zs_parse_size(const char *s, uint64_t *bytes_p)
{
    char buf[128];
    const char *p;
    const zs_unit_t *unit;
    zs_u128_t d;
    long e;
    uint64_t v;
    zs_status_t status;

    if (s == NULL || zs_trim_copy(s, buf, sizeof(buf)) != 0) {
        return ZS_ERR_INVALID;
    }
    p = zs_parse_decimal(buf, &d, &e);
    if (p == NULL) {
        return ZS_ERR_INVALID;
    }
    while (zs_is_blank(*p)) {
        p++;
    }
    unit = zs_unit_find(zs_size_units, ZS_ARRAY_SIZE(zs_size_units), &p);
    if (unit == NULL || *p != '\0') {
        return ZS_ERR_INVALID;
    }
    status = zs_scale_u64(d, e, unit->mult, &v);
    if (status != ZS_OK) {
        return status;
    }
    *bytes_p = v;
    return ZS_OK;
}

zs_status_t zs_parse_duration(const char *s, uint64_t *ns_p)
{
    char buf[128];
    const char *p;
    uint64_t total = 0;
    int n_parts = 0;

    if (s == NULL || zs_trim_copy(s, buf, sizeof(buf)) != 0 || buf[0] == '\0') {
        return ZS_ERR_INVALID;
    }
    p = buf;
    while (*p != '\0') {
        const zs_unit_t *unit;
        zs_u128_t d;
        long e;
        uint64_t v;
        zs_status_t status;

        p = zs_parse_decimal(p, &d, &e);
        if (p == NULL) {
            return ZS_ERR_INVALID;
        }
        while (zs_is_blank(*p)) {
            p++;
        }
        if (*p == '\0' && n_parts == 0) {
            unit = &zs_duration_seconds; /* a bare number is seconds */
        } else {
            unit = zs_unit_find(zs_duration_units, ZS_ARRAY_SIZE(zs_duration_units), &p);
            if (unit == NULL) {
                return ZS_ERR_INVALID;
            }
        }
        status = zs_scale_u64(d, e, unit->mult, &v);
        if (status != ZS_OK) {
            return status;
        }
        if (__builtin_add_overflow(total, v, &total)) {
            return ZS_ERR_OVERFLOW;
        }
        n_parts++;
        while (zs_is_blank(*p)) {
            p++;
        }
    }
    *ns_p = total;
    return ZS_OK;
}

zs_status_t zs_parse_bool(const char *s, int *b_p)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    char buf[16];

    if (s == NULL || zs_trim_copy(s, buf, sizeof(buf)) != 0) {
        return ZS_ERR_INVALID;
    }
    for (size_t i = 0; i < ZS_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(buf, yes[i]) == 0) {
            *b_p = 1;
            return ZS_OK;
        }
        if (strcasecmp(buf, no[i]) == 0) {
            *b_p = 0;
            return ZS_OK;
        }
    }
    return ZS_ERR_INVALID;
}

/* ------------------------------------------------------------------------------------------ */
/* Parsers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int zs_is_empty(const char *value)
{
    while (zs_is_blank(*value)) {
        value++;
    }
    return *value == '\0';
}

/* A size or a duration against the row's optional range, the bounds printed in the row's own
 * form ("out of range [100ms, 1h]"). */
static zs_status_t zs_cfg_u64_range_check(const zs_config_row_t *row, uint64_t v, char *err,
                                          size_t errlen)
{
    const zs_config_range_t *range = row->arg;
    char lo[64], hi[64];
    uint64_t b;

    if (range == NULL || ((double)v >= range->min && (double)v <= range->max)) {
        return ZS_OK;
    }
    b = (uint64_t)range->min;
    row->parser->format(row, &b, lo, sizeof(lo));
    b = (uint64_t)range->max;
    row->parser->format(row, &b, hi, sizeof(hi));
    return zs_errf(err, errlen, ZS_ERR_INVALID, "out of range [%s, %s]", lo, hi);
}

static zs_status_t zs_cfg_size_parse(const zs_config_row_t *row, const char *value, void *field,
                                     char *err, size_t errlen)
{
    zs_status_t status = ZS_ERR_INVALID;
    uint64_t v;

    if (!zs_is_empty(value)) {
        status = zs_parse_size(value, &v);
    }
    if (status == ZS_OK) {
        status = zs_cfg_u64_range_check(row, v, err, errlen);
        if (status != ZS_OK) {
            return status;
        }
        *(uint64_t *)field = v;
    } else if (status == ZS_ERR_OVERFLOW) {
        zs_errf(err, errlen, status, "a size must be below 16EiB (2^64 bytes)");
    } else if (strchr(value, '-') != NULL) {
        zs_errf(err, errlen, status, "a size cannot be negative");
    } else {
        zs_errf(err, errlen, status, "expected a size such as 512MiB, 4k, 1GB, 5e8 or bytes");
    }
    return status;
}

static void zs_cfg_size_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    static const char *const names[] = {"PiB", "TiB", "GiB", "MiB", "KiB"};
    uint64_t v = *(const uint64_t *)field;

    for (size_t i = 0; v != 0 && i < ZS_ARRAY_SIZE(names); i++) {
        uint64_t mult = UINT64_C(1) << (10 * (ZS_ARRAY_SIZE(names) - i));
        if (v % mult == 0) {
            snprintf(buf, len, "%" PRIu64 "%s", v / mult, names[i]);
            return;
        }
    }
    snprintf(buf, len, "%" PRIu64, v);
}

static zs_status_t zs_cfg_duration_parse(const zs_config_row_t *row, const char *value, void *field,
                                         char *err, size_t errlen)
{
    zs_status_t status = ZS_ERR_INVALID;
    uint64_t v;

    if (!zs_is_empty(value)) {
        status = zs_parse_duration(value, &v);
    }
    if (status == ZS_OK) {
        status = zs_cfg_u64_range_check(row, v, err, errlen);
        if (status != ZS_OK) {
            return status;
        }
        *(uint64_t *)field = v;
    } else if (status == ZS_ERR_OVERFLOW) {
        zs_errf(err, errlen, status, "a duration must be below 2^64 ns (about 584 years)");
    } else {
        zs_errf(err, errlen, status, "expected a duration such as 60s, 250ms, 10min");
    }
    return status;
}

static void zs_cfg_duration_format(const zs_config_row_t *row, const void *field, char *buf,
                                   size_t len)
{
    static const zs_unit_t units[] = {{"d", ZS_NS_D},     {"h", ZS_NS_H},   {"min", ZS_NS_MIN},
                                      {"s", ZS_NS_S},     {"ms", ZS_NS_MS}, {"us", ZS_NS_US},
                                      {"ns", UINT64_C(1)}};
    uint64_t v = *(const uint64_t *)field;

    if (v == 0) {
        snprintf(buf, len, "0");
        return;
    }
    for (size_t i = 0; i < ZS_ARRAY_SIZE(units); i++) {
        if (v % units[i].mult == 0) {
            snprintf(buf, len, "%" PRIu64 "%s", v / units[i].mult, units[i].name);
            return;
        }
    }
}

static zs_status_t zs_cfg_bool_parse(const zs_config_row_t *row, const char *value, void *field,
                                     char *err, size_t errlen)
{
    int b;

    if (zs_parse_bool(value, &b) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected true/false, yes/no, on/off or 1/0");
    }
    *(int *)field = b;
    return ZS_OK;
}

static void zs_cfg_bool_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    snprintf(buf, len, "%s", *(const int *)field ? "true" : "false");
}

static zs_status_t zs_cfg_enum_parse(const zs_config_row_t *row, const char *value, void *field,
                                     char *err, size_t errlen)
{
    const char *const *names = row->arg;
    char buf[ZS_CONFIG_NAME_MAX];
    size_t off = 0;

    if (names != NULL && zs_trim_copy(value, buf, sizeof(buf)) == 0) {
        for (int i = 0; names[i] != NULL; i++) {
            if (strcasecmp(buf, names[i]) == 0) {
                *(int *)field = i;
                return ZS_OK;
            }
        }
    }
    if (err == NULL || errlen == 0) {
        return ZS_ERR_INVALID;
    }
    off = (size_t)snprintf(err, errlen, "expected one of:");
    for (int i = 0; names != NULL && names[i] != NULL && off < errlen; i++) {
        off += (size_t)snprintf(err + off, errlen - off, "%s %s", i == 0 ? "" : ",", names[i]);
    }
    return ZS_ERR_INVALID;
}

static void zs_cfg_enum_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    const char *const *names = row->arg;
    int v = *(const int *)field;

    for (int i = 0; names != NULL && names[i] != NULL; i++) {
        if (i == v) {
            snprintf(buf, len, "%s", names[i]);
            return;
        }
    }
    snprintf(buf, len, "%d", v);
}

static zs_status_t zs_cfg_str_set(const char *value, void *field, char *err, size_t errlen)
{
    char *copy = strdup(value);

    if (copy == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    *(char **)field = copy;
    return ZS_OK;
}

static zs_status_t zs_cfg_path_parse(const zs_config_row_t *row, const char *value, void *field,
                                     char *err, size_t errlen)
{
    if (value[0] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected a non-empty path");
    }
    return zs_cfg_str_set(value, field, err, errlen);
}

static zs_status_t zs_cfg_string_parse(const zs_config_row_t *row, const char *value, void *field,
                                       char *err, size_t errlen)
{
    return zs_cfg_str_set(value, field, err, errlen);
}

static void zs_cfg_str_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    const char *s = *(char *const *)field;

    snprintf(buf, len, "%s", s != NULL ? s : "");
}

static void zs_cfg_str_release(void *field)
{
    free(*(char **)field);
    *(char **)field = NULL;
}

static zs_status_t zs_cfg_range_check(const zs_config_row_t *row, double v, char *err,
                                      size_t errlen)
{
    const zs_config_range_t *range = row->arg;

    if (range != NULL && (v < range->min || v > range->max)) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "out of range [%.17g, %.17g]", range->min,
                       range->max);
    }
    return ZS_OK;
}

static zs_status_t zs_cfg_int_parse(const zs_config_row_t *row, const char *value, void *field,
                                    char *err, size_t errlen)
{
    char buf[64];
    char *end = NULL;
    const char *p;
    long long v;
    zs_status_t status;

    if (zs_trim_copy(value, buf, sizeof(buf)) != 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected an integer");
    }
    p = (buf[0] == '-' || buf[0] == '+') ? buf + 1 : buf;
    if (!isdigit((unsigned char)*p)) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected an integer");
    }
    errno = 0;
    v = strtoll(buf, &end, 10);
    if (*end != '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected an integer");
    }
    if (errno == ERANGE) {
        return zs_errf(err, errlen, ZS_ERR_OVERFLOW, "does not fit in a 64-bit integer");
    }
    status = zs_cfg_range_check(row, (double)v, err, errlen);
    if (status != ZS_OK) {
        return status;
    }
    *(int64_t *)field = (int64_t)v;
    return ZS_OK;
}

static void zs_cfg_int_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
}

static zs_status_t zs_cfg_double_parse(const zs_config_row_t *row, const char *value, void *field,
                                       char *err, size_t errlen)
{
    char buf[128];
    char *end = NULL;
    double v;
    zs_status_t status;

    if (zs_trim_copy(value, buf, sizeof(buf)) != 0 || buf[0] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected a number");
    }
    errno = 0;
    v = strtod(buf, &end);
    if (end == buf || *end != '\0' || isnan(v)) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected a number");
    }
    if (isinf(v)) {
        return zs_errf(err, errlen, errno == ERANGE ? ZS_ERR_OVERFLOW : ZS_ERR_INVALID,
                       "expected a finite number");
    }
    status = zs_cfg_range_check(row, v, err, errlen);
    if (status != ZS_OK) {
        return status;
    }
    *(double *)field = v;
    return ZS_OK;
}

static void zs_cfg_double_format(const zs_config_row_t *row, const void *field, char *buf,
                                 size_t len)
{
    double v = *(const double *)field;

    /* The shortest of %.15g..%.17g that reads back to the same bits. */
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) {
            return;
        }
    }
}

const zs_config_parser_t zs_config_size = {"size", zs_cfg_size_parse, zs_cfg_size_format, NULL};
const zs_config_parser_t zs_config_duration = {"duration", zs_cfg_duration_parse,
                                               zs_cfg_duration_format, NULL};
const zs_config_parser_t zs_config_bool = {"bool", zs_cfg_bool_parse, zs_cfg_bool_format, NULL};
void zs_config_allowed(const zs_config_row_t *row, char *buf, size_t len)
{
    const zs_config_range_t *range = row->arg;
    char lo[64], hi[64];
    size_t used = 0;

    buf[0] = '\0';
    if (row->parser == &zs_config_enum) {
        const char *const *names = row->arg;
        for (int i = 0; names != NULL && names[i] != NULL && used < len; i++) {
            int n = snprintf(buf + used, len - used, "%s%s", i > 0 ? " | " : "", names[i]);
            used += n > 0 ? (size_t)n : 0;
        }
    } else if (range != NULL &&
               (row->parser == &zs_config_size || row->parser == &zs_config_duration)) {
        uint64_t b = (uint64_t)range->min;
        row->parser->format(row, &b, lo, sizeof(lo));
        b = (uint64_t)range->max;
        row->parser->format(row, &b, hi, sizeof(hi));
        snprintf(buf, len, "[%s, %s]", lo, hi);
    } else if (range != NULL &&
               (row->parser == &zs_config_int || row->parser == &zs_config_double)) {
        snprintf(buf, len, "[%.17g, %.17g]", range->min, range->max);
    }
}

const zs_config_parser_t zs_config_enum = {"enum", zs_cfg_enum_parse, zs_cfg_enum_format, NULL};
const zs_config_parser_t zs_config_path = {"path", zs_cfg_path_parse, zs_cfg_str_format,
                                           zs_cfg_str_release};
const zs_config_parser_t zs_config_string = {"string", zs_cfg_string_parse, zs_cfg_str_format,
                                             zs_cfg_str_release};
const zs_config_parser_t zs_config_int = {"int", zs_cfg_int_parse, zs_cfg_int_format, NULL};
const zs_config_parser_t zs_config_double = {"double", zs_cfg_double_parse, zs_cfg_double_format,
                                             NULL};

/* Storage size of a built-in parser's field; 0 for a parser defined elsewhere. */
static size_t zs_config_field_size(const zs_config_parser_t *parser)
{
    if (parser == &zs_config_size || parser == &zs_config_duration) {
        return sizeof(uint64_t);
    }
    if (parser == &zs_config_bool || parser == &zs_config_enum) {
        return sizeof(int);
    }
    if (parser == &zs_config_path || parser == &zs_config_string) {
        return sizeof(char *);
    }
    if (parser == &zs_config_int) {
        return sizeof(int64_t);
    }
    if (parser == &zs_config_double) {
        return sizeof(double);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Table                                                                                      */
/* ------------------------------------------------------------------------------------------ */

const char *zs_config_source_name(zs_config_source_t src)
{
    switch (src) {
    case ZS_CONFIG_SRC_DEFAULT:
        return "default";
    case ZS_CONFIG_SRC_FILE:
        return "file";
    case ZS_CONFIG_SRC_ENV:
        return "env";
    case ZS_CONFIG_SRC_FLAG:
        return "flag";
    }
    return "?";
}

static void *zs_config_field(const zs_config_row_t *row, void *obj)
{
    return (char *)obj + row->offset;
}

static const void *zs_config_cfield(const zs_config_row_t *row, const void *obj)
{
    return (const char *)obj + row->offset;
}

/* Key names compare with '-' equal to '_'. */
static int zs_config_name_eq(const char *a, const char *b)
{
    for (; *a != '\0' && *b != '\0'; a++, b++) {
        char ca = (*a == '-') ? '_' : *a;
        char cb = (*b == '-') ? '_' : *b;
        if (ca != cb) {
            return 0;
        }
    }
    return *a == *b;
}

const zs_config_row_t *zs_config_find(const zs_config_table_t *t, const char *name)
{
    if (t == NULL || name == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        if (zs_config_name_eq(t->rows[i].name, name)) {
            return &t->rows[i];
        }
    }
    return NULL;
}

/*
 * Parse value into the row's field. The value is first parsed into scratch storage so that a
 * failure leaves the field as it was; `have_old` says whether the field holds a value to
 * release (false while zs_config_init() fills garbage).
 */
static zs_status_t zs_config_apply(const zs_config_row_t *row, void *obj, const char *value,
                                   const char *origin, int have_old, char *err, size_t errlen)
{
    union {
        uint64_t u;
        long double ld;
        void *p;
        unsigned char raw[ZS_CONFIG_FIELD_MAX];
    } scratch;
    char reason[ZS_CONFIG_REASON_LEN] = "";
    void *field = zs_config_field(row, obj);
    size_t size = zs_config_field_size(row->parser);
    zs_status_t status;

    memset(&scratch, 0, sizeof(scratch));
    if (value == NULL) {
        value = "";
    }
    status = row->parser->parse(row, value, &scratch, reason, sizeof(reason));
    if (status != ZS_OK) {
        goto err_bad_value;
    }
    if (size != 0) {
        if (have_old && row->parser->release != NULL) {
            row->parser->release(field);
        }
        memcpy(field, &scratch, size);
        return ZS_OK;
    }
    /* A parser defined elsewhere: its field size is unknown, so parse again in place (only an
     * allocation failure can fail the second time, and then the old value is already gone). */
    if (row->parser->release != NULL) {
        row->parser->release(&scratch);
        if (have_old) {
            row->parser->release(field);
        }
    }
    status = row->parser->parse(row, value, field, reason, sizeof(reason));
    if (status != ZS_OK) {
        goto err_bad_value;
    }
    return ZS_OK;

err_bad_value:
    return zs_errf(err, errlen, status, "config key '%s' (from %s): invalid value '%s': %s",
                   row->name, origin, (row->flags & ZS_CONFIG_SECRET) ? "<hidden>" : value, reason);
}

void zs_config_cleanup(const zs_config_table_t *t, void *obj)
{
    if (t == NULL || obj == NULL) {
        return;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        if (t->rows[i].parser->release != NULL) {
            t->rows[i].parser->release(zs_config_field(&t->rows[i], obj));
        }
    }
}

zs_status_t zs_config_init(const zs_config_table_t *t, void *obj, char *err, size_t errlen)
{
    zs_status_t status = ZS_OK;
    size_t i;

    /* Zero built-in fields first: after a failed init, cleanup finds nothing to release. */
    for (i = 0; i < t->n_rows; i++) {
        size_t size = zs_config_field_size(t->rows[i].parser);
        memset(zs_config_field(&t->rows[i], obj), 0, size);
    }
    for (i = 0; i < t->n_rows; i++) {
        status = zs_config_apply(&t->rows[i], obj, t->rows[i].def, "default", 0, err, errlen);
        if (status != ZS_OK) {
            goto err_release;
        }
    }
    return ZS_OK;

err_release:
    while (i-- > 0) {
        if (t->rows[i].parser->release != NULL) {
            t->rows[i].parser->release(zs_config_field(&t->rows[i], obj));
        }
    }
    return status;
}

/* "ZEROD_JOB_LINGER" or "--job-linger" for a key name. */
static void zs_config_origin(zs_config_source_t src, const char *name, char *buf, size_t len)
{
    const char *prefix = (src == ZS_CONFIG_SRC_ENV) ? ZS_CONFIG_ENV_PREFIX : "--";
    size_t off;

    if (src != ZS_CONFIG_SRC_ENV && src != ZS_CONFIG_SRC_FLAG) {
        snprintf(buf, len, "%s", src == ZS_CONFIG_SRC_FILE ? "config file" : "default");
        return;
    }
    off = (size_t)snprintf(buf, len, "%s", prefix);
    for (; *name != '\0' && off + 1 < len; name++, off++) {
        if (src == ZS_CONFIG_SRC_ENV) {
            buf[off] = (*name == '-') ? '_' : (char)toupper((unsigned char)*name);
        } else {
            buf[off] = (*name == '_') ? '-' : *name;
        }
    }
    buf[off] = '\0';
}

zs_status_t zs_config_set(const zs_config_table_t *t, void *obj, const char *name,
                          const char *value, zs_config_source_t src, char *err, size_t errlen)
{
    const zs_config_row_t *row = zs_config_find(t, name);
    char origin[ZS_CONFIG_NAME_MAX + 16];

    zs_config_origin(src, name != NULL ? name : "", origin, sizeof(origin));
    if (row == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "unknown config key '%s' (from %s)",
                       name ? name : "(null)", origin);
    }
    return zs_config_apply(row, obj, value, origin, 1, err, errlen);
}

/* ------------------------------------------------------------------------------------------ */
/* File                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct zs_config_file_ctx {
    const zs_config_table_t *t;
    void *obj;
    const char *path;
    FILE *fp;
    int lineno; /* lines handed to inih so far: the line the handler is looking at */
    zs_status_t status;
    char *err;
    size_t errlen;
} zs_config_file_ctx_t;

static void zs_config_file_fail(zs_config_file_ctx_t *ctx, zs_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void zs_config_file_fail(zs_config_file_ctx_t *ctx, zs_status_t status, const char *fmt, ...)
{
    va_list ap;
    int off;

    ctx->status = status;
    if (ctx->err == NULL || ctx->errlen == 0) {
        return;
    }
    off = snprintf(ctx->err, ctx->errlen, "%s:%d: ", ctx->path, ctx->lineno);
    if (off < 0 || (size_t)off >= ctx->errlen) {
        return;
    }
    va_start(ap, fmt);
    zs_verrf(ctx->err + off, ctx->errlen - (size_t)off, status, fmt, ap);
    va_end(ap);
}

/* fgets-style reader for inih: counts lines, strips indentation (so inih never sees a
 * continuation line) and `#` comments after a blank, and stops at the first error. */
static char *zs_config_file_read(char *str, int num, void *stream)
{
    zs_config_file_ctx_t *ctx = stream;
    size_t len;
    char *s;
    char *c;

    if (ctx->status != ZS_OK || fgets(str, num, ctx->fp) == NULL) {
        return NULL;
    }
    ctx->lineno++;
    len = strlen(str);
    if (len > 0 && str[len - 1] != '\n' && !feof(ctx->fp)) {
        zs_config_file_fail(ctx, ZS_ERR_CONFIG, "line too long (at most %d characters)", num - 3);
        return NULL;
    }
    s = str + strspn(str, " \t");
    memmove(str, s, strlen(s) + 1);
    for (c = str; (c = strchr(c, '#')) != NULL; c++) {
        if (c > str && (c[-1] == ' ' || c[-1] == '\t')) {
            c[0] = '\n';
            c[1] = '\0';
            break;
        }
    }
    s = str;
    if (ctx->lineno == 1 && strncmp(s, "\xef\xbb\xbf", 3) == 0) {
        s += 3;
    }
    if (*s == '[' && strchr(s, ']') == NULL) {
        zs_config_file_fail(ctx, ZS_ERR_CONFIG, "unterminated section header");
        return NULL;
    }
    if (*s != '\0' && !zs_is_blank(*s) && strchr("#;[", *s) == NULL && strpbrk(s, "=:") == NULL) {
        zs_config_file_fail(ctx, ZS_ERR_CONFIG, "expected 'key = value' or '[section]'");
        return NULL;
    }
    return str;
}

static int zs_config_file_handler(void *user, const char *section, const char *name,
                                  const char *value)
{
    zs_config_file_ctx_t *ctx = user;
    const zs_config_row_t *row;
    char origin[ZS_CONFIG_ERRLEN];
    zs_status_t status;

    if (ctx->status != ZS_OK) {
        return 0;
    }
    if (section[0] != '\0' && (ctx->t->section == NULL || strcmp(section, ctx->t->section) != 0)) {
        zs_config_file_fail(ctx, ZS_ERR_CONFIG, "unknown section '[%s]' (key '%s')", section, name);
        return 0;
    }
    row = zs_config_find(ctx->t, name);
    if (row == NULL) {
        zs_config_file_fail(ctx, ZS_ERR_CONFIG, "unknown config key '%s'", name);
        return 0;
    }
    snprintf(origin, sizeof(origin), "%s:%d", ctx->path, ctx->lineno);
    status = zs_config_apply(row, ctx->obj, value, origin, 1, ctx->err, ctx->errlen);
    if (status != ZS_OK) {
        ctx->status = status;
        return 0;
    }
    return 1;
}

zs_status_t zs_config_load_file(const zs_config_table_t *t, void *obj, const char *path, char *err,
                                size_t errlen)
{
    zs_config_file_ctx_t ctx = {t, obj, path, NULL, 0, ZS_OK, err, errlen};
    int rc;

    ctx.fp = fopen(path, "re");
    if (ctx.fp == NULL) {
        int e = errno;
        return zs_errf(err, errlen, (e == ENOENT) ? ZS_ERR_NOT_FOUND : ZS_ERR_IO,
                       "cannot open config file '%s': %s", path, strerror(e));
    }
    rc = ini_parse_stream(zs_config_file_read, &ctx, zs_config_file_handler, &ctx);
    if (ctx.status == ZS_OK && ferror(ctx.fp)) {
        ctx.status = zs_errf(err, errlen, ZS_ERR_IO, "%s: read error", path);
    } else if (ctx.status == ZS_OK && rc != 0) {
        ctx.lineno = rc;
        zs_config_file_fail(&ctx, ZS_ERR_CONFIG, "syntax error");
    }
    fclose(ctx.fp);
    return ctx.status;
}

/* ------------------------------------------------------------------------------------------ */
/* Environment and flags                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* The row whose ZEROD_ name is exactly `name` (upper case, `len` bytes). */
static const zs_config_row_t *zs_config_find_env(const zs_config_table_t *t, const char *name,
                                                 size_t len)
{
    for (size_t i = 0; i < t->n_rows; i++) {
        const char *r = t->rows[i].name;
        size_t j;

        for (j = 0; j < len && r[j] != '\0'; j++) {
            char want = (r[j] == '-') ? '_' : (char)toupper((unsigned char)r[j]);
            if (name[j] != want) {
                break;
            }
        }
        if (j == len && r[j] == '\0') {
            return &t->rows[i];
        }
    }
    return NULL;
}

static int zs_config_ignored(const char *const *ignore, const char *name, size_t len)
{
    for (; ignore != NULL && *ignore != NULL; ignore++) {
        if (strlen(*ignore) == len && strncmp(*ignore, name, len) == 0) {
            return 1;
        }
    }
    return 0;
}

zs_status_t zs_config_load_env(const zs_config_table_t *t, void *obj, char *const *envp,
                               const char *const *ignore, char *err, size_t errlen)
{
    const size_t plen = strlen(ZS_CONFIG_ENV_PREFIX);

    if (envp == NULL) {
        envp = environ;
    }
    for (; envp != NULL && *envp != NULL; envp++) {
        const char *var = *envp;
        const char *eq = strchr(var, '=');
        const char *name = var + plen;
        const zs_config_row_t *row;
        char origin[ZS_CONFIG_NAME_MAX + 16];
        size_t len;
        zs_status_t status;

        if (eq == NULL || strncmp(var, ZS_CONFIG_ENV_PREFIX, plen) != 0 || eq < name) {
            continue;
        }
        len = (size_t)(eq - name);
        row = zs_config_find_env(t, name, len);
        if (row == NULL) {
            if (!zs_config_ignored(ignore, name, len)) {
                zs_warn(ZS_SUB_CFG, "unknown environment variable %.*s (not a config key; ignored)",
                        (int)(eq - var), var);
            }
            continue;
        }
        snprintf(origin, sizeof(origin), "%.*s", (int)(eq - var), var);
        status = zs_config_apply(row, obj, eq + 1, origin, 1, err, errlen);
        if (status != ZS_OK) {
            return status;
        }
    }
    return ZS_OK;
}

static zs_status_t zs_config_load_flag(const zs_config_table_t *t, void *obj,
                                       const zs_config_flag_t *flag, char *err, size_t errlen)
{
    char name[ZS_CONFIG_NAME_MAX];
    char origin[ZS_CONFIG_NAME_MAX + 2];
    const char *fname = flag->name != NULL ? flag->name : "";
    const char *value = flag->value;
    const zs_config_row_t *row;
    size_t len;

    while (*fname == '-') {
        fname++;
    }
    len = strlen(fname);
    if (value == NULL && strchr(fname, '=') != NULL) {
        value = strchr(fname, '=') + 1;
        len = (size_t)(value - 1 - fname);
    }
    if (len >= sizeof(name)) {
        len = sizeof(name) - 1;
    }
    memcpy(name, fname, len);
    name[len] = '\0';
    snprintf(origin, sizeof(origin), "--%s", name);
    row = zs_config_find(t, name);
    if (row == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "unknown config key '%s' (from %s)", name,
                       origin);
    }
    if (value == NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "config key '%s' (from %s): missing value",
                       row->name, origin);
    }
    return zs_config_apply(row, obj, value, origin, 1, err, errlen);
}

zs_status_t zs_config_load(const zs_config_table_t *t, void *obj, const char *file_path,
                           char *const *envp, const char *const *env_ignore,
                           const zs_config_flag_t *flags, size_t n_flags, char *err, size_t errlen)
{
    zs_status_t status;

    status = zs_config_init(t, obj, err, errlen);
    if (status != ZS_OK) {
        goto err;
    }
    if (file_path != NULL) {
        status = zs_config_load_file(t, obj, file_path, err, errlen);
        if (status != ZS_OK) {
            goto err_cleanup;
        }
    }
    status = zs_config_load_env(t, obj, envp, env_ignore, err, errlen);
    if (status != ZS_OK) {
        goto err_cleanup;
    }
    for (size_t i = 0; i < n_flags; i++) {
        status = zs_config_load_flag(t, obj, &flags[i], err, errlen);
        if (status != ZS_OK) {
            goto err_cleanup;
        }
    }
    return ZS_OK;

err_cleanup:
    zs_config_cleanup(t, obj);
err:
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Output                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static void zs_config_format_row(const zs_config_row_t *row, const void *obj, char *buf, size_t len)
{
    if (len == 0) {
        return;
    }
    buf[0] = '\0';
    if (row->flags & ZS_CONFIG_SECRET) {
        snprintf(buf, len, "<hidden>");
        return;
    }
    row->parser->format(row, zs_config_cfield(row, obj), buf, len);
}

void zs_config_format(const zs_config_table_t *t, const void *obj, const char *name, char *buf,
                      size_t len)
{
    const zs_config_row_t *row = zs_config_find(t, name);

    if (buf == NULL || len == 0) {
        return;
    }
    buf[0] = '\0';
    if (row != NULL) {
        zs_config_format_row(row, obj, buf, len);
    }
}

void zs_config_print(const zs_config_table_t *t, const void *obj, FILE *out)
{
    char value[ZS_CONFIG_ERRLEN];
    int name_w = 0;
    int value_w = 0;

    for (size_t i = 0; i < t->n_rows; i++) {
        int n = (int)strlen(t->rows[i].name);
        int v;

        zs_config_format_row(&t->rows[i], obj, value, sizeof(value));
        v = (int)strlen(value);
        name_w = n > name_w ? n : name_w;
        value_w = (v > value_w && v <= 40) ? v : value_w;
    }
    for (size_t i = 0; i < t->n_rows; i++) {
        const zs_config_row_t *row = &t->rows[i];

        zs_config_format_row(row, obj, value, sizeof(value));
        if (row->doc != NULL && row->doc[0] != '\0') {
            fprintf(out, "%-*s = %-*s  # %s\n", name_w, row->name, value_w, value, row->doc);
        } else {
            fprintf(out, "%-*s = %s\n", name_w, row->name, value);
        }
    }
}
