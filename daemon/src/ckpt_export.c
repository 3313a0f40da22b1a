/*
 * ExportRequest (docs/checkpoints.md, `zeroctl export` of a live job): the daemon writes its
 * job's parameters -- every rank's params region holds all of them -- into one safetensors
 * file with the names and shapes of the attach. It runs on the engine thread, between steps,
 * so the file holds one step's parameters. The file is created for the requesting user: the
 * path must be absolute and new, in a directory that user owns (or root asks), and the file
 * is handed to that user.
 */
#define _GNU_SOURCE
#include "job_int.h"
#include "zs/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* path is absolute and does not exist; its directory belongs to uid (root may use any). */
static zs_status_t zd_export_check_path(const char *path, uint32_t uid, char *err, size_t errlen)
{
    char dir[4096];
    struct stat sb;

    if (path == NULL || path[0] != '/' || strlen(path) > ZD_CKPT_DIR_MAX) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "export: path '%.200s' must be absolute and at most %u bytes",
                       path != NULL ? path : "", ZD_CKPT_DIR_MAX);
    }
    if (lstat(path, &sb) == 0 || errno != ENOENT) {
        return zs_errf(err, errlen, ZS_ERR_EXISTS,
                       "export: %s already exists (the daemon never replaces a file)", path);
    }
    zs_ckpt_pathf(dir, sizeof(dir), "%s", path);
    if (stat(dirname(dir), &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "export: directory %s: %s", dir,
                       strerror(errno ? errno : ENOTDIR));
    }
    if (uid == UINT32_MAX || (uid != 0 && sb.st_uid != uid)) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                       "export: directory %s belongs to uid %u, the request comes from uid %d: "
                       "the daemon writes only where the requesting user may",
                       dir, (unsigned)sb.st_uid, uid == UINT32_MAX ? -1 : (int)uid);
    }
    return ZS_OK;
}

/* Each parameter from the params region, cast to dtype, in registration order. */
static zs_status_t zd_export_data(const zd_job_t *job, const zk_exec_t *exec, zs_dtype_t dtype,
                                  zs_st_writer_t *w, char *err, size_t errlen)
{
    const zs_layout_t *l = job->layout;
    size_t dsize = zs_dtype_size(dtype), psize = zs_dtype_size(job->dtype);
    uint64_t cap = 0;
    bool on_device = zd_backend_device(job->be) >= 0;
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
        const char *src = (const char *)job->params.addr + p->offset * psize;
        const void *out;
        if (on_device) {
            st = zd_backend_copy(job->be, raw, src, (size_t)p->numel * psize);
            if (st != ZS_OK) {
                st = zs_errf(err, errlen, st, "export: %s", zd_backend_error(job->be));
                break;
            }
            src = raw;
        }
        out = src;
        if (dtype != job->dtype) {
            st = zk_cast(exec, buf, dtype, src, job->dtype, p->numel);
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

static zs_status_t zd_export_write(const zd_job_t *job, const zk_exec_t *exec, const char *tmp,
                                   zs_dtype_t dtype, uint64_t *bytes_p, char *err, size_t errlen)
{
    uint32_t n = job->layout->n_params;
    zs_st_meta_t *meta = calloc(n ? n : 1, sizeof(*meta));
    char step_s[32];
    const char *kv[] = {"format", "pt", "zerod_step", step_s, "zerod_job", job->id};
    zs_st_writer_t *w = NULL;
    zs_status_t st;

    if (meta == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "export: out of memory");
    }
    snprintf(step_s, sizeof(step_s), "%" PRIu64, job->step);
    for (uint32_t i = 0; i < n; i++) {
        meta[i] = (zs_st_meta_t){job->pmeta[i].name, dtype, job->pmeta[i].ndim, job->pmeta[i].dims};
    }
    st = zs_st_create(tmp, meta, n, kv, 3, &w, err, errlen);
    free(meta);
    if (st == ZS_OK) {
        st = zd_export_data(job, exec, dtype, w, err, errlen);
        if (st != ZS_OK) {
            zs_st_abort(w);
            return st;
        }
        st = zs_st_finish(w, bytes_p, NULL, err, errlen);
    }
    return st;
}

zs_status_t zd_job_export(zd_job_t *job, const zd_job_env_t *env, const char *path,
                          zs_dtype_t dtype, uint32_t uid, zd_ckpt_out_t *out, char *err,
                          size_t errlen)
{
    char tmp[4096];
    uint64_t bytes = 0;
    const char *dup;
    zs_status_t st;
    int fd;

    memset(out, 0, sizeof(*out));
    if (job == NULL || !job->params_loaded) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND,
                       job == NULL ? "export: no job on this daemon"
                                   : "export: the job has no parameters yet");
    }
    if (dtype != ZS_DTYPE_F32 && dtype != ZS_DTYPE_BF16) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "export: dtype %s: fp32 or bf16 only",
                       zs_dtype_name(dtype));
    }
    dup = zs_ckpt_duplicate_name(job->pmeta, job->layout->n_params);
    if (dup != NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "export: two parameters are named '%s'", dup);
    }
    st = zd_export_check_path(path, uid, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    zs_ckpt_pathf(tmp, sizeof(tmp), "%s.zerod-tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644); /* ours alone */
    if (fd < 0) {
        return zs_errf(err, errlen, ZS_ERR_IO, "export: cannot create %s: %s", tmp,
                       strerror(errno));
    }
    close(fd);
    st = zd_export_write(job, env->exec, tmp, dtype, &bytes, err, errlen);
    if (st == ZS_OK && uid != 0 && chown(tmp, (uid_t)uid, (gid_t)-1) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "export: chown of %s to uid %u: %s", tmp, uid,
                     strerror(errno));
    }
    if (st == ZS_OK && renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "export: renaming %s to %s: %s", tmp, path,
                     strerror(errno));
    }
    if (st != ZS_OK) {
        unlink(tmp);
        return st;
    }
    zs_ckpt_pathf(out->path, sizeof(out->path), "%s", path);
    out->step = job->step;
    out->saved_world = job->layout->n_params;
    out->bytes = bytes;
    zs_info(ZS_SUB_ENGINE, "exported %u parameters of job '%s' at step %" PRIu64 " to %s (%s)",
            job->layout->n_params, job->id, job->step, path, zs_dtype_name(dtype));
    return ZS_OK;
}
