#include "ipc_check.h"

#include <stdio.h>

#ifndef ZEROD_VERSION
#define ZEROD_VERSION "0.0.0"
#endif

const char *zd_ipc_body_name(int body_case)
{
    /* the oneof member's name from the generated descriptor: never out of step with the
     * .proto */
    const ProtobufCFieldDescriptor *fd;

    if (body_case == ZEROD__IPC__V1__FRAME__BODY__NOT_SET) {
        return "empty";
    }
    fd = protobuf_c_message_descriptor_get_field(&zerod__ipc__v1__frame__descriptor,
                                                 (unsigned)body_case);
    return fd != NULL ? fd->name : "unknown";
}

zs_status_t zd_ipc_decode(const uint8_t *buf, size_t len, zd_frame_t **frame_p, size_t *consumed_p,
                          size_t *need_p, char *err, size_t errlen)
{
    uint32_t n;
    zd_frame_t *frame;

    *frame_p = NULL;
    *consumed_p = 0;
    if (len < 4) {
        *need_p = 4;
        return ZS_OK;
    }
    n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
    if (n == 0) {
        snprintf(err, errlen, "frame length is 0 (a frame holds one zerod.ipc.v1.Frame)");
        return ZS_ERR_PROTOCOL;
    }
    if (n > ZD_MAX_FRAME) {
        snprintf(err, errlen, "frame length %u exceeds the limit of %u bytes (ZS_MAX_FRAME)", n,
                 ZD_MAX_FRAME);
        return ZS_ERR_FRAME_TOO_LARGE;
    }
    if (len - 4 < n) {
        *need_p = (size_t)n + 4;
        return ZS_OK;
    }
    frame = zerod__ipc__v1__frame__unpack(NULL, n, buf + 4);
    if (frame == NULL) {
        snprintf(err, errlen, "frame of %u bytes is not a valid zerod.ipc.v1.Frame", n);
        return ZS_ERR_PROTOCOL;
    }
    *frame_p = frame;
    *consumed_p = (size_t)n + 4;
    return ZS_OK;
}

zs_status_t zd_ipc_check(zd_role_t role, const zd_frame_t *f, char *err, size_t errlen)
{
    const char *name = zd_ipc_body_name(f->body_case);
    bool trainer_msg = false, control_msg = false;

    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY__NOT_SET:
        snprintf(err, errlen,
                 "unknown message: the frame has no body this daemon knows (protocol %d)",
                 ZD_IPC_PROTOCOL);
        return ZS_ERR_PROTOCOL;
    case ZEROD__IPC__V1__FRAME__BODY_HELLO:
        if (role != ZD_ROLE_NONE) {
            snprintf(err, errlen, "hello: sent twice on one connection");
            return ZS_ERR_PROTOCOL;
        }
        if (f->hello->protocol != ZD_IPC_PROTOCOL) {
            snprintf(err, errlen,
                     "hello.protocol: client speaks protocol %u (version %s), daemon speaks "
                     "protocol %d (version %s)",
                     f->hello->protocol, f->hello->version ? f->hello->version : "?",
                     ZD_IPC_PROTOCOL, ZEROD_VERSION);
            return ZS_ERR_VERSION;
        }
        if (f->hello->role != ZEROD__IPC__V1__ROLE__ROLE_TRAINER &&
            f->hello->role != ZEROD__IPC__V1__ROLE__ROLE_CONTROL) {
            snprintf(err, errlen, "hello.role: %d is neither trainer (1) nor control (2)",
                     (int)f->hello->role);
            return ZS_ERR_PROTOCOL;
        }
        return ZS_OK;
    case ZEROD__IPC__V1__FRAME__BODY_ATTACH:
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
    case ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY:
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
        trainer_msg = true;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STATUS:
    case ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO:
        control_msg = true;
        break;
    default:
        snprintf(err, errlen, "%s: a reply type is not a request", name);
        return ZS_ERR_PROTOCOL;
    }
    if (role == ZD_ROLE_NONE) {
        snprintf(err, errlen, "%s before hello: the first frame must be hello", name);
        return ZS_ERR_PROTOCOL;
    }
    if (trainer_msg && role != ZD_ROLE_TRAINER) {
        snprintf(err, errlen, "%s: not allowed for role control (trainer role only)", name);
        return ZS_ERR_PERMISSION;
    }
    if (control_msg && role != ZD_ROLE_CONTROL) {
        snprintf(err, errlen, "%s: not allowed for role trainer (control role only)", name);
        return ZS_ERR_PERMISSION;
    }
    return ZS_OK;
}
