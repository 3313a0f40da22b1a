/*
 * Raw zerod.ipc.v1 frames on the daemon's Unix socket, for the test clients that speak the
 * protocol without libzc (test_bad_input.c, disconnect_client.c, live_fuzz*.c): the 4-byte
 * little-endian length before each frame, packing, whole sends and the connection.
 */
#ifndef RF_RAW_FRAME_H
#define RF_RAW_FRAME_H

#include "zerod/ipc/v1/ipc.pb-c.h"

#include <stddef.h>
#include <stdint.h>

void rf_put_le32(uint8_t *p, uint32_t v);
uint32_t rf_get_le32(const uint8_t *p);

/* Initializes f as a Hello held in h: `protocol`, `version` (NULL: none) and `role`; seq 0. */
void rf_hello_init(Zerod__Ipc__V1__Frame *f, Zerod__Ipc__V1__Hello *h, uint32_t protocol,
                   const char *version, Zerod__Ipc__V1__Role role);

/* Bytes of f on the wire: the length header and the packed frame. */
size_t rf_frame_size(const Zerod__Ipc__V1__Frame *f);

/* Writes f's header and packed frame to out, which holds rf_frame_size(f) bytes; returns that
 * size. */
size_t rf_frame_pack(const Zerod__Ipc__V1__Frame *f, uint8_t *out);

/* send()s all n bytes (MSG_NOSIGNAL), retrying on EINTR: 0, or -1 with errno (0 when the peer
 * took nothing). */
int rf_send_all(int fd, const void *data, size_t n);

/* A socket connected to the AF_UNIX stream socket at path, SOCK_CLOEXEC and the `flags` of
 * socket(2) (SOCK_NONBLOCK or 0); -1 with errno (ENAMETOOLONG: path does not fit). */
int rf_connect(const char *path, int flags);

#endif
