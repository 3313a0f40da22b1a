/*
 * zc_checkpoint_save / zc_checkpoint_load (zc.h, docs/checkpoints.md): one request each to the
 * daemon, which does the work with the job's other daemons, in the directory this process
 * opens and passes (the daemon acts there with this process's rights, not its own).
 */
#define _GNU_SOURCE
#include "zc_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZC_CHECKPOINT_TIMEOUT_MS (3600 * 1000)

int zc_abs_path(const char *what, const char *path, char *buf, size_t len)
{
    char cwd[PATH_MAX];
    int n;

    if (path == NULL || path[0] == '\0') {
        return zc_fail(ZC_ERR_INVALID, "%s: the path is empty", what);
    }
    if (path[0] == '/') {
        n = snprintf(buf, len, "%s", path);
    } else if (getcwd(cwd, sizeof(cwd)) == NULL) {
        return zc_fail(ZC_ERR_IO, "%s: cannot make '%s' absolute: getcwd failed", what, path);
    } else {
        n = snprintf(buf, len, "%s/%s", cwd, path);
    }
    if (n < 0 || (size_t)n >= len) {
        return zc_fail(ZC_ERR_INVALID, "%s: path '%.200s...' is longer than %zu bytes", what, path,
                       len - 1);
    }
    while (n > 1 && buf[n - 1] == '/') {
        buf[--n] = '\0';
    }
    return ZC_OK;
}

/* mkdir -p of an absolute path (mode 0777 less the umask, as DeepSpeed's os.makedirs). */
static int zc_mkdir_p(const char *what, const char *abs)
{
    char buf[4096];
    size_t n = strlen(abs);

    if (n >= sizeof(buf)) {
        return zc_fail(ZC_ERR_INVALID, "%s: path too long", what);
    }
    memcpy(buf, abs, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') {
            continue;
        }
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            return zc_fail(errno == EACCES ? ZC_ERR_PERMISSION : ZC_ERR_IO,
                           "%s: cannot create directory %s: %s", what, buf, strerror(errno));
        }
        buf[i] = abs[i];
    }
    return ZC_OK;
}

int zc_dir_open(const char *what, const char *path, bool create, char *abs, size_t len, int *fd_p)
{
    int status = zc_abs_path(what, path, abs, len);
    int fd;

    if (status == ZC_OK && create) {
        status = zc_mkdir_p(what, abs);
    }
    if (status != ZC_OK) {
        return status;
    }
    fd = open(abs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return zc_fail(errno == ENOENT   ? ZC_ERR_NOT_FOUND
                       : errno == EACCES ? ZC_ERR_PERMISSION
                                         : ZC_ERR_IO,
                       "%s: cannot open directory %s: %s", what, abs, strerror(errno));
    }
    *fd_p = fd;
    return ZC_OK;
}

static int zc_checkpoint_timeout(const zc_checkpoint_params_t *p)
{
    return p->timeout_ms > 0 ? p->timeout_ms : ZC_CHECKPOINT_TIMEOUT_MS;
}

static void zc_checkpoint_info(zc_checkpoint_info_t *info, const char *path, const char *tag,
                               uint64_t step)
{
    memset(info, 0, sizeof(*info));
    snprintf(info->path, sizeof(info->path), "%s", path != NULL ? path : "");
    snprintf(info->tag, sizeof(info->tag), "%s", tag != NULL ? tag : "");
    info->step = step;
}

ZC_API int zc_checkpoint_save(zc_session_t *session, const zc_checkpoint_params_t *params,
                              zc_checkpoint_info_t *info_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__CheckpointSave cs = ZEROD__IPC__V1__CHECKPOINT_SAVE__INIT;
    const Zerod__Ipc__V1__CheckpointSaveReply *sr;
    zc_frame_t *reply = NULL;
    char dir[3800];
    int status, fd = -1;

    zc_error_clear();
    if (params == NULL) {
        return zc_fail(ZC_ERR_INVALID, "checkpoint_save: params is NULL");
    }
    if (params->trainer_state_len > ZC_CHECKPOINT_STATE_MAX ||
        (params->trainer_state_len > 0 && params->trainer_state == NULL)) {
        return zc_fail(ZC_ERR_INVALID,
                       "checkpoint_save: trainer_state of %zu bytes (at most %u, and not NULL)",
                       params->trainer_state_len, ZC_CHECKPOINT_STATE_MAX);
    }
    status = zc_session_prepare_call(session, zc_checkpoint_timeout(params), "checkpoint_save");
    if (status == ZC_OK) { /* made here, with this process's rights, as DeepSpeed does */
        status = zc_dir_open("checkpoint_save", params->dir, true, dir, sizeof(dir), &fd);
    }
    if (status != ZC_OK) {
        return status;
    }
    cs.dir = dir;
    cs.tag = (char *)(params->tag != NULL ? params->tag : "");
    cs.trainer_state.data = (uint8_t *)params->trainer_state;
    cs.trainer_state.len = params->trainer_state_len;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE;
    req.checkpoint_save = &cs;
    status =
        zc_session_request_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE_REPLY,
                              zc_checkpoint_timeout(params), &reply);
    close(fd);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_save");
    }
    sr = reply->checkpoint_save_reply;
    status = zc_result_status(sr->result, "checkpoint_save");
    if (status == ZC_OK && info_p != NULL) {
        zc_checkpoint_info(info_p, sr->path, sr->tag, sr->step);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

ZC_API int zc_checkpoint_load(zc_session_t *session, const zc_checkpoint_params_t *params,
                              zc_checkpoint_info_t *info_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__CheckpointLoad cl = ZEROD__IPC__V1__CHECKPOINT_LOAD__INIT;
    const Zerod__Ipc__V1__CheckpointLoadReply *lr;
    zc_frame_t *reply = NULL;
    char dir[3800];
    int status, fd = -1;

    zc_error_clear();
    if (params == NULL) {
        return zc_fail(ZC_ERR_INVALID, "checkpoint_load: params is NULL");
    }
    status = zc_session_prepare_call(session, zc_checkpoint_timeout(params), "checkpoint_load");
    if (status == ZC_OK) {
        status = zc_dir_open("checkpoint_load", params->dir, false, dir, sizeof(dir), &fd);
    }
    if (status != ZC_OK) {
        return status;
    }
    cl.dir = dir;
    cl.tag = (char *)(params->tag != NULL ? params->tag : "");
    cl.load_optimizer_states = params->load_optimizer_states != 0;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD;
    req.checkpoint_load = &cl;
    status =
        zc_session_request_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD_REPLY,
                              zc_checkpoint_timeout(params), &reply);
    close(fd);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_load");
    }
    lr = reply->checkpoint_load_reply;
    status = zc_result_status(lr->result, "checkpoint_load");
    if (status == ZC_OK && info_p != NULL) {
        zc_checkpoint_info(info_p, lr->path, lr->tag, lr->step);
        info_p->loss_scale = lr->loss_scale;
        info_p->saved_world = lr->saved_world;
        info_p->has_trainer_state = lr->has_trainer_state;
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

ZC_API int zc_checkpoint_wait(zc_session_t *session, int timeout_ms, zc_checkpoint_info_t *info_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__CheckpointWait cw = ZEROD__IPC__V1__CHECKPOINT_WAIT__INIT;
    const Zerod__Ipc__V1__CheckpointSaveReply *sr;
    zc_frame_t *reply = NULL;
    int tmo = timeout_ms > 0 ? timeout_ms : ZC_CHECKPOINT_TIMEOUT_MS;
    int status;

    zc_error_clear();
    status = zc_session_prepare_call(session, tmo, "checkpoint_wait");
    if (status != ZC_OK) {
        return status;
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_WAIT;
    req.checkpoint_wait = &cw;
    status = zc_session_request(session, &req, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE_REPLY,
                                tmo, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_wait");
    }
    sr = reply->checkpoint_save_reply;
    status = zc_result_status(sr->result, "checkpoint_wait");
    if (status == ZC_OK && info_p != NULL) {
        zc_checkpoint_info(info_p, sr->path, sr->tag, sr->step);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}
