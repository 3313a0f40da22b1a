/* The daemon's own settings: one config table (zs/config.h) for zerod.conf, ZEROD_* and flags
 * (docs/daemon-config.md). */
#ifndef ZD_DAEMON_CONFIG_H
#define ZD_DAEMON_CONFIG_H

#include "zs/config.h"

#include <stdint.h>

/* Gradient slots a trainer can fill ahead of the daemon: the upper bound of bucket_slots and
 * the width of a connection's slot bitmask (rpc/rpc.c). */
#define ZD_MAX_SLOTS 64

/* replication: where each rank's shard also lives (docs/daemon-config.md); the values go on the
 * mesh's wire (MeshHello.replication) and never change. */
typedef enum zd_replication { ZD_REPLICATION_OFF = 0, ZD_REPLICATION_BUDDY = 1 } zd_replication_t;

/* "off", "buddy", or "?" for a value this version does not know. */
const char *zd_replication_name(uint32_t replication);

typedef struct zd_config {
    char *socket; /* "auto": /run/zerod/zerod-<device>.sock */
    char *device; /* cpu | cpu:N | cuda:N | auto */
    uint64_t job_linger_ns;
    uint64_t max_shard_bytes;
    int64_t bucket_slots;
    char *allowed_group;
    int64_t threads;
    uint64_t frame_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t mesh_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns;
    char *token_file;
    int direct_collectives;
    char *checkpoint_dir; /* "": no automatic checkpoints (docs/checkpoints.md) */
    int64_t checkpoint_every_steps;
    int64_t checkpoint_every_seconds;
    int64_t checkpoint_keep_last;
    int checkpoint_async;
    int checkpoint_staging_keep;
    char *metrics_listen; /* auto, off, HOST:PORT or a unix socket path (docs/metrics.md); main.c
                           * resolves auto to a path and off to "" */
    int64_t trace_buffer; /* spans of the step trace's ring; 0: off (docs/trace.md) */
    int replication;      /* zd_replication_t */
} zd_config_t;

extern const zs_config_table_t zd_config_table;

/* Rules between keys (one key's range is checked by its row). err names the keys. */
zs_status_t zd_config_check(const zd_config_t *cfg, char *err, size_t errlen);

/* The longest a pending trainer call waits before the daemon fails it because of a peer:
 * max(mesh_timeout, collective_timeout) + heartbeat_timeout (told to clients in HelloReply). */
uint64_t zd_config_peer_deadline_ns(const zd_config_t *cfg);
/* ZEROD_* variables that are not daemon keys but are read elsewhere (no warning). */
extern const char *const zd_config_env_ignore[];

#define ZD_DEFAULT_CONFIG_PATH "/etc/zerod/zerod.conf"

#endif
