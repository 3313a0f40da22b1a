/*
 * The training config's types (config/train_config.h parses it): what a job's config resolves
 * to, one param group's optimizer settings, and the rows of the key table that describes every
 * key (config/train_config_keys.h).
 */
#ifndef ZD_TRAIN_CONFIG_TYPES_H
#define ZD_TRAIN_CONFIG_TYPES_H

#include "zs/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Optimizer hyper-parameters of one param group. */
typedef struct zd_group_opts {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;
    bool bias_correction;
    bool adam_w_mode;
} zd_group_opts_t;

typedef struct zd_train_config {
    /* zero_optimization */
    uint32_t stage;
    uint64_t reduce_bucket_size;
    bool overlap_comm;
    bool contiguous_gradients;
    bool round_robin_gradients;
    bool offload_cpu;
    /* precision */
    zs_dtype_t dtype;  /* from fp16.enabled / bf16.enabled */
    bool fp16_enabled; /* as given; dtype is what the job uses */
    bool bf16_enabled;
    double static_loss_scale; /* fp16.loss_scale: 0 = dynamic */
    int initial_scale_power;
    uint32_t loss_scale_window;
    uint32_t hysteresis;
    bool consecutive_hysteresis;
    double min_loss_scale;
    bool bf16_check_overflow;
    /* step */
    double gradient_clipping;
    uint32_t gradient_accumulation_steps;
    bool allreduce_mean;
    bool prescale_gradients;          /* accepted: the mean is the same (sums are fp32) */
    double gradient_predivide_factor; /* likewise */
    int grad_accum_code;              /* data_types.grad_accum_dtype: 0 = null, else dtype + 1 */
    zs_dtype_t grad_accum_dtype;      /* resolved: stage 1's grads region holds this dtype */
    /* batch (0: not given; zd_train_config_resolve_batch fills what the others determine) */
    uint32_t train_batch_size;
    uint32_t micro_batch_size;
    bool gas_given;
    /* read by the trainer's engine (not by the daemon's math) */
    uint32_t steps_per_print;
    bool zero_allow_untested_optimizer;
    bool offload_pin_memory;
    uint32_t offload_buffer_count;
    bool offload_fast_init;
    /* optimizer */
    bool optimizer_adamw; /* type AdamW (else Adam) */
    zd_group_opts_t opt;
} zd_train_config_t;

/* ---- the rows of the key table ------------------------------------------------------------ */

typedef enum zd_tc_type {
    ZD_TC_OBJECT, /* a section: its children are the rows "<path>.<name>" */
    ZD_TC_BOOL,
    ZD_TC_INT,
    ZD_TC_NUMBER,
    ZD_TC_ENUM, /* a string out of `choices` */
    ZD_TC_PAIR, /* [a, b], two numbers in range: stored at offset and offset2 */
} zd_tc_type_t;

typedef enum zd_tc_fate {
    ZD_TC_HONOURED, /* parsed, validated and used */
    ZD_TC_IGNORED,  /* accepted and listed in `ignored`: ignoring it cannot change the math */
    ZD_TC_REFUSED,  /* present = ZS_ERR_CONFIG with the row's doc as the reason */
} zd_tc_fate_t;

/* Where a value lands. */
typedef enum zd_tc_store {
    ZD_TC_STORE_NONE, /* validated only */
    ZD_TC_STORE_BOOL,
    ZD_TC_STORE_I32,
    ZD_TC_STORE_U32,
    ZD_TC_STORE_U64,
    ZD_TC_STORE_F64,
} zd_tc_store_t;

enum {
    ZD_TC_MATH = 1u << 0,      /* changes what a step computes: part of zd_train_config_hash */
    ZD_TC_OPEN = 1u << 1,      /* object: an unknown child that is not a typo is ignored */
    ZD_TC_NOCASE = 1u << 2,    /* enum: choices match whatever the case */
    ZD_TC_MIN_OPEN = 1u << 3,  /* the range excludes min */
    ZD_TC_MAX_OPEN = 1u << 4,  /* the range excludes max */
    ZD_TC_OPAQUE = 1u << 5,    /* object: handed whole to the trainer's engine, which checks it */
    ZD_TC_LAX = 1u << 6,       /* object: DeepSpeed validates it with a pydantic model, whose lax
                                  mode converts strings ("2", "true") to its fields' types */
    ZD_TC_ALIAS = 1u << 7,     /* object: another name of the section `def` names, read in its
                                  place when that one is not given (and ignored when it is) */
    ZD_TC_INF_NEVER = 1u << 8, /* int: Infinity is taken, as "never", and stored as 0 */
};

/* A value of an enum (name), or of an int (value; name is its decimal text). refused == NULL:
 * accepted and stored as `value`; else refused with that reason. */
typedef struct zd_tc_choice {
    const char *name;
    int value;
    const char *refused;
} zd_tc_choice_t;

typedef struct zd_tc_key {
    const char *path; /* dotted, "" for the root; a parent comes before its children */
    zd_tc_type_t type;
    zd_tc_fate_t fate;
    const char *def; /* JSON text of the default, parsed like a value; NULL: none. An alias: the
                        path of the section it names */
    double min, max; /* INT, NUMBER, PAIR */
    const zd_tc_choice_t *choices; /* ENUM, INT (optional); ends with a NULL name */
    zd_tc_store_t store;
    size_t offset, offset2; /* offsetof in zd_train_config_t */
    unsigned flags;
    const char *doc; /* one line; for an ignored or refused key, the reason */
} zd_tc_key_t;

#endif
