/*
 * The heartbeat of one mesh (docs/architecture.md, docs/design-notes.md): a thread of its own
 * with a TCP-only UCX worker and an endpoint to every peer in peer-failure mode. It sends a
 * heartbeat every heartbeat_interval and declares a rank lost on whichever comes first: its
 * endpoint fails (a killed daemon's kernel resets the connection at once) or nothing arrived from
 * it for heartbeat_timeout (a hung host, a cut network). It does not depend on the runner thread,
 * which may be busy in a long Adam step, so a short heartbeat_timeout is safe.
 *
 * On a loss it broadcasts ABORT to the other ranks, records why (naming the rank) and calls
 * the notify callback (from its own thread), which wakes the runner. The runner polls
 * zd_heartbeat_lost() wherever it waits on the mesh.
 */
#ifndef ZD_HEARTBEAT_H
#define ZD_HEARTBEAT_H

#include "zs/status.h"
#include "zs/time.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zd_heartbeat zd_heartbeat_t;

typedef struct zd_heartbeat_params {
    const char *job_id;
    uint32_t rank, world;
    uint64_t interval_ns; /* heartbeat_interval */
    uint64_t timeout_ns;  /* heartbeat_timeout */
    void (*notify)(void *arg);
    void *notify_arg;
} zd_heartbeat_params_t;

/* The worker exists (its address can go into the roster); the thread starts later. */
zs_status_t zd_heartbeat_create(const zd_heartbeat_params_t *params, zd_heartbeat_t **hb_p,
                                char *err, size_t errlen);
/* Stops the thread, closes the endpoints and the worker. NULL is a no-op. */
void zd_heartbeat_destroy(zd_heartbeat_t *hb);

/* This rank's heartbeat worker address (owned by the heartbeat). */
void zd_heartbeat_address(const zd_heartbeat_t *hb, const uint8_t **addr_p, size_t *len_p);

/* Connect to every peer's heartbeat worker (addresses by rank; this rank's entry is ignored) and
 * start the thread. */
zs_status_t zd_heartbeat_start(zd_heartbeat_t *hb, uint8_t *const *addrs, const size_t *lens,
                               char *err, size_t errlen);

/* Has a rank been lost (or an ABORT arrived)? Fills why (naming the rank) and lost_rank_p
 * (either may be NULL). Thread-safe. */
bool zd_heartbeat_lost(zd_heartbeat_t *hb, uint32_t *lost_rank_p, char *why, size_t len);

/* The runner aborted the job: tell every peer (ABORT, best effort) and stop checking. */
void zd_heartbeat_abort(zd_heartbeat_t *hb, uint32_t lost_rank, const char *why);

/* The job ends normally on this rank: tell the peers (LEAVE) and wait briefly until it is out,
 * so that closing the endpoints is not taken for a lost rank. */
void zd_heartbeat_leave(zd_heartbeat_t *hb);

/* One rank's outcome of writing its file of a checkpoint save (docs/checkpoints.md
 * "Asynchronous saves"): sent at once to every rank over the heartbeat, not through a file on a
 * disk that may be the one that failed. */
#define ZD_HEARTBEAT_REPORT_WHY 512
typedef struct zd_ckpt_report {
    uint64_t seq;   /* which save of the job (0: none) */
    int32_t status; /* zs_status_t of the write */
    uint64_t bytes, xxh3;
    char why[ZD_HEARTBEAT_REPORT_WHY]; /* when status is not ZS_OK */
} zd_ckpt_report_t;

/* This rank's report: kept here and sent to every other rank (any thread). */
void zd_heartbeat_report(zd_heartbeat_t *hb, const zd_ckpt_report_t *report);
/* Wait until every rank reported save `seq` (reports[world] filled, statuses inside: ZS_OK), or,
 * with stop_on_error, until one rank reported a failure (ZS_ERR_ABORTED, its report in
 * reports[*failed_p]). ZS_ERR_PEER_LOST when a rank is lost; ZS_ERR_TIMEOUT at the deadline or
 * when cancel is set. */
zs_status_t zd_heartbeat_await_reports(zd_heartbeat_t *hb, uint64_t seq, bool stop_on_error,
                                       zs_deadline_t deadline, const atomic_bool *cancel,
                                       zd_ckpt_report_t *reports, uint32_t *failed_p, char *err,
                                       size_t errlen);

#endif
