/* The libuv side of zerod: the socket, connections, framing, signals (docs/architecture.md). */
#ifndef ZD_SERVER_H
#define ZD_SERVER_H

#include "config/daemon_config.h"
#include "zs/status.h"

typedef struct zd_server_params {
    const zd_config_t *config;
    const char *socket_path; /* resolved */
    const char *stores_file; /* <socket>.stores: the kernels' store plan kept for a restart */
    const char *device;      /* resolved, e.g. "cpu:0" */
    /* for SIGHUP reloads: the same sources as at start-up */
    const char *config_path;
    const zs_config_flag_t *flags;
    size_t n_flags;
} zd_server_params_t;

/* Run until SIGTERM/SIGINT. Returns 0 on a clean stop. */
int zd_server_run(const zd_server_params_t *params);

#endif
