/*
 * The value types of config tables (zs/config.h): the stand-alone parsers of sizes,
 * durations and booleans, and each row type's parse, format and allowed-values text.
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
 */
#define _GNU_SOURCE
#include "zs/config_types.h"
#include "config_int.h"
#include "zs/error.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 zs_u128_t;

#define ZS_U128_MAX (~(zs_u128_t)0)
/* ------------------------------------------------------------------------------------------ */
/* Numbers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

int zs_is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

int zs_trim_copy(const char *s, char *buf, size_t len)
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
    (void)row;
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
    (void)row;
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
    (void)row;
    int b;

    if (zs_parse_bool(value, &b) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected true/false, yes/no, on/off or 1/0");
    }
    *(int *)field = b;
    return ZS_OK;
}

static void zs_cfg_bool_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    (void)row;
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
    (void)row;
    if (value[0] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "expected a non-empty path");
    }
    return zs_cfg_str_set(value, field, err, errlen);
}

static zs_status_t zs_cfg_string_parse(const zs_config_row_t *row, const char *value, void *field,
                                       char *err, size_t errlen)
{
    (void)row;
    return zs_cfg_str_set(value, field, err, errlen);
}

static void zs_cfg_str_format(const zs_config_row_t *row, const void *field, char *buf, size_t len)
{
    (void)row;
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
    (void)row;
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
    (void)row;
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

size_t zs_config_field_size(const zs_config_parser_t *parser)
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
