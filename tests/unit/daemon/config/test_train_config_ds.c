/* The DeepSpeed keys of the training config (daemon/src/config/train_config_keys.c): the batch
 * triple, "auto", null, the keys refused with a reason, grad_accum_dtype, the scheduler, and that
 * every key of DeepSpeed 0.19.8's ZeRO config has a row. */
#include "config/train_config.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static char err[512];
static char ignored[512];

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

/* Parse and resolve at world w; returns the status, the triple in *c. */
static zs_status_t batch(const char *json, uint32_t w, zd_train_config_t *c)
{
    *c = parse_ok(json);
    err[0] = '\0';
    return zd_train_config_resolve_batch(c, w, err, sizeof(err));
}

static void expect_batch(const char *json, uint32_t w, uint32_t tb, uint32_t mb, uint32_t gas)
{
    zd_train_config_t c;
    zs_status_t st = batch(json, w, &c);

    cr_assert_eq(st, ZS_OK, "%s at world %u: %s", json, w, err);
    cr_assert_eq(c.train_batch_size, tb, "%s: train_batch_size %u, want %u", json,
                 c.train_batch_size, tb);
    cr_assert_eq(c.micro_batch_size, mb, "%s: micro %u, want %u", json, c.micro_batch_size, mb);
    cr_assert_eq(c.gradient_accumulation_steps, gas, "%s: gas %u, want %u", json,
                 c.gradient_accumulation_steps, gas);
}

Test(zd_train_config_ds, batch_triple_any_two_determine_the_third)
{
    expect_batch("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4}", 2, 32, 4, 4);
    expect_batch("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 4}", 2, 32, 4, 4);
    expect_batch("{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 4}", 2,
                 32, 4, 4);
    expect_batch("{\"train_batch_size\": 16}", 4, 16, 4, 1);
    expect_batch("{\"train_micro_batch_size_per_gpu\": 3}", 2, 6, 3, 1);
    expect_batch("{\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 3,"
                 " \"gradient_accumulation_steps\": 4}",
                 2, 24, 3, 4);
    expect_batch("{\"gradient_accumulation_steps\": 4}", 2, 0, 0, 4); /* no batch: as given */
    expect_batch("{\"train_batch_size\": null, \"train_micro_batch_size_per_gpu\": 2}", 1, 2, 2, 1);
}

Test(zd_train_config_ds, batch_triple_that_disagrees_is_refused_with_all_three)
{
    zd_train_config_t c;

    cr_assert_eq(batch("{\"train_batch_size\": 24, \"train_micro_batch_size_per_gpu\": 3,"
                       " \"gradient_accumulation_steps\": 3}",
                       2, &c),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, "'train_batch_size' 24, 'train_micro_batch_size_per_gpu' 3 and "
                          "'gradient_accumulation_steps' 3 disagree: with world 2") != NULL,
              "%s", err);
    cr_assert(strstr(err, "= 18") != NULL, "%s", err);
    /* 10 / 3 / 1 = 3 accumulation steps, 3 x 3 != 10: DeepSpeed's assertion */
    cr_assert_eq(batch("{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 3}", 1, &c),
                 ZS_ERR_CONFIG);
    cr_assert(strstr(err, "'gradient_accumulation_steps' 3 (derived)") != NULL, "%s", err);
    /* a micro-batch of 0 per rank */
    cr_assert_eq(batch("{\"train_batch_size\": 2}", 4, &c), ZS_ERR_CONFIG);
    cr_assert(strstr(err, "'train_micro_batch_size_per_gpu' 0 (derived)") != NULL, "%s", err);
}

Test(zd_train_config_ds, auto_is_refused_with_where_it_comes_from)
{
    expect_refused("{\"train_micro_batch_size_per_gpu\": \"auto\"}",
                   "config key 'train_micro_batch_size_per_gpu': \"auto\" is filled in by the "
                   "Hugging Face Trainer's DeepSpeed integration",
                   "write the value");
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}",
                   "'zero_optimization.reduce_bucket_size': \"auto\"", NULL);
    expect_refused("{\"bf16\": {\"enabled\": \"auto\"}}", "'bf16.enabled': \"auto\"", NULL);
}

Test(zd_train_config_ds, refused_keys_name_key_value_and_reason)
{
    expect_refused("{\"amp\": {\"enabled\": true, \"opt_level\": \"O1\"}}",
                   "config key 'amp.enabled': true is not supported", "Apex AMP");
    expect_refused("{\"sparse_gradients\": true}", "'sparse_gradients': true is not supported",
                   "dense");
    expect_refused("{\"communication_data_type\": \"bf16\"}",
                   "'communication_data_type': \"bf16\" is not supported", "fp32");
    expect_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"nvme\","
                   " \"nvme_path\": \"/nvme\"}}}",
                   "not supported", "NVMe");
    expect_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\","
                   " \"ratio\": 0.3}}}",
                   "'zero_optimization.offload_optimizer.ratio': 0.3 is not supported", "partial");
    expect_refused("{\"optimizer\": {\"type\": \"Lamb\"}}", "\"Lamb\" is not supported",
                   "Adam and AdamW only");
    expect_refused("{\"optimizer\": {\"params\": {\"amsgrad\": true}}}", "AMSGrad", NULL);
    expect_refused("{\"tensor_parallel\": {\"autotp_size\": 2}}", "'tensor_parallel' is not",
                   "data parallel");
    expect_refused("{\"elasticity\": {\"enabled\": true}}", "'elasticity.enabled': true", NULL);
    expect_refused("{\"gradient_predivide_factor\": 0}", "'gradient_predivide_factor'", "positive");
}

Test(zd_train_config_ds, harmless_values_of_refused_keys_and_disabled_features_pass)
{
    zd_train_config_t c = parse_ok(
        "{\"amp\": {\"enabled\": false, \"opt_level\": \"O1\"}, \"sparse_gradients\": false,"
        " \"communication_data_type\": \"FP32\", \"prescale_gradients\": true,"
        " \"gradient_predivide_factor\": 2.0, \"elasticity\": {\"enabled\": false},"
        " \"zero_optimization\": {\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 1.0,"
        " \"pin_memory\": true, \"buffer_count\": 8, \"fast_init\": true}}}");

    cr_assert_str_eq(ignored, "amp.opt_level");
    cr_assert(c.prescale_gradients);
    cr_assert_float_eq(c.gradient_predivide_factor, 2.0, 0);
    cr_assert(c.offload_pin_memory && c.offload_fast_init);
    cr_assert_eq(c.offload_buffer_count, 8u);
    c = parse_ok("{\"communication_data_type\": null}");
}

Test(zd_train_config_ds, grad_accum_dtype_follows_deepspeed)
{
    zd_train_config_t c = parse_ok("{\"bf16\": {\"enabled\": true}}");

    cr_assert_eq(c.grad_accum_dtype, ZS_DTYPE_BF16, "null is the param dtype");
    c = parse_ok("{\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": "
                 "\"fp32\"}}");
    cr_assert_eq(c.grad_accum_dtype, ZS_DTYPE_F32);
    c = parse_ok("{\"fp16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": "
                 "\"half\"}}");
    cr_assert_eq(c.grad_accum_dtype, ZS_DTYPE_F16);
    expect_refused("{\"bf16\": {\"enabled\": true}, \"data_types\": {\"grad_accum_dtype\": "
                   "\"fp16\"}}",
                   "'data_types.grad_accum_dtype': \"fp16\" with bf16 parameters", NULL);
    expect_refused("{\"data_types\": {\"grad_accum_dtype\": \"int8\"}}",
                   "'data_types.grad_accum_dtype': expected \"fp32\"", NULL);
}

Test(zd_train_config_ds, scheduler_type_is_checked_and_params_passed_on)
{
    parse_ok("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10,"
             " \"warmup_max_lr\": [0.1, 0.2]}}}");
    cr_assert_str_eq(ignored, "");
    parse_ok("{\"scheduler\": {\"type\": \"CosineAnnealingLR\", \"params\": {\"T_max\": 10}}}");
    expect_refused("{\"scheduler\": {\"type\": \"Bogus\"}}", "'scheduler.type'",
                   "\"WarmupLR\", \"WarmupDecayLR\"");
    expect_refused("{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": 3}}", "'scheduler.params'",
                   "object");
    expect_refused("{\"schedular\": {\"type\": \"WarmupLR\"}}", "did you mean 'scheduler'?", NULL);
}

Test(zd_train_config_ds, nested_typos_get_did_you_mean)
{
    expect_refused("{\"zero_optimization\": {\"reduce_bucket_sise\": 8}}",
                   "'zero_optimization.reduce_bucket_sise' is unknown; did you mean "
                   "'zero_optimization.reduce_bucket_size'?",
                   NULL);
    expect_refused("{\"zero_optimization\": {\"offload_optimizer\": {\"pin_memroy\": true}}}",
                   "did you mean 'zero_optimization.offload_optimizer.pin_memory'?", NULL);
    expect_refused("{\"bf16\": {\"enable\": true}}", "did you mean 'bf16.enabled'?", NULL);
    expect_refused("{\"train_batch_sizes\": 8}", "did you mean 'train_batch_size'?", NULL);
}

/* Every field of DeepSpeed 0.19.8's DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig,
 * DeepSpeedZeroOffloadParamConfig, fp16 and bf16 configs has a row (a key DeepSpeed validates
 * must never be "unknown" here). */
Test(zd_train_config_ds, every_deepspeed_zero_key_has_a_row)
{
    static const char *const ds_keys[] = {
        "zero_optimization.stage",
        "zero_optimization.contiguous_gradients",
        "zero_optimization.reduce_scatter",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.use_multi_rank_bucket_allreduce",
        "zero_optimization.allgather_partitions",
        "zero_optimization.allgather_bucket_size",
        "zero_optimization.overlap_comm",
        "zero_optimization.compute_grad_norm",
        "zero_optimization.load_from_fp32_weights",
        "zero_optimization.elastic_checkpoint",
        "zero_optimization.offload_param",
        "zero_optimization.offload_optimizer",
        "zero_optimization.zenflow",
        "zero_optimization.sub_group_size",
        "zero_optimization.cpu_offload_param",
        "zero_optimization.cpu_offload_use_pin_memory",
        "zero_optimization.cpu_offload",
        "zero_optimization.prefetch_bucket_size",
        "zero_optimization.param_persistence_threshold",
        "zero_optimization.model_persistence_threshold",
        "zero_optimization.max_live_parameters",
        "zero_optimization.max_reuse_distance",
        "zero_optimization.gather_16bit_weights_on_model_save",
        "zero_optimization.module_granularity_threshold",
        "zero_optimization.use_all_reduce_for_fetch_params",
        "zero_optimization.allgather_sequential",
        "zero_optimization.stage3_gather_fp16_weights_on_model_save",
        "zero_optimization.stage3_module_granularity_threshold", /* the aliases, accepted too */
        "zero_optimization.stage3_use_all_reduce_for_fetch_params",
        "zero_optimization.stage3_allgather_sequential",
        "zero_optimization.ignore_unused_parameters",
        "zero_optimization.legacy_stage1",
        "zero_optimization.round_robin_gradients",
        "zero_optimization.parameter_alignment",
        "zero_optimization.zero_hpz_partition_size",
        "zero_optimization.zero_quantized_weights",
        "zero_optimization.zero_quantized_nontrainable_weights",
        "zero_optimization.zero_quantized_gradients",
        "zero_optimization.memory_efficient_linear",
        "zero_optimization.pipeline_loading_checkpoint",
        "zero_optimization.override_module_apply",
        "zero_optimization.log_trace_cache_warnings",
        "zero_optimization.enable_sanity_checks",
        "zero_optimization.save_muon_momentum_buffer_in_memory",
        "zero_optimization.leaf_module",
        "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.nvme_path",
        "zero_optimization.offload_optimizer.buffer_count",
        "zero_optimization.offload_optimizer.pin_memory",
        "zero_optimization.offload_optimizer.pipeline_read",
        "zero_optimization.offload_optimizer.pipeline_write",
        "zero_optimization.offload_optimizer.fast_init",
        "zero_optimization.offload_optimizer.ratio",
        "zero_optimization.offload_optimizer.super_offload",
        "zero_optimization.offload_optimizer.cpuadam_cores_perc",
        "zero_optimization.offload_param.device",
        "zero_optimization.offload_param.nvme_path",
        "zero_optimization.offload_param.buffer_count",
        "zero_optimization.offload_param.buffer_size",
        "zero_optimization.offload_param.max_in_cpu",
        "zero_optimization.offload_param.pin_memory",
        "fp16.enabled",
        "fp16.auto_cast",
        "fp16.loss_scale",
        "fp16.initial_scale_power",
        "fp16.loss_scale_window",
        "fp16.hysteresis",
        "fp16.consecutive_hysteresis",
        "fp16.min_loss_scale",
        "fp16.fp16_master_weights_and_grads",
        "bf16.enabled",
        "bf16.immediate_grad_update",
        "bf16.check_grad_overflow",
        "bf16.bf16_master_weights_and_grads",
        "bf16.bf16_optimizer_states",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "steps_per_print",
        "communication_data_type",
        "prescale_gradients",
        "gradient_predivide_factor",
        "gradient_allreduce_op",
        "sparse_gradients",
        "zero_allow_untested_optimizer",
        "zero_force_ds_cpu_optimizer",
        "optimizer",
        "scheduler",
        "amp",
        "gradient_clipping",
        "torch_autocast",
        "data_types.grad_accum_dtype",
        "data_types.param_dtype",
        "data_types.buffer_dtype",
        "data_types.keep_in_fp32_modules",
        "bfloat16",
        "disable_allgather",
        "dump_state",
        "wall_clock_breakdown",
        "memory_breakdown",
        "activation_checkpointing",
        "checkpoint",
        "dataloader_drop_last",
    };
    size_t n;
    const zd_tc_key_t *keys = zd_train_config_keys(&n);

    for (size_t i = 0; i < sizeof(ds_keys) / sizeof(ds_keys[0]); i++) {
        bool found = false;
        for (size_t j = 0; j < n && !found; j++) {
            found = strcmp(keys[j].path, ds_keys[i]) == 0;
        }
        cr_assert(found, "DeepSpeed's key '%s' has no row", ds_keys[i]);
    }
}
