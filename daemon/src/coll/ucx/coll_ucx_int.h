/*
 * The `ucx` collectives' state, shared by coll/ucx/: coll_ucx.c (the ops table, the choice of
 * algorithm per call) over coll_ring.c (the ring, between hosts) and coll_direct.c (co-located
 * ranks reading each other's regions), all over ucx_p2p.c (requests, progress, exchanges, the
 * all-reduce). Never included elsewhere.
 *
 * Tags: collective sequence (24 bits) | source rank (16) | step (12) | segment (12).
 */
#ifndef ZD_COLL_UCX_INT_H
#define ZD_COLL_UCX_INT_H

#include "coll/coll.h"
#include "mesh/mesh.h"

#include <ucp/api/ucp.h>

/* progress rounds with nothing done before a check and a sleep */
#define ZD_COLL_IDLE_SPINS 1000u
/* the longest sleep of a waiting collective between checks */
#define ZD_COLL_SLEEP_MS 1
/* a control message of the direct algorithm */
#define ZD_COLL_MSG_MAX 1024u
/* segment numbers of the direct algorithm's messages (ring segments stay below 64) */
#define ZD_SEG_TOKEN 0xffcu /* the ring's "every peer entered" token (coll_ring.c) */
#define ZD_SEG_SHARE 0xffdu
#define ZD_SEG_READY 0xffeu
#define ZD_SEG_DONE  0xfffu

typedef struct zd_map {
    const char *addr;
    size_t size;
} zd_map_t;

typedef struct zd_coll_ucx {
    zd_coll_t base;
    zd_mesh_t *mesh;
    ucp_worker_h worker;
    zk_exec_t exec;
    uint64_t seq;
    float *part[2]; /* ring reduce-scatter partial sums, double-buffered by step parity */
    uint64_t part_elems;
    double *norm_part; /* direct reduce-scatter: the super-block sums of squares */
    size_t norm_parts; /* how many norm_part holds */
    void **reqs;       /* request slots */
    size_t n_reqs;
    /* direct algorithm */
    bool direct_allowed;                 /* config key direct_collectives */
    bool direct;                         /* agreed by every rank at the last share */
    zd_map_t local[ZD_COLL_MAX_REGIONS]; /* this rank's offered regions */
    unsigned n_local;
    zd_map_t *peer;               /* [world][ZD_COLL_MAX_REGIONS] read-only mappings */
    const char **peer_buf;        /* [world] this collective's buffer of each peer */
    uint8_t *in;                  /* [world][ZD_COLL_MSG_MAX] small-message landing */
    ucp_tag_recv_info_t *in_info; /* [world] */
    uint8_t out[ZD_COLL_MSG_MAX];
} zd_coll_ucx_t;

/* ---- ucx_p2p.c: requests and progress -------------------------------------------------------- */

uint64_t zd_ucx_tag(uint64_t seq, uint32_t src, uint32_t step, uint32_t seg);
void *zd_ucx_post_send(zd_coll_ucx_t *c, uint32_t to, const void *buf, size_t bytes, uint64_t tag);
void *zd_ucx_post_recv(zd_coll_ucx_t *c, void *buf, size_t bytes, uint64_t tag);
/* Is *req complete? Frees it and clears the slot. A failed request sets *st. */
bool zd_ucx_req_test(void **req, zs_status_t *st);
void zd_ucx_reqs_cancel(zd_coll_ucx_t *c, void **reqs, size_t n);
/* At least n request slots in c->reqs, all NULL. */
zs_status_t zd_ucx_reqs_reserve(zd_coll_ucx_t *c, size_t n);
/* One round of progress. Fails when the mesh aborted or the deadline passed (then the job is
 * aborted everywhere, naming `suspect`). */
zs_status_t zd_ucx_pump(zd_coll_ucx_t *c, unsigned *idle, zs_deadline_t deadline, uint32_t suspect,
                        const char *what, char *err, size_t errlen);
/* Send `len` bytes of c->out to every other rank and receive one message of at most
 * ZD_COLL_MSG_MAX bytes from each into c->in (lengths in c->in_info), within the deadline. */
zs_status_t zd_ucx_exchange(zd_coll_ucx_t *c, size_t len, uint64_t seq, uint32_t segno,
                            zs_deadline_t deadline, const char *what, char *err, size_t errlen);
zs_status_t zd_ucx_all_reduce(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops, unsigned n,
                              char *err, size_t errlen);
/* The sendrecv of zd_coll_ops_t: message i is segment i of the call's sequence number. */
zs_status_t zd_ucx_sendrecv(zd_coll_t *coll, uint32_t to, const zd_coll_buf_t *send,
                            unsigned n_send, uint32_t from, const zd_coll_buf_t *recv,
                            unsigned n_recv, char *err, size_t errlen);

/* ---- coll_ring.c ----------------------------------------------------------------------------- */

zs_status_t zd_ring_reduce_scatter(zd_coll_ucx_t *c, const void *src, zs_dtype_t dtype,
                                   uint64_t slice, float *acc, unsigned flags, uint64_t seq,
                                   char *err, size_t errlen);
zs_status_t zd_ring_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype, uint64_t slice,
                               uint64_t seq, char *err, size_t errlen);

/* ---- coll_direct.c --------------------------------------------------------------------------- */

/* The share of zd_coll_ops_t: offer this rank's regions, map the peers', agree. */
zs_status_t zd_direct_share(zd_coll_t *coll, const zs_region_t *const *regions, unsigned n,
                            zd_share_params_t *sp, char *err, size_t errlen);
void zd_direct_unmap(zd_coll_ucx_t *c);
/* Opening round of a direct collective: where each rank's buffer lies (c->peer_buf). *direct
 * false: some rank's buffer is outside its regions, every rank takes the ring this time. */
zs_status_t zd_direct_begin(zd_coll_ucx_t *c, const void *buf, size_t bytes, uint64_t seq,
                            zs_deadline_t deadline, bool *direct, const char *what, char *err,
                            size_t errlen);
/* Closing round: this rank is done reading; return once every peer is done with ours. */
zs_status_t zd_direct_end(zd_coll_ucx_t *c, uint64_t seq, zs_deadline_t deadline, const char *what,
                          char *err, size_t errlen);
zs_status_t zd_direct_reduce_scatter(zd_coll_ucx_t *c, zs_dtype_t dtype, uint64_t slice, float *acc,
                                     unsigned flags, zd_coll_norm_t *norm, char *err,
                                     size_t errlen);
zs_status_t zd_direct_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype, uint64_t slice,
                                 char *err, size_t errlen);

#endif
