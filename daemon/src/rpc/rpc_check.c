#include "rpc/rpc_check.h"
#include "zs/version.h"

#include "zs/error.h"

#include <stdio.h>

const char *zd_rpc_body_name(int body_case)
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

zs_status_t zd_rpc_decode(const uint8_t *payload, size_t len, zd_frame_t **frame_p, char *err,
                          size_t errlen)
{
    *frame_p = zerod__ipc__v1__frame__unpack(NULL, len, payload);
    if (*frame_p == NULL) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "frame of %zu bytes is not a valid zerod.ipc.v1.Frame", len);
    }
    return ZS_OK;
}

/* The first frame of a connection: the protocol it speaks and the role it takes. */
static zs_status_t zd_rpc_check_hello(zd_role_t role, const Zerod__Ipc__V1__Hello *h, char *err,
                                      size_t errlen)
{
    if (role != ZD_ROLE_NONE) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL, "hello: sent twice on one connection");
    }
    if (h->protocol != ZD_IPC_PROTOCOL) {
        return zs_errf(err, errlen, ZS_ERR_VERSION,
                       "hello.protocol: client speaks protocol %u (version %s), daemon speaks "
                       "protocol %d (version %s)",
                       h->protocol, h->version ? h->version : "?", ZD_IPC_PROTOCOL, ZS_VERSION);
    }
    if (h->role != ZEROD__IPC__V1__ROLE__ROLE_TRAINER &&
        h->role != ZEROD__IPC__V1__ROLE__ROLE_CONTROL) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "hello.role: %d is neither trainer (1) nor control (2)", (int)h->role);
    }
    return ZS_OK;
}

zs_status_t zd_rpc_check(zd_role_t role, const zd_frame_t *f, char *err, size_t errlen)
{
    const char *name = zd_rpc_body_name(f->body_case);
    bool trainer_msg = false, control_msg = false;

    switch (f->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY__NOT_SET:
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "unknown message: the frame has no body this daemon knows (protocol %d)",
                       ZD_IPC_PROTOCOL);
    case ZEROD__IPC__V1__FRAME__BODY_HELLO:
        return zd_rpc_check_hello(role, f->hello, err, errlen);
    case ZEROD__IPC__V1__FRAME__BODY_ATTACH:
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
    case ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY:
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD:
    case ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_WAIT:
        trainer_msg = true;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STATUS:
    case ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO:
    case ZEROD__IPC__V1__FRAME__BODY_EXPORT_REQUEST:
    case ZEROD__IPC__V1__FRAME__BODY_JOB_END:
    case ZEROD__IPC__V1__FRAME__BODY_JOB_LIST:
    case ZEROD__IPC__V1__FRAME__BODY_TRACE:
        control_msg = true;
        break;
    default:
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL, "%s: a reply type is not a request", name);
    }
    if (role == ZD_ROLE_NONE) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "%s before hello: the first frame must be hello", name);
    }
    if (trainer_msg && role != ZD_ROLE_TRAINER) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                       "%s: not allowed for role control (trainer role only)", name);
    }
    if (control_msg && role != ZD_ROLE_CONTROL) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                       "%s: not allowed for role trainer (control role only)", name);
    }
    return ZS_OK;
}
