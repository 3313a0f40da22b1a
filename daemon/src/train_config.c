#include "train_config.h"

#define XXH_STATIC_LINKING_ONLY
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

/* Parsing context: the dotted path of the object being read, for messages. */
typedef struct zd_cfg_ctx {
    char *err;
    size_t errlen;
} zd_cfg_ctx_t;

static zs_status_t zd_cfg_fail(zd_cfg_ctx_t *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static zs_status_t zd_cfg_fail(zd_cfg_ctx_t *ctx, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(ctx->err, ctx->errlen, fmt, ap);
    va_end(ap);
    return ZS_ERR_CONFIG;
}

static const char *zd_cfg_type_name(const cJSON *item)
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

/* A short rendering of a value for messages. */
static void zd_cfg_render(const cJSON *item, char *buf, size_t len)
{
    char *s = cJSON_PrintUnformatted(item);

    snprintf(buf, len, "%s", s != NULL ? s : "?");
    if (strlen(buf) > 60) {
        strcpy(buf + 56, "...");
    }
    cJSON_free(s);
}

static zs_status_t zd_cfg_number(zd_cfg_ctx_t *ctx, const cJSON *item, const char *key, double min,
                                 double max, bool integer, double *out)
{
    char val[80];
    double v;

    if (!cJSON_IsNumber(item)) {
        zd_cfg_render(item, val, sizeof(val));
        return zd_cfg_fail(ctx, "config key '%s': expected a number, got %s %s", key,
                           zd_cfg_type_name(item), val);
    }
    v = item->valuedouble;
    if (!isfinite(v) || v < min || v > max) {
        return zd_cfg_fail(ctx, "config key '%s': value %g is out of range [%g, %g]", key, v, min,
                           max);
    }
    if (integer && floor(v) != v) {
        return zd_cfg_fail(ctx, "config key '%s': value %g is not an integer", key, v);
    }
    *out = v;
    return ZS_OK;
}

static zs_status_t zd_cfg_bool(zd_cfg_ctx_t *ctx, const cJSON *item, const char *key, bool *out)
{
    char val[80];

    if (!cJSON_IsBool(item)) {
        zd_cfg_render(item, val, sizeof(val));
        return zd_cfg_fail(ctx, "config key '%s': expected true or false, got %s %s", key,
                           zd_cfg_type_name(item), val);
    }
    *out = cJSON_IsTrue(item);
    return ZS_OK;
}

static zs_status_t zd_cfg_object(zd_cfg_ctx_t *ctx, const cJSON *item, const char *key)
{
    char val[80];

    if (!cJSON_IsObject(item)) {
        zd_cfg_render(item, val, sizeof(val));
        return zd_cfg_fail(ctx, "config key '%s': expected an object, got %s %s", key,
                           zd_cfg_type_name(item), val);
    }
    return ZS_OK;
}

#define ZD_CFG_TRY(expr)                                                                           \
    do {                                                                                           \
        zs_status_t _st = (expr);                                                                  \
        if (_st != ZS_OK) {                                                                        \
            return _st;                                                                            \
        }                                                                                          \
    } while (0)

static zs_status_t zd_cfg_opt_params(zd_cfg_ctx_t *ctx, const cJSON *obj, const char *prefix,
                                     zd_group_opts_t *o)
{
    const cJSON *item;
    char key[128];
    double d;

    ZD_CFG_TRY(zd_cfg_object(ctx, obj, prefix));
    cJSON_ArrayForEach(item, obj)
    {
        snprintf(key, sizeof(key), "%s.%s", prefix, item->string);
        if (strcmp(item->string, "lr") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 1e6, false, &o->lr));
        } else if (strcmp(item->string, "eps") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 1, false, &o->eps));
        } else if (strcmp(item->string, "weight_decay") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 1e6, false, &o->weight_decay));
        } else if (strcmp(item->string, "bias_correction") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &o->bias_correction));
        } else if (strcmp(item->string, "adam_w_mode") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &o->adam_w_mode));
        } else if (strcmp(item->string, "betas") == 0) {
            char val[80];
            if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 2) {
                zd_cfg_render(item, val, sizeof(val));
                return zd_cfg_fail(ctx, "config key '%s': expected [beta1, beta2], got %s", key,
                                   val);
            }
            snprintf(key, sizeof(key), "%s.betas[0]", prefix);
            ZD_CFG_TRY(
                zd_cfg_number(ctx, cJSON_GetArrayItem(item, 0), key, 0, 0.999999999, false, &d));
            o->beta1 = d;
            snprintf(key, sizeof(key), "%s.betas[1]", prefix);
            ZD_CFG_TRY(
                zd_cfg_number(ctx, cJSON_GetArrayItem(item, 1), key, 0, 0.999999999, false, &d));
            o->beta2 = d;
        } else {
            return zd_cfg_fail(ctx,
                               "config key '%s' is unknown (known: lr, betas, eps, weight_decay, "
                               "bias_correction, adam_w_mode)",
                               key);
        }
    }
    return ZS_OK;
}

static zs_status_t zd_cfg_optimizer(zd_cfg_ctx_t *ctx, const cJSON *obj, zd_train_config_t *cfg)
{
    const cJSON *item;
    const cJSON *params = NULL;
    bool adam_w_set = false;
    char key[128];

    ZD_CFG_TRY(zd_cfg_object(ctx, obj, "optimizer"));
    cJSON_ArrayForEach(item, obj)
    {
        snprintf(key, sizeof(key), "optimizer.%s", item->string);
        if (strcmp(item->string, "type") == 0) {
            if (!cJSON_IsString(item)) {
                return zd_cfg_fail(ctx, "config key '%s': expected \"Adam\" or \"AdamW\", got %s",
                                   key, zd_cfg_type_name(item));
            }
            if (strcasecmp(item->valuestring, "adamw") == 0) {
                cfg->optimizer_adamw = true;
            } else if (strcasecmp(item->valuestring, "adam") == 0) {
                cfg->optimizer_adamw = false;
            } else {
                return zd_cfg_fail(ctx,
                                   "config key '%s': optimizer \"%s\" is not supported (zerod "
                                   "runs Adam and AdamW)",
                                   key, item->valuestring);
            }
        } else if (strcmp(item->string, "params") == 0) {
            params = item;
        } else {
            return zd_cfg_fail(ctx, "config key '%s' is unknown (known: type, params)", key);
        }
    }
    if (params != NULL) {
        ZD_CFG_TRY(zd_cfg_opt_params(ctx, params, "optimizer.params", &cfg->opt));
        adam_w_set = cJSON_GetObjectItemCaseSensitive(params, "adam_w_mode") != NULL;
    }
    if (cfg->optimizer_adamw) {
        if (adam_w_set && !cfg->opt.adam_w_mode) {
            return zd_cfg_fail(ctx, "config key 'optimizer.params.adam_w_mode': false contradicts "
                                    "optimizer.type \"AdamW\" (use type \"Adam\" for L2 mode)");
        }
        cfg->opt.adam_w_mode = true;
    }
    return ZS_OK;
}

static zs_status_t zd_cfg_zero(zd_cfg_ctx_t *ctx, const cJSON *obj, zd_train_config_t *cfg,
                               char *ignored, size_t ignored_len)
{
    const cJSON *item;
    char key[128];
    double d;

    ZD_CFG_TRY(zd_cfg_object(ctx, obj, "zero_optimization"));
    cJSON_ArrayForEach(item, obj)
    {
        snprintf(key, sizeof(key), "zero_optimization.%s", item->string);
        if (strcmp(item->string, "stage") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 1e9, true, &d));
            if (d == 0) {
                return zd_cfg_fail(ctx,
                                   "config key '%s': stage 0 is plain data parallelism; "
                                   "use DDP (zerod serves stages 1 and 2)",
                                   key);
            }
            if (d >= 3) {
                return zd_cfg_fail(ctx,
                                   "config key '%s': stage %g is not supported (zerod "
                                   "serves stages 1 and 2; stage 3 parameter partitioning "
                                   "is not implemented)",
                                   key, d);
            }
            cfg->stage = (uint32_t)d;
        } else if (strcmp(item->string, "reduce_bucket_size") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 1, 1e15, true, &d));
            cfg->reduce_bucket_size = (uint64_t)d;
        } else if (strcmp(item->string, "overlap_comm") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &cfg->overlap_comm));
        } else if (strcmp(item->string, "contiguous_gradients") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &cfg->contiguous_gradients));
        } else if (strcmp(item->string, "round_robin_gradients") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &cfg->round_robin_gradients));
        } else if (strcmp(item->string, "offload_optimizer") == 0) {
            const cJSON *dev;
            ZD_CFG_TRY(zd_cfg_object(ctx, item, key));
            cJSON_ArrayForEach(dev, item)
            {
                if (strcmp(dev->string, "device") != 0) {
                    return zd_cfg_fail(ctx, "config key '%s.%s' is unknown (known: device)", key,
                                       dev->string);
                }
                if (!cJSON_IsString(dev) || (strcmp(dev->valuestring, "none") != 0 &&
                                             strcmp(dev->valuestring, "cpu") != 0)) {
                    char val[80];
                    zd_cfg_render(dev, val, sizeof(val));
                    return zd_cfg_fail(ctx,
                                       "config key '%s.device': expected \"none\" or \"cpu\", "
                                       "got %s",
                                       key, val);
                }
                cfg->offload_cpu = strcmp(dev->valuestring, "cpu") == 0;
            }
        } else if (strcmp(item->string, "allgather_partitions") == 0 ||
                   strcmp(item->string, "allgather_bucket_size") == 0 ||
                   strcmp(item->string, "reduce_scatter") == 0) {
            /* DeepSpeed tuning knobs with no meaning here: zerod always reduce-scatters and
             * all-gathers per bucket. */
            if (ignored != NULL) {
                size_t used = strlen(ignored);
                snprintf(ignored + used, ignored_len - used, "%s%s", used ? ", " : "", key);
            }
        } else {
            return zd_cfg_fail(ctx,
                               "config key '%s' is unknown (known: stage, reduce_bucket_size, "
                               "overlap_comm, contiguous_gradients, round_robin_gradients, "
                               "offload_optimizer)",
                               key);
        }
    }
    return ZS_OK;
}

static zs_status_t zd_cfg_fp16(zd_cfg_ctx_t *ctx, const cJSON *obj, zd_train_config_t *cfg,
                               bool *enabled)
{
    const cJSON *item;
    char key[128];
    double d;

    ZD_CFG_TRY(zd_cfg_object(ctx, obj, "fp16"));
    cJSON_ArrayForEach(item, obj)
    {
        snprintf(key, sizeof(key), "fp16.%s", item->string);
        if (strcmp(item->string, "enabled") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, enabled));
        } else if (strcmp(item->string, "loss_scale") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 1e38, false, &cfg->static_loss_scale));
        } else if (strcmp(item->string, "initial_scale_power") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 0, 126, true, &d));
            cfg->initial_scale_power = (int)d;
        } else if (strcmp(item->string, "loss_scale_window") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 1, 1e9, true, &d));
            cfg->loss_scale_window = (uint32_t)d;
        } else if (strcmp(item->string, "hysteresis") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 1, 1e9, true, &d));
            cfg->hysteresis = (uint32_t)d;
        } else if (strcmp(item->string, "consecutive_hysteresis") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &cfg->consecutive_hysteresis));
        } else if (strcmp(item->string, "min_loss_scale") == 0) {
            ZD_CFG_TRY(zd_cfg_number(ctx, item, key, 1e-38, 1e38, false, &cfg->min_loss_scale));
        } else {
            return zd_cfg_fail(ctx,
                               "config key '%s' is unknown (known: enabled, loss_scale, "
                               "initial_scale_power, loss_scale_window, hysteresis, "
                               "consecutive_hysteresis, min_loss_scale)",
                               key);
        }
    }
    return ZS_OK;
}

static zs_status_t zd_cfg_bf16(zd_cfg_ctx_t *ctx, const cJSON *obj, zd_train_config_t *cfg,
                               bool *enabled)
{
    const cJSON *item;
    char key[128];

    ZD_CFG_TRY(zd_cfg_object(ctx, obj, "bf16"));
    cJSON_ArrayForEach(item, obj)
    {
        snprintf(key, sizeof(key), "bf16.%s", item->string);
        if (strcmp(item->string, "enabled") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, enabled));
        } else if (strcmp(item->string, "check_grad_overflow") == 0) {
            ZD_CFG_TRY(zd_cfg_bool(ctx, item, key, &cfg->bf16_check_overflow));
        } else {
            return zd_cfg_fail(
                ctx, "config key '%s' is unknown (known: enabled, check_grad_overflow)", key);
        }
    }
    return ZS_OK;
}

static void zd_train_config_defaults(zd_train_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->stage = 2;
    cfg->reduce_bucket_size = 500000000ull;
    cfg->overlap_comm = true;
    cfg->contiguous_gradients = true;
    cfg->dtype = ZS_DTYPE_F32;
    cfg->initial_scale_power = 16;
    cfg->loss_scale_window = 1000;
    cfg->hysteresis = 2;
    cfg->min_loss_scale = 1;
    cfg->bf16_check_overflow = true;
    cfg->gradient_clipping = 1.0;
    cfg->gradient_accumulation_steps = 1;
    cfg->allreduce_mean = true;
    cfg->optimizer_adamw = true;
    cfg->opt.lr = 1e-3;
    cfg->opt.beta1 = 0.9;
    cfg->opt.beta2 = 0.999;
    cfg->opt.eps = 1e-8;
    cfg->opt.weight_decay = 0;
    cfg->opt.bias_correction = true;
    cfg->opt.adam_w_mode = true;
}

zs_status_t zd_train_config_parse(const char *json, zd_train_config_t *cfg, char *ignored,
                                  size_t ignored_len, char *err, size_t errlen)
{
    zd_cfg_ctx_t ctx = {err, errlen};
    zd_train_config_t tmp;
    cJSON *root;
    const cJSON *item;
    bool fp16 = false, bf16 = false;
    zs_status_t status = ZS_OK;
    double d;

    zd_train_config_defaults(&tmp);
    if (ignored != NULL && ignored_len > 0) {
        ignored[0] = '\0';
    }
    if (json == NULL || *json == '\0') {
        *cfg = tmp;
        return ZS_OK;
    }
    root = cJSON_Parse(json);
    if (root == NULL) {
        const char *at = cJSON_GetErrorPtr();
        return zd_cfg_fail(&ctx, "config: not valid JSON near '%.20s'", at != NULL ? at : "?");
    }
    if (!cJSON_IsObject(root)) {
        status = zd_cfg_fail(&ctx, "config: expected a JSON object at the top level");
        goto out;
    }
    cJSON_ArrayForEach(item, root)
    {
        const char *k = item->string;
        if (strcmp(k, "zero_optimization") == 0) {
            status = zd_cfg_zero(&ctx, item, &tmp, ignored, ignored_len);
        } else if (strcmp(k, "fp16") == 0) {
            status = zd_cfg_fp16(&ctx, item, &tmp, &fp16);
        } else if (strcmp(k, "bf16") == 0) {
            status = zd_cfg_bf16(&ctx, item, &tmp, &bf16);
        } else if (strcmp(k, "gradient_clipping") == 0) {
            status = zd_cfg_number(&ctx, item, k, 0, 1e38, false, &tmp.gradient_clipping);
        } else if (strcmp(k, "gradient_accumulation_steps") == 0) {
            status = zd_cfg_number(&ctx, item, k, 1, 1e6, true, &d);
            if (status == ZS_OK) {
                tmp.gradient_accumulation_steps = (uint32_t)d;
            }
        } else if (strcmp(k, "gradient_allreduce_op") == 0) {
            if (!cJSON_IsString(item) ||
                (strcmp(item->valuestring, "mean") != 0 && strcmp(item->valuestring, "sum") != 0)) {
                char val[80];
                zd_cfg_render(item, val, sizeof(val));
                status = zd_cfg_fail(&ctx, "config key '%s': expected \"mean\" or \"sum\", got %s",
                                     k, val);
            } else {
                tmp.allreduce_mean = strcmp(item->valuestring, "mean") == 0;
            }
        } else if (strcmp(k, "optimizer") == 0) {
            status = zd_cfg_optimizer(&ctx, item, &tmp);
        } else if (ignored != NULL) {
            size_t used = strlen(ignored);
            snprintf(ignored + used, ignored_len - used, "%s%s", used ? ", " : "", k);
        }
        if (status != ZS_OK) {
            goto out;
        }
    }
    if (fp16 && bf16) {
        status = zd_cfg_fail(&ctx, "config keys 'fp16.enabled' and 'bf16.enabled' are both true; "
                                   "choose one");
        goto out;
    }
    tmp.dtype = fp16 ? ZS_DTYPE_F16 : (bf16 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32);
    *cfg = tmp;
out:
    cJSON_Delete(root);
    return status;
}

zs_status_t zd_group_opts_parse(const char *json, const zd_group_opts_t *base, uint32_t group,
                                zd_group_opts_t *opts, char *err, size_t errlen)
{
    zd_cfg_ctx_t ctx = {err, errlen};
    zd_group_opts_t tmp = *base;
    char prefix[64];
    cJSON *root;
    zs_status_t status;

    if (json == NULL || *json == '\0') {
        *opts = tmp;
        return ZS_OK;
    }
    snprintf(prefix, sizeof(prefix), "groups[%u].options", group);
    root = cJSON_Parse(json);
    if (root == NULL) {
        return zd_cfg_fail(&ctx, "%s: not valid JSON", prefix);
    }
    status = zd_cfg_opt_params(&ctx, root, prefix, &tmp);
    cJSON_Delete(root);
    if (status == ZS_OK) {
        *opts = tmp;
    }
    return status;
}

uint64_t zd_train_config_hash(const zd_train_config_t *c)
{
    char buf[1024];
    int n;

    /* A canonical text of every field that changes the math; %a keeps doubles exact. */
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
    return XXH3_64bits(buf, (size_t)n);
}
