/*
 * The training config a job attaches with: DeepSpeed key names and semantics
 * (semantics.md §1), parsed with cJSON, every key validated.
 */
#ifndef ZD_TRAIN_CONFIG_H
#define ZD_TRAIN_CONFIG_H

#include "zs/dtype.h"
#include "zs/status.h"

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
    zs_dtype_t dtype;
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
    /* optimizer */
    bool optimizer_adamw; /* type AdamW (else Adam) */
    zd_group_opts_t opt;
} zd_train_config_t;

/* Parse a DeepSpeed-style JSON config. On error: ZS_ERR_CONFIG and a message naming the key
 * and value in err. Keys of other DeepSpeed features are collected in `ignored` (a comma
 * list, may be NULL) for the caller to warn about once. */
zs_status_t zd_train_config_parse(const char *json, zd_train_config_t *cfg, char *ignored,
                                  size_t ignored_len, char *err, size_t errlen);

/* Parse one group's options JSON (keys of optimizer.params) over `base`. NULL/empty: base. */
zs_status_t zd_group_opts_parse(const char *json, const zd_group_opts_t *base, uint32_t group,
                                zd_group_opts_t *opts, char *err, size_t errlen);

/* Stable hash of the parsed config (every field that changes the math). */
uint64_t zd_train_config_hash(const zd_train_config_t *cfg);

#endif
