/*
 * Every reply's framing, and the replies built in more than one place (rpc/rpc_int.h): the one
 * place that packs a frame with its length prefix, an ErrorReply, a SlotFree.
 */
#define _GNU_SOURCE
#include "rpc/rpc_reply.h"
#include "rpc/rpc_int.h"

#include "zs/frame.h"
#include "zs/log.h"

#include <stdlib.h>
#include <unistd.h>

void zd_reply_free(zd_reply_t *reply)
{
    if (reply == NULL) {
        return;
    }
    for (int i = 0; i < reply->n_fds; i++) {
        if (reply->fds[i] >= 0) {
            close(reply->fds[i]);
        }
    }
    free(reply->buf);
    free(reply);
}

/* The length prefix and the packed frame, in a new reply (NULL on allocation failure). */
zd_reply_t *zd_rpc_pack(const zd_frame_t *frame)
{
    size_t len = zerod__ipc__v1__frame__get_packed_size(frame);
    zd_reply_t *reply = calloc(1, sizeof(*reply));
    char err[128];

    if (reply == NULL) {
        return NULL;
    }
    reply->buf = malloc(len + ZS_FRAME_HEADER);
    if (reply->buf == NULL || zs_frame_header(len, reply->buf, err, sizeof(err)) != ZS_OK) {
        zs_error(ZS_SUB_IPC, "cannot send a %s reply of %zu bytes: %s",
                 zd_rpc_body_name(frame->body_case), len, reply->buf ? err : "out of memory");
        free(reply->buf);
        free(reply);
        return NULL;
    }
    zerod__ipc__v1__frame__pack(frame, reply->buf + ZS_FRAME_HEADER);
    reply->len = len + ZS_FRAME_HEADER;
    return reply;
}

Zerod__Ipc__V1__Result zd_rpc_result_of(zs_status_t status, const char *msg)
{
    Zerod__Ipc__V1__Result r = ZEROD__IPC__V1__RESULT__INIT;

    r.status = (Zerod__Common__V1__Status)status;
    r.message = (char *)(msg != NULL ? msg : "");
    return r;
}

zd_reply_t *zd_rpc_error(uint64_t seq, zs_status_t status, const char *msg)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ErrorReply er = ZEROD__IPC__V1__ERROR_REPLY__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(status, msg);

    er.result = &r;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ERROR;
    f.error = &er;
    return zd_rpc_pack(&f);
}

zd_reply_t *zd_rpc_still_working(uint32_t in_progress)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StillWorking sw = ZEROD__IPC__V1__STILL_WORKING__INIT;

    sw.in_progress = in_progress;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STILL_WORKING;
    f.still_working = &sw;
    return zd_rpc_pack(&f);
}

zd_reply_t *zd_rpc_slot_free(uint64_t seq, uint32_t slot, uint32_t bucket, zs_status_t status,
                             const char *msg)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__SlotFree sf = ZEROD__IPC__V1__SLOT_FREE__INIT;
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(status, msg);

    sf.result = &r;
    sf.slot = slot;
    sf.bucket = bucket;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE;
    f.slot_free = &sf;
    return zd_rpc_pack(&f);
}
