/*
 * The mesh's state, shared by mesh/mesh.c (the data side: endpoints, control messages, barriers,
 * aborts) and the formation's files (mesh/mesh_boot*.c: the listener, challenge, hello, HMAC,
 * roster). Never included elsewhere.
 */
#ifndef ZD_MESH_INT_H
#define ZD_MESH_INT_H

#include "mesh/heartbeat.h"
#include "mesh/mesh_params.h"
#include "mesh/ucx_util.h"
#include "zerod/mesh/v1/mesh.pb-c.h"

typedef Zerod__Mesh__V1__MeshMsg zd_mesh_msg_t;

/* Every rank's worker addresses, by rank: the data worker and the heartbeat worker. While the
 * mesh forms the bytes belong to the bootstrap connections or the Welcome; zd_mesh_boot hands
 * back a roster that owns them (`bytes`). */
typedef struct zd_roster {
    uint8_t **data;
    size_t *data_len;
    uint8_t **heartbeat;
    size_t *heartbeat_len;
    uint8_t *bytes; /* every address above, when the roster owns them */
} zd_roster_t;

typedef struct zd_peer_ref {
    zd_mesh_t *mesh;
    uint32_t rank;
} zd_peer_ref_t;

struct zd_mesh {
    zd_mesh_params_t p;
    char job_id[128];
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *address;
    size_t address_len;
    ucp_ep_h *eps;
    zd_peer_ref_t *refs;
    uint64_t *barrier_seen;
    bool *left; /* ranks whose job ended normally (LEAVE) */
    uint64_t barrier_seq;
    zd_heartbeat_t
        *heartbeat; /* liveness: heartbeats and endpoint errors, on a thread of its own */
    int efd;
    bool aborted;
    char why[512];
    bool ended; /* a rank sent END (zeroctl job end): aborted too, without an error */
    bool closing;
};

/* Form the mesh (mesh/mesh_boot.c): every rank joins through rank 0's listener, authenticated,
 * and gets the roster, which it owns (zd_roster_free). Bounded by mesh_timeout. */
zs_status_t zd_mesh_boot(zd_mesh_t *mesh, zd_roster_t *roster, char *err, size_t errlen);
/* The roster's arrays (mesh/mesh_boot_common.c) and, when it owns them, its bytes. */
void zd_roster_free(zd_roster_t *r);

/* True once the daemon is shutting down (mesh_params_t.cancel): a formation or a collective
 * stops waiting. */
static inline bool zd_mesh_params_cancelled(const zd_mesh_params_t *p)
{
    return p->cancel != NULL && atomic_load(p->cancel);
}

#endif
