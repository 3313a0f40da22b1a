/*
 * The key table of the training config: every key of DeepSpeed's ZeRO-1/2 config (read from
 * DeepSpeed 0.19.8's config classes) with its fate in zerod, honoured, ignored with the reason
 * ignoring it cannot change the math, or refused with the reason. config/train_config.c walks it;
 * docs/training-config.md is printed from it.
 */
#include "config/train_config_keys.h"
#include "config/train_config_int.h"

#include "zs/config.h"

#include <stddef.h>

#define ZD_TC_OFF(field) offsetof(zd_train_config_t, field)

static const zd_tc_choice_t zd_tc_stage_choices[] = {
    {"0", 0, "stage 0 is plain data parallelism: use DDP; zerod serves stages 1 and 2"},
    {"1", 1, NULL},
    {"2", 2, NULL},
    {"3", 3, "stage 3 parameter partitioning is not implemented; zerod serves stages 1 and 2"},
    {NULL, 0, NULL},
};

static const zd_tc_choice_t zd_tc_offload_opt_choices[] = {
    {"none", 0, NULL},
    {"cpu", 1, NULL},
    {"nvme", 0, "NVMe offload is not implemented; use \"cpu\""},
    {NULL, 0, NULL},
};

static const zd_tc_choice_t zd_tc_offload_param_choices[] = {
    {"none", 0, NULL},
    {"cpu", 0, "parameter offload is a stage 3 feature, which zerod does not implement"},
    {"nvme", 0, "parameter offload is a stage 3 feature, which zerod does not implement"},
    {NULL, 0, NULL},
};

static const zd_tc_choice_t zd_tc_allreduce_choices[] = {
    {"mean", 1, NULL},
    {"sum", 0, NULL},
    {NULL, 0, NULL},
};

#define ZD_TC_ADAM_ONLY "zerod's daemons run Adam and AdamW only"

static const zd_tc_choice_t zd_tc_optimizer_choices[] = {
    {"Adam", 0, NULL},
    {"AdamW", 1, NULL},
    {"Lamb", 0, ZD_TC_ADAM_ONLY},
    {"OneBitAdam", 0, ZD_TC_ADAM_ONLY},
    {"ZeroOneAdam", 0, ZD_TC_ADAM_ONLY},
    {"OneBitLamb", 0, ZD_TC_ADAM_ONLY},
    {"Adagrad", 0, ZD_TC_ADAM_ONLY},
    {"Lion", 0, ZD_TC_ADAM_ONLY},
    {"Muon", 0, ZD_TC_ADAM_ONLY},
    {"MuAdam", 0, ZD_TC_ADAM_ONLY},
    {"MuAdamW", 0, ZD_TC_ADAM_ONLY},
    {"MuSGD", 0, ZD_TC_ADAM_ONLY},
    {NULL, 0, NULL},
};

#define ZD_TC_16BIT_COMM                                                                           \
    "zerod reduces gradients in fp32; a 16-bit reduction would round what zerod sums exactly"

static const zd_tc_choice_t zd_tc_comm_choices[] = {
    {"fp32", 1, NULL},
    {"fp16", 0, ZD_TC_16BIT_COMM},
    {"bf16", 0, ZD_TC_16BIT_COMM},
    {NULL, 0, NULL},
};

/* dtype + 1 (0 is null: the param dtype), DeepSpeed's DtypeEnum spellings */
static const zd_tc_choice_t zd_tc_accum_choices[] = {
    {"fp32", ZS_DTYPE_F32 + 1, NULL},
    {"float32", ZS_DTYPE_F32 + 1, NULL},
    {"float", ZS_DTYPE_F32 + 1, NULL},
    {"fp16", ZS_DTYPE_F16 + 1, NULL},
    {"float16", ZS_DTYPE_F16 + 1, NULL},
    {"half", ZS_DTYPE_F16 + 1, NULL},
    {"bf16", ZS_DTYPE_BF16 + 1, NULL},
    {"bfloat16", ZS_DTYPE_BF16 + 1, NULL},
    {NULL, 0, NULL},
};

/* DeepSpeed looks the type up in deepspeed.runtime.lr_schedules, then torch.optim.lr_scheduler
 * (the ones a JSON config can build); zerod.torch builds it and checks its params. */
static const zd_tc_choice_t zd_tc_scheduler_choices[] = {
    {"WarmupLR", 0, NULL},
    {"WarmupDecayLR", 0, NULL},
    {"WarmupCosineLR", 0, NULL},
    {"OneCycle", 0, NULL},
    {"LRRangeTest", 0, NULL},
    {"StepLR", 0, NULL},
    {"MultiStepLR", 0, NULL},
    {"ConstantLR", 0, NULL},
    {"LinearLR", 0, NULL},
    {"ExponentialLR", 0, NULL},
    {"PolynomialLR", 0, NULL},
    {"CosineAnnealingLR", 0, NULL},
    {"CosineAnnealingWarmRestarts", 0, NULL},
    {"CyclicLR", 0, NULL},
    {"OneCycleLR", 0, NULL},
    {NULL, 0, NULL},
};

/* Row shapes. `flags` ZD_TC_MATH marks what the config hash must cover. */
#define ZD_TC_SECTION(path, doc)                                                                   \
    {                                                                                              \
        path, ZD_TC_OBJECT, ZD_TC_HONOURED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, 0, doc       \
    }
#define ZD_TC_FLAG(path, def, field, flags, doc)                                                   \
    {                                                                                              \
        path, ZD_TC_BOOL, ZD_TC_HONOURED, def, 0, 0, NULL, ZD_TC_STORE_BOOL, ZD_TC_OFF(field), 0,  \
            flags, doc                                                                             \
    }
#define ZD_TC_INTEGER(path, def, min, max, store, field, flags, doc)                               \
    {                                                                                              \
        path, ZD_TC_INT, ZD_TC_HONOURED, def, min, max, NULL, store, ZD_TC_OFF(field), 0, flags,   \
            doc                                                                                    \
    }
#define ZD_TC_REAL(path, def, min, max, field, flags, doc)                                         \
    {                                                                                              \
        path, ZD_TC_NUMBER, ZD_TC_HONOURED, def, min, max, NULL, ZD_TC_STORE_F64,                  \
            ZD_TC_OFF(field), 0, flags, doc                                                        \
    }
/* An enum (type ZD_TC_ENUM) or an int (ZD_TC_INT) that takes only its choices. */
#define ZD_TC_CHOICE(path, type, def, choices, store, offset, flags, doc)                          \
    {                                                                                              \
        path, type, ZD_TC_HONOURED, def, 0, 0, choices, store, offset, 0, flags, doc               \
    }
#define ZD_TC_TWO(path, def, min, max, field1, field2, flags, doc)                                 \
    {                                                                                              \
        path, ZD_TC_PAIR, ZD_TC_HONOURED, def, min, max, NULL, ZD_TC_STORE_F64, ZD_TC_OFF(field1), \
            ZD_TC_OFF(field2), flags, doc                                                          \
    }
/* A section DeepSpeed validates with a pydantic model: a string its lax mode converts is taken
 * ("2" for an int, "true" for a bool). */
#define ZD_TC_MODEL(path, doc)                                                                     \
    {                                                                                              \
        path, ZD_TC_OBJECT, ZD_TC_HONOURED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, ZD_TC_LAX,   \
            doc                                                                                    \
    }
/* Another name of the section `section`, read in its place when that one is not given. */
#define ZD_TC_ALIAS_OF(path, section, doc)                                                         \
    {                                                                                              \
        path, ZD_TC_OBJECT, ZD_TC_HONOURED, section, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0,           \
            ZD_TC_ALIAS, doc                                                                       \
    }
/* A whole DeepSpeed feature: its keys are ignored (listed) unless its `enabled` is true. */
#define ZD_TC_FEATURE(path, doc)                                                                   \
    {                                                                                              \
        path, ZD_TC_OBJECT, ZD_TC_HONOURED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, ZD_TC_OPEN,  \
            doc                                                                                    \
    }
/* An object handed whole to the trainer's engine (it checks the members against the type). */
#define ZD_TC_PASSED(path, doc)                                                                    \
    {                                                                                              \
        path, ZD_TC_OBJECT, ZD_TC_HONOURED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0,              \
            ZD_TC_OPAQUE, doc                                                                      \
    }
/* Refused with doc as the reason, unless its value is def (what zerod does anyway). */
#define ZD_TC_REFUSE(path, type, def, doc)                                                         \
    {                                                                                              \
        path, type, ZD_TC_REFUSED, def, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, 0, doc                 \
    }
/* Accepted and listed in `ignored` (doc: why ignoring it cannot change the math). */
#define ZD_TC_IGNORE(path, type, doc)                                                              \
    {                                                                                              \
        path, type, ZD_TC_IGNORED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, 0, doc                \
    }

#define ZD_TC_PER_BUCKET "not used: zerod reduce-scatters and all-gathers once per reduce bucket"
#define ZD_TC_OWN_MEMORY "zerod allocates and pins its host memory itself"
#define ZD_TC_MONITOR    "monitoring only; zerod exports its metrics itself"
#define ZD_TC_STAGE3     "a stage 3 key: no effect at stages 1 and 2 (DeepSpeed ignores it there too)"
#define ZD_TC_ENGINE     "read by the trainer's engine (zerod.torch), not by the daemon's math"
#define ZD_TC_NO_NVME    "NVMe offload is not implemented"
#define ZD_TC_WHOLE_MODULE                                                                         \
    "zerod.torch converts the whole module to the param dtype, buffers included (module.to)"
#define ZD_TC_BF16_NO_SCALE                                                                        \
    "fp16's loss scaling, which bf16 does not need (DeepSpeed before 0.17 ignored it under bf16 "  \
    "too; later versions refuse it)"

const zd_tc_key_t zd_tc_keys[] = {
    {"", ZD_TC_OBJECT, ZD_TC_HONOURED, NULL, 0, 0, NULL, ZD_TC_STORE_NONE, 0, 0, ZD_TC_OPEN,
     "the training config; a top-level key zerod does not know (another DeepSpeed feature) is "
     "ignored with a warning, unless it looks like a typo of a known key"},
    /* batch */
    ZD_TC_INTEGER("train_batch_size", NULL, 1, 1e9, ZD_TC_STORE_U32, train_batch_size, 0,
                  "samples per optimizer step over all ranks: micro x gradient_accumulation_steps "
                  "x world (any two of the three determine the third)"),
    ZD_TC_INTEGER("train_micro_batch_size_per_gpu", NULL, 1, 1e9, ZD_TC_STORE_U32, micro_batch_size,
                  0, "samples per rank per micro-step (forward and backward)"),
    ZD_TC_INTEGER("gradient_accumulation_steps", "1", 1, 1e6, ZD_TC_STORE_U32,
                  gradient_accumulation_steps, ZD_TC_MATH,
                  "micro-steps per optimizer step (derived from the batch sizes when not given)"),
    ZD_TC_REFUSE("managed_gradient_accumulation", ZD_TC_BOOL, "true",
                 "the engine counts micro-steps; to step early, call "
                 "engine.set_gradient_accumulation_boundary(True)"),
    ZD_TC_INTEGER("steps_per_print", "10", 1, 1e9, ZD_TC_STORE_U32, steps_per_print,
                  ZD_TC_INF_NEVER,
                  "rank 0's engine logs step, loss scale, lr, grad norm, samples/s and skipped "
                  "steps every N optimizer steps; Infinity (as Accelerate writes it): never"),
    /* zero */
    ZD_TC_MODEL("zero_optimization", "ZeRO stage and buckets"),
    ZD_TC_CHOICE("zero_optimization.stage", ZD_TC_INT, "2", zd_tc_stage_choices, ZD_TC_STORE_U32,
                 ZD_TC_OFF(stage), ZD_TC_MATH,
                 "1: optimizer state sharded; 2: gradients sharded too"),
    ZD_TC_INTEGER("zero_optimization.reduce_bucket_size", "500000000", 1, 1e15, ZD_TC_STORE_U64,
                  reduce_bucket_size, ZD_TC_MATH,
                  "elements per gradient bucket (rounded down to world x 16); parameters are split "
                  "between buckets where they cross one's end"),
    ZD_TC_FLAG("zero_optimization.overlap_comm", "true", overlap_comm, 0,
               "accepted; stage 2 always reduces buckets while backward continues"),
    ZD_TC_FLAG("zero_optimization.contiguous_gradients", "true", contiguous_gradients, 0,
               "accepted; zerod is always contiguous"),
    ZD_TC_FLAG("zero_optimization.round_robin_gradients", "false", round_robin_gradients,
               ZD_TC_MATH, "reorder each group's params round-robin before the layout"),
    ZD_TC_MODEL("zero_optimization.offload_optimizer", "where the optimizer state lives"),
    ZD_TC_CHOICE("zero_optimization.offload_optimizer.device", ZD_TC_ENUM, "\"none\"",
                 zd_tc_offload_opt_choices, ZD_TC_STORE_BOOL, ZD_TC_OFF(offload_cpu), ZD_TC_MATH,
                 "cpu: shard and Adam in host memory, CPU Adam even on a CUDA backend"),
    ZD_TC_FLAG("zero_optimization.offload_optimizer.pin_memory", "false", offload_pin_memory, 0,
               "read: a GPU trainer pins the host regions it copies gradients into (GPU trainers "
               "with offload are not yet built; a CPU trainer maps them directly)"),
    ZD_TC_INTEGER("zero_optimization.offload_optimizer.buffer_count", "4", 0, 1024, ZD_TC_STORE_U32,
                  offload_buffer_count, 0,
                  "read: gradient copies a GPU trainer keeps in flight (with GPU trainers)"),
    ZD_TC_FLAG("zero_optimization.offload_optimizer.fast_init", "false", offload_fast_init, 0,
               "read: accepted for DeepSpeed's configs; zerod's state is created in the daemon"),
    ZD_TC_REFUSE("zero_optimization.offload_optimizer.nvme_path", ZD_TC_ENUM, "null",
                 ZD_TC_NO_NVME),
    ZD_TC_REFUSE("zero_optimization.offload_optimizer.pipeline_read", ZD_TC_BOOL, "false",
                 ZD_TC_NO_NVME),
    ZD_TC_REFUSE("zero_optimization.offload_optimizer.pipeline_write", ZD_TC_BOOL, "false",
                 ZD_TC_NO_NVME),
    ZD_TC_REFUSE("zero_optimization.offload_optimizer.ratio", ZD_TC_NUMBER, "1.0",
                 "partial offload (ratio below 1) is not implemented"),
    ZD_TC_REFUSE("zero_optimization.offload_optimizer.super_offload", ZD_TC_BOOL, "false",
                 "SuperOffload is not implemented"),
    ZD_TC_IGNORE("zero_optimization.offload_optimizer.cpuadam_cores_perc", ZD_TC_NUMBER,
                 "the daemon's `threads` setting sizes its Adam"),
    ZD_TC_MODEL("zero_optimization.offload_param", "parameter offload, a stage 3 feature"),
    ZD_TC_CHOICE("zero_optimization.offload_param.device", ZD_TC_ENUM, "\"none\"",
                 zd_tc_offload_param_choices, ZD_TC_STORE_NONE, 0, 0, "only \"none\""),
    ZD_TC_IGNORE("zero_optimization.offload_param.pin_memory", ZD_TC_BOOL, ZD_TC_OWN_MEMORY),
    ZD_TC_REFUSE("zero_optimization.offload_param.nvme_path", ZD_TC_ENUM, "null", ZD_TC_NO_NVME),
    ZD_TC_IGNORE("zero_optimization.offload_param.buffer_count", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.offload_param.buffer_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.offload_param.max_in_cpu", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_REFUSE("zero_optimization.zero_quantized_weights", ZD_TC_BOOL, "false",
                 "ZeRO++ quantized weights are a stage 3 feature, which zerod does not implement"),
    ZD_TC_REFUSE("zero_optimization.zero_quantized_gradients", ZD_TC_BOOL, "false",
                 "ZeRO++ quantized gradient communication is not implemented"),
    ZD_TC_REFUSE("zero_optimization.compute_grad_norm", ZD_TC_BOOL, "true",
                 "zerod computes the global norm every step, for clipping and the report"),
    ZD_TC_REFUSE("zero_optimization.cpu_offload", ZD_TC_BOOL, "false",
                 "the old spelling: write offload_optimizer.device \"cpu\""),
    ZD_TC_REFUSE("zero_optimization.cpu_offload_param", ZD_TC_BOOL, "false",
                 "parameter offload is a stage 3 feature, which zerod does not implement"),
    ZD_TC_REFUSE("zero_optimization.legacy_stage1", ZD_TC_BOOL, "false",
                 "the legacy stage 1 optimizer is gone from DeepSpeed too"),
    ZD_TC_REFUSE("zero_optimization.zenflow", ZD_TC_OBJECT, NULL, "ZenFlow is not implemented"),
    ZD_TC_IGNORE("zero_optimization.allgather_partitions", ZD_TC_BOOL, ZD_TC_PER_BUCKET),
    ZD_TC_IGNORE("zero_optimization.allgather_bucket_size", ZD_TC_INT, ZD_TC_PER_BUCKET),
    ZD_TC_IGNORE("zero_optimization.reduce_scatter", ZD_TC_BOOL, ZD_TC_PER_BUCKET),
    ZD_TC_IGNORE("zero_optimization.use_multi_rank_bucket_allreduce", ZD_TC_BOOL, ZD_TC_PER_BUCKET),
    ZD_TC_IGNORE("zero_optimization.load_from_fp32_weights", ZD_TC_BOOL,
                 "zerod's checkpoints always restore the fp32 master"),
    ZD_TC_IGNORE("zero_optimization.elastic_checkpoint", ZD_TC_BOOL,
                 "zerod's checkpoints load at any world size"),
    ZD_TC_IGNORE("zero_optimization.cpu_offload_use_pin_memory", ZD_TC_BOOL, ZD_TC_OWN_MEMORY),
    ZD_TC_IGNORE("zero_optimization.ignore_unused_parameters", ZD_TC_BOOL,
                 "a parameter without a gradient contributes zeros to its bucket"),
    ZD_TC_IGNORE("zero_optimization.parameter_alignment", ZD_TC_INT,
                 "zerod aligns its layout itself"),
    ZD_TC_IGNORE("zero_optimization.enable_sanity_checks", ZD_TC_BOOL,
                 "DeepSpeed's internal checks"),
    ZD_TC_IGNORE("zero_optimization.save_muon_momentum_buffer_in_memory", ZD_TC_BOOL, "Muon only"),
    ZD_TC_IGNORE("zero_optimization.sub_group_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.prefetch_bucket_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.param_persistence_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.model_persistence_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.max_live_parameters", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.max_reuse_distance", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.gather_16bit_weights_on_model_save", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.module_granularity_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.use_all_reduce_for_fetch_params", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.allgather_sequential", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.zero_hpz_partition_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.zero_quantized_nontrainable_weights", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.memory_efficient_linear", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.pipeline_loading_checkpoint", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.override_module_apply", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.log_trace_cache_warnings", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.leaf_module", ZD_TC_OBJECT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.mics_shard_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.mics_hierarchical_params_gather", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_prefetch_bucket_size", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_param_persistence_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_model_persistence_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_max_live_parameters", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_max_reuse_distance", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_module_granularity_threshold", ZD_TC_INT, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_use_all_reduce_for_fetch_params", ZD_TC_BOOL,
                 ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_allgather_sequential", ZD_TC_BOOL, ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_gather_16bit_weights_on_model_save", ZD_TC_BOOL,
                 ZD_TC_STAGE3),
    ZD_TC_IGNORE("zero_optimization.stage3_gather_fp16_weights_on_model_save", ZD_TC_BOOL,
                 ZD_TC_STAGE3),
    /* precision */
    ZD_TC_MODEL("fp16", "fp16 params and grads, loss scaling"),
    ZD_TC_FLAG("fp16.enabled", "false", fp16_enabled, ZD_TC_MATH,
               "fp16 params and grads (fp16 and bf16 both false: fp32)"),
    ZD_TC_REAL("fp16.loss_scale", "0", 0, 1e38, static_loss_scale, ZD_TC_MATH,
               "0: dynamic loss scale; > 0: this static scale"),
    ZD_TC_INTEGER("fp16.initial_scale_power", "16", 0, 126, ZD_TC_STORE_I32, initial_scale_power,
                  ZD_TC_MATH, "the dynamic scale starts at 2^power"),
    ZD_TC_INTEGER("fp16.loss_scale_window", "1000", 1, 1e9, ZD_TC_STORE_U32, loss_scale_window,
                  ZD_TC_MATH, "good steps before the scale doubles"),
    ZD_TC_INTEGER("fp16.hysteresis", "2", 1, 1e9, ZD_TC_STORE_U32, hysteresis, ZD_TC_MATH,
                  "overflows tolerated before the scale halves"),
    ZD_TC_FLAG("fp16.consecutive_hysteresis", "false", consecutive_hysteresis, ZD_TC_MATH,
               "refill the hysteresis on every good step"),
    ZD_TC_REAL("fp16.min_loss_scale", "1", 0, 1e38, min_loss_scale, ZD_TC_MATH | ZD_TC_MIN_OPEN,
               "floor of the dynamic scale; an overflow there with hysteresis spent is an error"),
    ZD_TC_REFUSE("fp16.auto_cast", ZD_TC_BOOL, "false",
                 "the engine casting forward's inputs to fp16 is not implemented: cast them in "
                 "the script"),
    ZD_TC_REFUSE("fp16.fp16_master_weights_and_grads", ZD_TC_BOOL, "false",
                 "zerod always keeps an fp32 master"),
    ZD_TC_MODEL("bf16", "bf16 params and grads"),
    ZD_TC_FLAG("bf16.enabled", "false", bf16_enabled, ZD_TC_MATH,
               "bf16 params and grads (not together with fp16.enabled)"),
    ZD_TC_FLAG("bf16.check_grad_overflow", "true", bf16_check_overflow, ZD_TC_MATH,
               "skip steps whose gradients hold inf or nan"),
    ZD_TC_IGNORE("bf16.immediate_grad_update", ZD_TC_BOOL,
                 "zerod adds each micro-step's gradient as it is produced either way"),
    ZD_TC_REFUSE("bf16.bf16_master_weights_and_grads", ZD_TC_BOOL, "false",
                 "zerod always keeps an fp32 master"),
    ZD_TC_REFUSE("bf16.bf16_optimizer_states", ZD_TC_BOOL, "false",
                 "zerod keeps Adam's moments in fp32"),
    ZD_TC_IGNORE("bf16.loss_scale", ZD_TC_NUMBER, ZD_TC_BF16_NO_SCALE),
    ZD_TC_IGNORE("bf16.initial_scale_power", ZD_TC_INT, ZD_TC_BF16_NO_SCALE),
    ZD_TC_IGNORE("bf16.loss_scale_window", ZD_TC_INT, ZD_TC_BF16_NO_SCALE),
    ZD_TC_IGNORE("bf16.hysteresis", ZD_TC_INT, ZD_TC_BF16_NO_SCALE),
    ZD_TC_IGNORE("bf16.consecutive_hysteresis", ZD_TC_BOOL, ZD_TC_BF16_NO_SCALE),
    ZD_TC_IGNORE("bf16.min_loss_scale", ZD_TC_NUMBER, ZD_TC_BF16_NO_SCALE),
    ZD_TC_ALIAS_OF("bfloat16", "bf16",
                   "the old name of \"bf16\", read as it when \"bf16\" is not given and ignored "
                   "when it is (DeepSpeed's rule)"),
    ZD_TC_SECTION("data_types", "dtypes of gradient accumulation"),
    ZD_TC_CHOICE("data_types.grad_accum_dtype", ZD_TC_ENUM, "null", zd_tc_accum_choices,
                 ZD_TC_STORE_I32, ZD_TC_OFF(grad_accum_code), ZD_TC_MATH | ZD_TC_NOCASE,
                 "stage 1: the dtype micro-steps are summed in before the reduce-scatter (null: "
                 "the param dtype, DeepSpeed's default; fp32 makes stage 1 equal stage 2); "
                 "stage 2 sums in fp32 whatever this says"),
    ZD_TC_REFUSE("data_types.param_dtype", ZD_TC_ENUM, "null",
                 "the param dtype comes from fp16.enabled / bf16.enabled"),
    ZD_TC_REFUSE("data_types.buffer_dtype", ZD_TC_ENUM, "null", ZD_TC_WHOLE_MODULE),
    ZD_TC_REFUSE("data_types.keep_in_fp32_modules", ZD_TC_ENUM, "\"auto\"", ZD_TC_WHOLE_MODULE),
    ZD_TC_FEATURE("amp", "NVIDIA Apex AMP"),
    ZD_TC_REFUSE("amp.enabled", ZD_TC_BOOL, "false",
                 "Apex AMP does not work with ZeRO (DeepSpeed refuses it too): use bf16 or fp16"),
    ZD_TC_FEATURE("torch_autocast", "the engine running forward under torch.autocast"),
    ZD_TC_REFUSE("torch_autocast.enabled", ZD_TC_BOOL, "false",
                 "not implemented: use bf16 or fp16, or torch.autocast in the script"),
    /* step */
    ZD_TC_REAL("gradient_clipping", "1.0", 0, 1e38, gradient_clipping, ZD_TC_MATH,
               "largest global gradient norm; 0 disables clipping"),
    ZD_TC_CHOICE("gradient_allreduce_op", ZD_TC_ENUM, "\"mean\"", zd_tc_allreduce_choices,
                 ZD_TC_STORE_BOOL, ZD_TC_OFF(allreduce_mean), ZD_TC_MATH,
                 "sum: gradients are not divided by the world size"),
    ZD_TC_FLAG("prescale_gradients", "false", prescale_gradients, 0,
               "accepted, same result: DeepSpeed divides before a 16-bit all-reduce to keep it "
               "from overflowing; zerod sums in fp32, then divides"),
    ZD_TC_REAL("gradient_predivide_factor", "1.0", 0, 1e9, gradient_predivide_factor,
               ZD_TC_MIN_OPEN,
               "accepted, same result: taken out before an fp32 sum and put back after, it "
               "leaves the average as it is"),
    ZD_TC_CHOICE("communication_data_type", ZD_TC_ENUM, "null", zd_tc_comm_choices,
                 ZD_TC_STORE_NONE, 0, ZD_TC_NOCASE,
                 "null or \"fp32\": zerod reduces in fp32 (DeepSpeed's null reduces in the "
                 "gradient dtype)"),
    ZD_TC_IGNORE("seq_parallel_communication_data_type", ZD_TC_ENUM,
                 "sequence parallelism is outside ZeRO-1/2 data parallelism"),
    ZD_TC_REFUSE("sparse_gradients", ZD_TC_BOOL, "false",
                 "sparse gradients are not implemented: zerod's gradient regions are dense"),
    ZD_TC_REFUSE("disable_allgather", ZD_TC_BOOL, "false",
                 "the all-gather is how every rank gets the updated parameters"),
    /* optimizer and schedule */
    ZD_TC_SECTION("optimizer", "the optimizer zerod runs on the shard"),
    ZD_TC_CHOICE("optimizer.type", ZD_TC_ENUM, "\"AdamW\"", zd_tc_optimizer_choices,
                 ZD_TC_STORE_BOOL, ZD_TC_OFF(optimizer_adamw), ZD_TC_MATH | ZD_TC_NOCASE,
                 "any case; Adam with adam_w_mode false is L2 mode"),
    ZD_TC_IGNORE("optimizer.legacy_fusion", ZD_TC_BOOL, "a DeepSpeed implementation choice"),
    ZD_TC_SECTION("optimizer.params", "hyper-parameters; a param group may override each"),
    ZD_TC_REAL("optimizer.params.lr", "1e-3", 0, 1e6, opt.lr, ZD_TC_MATH, "learning rate"),
    ZD_TC_TWO("optimizer.params.betas", "[0.9, 0.999]", 0, 0.999999999, opt.beta1, opt.beta2,
              ZD_TC_MATH, "Adam's beta1 and beta2"),
    ZD_TC_REAL("optimizer.params.eps", "1e-8", 0, 1, opt.eps, ZD_TC_MATH,
               "added to the denominator"),
    ZD_TC_REAL("optimizer.params.weight_decay", "0", 0, 1e6, opt.weight_decay, ZD_TC_MATH,
               "decoupled (adam_w_mode) or L2 weight decay"),
    ZD_TC_FLAG("optimizer.params.bias_correction", "true", opt.bias_correction, ZD_TC_MATH,
               "divide the moments by 1 - beta^t"),
    ZD_TC_FLAG("optimizer.params.adam_w_mode", "true", opt.adam_w_mode, ZD_TC_MATH,
               "false: L2 mode (only with optimizer.type Adam)"),
    ZD_TC_REFUSE("optimizer.params.amsgrad", ZD_TC_BOOL, "false", "AMSGrad is not implemented"),
    ZD_TC_IGNORE("optimizer.params.torch_adam", ZD_TC_BOOL,
                 "chooses DeepSpeed's Adam implementation; the math is the same"),
    ZD_TC_IGNORE("optimizer.params.set_grad_none", ZD_TC_BOOL,
                 "gradients live in zerod's regions, not in .grad"),
    ZD_TC_IGNORE("optimizer.params.foreach", ZD_TC_BOOL,
                 "chooses torch's Adam implementation (with torch_adam); the math is the same"),
    ZD_TC_REFUSE("optimizer.params.fp32_optimizer_states", ZD_TC_BOOL, "true",
                 "zerod keeps Adam's moments in fp32"),
    ZD_TC_REFUSE("optimizer.params.max_grad_norm", ZD_TC_NUMBER, NULL,
                 "write gradient_clipping (DeepSpeed refuses it too)"),
    ZD_TC_FLAG("zero_allow_untested_optimizer", "false", zero_allow_untested_optimizer, 0,
               "as in DeepSpeed, initialize() refuses a client optimizer other than Adam or "
               "AdamW unless true; zerod then says it runs Adam/AdamW only"),
    ZD_TC_IGNORE("zero_force_ds_cpu_optimizer", ZD_TC_BOOL,
                 "zerod always runs its own CPU Adam for offloaded state"),
    ZD_TC_SECTION("scheduler", "the learning-rate schedule, " ZD_TC_ENGINE),
    ZD_TC_CHOICE("scheduler.type", ZD_TC_ENUM, NULL, zd_tc_scheduler_choices, ZD_TC_STORE_NONE, 0,
                 0,
                 "DeepSpeed's schedules, or a torch.optim.lr_scheduler class; stepped after "
                 "every applied optimizer step"),
    ZD_TC_PASSED("scheduler.params",
                 "the schedule's arguments, checked against its type before anything changes"),
    /* other DeepSpeed features */
    ZD_TC_FEATURE("elasticity", "elastic training"),
    ZD_TC_REFUSE("elasticity.enabled", ZD_TC_BOOL, "false",
                 "elastic training changes the batch size with the world; not implemented"),
    ZD_TC_FEATURE("progressive_layer_drop", "progressive layer dropping"),
    ZD_TC_REFUSE("progressive_layer_drop.enabled", ZD_TC_BOOL, "false",
                 "it changes the forward pass; not implemented"),
    ZD_TC_FEATURE("curriculum_learning", "curriculum learning"),
    ZD_TC_REFUSE("curriculum_learning.enabled", ZD_TC_BOOL, "false",
                 "it changes the data each step sees; not implemented"),
    ZD_TC_FEATURE("data_efficiency", "data sampling and routing"),
    ZD_TC_REFUSE("data_efficiency.enabled", ZD_TC_BOOL, "false",
                 "it changes the data each step sees; not implemented"),
    ZD_TC_FEATURE("eigenvalue", "eigenvalue computation for quantization"),
    ZD_TC_REFUSE("eigenvalue.enabled", ZD_TC_BOOL, "false", "not implemented"),
    ZD_TC_FEATURE("quantize_training", "MoQ quantized training"),
    ZD_TC_REFUSE("quantize_training.enabled", ZD_TC_BOOL, "false",
                 "it changes the weights; not implemented"),
    ZD_TC_FEATURE("hybrid_engine", "the RLHF hybrid engine"),
    ZD_TC_REFUSE("hybrid_engine.enabled", ZD_TC_BOOL, "false", "not implemented"),
    ZD_TC_REFUSE("compression_training", ZD_TC_OBJECT, NULL,
                 "DeepSpeed Compression rewrites the model; not implemented"),
    ZD_TC_REFUSE("sparse_attention", ZD_TC_OBJECT, NULL,
                 "sparse attention kernels are a model feature zerod does not provide"),
    ZD_TC_REFUSE("weight_quantization", ZD_TC_OBJECT, NULL, "not implemented"),
    ZD_TC_REFUSE("tensor_parallel", ZD_TC_OBJECT, NULL,
                 "tensor parallelism (AutoTP) is not implemented; zerod is data parallel"),
    ZD_TC_IGNORE("pipeline", ZD_TC_OBJECT,
                 "read by DeepSpeed's PipelineModule, which zerod does not provide"),
    ZD_TC_IGNORE("activation_checkpointing", ZD_TC_OBJECT,
                 "configures deepspeed.checkpointing, which zerod does not provide; "
                 "torch.utils.checkpoint gives the same gradients"),
    ZD_TC_PASSED("checkpoint",
                 "read by engine.save_checkpoint (docs/checkpoints.md): writer.decoupled (return "
                 "before the commit), tag_validation and use_node_local_storage (checked)"),
    ZD_TC_IGNORE("aio", ZD_TC_OBJECT, ZD_TC_NO_NVME),
    ZD_TC_IGNORE("nebula", ZD_TC_OBJECT, "a DeepSpeed checkpoint service"),
    ZD_TC_IGNORE("autotuning", ZD_TC_OBJECT, "DeepSpeed's launcher feature"),
    ZD_TC_IGNORE("compile", ZD_TC_OBJECT,
                 "engine.compile(); compiling the model with torch.compile keeps the math"),
    ZD_TC_IGNORE("use_data_before_expert_parallelism", ZD_TC_BOOL, "mixture of experts only"),
    ZD_TC_IGNORE("dataloader_drop_last", ZD_TC_BOOL, "zerod's engine builds no data loader"),
    ZD_TC_IGNORE("dump_state", ZD_TC_BOOL, "DeepSpeed's debug print"),
    ZD_TC_IGNORE("disable_python_gc", ZD_TC_INT, "DeepSpeed's garbage collector control"),
    ZD_TC_IGNORE("log_level", ZD_TC_ENUM, "zerod's Python logger follows logging's settings"),
    ZD_TC_IGNORE("wall_clock_breakdown", ZD_TC_BOOL,
                 "DeepSpeed's timers; zeroctl stats reports zerod's"),
    ZD_TC_IGNORE("memory_breakdown", ZD_TC_BOOL, "zeroctl shard reports zerod's memory"),
    ZD_TC_IGNORE("timers", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("flops_profiler", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("comms_logger", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("tensorboard", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("wandb", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("csv_monitor", ZD_TC_OBJECT, ZD_TC_MONITOR),
    ZD_TC_IGNORE("comet", ZD_TC_OBJECT, ZD_TC_MONITOR),
};

const size_t zd_tc_n_keys = ZS_ARRAY_SIZE(zd_tc_keys);

const zd_tc_key_t *zd_train_config_keys(size_t *n_p)
{
    if (n_p != NULL) {
        *n_p = zd_tc_n_keys;
    }
    return zd_tc_keys;
}
