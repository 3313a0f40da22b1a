/*
 * Collectives between the daemons of one job (docs/architecture.md): one interface, several
 * implementations: `local` (world 1: the accumulate kernel, nothing to exchange), `ucx` (host
 * memory: ring algorithms over ucp tagged messages, pipelined in segments), `nccl` (device
 * memory; built whenever CUDA is found). Every operation is bounded by collective_timeout and
 * fails with ZS_ERR_PEER_LOST naming the rank when a peer is lost or the job was aborted.
 * Every rank must call the same collectives in the same order.
 *
 * `ucx` has two algorithms for reduce-scatter and all-gather: when every rank of the job runs
 * on this host (same boot, network and pid namespaces) and each could map the others' shared
 * regions (`share`), a rank reads its peers' buffers in place (one copy, no staging); otherwise
 * the ring. All ranks agree on one of them at `share` time (docs/design-notes.md).
 */
#ifndef ZD_COLL_H
#define ZD_COLL_H

#include "zk/kernels.h"
#include "zs/mem.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zd_mesh zd_mesh_t;
typedef struct zd_coll zd_coll_t;

typedef enum zd_reduce_op {
    ZD_REDUCE_SUM = 0,
    ZD_REDUCE_MAX = 1,
} zd_reduce_op_t;

/* reduce_scatter flags */
#define ZD_COLL_OVERWRITE 1u /* acc = Σ (the accumulator holds nothing yet), not acc += Σ */

/* reduce_scatter's optional out: the sum of squares of the new accumulator slice, taken in
 * the same pass where the algorithm can (the bits of zk_sumsq on it); `done` false where it did
 * not, and the caller then takes it itself. */
typedef struct zd_coll_norm {
    bool done;
    int nonfinite;
    double sumsq;
} zd_coll_norm_t;

/* Most shared regions one rank offers to `share`. */
#define ZD_COLL_MAX_REGIONS 4u

/* `share`'s offer of one params region for every co-located rank (docs/design-notes.md "One
 * params region per host"). */
typedef struct zd_share_params {
    bool want;          /* in: this rank would take rank 0's region 0 as its own params region */
    bool agreed;        /* out: every rank wanted it and the direct path holds */
    zs_region_t region; /* out, ranks > 0 when agreed: rank 0's region 0 mapped read-write (the
                         * caller owns it); ZS_REGION_INIT otherwise */
} zd_share_params_t;

/* One message of a point-to-point transfer (sendrecv): exactly `bytes` at addr. */
typedef struct zd_coll_buf {
    void *addr;
    size_t bytes;
} zd_coll_buf_t;

/* sendrecv: no peer on that side */
#define ZD_COLL_NONE UINT32_MAX
/* most messages one side of a sendrecv carries */
#define ZD_COLL_MAX_BUFS 8u

typedef struct zd_coll_ops {
    const char *name;
    /* acc[0..slice) += Σ over ranks of src_q[rank * slice .. + slice), src of `dtype` holding
     * world * slice elements (this rank's whole bucket), summed in fp32 (ZD_COLL_OVERWRITE:
     * acc = Σ). norm (may be NULL): the new slice's sum of squares, where the algorithm takes
     * it in the same pass. */
    zs_status_t (*reduce_scatter)(zd_coll_t *coll, const void *src, zs_dtype_t dtype,
                                  uint64_t slice, float *acc, unsigned flags, zd_coll_norm_t *norm,
                                  char *err, size_t errlen);
    /* buf holds world * slice elements of dtype; this rank's slice (at rank * slice) goes to
     * every rank and the others arrive in place. */
    zs_status_t (*all_gather)(zd_coll_t *coll, void *buf, zs_dtype_t dtype, uint64_t slice,
                              char *err, size_t errlen);
    /* vals[i] = op[i] over ranks of vals[i], combined in rank order so every rank gets the
     * bit-identical result. */
    zs_status_t (*all_reduce)(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops, unsigned n,
                              char *err, size_t errlen);
    zs_status_t (*barrier)(zd_coll_t *coll, char *err, size_t errlen);
    /* Optional (NULL: nothing to share). Offer this rank's shared memfd regions (the buffers
     * later passed to reduce_scatter and all_gather) to co-located peers; replaces an earlier
     * offer. A collective: every rank calls it with its own regions. Afterwards `algo` says
     * which algorithm the ranks agreed on. sp (may be NULL): the params region offer. */
    zs_status_t (*share)(zd_coll_t *coll, const zs_region_t *const *regions, unsigned n,
                         zd_share_params_t *sp, char *err, size_t errlen);
    /* Optional (NULL: nothing to send to). Send n_send messages to rank `to` and receive n_recv
     * from rank `from` (either ZD_COLL_NONE: nothing that way), in order, each exactly its
     * size (a message of another size fails the call). A collective: every rank calls it,
     * with or without peers, so that the collectives' sequence stays aligned. */
    zs_status_t (*sendrecv)(zd_coll_t *coll, uint32_t to, const zd_coll_buf_t *send,
                            unsigned n_send, uint32_t from, const zd_coll_buf_t *recv,
                            unsigned n_recv, char *err, size_t errlen);
    void (*destroy)(zd_coll_t *coll);
} zd_coll_ops_t;

struct zd_coll {
    const zd_coll_ops_t *ops;
    uint32_t rank, world;
    char algo[160]; /* the algorithm in use and why, for logs and benchmarks */
    /* Of the last reduce_scatter or all_gather: the part of its time spent waiting for peers to
     * enter it (the rest moved and summed bytes; docs/metrics.md). 0 where the algorithm
     * cannot tell them apart (local, nccl). */
    uint64_t wait_ns;
};

static inline zs_status_t zd_coll_share(zd_coll_t *coll, const zs_region_t *const *regions,
                                        unsigned n, zd_share_params_t *sp, char *err, size_t errlen)
{
    if (sp != NULL) {
        sp->agreed = false;
        sp->region = (zs_region_t)ZS_REGION_INIT;
    }
    return coll->ops->share != NULL ? coll->ops->share(coll, regions, n, sp, err, errlen) : ZS_OK;
}

/* World 1: reduce-scatter is an accumulate, the rest are no-ops. */
zs_status_t zd_coll_local_create(const zk_exec_t *exec, zd_coll_t **coll_p);
/* Host memory over the mesh's UCX worker. direct: allow the in-place algorithm between
 * co-located ranks (config key direct_collectives); the ring otherwise. */
zs_status_t zd_coll_ucx_create(zd_mesh_t *mesh, const zk_exec_t *exec, bool direct,
                               zd_coll_t **coll_p);

static inline void zd_coll_destroy(zd_coll_t *coll)
{
    if (coll != NULL) {
        coll->ops->destroy(coll);
    }
}

#endif
