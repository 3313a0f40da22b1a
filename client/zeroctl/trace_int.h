/*
 * `zeroctl trace`'s two files: trace_cmd.c asks the daemons and says what they answered,
 * trace_json.c writes their spans as one Trace Event JSON document. Nothing else includes it:
 * the rest of zeroctl goes through trace_cmd.h.
 */
#ifndef ZEROCTL_TRACE_INT_H
#define ZEROCTL_TRACE_INT_H

#include "cli.h"
#include "zerod/zc.h"

#include <stddef.h>
#include <stdint.h>

#define TRACE_MAX_DAEMONS ZCTL_MAX_DAEMONS

/* One daemon: its socket and what its trace said. */
typedef struct trace_daemon {
    char socket[ZCTL_SOCKET_MAX];
    int status; /* of the last call: ZC_OK, or the failure (msg) */
    char msg[512];
    char job_id[128];
    zc_trace_info_t info;
    zc_trace_span_t *spans; /* [info.n_spans] */
    int used;               /* its trace is of the job written */
} trace_daemon_t;

typedef struct trace_opts {
    int json;
    int timeout_ms;
    const char *dir;
    const char *sockets[TRACE_MAX_DAEMONS];
    int n_sockets;
    const char *out; /* "-": stdout */
    const char *job; /* NULL: the first found */
    uint32_t steps;
    double wait_s;
} trace_opts_t;

/* The first daemon used (the job's id and world); NULL when none. */
static inline const trace_daemon_t *trace_first(const trace_daemon_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (d[i].used) {
            return &d[i];
        }
    }
    return NULL;
}

/* The document of the spans of the daemons used (at least one), written to o->out; the number
 * of events, or -1 (reported with zctl_error). */
long zeroctl_trace_write(const trace_opts_t *o, const trace_daemon_t *d, int n);

#endif
