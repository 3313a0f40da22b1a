/*
 * The training config parsed (config/train_config.h): a walk of the JSON against the key table,
 * each value checked and stored where its row says, refused and ignored keys handled as their
 * fate says, defaults for what was not given, the rules between keys, and a group's options
 * (config/train_config_resolve.c: the batch triple and the hash). The walk goes on past a
 * problem, so that one message lists every problem of the config.
 */
#include "config/train_config.h"
#include "config/train_config_int.h"

#include "zs/config.h"
#include "zs/error.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define ZD_TC_N_KEYS zd_tc_n_keys

/* ---- messages ----------------------------------------------------------------------------- */

/* The problems one message lists in full (more are counted); each is cut to its length. */
#define ZD_TC_MAX_PROBLEMS 16
#define ZD_TC_PROBLEM_LEN  320

/* What one parse call writes to, and where values land. */
typedef struct zd_tc_ctx {
    char *base;      /* the struct values land in */
    size_t base_off; /* its offset in zd_train_config_t: 0, or that of opt for a group */
    size_t base_size;
    char *ignored; /* NULL: not wanted */
    size_t ignored_len;
    bool ignored_full;
    char *err;
    size_t errlen;
    unsigned n_problems;
    char problems[ZD_TC_MAX_PROBLEMS][ZD_TC_PROBLEM_LEN];
    bool seen[ZD_TC_MAX_KEYS];
} zd_tc_ctx_t;

static zs_status_t zd_tc_fail(zd_tc_ctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Note one problem of the config; the walk goes on. */
static zs_status_t zd_tc_fail(zd_tc_ctx_t *ctx, const char *fmt, ...)
{
    va_list ap;

    if (ctx->n_problems < ZD_TC_MAX_PROBLEMS) {
        va_start(ap, fmt);
        vsnprintf(ctx->problems[ctx->n_problems], ZD_TC_PROBLEM_LEN, fmt, ap);
        va_end(ap);
    }
    ctx->n_problems++;
    return ZS_ERR_CONFIG;
}

/* The one message: the problem, or "3 problems in the config: (1) ...; (2) ...; (3) ...", as
 * many as fit in err and then "; and N more". */
static zs_status_t zd_tc_report(zd_tc_ctx_t *ctx)
{
    char more[48];
    size_t used;
    unsigned shown = 0;

    if (ctx->n_problems == 0) {
        return ZS_OK;
    }
    if (ctx->n_problems == 1) {
        return zs_errf(ctx->err, ctx->errlen, ZS_ERR_CONFIG, "%s", ctx->problems[0]);
    }
    if (ctx->err == NULL || ctx->errlen == 0) {
        return ZS_ERR_CONFIG;
    }
    used = (size_t)snprintf(ctx->err, ctx->errlen, "%u problems in the config:", ctx->n_problems);
    for (; shown < ctx->n_problems && shown < ZD_TC_MAX_PROBLEMS; shown++) {
        const char *p = ctx->problems[shown];
        /* "; (12) " and the problem, and room for "; and N more" unless it is the last */
        size_t need = strlen(p) + 8 + (shown + 1 < ctx->n_problems ? 16 : 0);
        if (used + need >= ctx->errlen) {
            break;
        }
        used += (size_t)snprintf(ctx->err + used, ctx->errlen - used, "%s (%u) %s",
                                 shown > 0 ? ";" : "", shown + 1, p);
    }
    if (shown < ctx->n_problems && used < ctx->errlen) {
        snprintf(more, sizeof(more), "%s and %u more", shown > 0 ? ";" : "",
                 ctx->n_problems - shown);
        snprintf(ctx->err + used, ctx->errlen - used, "%s", more);
    }
    return ZS_ERR_CONFIG;
}

static const char *zd_tc_json_type(const cJSON *item)
{
    if (cJSON_IsBool(item)) {
        return "a boolean";
    }
    if (cJSON_IsNumber(item)) {
        return "a number";
    }
    if (cJSON_IsString(item)) {
        return "a string";
    }
    if (cJSON_IsArray(item)) {
        return "an array";
    }
    if (cJSON_IsObject(item)) {
        return "an object";
    }
    return "null";
}

/* Does the JSON type of item fit type (whatever its value)? */
static bool zd_tc_json_fits(zd_tc_type_t type, const cJSON *item)
{
    switch (type) {
    case ZD_TC_OBJECT:
        return cJSON_IsObject(item);
    case ZD_TC_BOOL:
        return cJSON_IsBool(item);
    case ZD_TC_INT:
    case ZD_TC_NUMBER:
        return cJSON_IsNumber(item);
    case ZD_TC_ENUM:
        return cJSON_IsString(item);
    case ZD_TC_PAIR:
        return cJSON_IsArray(item);
    }
    return false;
}

/* A short rendering of a value: "-3", "\"fast\"", or with its type when the type is wrong:
 * "a string \"fast\"". */
static void zd_tc_render(const cJSON *item, bool typed, char *buf, size_t len)
{
    char *s = cJSON_PrintUnformatted(item);
    const char *text = s != NULL ? s : "?";
    int n = 0;

    if (typed && !cJSON_IsNull(item)) {
        n = snprintf(buf, len, "%s ", zd_tc_json_type(item));
    }
    if (cJSON_IsNumber(item) && !isfinite(item->valuedouble)) { /* cJSON prints null */
        text = isnan(item->valuedouble) ? "nan" : (item->valuedouble > 0 ? "inf" : "-inf");
    }
    snprintf(buf + n, len - (size_t)n, "%s", text);
    if (strlen(buf) > 72) {
        strcpy(buf + 68, "...");
    }
    cJSON_free(s);
}

/* The accepted choices: "\"mean\" or \"sum\"", "1 or 2". */
static void zd_tc_choices_text(const zd_tc_key_t *k, const char *quote, char *buf, size_t len)
{
    size_t n_ok = 0, i_ok = 0, used = 0;

    for (const zd_tc_choice_t *c = k->choices; c->name != NULL; c++) {
        n_ok += c->refused == NULL;
    }
    buf[0] = '\0';
    for (const zd_tc_choice_t *c = k->choices; c->name != NULL && used < len; c++) {
        if (c->refused != NULL) {
            continue;
        }
        used += (size_t)snprintf(buf + used, len - used, "%s%s%s%s",
                                 i_ok == 0 ? "" : (i_ok + 1 == n_ok ? " or " : ", "), quote,
                                 c->name, quote);
        i_ok++;
    }
}

/* What a key takes, for "expected ...": "a positive integer up to 1e+15". with_max: say the
 * upper bound too (not when the value broke the lower one). */
static void zd_tc_expect(const zd_tc_key_t *k, zd_tc_type_t type, bool with_max, char *buf,
                         size_t len)
{
    const char *noun = type == ZD_TC_INT ? "integer" : "number";
    int n;

    if (type == ZD_TC_BOOL || type == ZD_TC_OBJECT || type == ZD_TC_PAIR) {
        snprintf(buf, len, "%s",
                 type == ZD_TC_BOOL
                     ? "true or false"
                     : (type == ZD_TC_OBJECT ? "an object" : "an array of two numbers"));
        return;
    }
    if (k->choices != NULL) {
        zd_tc_choices_text(k, type == ZD_TC_ENUM ? "\"" : "", buf, len);
        return;
    }
    if (k->min == 0) {
        n = snprintf(buf, len, "a %s %s", (k->flags & ZD_TC_MIN_OPEN) ? "positive" : "non-negative",
                     noun);
    } else if (type == ZD_TC_INT && k->min == 1) {
        n = snprintf(buf, len, "a positive integer");
    } else {
        n = snprintf(buf, len, "%s %s %s %.10g", type == ZD_TC_INT ? "an" : "a", noun,
                     (k->flags & ZD_TC_MIN_OPEN) ? "above" : "from", k->min);
    }
    if (with_max && n > 0 && (size_t)n < len) {
        snprintf(buf + n, len - (size_t)n, " %s %.10g",
                 (k->flags & ZD_TC_MAX_OPEN) ? "below" : "up to", k->max);
    }
}

/* "config key 'K': expected <what K takes>, got <value>". */
static zs_status_t zd_tc_bad_value(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, zd_tc_type_t type,
                                   const char *shown, const cJSON *item)
{
    char want[160], got[96];
    bool fits = zd_tc_json_fits(type, item);
    bool with_max = !(fits && cJSON_IsNumber(item) && item->valuedouble <= k->max);

    zd_tc_expect(k, type, with_max, want, sizeof(want));
    zd_tc_render(item, !fits, got, sizeof(got));
    return zd_tc_fail(ctx, "config key '%s': expected %s, got %s", shown, want, got);
}

/* ---- values ------------------------------------------------------------------------------- */

/* v has passed the key's range check, so it fits the field's type; each conversion is made
 * only for its own kind of field (converting a double out of an integer type's range, as a
 * float key's 2e34 would be for int32_t, is undefined). */
static void zd_tc_store(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, size_t offset, double v)
{
    char *field;

    if (k->store == ZD_TC_STORE_NONE || offset < ctx->base_off ||
        offset >= ctx->base_off + ctx->base_size) {
        return;
    }
    field = ctx->base + (offset - ctx->base_off);
    switch (k->store) {
    case ZD_TC_STORE_BOOL: {
        bool b = v != 0;
        memcpy(field, &b, sizeof(b));
        break;
    }
    case ZD_TC_STORE_I32: {
        int32_t i32 = (int32_t)v;
        memcpy(field, &i32, sizeof(i32));
        break;
    }
    case ZD_TC_STORE_U32: {
        uint32_t u32 = (uint32_t)v;
        memcpy(field, &u32, sizeof(u32));
        break;
    }
    case ZD_TC_STORE_U64: {
        uint64_t u64 = (uint64_t)v;
        memcpy(field, &u64, sizeof(u64));
        break;
    }
    case ZD_TC_STORE_F64:
        memcpy(field, &v, sizeof(v));
        break;
    case ZD_TC_STORE_NONE:
        break;
    }
}

/* The choice item names: by name for an enum, by value for an int. NULL: none. */
static const zd_tc_choice_t *zd_tc_choice(const zd_tc_key_t *k, const cJSON *item)
{
    for (const zd_tc_choice_t *c = k->choices; c->name != NULL; c++) {
        if (k->type == ZD_TC_ENUM &&
            ((k->flags & ZD_TC_NOCASE) ? strcasecmp(c->name, item->valuestring)
                                       : strcmp(c->name, item->valuestring)) == 0) {
            return c;
        }
        if (k->type == ZD_TC_INT && item->valuedouble == (double)c->value) {
            return c;
        }
    }
    return NULL;
}

/* A choice of an enum or int row: store its value, or refuse it with its reason. */
static zs_status_t zd_tc_set_choice(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, const char *shown,
                                    const cJSON *item)
{
    const zd_tc_choice_t *c = zd_tc_choice(k, item);
    char got[96];

    if (c == NULL) {
        return zd_tc_bad_value(ctx, k, k->type, shown, item);
    }
    if (c->refused != NULL) {
        zd_tc_render(item, false, got, sizeof(got));
        return zd_tc_fail(ctx, "config key '%s': %s is not supported (%s)", shown, got, c->refused);
    }
    zd_tc_store(ctx, k, k->offset, c->value);
    return ZS_OK;
}

/* A number of an INT or NUMBER row (type), or one element of a PAIR row, checked for range. */
static zs_status_t zd_tc_number(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, zd_tc_type_t type,
                                const char *shown, const cJSON *item, double *v_p)
{
    double v;

    if (!cJSON_IsNumber(item)) {
        return zd_tc_bad_value(ctx, k, type, shown, item);
    }
    v = item->valuedouble;
    if ((k->flags & ZD_TC_INF_NEVER) && v == INFINITY) {
        *v_p = v;
        return ZS_OK;
    }
    if (!isfinite(v) || (type == ZD_TC_INT && floor(v) != v)) {
        return zd_tc_bad_value(ctx, k, type, shown, item);
    }
    if (k->choices == NULL &&
        (v < k->min || v > k->max || ((k->flags & ZD_TC_MIN_OPEN) && v == k->min) ||
         ((k->flags & ZD_TC_MAX_OPEN) && v == k->max))) {
        return zd_tc_bad_value(ctx, k, type, shown, item);
    }
    *v_p = v;
    return ZS_OK;
}

static zs_status_t zd_tc_set_pair(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, const char *shown,
                                  const cJSON *item)
{
    char elem[ZD_TC_PATHLEN + 8];
    double v[2];
    zs_status_t st;

    if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 2) {
        return zd_tc_bad_value(ctx, k, ZD_TC_PAIR, shown, item);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(elem, sizeof(elem), "%s[%d]", shown, i);
        st = zd_tc_number(ctx, k, ZD_TC_NUMBER, elem, cJSON_GetArrayItem(item, i), &v[i]);
        if (st != ZS_OK) {
            return st;
        }
    }
    zd_tc_store(ctx, k, k->offset, v[0]);
    zd_tc_store(ctx, k, k->offset2, v[1]);
    return ZS_OK;
}

/* A leaf row without a default (or with the default null) takes null: not given. */
static bool zd_tc_null_ok(const zd_tc_key_t *k)
{
    return k->def == NULL || strcmp(k->def, "null") == 0;
}

/* "auto" is the Hugging Face integration's placeholder, filled in from the Trainer's own
 * arguments before DeepSpeed sees the config; nothing here can resolve it. */
static bool zd_tc_is_auto(const zd_tc_key_t *k, const cJSON *item)
{
    return cJSON_IsString(item) && strcmp(item->valuestring, "auto") == 0 &&
           (k->type != ZD_TC_ENUM || zd_tc_choice(k, item) == NULL);
}

/* One value of a leaf row (not an object). */
static zs_status_t zd_tc_set_leaf(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, const char *shown,
                                  const cJSON *item)
{
    double v;
    zs_status_t st;

    if (cJSON_IsNull(item) && zd_tc_null_ok(k)) {
        zd_tc_store(ctx, k, k->offset, 0);
        return ZS_OK;
    }
    if (zd_tc_is_auto(k, item)) {
        return zd_tc_fail(ctx,
                          "config key '%s': \"auto\" is filled in by the Hugging Face Trainer's "
                          "DeepSpeed integration from its own arguments; zerod takes the config "
                          "as given: write the value",
                          shown);
    }
    switch (k->type) {
    case ZD_TC_BOOL:
        if (!cJSON_IsBool(item)) {
            return zd_tc_bad_value(ctx, k, k->type, shown, item);
        }
        zd_tc_store(ctx, k, k->offset, cJSON_IsTrue(item) ? 1 : 0);
        return ZS_OK;
    case ZD_TC_INT:
    case ZD_TC_NUMBER:
        st = zd_tc_number(ctx, k, k->type, shown, item, &v);
        if (st == ZS_OK && k->choices != NULL) {
            return zd_tc_set_choice(ctx, k, shown, item);
        }
        if (st == ZS_OK) {
            zd_tc_store(ctx, k, k->offset, isinf(v) ? 0 : v); /* Infinity: never (0) */
        }
        return st;
    case ZD_TC_ENUM:
        if (!cJSON_IsString(item)) {
            return zd_tc_bad_value(ctx, k, k->type, shown, item);
        }
        return zd_tc_set_choice(ctx, k, shown, item);
    case ZD_TC_PAIR:
        return zd_tc_set_pair(ctx, k, shown, item);
    case ZD_TC_OBJECT:
        break;
    }
    return zd_tc_fail(ctx, "config key '%s': no parser for this key", shown);
}

/* ---- unknown keys ------------------------------------------------------------------------- */

/* Append a key to the caller's ignored list; "..." once it is full. */
static void zd_tc_ignore(zd_tc_ctx_t *ctx, const char *shown)
{
    static const char more[] = ", ...";
    size_t used;

    if (ctx->ignored == NULL || ctx->ignored_full) {
        return;
    }
    used = strlen(ctx->ignored);
    if (used + (used > 0 ? 2 : 0) + strlen(shown) + sizeof(more) > ctx->ignored_len) {
        ctx->ignored_full = true;
        if (used + sizeof(more) <= ctx->ignored_len) {
            snprintf(ctx->ignored + used, ctx->ignored_len - used, "%s", used > 0 ? more : "...");
        }
        return;
    }
    snprintf(ctx->ignored + used, ctx->ignored_len - used, "%s%s", used > 0 ? ", " : "", shown);
}

/* A key the table does not have under `parent`: refused, or ignored under an open object when
 * it does not look like a typo. */
static zs_status_t zd_tc_unknown(zd_tc_ctx_t *ctx, const zd_tc_key_t *parent,
                                 const char *shown_parent, const char *name, const char *shown)
{
    char hint[ZD_TC_PATHLEN + 64], known[512];

    zd_tc_suggest(parent, shown_parent, name, hint, sizeof(hint));
    if (hint[0] != '\0') {
        return zd_tc_fail(ctx, "config key '%s' is unknown%s", shown, hint);
    }
    if (parent->flags & ZD_TC_OPEN) {
        zd_tc_ignore(ctx, shown);
        return ZS_OK;
    }
    zd_tc_known(parent, shown_parent, known, sizeof(known));
    return zd_tc_fail(ctx, "config key '%s' is unknown%s", shown, known);
}

/* ---- objects ------------------------------------------------------------------------------ */

/* A key of fate refused: an error, unless its value is the row's default. */
static zs_status_t zd_tc_refuse(zd_tc_ctx_t *ctx, const zd_tc_key_t *k, const char *shown,
                                const cJSON *item)
{
    cJSON *def = k->def != NULL ? cJSON_Parse(k->def) : NULL;
    bool harmless = def != NULL && cJSON_Compare(def, item, true);
    char got[96];

    cJSON_Delete(def);
    if (harmless) {
        return ZS_OK;
    }
    if (k->def == NULL) {
        return zd_tc_fail(ctx, "config key '%s' is not supported (%s)", shown, k->doc);
    }
    zd_tc_render(item, false, got, sizeof(got));
    return zd_tc_fail(ctx, "config key '%s': %s is not supported (%s)", shown, got, k->doc);
}

static void zd_tc_walk(zd_tc_ctx_t *ctx, const zd_tc_key_t *parent, const char *shown,
                       const cJSON *obj);

/* The member `item` of the JSON object `obj` (the value of row `parent`) that row k (honoured)
 * names, shown as `shown`. */
static void zd_tc_member(zd_tc_ctx_t *ctx, const zd_tc_key_t *parent, const zd_tc_key_t *k,
                         const char *shown, const cJSON *item, const cJSON *obj)
{
    cJSON *lax = NULL;

    if (k->flags & ZD_TC_ALIAS) { /* DeepSpeed reads the alias only without the section */
        const zd_tc_key_t *section = zd_tc_find(k->def);
        const cJSON *given = cJSON_GetObjectItemCaseSensitive(obj, zd_tc_leaf(section));
        if (given != NULL && !cJSON_IsNull(given)) {
            zd_tc_ignore(ctx, shown);
            return;
        }
        k = section;
    }
    ctx->seen[k - zd_tc_keys] = true;
    if (k->type == ZD_TC_OBJECT) {
        if (!(k->flags & ZD_TC_OPAQUE)) {
            zd_tc_walk(ctx, k, shown, item);
        } else if (!cJSON_IsObject(item)) {
            zd_tc_bad_value(ctx, k, ZD_TC_OBJECT, shown, item);
        }
        return;
    }
    if (parent->flags & ZD_TC_LAX) {
        lax = zd_tc_lax(k, item);
    }
    zd_tc_set_leaf(ctx, k, shown, lax != NULL ? lax : item);
    cJSON_Delete(lax);
}

/* Every member of the JSON object `obj`, which is the value of row `parent` (shown as
 * `shown`); its problems go to ctx. */
static void zd_tc_walk(zd_tc_ctx_t *ctx, const zd_tc_key_t *parent, const char *shown,
                       const cJSON *obj)
{
    const cJSON *item;
    char child[ZD_TC_PATHLEN];

    if (!cJSON_IsObject(obj)) {
        zd_tc_bad_value(ctx, parent, ZD_TC_OBJECT, shown, obj);
        return;
    }
    cJSON_ArrayForEach(item, obj)
    {
        const zd_tc_key_t *k = zd_tc_child(parent, item->string);
        zd_tc_join(child, sizeof(child), shown, item->string);
        if (k == NULL) {
            zd_tc_unknown(ctx, parent, shown, item->string, child);
        } else if (k->fate == ZD_TC_REFUSED) {
            zd_tc_refuse(ctx, k, child, item);
        } else if (k->fate == ZD_TC_IGNORED) {
            zd_tc_ignore(ctx, child);
        } else {
            zd_tc_member(ctx, parent, k, child, item, obj);
        }
    }
}

/* Every row's default, parsed like a value (so a default is in its own range). */
static zs_status_t zd_tc_defaults(zd_tc_ctx_t *ctx)
{
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        cJSON *def;
        zs_status_t st;
        if (k->def == NULL || k->fate != ZD_TC_HONOURED || k->type == ZD_TC_OBJECT) {
            continue;
        }
        def = cJSON_Parse(k->def);
        if (def == NULL) {
            return zd_tc_fail(ctx, "config key '%s': default %s is not JSON", k->path, k->def);
        }
        st = zd_tc_set_leaf(ctx, k, k->path, def);
        cJSON_Delete(def);
        if (st != ZS_OK) {
            return st;
        }
    }
    return ZS_OK;
}

/* data_types.grad_accum_dtype: null is the param dtype (DeepSpeed's default); otherwise the
 * param dtype or fp32 (a sum in a narrower or other 16-bit type than the gradients is refused,
 * as DeepSpeed has no optimizer for that mix). */
static zs_status_t zd_tc_accum_rule(zd_tc_ctx_t *ctx, zd_train_config_t *cfg)
{
    zs_dtype_t want;

    if (cfg->grad_accum_code == 0) {
        cfg->grad_accum_dtype = cfg->dtype;
        return ZS_OK;
    }
    want = (zs_dtype_t)(cfg->grad_accum_code - 1);
    if (want != ZS_DTYPE_F32 && want != cfg->dtype) {
        return zd_tc_fail(ctx,
                          "config key 'data_types.grad_accum_dtype': \"%s\" with %s parameters is "
                          "not supported (sum in fp32, or in the param dtype)",
                          zs_dtype_name(want), zs_dtype_name(cfg->dtype));
    }
    cfg->grad_accum_dtype = want;
    return ZS_OK;
}

/* Rules between keys, once every key is read. */
static void zd_tc_rules(zd_tc_ctx_t *ctx, zd_train_config_t *cfg)
{
    const zd_tc_key_t *awm = zd_tc_find("optimizer.params.adam_w_mode");

    if (cfg->fp16_enabled && cfg->bf16_enabled) {
        zd_tc_fail(ctx, "config keys 'fp16.enabled' and 'bf16.enabled' are both true; choose one");
    }
    cfg->dtype =
        cfg->fp16_enabled ? ZS_DTYPE_F16 : (cfg->bf16_enabled ? ZS_DTYPE_BF16 : ZS_DTYPE_F32);
    if (cfg->optimizer_adamw) {
        if (awm != NULL && ctx->seen[awm - zd_tc_keys] && !cfg->opt.adam_w_mode) {
            zd_tc_fail(ctx, "config key 'optimizer.params.adam_w_mode': false contradicts "
                            "optimizer.type \"AdamW\" (use type \"Adam\" for L2 mode)");
        }
        cfg->opt.adam_w_mode = true;
    }
    cfg->gas_given = ctx->seen[zd_tc_find("gradient_accumulation_steps") - zd_tc_keys];
    zd_tc_accum_rule(ctx, cfg);
}

zs_status_t zd_train_config_parse(const char *json, zd_train_config_t *cfg, char *ignored,
                                  size_t ignored_len, char *err, size_t errlen)
{
    zd_train_config_t tmp;
    zd_tc_ctx_t ctx = {.base = (char *)&tmp,
                       .base_size = sizeof(tmp),
                       .ignored = ignored_len > 0 ? ignored : NULL,
                       .ignored_len = ignored_len,
                       .err = err,
                       .errlen = errlen};
    cJSON *root = NULL;
    zs_status_t st;

    memset(&tmp, 0, sizeof(tmp));
    if (ignored != NULL && ignored_len > 0) {
        ignored[0] = '\0';
    }
    if (zd_tc_defaults(&ctx) != ZS_OK) {
        return zd_tc_report(&ctx);
    }
    if (json != NULL && *json != '\0') {
        st = zd_tc_json_parse(json, "config", &root, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        if (!cJSON_IsObject(root)) {
            zd_tc_fail(&ctx, "config: expected a JSON object at the top level");
            goto out;
        }
        zd_tc_walk(&ctx, &zd_tc_keys[0], "", root);
    }
    zd_tc_rules(&ctx, &tmp);
out:
    cJSON_Delete(root);
    st = zd_tc_report(&ctx);
    if (st == ZS_OK) {
        *cfg = tmp;
    }
    return st;
}

zs_status_t zd_group_opts_parse(const char *json, const zd_group_opts_t *base, uint32_t group,
                                zd_group_opts_t *opts, char *err, size_t errlen)
{
    zd_group_opts_t tmp = *base;
    zd_tc_ctx_t ctx = {.base = (char *)&tmp,
                       .base_off = offsetof(zd_train_config_t, opt),
                       .base_size = sizeof(tmp),
                       .err = err,
                       .errlen = errlen};
    char shown[64];
    cJSON *root;
    zs_status_t st;

    if (json == NULL || *json == '\0') {
        *opts = tmp;
        return ZS_OK;
    }
    snprintf(shown, sizeof(shown), "groups[%u].options", group);
    st = zd_tc_json_parse(json, shown, &root, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    zd_tc_walk(&ctx, zd_tc_find("optimizer.params"), shown, root);
    cJSON_Delete(root);
    st = zd_tc_report(&ctx);
    if (st == ZS_OK) {
        *opts = tmp;
    }
    return st;
}
