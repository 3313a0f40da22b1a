/*
 * The config's JSON read as DeepSpeed reads it (config/train_config_int.h): the text as Python's
 * json module parses it (Infinity, -Infinity and NaN are numbers, as json.dumps writes them),
 * and a value as pydantic's lax mode converts it for the sections DeepSpeed validates with its
 * pydantic models ("2" is 2 for an int, "true" true for a bool).
 */
#include "config/train_config_int.h"

#include "zs/config_types.h"
#include "zs/error.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- Python's json tokens ----------------------------------------------------------------- */

/* The bare tokens Python's json adds, and texts of the same length cJSON parses as numbers:
 * the infinities overflow strtod to +-HUGE_VAL; NaN has no such text, so it is parsed as 0 and
 * set to nan afterwards (zd_tc_json_nan), its place found by counting numbers. */
static const struct {
    const char *token, *as;
    bool nan;
} zd_tc_tokens[] = {
    {"-Infinity", "-1e999999", false},
    {"Infinity", "1e999999", false},
    {"NaN", "0.0", true},
};

/* The ordinals (among the text's numbers, in document order) of its NaNs. */
typedef struct zd_tc_nans {
    size_t *at;
    size_t n, cap;
} zd_tc_nans_t;

static bool zd_tc_word_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

/* Rewrite the tokens of zd_tc_tokens outside strings in buf (a copy of the text: same length,
 * so cJSON's error offsets stay those of the text). False when out of memory. */
static bool zd_tc_json_rewrite(char *buf, zd_tc_nans_t *nans)
{
    size_t n_numbers = 0;
    char *p = buf;

    while (*p != '\0') {
        if (*p == '"') { /* a string: up to the closing quote that is not escaped */
            for (p++; *p != '\0' && *p != '"'; p++) {
                p += p[0] == '\\' && p[1] != '\0';
            }
            p += *p == '"';
            continue;
        }
        size_t i = 0, len = 0;
        for (; i < ZS_ARRAY_SIZE(zd_tc_tokens); i++) {
            len = strlen(zd_tc_tokens[i].token);
            if (strncmp(p, zd_tc_tokens[i].token, len) == 0 && !zd_tc_word_char(p[len]) &&
                (p == buf || !zd_tc_word_char(p[-1]))) {
                break;
            }
        }
        if (i < ZS_ARRAY_SIZE(zd_tc_tokens)) {
            memcpy(p, zd_tc_tokens[i].as, len);
            if (zd_tc_tokens[i].nan) {
                if (nans->n == nans->cap) {
                    size_t cap = nans->cap > 0 ? nans->cap * 2 : 8;
                    size_t *at = realloc(nans->at, cap * sizeof(*at));
                    if (at == NULL) {
                        return false;
                    }
                    nans->at = at;
                    nans->cap = cap;
                }
                nans->at[nans->n++] = n_numbers;
            }
            n_numbers++;
            p += len;
        } else if (*p == '-' || isdigit((unsigned char)*p)) {
            /* a number as cJSON takes it: these characters, then strtod */
            n_numbers++;
            p += strspn(p, "0123456789+-.eE");
        } else if (zd_tc_word_char(*p)) {
            while (zd_tc_word_char(*p)) {
                p++;
            }
        } else {
            p++;
        }
    }
    return true;
}

/* Set the NaNs: the numbers of item's tree, counted in document order as the rewrite did. */
static void zd_tc_json_nan(cJSON *item, const zd_tc_nans_t *nans, size_t *ordinal, size_t *next)
{
    for (; item != NULL && *next < nans->n; item = item->next) {
        if (cJSON_IsNumber(item)) {
            if (nans->at[*next] == (*ordinal)++) {
                item->valuedouble = NAN; /* not cJSON_SetNumberValue: (int)nan is undefined */
                item->valueint = 0;
                (*next)++;
            }
        }
        zd_tc_json_nan(item->child, nans, ordinal, next);
    }
}

/* "line 3, column 7, near '\"lr\": 0.1,'" for the offset `at` of text; at the end of the
 * text (where cJSON reports an unfinished value) the text before it. */
static void zd_tc_json_where(const char *text, size_t at, char *buf, size_t len)
{
    size_t line = 1, col = 1, used, from = at;
    bool end = text[at] == '\0';

    for (size_t i = 0; i < at; i++) {
        line += text[i] == '\n';
        col = text[i] == '\n' ? 1 : col + 1;
    }
    if (end) {
        from = at > 24 ? at - 24 : 0;
    }
    used = (size_t)snprintf(buf, len, "line %zu, column %zu%s '", line, col,
                            end ? " (the end of the text), after" : ", near");
    for (const char *p = text + from; *p != '\0' && p < text + from + 24 && used + 6 < len; p++) {
        unsigned char c = (unsigned char)*p;
        used +=
            (size_t)snprintf(buf + used, len - used, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x", c);
    }
    snprintf(buf + used, len - used, "'");
}

zs_status_t zd_tc_json_parse(const char *text, const char *what, cJSON **root_p, char *err,
                             size_t errlen)
{
    zd_tc_nans_t nans = {0};
    const char *end = NULL;
    char *buf = strdup(text), where[128];
    cJSON *root = NULL;
    zs_status_t st = ZS_OK;

    if (buf == NULL || !zd_tc_json_rewrite(buf, &nans)) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "%s: out of memory", what);
        goto out;
    }
    /* null-terminated: text after the value is an error, as it is for json.loads */
    root = cJSON_ParseWithOpts(buf, &end, true);
    if (root == NULL) {
        /* end points into buf, which has text's length */
        zd_tc_json_where(text, end != NULL && end >= buf ? (size_t)(end - buf) : 0, where,
                         sizeof(where));
        st = zs_errf(err, errlen, ZS_ERR_CONFIG, "%s: not valid JSON at %s", what, where);
        goto out;
    }
    if (nans.n > 0) {
        size_t ordinal = 0, next = 0;
        zd_tc_json_nan(root, &nans, &ordinal, &next);
    }
    *root_p = root;
out:
    free(nans.at);
    free(buf);
    return st;
}

/* ---- pydantic's lax mode ------------------------------------------------------------------ */

/* s without leading and trailing whitespace, and without the underscores Python allows between
 * digits ("1_000"), in buf; false when it does not fit or an underscore is not between digits. */
static bool zd_tc_lax_clean(const char *s, char *buf, size_t len)
{
    size_t n = 0, end;

    while (isspace((unsigned char)*s)) {
        s++;
    }
    end = strlen(s);
    while (end > 0 && isspace((unsigned char)s[end - 1])) {
        end--;
    }
    for (size_t i = 0; i < end; i++) {
        if (s[i] == '_') {
            if (i == 0 || i + 1 == end || !isdigit((unsigned char)s[i - 1]) ||
                !isdigit((unsigned char)s[i + 1])) {
                return false;
            }
            continue;
        }
        if (n + 1 >= len) {
            return false;
        }
        buf[n++] = s[i];
    }
    buf[n] = '\0';
    return n > 0;
}

/* An int as pydantic reads a string: [sign] digits, then optionally "." and zeros only. */
static bool zd_tc_lax_int(const char *s, double *v_p)
{
    char buf[64];
    const char *p = buf, *rest;

    if (!zd_tc_lax_clean(s, buf, sizeof(buf))) {
        return false;
    }
    p += *p == '+' || *p == '-';
    rest = p + strspn(p, "0123456789");
    if (rest == p) {
        return false;
    }
    if (*rest == '.') { /* "2.00" is 2; "2." and "2.5" are not ints */
        size_t zeros = strspn(rest + 1, "0");
        if (zeros == 0) {
            return false;
        }
        rest += 1 + zeros;
    }
    if (*rest != '\0') {
        return false;
    }
    *v_p = strtod(buf, NULL);
    return true;
}

/* A float as Python's float() reads a string: a decimal number, or inf, infinity, nan. */
static bool zd_tc_lax_float(const char *s, double *v_p)
{
    char buf[64], *end;
    const char *p = buf;

    if (!zd_tc_lax_clean(s, buf, sizeof(buf))) {
        return false;
    }
    p += *p == '+' || *p == '-';
    if (strcasecmp(p, "inf") == 0 || strcasecmp(p, "infinity") == 0) {
        *v_p = *buf == '-' ? -INFINITY : INFINITY;
        return true;
    }
    if (strcasecmp(p, "nan") == 0) {
        *v_p = NAN;
        return true;
    }
    if (strspn(p, "0123456789.eE+-") != strlen(p) || !(isdigit((unsigned char)*p) || *p == '.')) {
        return false; /* strtod would take hex and "infinity" forms Python does not */
    }
    *v_p = strtod(buf, &end);
    return *end == '\0';
}

static int zd_tc_lax_bool(const cJSON *item)
{
    static const char *const no[] = {"0", "off", "f", "false", "n", "no"};
    static const char *const yes[] = {"1", "on", "t", "true", "y", "yes"};

    if (cJSON_IsNumber(item)) {
        return item->valuedouble == 0 ? 0 : (item->valuedouble == 1 ? 1 : -1);
    }
    for (size_t i = 0; i < ZS_ARRAY_SIZE(no); i++) {
        if (strcasecmp(item->valuestring, no[i]) == 0) {
            return 0;
        }
        if (strcasecmp(item->valuestring, yes[i]) == 0) {
            return 1;
        }
    }
    return -1;
}

cJSON *zd_tc_lax(const zd_tc_key_t *k, const cJSON *item)
{
    double v;
    int b;

    if (k->type == ZD_TC_BOOL && (cJSON_IsString(item) || cJSON_IsNumber(item))) {
        b = zd_tc_lax_bool(item);
        return b >= 0 ? cJSON_CreateBool(b) : NULL;
    }
    if (!cJSON_IsString(item) || strcmp(item->valuestring, "auto") == 0) {
        return NULL; /* "auto" keeps its own message */
    }
    if ((k->type == ZD_TC_INT && zd_tc_lax_int(item->valuestring, &v)) ||
        (k->type == ZD_TC_NUMBER && zd_tc_lax_float(item->valuestring, &v))) {
        cJSON *num = cJSON_CreateNumber(isfinite(v) ? v : 0);
        if (num != NULL) {
            num->valuedouble = v; /* cJSON_CreateNumber's (int) of a non-finite is undefined */
        }
        return num;
    }
    return NULL;
}
