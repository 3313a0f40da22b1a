/*
 * Config tables: see zs/config.h.
 *
 * Value forms: see config_types.c.
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

#include "config_int.h"

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
/* Scratch for validating a value before the field is touched; a custom parser's field must fit. */
#define ZS_CONFIG_FIELD_MAX  256
#define ZS_CONFIG_REASON_LEN 256

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
