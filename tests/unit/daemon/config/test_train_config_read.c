/* The training config read as DeepSpeed reads it (daemon/src/config/train_config_json.c and the
 * walk of train_config.c): every problem in one message, Python's json tokens (Infinity, NaN), a
 * JSON syntax error's place, the "bfloat16" alias, strings pydantic converts in the sections
 * DeepSpeed validates with its models, and bf16's copy of fp16's loss-scale keys. */
#include "config/train_config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err[512]; /* ZS_MSG_MAX: what an attach's reply carries */
static char ignored[256];

static zs_status_t parse(const char *json, zd_train_config_t *cfg)
{
    err[0] = '\0';
    return zd_train_config_parse(json, cfg, ignored, sizeof(ignored), err, sizeof(err));
}

static zd_train_config_t parse_ok(const char *json)
{
    zd_train_config_t cfg;

    cr_assert_eq(parse(json, &cfg), ZS_OK, "%s: %s", json, err);
    return cfg;
}

static void expect_refused(const char *json, const char *needle1, const char *needle2)
{
    zd_train_config_t cfg;

    cr_assert_eq(parse(json, &cfg), ZS_ERR_CONFIG, "%s was accepted", json);
    cr_assert(strstr(err, needle1) != NULL, "%s: '%s' not in: %s", json, needle1, err);
    cr_assert(needle2 == NULL || strstr(err, needle2) != NULL, "%s: '%s' not in: %s", json, needle2,
              err);
}

/* ---- every problem at once ---------------------------------------------------------------- */

Test(zd_train_config_read, lists_every_problem_in_one_message)
{
    expect_refused("{\"zero_optimization\": {\"stage\": 5, \"reduce_bucket_sise\": 8},"
                   " \"gradient_clipping\": -1, \"optimizer\": {\"params\": {\"lr\": NaN}},"
                   " \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                   "5 problems in the config: (1) config key 'zero_optimization.stage': expected 1 "
                   "or 2, got 5; (2) config key 'zero_optimization.reduce_bucket_sise' is unknown; "
                   "did you mean 'zero_optimization.reduce_bucket_size'?; (3) config key "
                   "'gradient_clipping': expected a non-negative number",
                   "; (4) config key 'optimizer.params.lr': expected a non-negative number up to "
                   "1000000, got nan; (5) config keys 'fp16.enabled' and 'bf16.enabled' are both "
                   "true; choose one");
}

Test(zd_train_config_read, counts_the_problems_that_do_not_fit)
{
    char json[4096];
    size_t used = (size_t)snprintf(json, sizeof(json), "{\"optimizer\": {\"params\": {");
    zd_train_config_t c, before;

    for (int i = 0; i < 30; i++) {
        used += (size_t)snprintf(json + used, sizeof(json) - used, "%s\"unknown_key_%d\": 1",
                                 i > 0 ? ", " : "", i);
    }
    snprintf(json + used, sizeof(json) - used, "}}}");
    memset(&c, 0x5a, sizeof(c));
    before = c;
    expect_refused(json,
                   "30 problems in the config: (1) config key 'optimizer.params.unknown_key_0'",
                   " more");
    cr_assert_lt(strlen(err), sizeof(err) - 1, "cut, not counted: %s", err);
    cr_assert(strstr(err, "; and ") != NULL && strstr(err, " more") == err + strlen(err) - 5, "%s",
              err);
    cr_assert_eq(memcmp(&c, &before, sizeof(c)), 0, "a refused config was written");
}

/* ---- Python's json ------------------------------------------------------------------------ */

Test(zd_train_config_read, reads_infinity_and_nan_as_python_json_does)
{
    zd_train_config_t c;
    char *explained;

    /* Accelerate writes steps_per_print Infinity: DeepSpeed then never prints */
    c = parse_ok("{\"steps_per_print\": Infinity, \"wall_clock_breakdown\": NaN,"
                 " \"gradient_clipping\": 0.25, \"optimizer\": {\"params\": {\"lr\": 0.5}}}");
    cr_assert_eq(c.steps_per_print, 0, "Infinity: never");
    cr_assert_eq(c.gradient_clipping, 0.25, "the numbers after a NaN are the right ones");
    cr_assert_eq(c.opt.lr, 0.5);
    explained = zd_train_config_explain("{\"steps_per_print\": Infinity}", &c);
    cr_assert(explained != NULL && strstr(explained, "\"key\":\"steps_per_print\",\"value\":"
                                                     "\"Infinity\"") != NULL,
              "%s", explained);
    free(explained);
    c = parse_ok("{\"steps_per_print\": 7}");
    cr_assert_eq(c.steps_per_print, 7);
    /* then each key's range decides */
    expect_refused("{\"optimizer\": {\"params\": {\"lr\": NaN}}}", "'optimizer.params.lr'",
                   "got nan");
    expect_refused("{\"gradient_clipping\": Infinity}", "'gradient_clipping'", "got inf");
    expect_refused("{\"steps_per_print\": -Infinity}", "'steps_per_print'", "got -inf");
    expect_refused("{\"steps_per_print\": NaN}", "'steps_per_print'", "got nan");
    expect_refused("{\"optimizer\": {\"params\": {\"betas\": [0.9, NaN]}}}",
                   "'optimizer.params.betas[1]'", "got nan");
    /* a token inside a string is text */
    expect_refused("{\"optimizer\": {\"type\": \"NaN Infinity\"}}", "'optimizer.type'",
                   "got \"NaN Infinity\"");
}

Test(zd_train_config_read, says_where_json_is_not_valid)
{
    expect_refused("{\n  \"gradient_clipping\": 1.0,\n  \"bf16\": {\"enabled\": tru}\n}",
                   "config: not valid JSON at line 3, column 23, near 'tru}\\x0a}'", NULL);
    /* cJSON reports these at the end of the text: the message shows what comes before */
    expect_refused("{\"a\": 1,}",
                   "not valid JSON at line 1, column 10 (the end of the text), after '{\"a\": 1,}'",
                   NULL);
    expect_refused("{\"a\": 1", "at line 1, column 8 (the end of the text), after '{\"a\": 1'",
                   NULL);
    expect_refused("{} {}", "not valid JSON at line 1, column 4, near '{}'", NULL);
    expect_refused("{\"steps_per_print\": Infinityx}", "not valid JSON at line 1", NULL);
    expect_refused("{\"steps_per_print\": infinity}", "not valid JSON at line 1", NULL);
    expect_refused("{\"a\\n\": \"\x01\x7f\" x}", "not valid JSON", NULL);
    cr_assert(strchr(err, '\n') == NULL && strchr(err, '\x01') == NULL, "%s", err);
}

/* ---- bfloat16 ----------------------------------------------------------------------------- */

Test(zd_train_config_read, bfloat16_is_bf16_when_bf16_is_not_given)
{
    zd_train_config_t c;
    char *explained;

    c = parse_ok("{\"bfloat16\": {\"enabled\": true, \"check_grad_overflow\": \"false\"}}");
    cr_assert_eq(c.dtype, ZS_DTYPE_BF16);
    cr_assert(!c.bf16_check_overflow);
    cr_assert_str_eq(ignored, "");
    explained = zd_train_config_explain("{\"bfloat16\": {\"enabled\": true}}", &c);
    cr_assert_not_null(explained);
    cr_assert(strstr(explained,
                     "{\"key\":\"bf16.enabled\",\"value\":true,\"source\":\"config\"}") != NULL,
              "%s", explained);
    free(explained);
    /* DeepSpeed reads bfloat16 only without bf16 */
    c = parse_ok("{\"bf16\": {\"enabled\": false}, \"bfloat16\": {\"enabled\": true}}");
    cr_assert_eq(c.dtype, ZS_DTYPE_F32);
    cr_assert_str_eq(ignored, "bfloat16");
    c = parse_ok("{\"bfloat16\": {\"enabled\": true}, \"bf16\": {}}");
    cr_assert_eq(c.dtype, ZS_DTYPE_F32);
    expect_refused("{\"bfloat16\": {\"enabld\": true}}", "'bfloat16.enabld' is unknown",
                   "did you mean 'bfloat16.enabled'?");
    expect_refused("{\"bfloat16\": {\"enabled\": true}, \"fp16\": {\"enabled\": true}}",
                   "both true", NULL);
}

/* ---- strings pydantic converts ------------------------------------------------------------ */

Test(zd_train_config_read, converts_strings_as_deepspeed_models_do)
{
    zd_train_config_t c, n;
    char *explained;

    c = parse_ok(
        "{\"zero_optimization\": {\"stage\": \"1\", \"reduce_bucket_size\": \" 1_000 \","
        " \"overlap_comm\": \"no\", \"round_robin_gradients\": 1, \"offload_optimizer\":"
        " {\"device\": \"cpu\", \"buffer_count\": \"8.00\", \"pin_memory\": \"True\"}},"
        " \"fp16\": {\"enabled\": \"yes\", \"loss_scale\": \"128\", \"hysteresis\": \"+3\","
        " \"min_loss_scale\": \"0.5\", \"consecutive_hysteresis\": \"on\"}}");
    cr_assert_eq(c.stage, 1);
    cr_assert_eq(c.reduce_bucket_size, 1000);
    cr_assert(!c.overlap_comm && c.round_robin_gradients && c.offload_pin_memory);
    cr_assert_eq(c.offload_buffer_count, 8);
    cr_assert_eq(c.dtype, ZS_DTYPE_F16);
    cr_assert_eq(c.static_loss_scale, 128);
    cr_assert_eq(c.hysteresis, 3);
    cr_assert_eq(c.min_loss_scale, 0.5);
    cr_assert(c.consecutive_hysteresis);
    n = parse_ok("{\"zero_optimization\": {\"stage\": 1, \"reduce_bucket_size\": 1000,"
                 " \"overlap_comm\": false, \"round_robin_gradients\": true, \"offload_optimizer\":"
                 " {\"device\": \"cpu\", \"buffer_count\": 8, \"pin_memory\": true}},"
                 " \"fp16\": {\"enabled\": true, \"loss_scale\": 128, \"hysteresis\": 3,"
                 " \"min_loss_scale\": 0.5, \"consecutive_hysteresis\": true}}");
    cr_assert_eq(zd_train_config_hash(&c), zd_train_config_hash(&n));
    explained = zd_train_config_explain("{\"zero_optimization\": {\"stage\": \"1\"}}", &c);
    cr_assert(explained != NULL &&
                  strstr(explained, "\"key\":\"zero_optimization.stage\",\"value\":1,") != NULL,
              "the value as read: %s", explained);
    free(explained);
    /* what pydantic does not convert, refused naming key and value */
    expect_refused("{\"zero_optimization\": {\"stage\": \"two\"}}",
                   "config key 'zero_optimization.stage': expected 1 or 2, got a string \"two\"",
                   NULL);
    expect_refused("{\"zero_optimization\": {\"stage\": \"3\"}}",
                   "'zero_optimization.stage': 3 is "
                   "not supported",
                   NULL);
    expect_refused("{\"zero_optimization\": {\"stage\": \"2.5\"}}", "got a string \"2.5\"", NULL);
    expect_refused("{\"zero_optimization\": {\"stage\": \"2.\"}}", "got a string \"2.\"", NULL);
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": \"5e8\"}}",
                   "'zero_optimization.reduce_bucket_size'", "got a string \"5e8\"");
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": \"1__0\"}}",
                   "got a string \"1__0\"", NULL);
    expect_refused("{\"fp16\": {\"enabled\": \"maybe\"}}", "'fp16.enabled': expected true or false",
                   "got a string \"maybe\"");
    expect_refused("{\"fp16\": {\"enabled\": \" true\"}}", "got a string \" true\"", NULL);
    expect_refused("{\"fp16\": {\"loss_scale\": \"inf\"}}", "'fp16.loss_scale'", "got inf");
    expect_refused("{\"fp16\": {\"loss_scale\": \"0x10\"}}", "got a string \"0x10\"", NULL);
    expect_refused("{\"zero_optimization\": {\"stage\": \"auto\"}}", "Hugging Face", NULL);
    /* DeepSpeed reads the top-level keys and optimizer.params as they are: a string stays one */
    expect_refused("{\"train_batch_size\": \"8\"}", "'train_batch_size'", "got a string \"8\"");
    expect_refused("{\"optimizer\": {\"params\": {\"lr\": \"1e-3\"}}}", "'optimizer.params.lr'",
                   "got a string \"1e-3\"");
}

/* ---- keys DeepSpeed accepts --------------------------------------------------------------- */

Test(zd_train_config_read, bf16_loss_scale_keys_are_one_warning)
{
    /* the bf16 section of DeepSpeedExamples' training/cifar/ds_config.json */
    zd_train_config_t c = parse_ok("{\"bf16\": {\"enabled\": true,"
                                   " \"bf16_master_weights_and_grads\": false, \"loss_scale\": 0,"
                                   " \"loss_scale_window\": 500, \"hysteresis\": 2,"
                                   " \"min_loss_scale\": 1, \"initial_scale_power\": 15,"
                                   " \"consecutive_hysteresis\": false}}");

    cr_assert_eq(c.dtype, ZS_DTYPE_BF16);
    cr_assert_str_eq(ignored, "bf16.loss_scale, bf16.loss_scale_window, bf16.hysteresis, "
                              "bf16.min_loss_scale, bf16.initial_scale_power, "
                              "bf16.consecutive_hysteresis");
    cr_assert_eq(c.loss_scale_window, 1000, "fp16's keys keep their defaults");
}

Test(zd_train_config_read, newer_deepspeed_keys_are_known)
{
    parse_ok("{\"zero_optimization\": {\"stage3_module_granularity_threshold\": 0,"
             " \"stage3_use_all_reduce_for_fetch_params\": false,"
             " \"stage3_allgather_sequential\": false}, \"data_types\": {\"buffer_dtype\": null,"
             " \"keep_in_fp32_modules\": \"auto\"}, \"optimizer\": {\"params\": {\"foreach\": true,"
             " \"fp32_optimizer_states\": true}}}");
    cr_assert_str_eq(ignored, "zero_optimization.stage3_module_granularity_threshold, "
                              "zero_optimization.stage3_use_all_reduce_for_fetch_params, "
                              "zero_optimization.stage3_allgather_sequential, "
                              "optimizer.params.foreach");
    expect_refused("{\"data_types\": {\"buffer_dtype\": \"fp32\"}}",
                   "'data_types.buffer_dtype': \"fp32\" is not supported", "buffers included");
    expect_refused("{\"optimizer\": {\"params\": {\"max_grad_norm\": 1.0}}}",
                   "'optimizer.params.max_grad_norm' is not supported", "gradient_clipping");
    expect_refused("{\"optimizer\": {\"params\": {\"fp32_optimizer_states\": false}}}",
                   "fp32_optimizer_states': false is not supported", NULL);
}
