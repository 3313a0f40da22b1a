/* Independent fp64 model of docs/semantics.md §4 (deliberately not sharing code with the daemon)
 * and IEEE 16-bit conversions. */
#ifndef TH_REFERENCE_H
#define TH_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zerod/zc.h>

/* ---- fp16/bf16 reference conversions (RNE) ---- */
uint16_t th_f32_to_f16(float f);
float th_f16_to_f32(uint16_t h);
uint16_t th_f32_to_bf16(float f);
float th_bf16_to_f32(uint16_t h);
/* Round a float to the dtype and back. */
float th_round(zc_dtype_t dt, float f);
/* Store / load element i of a dtype array. */
void th_store(zc_dtype_t dt, void *base, uint64_t i, float f);
float th_load(zc_dtype_t dt, const void *base, uint64_t i);
/* Unit in the last place of |x| in the dtype (fp32/fp16/bf16). */
double th_ulp(zc_dtype_t dt, double x);

/* ---- a model: groups of parameter sizes ---- */
#define TH_MAX_PARAMS 16
#define TH_MAX_GROUPS 4

typedef struct th_model {
    uint32_t n_groups;
    uint32_t gnp[TH_MAX_GROUPS];
    uint64_t numel[TH_MAX_PARAMS];
    const char *group_json[TH_MAX_GROUPS];
    uint32_t n_params;
    uint64_t total; /* sum of numel */
} th_model_t;

/* The test models of the multi-rank tests, by name: "mixed" (default: two groups, sizes that
 * divide nothing), "tiny", "large", "other". */
th_model_t th_model_by_name(const char *name);
/* The DeepSpeed JSON of the multi-rank tests (AdamW, clipping 1.0; buckets of 64 elements, or
 * 4 Mi for "large"); a static buffer. The same text gives the same config hash. */
const char *th_config_json(const char *model, unsigned stage, bool bf16, unsigned accum);

/* ---- fp64 reference of docs/semantics.md §4 ---- */
typedef struct th_opts {
    double lr, beta1, beta2, eps, wd;
    bool adam_w_mode, bias_correction;
} th_opts_t;

typedef struct th_ref {
    const th_model_t *model;
    th_opts_t opts[TH_MAX_GROUPS];
    zc_dtype_t dtype;
    bool check_overflow;
    double clipping;
    uint32_t G, world;
    bool mean;
    /* loss scaler */
    bool dynamic;
    double scale, min_scale;
    uint32_t window, hyst_cfg, cur_hyst;
    bool consecutive;
    int64_t cur_iter, last_overflow;
    /* state */
    uint64_t step, skipped;
    double *p, *m, *v, *acc; /* [model->total] */
    double last_norm;
    bool last_skipped;
} th_ref_t;

void th_ref_init(th_ref_t *r, const th_model_t *model, zc_dtype_t dtype, const float *init);
void th_ref_free(th_ref_t *r);
/* acc += grads (already in the dtype the trainer sent, as floats) */
void th_ref_accumulate(th_ref_t *r, const float *grads);
/* One optimizer step; returns false when it would fail (scale at minimum). */
bool th_ref_step(th_ref_t *r);

/* deterministic PRNG */
uint64_t th_rand_u64(uint64_t *state);
double th_rand_unit(uint64_t *state); /* uniform [-1, 1) */

#endif
