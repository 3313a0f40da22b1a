/*
 * A reply's bytes (rpc/rpc_reply.c): what a connection sends, with the descriptors that go with
 * its first bytes; the ErrorReply of a fault below the protocol, and the reply of a runner's
 * result (rpc/rpc_result.c). Free of protobuf, for the loop's files.
 */
#ifndef ZD_RPC_REPLY_H
#define ZD_RPC_REPLY_H

#include "rpc/rpc_types.h"
#include "runner/runner.h"
#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes for one connection: the length prefix and a packed Frame, and file descriptors to
 * pass with the first bytes (SCM_RIGHTS). */
struct zd_reply {
    uint8_t *buf;
    size_t len;
    int fds[3];
    int n_fds;
};

/* Frees the bytes and closes the fds not yet sent. NULL is a no-op. */
void zd_reply_free(zd_reply_t *reply);

/* An ErrorReply for a fault below the protocol (framing, a timeout, a refused peer). */
zd_reply_t *zd_rpc_error(uint64_t seq, zs_status_t status, const char *msg);

/* A StillWorking for a connection whose requests (in_progress of them) are not answered yet. */
zd_reply_t *zd_rpc_still_working(uint32_t in_progress);

/* The reply of a runner result (rpc/rpc_result.c) for this session's connection; the session's
 * slots follow it. Takes the result (frees it). NULL when no reply could be built (out of
 * memory). */
zd_reply_t *zd_rpc_result(zd_rpc_session_t *session, zd_resp_t *resp);

#endif
