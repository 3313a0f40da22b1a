/*
 * Listening unix sockets of the daemon (its IPC socket, server/server.c; a metrics socket,
 * server/metrics_http.c): replace only a stale socket, bind born 0660, remove at stop only the
 * socket this process bound.
 */
#ifndef ZD_UNIX_LISTEN_H
#define ZD_UNIX_LISTEN_H

#include "zs/status.h"

#include <sys/stat.h>
#include <sys/un.h>

/* The socket file a process bound (device and inode), to recognise it at stop. */
typedef struct zd_unix_id {
    dev_t dev;
    ino_t ino;
} zd_unix_id_t;

/* Only a stale socket (nothing listens on it) at sa is removed; anything else there (a file, a
 * directory, a socket something listens on) is refused and left alone. Messages (logged) name
 * the config key `key`. */
zs_status_t zd_unix_clear_stale(const struct sockaddr_un *sa, const char *key);

/* A socket bound at sa, born 0660, listening with `backlog`; -1 on error (logged). */
int zd_unix_bind(const struct sockaddr_un *sa, int backlog);

/* The bound socket's identity; ZS_ERR_IO (logged) when the path is gone. */
zs_status_t zd_unix_identify(const char *path, zd_unix_id_t *id);

/* Remove path while it is still the socket `id` (something may have replaced it since). */
void zd_unix_unlink_if_ours(const char *path, const zd_unix_id_t *id);

#endif
