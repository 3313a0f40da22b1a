/*
 * A job made from an Attach (job/job.h): the spec and config checked, the backend chosen, the
 * layout built within max_shard_bytes, every region allocated -- and a job taken apart again.
 * The rest of its life is job/job.c's.
 */
#define _GNU_SOURCE
#include "config/daemon_config.h"
#include "job/job_int.h"
#include "mesh/mesh.h"
#include "zs/error.h"
#include "zs/time.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static zs_status_t zd_job_check_spec(const zd_job_spec_t *spec, char *err, size_t errlen)
{
    size_t idlen = spec->job_id != NULL ? strlen(spec->job_id) : 0;

    if (idlen == 0 || idlen >= ZD_JOB_ID_MAX) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: job_id must be 1..%d characters (got %zu)", ZD_JOB_ID_MAX - 1,
                       idlen);
    }
    for (size_t i = 0; i < idlen; i++) {
        unsigned char c = (unsigned char)spec->job_id[i];
        if (c < 0x21 || c > 0x7e) {
            return zs_errf(err, errlen, ZS_ERR_INVALID,
                           "attach: job_id has a non-printable or space character at %zu", i);
        }
    }
    if (spec->world == 0 || spec->world > ZS_LAYOUT_MAX_WORLD) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: world %u is out of range 1..%u",
                       spec->world, ZS_LAYOUT_MAX_WORLD);
    }
    if (spec->rank >= spec->world) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: rank %u is not below world %u",
                       spec->rank, spec->world);
    }
    if (spec->n_groups == 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "attach: groups is empty (at least one param group is needed)");
    }
    if (zs_dtype_size(spec->dtype) == 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: dtype %d is not fp32, fp16 or bf16",
                       (int)spec->dtype);
    }
    return ZS_OK;
}

/* Sizes of every term of docs/semantics.md §1, measured and by formula; ZS_ERR_OVERFLOW on
 * wraparound. */
static zs_status_t zd_job_sizes(zd_job_t *job)
{
    const zs_layout_t *l = job->layout;
    uint64_t dsize = zs_dtype_size(job->dtype), psi = l->param_numel, shard_bytes;
    uint64_t gsize = zs_dtype_size(job->cfg.grad_accum_dtype);
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
    job->mem_bytes[ZD_MEM_GRADS] = 0;
    if (job->cfg.stage == 1) { /* full gradients in data_types.grad_accum_dtype */
        st = zs_mul_u64(l->total_numel, gsize, &job->mem_bytes[ZD_MEM_GRADS]);
        if (st != ZS_OK) {
            return st;
        }
    }
    /* stage 2 = dΨ + 16Ψ/N (+ slots); stage 1 adds gΨ of full gradients (g: accum dtype) */
    job->mem_formula[ZD_MEM_PARAMS] = dsize * psi;
    job->mem_formula[ZD_MEM_SLOTS] = job->mem_bytes[ZD_MEM_SLOTS];
    job->mem_formula[ZD_MEM_GRADS] = job->cfg.stage == 1 ? gsize * psi : 0;
    for (int t = ZD_MEM_MASTER; t <= ZD_MEM_ACC; t++) {
        job->mem_bytes[t] = shard_bytes;
        job->mem_formula[t] = 4 * psi / job->world;
    }
    if (job->master_shared) { /* the params region's slices: counted there */
        job->mem_bytes[ZD_MEM_MASTER] = 0;
        job->mem_formula[ZD_MEM_MASTER] = 0;
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
    if (max_bytes == 0 || total <= max_bytes) {
        return ZS_OK;
    }
    return zs_errf(err, errlen, ZS_ERR_LIMIT,
                   "attach: layout needs %llu bytes on this rank (params %llu, slots %llu, grads "
                   "%llu, shard %dx%llu), over max_shard_bytes = %llu",
                   (unsigned long long)total, (unsigned long long)job->mem_bytes[ZD_MEM_PARAMS],
                   (unsigned long long)job->mem_bytes[ZD_MEM_SLOTS],
                   (unsigned long long)job->mem_bytes[ZD_MEM_GRADS], job->master_shared ? 3 : 4,
                   (unsigned long long)job->mem_bytes[ZD_MEM_M], (unsigned long long)max_bytes);
}

static zs_status_t zd_job_alloc(zd_job_t *job, char *err, size_t errlen)
{
    static const char *const names[3] = {"zerod-params", "zerod-slots", "zerod-grads"};
    zs_region_t *regions[3] = {&job->params, &job->slots, &job->grads};
    const int kinds[3] = {ZD_MEM_PARAMS, ZD_MEM_SLOTS, ZD_MEM_GRADS};
    size_t bytes = (size_t)job->mem_bytes[ZD_MEM_M];
    float **arrays[4] = {&job->m, &job->v, &job->acc, &job->master};
    zs_status_t st;

    for (int i = 0; i < (job->master_shared ? 3 : 4); i++) {
        st = zd_backend_alloc(job->be, bytes, arrays[i]);
        if (st != ZS_OK) {
            return zs_errf(err, errlen, st, "attach: shard state on %s: %s",
                           zd_backend_name(job->be), zd_backend_error(job->be));
        }
    }
    for (int i = 0; i < (job->cfg.stage == 1 ? 3 : 2); i++) {
        st = zd_backend_region(job->be, names[i], (size_t)job->mem_bytes[kinds[i]], regions[i]);
        if (st != ZS_OK) {
            return zs_errf(err, errlen, st, "attach: cannot create shared regions on %s: %s",
                           zd_backend_name(job->be), zd_backend_error(job->be));
        }
    }
    /* the params region may yet give way to one per host (zd_job_form_mesh) */
    zd_backend_prefault(job->be, &job->slots);
    zd_backend_prefault(job->be, &job->grads);
    job->acc_clean = malloc(job->layout->n_buckets > 0 ? job->layout->n_buckets : 1);
    job->slice_norm =
        calloc(job->layout->n_buckets > 0 ? job->layout->n_buckets : 1, sizeof(*job->slice_norm));
    if (job->acc_clean == NULL || job->slice_norm == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory");
    }
    memset(job->acc_clean, 1, job->layout->n_buckets); /* zs_aligned_alloc zero-fills acc */
    return ZS_OK;
}

/* The training config and the per-group options of the spec; keys zerod does not use are
 * logged (rate-limited: any trainer can send them). */
static zs_status_t zd_job_parse_config(zd_job_t *job, const zd_job_env_t *env,
                                       const zd_job_spec_t *spec, char *err, size_t errlen)
{
    char *ignored = job->cfg_ignored;
    zs_status_t st;

    st = zd_train_config_parse(spec->config_json, &job->cfg, ignored, sizeof(job->cfg_ignored), err,
                               errlen);
    if (st == ZS_OK) {
        st = zd_train_config_resolve_batch(&job->cfg, spec->world, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    if (ignored[0] != '\0') { /* the trainer is told too (AttachReply.ignored_keys) */
        zs_warn_limited(env->warn_rl, ZS_SUB_CFG,
                        "job '%s': config keys zerod does not use, ignored: %s", job->id, ignored);
    }
    if (job->cfg.dtype != spec->dtype) {
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "attach: dtype %s does not match the config, which asks for %s "
                       "(fp16.enabled / bf16.enabled)",
                       zs_dtype_name(spec->dtype), zs_dtype_name(job->cfg.dtype));
    }
    job->config_hash = zd_train_config_hash(&job->cfg);
    job->cfg_explained = zd_train_config_explain(spec->config_json, &job->cfg);
    job->group_opts = calloc(spec->n_groups, sizeof(*job->group_opts));
    if (job->group_opts == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory");
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        st = zd_group_opts_parse(spec->group_json ? spec->group_json[g] : NULL, &job->cfg.opt, g,
                                 &job->group_opts[g], err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        if (job->cfg.optimizer_adamw && !job->group_opts[g].adam_w_mode) {
            return zs_errf(err, errlen, ZS_ERR_CONFIG,
                           "attach: groups[%u].options.adam_w_mode false contradicts "
                           "optimizer.type AdamW",
                           g);
        }
    }
    return ZS_OK;
}

/* bucket_slots = 0: one slot more than the most buckets one parameter spans, 2 to 4. The
 * trainer holds all slots but one open while it fills them, and computes a linear layer's
 * weight gradient straight into the slots of every bucket of it when they are open at once
 * (docs/design-notes.md, "Trainer memory"). */
static uint32_t zd_job_auto_slots(const zs_layout_t *l)
{
    uint32_t span = 1;

    for (uint32_t i = 0; i < l->n_params; i++) {
        uint32_t s = l->params[i].last_bucket - l->params[i].bucket + 1;
        span = s > span ? s : span;
    }
    return span + 1 > 4 ? 4 : span + 1;
}

/* bucket_slots = 0 with buddy replicas at stage 2 on host memory: a slot for every bucket of
 * the accumulation window (when that is at most ZD_MAX_SLOTS), so that the trainer's window
 * stays in the slots it submitted it in until the step (libzc takes slots round the ring), and
 * a trainer that re-attaches in place after a lost daemon sends it again without having copied
 * it (docs/design-notes.md "Buddy replicas"). 0: none. */
static uint32_t zd_job_window_slots(const zd_job_t *job, const zd_job_env_t *env,
                                    const zd_job_spec_t *spec)
{
    uint64_t n = (uint64_t)job->layout->n_buckets * job->cfg.gradient_accumulation_steps;

    if (env->replication != ZD_REPLICATION_BUDDY || spec->world < 2 || job->cfg.stage != 2 ||
        zd_backend_mem(job->be) != ZS_MEM_HOST || n > ZD_MAX_SLOTS) {
        return 0;
    }
    return (uint32_t)n;
}

/* The layout of the spec's parameters, its sizes within max_shard_bytes, and the memory. */
static zs_status_t zd_job_layout(zd_job_t *job, const zd_job_env_t *env, const zd_job_spec_t *spec,
                                 char *err, size_t errlen)
{
    uint64_t max_bytes = env->max_shard_bytes;
    zs_layout_spec_t ls;
    zs_status_t st;

    memset(&ls, 0, sizeof(ls));
    ls.world = spec->world;
    ls.bucket_size = job->cfg.reduce_bucket_size;
    ls.elem_align = ZS_ELEM_ALIGN;
    ls.round_robin = job->cfg.round_robin_gradients;
    ls.max_numel = max_bytes ? max_bytes / zs_dtype_size(spec->dtype) : 0;
    ls.n_groups = spec->n_groups;
    ls.group_n_params = spec->group_n_params;
    ls.numel = spec->numel;
    st = zs_layout_create(&ls, &job->layout, err, errlen);
    if (st == ZS_ERR_LIMIT) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, " (max_shard_bytes = %llu)",
                 (unsigned long long)max_bytes);
    }
    if (st != ZS_OK) {
        return st;
    }
    if (job->n_slots == 0) {
        uint32_t window = zd_job_window_slots(job, env, spec);

        job->n_slots = zd_job_auto_slots(job->layout);
        job->n_slots = window > job->n_slots ? window : job->n_slots;
    }
    if (zd_job_sizes(job) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_OVERFLOW,
                       "attach: layout sizes overflow 64-bit arithmetic");
    }
    st = zd_job_check_limit(job, max_bytes, err, errlen);
    return st == ZS_OK ? zd_job_alloc(job, err, errlen) : st;
}

void zd_job_destroy(zd_job_t *job)
{
    if (job == NULL) {
        return;
    }
    zd_ckpt_destroy(job->ck); /* a checkpoint still being written is finished first */
    zd_coll_destroy(job->coll);
    zd_mesh_destroy(job->mesh);
    zd_backend_region_cleanup(job->be, &job->params);
    zd_backend_region_cleanup(job->be, &job->slots);
    zd_backend_region_cleanup(job->be, &job->grads);
    zd_replica_free(job);
    if (job->be != NULL) {
        zd_backend_free(job->be, job->master);
        zd_backend_free(job->be, job->m);
        zd_backend_free(job->be, job->v);
        zd_backend_free(job->be, job->acc);
    }
    zd_backend_destroy(job->be);
    if (job->layout != NULL) {
        zd_job_names_free(job);
    }
    zs_layout_destroy(job->layout);
    free(job->group_opts);
    free(job->cfg_explained);
    free(job->acc_clean);
    free(job->slice_norm);
    free(job);
}

/* The daemon's backend for this job. The CUDA backend runs world-1 jobs only: its NCCL
 * communicator is formed at world 1 (job/job_mesh.c), and a CUDA job of world > 1 is refused. */
static zs_status_t zd_job_backend(zd_job_t *job, const zd_job_env_t *env, char *err, size_t errlen)
{
    int device = env->cuda ? env->cuda_device : -1;
    zs_status_t st;

    if (device >= 0 && job->world > 1) {
        return zs_errf(err, errlen, ZS_ERR_UNSUPPORTED,
                       "attach: world %u on device 'cuda:%d': the CUDA backend runs world-1 jobs "
                       "in this version (a mesh of CUDA daemons is not built yet); run world > 1 "
                       "on the CPU backend (--device cpu)",
                       job->world, device);
    }
    st = zd_backend_create(device, env->exec, &job->be, err, errlen);
    if (st != ZS_OK) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, " (attach)");
    }
    return st;
}

zs_status_t zd_job_create(const zd_job_spec_t *spec, const zd_job_env_t *env, zd_job_t **job_p,
                          char *err, size_t errlen)
{
    zd_job_t *job;
    zs_status_t st;

    st = zd_job_check_spec(spec, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    job = calloc(1, sizeof(*job));
    if (job == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory");
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
    job->master_shared = spec->dtype == ZS_DTYPE_F32;
    job->own_slices_only = spec->own_slices_only;
    job->n_slots = env->n_slots;
    job->created_ns = zs_time_now_ns();
    job->trace = env->trace;
    st = zd_job_parse_config(job, env, spec, err, errlen);
    if (st == ZS_OK) {
        st = zd_job_backend(job, env, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_job_layout(job, env, spec, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_job_names_init(job, spec, err, errlen);
    }
    if (st == ZS_OK && zd_ckpt_create(&job->ck) != ZS_OK) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "attach: out of memory");
    }
    if (st != ZS_OK) {
        zd_job_destroy(job);
        return st;
    }
    zd_scaler_init(&job->scaler, &job->cfg);
    *job_p = job;
    return ZS_OK;
}
