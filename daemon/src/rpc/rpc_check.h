/*
 * What a request frame may be (docs/architecture.md): the payload decoded into a
 * zerod.ipc.v1.Frame, and the message allowed now, from this role. Free of libuv and of the runner,
 * so that unit tests and the libFuzzer target drive exactly the code the daemon runs. Part of rpc.
 */
#ifndef ZD_RPC_CHECK_H
#define ZD_RPC_CHECK_H

#include "zerod/ipc/v1/ipc.pb-c.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ipc.proto PROTOCOL_VERSION */
#define ZD_IPC_PROTOCOL 1

typedef Zerod__Ipc__V1__Frame zd_frame_t;

typedef enum zd_role {
    ZD_ROLE_NONE = 0, /* before Hello */
    ZD_ROLE_TRAINER = 1,
    ZD_ROLE_CONTROL = 2,
} zd_role_t;

/* A frame's payload (the bytes after the length prefix) as a Frame the caller frees with
 * zerod__ipc__v1__frame__free_unpacked; ZS_ERR_PROTOCOL naming the size when it is none. */
zs_status_t zd_rpc_decode(const uint8_t *payload, size_t len, zd_frame_t **frame_p, char *err,
                          size_t errlen);

/* Is this message allowed now, from this role? ZS_ERR_PROTOCOL / ZS_ERR_VERSION /
 * ZS_ERR_PERMISSION with a message naming the message or field. */
zs_status_t zd_rpc_check(zd_role_t role, const zd_frame_t *frame, char *err, size_t errlen);

/* "attach", "bucket_ready", ... */
const char *zd_rpc_body_name(int body_case);

#endif
