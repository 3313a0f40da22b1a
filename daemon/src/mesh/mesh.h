/*
 * The daemon mesh of one job (docs/architecture.md): UCX bootstrap through rank 0's ucp_listener,
 * HMAC authentication, roster exchange, data endpoints from worker addresses, aborts and
 * barriers as active messages; liveness (heartbeats, endpoint errors) is the heartbeat's
 * (mesh/heartbeat.h), which runs on a thread of its own. Used only from the runner thread (UCX
 * single-thread mode); the runner progresses the worker, both inside collectives and when idle (it
 * polls the worker's event fd next to its queue), so the libuv loop never touches UCX.
 */
#ifndef ZD_MESH_H
#define ZD_MESH_H

#include "mesh/mesh_params.h"
#include "zs/status.h"
#include "zs/time.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

/* Form the mesh; blocks (bounded by mesh_timeout) until every rank joined, or fails naming
 * what differs (ZS_ERR_AUTH, ZS_ERR_LAYOUT_MISMATCH, ZS_ERR_CONFIG, ZS_ERR_UNREACHABLE,
 * ZS_ERR_TIMEOUT, ZS_ERR_INVALID). */
zs_status_t zd_mesh_create(const zd_mesh_params_t *params, zd_mesh_t **mesh_p, char *err,
                           size_t errlen);
/* Closes endpoints and the worker; NULL is a no-op. */
void zd_mesh_destroy(zd_mesh_t *mesh);

uint32_t zd_mesh_rank(const zd_mesh_t *mesh);
uint32_t zd_mesh_world(const zd_mesh_t *mesh);
ucp_worker_h zd_mesh_worker(zd_mesh_t *mesh);
ucp_ep_h zd_mesh_ep(zd_mesh_t *mesh, uint32_t rank);
uint64_t zd_mesh_collective_timeout_ns(const zd_mesh_t *mesh);
/* Change it (the runner thread, between collectives): a checkpoint's agreement waits for the
 * slowest rank's disk; a lost peer is still noticed by its heartbeat. */
void zd_mesh_set_collective_timeout_ns(zd_mesh_t *mesh, uint64_t ns);

/* The worker's event fd, armed: poll it for POLLIN while idle. -1 when unavailable. */
int zd_mesh_arm(zd_mesh_t *mesh);
/* Progress the worker and take in what the heartbeat saw (a lost peer). Returns the nanoseconds
 * until something is due here: UINT64_MAX (heartbeats are the heartbeat thread's). */
uint64_t zd_mesh_tick(zd_mesh_t *mesh);

/* Aborted (a peer was lost, or some rank broadcast an abort)? Fills why with a message that
 * names the lost rank. */
bool zd_mesh_aborted(const zd_mesh_t *mesh, char *why, size_t len);
/* Abort the job on every daemon: broadcast (best effort) and mark locally. */
void zd_mesh_abort(zd_mesh_t *mesh, uint32_t lost_rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The job ends normally on this rank: tell the peers, so that closing the endpoints is not
 * taken for a lost rank. */
void zd_mesh_leave(zd_mesh_t *mesh);
/* An operator ends the job (zeroctl job end): tell every peer to end it too (best effort), with
 * why for their trainers. zd_mesh_leave follows. */
void zd_mesh_end(zd_mesh_t *mesh, const char *why);
/* Did a peer end the job (END)? Fills why with its reason. The mesh is aborted too, so that a
 * collective in progress stops at once. */
bool zd_mesh_ended(const zd_mesh_t *mesh, char *why, size_t len);

/* Was the wait cut short because the daemon is shutting down? */
bool zd_mesh_cancelled(const zd_mesh_t *mesh);

/* The mesh's heartbeat (mesh/heartbeat.h): checkpoint writers report through it. */
struct zd_heartbeat *zd_mesh_heartbeat(zd_mesh_t *mesh);

/* Barrier over control messages, bounded by the collective timeout. */
zs_status_t zd_mesh_barrier(zd_mesh_t *mesh, char *err, size_t errlen);

#endif
