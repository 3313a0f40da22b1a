/*
 * Shared by the files of the mesh's bootstrap (mesh/mesh_boot_common.c, mesh/mesh_boot.c,
 * mesh/mesh_boot_rank0.c): the bootstrap's state and the steps both sides take. Never included
 * elsewhere.
 */
#ifndef ZD_MESH_BOOT_INT_H
#define ZD_MESH_BOOT_INT_H

#include "mesh/mesh_int.h"

#include <sys/socket.h>

#define ZD_NONCE_LEN    32
#define ZD_HMAC_LEN     32
#define ZD_BOOT_MSG_MAX (1u << 20)
/* how often a rank > 0 tries the coordinator again while rank 0 does not listen: the ranks
 * that kept a job re-form its mesh as soon as a lost daemon's trainer is back, and a connection
 * refused on the coordinator's port costs little */
#define ZD_BOOT_RETRY_US 20000
/* how long rank 0 keeps telling ranks that still connect why formation failed */
#define ZD_BOOT_LINGER_MS 2000

/* A bootstrap message received on some endpoint, queued by the AM callback. */
typedef struct zd_boot_msg {
    struct zd_boot_msg *next;
    ucp_ep_h reply_ep;
    uint8_t *data;
    size_t len;
    bool ready; /* false while a rendezvous receive is in flight */
} zd_boot_msg_t;

typedef struct zd_boot_conn {
    ucp_ep_h ep;
    bool failed;
    bool joined;
    bool told; /* rank 0: sent a Refuse after formation failed (mesh/mesh_boot_rank0.c) */
    uint32_t rank;
    char from[64]; /* the peer's address:port as rank 0 saw it connect, for messages */
    uint8_t nonce[ZD_NONCE_LEN];
    uint8_t *address;
    size_t address_len;
    uint8_t *heartbeat_address;
    size_t heartbeat_address_len;
} zd_boot_conn_t;

/* The TCP-only bootstrap side: lives only while the mesh forms. */
typedef struct zd_boot {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    ucp_conn_request_h *requests; /* pending connection requests */
    size_t n_requests, cap_requests;
    zd_boot_msg_t *head, *tail;
    zd_boot_conn_t *conns;
    size_t n_conns, cap_conns;
    bool client_failed; /* rank > 0: the coordinator endpoint failed */
    ucs_status_t client_status;
    /* rank 0: a hello refused for its token that claimed a rank of this job not yet joined;
     * formation fails with it unless that rank joins by auth_deadline (mesh/mesh_boot_rank0.c) */
    bool auth_pending;
    uint32_t auth_rank;
    zs_deadline_t auth_deadline;
    char auth_why[512];
} zd_boot_t;

/* mesh/mesh_boot_common.c: a roster for `world` ranks (ZS_ERR_NO_MEMORY when it cannot be had). */
zs_status_t zd_roster_alloc(zd_roster_t *r, uint32_t world);
/* Copy the bytes the roster points to into one block it owns. */
zs_status_t zd_roster_keep(zd_roster_t *r, uint32_t world);
/* The bootstrap worker (TCP only) with the handler that queues received messages. */
zs_status_t zd_boot_open(zd_boot_t *b, char *err, size_t errlen);
/* force: the formation failed, and an endpoint's peer may never answer a flush (a stranger on
 * the coordinator's port, a dead daemon): close without one. */
void zd_boot_cleanup(zd_boot_t *b, bool force);
/* HMAC-SHA256 under the job token of the nonce, the job id (its first 128 bytes) and the rank
 * (4 bytes, little-endian): what a MeshHello carries. */
void zd_hmac(const uint8_t *token, size_t token_len, const uint8_t *nonce, const char *job_id,
             uint32_t rank, uint8_t out[ZD_HMAC_LEN]);
/* The next message received and ready, or NULL; zd_boot_msg_free frees it. */
zd_boot_msg_t *zd_boot_pop(zd_boot_t *b);
void zd_boot_msg_free(zd_boot_msg_t *m);
/* One round of the bootstrap worker's progress (a short sleep when nothing moved). */
void zd_boot_progress(zd_boot_t *b);
/* The mesh message a bootstrap message holds (ZS_ERR_PROTOCOL when it holds none). */
zs_status_t zd_boot_unpack(const zd_boot_msg_t *m, zd_mesh_msg_t **msg_p);
/* host:port of the coordinator as a socket address. */
zs_status_t zd_parse_hostport(const char *coordinator, struct sockaddr_storage *ss,
                              socklen_t *len_p, char *err, size_t errlen);

/* mesh/mesh_boot_rank0.c: rank 0 listens, checks every rank's hello and sends the roster. */
zs_status_t zd_boot_server(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster, char *err,
                           size_t errlen);

#endif
