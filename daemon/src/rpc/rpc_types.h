/*
 * rpc's plain types (rpc/rpc.h is its API): what the daemon tells its clients besides results,
 * a connection's session and a reply (both opaque here), and the descriptors a connection
 * received.
 */
#ifndef ZD_RPC_TYPES_H
#define ZD_RPC_TYPES_H

#include "runner/runner.h"

#include <stdint.h>

typedef struct zd_rpc_session zd_rpc_session_t;
/* A reply's bytes (rpc/rpc_reply.h). */
typedef struct zd_reply zd_reply_t;

/* Descriptors received on a connection (SCM_RIGHTS), oldest first, until a frame claims them
 * (Frame.fds, ipc.proto). */
#define ZD_FDQ_MAX 4u
typedef struct zd_fdq {
    int fd[ZD_FDQ_MAX];
    unsigned n;
} zd_fdq_t;

/* What the daemon tells its clients besides results. */
typedef struct zd_rpc {
    zd_runner_t *runner;
    const char *device;
    const char *socket_path;
    uint64_t peer_deadline_ms; /* HelloReply: how long the daemon takes to fail a call */
    /* HelloReply.keepalive_*: the server's StillWorking period (heartbeat_interval) and the
     * silence after which a client may give the daemon up (heartbeat_timeout) */
    uint64_t keepalive_interval_ms, keepalive_timeout_ms;
    zd_trace_t *trace; /* TraceRequest's ring (the runner's); NULL: tracing is off */
    /* Where requests go: NULL sends them to zd_runner_submit(runner); a unit test takes them
     * here instead (and frees each with zd_req_free). */
    void (*submit)(void *arg, zd_req_t *req);
    void *submit_arg;
} zd_rpc_t;

#endif
