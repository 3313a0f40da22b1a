/*
 * ExportRequest (docs/checkpoints.md, `zeroctl export` of a live job): the daemon writes its
 * job's parameters -- every rank's params region holds all of them -- into one safetensors
 * file with the names and shapes of the attach. It runs on the runner thread, between steps,
 * so the file holds one step's parameters. The file is created for the requesting user, with
 * its rights (zs/dir.h): in the directory it opened and passed, under a new name, handed to it
 * from the descriptor the daemon created (never a path looked up again).
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Each parameter from the params region, cast to dtype, in registration order. */
static zs_status_t zd_export_data(const zd_ckpt_shard_t *sh, const zk_exec_t *exec,
                                  zs_dtype_t dtype, zs_st_writer_t *w, char *err, size_t errlen)
{
    const zs_layout_t *l = sh->layout;
    size_t dsize = zs_dtype_size(dtype), psize = zs_dtype_size(sh->dtype);
    uint64_t cap = 0;
    bool on_device = zd_backend_device(sh->be) >= 0;
    void *buf, *raw = NULL;
    zs_status_t st = ZS_OK;

    for (uint32_t i = 0; i < l->n_params; i++) {
        cap = l->params[i].numel > cap ? l->params[i].numel : cap;
    }
    buf = malloc((size_t)(cap ? cap : 1) * dsize);
    if (buf != NULL && on_device) { /* the device's values come to the host first */
        raw = malloc((size_t)(cap ? cap : 1) * psize);
    }
    if (buf == NULL || (on_device && raw == NULL)) {
        free(buf);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "export: out of memory");
    }
    for (uint32_t id = 0; id < l->n_params && st == ZS_OK; id++) {
        const zs_layout_param_t *p = zs_layout_param_by_id(l, id);
        const char *src = (const char *)sh->params->addr + p->offset * psize;
        const void *out;
        if (on_device) {
            st = zd_backend_copy(sh->be, raw, src, (size_t)p->numel * psize);
            if (st != ZS_OK) {
                st = zs_errf(err, errlen, st, "export: %s", zd_backend_error(sh->be));
                break;
            }
            src = raw;
        }
        out = src;
        if (dtype != sh->dtype) {
            st = zk_cast(exec, buf, dtype, src, sh->dtype, p->numel);
            if (st != ZS_OK) {
                st = zs_errf(err, errlen, st, "export: cast: %s", zk_last_error());
                break;
            }
            out = buf;
        }
        st = zs_st_put(w, out, (size_t)p->numel * dsize, err, errlen);
    }
    free(buf);
    free(raw);
    return st;
}

static zs_status_t zd_export_write(const zd_ckpt_shard_t *sh, const zk_exec_t *exec,
                                   const zs_dir_t *dir, const char *tmp, zs_dtype_t dtype,
                                   uint64_t *bytes_p, char *err, size_t errlen)
{
    uint32_t n = sh->layout->n_params;
    zs_st_meta_t *meta = calloc(n ? n : 1, sizeof(*meta));
    char step_s[32];
    const char *kv[] = {"format", "pt", "zerod_step", step_s, "zerod_job", sh->job_id};
    zs_st_writer_t *w = NULL;
    zs_status_t st;

    if (meta == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "export: out of memory");
    }
    snprintf(step_s, sizeof(step_s), "%" PRIu64, sh->step);
    for (uint32_t i = 0; i < n; i++) {
        meta[i] = (zs_st_meta_t){sh->pmeta[i].name, dtype, sh->pmeta[i].ndim, sh->pmeta[i].dims};
    }
    st = zs_st_create(dir, tmp, meta, n, kv, 3, &w, err, errlen);
    free(meta);
    if (st == ZS_OK) {
        st = zd_export_data(sh, exec, dtype, w, err, errlen);
        if (st != ZS_OK) {
            zs_st_abort(w);
            return st;
        }
        st = zs_st_finish(w, bytes_p, NULL, err, errlen);
    }
    return st;
}

/* The request's directory, for its requester, and the name to create in it. */
static zs_status_t zd_export_dir(const zd_export_req_t *req, zs_dir_t *dir, const char **name_p,
                                 char *err, size_t errlen)
{
    char shown[4096];
    const char *slash = req->path != NULL ? strrchr(req->path, '/') : NULL;
    int fd;

    if (req->path == NULL || req->path[0] != '/' || strlen(req->path) > ZD_CKPT_DIR_MAX ||
        slash[1] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "export: path '%.200s' must be absolute, name a file and be at most %u "
                       "bytes",
                       req->path != NULL ? req->path : "", ZD_CKPT_DIR_MAX);
    }
    zs_ckpt_pathf(shown, sizeof(shown), "%.*s", (int)(slash - req->path), req->path);
    fd = req->dir_fd >= 0 ? fcntl(req->dir_fd, F_DUPFD_CLOEXEC, 0) : -1;
    *name_p = slash + 1;
    return zs_dir_adopt(dir, fd, shown[0] != '\0' ? shown : "/", req->cred,
                        ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
}

zs_status_t zd_ckpt_export(const zd_ckpt_shard_t *sh, const zk_exec_t *exec,
                           const zd_export_req_t *req, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    char tmp[300];
    const char *name = NULL;
    uint64_t bytes = 0;
    const char *dup;
    zs_dir_t dir = ZS_DIR_INIT;
    zs_status_t st;

    memset(out, 0, sizeof(*out));
    if (!sh->params_loaded) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "export: the job has no parameters yet");
    }
    if (req->dtype != ZS_DTYPE_F32 && req->dtype != ZS_DTYPE_BF16) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "export: dtype %s: fp32 or bf16 only",
                       zs_dtype_name(req->dtype));
    }
    dup = zs_ckpt_duplicate_name(sh->pmeta, sh->layout->n_params);
    if (dup != NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "export: two parameters are named '%s'", dup);
    }
    st = zd_export_dir(req, &dir, &name, err, errlen);
    if (st == ZS_OK && zs_dir_has(&dir, name, NULL)) {
        st = zs_errf(err, errlen, ZS_ERR_EXISTS,
                     "export: %s already exists (the daemon never replaces a file)", req->path);
    }
    if (st == ZS_OK && !zs_ckpt_pathf(tmp, sizeof(tmp), "%s.zerod-tmp", name)) {
        st = zs_errf(err, errlen, ZS_ERR_INVALID, "export: the file name '%.200s' is too long",
                     name);
    }
    if (st == ZS_OK) { /* a temporary file of an export that died: the requester's, it goes */
        st = zs_dir_unlink(&dir, tmp, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_export_write(sh, exec, &dir, tmp, req->dtype, &bytes, err, errlen);
        if (st == ZS_OK) {
            st = zs_dir_rename(&dir, tmp, name, RENAME_NOREPLACE, err, errlen);
        }
        if (st != ZS_OK) {
            char why[ZS_MSG_MAX];
            (void)zs_dir_unlink(&dir, tmp, why, sizeof(why));
        }
    }
    zs_dir_close(&dir);
    if (st != ZS_OK) {
        return st;
    }
    zs_ckpt_pathf(out->path, sizeof(out->path), "%s", req->path);
    out->step = sh->step;
    out->saved_world = sh->layout->n_params;
    out->bytes = bytes;
    zs_info(ZS_SUB_ENGINE, "exported %u parameters of job '%s' at step %" PRIu64 " to %s (%s)",
            sh->layout->n_params, sh->job_id, sh->step, req->path, zs_dtype_name(req->dtype));
    return ZS_OK;
}
