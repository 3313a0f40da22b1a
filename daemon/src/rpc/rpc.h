/*
 * rpc: the one place that knows ipc.proto (with rpc/rpc_check.c). It decodes a connection's frames,
 * answers what needs no runner (Hello, Status from the published status, a slot submitted
 * twice, a malformed or forbidden frame), turns the rest into runner requests (runner/runner.h),
 * and encodes the runner's results as replies. Loop thread only.
 *
 * A connection's session owns its slot bookkeeping: the slots the job gave it at attach, and
 * which of them are in flight (a BucketReady accepted, its SlotFree not yet sent). The types are
 * rpc/rpc_types.h's, a reply's bytes rpc/rpc_reply.h's.
 */
#ifndef ZD_RPC_H
#define ZD_RPC_H

#include "rpc/rpc_reply.h"
#include "rpc/rpc_types.h"
#include "runner/runner.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

zd_rpc_session_t *zd_rpc_session_create(uint64_t conn_id);
void zd_rpc_session_destroy(zd_rpc_session_t *session);
/* The connection's peer (SO_PEERCRED, SO_PEERGROUPS): the rights its requests are done with
 * (zs/dir.h). Without it, no request that names a directory is accepted. */
void zd_rpc_session_set_cred(zd_rpc_session_t *session, const zs_cred_t *cred);
/* The connection's peer pid (SO_PEERCRED): named when its trainer holds the job. */
void zd_rpc_session_set_pid(zd_rpc_session_t *session, int32_t pid);

/* Who a connection's peer has said it is, for the server's admission limits and keepalives. */
typedef struct zd_rpc_peer {
    bool hello;     /* its Hello was answered */
    bool control;   /* ... with the control role */
    bool holds_job; /* an attach of it succeeded and no detach followed */
    bool keepalive; /* its Hello asked for StillWorking frames */
} zd_rpc_peer_t;
void zd_rpc_session_peer(const zd_rpc_session_t *session, zd_rpc_peer_t *peer_p);

/* Close every descriptor still queued. */
void zd_fdq_close(zd_fdq_t *q);

/* One frame's payload (the bytes after the length prefix), with the descriptors that came
 * before or with it (fds: the frame takes those it declares, oldest first, and owns them from
 * then). Either it is answered here
 * (*reply_p: the reply to send; NULL when it went to the runner, *submitted_p, or when no reply
 * could be built) or handed to the runner. Returns ZS_OK, or the status of a refusal with the
 * reason in why: a malformed or forbidden frame (*close_p: close the connection once *reply_p is
 * out), or a request refused in its own reply (a slot submitted twice, an unusable Attach). */
zs_status_t zd_rpc_frame(const zd_rpc_t *rpc, zd_rpc_session_t *session, const uint8_t *payload,
                         size_t len, zd_fdq_t *fds, zd_reply_t **reply_p, bool *submitted_p,
                         bool *close_p, char *why, size_t whylen);

/* The connection closed: the runner hears of it when it held a trainer. */
void zd_rpc_closed(const zd_rpc_t *rpc, zd_rpc_session_t *session);

#endif
