/*
 * What follows the parse of a training config (config/train_config.h): the batch triple resolved
 * at the attach's world, and the hash of what changes the math.
 */
#include "config/train_config.h"

#include "zs/error.h"

#define XXH_STATIC_LINKING_ONLY
#include <stdio.h>
#include <xxhash.h>

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
