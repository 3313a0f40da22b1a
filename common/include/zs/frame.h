/*
 * The frame of the daemon's socket (ipc.proto): a 4-byte little-endian length, then that many
 * bytes of one packed zerod.ipc.v1.Frame (1 .. ZS_FRAME_MAX). The one codec of the length
 * prefix and its limit, for the daemon, libzc and the tools; what the bytes mean is theirs.
 */
#ifndef ZS_FRAME_H
#define ZS_FRAME_H

#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_FRAME_HEADER 4u
#define ZS_FRAME_MAX    (16u << 20) /* payload bytes of one frame */

/* The payload length a header announces, unchecked (zs_frame_parse checks it): for messages
 * about a length that zs_frame_parse refused. */
static inline uint32_t zs_frame_length(const uint8_t hdr[ZS_FRAME_HEADER])
{
    return (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
           (uint32_t)hdr[3] << 24;
}

/* The frame at the start of buf (len bytes):
 *   ZS_OK, *frame_len_p > 0: buf holds the whole frame, ZS_FRAME_HEADER + payload bytes;
 *   ZS_OK, *frame_len_p == 0: more bytes are needed, *need_p of them in all (the whole frame
 *     once its header is in, else ZS_FRAME_HEADER);
 *   ZS_ERR_PROTOCOL (length 0) or ZS_ERR_FRAME_TOO_LARGE (over ZS_FRAME_MAX), err naming it. */
zs_status_t zs_frame_parse(const uint8_t *buf, size_t len, size_t *frame_len_p, size_t *need_p,
                           char *err, size_t errlen);

/* The header of a frame of `payload` bytes into hdr; ZS_ERR_FRAME_TOO_LARGE (or ZS_ERR_INVALID
 * for 0), err naming it. */
zs_status_t zs_frame_header(size_t payload, uint8_t hdr[ZS_FRAME_HEADER], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
