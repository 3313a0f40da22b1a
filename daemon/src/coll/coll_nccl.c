/*
 * Device-memory collectives over NCCL (docs/architecture.md): the zd_coll_ops_t interface with
 * ncclReduceScatter / ncclAllGather / ncclAllReduce on the daemon's stream. The communicator
 * is non-blocking, so every wait polls the stream and ncclCommGetAsyncError against the
 * collective deadline and ends in ncclCommAbort rather than a hang.
 * Built whenever CUDA is found; used by the CUDA backend (device buffers only).
 */
#include "coll/coll_nccl.h"

#include "zk/kernels_cuda.h"
#include "zs/thread.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zd_coll_nccl {
    zd_coll_t base;
    ncclComm_t comm;
    cudaStream_t stream;
    void *tmp; /* reduce-scatter landing buffer (device) */
    size_t tmp_bytes;
    double *dvals; /* all_reduce scratch (device) */
    uint64_t timeout_ns;
    int device;
    bool aborted;
} zd_coll_nccl_t;

_Static_assert(ZD_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");

static ncclDataType_t zd_nccl_dtype(zs_dtype_t dt)
{
    switch (dt) {
    case ZS_DTYPE_F16:
        return ncclFloat16;
    case ZS_DTYPE_BF16:
        return ncclBfloat16;
    default:
        return ncclFloat32;
    }
}

/* Wait for the stream; abort the communicator on an async error or at the deadline. */
static zs_status_t zd_nccl_wait(zd_coll_nccl_t *c, const char *what, char *err, size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(c->timeout_ns);

    for (;;) {
        cudaError_t ce = cudaStreamQuery(c->stream);
        ncclResult_t ar = ncclSuccess;

        if (ce == cudaSuccess) {
            return ZS_OK;
        }
        if (ce != cudaErrorNotReady) {
            snprintf(err, errlen, "%s: CUDA error %s", what, cudaGetErrorString(ce));
            return ZS_ERR_CUDA;
        }
        ncclCommGetAsyncError(c->comm, &ar);
        if (ar != ncclSuccess && ar != ncclInProgress) {
            snprintf(err, errlen, "%s: NCCL error %s; communicator aborted", what,
                     ncclGetErrorString(ar));
            ncclCommAbort(c->comm);
            c->aborted = true;
            return ZS_ERR_PEER_LOST;
        }
        if (zs_deadline_expired(deadline)) {
            snprintf(err, errlen,
                     "%s: timed out after %.1f s (collective_timeout); NCCL "
                     "communicator aborted",
                     what, (double)c->timeout_ns * 1e-9);
            ncclCommAbort(c->comm);
            c->aborted = true;
            return ZS_ERR_PEER_LOST;
        }
        sched_yield();
    }
}

static zs_status_t zd_nccl_check(zd_coll_nccl_t *c, ncclResult_t r, const char *what, char *err,
                                 size_t errlen)
{
    if (c->aborted) {
        snprintf(err, errlen, "%s: the NCCL communicator was aborted", what);
        return ZS_ERR_PEER_LOST;
    }
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "%s: %s", what, ncclGetErrorString(r));
        return ZS_ERR_NCCL;
    }
    return ZS_OK;
}

/* World 1: acc = src (overwrite) or acc += src, on the communicator's stream. */
static zs_status_t zd_nccl_reduce_one(zd_coll_nccl_t *c, const void *src, zs_dtype_t dtype,
                                      uint64_t slice, float *acc, unsigned flags, char *err,
                                      size_t errlen)
{
    zs_status_t st = ZS_OK;

    if ((flags & ZD_COLL_OVERWRITE) && dtype == ZS_DTYPE_F32) {
        if (cudaMemcpyAsync(acc, src, slice * sizeof(float), cudaMemcpyDeviceToDevice, c->stream) !=
            cudaSuccess) {
            snprintf(err, errlen, "reduce_scatter: cudaMemcpyAsync failed");
            return ZS_ERR_CUDA;
        }
    } else if (flags & ZD_COLL_OVERWRITE) {
        st = zk_cuda_cast(acc, ZS_DTYPE_F32, src, dtype, slice, c->stream);
    } else {
        st = zk_cuda_accumulate(acc, src, dtype, 1.0f, slice, c->stream);
    }
    if (st != ZS_OK) {
        snprintf(err, errlen, "reduce_scatter: %s", zk_last_error());
        return st;
    }
    return zd_nccl_wait(c, "reduce_scatter", err, errlen);
}

static zs_status_t zd_nccl_reduce_scatter(zd_coll_t *coll, const void *src, zs_dtype_t dtype,
                                          uint64_t slice, float *acc, unsigned flags,
                                          zd_coll_norm_t *norm, char *err, size_t errlen)
{
    (void)norm; /* the device's norm is its own pass (zk_cuda) */
    zd_coll_nccl_t *c = (zd_coll_nccl_t *)coll;
    size_t bytes = slice * zs_dtype_size(dtype);
    zs_status_t st;

    if (slice == 0) {
        return ZS_OK;
    }
    if (coll->world == 1) { /* the sum over one rank is src: no landing buffer, no NCCL call */
        return zd_nccl_reduce_one(c, src, dtype, slice, acc, flags, err, errlen);
    }
    if ((flags & ZD_COLL_OVERWRITE) && dtype == ZS_DTYPE_F32) {
        /* the sum lands straight in the accumulator */
        st = zd_nccl_check(
            c, ncclReduceScatter(src, acc, slice, ncclFloat32, ncclSum, c->comm, c->stream),
            "ncclReduceScatter", err, errlen);
        return st == ZS_OK ? zd_nccl_wait(c, "reduce_scatter", err, errlen) : st;
    }
    if ((flags & ZD_COLL_OVERWRITE) &&
        cudaMemsetAsync(acc, 0, slice * sizeof(float), c->stream) != cudaSuccess) {
        snprintf(err, errlen, "reduce_scatter: cudaMemsetAsync failed");
        return ZS_ERR_CUDA;
    }
    if (bytes > c->tmp_bytes) {
        cudaFree(c->tmp);
        c->tmp = NULL;
        c->tmp_bytes = 0;
        if (cudaMalloc(&c->tmp, bytes) != cudaSuccess) {
            snprintf(err, errlen, "reduce_scatter: cudaMalloc(%zu) failed", bytes);
            return ZS_ERR_NO_MEMORY;
        }
        c->tmp_bytes = bytes;
    }
    st = zd_nccl_check(
        c, ncclReduceScatter(src, c->tmp, slice, zd_nccl_dtype(dtype), ncclSum, c->comm, c->stream),
        "ncclReduceScatter", err, errlen);
    if (st == ZS_OK) {
        st = zk_cuda_accumulate(acc, c->tmp, dtype, 1.0f, slice, c->stream);
        if (st != ZS_OK) {
            snprintf(err, errlen, "reduce_scatter: accumulate: %s", zk_last_error());
        }
    }
    return st == ZS_OK ? zd_nccl_wait(c, "reduce_scatter", err, errlen) : st;
}

static zs_status_t zd_nccl_all_gather(zd_coll_t *coll, void *buf, zs_dtype_t dtype, uint64_t slice,
                                      char *err, size_t errlen)
{
    zd_coll_nccl_t *c = (zd_coll_nccl_t *)coll;
    char *own = (char *)buf + (uint64_t)coll->rank * slice * zs_dtype_size(dtype);
    zs_status_t st;

    if (slice == 0) {
        return ZS_OK;
    }
    /* in place: sendbuff == recvbuff + rank * count */
    st = zd_nccl_check(c, ncclAllGather(own, buf, slice, zd_nccl_dtype(dtype), c->comm, c->stream),
                       "ncclAllGather", err, errlen);
    return st == ZS_OK ? zd_nccl_wait(c, "all_gather", err, errlen) : st;
}

static zs_status_t zd_nccl_all_reduce(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops,
                                      unsigned n, char *err, size_t errlen)
{
    zd_coll_nccl_t *c = (zd_coll_nccl_t *)coll;
    zs_status_t st = ZS_OK;

    if (n > 64) {
        snprintf(err, errlen, "all_reduce: %u values (at most 64)", n);
        return ZS_ERR_INVALID;
    }
    if (cudaMemcpyAsync(c->dvals, vals, n * sizeof(double), cudaMemcpyHostToDevice, c->stream) !=
        cudaSuccess) {
        snprintf(err, errlen, "all_reduce: cudaMemcpyAsync failed");
        return ZS_ERR_CUDA;
    }
    for (unsigned i = 0; i < n && st == ZS_OK; i++) {
        st = zd_nccl_check(c,
                           ncclAllReduce(c->dvals + i, c->dvals + i, 1, ncclFloat64,
                                         ops[i] == ZD_REDUCE_SUM ? ncclSum : ncclMax, c->comm,
                                         c->stream),
                           "ncclAllReduce", err, errlen);
    }
    if (st == ZS_OK && cudaMemcpyAsync(vals, c->dvals, n * sizeof(double), cudaMemcpyDeviceToHost,
                                       c->stream) != cudaSuccess) {
        snprintf(err, errlen, "all_reduce: cudaMemcpyAsync failed");
        return ZS_ERR_CUDA;
    }
    return st == ZS_OK ? zd_nccl_wait(c, "all_reduce", err, errlen) : st;
}

static zs_status_t zd_nccl_barrier(zd_coll_t *coll, char *err, size_t errlen)
{
    static const zd_reduce_op_t op = ZD_REDUCE_SUM;
    double v = 0;

    return zd_nccl_all_reduce(coll, &v, &op, 1, err, errlen);
}

static void zd_nccl_destroy(zd_coll_t *coll)
{
    zd_coll_nccl_t *c = (zd_coll_nccl_t *)coll;

    if (c->comm != NULL) {
        if (c->aborted) {
            /* already aborted: the communicator is gone */
        } else {
            ncclCommAbort(c->comm); /* never blocks on a dead peer, unlike ncclCommDestroy */
        }
    }
    cudaFree(c->tmp);
    cudaFree(c->dvals);
    if (c->stream != NULL) {
        cudaStreamDestroy(c->stream);
    }
    free(c);
}

static const zd_coll_ops_t zd_coll_nccl_ops = {
    .name = "nccl",
    .reduce_scatter = zd_nccl_reduce_scatter,
    .all_gather = zd_nccl_all_gather,
    .all_reduce = zd_nccl_all_reduce,
    .barrier = zd_nccl_barrier,
    .destroy = zd_nccl_destroy,
};

zs_status_t zd_coll_nccl_unique_id(uint8_t id[ZD_NCCL_ID_BYTES], char *err, size_t errlen)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);

    if (r != ncclSuccess) {
        snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return ZS_ERR_NCCL;
    }
    memcpy(id, uid.internal, ZD_NCCL_ID_BYTES);
    return ZS_OK;
}

static zs_status_t zd_nccl_open(uint32_t rank, uint32_t world, const uint8_t id[ZD_NCCL_ID_BYTES],
                                int device, uint64_t timeout_ns, zd_coll_t **coll_p, char *err,
                                size_t errlen)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId uid;
    zd_coll_nccl_t *c;
    ncclResult_t r;
    zs_status_t st;

    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    c->base.ops = &zd_coll_nccl_ops;
    c->base.rank = rank;
    c->base.world = world;
    snprintf(c->base.algo, sizeof(c->base.algo), "NCCL");
    c->timeout_ns = timeout_ns;
    c->device = device;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void **)&c->dvals, 64 * sizeof(double)) != cudaSuccess) {
        snprintf(err, errlen, "nccl: CUDA device %d unusable: %s", device,
                 cudaGetErrorString(cudaGetLastError()));
        zd_nccl_destroy(&c->base);
        return ZS_ERR_NO_DEVICE;
    }
    memcpy(uid.internal, id, ZD_NCCL_ID_BYTES);
    config.blocking = 0; /* init and collectives return at once; we poll with a deadline */
    r = ncclCommInitRankConfig(&c->comm, (int)world, uid, (int)rank, &config);
    st = zd_nccl_check(c, r, "ncclCommInitRankConfig", err, errlen);
    if (st == ZS_OK) {
        zs_deadline_t deadline = zs_deadline_in_ns(timeout_ns);
        do {
            ncclCommGetAsyncError(c->comm, &r);
            if (r == ncclInProgress && zs_deadline_expired(deadline)) {
                snprintf(err, errlen, "ncclCommInitRank: timed out after %.1f s",
                         (double)timeout_ns * 1e-9);
                st = ZS_ERR_TIMEOUT;
                break;
            }
            sched_yield();
        } while (r == ncclInProgress);
        if (st == ZS_OK && r != ncclSuccess) {
            snprintf(err, errlen, "ncclCommInitRank: %s", ncclGetErrorString(r));
            st = ZS_ERR_NCCL;
        }
    }
    if (st != ZS_OK) {
        zd_nccl_destroy(&c->base);
        return st;
    }
    *coll_p = &c->base;
    return ZS_OK;
}

/* CUDA and NCCL start threads of their own here; they inherit a mask that blocks every signal
 * (zs/thread.h) */
zs_status_t zd_coll_nccl_create(uint32_t rank, uint32_t world, const uint8_t id[ZD_NCCL_ID_BYTES],
                                int device, uint64_t timeout_ns, zd_coll_t **coll_p, char *err,
                                size_t errlen)
{
    sigset_t old;
    zs_status_t st;

    zs_signals_block(&old);
    st = zd_nccl_open(rank, world, id, device, timeout_ns, coll_p, err, errlen);
    zs_signals_restore(&old);
    return st;
}
