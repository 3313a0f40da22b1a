/*
 * The training config parsed (config/train_config.h): a walk of the JSON against the key table,
 * each value checked and stored where its row says, refused and ignored keys handled as their
 * fate says, defaults for what was not given, the rules between keys, the batch triple, a
 * group's options, and the hash of what changes the math.
 */
#include "config/train_config.h"
#include "config/train_config_int.h"

#include "zs/config.h"
#include "zs/error.h"

#define XXH_STATIC_LINKING_ONLY
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

#define ZD_TC_N_KEYS zd_tc_n_keys

/* ---- messages ----------------------------------------------------------------------------- */

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
    bool seen[ZD_TC_MAX_KEYS];
} zd_tc_ctx_t;

static zs_status_t zd_tc_fail(zd_tc_ctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static zs_status_t zd_tc_fail(zd_tc_ctx_t *ctx, const char *fmt, ...)
{
    va_list ap;
    zs_status_t st;

    va_start(ap, fmt);
    st = zs_verrf(ctx->err, ctx->errlen, ZS_ERR_CONFIG, fmt, ap);
    va_end(ap);
    return st;
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
    if (cJSON_IsNumber(item) && !isfinite(item->valuedouble)) {
        text = item->valuedouble > 0 ? "inf" : "-inf"; /* cJSON prints null */
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
            zd_tc_store(ctx, k, k->offset, v);
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

/* Every member of the JSON object `obj`, which is the value of row `parent` (shown as
 * `shown`). */
static zs_status_t zd_tc_walk(zd_tc_ctx_t *ctx, const zd_tc_key_t *parent, const char *shown,
                              const cJSON *obj)
{
    const cJSON *item;
    char child[ZD_TC_PATHLEN];
    zs_status_t st = ZS_OK;

    if (!cJSON_IsObject(obj)) {
        return zd_tc_bad_value(ctx, parent, ZD_TC_OBJECT, shown, obj);
    }
    cJSON_ArrayForEach(item, obj)
    {
        const zd_tc_key_t *k = zd_tc_child(parent, item->string);
        zd_tc_join(child, sizeof(child), shown, item->string);
        if (k == NULL) {
            st = zd_tc_unknown(ctx, parent, shown, item->string, child);
        } else if (k->fate == ZD_TC_REFUSED) {
            st = zd_tc_refuse(ctx, k, child, item);
        } else if (k->fate == ZD_TC_IGNORED) {
            zd_tc_ignore(ctx, child);
        } else {
            ctx->seen[k - zd_tc_keys] = true;
            st = k->type != ZD_TC_OBJECT      ? zd_tc_set_leaf(ctx, k, child, item)
                 : !(k->flags & ZD_TC_OPAQUE) ? zd_tc_walk(ctx, k, child, item)
                 : cJSON_IsObject(item)       ? ZS_OK
                                              : zd_tc_bad_value(ctx, k, ZD_TC_OBJECT, child, item);
        }
        if (st != ZS_OK) {
            return st;
        }
    }
    return ZS_OK;
}

/* Every row's default, parsed like a value (so a default is in its own range). */
static zs_status_t zd_tc_defaults(zd_tc_ctx_t *ctx)
{
    for (size_t i = 0; i < ZD_TC_N_KEYS; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        cJSON *def;
        zs_status_t st;
        if (k->def == NULL || k->fate != ZD_TC_HONOURED) {
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
static zs_status_t zd_tc_rules(zd_tc_ctx_t *ctx, zd_train_config_t *cfg)
{
    const zd_tc_key_t *awm = zd_tc_find("optimizer.params.adam_w_mode");

    if (cfg->fp16_enabled && cfg->bf16_enabled) {
        return zd_tc_fail(ctx, "config keys 'fp16.enabled' and 'bf16.enabled' are both true; "
                               "choose one");
    }
    cfg->dtype =
        cfg->fp16_enabled ? ZS_DTYPE_F16 : (cfg->bf16_enabled ? ZS_DTYPE_BF16 : ZS_DTYPE_F32);
    if (cfg->optimizer_adamw) {
        if (awm != NULL && ctx->seen[awm - zd_tc_keys] && !cfg->opt.adam_w_mode) {
            return zd_tc_fail(ctx, "config key 'optimizer.params.adam_w_mode': false contradicts "
                                   "optimizer.type \"AdamW\" (use type \"Adam\" for L2 mode)");
        }
        cfg->opt.adam_w_mode = true;
    }
    cfg->gas_given = ctx->seen[zd_tc_find("gradient_accumulation_steps") - zd_tc_keys];
    return zd_tc_accum_rule(ctx, cfg);
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
    st = zd_tc_defaults(&ctx);
    if (st != ZS_OK) {
        return st;
    }
    if (json != NULL && *json != '\0') {
        root = cJSON_Parse(json);
        if (root == NULL) {
            const char *at = cJSON_GetErrorPtr();
            return zd_tc_fail(&ctx, "config: not valid JSON near '%.20s'", at != NULL ? at : "?");
        }
        if (!cJSON_IsObject(root)) {
            st = zd_tc_fail(&ctx, "config: expected a JSON object at the top level");
            goto out;
        }
        st = zd_tc_walk(&ctx, &zd_tc_keys[0], "", root);
        if (st != ZS_OK) {
            goto out;
        }
    }
    st = zd_tc_rules(&ctx, &tmp);
    if (st == ZS_OK) {
        *cfg = tmp;
    }
out:
    cJSON_Delete(root);
    return st;
}

/* DeepSpeed's _set_batch_related_parameters and _batch_assertion, with one difference: neither
 * batch size given is not an error (zerod needs none; the engine then reports none). */
zs_status_t zd_train_config_resolve_batch(zd_train_config_t *cfg, uint32_t world, char *err,
                                          size_t errlen)
{
    uint64_t tb = cfg->train_batch_size, mb = cfg->micro_batch_size;
    uint64_t gas = cfg->gas_given ? cfg->gradient_accumulation_steps : 0;
    uint64_t w = world > 0 ? world : 1;

    if (tb == 0 && mb == 0) {
        return ZS_OK;
    }
    if (tb != 0 && mb != 0 && gas == 0) {
        gas = tb / mb / w;
    } else if (tb != 0 && mb == 0) {
        gas = gas == 0 ? 1 : gas;
        mb = tb / w / gas;
    } else if (tb == 0) {
        gas = gas == 0 ? 1 : gas;
        tb = mb * gas * w;
    }
    if (tb == 0 || mb == 0 || gas == 0 || tb != mb * gas * w || tb > UINT32_MAX) {
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "config keys 'train_batch_size' %llu%s, 'train_micro_batch_size_per_gpu' "
                       "%llu%s and 'gradient_accumulation_steps' %llu%s disagree: with world %llu "
                       "the batch must be micro x gradient_accumulation_steps x world = %llu, "
                       "every term at least 1",
                       (unsigned long long)tb, cfg->train_batch_size ? "" : " (derived)",
                       (unsigned long long)mb, cfg->micro_batch_size ? "" : " (derived)",
                       (unsigned long long)gas, cfg->gas_given ? "" : " (derived)",
                       (unsigned long long)w, (unsigned long long)(mb * gas * w));
    }
    cfg->train_batch_size = (uint32_t)tb;
    cfg->micro_batch_size = (uint32_t)mb;
    cfg->gradient_accumulation_steps = (uint32_t)gas;
    return ZS_OK;
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
    root = cJSON_Parse(json);
    if (root == NULL) {
        return zd_tc_fail(&ctx, "%s: not valid JSON", shown);
    }
    st = zd_tc_walk(&ctx, zd_tc_find("optimizer.params"), shown, root);
    cJSON_Delete(root);
    if (st == ZS_OK) {
        *opts = tmp;
    }
    return st;
}

uint64_t zd_train_config_hash(const zd_train_config_t *c)
{
    char buf[1024];
    int n;

    /* A canonical text of every field that changes the math (the rows flagged ZD_TC_MATH; a
     * unit test holds the two together); %a keeps doubles exact. The text is the one of
     * earlier versions, so their hashes still match. */
    n = snprintf(buf, sizeof(buf),
                 "v1 stage=%u bucket=%llu rr=%d dtype=%d ls=%a isp=%d win=%u hyst=%u ch=%d "
                 "min=%a bf16chk=%d clip=%a G=%u mean=%d adamw=%d lr=%a b1=%a b2=%a eps=%a "
                 "wd=%a bc=%d awm=%d off=%d",
                 c->stage, (unsigned long long)c->reduce_bucket_size, c->round_robin_gradients,
                 (int)c->dtype, c->static_loss_scale, c->initial_scale_power, c->loss_scale_window,
                 c->hysteresis, c->consecutive_hysteresis, c->min_loss_scale,
                 c->bf16_check_overflow, c->gradient_clipping, c->gradient_accumulation_steps,
                 c->allreduce_mean, c->optimizer_adamw, c->opt.lr, c->opt.beta1, c->opt.beta2,
                 c->opt.eps, c->opt.weight_decay, c->opt.bias_correction, c->opt.adam_w_mode,
                 c->offload_cpu);
    if (c->grad_accum_dtype != c->dtype && n > 0 && (size_t)n < sizeof(buf)) {
        /* only when it differs, so that the hash of every earlier config stays the same */
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, " gad=%d", (int)c->grad_accum_dtype);
    }
    return XXH3_64bits(buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}
