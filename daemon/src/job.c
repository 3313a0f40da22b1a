#include "job.h"

#include "mesh.h"
#include "zs/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const zd_mem_term_names[ZD_MEM_COUNT] = {"params", "slots", "grads",      "master",
                                                     "m",      "v",     "accumulator"};

static void zd_job_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void zd_job_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static zs_status_t zd_job_check_spec(const zd_job_spec_t *spec, char *err, size_t errlen)
{
    size_t idlen = spec->job_id != NULL ? strlen(spec->job_id) : 0;

    if (idlen == 0 || idlen >= ZD_JOB_ID_MAX) {
        zd_job_err(err, errlen, "attach: job_id must be 1..%d characters (got %zu)",
                   ZD_JOB_ID_MAX - 1, idlen);
        return ZS_ERR_INVALID;
    }
    for (size_t i = 0; i < idlen; i++) {
        unsigned char c = (unsigned char)spec->job_id[i];
        if (c < 0x21 || c > 0x7e) {
            zd_job_err(err, errlen, "attach: job_id has a non-printable or space character at %zu",
                       i);
            return ZS_ERR_INVALID;
        }
    }
    if (spec->world == 0 || spec->world > ZS_LAYOUT_MAX_WORLD) {
        zd_job_err(err, errlen, "attach: world %u is out of range 1..%u", spec->world,
                   ZS_LAYOUT_MAX_WORLD);
        return ZS_ERR_INVALID;
    }
    if (spec->rank >= spec->world) {
        zd_job_err(err, errlen, "attach: rank %u is not below world %u", spec->rank, spec->world);
        return ZS_ERR_INVALID;
    }
    if (spec->n_groups == 0) {
        zd_job_err(err, errlen, "attach: groups is empty (at least one param group is needed)");
        return ZS_ERR_INVALID;
    }
    if ((unsigned)spec->dtype > ZS_DTYPE_BF16) {
        zd_job_err(err, errlen, "attach: dtype %d is not fp32, fp16 or bf16", (int)spec->dtype);
        return ZS_ERR_INVALID;
    }
    return ZS_OK;
}

/* Sizes of every term; ZS_ERR_OVERFLOW on wraparound. */
static zs_status_t zd_job_sizes(zd_job_t *job)
{
    const zs_layout_t *l = job->layout;
    uint64_t dsize = zs_dtype_size(job->dtype);
    uint64_t psi = l->param_numel;
    uint64_t n = job->world;
    uint64_t shard_bytes;
    zs_status_t st;

    st = zs_mul_u64(l->total_numel, dsize, &job->mem_bytes[ZD_MEM_PARAMS]);
    if (st == ZS_OK) {
        st = zs_mul_u64(l->max_bucket_numel, dsize, &job->slot_bytes);
    }
    if (st == ZS_OK) {
        st = zs_mul_u64(job->slot_bytes, job->n_slots, &job->mem_bytes[ZD_MEM_SLOTS]);
    }
    if (st == ZS_OK) {
        st = zs_mul_u64(l->shard_numel, sizeof(float), &shard_bytes);
    }
    if (st != ZS_OK) {
        return st;
    }
    job->mem_bytes[ZD_MEM_GRADS] = job->cfg.stage == 1 ? job->mem_bytes[ZD_MEM_PARAMS] : 0;
    job->mem_bytes[ZD_MEM_MASTER] = shard_bytes;
    job->mem_bytes[ZD_MEM_M] = shard_bytes;
    job->mem_bytes[ZD_MEM_V] = shard_bytes;
    job->mem_bytes[ZD_MEM_ACC] = shard_bytes;

    /* design.md §2: stage 2 = dΨ + 16Ψ/N (+ slots); stage 1 adds dΨ of full gradients. */
    job->mem_formula[ZD_MEM_PARAMS] = dsize * psi;
    job->mem_formula[ZD_MEM_SLOTS] = job->mem_bytes[ZD_MEM_SLOTS];
    job->mem_formula[ZD_MEM_GRADS] = job->cfg.stage == 1 ? dsize * psi : 0;
    for (int t = ZD_MEM_MASTER; t <= ZD_MEM_ACC; t++) {
        job->mem_formula[t] = 4 * psi / n;
    }
    return ZS_OK;
}

static zs_status_t zd_job_check_limit(const zd_job_t *job, uint64_t max_bytes, char *err,
                                      size_t errlen)
{
    uint64_t total = 0;

    for (int t = 0; t < ZD_MEM_COUNT; t++) {
        if (zs_add_u64(total, job->mem_bytes[t], &total) != ZS_OK) {
            total = UINT64_MAX;
            break;
        }
    }
    if (max_bytes != 0 && total > max_bytes) {
        zd_job_err(err, errlen,
                   "attach: layout needs %llu bytes on this rank (params %llu, slots %llu, grads "
                   "%llu, shard 4x%llu), over max_shard_bytes = %llu",
                   (unsigned long long)total, (unsigned long long)job->mem_bytes[ZD_MEM_PARAMS],
                   (unsigned long long)job->mem_bytes[ZD_MEM_SLOTS],
                   (unsigned long long)job->mem_bytes[ZD_MEM_GRADS],
                   (unsigned long long)job->mem_bytes[ZD_MEM_MASTER],
                   (unsigned long long)max_bytes);
        return ZS_ERR_LIMIT;
    }
    return ZS_OK;
}

static zs_status_t zd_job_alloc(zd_job_t *job, char *err, size_t errlen)
{
    size_t bytes = (size_t)job->mem_bytes[ZD_MEM_MASTER];
    float **arrays[4] = {&job->master, &job->m, &job->v, &job->acc};
    zs_status_t st;

    for (int i = 0; i < 4; i++) {
        st = zs_aligned_alloc(bytes, ZS_CACHE_LINE, (void **)arrays[i]);
        if (st != ZS_OK) {
            zd_job_err(err, errlen, "attach: cannot allocate %zu bytes of shard state", bytes);
            return st;
        }
    }
    st = zs_region_create("zerod-params", (size_t)job->mem_bytes[ZD_MEM_PARAMS], &job->params);
    if (st == ZS_OK) {
        st = zs_region_create("zerod-slots", (size_t)job->mem_bytes[ZD_MEM_SLOTS], &job->slots);
    }
    if (st == ZS_OK && job->cfg.stage == 1) {
        st = zs_region_create("zerod-grads", (size_t)job->mem_bytes[ZD_MEM_GRADS], &job->grads);
    }
    if (st != ZS_OK) {
        zd_job_err(err, errlen, "attach: cannot create shared regions (%s): %s",
                   zs_status_string(st), strerror(errno));
    }
    return st;
}

zs_status_t zd_job_create(const zd_job_spec_t *spec, zd_job_t **job_p, char *err, size_t errlen)
{
    zs_layout_spec_t lspec;
    zd_job_t *job;
    char ignored[256];
    zs_status_t st;

    st = zd_job_check_spec(spec, err, errlen);
    if (st != ZS_OK) {
        goto err;
    }
    job = calloc(1, sizeof(*job));
    if (job == NULL) {
        st = ZS_ERR_NO_MEMORY;
        goto err;
    }
    job->params = (zs_region_t)ZS_REGION_INIT;
    job->slots = (zs_region_t)ZS_REGION_INIT;
    job->grads = (zs_region_t)ZS_REGION_INIT;
    snprintf(job->id, sizeof(job->id), "%s", spec->job_id);
    snprintf(job->coordinator, sizeof(job->coordinator), "%s",
             spec->coordinator ? spec->coordinator : "");
    job->rank = spec->rank;
    job->world = spec->world;
    job->dtype = spec->dtype;
    job->n_slots = spec->n_slots;

    st = zd_train_config_parse(spec->config_json, &job->cfg, ignored, sizeof(ignored), err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    if (job->cfg.dtype != spec->dtype) {
        zd_job_err(err, errlen,
                   "attach: dtype %s does not match the config, which asks for %s "
                   "(fp16.enabled / bf16.enabled)",
                   zs_dtype_name(spec->dtype), zs_dtype_name(job->cfg.dtype));
        st = ZS_ERR_CONFIG;
        goto err_destroy;
    }
    job->config_hash = zd_train_config_hash(&job->cfg);
    job->group_opts = calloc(spec->n_groups, sizeof(*job->group_opts));
    if (job->group_opts == NULL) {
        st = ZS_ERR_NO_MEMORY;
        goto err_destroy;
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        st = zd_group_opts_parse(spec->group_json ? spec->group_json[g] : NULL, &job->cfg.opt, g,
                                 &job->group_opts[g], err, errlen);
        if (st != ZS_OK) {
            goto err_destroy;
        }
        if (job->cfg.optimizer_adamw && !job->group_opts[g].adam_w_mode) {
            zd_job_err(err, errlen,
                       "attach: groups[%u].options.adam_w_mode false contradicts optimizer.type "
                       "AdamW",
                       g);
            st = ZS_ERR_CONFIG;
            goto err_destroy;
        }
    }

    memset(&lspec, 0, sizeof(lspec));
    lspec.world = spec->world;
    lspec.bucket_size = job->cfg.reduce_bucket_size;
    lspec.elem_align = ZS_ELEM_ALIGN;
    lspec.round_robin = job->cfg.round_robin_gradients;
    lspec.max_numel =
        spec->max_shard_bytes ? spec->max_shard_bytes / zs_dtype_size(spec->dtype) : 0;
    lspec.n_groups = spec->n_groups;
    lspec.group_n_params = spec->group_n_params;
    lspec.numel = spec->numel;
    st = zs_layout_create(&lspec, &job->layout, err, errlen);
    if (st == ZS_ERR_LIMIT) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, " (max_shard_bytes = %llu)",
                 (unsigned long long)spec->max_shard_bytes);
    }
    if (st != ZS_OK) {
        goto err_destroy;
    }
    st = zd_job_sizes(job);
    if (st != ZS_OK) {
        zd_job_err(err, errlen, "attach: layout sizes overflow 64-bit arithmetic");
        goto err_destroy;
    }
    st = zd_job_check_limit(job, spec->max_shard_bytes, err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    st = zd_job_alloc(job, err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    job->acc_clean = malloc(job->layout->n_buckets > 0 ? job->layout->n_buckets : 1);
    if (job->acc_clean == NULL) {
        zd_job_err(err, errlen, "attach: out of memory");
        st = ZS_ERR_NO_MEMORY;
        goto err_destroy;
    }
    memset(job->acc_clean, 1, job->layout->n_buckets); /* zd_job_alloc zero-fills acc */
    zd_scaler_init(&job->scaler, &job->cfg);
    job->last_grad_norm = 0;
    *job_p = job;
    return ZS_OK;

err_destroy:
    zd_job_destroy(job);
err:
    return st;
}

void zd_job_destroy(zd_job_t *job)
{
    if (job == NULL) {
        return;
    }
    zd_coll_destroy(job->coll);
    zd_mesh_destroy(job->mesh);
    zs_region_cleanup(&job->params);
    zs_region_cleanup(&job->slots);
    zs_region_cleanup(&job->grads);
    zs_aligned_free(job->master);
    zs_aligned_free(job->m);
    zs_aligned_free(job->v);
    zs_aligned_free(job->acc);
    zs_layout_destroy(job->layout);
    free(job->group_opts);
    free(job->acc_clean);
    free(job);
}

/* This rank's slice of bucket b inside a full-layout region of the job's dtype. */
static void *zd_job_slice_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    uint64_t elem = bk->offset + (uint64_t)job->rank * bk->slice;

    return (char *)region->addr + elem * zs_dtype_size(job->dtype);
}

/* This rank's whole bucket b inside a full-layout region. */
static void *zd_job_bucket_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b)
{
    return (char *)region->addr + job->layout->buckets[b].offset * zs_dtype_size(job->dtype);
}

zs_status_t zd_job_refresh_params(zd_job_t *job, const zk_exec_t *exec, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    zs_status_t st = ZS_OK;

    job->params_stale = true;
    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        st = zk_cast(exec, zd_job_slice_ptr(job, &job->params, b), job->dtype,
                     job->master + bk->shard_offset, ZS_DTYPE_F32, bk->slice);
        if (st != ZS_OK) {
            zd_job_err(err, errlen, "cast: %s", zk_last_error());
            break;
        }
        st = job->coll->ops->all_gather(job->coll, zd_job_bucket_ptr(job, &job->params, b),
                                        job->dtype, bk->slice, err, errlen);
    }
    if (st == ZS_OK) {
        job->params_stale = false;
    }
    return st;
}

zs_status_t zd_job_load_params(zd_job_t *job, const zk_exec_t *exec, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    zs_status_t st = ZS_OK;

    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        st = zk_cast(exec, job->master + bk->shard_offset, ZS_DTYPE_F32,
                     zd_job_slice_ptr(job, &job->params, b), job->dtype, bk->slice);
    }
    if (st != ZS_OK) {
        zd_job_err(err, errlen, "loading parameters: %s", zk_last_error());
        return st;
    }
    job->params_loaded = true;
    if (job->world > 1) {
        st = zd_job_refresh_params(job, exec, err, errlen);
    }
    return st;
}

zs_status_t zd_job_share_regions(zd_job_t *job, char *err, size_t errlen)
{
    const zs_region_t *regions[3] = {&job->params, &job->slots, &job->grads};

    return zd_coll_share(job->coll, regions, 3, err, errlen);
}

/* Reduce-scatter `src` (bucket b of this rank) into the accumulator: the first contribution of
 * an accumulation window overwrites (no read of a zero accumulator), later ones add. */
static zs_status_t zd_job_reduce_bucket(zd_job_t *job, const void *src, uint32_t b, char *err,
                                        size_t errlen)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    unsigned flags = job->acc_clean[b] ? ZD_COLL_OVERWRITE : 0;

    job->acc_clean[b] = 0;
    return job->coll->ops->reduce_scatter(job->coll, src, job->dtype, bk->slice,
                                          job->acc + bk->shard_offset, flags, err, errlen);
}

zs_status_t zd_job_accumulate_slot(zd_job_t *job, const zk_exec_t *exec, uint32_t slot,
                                   uint32_t bucket, char *err, size_t errlen)
{
    const char *src = (const char *)job->slots.addr + (uint64_t)slot * job->slot_bytes;

    (void)exec;
    return zd_job_reduce_bucket(job, src, bucket, err, errlen);
}

void zd_job_drop_partial(zd_job_t *job)
{
    memset(job->acc, 0, (size_t)job->mem_bytes[ZD_MEM_ACC]);
    memset(job->acc_clean, 1, job->layout->n_buckets);
    if (job->grads.addr != NULL) {
        memset(job->grads.addr, 0, job->grads.size);
    }
}

/* Stage 1 at the boundary: reduce-scatter the full-gradient region into the accumulator and
 * zero it for the next accumulation. */
static zs_status_t zd_job_consume_grads(zd_job_t *job, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    size_t dsize = zs_dtype_size(job->dtype);

    for (uint32_t b = 0; b < l->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        zs_status_t st =
            zd_job_reduce_bucket(job, zd_job_bucket_ptr(job, &job->grads, b), b, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        memset((char *)job->grads.addr + bk->offset * dsize, 0, (size_t)(bk->padded * dsize));
    }
    return ZS_OK;
}

/* Fault injection for the disconnect tests (tests/integration/disconnect_test.sh), never set
 * in production: ZEROD_TEST_PAUSE=<phase>:<ms> makes every step sleep at that phase ("step":
 * before its first collective; "allgather": after the first bucket's all-gather) and log it,
 * so that a test can kill a trainer exactly there. Engine thread only. */
static void zd_job_test_pause(const zd_job_t *job, const char *phase, uint64_t step)
{
    static bool parsed;
    static char want[16];
    static unsigned ms;

    if (!parsed) {
        const char *env = getenv("ZEROD_TEST_PAUSE");
        parsed = true;
        if (env != NULL && sscanf(env, "%15[a-z]:%u", want, &ms) != 2) {
            zs_warn(ZS_SUB_ENGINE, "ZEROD_TEST_PAUSE='%s' is not <phase>:<ms>; ignored", env);
            ms = 0;
        }
    }
    if (ms == 0 || strcmp(want, phase) != 0) {
        return;
    }
    zs_warn(ZS_SUB_ENGINE, "ZEROD_TEST_PAUSE: %s of step %llu of job '%s' paused %u ms", phase,
            (unsigned long long)step, job->id, ms);
    usleep(ms * 1000u);
}

zs_status_t zd_job_step(zd_job_t *job, const zk_exec_t *exec, const double *group_lr,
                        zd_step_out_t *out, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    const zd_train_config_t *cfg = &job->cfg;
    double sumsq = 0, scaled_norm, grad_norm, c, n_avg, S;
    int nonfinite = 0;
    bool check, overflow;
    uint64_t t;
    float grad_scale;
    zs_status_t st;

    zd_job_test_pause(job, "step", job->step + 1);
    if (cfg->stage == 1) {
        st = zd_job_consume_grads(job, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
    }
    /* 1. overflow flag and sum of squares in one pass; global: SUM and MAX over ranks */
    st = zk_sumsq(exec, job->acc, l->shard_numel, &sumsq, &nonfinite);
    if (st != ZS_OK) {
        goto err_kernel;
    }
    {
        double vals[2] = {sumsq, nonfinite ? 1.0 : 0.0};
        static const zd_reduce_op_t ops[2] = {ZD_REDUCE_SUM, ZD_REDUCE_MAX};
        st = job->coll->ops->all_reduce(job->coll, vals, ops, 2, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        sumsq = vals[0];
        nonfinite = vals[1] != 0.0 || !isfinite(sumsq);
    }
    check = job->dtype == ZS_DTYPE_F16 || (job->dtype == ZS_DTYPE_BF16 && cfg->bf16_check_overflow);
    overflow = check && nonfinite;

    /* 2. loss-scaler update; S is the scale this step's backward used */
    S = job->scaler.cur_scale;
    st = zd_scaler_update(&job->scaler, overflow);
    if (st != ZS_OK) {
        zd_job_drop_partial(job);
        zd_job_err(err, errlen,
                   "step %llu: gradients overflowed with the loss scale already at its minimum "
                   "%g (fp16.min_loss_scale) and hysteresis spent",
                   (unsigned long long)job->step + 1, job->scaler.min_scale);
        return st;
    }
    /* 3. skip */
    if (overflow) {
        zd_job_drop_partial(job);
        job->skipped_steps++;
        job->last_grad_norm = -1;
        out->skipped = true;
        out->grad_norm = -1;
        return ZS_OK;
    }
    /* 4. norm of the averaged gradient */
    n_avg = cfg->allreduce_mean ? (double)job->world : 1.0;
    scaled_norm = sqrt(sumsq) / (n_avg * cfg->gradient_accumulation_steps);
    grad_norm = isfinite(scaled_norm) ? scaled_norm / S : -1;
    /* 5. combined factor */
    c = S;
    if (cfg->gradient_clipping > 0) {
        double clip = fmax(1.0, (scaled_norm / S + 1e-6) / cfg->gradient_clipping);
        c = clip * S;
    }
    grad_scale = (float)(1.0 / (n_avg * cfg->gradient_accumulation_steps * c));

    /* 6-7. Adam per group over this rank's slices, cast into the params region */
    t = job->step + 1;
    for (uint32_t g = 0; g < l->n_groups; g++) {
        const zs_layout_group_t *grp = &l->groups[g];
        zd_group_opts_t *o = &job->group_opts[g];
        zk_adam_params_t p;

        if (group_lr != NULL) {
            o->lr = group_lr[g];
        }
        p.lr = (float)o->lr;
        p.beta1 = (float)o->beta1;
        p.beta2 = (float)o->beta2;
        p.eps = (float)o->eps;
        p.weight_decay = (float)o->weight_decay;
        p.adam_w_mode = o->adam_w_mode;
        p.bias_correction = o->bias_correction;
        p.step = t;
        p.grad_scale = grad_scale;
        for (uint32_t b = grp->first_bucket; b < grp->first_bucket + grp->n_buckets; b++) {
            const zs_layout_bucket_t *bk = &l->buckets[b];
            uint64_t off = bk->shard_offset;
            st = zk_adam_step(exec, &p, job->master + off, job->m + off, job->v + off,
                              job->acc + off, zd_job_slice_ptr(job, &job->params, b), job->dtype,
                              bk->slice);
            if (st != ZS_OK) {
                goto err_kernel;
            }
        }
    }
    memset(job->acc_clean, 1, l->n_buckets); /* Adam zeroed every accumulator slice */
    /* Adam ran on every rank (it cannot fail for want of a peer): the step is committed. An
     * interrupted all-gather below is redone from the master on re-attach. */
    job->step = t;
    job->last_grad_norm = grad_norm;
    out->skipped = false;
    out->grad_norm = grad_norm;
    if (job->world > 1) {
        job->params_stale = true;
        for (uint32_t b = 0; b < l->n_buckets; b++) {
            st = job->coll->ops->all_gather(job->coll, zd_job_bucket_ptr(job, &job->params, b),
                                            job->dtype, l->buckets[b].slice, err, errlen);
            if (st != ZS_OK) {
                return st;
            }
            if (b == 0) {
                zd_job_test_pause(job, "allgather", job->step);
            }
        }
        job->params_stale = false;
    }
    return ZS_OK;

err_kernel:
    zd_job_err(err, errlen, "step %llu: kernel failed: %s (%s)", (unsigned long long)job->step + 1,
               zs_status_string(st), zk_last_error());
    return st;
}
