/*
 * zc_checkpoint_save / _load / _wait (zc.h, docs/checkpoints.md): one request each to the
 * daemon, which does the work with the job's other daemons, in the directory this process
 * opens and passes (dir.c: the daemon acts there with this process's rights, not its own).
 */
#include "zc_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ZC_CHECKPOINT_TIMEOUT_MS (3600 * 1000)

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
        zc_session_call_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE_REPLY,
                           zc_checkpoint_timeout(params), NULL, &reply);
    close(fd);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_save");
    }
    sr = reply->checkpoint_save_reply;
    if (info_p != NULL) {
        zc_checkpoint_info(info_p, sr->path, sr->tag, sr->step);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return ZC_OK;
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
        zc_session_call_fd(session, &req, fd, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD_REPLY,
                           zc_checkpoint_timeout(params), NULL, &reply);
    close(fd);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_load");
    }
    lr = reply->checkpoint_load_reply;
    if (info_p != NULL) {
        zc_checkpoint_info(info_p, lr->path, lr->tag, lr->step);
        info_p->loss_scale = lr->loss_scale;
        info_p->saved_world = lr->saved_world;
        info_p->has_trainer_state = lr->has_trainer_state;
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return ZC_OK;
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
    status = zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE_REPLY, tmo,
                             NULL, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "checkpoint_wait");
    }
    sr = reply->checkpoint_save_reply;
    if (info_p != NULL) {
        zc_checkpoint_info(info_p, sr->path, sr->tag, sr->step);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return ZC_OK;
}
