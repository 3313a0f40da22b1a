/*
 * Frame decoding and message validation for the local IPC (design.md §4), kept free of libuv
 * so that unit tests and the libFuzzer target drive exactly the code the daemon runs.
 */
#ifndef ZD_IPC_CHECK_H
#define ZD_IPC_CHECK_H

#include "engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum zd_role {
    ZD_ROLE_NONE = 0, /* before Hello */
    ZD_ROLE_TRAINER = 1,
    ZD_ROLE_CONTROL = 2,
} zd_role_t;

/* Try to take one frame off the front of buf[0..len).
 *  ZS_OK with *frame_p set and *consumed_p bytes used: a frame (caller frees it);
 *  ZS_OK with *frame_p NULL: more bytes needed (*need_p: the whole frame's size, or 4);
 *  ZS_ERR_FRAME_TOO_LARGE / ZS_ERR_PROTOCOL with a message: close the connection. */
zs_status_t zd_ipc_decode(const uint8_t *buf, size_t len, zd_frame_t **frame_p, size_t *consumed_p,
                          size_t *need_p, char *err, size_t errlen);

/* Is this message allowed now, from this role? ZS_ERR_PROTOCOL / ZS_ERR_VERSION /
 * ZS_ERR_PERMISSION with a message naming the message or field. */
zs_status_t zd_ipc_check(zd_role_t role, const zd_frame_t *frame, char *err, size_t errlen);

/* "attach", "bucket_ready", ... */
const char *zd_ipc_body_name(int body_case);

#endif
