/*
 * The daemon's config table (config/daemon_config.h; docs/daemon-config.md): every key of
 * zerod.conf with its default, doc and bounds, and the checks between keys at start-up.
 */
#include "config/daemon_config.h"
#include "obs/metrics.h"
#include "obs/trace.h"

#include <stddef.h>
#include <stdio.h>

#define ZD_MS  1e6
#define ZD_S   1e9
#define ZD_MIN (60 * ZD_S)
#define ZD_H   (60 * ZD_MIN)
#define ZD_D   (24 * ZD_H)

/* Bounds: zero and nonsensical values are refused at start-up (zerod -t) naming the key. */
static const zs_config_range_t zd_slots_range = {0, ZD_MAX_SLOTS};
static const zs_config_range_t zd_threads_range = {1, 256};
static const zs_config_range_t zd_linger_range = {0, 30 * ZD_D};
static const zs_config_range_t zd_shard_range = {1 << 20, 1125899906842624.0}; /* 1MiB..1PiB */
static const zs_config_range_t zd_frame_timeout_range = {100 * ZD_MS, ZD_H};
static const zs_config_range_t zd_collective_timeout_range = {100 * ZD_MS, ZD_D};
static const zs_config_range_t zd_mesh_timeout_range = {ZD_S, ZD_D};
static const zs_config_range_t zd_hb_interval_range = {10 * ZD_MS, ZD_MIN};
static const zs_config_range_t zd_hb_timeout_range = {100 * ZD_MS, ZD_H};
static const zs_config_range_t zd_every_range = {0, 1e12};
static const zs_config_range_t zd_keep_range = {0, 1e6};
static const zs_config_range_t zd_trace_range = {0, ZD_TRACE_MAX_SPANS};

static const char *const zd_replication_names[] = {"off", "buddy", NULL};

const char *zd_replication_name(uint32_t replication)
{
    return replication < ZS_ARRAY_SIZE(zd_replication_names) - 1 ? zd_replication_names[replication]
                                                                 : "?";
}

static const zs_config_row_t zd_config_rows[] = {
    {"socket", "auto", "Unix socket path; auto = /run/zerod/zerod-<device>.sock",
     offsetof(zd_config_t, socket), &zs_config_path, NULL, 0},
    {"device", "auto",
     "cpu, cpu:N, cuda:N or auto (auto: cuda:0 when zerod has the CUDA backend and the "
     "machine a GPU, else cpu:0)",
     offsetof(zd_config_t, device), &zs_config_string, NULL, 0},
    {"job_linger", "10min", "keep a job this long after its trainer is gone, for a re-attach",
     offsetof(zd_config_t, job_linger_ns), &zs_config_duration, &zd_linger_range, ZS_CONFIG_RELOAD},
    {"max_shard_bytes", "64GiB", "largest model state one job may allocate on this daemon",
     offsetof(zd_config_t, max_shard_bytes), &zs_config_size, &zd_shard_range, ZS_CONFIG_RELOAD},
    {"bucket_slots", "0",
     "gradient slots a trainer can fill ahead of the daemon; 0: per job, one more than the most "
     "buckets one parameter spans, 2 to 4",
     offsetof(zd_config_t, bucket_slots), &zs_config_int, &zd_slots_range, 0},
    {"allowed_group", "", "group whose members may connect besides root and the daemon's user",
     offsetof(zd_config_t, allowed_group), &zs_config_string, NULL, 0},
    {"threads", "1", "kernel worker threads for the shard update", offsetof(zd_config_t, threads),
     &zs_config_int, &zd_threads_range, 0},
    {"frame_timeout", "10s", "a started frame must arrive whole within this time",
     offsetof(zd_config_t, frame_timeout_ns), &zs_config_duration, &zd_frame_timeout_range,
     ZS_CONFIG_RELOAD},
    {"collective_timeout", "60s", "deadline of every collective between daemons",
     offsetof(zd_config_t, collective_timeout_ns), &zs_config_duration,
     &zd_collective_timeout_range, 0},
    {"mesh_timeout", "60s", "how long non-zero ranks retry reaching the coordinator",
     offsetof(zd_config_t, mesh_timeout_ns), &zs_config_duration, &zd_mesh_timeout_range, 0},
    {"heartbeat_interval", "1s",
     "period of the heartbeats every daemon of a job sends its peers, and of the keepalives a "
     "client gets while its request is in progress",
     offsetof(zd_config_t, heartbeat_interval_ns), &zs_config_duration, &zd_hb_interval_range, 0},
    {"heartbeat_timeout", "5s",
     "a peer silent this long is lost (a killed daemon is noticed at once, by its endpoint); "
     "a client whose daemon is silent this long fails its call",
     offsetof(zd_config_t, heartbeat_timeout_ns), &zs_config_duration, &zd_hb_timeout_range, 0},
    {"direct_collectives", "true",
     "co-located daemons reduce-scatter and all-gather by reading each other's shared regions in "
     "place, and share one params region when the trainers allow it; false: always the UCX "
     "ring, one params region per rank",
     offsetof(zd_config_t, direct_collectives), &zs_config_bool, NULL, 0},
    {"token_file", "", "file (mode 0600) holding the shared job token for mesh authentication",
     offsetof(zd_config_t, token_file), &zs_config_string, NULL, 0},
    {"checkpoint_dir", "",
     "absolute directory (shared by the job's hosts) for the daemons' own checkpoints; a job "
     "whose daemons restart resumes from its latest one there; empty: none",
     offsetof(zd_config_t, checkpoint_dir), &zs_config_string, NULL, 0},
    {"checkpoint_every_steps", "0", "save into checkpoint_dir every N optimizer steps (0: off)",
     offsetof(zd_config_t, checkpoint_every_steps), &zs_config_int, &zd_every_range, 0},
    {"checkpoint_every_seconds", "0",
     "save into checkpoint_dir after a step once N seconds passed since the last save (0: off)",
     offsetof(zd_config_t, checkpoint_every_seconds), &zs_config_int, &zd_every_range, 0},
    {"checkpoint_keep_last", "0",
     "after a save, keep the newest N checkpoints of that directory (0: keep all)",
     offsetof(zd_config_t, checkpoint_keep_last), &zs_config_int, &zd_keep_range, 0},
    {"checkpoint_async", "true",
     "a save replies once every rank holds a staging copy of its shard (3 x 4 bytes per shard "
     "element, freed when written) and writes it while training goes on; false, or no memory "
     "for the copy: the save writes before it replies",
     offsetof(zd_config_t, checkpoint_async), &zs_config_bool, NULL, 0},
    {"checkpoint_staging_keep", "false",
     "keep the staging copy's memory from one save to the next: the trainer's stall becomes a "
     "memcpy, at 12 bytes per shard element for the job's life",
     offsetof(zd_config_t, checkpoint_staging_keep), &zs_config_bool, NULL, 0},
    {"metrics_listen", "auto",
     "serve /metrics (Prometheus), /healthz and /readyz over HTTP; auto: on a unix socket beside "
     "the daemon socket (zerod-cpu0.metrics.sock), mode 0660 and the daemon socket's group, so "
     "only who may use the daemon may read it; an absolute unix socket path (the same access); "
     "HOST:PORT (127.0.0.1:9400): TCP, readable by every local user; off (docs/metrics.md)",
     offsetof(zd_config_t, metrics_listen), &zs_config_string, NULL, 0},
    {"trace_buffer", "8192",
     "spans the step trace keeps for zeroctl trace, recorded always (48 bytes each; a step takes "
     "3 per bucket and 4 more); 0: off (docs/trace.md)",
     offsetof(zd_config_t, trace_buffer), &zs_config_int, &zd_trace_range, 0},
    {"replication", "off",
     "buddy: each rank's shard (fp32 master, Adam's m and v) is also held and kept current every "
     "step by another daemon of the job (on another host when the job spans hosts), so a job "
     "whose daemon dies resumes at its current step without a checkpoint; every daemon of a "
     "job must agree; off: none (docs/design-notes.md \"Buddy replicas\")",
     offsetof(zd_config_t, replication), &zs_config_enum, zd_replication_names, 0},
};

const zs_config_table_t zd_config_table = {"zerod", zd_config_rows, ZS_ARRAY_SIZE(zd_config_rows)};

const char *const zd_config_env_ignore[] = {"LOG_LEVEL", "LOG_SUBSYS", "KERNELS",    "JOB",
                                            "LIBZC",     "CONFIG",     "TEST_PAUSE", "COORDINATOR",
                                            "ZEROCTL",   "LONG_TESTS", NULL};

zs_status_t zd_config_check(const zd_config_t *cfg, char *err, size_t errlen)
{
    zd_listen_t listen;

    if (zd_listen_parse(cfg->metrics_listen, &listen, err, errlen) != ZS_OK) {
        return ZS_ERR_CONFIG;
    }
    if (cfg->checkpoint_dir != NULL && cfg->checkpoint_dir[0] != '\0' &&
        cfg->checkpoint_dir[0] != '/') {
        snprintf(err, errlen, "config key 'checkpoint_dir' ('%s') must be an absolute path",
                 cfg->checkpoint_dir);
        return ZS_ERR_CONFIG;
    }
    if ((cfg->checkpoint_every_steps > 0 || cfg->checkpoint_every_seconds > 0) &&
        (cfg->checkpoint_dir == NULL || cfg->checkpoint_dir[0] == '\0')) {
        snprintf(err, errlen,
                 "config keys 'checkpoint_every_steps' (%lld) / 'checkpoint_every_seconds' (%lld) "
                 "need 'checkpoint_dir'",
                 (long long)cfg->checkpoint_every_steps, (long long)cfg->checkpoint_every_seconds);
        return ZS_ERR_CONFIG;
    }
    if (cfg->heartbeat_timeout_ns < 2 * cfg->heartbeat_interval_ns) {
        snprintf(err, errlen,
                 "config key 'heartbeat_timeout' (%.3g s) must be at least twice "
                 "'heartbeat_interval' (%.3g s): a peer would be lost after one late beat",
                 (double)cfg->heartbeat_timeout_ns * 1e-9,
                 (double)cfg->heartbeat_interval_ns * 1e-9);
        return ZS_ERR_CONFIG;
    }
    return ZS_OK;
}

uint64_t zd_config_peer_deadline_ns(const zd_config_t *cfg)
{
    uint64_t wait = cfg->mesh_timeout_ns > cfg->collective_timeout_ns ? cfg->mesh_timeout_ns
                                                                      : cfg->collective_timeout_ns;
    return wait + cfg->heartbeat_timeout_ns;
}
