/*
 * What a mesh is formed with (mesh/mesh.h forms it): the job it belongs to, this rank, the
 * hashes every rank must agree on, the job token and the deadlines; and the job token read from
 * its file (mesh/mesh_boot_common.c).
 */
#ifndef ZD_MESH_PARAMS_H
#define ZD_MESH_PARAMS_H

#include "zs/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZD_MESH_PROTOCOL 2
#define ZD_TOKEN_MAX     4096

typedef struct zd_mesh zd_mesh_t;

typedef struct zd_mesh_params {
    const char *job_id;
    uint32_t rank, world;
    const char *coordinator; /* host:port of rank 0's listener */
    uint64_t layout_hash, config_hash;
    uint64_t step;
    bool params_loaded;
    uint32_t replication; /* zd_replication_t of the daemon config: every rank must agree; with
                             buddy, ranks may differ in step (job/replica.c settles it) */
    const uint8_t *token;
    size_t token_len;
    uint64_t mesh_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns; /* a peer silent this long is lost (the heartbeat,
                                      mesh/heartbeat.h) */
    const atomic_bool *cancel;     /* set when the daemon shuts down: formation and waits stop */
    void (*wake)(void *arg);       /* called from the heartbeat thread when a peer is lost */
    void *wake_arg;
} zd_mesh_params_t;

/* Read the job token: the file must be a regular file, owned by this user, mode 0600 or
 * stricter, 16..4096 bytes. */
zs_status_t zd_mesh_read_token(const char *path, uint8_t *buf, size_t *len_p, char *err,
                               size_t errlen);

#endif
