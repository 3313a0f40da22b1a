#include "zs/frame.h"

#include "zs/error.h"

zs_status_t zs_frame_parse(const uint8_t *buf, size_t len, size_t *frame_len_p, size_t *need_p,
                           char *err, size_t errlen)
{
    uint32_t n;

    *frame_len_p = 0;
    if (len < ZS_FRAME_HEADER) {
        *need_p = ZS_FRAME_HEADER;
        return ZS_OK;
    }
    n = zs_frame_length(buf);
    if (n == 0) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "frame length is 0 (a frame holds one zerod.ipc.v1.Frame)");
    }
    if (n > ZS_FRAME_MAX) {
        return zs_errf(err, errlen, ZS_ERR_FRAME_TOO_LARGE,
                       "frame length %u exceeds the limit of %u bytes (ZS_MAX_FRAME)", n,
                       ZS_FRAME_MAX);
    }
    *need_p = (size_t)n + ZS_FRAME_HEADER;
    if (len >= *need_p) {
        *frame_len_p = *need_p;
    }
    return ZS_OK;
}

zs_status_t zs_frame_header(size_t payload, uint8_t hdr[ZS_FRAME_HEADER], char *err, size_t errlen)
{
    if (payload == 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "an empty frame cannot be sent");
    }
    if (payload > ZS_FRAME_MAX) {
        return zs_errf(err, errlen, ZS_ERR_FRAME_TOO_LARGE,
                       "a frame of %zu bytes is over the limit of %u bytes", payload, ZS_FRAME_MAX);
    }
    for (unsigned i = 0; i < ZS_FRAME_HEADER; i++) {
        hdr[i] = (uint8_t)(payload >> (8 * i));
    }
    return ZS_OK;
}
