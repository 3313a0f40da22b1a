/*
 * The daemon and its service manager (sd_notify(3), daemon(7)): READY, STATUS on every job
 * change, WATCHDOG while the loop and the runner make progress, STOPPING, and
 * EXTEND_TIMEOUT_USEC while a stop's teardown lasts. Loop thread only. Without libsystemd in the
 * build, or without $NOTIFY_SOCKET, zd_sdnotify_start returns NULL and every call is a no-op.
 */
#ifndef ZD_SDNOTIFY_H
#define ZD_SDNOTIFY_H

#include "runner/runner.h"

#include <stdint.h>
#include <uv.h>

typedef struct zd_sdnotify zd_sdnotify_t;

/* STATUS= names a step change at most this often (job, state and stop changes go out at once). */
#define ZD_SDNOTIFY_STEP_NS (5ull * 1000000000ull)
/* While the stop lasts and the runner makes progress, EXTEND_TIMEOUT_USEC= this, every second;
 * a job holding at least ZD_SDNOTIFY_LARGE_JOB bytes sends the first one at once. */
#define ZD_SDNOTIFY_EXTEND_NS (10ull * 1000000000ull)
#define ZD_SDNOTIFY_LARGE_JOB (1ull << 30)

/* $WATCHDOG_USEC in nanoseconds when the service manager wants watchdog pings, else 0. */
uint64_t zd_sdnotify_watchdog_ns(void);

/* READY=1 and the first STATUS=; then the timers run. peer_deadline_ns: the longest a request
 * may legitimately wait for a peer (zd_config_peer_deadline_ns). NULL: no service manager. */
zd_sdnotify_t *zd_sdnotify_start(uv_loop_t *loop, zd_runner_t *runner, const char *socket_path,
                                 uint64_t peer_deadline_ns);
/* The runner delivered results: STATUS= if the job changed. */
void zd_sdnotify_update(zd_sdnotify_t *n);
/* STOPPING=1; then EXTEND_TIMEOUT_USEC= while the stop lasts and the runner makes progress. */
void zd_sdnotify_stopping(zd_sdnotify_t *n);
/* Close the timers; n is freed in their close callbacks. NULL is a no-op. */
void zd_sdnotify_close(zd_sdnotify_t *n);

#endif
