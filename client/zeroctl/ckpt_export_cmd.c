/*
 * zeroctl checkpoint export and zeroctl export --checkpoint (docs/checkpoints.md): one
 * safetensors file from a checkpoint's rank files, written beside OUT and renamed over it once
 * whole. ckpt_cmd.c opens the checkpoint and checks the arguments.
 */
#define _GNU_SOURCE
#include "ckpt_export_cmd.h"
#include "ckpt_module.h"

#include "cli.h"
#include "zerod/zc.h"
#include "zs/ckpt.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ckpt_fill {
    zs_ckpt_reader_t *rd;
    unsigned tensor;
    float *buf;
} ckpt_fill_t;

static zs_status_t ckpt_fill_run(void *arg, uint32_t rank, uint64_t shard_off, uint64_t n,
                                 uint64_t dst_off, char *err, size_t errlen)
{
    ckpt_fill_t *f = arg;
    return zs_ckpt_reader_read(f->rd, f->tensor, rank, shard_off, f->buf + dst_off, n, err, errlen);
}

/* fp32 -> bf16, round to nearest even (NaN stays NaN). */
static uint16_t ckpt_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    if (isnan(x)) {
        return (uint16_t)((u >> 16) | 0x40);
    }
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static int ckpt_export_data(const zs_ckpt_manifest_t *m, const zs_layout_t *layout,
                            zs_ckpt_reader_t *rd, zs_st_writer_t *w, unsigned tensor, bool bf16,
                            char *err, size_t errlen)
{
    uint64_t cap = 0;
    float *buf = NULL;
    uint16_t *half = NULL;
    zs_status_t st = ZS_OK;

    for (uint32_t i = 0; i < m->n_params; i++) {
        cap = m->params[i].numel > cap ? m->params[i].numel : cap;
    }
    buf = malloc((cap ? cap : 1) * sizeof(float));
    half = bf16 ? malloc((cap ? cap : 1) * sizeof(uint16_t)) : NULL;
    if (buf == NULL || (bf16 && half == NULL)) {
        free(buf);
        free(half);
        snprintf(err, errlen, "out of memory for a parameter of %" PRIu64 " elements", cap);
        return ZC_EXIT_BAD;
    }
    for (uint32_t i = 0; i < m->n_params && st == ZS_OK; i++) {
        ckpt_fill_t f = {rd, tensor, buf};
        uint64_t n = m->params[i].numel;
        st = zs_ckpt_runs(layout, i, 0, n, ckpt_fill_run, &f, err, errlen);
        for (uint64_t j = 0; st == ZS_OK && bf16 && j < n; j++) {
            half[j] = ckpt_bf16(buf[j]);
        }
        if (st == ZS_OK) {
            st = zs_st_put(w, bf16 ? (const void *)half : (const void *)buf, n * (bf16 ? 2 : 4),
                           err, errlen);
        }
    }
    free(buf);
    free(half);
    return st == ZS_OK ? ZC_EXIT_OK : ZC_EXIT_BAD;
}

/* OUT's directory (into outdir), and OUT.tmp in it (into tmp) until the file is whole; returns
 * OUT's name in its directory. */
static const char *ckpt_export_paths(const char *out, char *outdir, size_t outdir_len, char *tmp,
                                     size_t tmp_len)
{
    const char *slash = strrchr(out, '/');
    const char *name = slash == NULL ? out : slash + 1;

    zs_ckpt_pathf(outdir, outdir_len, "%.*s",
                  slash == NULL  ? 1
                  : slash == out ? 1
                                 : (int)(slash - out),
                  slash == NULL ? "." : out);
    zs_ckpt_pathf(tmp, tmp_len, "%s.tmp", name);
    return name;
}

/* ---- the module's other state_dict() entries (ckpt_module.c) ------------------------------ */

/* The extras' data after the parameters': a tied name as its parameter, the rest as fp32. */
static int ckpt_export_extras(const ckpt_module_t *mod, const zs_layout_t *layout,
                              zs_ckpt_reader_t *rd, zs_st_writer_t *w, unsigned tensor, bool bf16,
                              char *err, size_t errlen)
{
    zs_status_t st = ZS_OK;

    for (unsigned k = 0; k < mod->n && st == ZS_OK; k++) {
        const ckpt_extra_t *e = &mod->x[k];
        size_t n = (size_t)e->numel;
        float *buf = malloc((n ? n : 1) * sizeof(float));
        uint16_t *half = NULL;
        if (buf == NULL) {
            snprintf(err, errlen, "out of memory for '%s' (%zu elements)", e->name, n);
            return ZC_EXIT_BAD;
        }
        if (e->param >= 0) {
            ckpt_fill_t f = {rd, tensor, buf};
            st = zs_ckpt_runs(layout, (uint32_t)e->param, 0, n, ckpt_fill_run, &f, err, errlen);
            half = bf16 ? malloc((n ? n : 1) * sizeof(uint16_t)) : NULL;
            for (size_t j = 0; half != NULL && j < n; j++) {
                half[j] = ckpt_bf16(buf[j]);
            }
            st = st == ZS_OK && bf16 && half == NULL ? ZS_ERR_NO_MEMORY : st;
        } else {
            for (size_t j = 0; j < n; j++) {
                buf[j] = ckpt_extra_float(mod, e, j);
            }
        }
        if (st == ZS_OK) {
            st = zs_st_put(w, half != NULL ? (const void *)half : (const void *)buf,
                           n * (half != NULL ? 2 : 4), err, errlen);
        }
        free(buf);
        free(half);
    }
    return st == ZS_OK ? ZC_EXIT_OK : ZC_EXIT_BAD;
}

/* The safetensors header of every parameter, then of every extra: its name, dtype and shape;
 * NULL when out of memory. */
static zs_st_meta_t *ckpt_export_meta(const zs_ckpt_manifest_t *m, const ckpt_module_t *mod,
                                      bool bf16)
{
    zs_st_meta_t *meta = calloc(m->n_params + mod->n + 1, sizeof(*meta));

    for (uint32_t i = 0; meta != NULL && i < m->n_params; i++) {
        meta[i] = (zs_st_meta_t){m->params[i].name, bf16 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32,
                                 m->params[i].ndim, m->params[i].dims};
    }
    for (unsigned k = 0; meta != NULL && k < mod->n; k++) {
        const ckpt_extra_t *e = &mod->x[k];
        meta[m->n_params + k] = (zs_st_meta_t){
            e->name, bf16 && e->param >= 0 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32, e->ndim, e->dims};
    }
    return meta;
}

/* The export's tensors (the parameters, then the module's tied names and buffers) into a new
 * safetensors file `tmp` of od; kv its three metadata pairs. */
static zs_status_t ckpt_export_write(const zs_dir_t *od, const char *tmp,
                                     const zs_ckpt_manifest_t *m, const ckpt_module_t *mod,
                                     const zs_st_meta_t *meta, const char **kv,
                                     const zs_layout_t *layout, zs_ckpt_reader_t *rd,
                                     unsigned tensor, bool bf16, char *err, size_t errlen)
{
    zs_st_writer_t *w = NULL;
    zs_status_t st = zs_st_create(od, tmp, meta, m->n_params + mod->n, kv, 3, &w, err, errlen);
    int rc;

    if (st != ZS_OK) {
        return st;
    }
    rc = ckpt_export_data(m, layout, rd, w, tensor, bf16, err, errlen);
    if (rc == ZC_EXIT_OK) {
        rc = ckpt_export_extras(mod, layout, rd, w, tensor, bf16, err, errlen);
    }
    if (rc != ZC_EXIT_OK) {
        zs_st_abort(w);
        return ZS_ERR_IO;
    }
    return zs_st_finish(w, NULL, NULL, err, errlen);
}

int ckpt_export_run(const ckpt_export_t *x, const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                    unsigned tensor, bool bf16)
{
    char err[1024], tmp[4096], step_s[32], outdir[4096];
    const char *path = ckpt->shown;
    const char *name = ckpt_export_paths(x->out, outdir, sizeof(outdir), tmp, sizeof(tmp));
    zs_dir_t od = ZS_DIR_INIT;
    zs_layout_t *layout = NULL;
    zs_ckpt_reader_t *rd = NULL;
    zs_st_meta_t *meta = NULL;
    const char *kv[] = {"format", "pt",          "zerod_step",
                        step_s,   "zerod_state", zs_ckpt_tensor_names[tensor]};
    ckpt_module_t mod = {NULL};
    int rc = ZC_EXIT_BAD;
    zs_status_t st = ZS_OK;

    snprintf(step_s, sizeof(step_s), "%" PRIu64, m->step);
    /* the master weights are the model's: its tied names and buffers go with them */
    if (tensor == 0 && ckpt_module_open(ckpt, m, &mod, err, sizeof(err)) != 0) {
        st = ZS_ERR_IO;
    }
    meta = st == ZS_OK ? ckpt_export_meta(m, &mod, bf16) : NULL;
    st = st != ZS_OK    ? st
         : meta != NULL ? zs_ckpt_layout(m, &layout, err, sizeof(err))
                        : ZS_ERR_NO_MEMORY;
    if (st == ZS_OK) {
        st = zs_ckpt_reader_open(ckpt, m, &rd, err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_dir_open(&od, outdir, err, sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_dir_unlink(&od, tmp, err, sizeof(err)); /* an export that died */
    }
    if (st == ZS_OK) {
        st = ckpt_export_write(&od, tmp, m, &mod, meta, kv, layout, rd, tensor, bf16, err,
                               sizeof(err));
    }
    if (st == ZS_OK) {
        st = zs_dir_rename(&od, tmp, name, 0, err, sizeof(err));
    }
    if (st != ZS_OK) {
        char why[256];
        if (od.fd >= 0) {
            (void)zs_dir_unlink(&od, tmp, why, sizeof(why));
        }
        zctl_error(st, "export of %s: %s", path, err);
        rc = ZC_EXIT_BAD;
    } else {
        rc = ZC_EXIT_OK;
        printf("%s: %u tensors (%s %s) from %s at step %" PRIu64 "\n", x->out, m->n_params + mod.n,
               zs_ckpt_tensor_names[tensor], bf16 ? "bf16" : "fp32", path, m->step);
    }
    zs_ckpt_reader_close(rd);
    zs_layout_destroy(layout);
    zs_dir_close(&od);
    ckpt_module_close(&mod);
    free(meta);
    return rc;
}
