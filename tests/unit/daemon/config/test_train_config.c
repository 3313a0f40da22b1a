/* The training config (daemon/src/config/train_config.c): one table drives parsing, messages,
 * unknown keys, the ignored list, group overrides and the config hash. */
#define _GNU_SOURCE /* open_memstream */
#include "config/train_config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512];
static char ignored[256];

static zs_status_t parse(const char *json, zd_train_config_t *cfg)
{
    err[0] = '\0';
    return zd_train_config_parse(json, cfg, ignored, sizeof(ignored), err, sizeof(err));
}

static zd_train_config_t parse_ok(const char *json)
{
    zd_train_config_t cfg;
    zs_status_t st = parse(json, &cfg);

    cr_assert_eq(st, ZS_OK, "%s: %s", json, err);
    return cfg;
}

/* The config is refused with a message holding every needle (NULL ends the list early). */
static void expect_refused(const char *json, const char *needle1, const char *needle2)
{
    zd_train_config_t cfg;
    zs_status_t st = parse(json, &cfg);

    cr_assert_eq(st, ZS_ERR_CONFIG, "%s was accepted", json);
    cr_assert(strstr(err, needle1) != NULL, "%s: '%s' not in: %s", json, needle1, err);
    cr_assert(needle2 == NULL || strstr(err, needle2) != NULL, "%s: '%s' not in: %s", json, needle2,
              err);
}

/* {"a": {"b": VALUE}} for the dotted path "a.b". */
static void nest(const char *path, const char *value, char *buf, size_t len)
{
    size_t used = 0, depth = 0;
    const char *p = path;

    while (used < len) {
        const char *dot = strchr(p, '.');
        int n = dot != NULL ? (int)(dot - p) : (int)strlen(p);
        used += (size_t)snprintf(buf + used, len - used, "{\"%.*s\": ", n, p);
        depth++;
        if (dot == NULL) {
            break;
        }
        p = dot + 1;
    }
    used += (size_t)snprintf(buf + used, len - used, "%s", value);
    while (depth-- > 0 && used < len) {
        used += (size_t)snprintf(buf + used, len - used, "}");
    }
    cr_assert_lt(used, len, "nest(%s) does not fit", path);
}

Test(zd_train_config, defaults_are_those_of_semantics_md)
{
    static const char *const empty[] = {NULL, "", "{}"};

    for (size_t i = 0; i < 3; i++) {
        zd_train_config_t c = parse_ok(empty[i]);
        cr_assert_eq(c.stage, 2);
        cr_assert_eq(c.reduce_bucket_size, 500000000ull);
        cr_assert(c.overlap_comm && c.contiguous_gradients);
        cr_assert(!c.round_robin_gradients && !c.offload_cpu);
        cr_assert_eq(c.dtype, ZS_DTYPE_F32);
        cr_assert(!c.fp16_enabled && !c.bf16_enabled);
        cr_assert_eq(c.static_loss_scale, 0.0);
        cr_assert_eq(c.initial_scale_power, 16);
        cr_assert_eq(c.loss_scale_window, 1000);
        cr_assert_eq(c.hysteresis, 2);
        cr_assert(!c.consecutive_hysteresis);
        cr_assert_eq(c.min_loss_scale, 1.0);
        cr_assert(c.bf16_check_overflow);
        cr_assert_eq(c.gradient_clipping, 1.0);
        cr_assert_eq(c.gradient_accumulation_steps, 1);
        cr_assert(c.allreduce_mean && c.optimizer_adamw);
        cr_assert_eq(c.opt.lr, 1e-3);
        cr_assert_eq(c.opt.beta1, 0.9);
        cr_assert_eq(c.opt.beta2, 0.999);
        cr_assert_eq(c.opt.eps, 1e-8);
        cr_assert_eq(c.opt.weight_decay, 0.0);
        cr_assert(c.opt.bias_correction && c.opt.adam_w_mode);
        cr_assert_str_eq(ignored, "");
    }
}

static const char full_config[] =
    "{\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 64, \"overlap_comm\": false,"
    " \"contiguous_gradients\": false, \"round_robin_gradients\": true,"
    " \"offload_optimizer\": {\"device\": \"cpu\"}},"
    " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12,"
    " \"loss_scale_window\": 50, \"hysteresis\": 3, \"consecutive_hysteresis\": true,"
    " \"min_loss_scale\": 0.5}, \"bf16\": {\"check_grad_overflow\": false},"
    " \"gradient_clipping\": 0.5, \"gradient_accumulation_steps\": 4,"
    " \"gradient_allreduce_op\": \"sum\", \"optimizer\": {\"type\": \"Adam\","
    " \"params\": {\"lr\": 0.01, \"betas\": [0.8, 0.99], \"eps\": 1e-6, \"weight_decay\": 0.1,"
    " \"bias_correction\": false, \"adam_w_mode\": false}}}";

/* A real key's value beyond every integer type is stored as given. zd_tc_store used to convert
 * every value to each integer type first, undefined for this one (clang's UBSan in fuzz/ipc
 * found it; GCC's -fsanitize=undefined leaves float-cast-overflow out). */
Test(zd_train_config, huge_real_values_are_stored_as_given)
{
    zd_train_config_t c = parse_ok("{\"gradient_clipping\": 2e34}");

    cr_assert_eq(c.gradient_clipping, 2e34);
}

Test(zd_train_config, sets_every_honoured_key)
{
    zd_train_config_t c = parse_ok(full_config);

    cr_assert_eq(c.stage, 1);
    cr_assert_eq(c.reduce_bucket_size, 64);
    cr_assert(!c.overlap_comm && !c.contiguous_gradients);
    cr_assert(c.round_robin_gradients && c.offload_cpu);
    cr_assert_eq(c.dtype, ZS_DTYPE_F16);
    cr_assert_eq(c.initial_scale_power, 12);
    cr_assert_eq(c.loss_scale_window, 50);
    cr_assert_eq(c.hysteresis, 3);
    cr_assert(c.consecutive_hysteresis);
    cr_assert_eq(c.min_loss_scale, 0.5);
    cr_assert(!c.bf16_check_overflow);
    cr_assert_eq(c.gradient_clipping, 0.5);
    cr_assert_eq(c.gradient_accumulation_steps, 4);
    cr_assert(!c.allreduce_mean && !c.optimizer_adamw);
    cr_assert_eq(c.opt.lr, 0.01);
    cr_assert_eq(c.opt.beta1, 0.8);
    cr_assert_eq(c.opt.beta2, 0.99);
    cr_assert_eq(c.opt.eps, 1e-6);
    cr_assert_eq(c.opt.weight_decay, 0.1);
    cr_assert(!c.opt.bias_correction && !c.opt.adam_w_mode);
    c = parse_ok("{\"bf16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"adamw\"}}");
    cr_assert_eq(c.dtype, ZS_DTYPE_BF16);
    cr_assert(c.optimizer_adamw, "optimizer.type matches whatever the case");
}

/* The value a key of this type can never take. */
static const char *wrong_json_type(const zd_tc_key_t *k)
{
    switch (k->type) {
    case ZD_TC_BOOL:
        return "\"maybe\""; /* not one of the strings pydantic reads as a bool */
    case ZD_TC_ENUM:
        return "7";
    case ZD_TC_OBJECT:
        return "[1]";
    default:
        return "{\"x\": 1}";
    }
}

Test(zd_train_config, refuses_a_wrong_type_naming_key_and_value_for_every_key)
{
    size_t n;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);
    char json[512], key[128];

    for (size_t i = 1; i < n; i++) {
        if (keys[i].fate != ZD_TC_HONOURED) {
            continue;
        }
        nest(keys[i].path, wrong_json_type(&keys[i]), json, sizeof(json));
        snprintf(key, sizeof(key), "config key '%s': expected ", keys[i].path);
        expect_refused(json, key, keys[i].type == ZD_TC_ENUM ? "got a number 7" : "got a");
    }
}

Test(zd_train_config, says_what_a_key_takes)
{
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": -3}}",
                   "config key 'zero_optimization.reduce_bucket_size': expected a positive "
                   "integer, got -3",
                   NULL);
    cr_assert_str_eq(err, "config key 'zero_optimization.reduce_bucket_size': expected a positive "
                          "integer, got -3");
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": 2.5}}",
                   "expected a positive integer, got 2.5", NULL);
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": 1e300}}",
                   "expected a positive integer up to 1e+15, got 1e+300", NULL);
    expect_refused("{\"gradient_clipping\": 1e999}", "'gradient_clipping'", "got inf");
    expect_refused("{\"optimizer\": {\"params\": {\"lr\": \"fast\"}}}", "'optimizer.params.lr'",
                   "got a string \"fast\"");
    expect_refused("{\"fp16\": {\"min_loss_scale\": 0}}", "expected a positive number, got 0",
                   NULL);
    expect_refused("{\"gradient_allreduce_op\": \"max\"}", "expected \"mean\" or \"sum\"",
                   "got \"max\"");
    expect_refused("{\"prescale_gradients\": 1}", "'prescale_gradients': expected true or false",
                   "got a number 1");
    expect_refused("{\"bf16\": {\"enabled\": 2}}", "'bf16.enabled': expected true or false",
                   "got a number 2");
    expect_refused("{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}",
                   "'optimizer.params.betas': expected an array of two numbers", "got [0.9]");
    expect_refused("{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.5]}}}",
                   "'optimizer.params.betas[1]'", "got 1.5");
    expect_refused("{\"zero_optimization\": 3}", "'zero_optimization': expected an object",
                   "got a number 3");
}

/* Every int or number key takes both ends of its range and nothing beyond them. */
Test(zd_train_config, takes_each_range_end_and_refuses_beyond)
{
    size_t n;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);
    char json[512], value[64], key[128];
    zd_train_config_t cfg;

    for (size_t i = 1; i < n; i++) {
        const zd_tc_key_t *k = &keys[i];
        double below = k->min - (k->type == ZD_TC_INT ? 1 : (k->min == 0 ? 1e-3 : k->min / 2));
        bool min_ok = !(k->flags & ZD_TC_MIN_OPEN);
        if ((k->type != ZD_TC_INT && k->type != ZD_TC_NUMBER) || k->choices != NULL ||
            k->fate != ZD_TC_HONOURED) {
            continue;
        }
        snprintf(key, sizeof(key), "config key '%s': expected ", k->path);
        snprintf(value, sizeof(value), "%.17g", k->max);
        nest(k->path, value, json, sizeof(json));
        cr_assert_eq(parse(json, &cfg), ZS_OK, "%s: %s", json, err);
        snprintf(value, sizeof(value), "%.17g", k->max * 2 + 1);
        nest(k->path, value, json, sizeof(json));
        expect_refused(json, key, "up to");
        snprintf(value, sizeof(value), "%.17g", k->min);
        nest(k->path, value, json, sizeof(json));
        cr_assert_eq(parse(json, &cfg) == ZS_OK, min_ok, "%s: %s", json, err);
        snprintf(value, sizeof(value), "%.17g", min_ok ? below : k->min);
        nest(k->path, value, json, sizeof(json));
        expect_refused(json, key, NULL);
    }
}

Test(zd_train_config, int_ranges_fit_their_fields)
{
    size_t n;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);

    for (size_t i = 0; i < n; i++) {
        const zd_tc_key_t *k = &keys[i];
        double limit = k->store == ZD_TC_STORE_I32   ? 2147483647.0
                       : k->store == ZD_TC_STORE_U32 ? 4294967295.0
                                                     : 9007199254740992.0; /* 2^53 */
        if (k->type == ZD_TC_INT && k->choices == NULL && k->fate == ZD_TC_HONOURED) {
            cr_assert_leq(k->max, limit, "%s: max %g does not fit its field", k->path, k->max);
            cr_assert_geq(k->min, k->store == ZD_TC_STORE_I32 ? -2147483648.0 : 0.0, "%s", k->path);
        }
    }
}

Test(zd_train_config, refuses_a_refused_value_with_its_reason)
{
    expect_refused("{\"zero_optimization\": {\"stage\": 3}}",
                   "config key 'zero_optimization.stage': 3 is not supported",
                   "stage 3 parameter partitioning is not implemented");
    expect_refused("{\"zero_optimization\": {\"stage\": 0}}", "'zero_optimization.stage': 0",
                   "use DDP");
    expect_refused("{\"zero_optimization\": {\"stage\": 4}}", "expected 1 or 2, got 4", NULL);
    expect_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\"}}}",
                   "'zero_optimization.offload_optimizer.device': \"nvme\" is not supported",
                   "NVMe offload is not implemented");
    expect_refused("{\"zero_optimization\": {\"offload_param\": {\"device\": \"cpu\"}}}",
                   "'zero_optimization.offload_param.device': \"cpu\" is not supported",
                   "stage 3 feature");
    parse_ok("{\"zero_optimization\": {\"offload_param\": {\"device\": \"none\"}}}");
    expect_refused("{\"zero_optimization\": {\"zero_quantized_gradients\": true}}",
                   "config key 'zero_optimization.zero_quantized_gradients': true is not supported",
                   "ZeRO++");
    parse_ok("{\"zero_optimization\": {\"zero_quantized_gradients\": false}}");
    cr_assert_str_eq(ignored, "", "a refused key at the value zerod uses anyway is no warning");
    expect_refused("{\"optimizer\": {\"type\": \"SGD\"}}",
                   "'optimizer.type': expected \"Adam\" or \"AdamW\", got \"SGD\"", NULL);
}

Test(zd_train_config, refuses_rules_between_keys)
{
    zd_train_config_t c;

    expect_refused("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                   "'fp16.enabled' and 'bf16.enabled' are both true", NULL);
    expect_refused("{\"optimizer\": {\"params\": {\"adam_w_mode\": false}}}",
                   "'optimizer.params.adam_w_mode': false contradicts", "AdamW");
    c = parse_ok("{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}");
    cr_assert(!c.optimizer_adamw && !c.opt.adam_w_mode);
    c = parse_ok("{\"optimizer\": {\"type\": \"Adam\"}}");
    cr_assert(c.opt.adam_w_mode, "Adam keeps adam_w_mode's default");
}

Test(zd_train_config, refuses_unknown_key_with_did_you_mean)
{
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_sise\": 5}}",
                   "config key 'zero_optimization.reduce_bucket_sise' is unknown; did you mean "
                   "'zero_optimization.reduce_bucket_size'?",
                   NULL);
    expect_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"devcie\": \"cpu\"}}}",
                   "'zero_optimization.offload_optimizer.devcie' is unknown",
                   "did you mean 'zero_optimization.offload_optimizer.device'?");
    expect_refused("{\"optimizer\": {\"Type\": \"Adam\"}}", "did you mean 'optimizer.type'?", NULL);
    expect_refused("{\"fp16\": {\"loss_scale_windows\": 5}}",
                   "did you mean 'fp16.loss_scale_window'?", NULL);
}

Test(zd_train_config, refuses_unknown_key_in_a_section_listing_the_known_ones)
{
    expect_refused("{\"optimizer\": {\"params\": {\"lr\": 0.01, \"lr_warp\": 2}}}",
                   "config key 'optimizer.params.lr_warp' is unknown (known keys of "
                   "'optimizer.params': lr, betas, eps, weight_decay, bias_correction, "
                   "adam_w_mode, torch_adam, set_grad_none, foreach)",
                   NULL);
    expect_refused("{\"zero_optimization\": {\"frobnicate_widgets\": 1}}",
                   "'zero_optimization.frobnicate_widgets' is unknown",
                   "known keys of 'zero_optimization': stage, reduce_bucket_size");
    expect_refused("{\"bf16\": {\"x\": 1}}", "'bf16.x' is unknown",
                   "(known keys of 'bf16': enabled, check_grad_overflow, immediate_grad_update, "
                   "loss_scale, ");
}

Test(zd_train_config, refuses_a_key_of_another_section)
{
    expect_refused("{\"zero_optimization\": {\"loss_scale\": 5}}",
                   "'zero_optimization.loss_scale' is unknown; 'loss_scale' is a key of 'fp16'",
                   NULL);
    expect_refused("{\"stage\": 1}", "config key 'stage' is unknown",
                   "'stage' is a key of 'zero_optimization'");
}

Test(zd_train_config, refuses_a_top_level_typo_and_ignores_other_features)
{
    zd_train_config_t c;

    expect_refused("{\"fp61\": {\"enabled\": true}}", "'fp61' is unknown; did you mean 'fp16'?",
                   NULL);
    expect_refused("{\"zero_optimisation\": {\"stage\": 1}}", "did you mean 'zero_optimization'?",
                   NULL);
    expect_refused("{\"gradient_cliping\": 0}", "did you mean 'gradient_clipping'?", NULL);
    parse_ok("{\"wandbb\": {}, \"dump_stat\": true}"); /* typos of keys zerod ignores */
    cr_assert_str_eq(ignored, "wandbb, dump_stat");
    c = parse_ok("{\"scheduler\": {\"type\": \"WarmupLR\"}, \"steps_per_print\": 10,"
                 " \"zero_optimization\": {\"reduce_scatter\": true, \"offload_optimizer\":"
                 " {\"device\": \"cpu\", \"pin_memory\": true}}, \"train_batch_size\": 8,"
                 " \"my_own_feature\": 1}");
    cr_assert_str_eq(ignored, "zero_optimization.reduce_scatter, my_own_feature");
    cr_assert(c.offload_cpu);
}

Test(zd_train_config, ignored_list_is_printable_and_bounded)
{
    char json[4096], small[24];
    size_t used = (size_t)snprintf(json, sizeof(json), "{\"a\\nERROR forged\": 1");
    zd_train_config_t c;

    for (int i = 0; i < 40; i++) {
        used += (size_t)snprintf(json + used, sizeof(json) - used, ", \"feature_%d\": 1", i);
    }
    snprintf(json + used, sizeof(json) - used, "}");
    parse_ok(json);
    cr_assert_eq(strncmp(ignored, "a\\x0aERROR forged, feature_0, ", 30), 0, "%s", ignored);
    cr_assert_lt(strlen(ignored), sizeof(ignored));
    cr_assert_str_eq(ignored + strlen(ignored) - 5, ", ...", "%s", ignored);
    cr_assert_eq(zd_train_config_parse(json, &c, small, sizeof(small), err, sizeof(err)), ZS_OK);
    cr_assert_str_eq(small, "a\\x0aERROR forged, ...");
    cr_assert_eq(zd_train_config_parse(json, &c, NULL, 0, err, sizeof(err)), ZS_OK);
    expect_refused("{\"fp16\": {\"x\\ny\": 1}}", "'fp16.x\\x0ay' is unknown", NULL);
}

Test(zd_train_config, refuses_bad_json_and_leaves_the_config_alone)
{
    zd_train_config_t c, before;

    memset(&c, 0x5a, sizeof(c));
    before = c;
    cr_assert_eq(parse("{", &c), ZS_ERR_CONFIG);
    cr_assert(strstr(err, "not valid JSON") != NULL, "%s", err);
    cr_assert_eq(parse("[]", &c), ZS_ERR_CONFIG);
    cr_assert(strstr(err, "expected a JSON object at the top level") != NULL, "%s", err);
    cr_assert_eq(parse("{\"gradient_clipping\": -1}", &c), ZS_ERR_CONFIG);
    cr_assert_eq(memcmp(&c, &before, sizeof(c)), 0, "a refused config was written");
}

Test(zd_train_config, group_overrides_take_optimizer_params_keys)
{
    zd_train_config_t c = parse_ok("{\"optimizer\": {\"params\": {\"lr\": 0.5, \"eps\": 1e-6}}}");
    zd_group_opts_t o;

    cr_assert_eq(zd_group_opts_parse("{\"lr\": 0.1, \"betas\": [0.8, 0.9]}", &c.opt, 2, &o, err,
                                     sizeof(err)),
                 ZS_OK, "%s", err);
    cr_assert_eq(o.lr, 0.1);
    cr_assert_eq(o.beta1, 0.8);
    cr_assert_eq(o.beta2, 0.9);
    cr_assert_eq(o.eps, 1e-6, "a key the group does not set keeps the base value");
    cr_assert(o.bias_correction && o.adam_w_mode);
    cr_assert_eq(zd_group_opts_parse(NULL, &c.opt, 0, &o, err, sizeof(err)), ZS_OK);
    cr_assert_eq(memcmp(&o, &c.opt, sizeof(o)), 0);
    cr_assert_eq(zd_group_opts_parse("{\"weight_decay\": 0, \"bias_correction\": false}", &c.opt, 0,
                                     &o, err, sizeof(err)),
                 ZS_OK, "%s", err);
    cr_assert(!o.bias_correction);
}

Test(zd_train_config, group_override_errors_name_the_group)
{
    zd_train_config_t c = parse_ok(NULL);
    zd_group_opts_t o;

    cr_assert_eq(zd_group_opts_parse("{\"lr\": \"x\"}", &c.opt, 3, &o, err, sizeof(err)),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, "config key 'groups[3].options.lr': expected a non-negative number") !=
                  NULL,
              "%s", err);
    cr_assert_eq(zd_group_opts_parse("{\"lrr\": 1}", &c.opt, 1, &o, err, sizeof(err)),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, "did you mean 'groups[1].options.lr'?") != NULL, "%s", err);
    cr_assert_eq(zd_group_opts_parse("{\"loss_scale\": 1}", &c.opt, 1, &o, err, sizeof(err)),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, "'loss_scale' is a key of 'fp16'") != NULL, "%s", err);
    cr_assert_eq(zd_group_opts_parse("{", &c.opt, 0, &o, err, sizeof(err)), ZS_ERR_CONFIG);
    cr_assert_str_eq(err, "groups[0].options: not valid JSON at line 1, column 2 (the end of the "
                          "text), after '{'");
    cr_assert_eq(zd_group_opts_parse("7", &c.opt, 0, &o, err, sizeof(err)), ZS_ERR_CONFIG);
    cr_assert(strstr(err, "'groups[0].options': expected an object, got a number 7") != NULL, "%s",
              err);
}

/* ---- the hash ----------------------------------------------------------------------------- */

static uint64_t hash_of(const char *json)
{
    zd_train_config_t c = parse_ok(json);

    return zd_train_config_hash(&c);
}

Test(zd_train_config, hash_is_that_of_earlier_versions)
{
    /* Values of the v1 hash computed by the strcmp-chain parser this table replaced: a daemon
     * of either version computes the same hash for the same config. */
    cr_assert_eq(hash_of(NULL), 0xcefd51057041761dull);
    cr_assert_eq(hash_of("{\"bf16\": {\"enabled\": true}, \"fp16\": {\"loss_scale\": 128}}"),
                 0x9258cd749f603720ull);
}

Test(zd_train_config, hash_ignores_key_order_spacing_and_non_math_keys)
{
    uint64_t h = hash_of("{\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 64},"
                         " \"gradient_clipping\": 0.5}");

    cr_assert_eq(h, hash_of("{\"gradient_clipping\":0.5,\"zero_optimization\":"
                            "{\"reduce_bucket_size\":64,\"stage\":1}}"));
    cr_assert_eq(h, hash_of("{\"gradient_clipping\": 0.50, \"zero_optimization\": {\"stage\": 1,"
                            " \"reduce_bucket_size\": 6.4e1, \"overlap_comm\": false,"
                            " \"contiguous_gradients\": false, \"reduce_scatter\": false},"
                            " \"steps_per_print\": 5, \"scheduler\": {}}"));
    cr_assert_eq(hash_of(full_config), hash_of(full_config));
}

/* One config per key that changes the math, each differing from the defaults in that key
 * alone (or with what it needs). */
static const struct {
    const char *path;
    const char *json;
} math_changes[] = {
    {"zero_optimization.stage", "{\"zero_optimization\": {\"stage\": 1}}"},
    {"zero_optimization.reduce_bucket_size",
     "{\"zero_optimization\": {\"reduce_bucket_size\": 8}}"},
    {"zero_optimization.round_robin_gradients",
     "{\"zero_optimization\": {\"round_robin_gradients\": true}}"},
    {"zero_optimization.offload_optimizer.device",
     "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\"}}}"},
    {"fp16.enabled", "{\"fp16\": {\"enabled\": true}}"},
    {"fp16.loss_scale", "{\"fp16\": {\"loss_scale\": 8}}"},
    {"fp16.initial_scale_power", "{\"fp16\": {\"initial_scale_power\": 8}}"},
    {"fp16.loss_scale_window", "{\"fp16\": {\"loss_scale_window\": 8}}"},
    {"fp16.hysteresis", "{\"fp16\": {\"hysteresis\": 8}}"},
    {"fp16.consecutive_hysteresis", "{\"fp16\": {\"consecutive_hysteresis\": true}}"},
    {"fp16.min_loss_scale", "{\"fp16\": {\"min_loss_scale\": 8}}"},
    {"bf16.enabled", "{\"bf16\": {\"enabled\": true}}"},
    {"bf16.check_grad_overflow", "{\"bf16\": {\"check_grad_overflow\": false}}"},
    {"gradient_clipping", "{\"gradient_clipping\": 8}"},
    {"gradient_accumulation_steps", "{\"gradient_accumulation_steps\": 8}"},
    {"gradient_allreduce_op", "{\"gradient_allreduce_op\": \"sum\"}"},
    {"optimizer.type", "{\"optimizer\": {\"type\": \"Adam\"}}"},
    {"optimizer.params.lr", "{\"optimizer\": {\"params\": {\"lr\": 8}}}"},
    {"optimizer.params.betas", "{\"optimizer\": {\"params\": {\"betas\": [0.9, 0.99]}}}"},
    {"optimizer.params.eps", "{\"optimizer\": {\"params\": {\"eps\": 0.5}}}"},
    {"optimizer.params.weight_decay", "{\"optimizer\": {\"params\": {\"weight_decay\": 8}}}"},
    {"optimizer.params.bias_correction", "{\"optimizer\": {\"params\": {\"bias_correction\": "
                                         "false}}}"},
    {"optimizer.params.adam_w_mode",
     "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}}"},
    {"data_types.grad_accum_dtype",
     "{\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": \"fp32\"}}"},
};

Test(zd_train_config, hash_changes_with_every_key_that_changes_the_math)
{
    size_t n, n_math = 0;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);
    uint64_t base = hash_of(NULL);
    uint64_t seen[sizeof(math_changes) / sizeof(math_changes[0])];

    for (size_t i = 0; i < n; i++) {
        bool listed = false;
        if (!(keys[i].flags & ZD_TC_MATH)) {
            continue;
        }
        n_math++;
        for (size_t j = 0; j < sizeof(math_changes) / sizeof(math_changes[0]); j++) {
            listed |= strcmp(math_changes[j].path, keys[i].path) == 0;
        }
        cr_assert(listed, "%s changes the math: give it a config in math_changes", keys[i].path);
    }
    cr_assert_eq(n_math, sizeof(math_changes) / sizeof(math_changes[0]));
    for (size_t j = 0; j < n_math; j++) {
        seen[j] = hash_of(math_changes[j].json);
        cr_assert_neq(seen[j], base, "%s does not change the hash", math_changes[j].path);
        for (size_t i = 0; i < j; i++) {
            cr_assert_neq(seen[i], seen[j], "%s and %s hash alike", math_changes[i].path,
                          math_changes[j].path);
        }
    }
}

/* ---- the table ---------------------------------------------------------------------------- */

Test(zd_train_config, table_lists_parents_before_children_and_no_key_twice)
{
    size_t n;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);

    cr_assert_str_eq(keys[0].path, "");
    for (size_t i = 1; i < n; i++) {
        const char *dot = strrchr(keys[i].path, '.');
        bool parent = dot == NULL;
        for (size_t j = 0; j < i; j++) {
            cr_assert_str_neq(keys[j].path, keys[i].path, "%s is in the table twice", keys[i].path);
            parent |= dot != NULL && keys[j].type == ZD_TC_OBJECT &&
                      strlen(keys[j].path) == (size_t)(dot - keys[i].path) &&
                      strncmp(keys[j].path, keys[i].path, (size_t)(dot - keys[i].path)) == 0;
        }
        cr_assert(parent, "%s comes before its section", keys[i].path);
        cr_assert(keys[i].doc != NULL && keys[i].doc[0] != '\0', "%s has no doc", keys[i].path);
    }
}

Test(zd_train_config, prints_a_markdown_row_per_key)
{
    size_t n, rows = 0, len = 0;
    char *text = NULL, *line;
    FILE *out = open_memstream(&text, &len);

    zd_train_config_keys(&n);
    cr_assert_not_null(out);
    zd_train_config_print_keys(out, ZD_TC_FORMAT_MARKDOWN);
    fclose(out);
    cr_assert(strncmp(text, "| key | type | default | allowed | zerod | meaning |\n", 52) == 0);
    for (line = text; (line = strstr(line, "\n| `")) != NULL; line++) {
        rows++;
    }
    cr_assert_eq(rows, n - 1, "one row per key but the root");
    cr_assert(strstr(text, "| `zero_optimization.reduce_bucket_size` | int | `500000000` | "
                           "`[1, 1e+15]` | honoured |") != NULL,
              "%s", text);
    cr_assert(strstr(text, "; `3` (stage 3 parameter partitioning") != NULL);
    free(text);
}
