/*
 * The HTTP endpoint of metrics_listen (docs/metrics.md): /metrics, /healthz and /readyz, served
 * by libmicrohttpd's own thread from the metrics snapshot (obs/metrics.h) only -- it never calls
 * into the loop or the runner -- and the loop's heartbeat timer that /healthz reads. The loop
 * thread starts and stops it.
 */
#ifndef ZD_METRICS_HTTP_H
#define ZD_METRICS_HTTP_H

#include "obs/metrics.h"

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

typedef struct zd_metrics_http zd_metrics_http_t;

/* What HTTP clients can hold (docs/metrics.md "Limits"): connections in all and per IP address
 * (TCP only), seconds a connection may stay idle or unfinished, bytes of its request buffer. */
#define ZD_HTTP_MAX_CONNS   32u
#define ZD_HTTP_PER_IP      8u
#define ZD_HTTP_TIMEOUT_S   5u
#define ZD_HTTP_CONN_MEMORY (32u << 10)

/* Whether this zerod can serve HTTP at all (built with libmicrohttpd). */
bool zd_metrics_http_available(void);

/* Serve m on `listen` (a metrics_listen value, "auto" already resolved by main.c; NULL, "",
 * "off" or "none": nothing, *http_p = NULL), once the daemon socket listens (it is marked
 * listening). A unix socket is born 0660 and given group gid when has_gid (the daemon socket's
 * access); TCP is logged once as readable by every local user. Starts the loop's heartbeat on
 * `loop`. Errors are logged naming the key. */
zs_status_t zd_metrics_http_start(uv_loop_t *loop, zd_metrics_t *m, const char *listen,
                                  bool has_gid, gid_t gid, zd_metrics_http_t **http_p);
/* Stop serving (joins the HTTP thread; a request in progress only formats), remove the unix
 * socket if it is still ours, close the timer (the object is freed in its close callback, so
 * the loop must run on). NULL is a no-op. */
void zd_metrics_http_stop(zd_metrics_http_t *http);

#endif
