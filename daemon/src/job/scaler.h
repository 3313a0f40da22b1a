/* The loss scaler of docs/semantics.md §4 step 3 (DeepSpeed's DynamicLossScaler). */
#ifndef ZD_SCALER_H
#define ZD_SCALER_H

#include "config/train_config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct zd_scaler {
    bool dynamic;
    double cur_scale;
    double min_scale;
    uint32_t window;
    uint32_t hysteresis_cfg;
    bool consecutive_hysteresis;
    uint32_t cur_hysteresis;
    int64_t cur_iter;
    int64_t last_overflow_iter;
} zd_scaler_t;

/* fp16 dynamic when fp16.loss_scale == 0; static scale otherwise; bf16/fp32: scale 1. */
void zd_scaler_init(zd_scaler_t *s, const zd_train_config_t *cfg);
/* Apply one step's overflow flag. ZS_ERR_LOSS_SCALE (state unchanged) when an overflow
 * arrives with the scale already at its minimum and hysteresis spent. */
zs_status_t zd_scaler_update(zd_scaler_t *s, bool overflow);

#endif
