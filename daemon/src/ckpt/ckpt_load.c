/*
 * Loading a checkpoint into a job at any world size (docs/checkpoints.md): the saved layout is
 * rebuilt from the manifest; for each (parameter, element range) this rank's shard owns, the
 * saved layout says which saved rank's file holds it and where, and only those bytes are read.
 * The files a rank reads from are verified against the manifest first, and every rank agrees
 * the checkpoint is sound before it reads. The reading pass fills a staging copy of the shard
 * state, and every rank agrees it read everything before any job takes it (job/, which moves
 * it in): a file that goes bad between the two passes, or a rank that fails to read, leaves
 * every job as it was.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"
#include "obs/testpoint.h"
#include "zs/time.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zd_ckpt_src {
    const zs_ckpt_manifest_t *m;
    zs_layout_t *old; /* the saving world's layout */
    const char *path; /* the checkpoint's, for messages */
    const zs_dir_t *ckpt;
    const zs_cancel_t *cancel;
    zs_ckpt_reader_t *rd;
    bool moments; /* read exp_avg and exp_avg_sq too */
    /* the staging copy of the shard: master, m, v in shard order (m, v only with moments),
     * zero where nothing is read (padding, absent moments); the caller's zd_ckpt_loaded_t */
    float **stage;
} zd_ckpt_src_t;

/* This rank's parameters against the saved ones: same count and sizes; names too where both
 * sides have them (a name "param.<i>" stands for none). */
static zs_status_t zd_ckpt_match(const zd_ckpt_shard_t *sh, const zs_ckpt_manifest_t *m,
                                 const char *path, char *err, size_t errlen)
{
    const zs_layout_t *l = sh->layout;

    if (m->n_params != l->n_params) {
        return zs_errf(err, errlen, ZS_ERR_LAYOUT_MISMATCH,
                       "checkpoint %s holds %u parameters; the model has %u", path, m->n_params,
                       l->n_params);
    }
    for (uint32_t i = 0; i < l->n_params; i++) {
        const zs_ckpt_param_t *a = &m->params[i], *b = &sh->pmeta[i];
        bool named = strncmp(a->name, "param.", 6) != 0 && strncmp(b->name, "param.", 6) != 0;
        if (a->numel != b->numel || (named && strcmp(a->name, b->name) != 0)) {
            return zs_errf(err, errlen, ZS_ERR_LAYOUT_MISMATCH,
                           "checkpoint %s: parameter %u is '%s' with %" PRIu64
                           " elements; the model's is '%s' with %" PRIu64,
                           path, i, a->name, a->numel, b->name, b->numel);
        }
    }
    return ZS_OK;
}

/* For each piece of this rank's new shard: (param id, first element, count, shard offset). */
typedef zs_status_t (*zd_ckpt_piece_fn)(zd_ckpt_src_t *src, const zd_ckpt_shard_t *sh, uint32_t b,
                                        uint32_t id, uint64_t a, uint64_t n, uint64_t dst_off,
                                        void *arg, char *err, size_t errlen);

static zs_status_t zd_ckpt_pieces(zd_ckpt_src_t *src, const zd_ckpt_shard_t *sh,
                                  zd_ckpt_piece_fn fn, void *arg, char *err, size_t errlen)
{
    const zs_layout_t *l = sh->layout;

    for (uint32_t b = 0; b < l->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        uint64_t lo = (uint64_t)sh->rank * bk->slice, hi = lo + bk->slice;
        for (uint32_t i = 0; i < bk->n_params; i++) {
            zs_layout_piece_t pc;
            uint64_t s, e;
            zs_status_t st;

            zs_layout_bucket_piece(l, b, i, &pc);
            s = pc.bucket_offset > lo ? pc.bucket_offset : lo;
            e = pc.bucket_offset + pc.numel < hi ? pc.bucket_offset + pc.numel : hi;
            if (s >= e) {
                continue;
            }
            st = fn(src, sh, b, l->params[pc.param].id, pc.param_offset + (s - pc.bucket_offset),
                    e - s, s - lo, arg, err, errlen);
            if (st != ZS_OK) {
                return st;
            }
        }
    }
    return ZS_OK;
}

/* ---- pass 1: the files this rank needs, verified ------------------------------------------ */

static zs_status_t zd_ckpt_mark_run(void *arg, uint32_t rank, uint64_t shard_off, uint64_t n,
                                    uint64_t dst_off, char *err, size_t errlen)
{
    (void)shard_off;
    (void)n;
    (void)dst_off;
    (void)err;
    (void)errlen;
    ((bool *)arg)[rank] = true;
    return ZS_OK;
}

static zs_status_t zd_ckpt_mark_piece(zd_ckpt_src_t *src, const zd_ckpt_shard_t *sh, uint32_t b,
                                      uint32_t id, uint64_t a, uint64_t n, uint64_t dst_off,
                                      void *arg, char *err, size_t errlen)
{
    (void)sh;
    (void)b;
    (void)dst_off;
    return zs_ckpt_runs(src->old, id, a, n, zd_ckpt_mark_run, arg, err, errlen);
}

/* The rank files this rank reads from, and trainer_state.pt (every rank's trainer reads it),
 * each checked against the manifest. */
static zs_status_t zd_ckpt_check_files(zd_ckpt_src_t *src, const zd_ckpt_shard_t *sh, char *err,
                                       size_t errlen)
{
    bool *need = calloc(src->m->world, sizeof(*need));
    const zs_ckpt_file_t *state = zs_ckpt_find_file(src->m, ZS_CKPT_TRAINER_STATE);
    zs_status_t st;

    if (need == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    st = zd_ckpt_pieces(src, sh, zd_ckpt_mark_piece, need, err, errlen);
    if (st == ZS_OK && state != NULL) {
        st = zs_ckpt_verify_file(src->ckpt, state, src->cancel, err, errlen);
    }
    for (uint32_t r = 0; r < src->m->world && st == ZS_OK; r++) {
        char name[64];
        const zs_ckpt_file_t *fe;

        if (!need[r]) {
            continue;
        }
        zs_ckpt_rank_file(r, name, sizeof(name));
        fe = zs_ckpt_find_file(src->m, name);
        if (fe == NULL) {
            st = zs_errf(err, errlen, ZS_ERR_IO, "%s/%s lists no %s", src->path, ZS_CKPT_MANIFEST,
                         name);
            break;
        }
        st = zs_ckpt_verify_file(src->ckpt, fe, src->cancel, err, errlen);
        if (st == ZS_OK) {
            st = zs_ckpt_reader_open_rank(src->rd, r, err, errlen);
        }
    }
    free(need);
    return st;
}

/* ---- pass 2: reading -------------------------------------------------------------------- */

typedef struct zd_ckpt_dst {
    zd_ckpt_src_t *src;
    float *dst[ZS_CKPT_N_TENSORS]; /* master, m, v of this piece (dst_off counts from here) */
} zd_ckpt_dst_t;

static zs_status_t zd_ckpt_read_run(void *arg, uint32_t rank, uint64_t shard_off, uint64_t n,
                                    uint64_t dst_off, char *err, size_t errlen)
{
    const zd_ckpt_dst_t *d = arg;
    zs_status_t st = ZS_OK;

    for (unsigned t = 0; t < ZS_CKPT_N_TENSORS && st == ZS_OK; t++) {
        if (t > 0 && !d->src->moments) {
            break;
        }
        st = zs_ckpt_reader_read(d->src->rd, t, rank, shard_off, d->dst[t] + dst_off, n, err,
                                 errlen);
    }
    return st;
}

static zs_status_t zd_ckpt_read_piece(zd_ckpt_src_t *src, const zd_ckpt_shard_t *sh, uint32_t b,
                                      uint32_t id, uint64_t a, uint64_t n, uint64_t dst_off,
                                      void *arg, char *err, size_t errlen)
{
    uint64_t at = sh->layout->buckets[b].shard_offset + dst_off;
    zd_ckpt_dst_t d = {src, {NULL, NULL, NULL}};

    (void)arg;
    for (unsigned t = 0; t < ZS_CKPT_N_TENSORS; t++) {
        d.dst[t] = src->stage[t] != NULL ? src->stage[t] + at : NULL;
    }
    return zs_ckpt_runs(src->old, id, a, n, zd_ckpt_read_run, &d, err, errlen);
}

/* ---- the load --------------------------------------------------------------------------- */

static void zd_ckpt_src_free(zd_ckpt_src_t *src)
{
    zs_ckpt_reader_close(src->rd);
    zs_layout_destroy(src->old);
}

void zd_ckpt_loaded_free(zd_ckpt_loaded_t *loaded)
{
    for (unsigned t = 0; t < ZS_CKPT_N_TENSORS; t++) {
        zs_aligned_free(loaded->stage[t]);
        loaded->stage[t] = NULL;
    }
}

/* The staging copy (zeroed): master, and m and v when the moments are read. */
static zs_status_t zd_ckpt_stage(const zd_ckpt_shard_t *sh, zd_ckpt_src_t *src, char *err,
                                 size_t errlen)
{
    size_t bytes = (size_t)sh->layout->shard_numel * sizeof(float);

    for (unsigned t = 0; t < (src->moments ? ZS_CKPT_N_TENSORS : 1u); t++) {
        zs_status_t st = zs_aligned_alloc(bytes > 0 ? bytes : sizeof(float), ZS_CACHE_LINE,
                                          (void **)&src->stage[t]);
        if (st != ZS_OK) {
            return zs_errf(err, errlen, st,
                           "checkpoint load: no memory to stage %zu bytes of shard state (%u "
                           "tensors of the shard, until every rank has read its part)",
                           bytes, src->moments ? ZS_CKPT_N_TENSORS : 1u);
        }
    }
    return ZS_OK;
}

/* Manifest, layout and the files this rank needs, all checked. */
static zs_status_t zd_ckpt_open(const zd_ckpt_shard_t *sh, zd_ckpt_src_t *src, char *err,
                                size_t errlen)
{
    zs_status_t st = zd_ckpt_match(sh, src->m, src->path, err, errlen);

    if (st == ZS_OK) {
        st = zs_ckpt_layout(src->m, &src->old, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_ckpt_reader_open(src->ckpt, src->m, &src->rd, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_check_files(src, sh, err, errlen);
    }
    return st == ZS_OK ? zd_ckpt_stage(sh, src, err, errlen) : st;
}

/* The loaded scalars and where they came from. */
static void zd_ckpt_loaded_fill(zd_ckpt_loaded_t *l, const zs_ckpt_manifest_t *m, const char *path,
                                const char *tag)
{
    l->step = l->moments ? m->step : 0;
    l->skipped_steps = l->moments ? m->skipped_steps : 0;
    l->scaler = m->scaler;
    zs_ckpt_pathf(l->out.path, sizeof(l->out.path), "%s", path);
    zs_ckpt_pathf(l->out.tag, sizeof(l->out.tag), "%s", tag);
    l->out.saved_world = m->world;
    l->out.has_trainer_state = zs_ckpt_find_file(m, ZS_CKPT_TRAINER_STATE) != NULL;
}

zs_status_t zd_ckpt_load(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                         zd_ckpt_loaded_t *loaded, char *err, size_t errlen)
{
    char tag[ZS_CKPT_TAG_MAX];
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t dir = ZS_DIR_INIT, ckpt = ZS_DIR_INIT;
    zd_ckpt_src_t src;
    uint64_t t0 = zs_time_now_ns();
    zs_status_t st;

    memset(&src, 0, sizeof(src));
    memset(loaded, 0, sizeof(*loaded));
    loaded->moments = req->load_optimizer_states;
    zd_ckpt_settle(ck); /* a save still writing finishes first */
    st = zd_ckpt_open_dir(req, ZS_MAY_READ | ZS_MAY_EXEC, &dir, err, errlen);
    if (st == ZS_OK) {
        st = zs_ckpt_open(&dir, req->tag, &ckpt, tag, sizeof(tag), err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(&ckpt, &m, err, errlen);
    }
    if (st == ZS_OK) {
        src = (zd_ckpt_src_t){.m = m,
                              .path = ckpt.shown,
                              .ckpt = &ckpt,
                              .cancel = &req->cancel,
                              .moments = req->load_optimizer_states,
                              .stage = loaded->stage};
        st = zd_ckpt_open(sh, &src, err, errlen);
    }
    st = zd_ckpt_agree(sh, st, "checkpoint load (checking the files)", err, errlen);
    if (st == ZS_OK) {
        zd_test_pause("ckptread", sh->job_id, sh->step); /* verified, not read yet */
        st = zd_ckpt_pieces(&src, sh, zd_ckpt_read_piece, NULL, err, errlen);
        st = zd_ckpt_agree(sh, st, "checkpoint load (reading)", err, errlen);
    }
    if (st == ZS_OK) {
        zd_ckpt_loaded_fill(loaded, m, ckpt.shown, tag);
        zs_info(ZS_SUB_ENGINE, "checkpoint %s (world %u) read in %.3f s", ckpt.shown, m->world,
                (double)(zs_time_now_ns() - t0) * 1e-9);
    } else {
        zd_ckpt_loaded_free(loaded);
    }
    if (m != NULL) {
        zd_ckpt_src_free(&src);
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    zs_dir_close(&dir);
    return st;
}
