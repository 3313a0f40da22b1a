/*
 * Small UCX helpers shared by the mesh (bootstrap and data workers) and the heartbeat:
 * context + single-thread worker creation, fire-and-forget active messages carrying a packed
 * MeshMsg, and a bounded endpoint close.
 */
#ifndef ZD_UCX_UTIL_H
#define ZD_UCX_UTIL_H

#include "zerod/mesh/v1/mesh.pb-c.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#define ZD_AM_BOOT 1 /* bootstrap messages (Challenge, MeshHello, Welcome, Refuse) */
#define ZD_AM_CTRL 2 /* Control messages on the data endpoints (abort, barrier) */
#define ZD_AM_HEARTBEAT                                                                            \
    3 /* Control messages on the heartbeat endpoints (heartbeat, abort, leave) */

/* A context and a UCS_THREAD_MODE_SINGLE worker. tls: NULL for every transport, or a UCX_TLS
 * value ("tcp"). features: UCP_FEATURE_* bits. */
zs_status_t zd_ucx_init(const char *tls, uint64_t features, ucp_context_h *ctx_p,
                        ucp_worker_h *worker_p, char *err, size_t errlen);
/* Destroy what zd_ucx_init made (either may be NULL). */
void zd_ucx_cleanup(ucp_context_h ctx, ucp_worker_h worker);

/* Pack msg and send it as an active message `id`; the buffer is freed when the send
 * completes. UCS_OK or UCS_INPROGRESS on success. */
ucs_status_t zd_ucx_send_msg(ucp_ep_h ep, unsigned id, const Zerod__Mesh__V1__MeshMsg *msg,
                             bool reply);

/* A Control message (mesh.proto) from `origin` as active message `id`; NULL ep is a no-op. */
void zd_ucx_send_control(ucp_ep_h ep, unsigned id, Zerod__Mesh__V1__Control__Type type,
                         uint32_t origin, uint64_t seq, uint32_t lost_rank, const char *reason);

/* Close an endpoint, progressing the worker for at most 1 s. NULL is a no-op. */
void zd_ucx_ep_close(ucp_worker_h worker, ucp_ep_h ep, bool force);

#endif
