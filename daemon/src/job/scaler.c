#include "job/scaler.h"

#include <math.h>

void zd_scaler_init(zd_scaler_t *s, const zd_train_config_t *cfg)
{
    s->dynamic = cfg->dtype == ZS_DTYPE_F16 && cfg->static_loss_scale == 0;
    if (cfg->dtype != ZS_DTYPE_F16) {
        s->cur_scale = 1.0;
    } else if (s->dynamic) {
        s->cur_scale = ldexp(1.0, cfg->initial_scale_power);
    } else {
        s->cur_scale = cfg->static_loss_scale;
    }
    s->min_scale = cfg->min_loss_scale;
    s->window = cfg->loss_scale_window;
    s->hysteresis_cfg = cfg->hysteresis;
    s->consecutive_hysteresis = cfg->consecutive_hysteresis;
    s->cur_hysteresis = cfg->hysteresis;
    s->cur_iter = 0;
    s->last_overflow_iter = -1;
}

zs_status_t zd_scaler_update(zd_scaler_t *s, bool overflow)
{
    if (!s->dynamic) {
        return ZS_OK;
    }
    if (overflow) {
        if (s->hysteresis_cfg == 1 || s->cur_hysteresis == 1) {
            if (s->cur_scale == s->min_scale) {
                return ZS_ERR_LOSS_SCALE;
            }
            s->cur_scale = fmax(s->cur_scale / 2, s->min_scale);
        } else {
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->cur_iter;
    } else {
        int64_t stable;
        if (s->consecutive_hysteresis) {
            s->cur_hysteresis = s->hysteresis_cfg;
        }
        stable = s->cur_iter - s->last_overflow_iter - 1;
        if (stable > 0 && stable % s->window == 0) {
            if (!s->consecutive_hysteresis) {
                s->cur_hysteresis = s->hysteresis_cfg;
            }
            s->cur_scale *= 2;
        }
    }
    s->cur_iter++;
    return ZS_OK;
}
