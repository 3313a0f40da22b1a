/*
 * The `local` collectives (coll/coll.h) of a world-1 job: a reduce-scatter is the accumulate
 * kernel into the shard's accumulator (a cast when it overwrites), and an all-gather, an
 * all-reduce and a barrier have nobody to exchange with.
 */
#include "coll/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zd_coll_local {
    zd_coll_t base;
    zk_exec_t exec;
} zd_coll_local_t;

static zs_status_t zd_local_reduce_scatter(zd_coll_t *coll, const void *src, zs_dtype_t dtype,
                                           uint64_t slice, float *acc, unsigned flags,
                                           zd_coll_norm_t *norm, char *err, size_t errlen)
{
    (void)norm; /* one source: nothing to fuse the squares with that a read saves */
    zd_coll_local_t *c = (zd_coll_local_t *)coll;
    zs_status_t st = (flags & ZD_COLL_OVERWRITE)
                         ? zk_cast(&c->exec, acc, ZS_DTYPE_F32, src, dtype, slice)
                         : zk_accumulate(&c->exec, acc, src, dtype, 1.0f, slice);

    if (st != ZS_OK) {
        snprintf(err, errlen, "accumulate: %s", zk_last_error());
    }
    return st;
}

static zs_status_t zd_local_all_gather(zd_coll_t *coll, void *buf, zs_dtype_t dtype, uint64_t slice,
                                       char *err, size_t errlen)
{
    (void)coll;
    (void)buf;
    (void)dtype;
    (void)slice;
    (void)err;
    (void)errlen;
    return ZS_OK;
}

static zs_status_t zd_local_all_reduce(zd_coll_t *coll, double *vals, const zd_reduce_op_t *ops,
                                       unsigned n, char *err, size_t errlen)
{
    (void)coll;
    (void)err;
    (void)errlen;
    (void)vals;
    (void)ops;
    (void)n;
    return ZS_OK;
}

static zs_status_t zd_local_barrier(zd_coll_t *coll, char *err, size_t errlen)
{
    (void)coll;
    (void)err;
    (void)errlen;
    return ZS_OK;
}

static void zd_local_destroy(zd_coll_t *coll)
{
    free(coll);
}

static const zd_coll_ops_t zd_coll_local_ops = {
    .name = "local",
    .reduce_scatter = zd_local_reduce_scatter,
    .all_gather = zd_local_all_gather,
    .all_reduce = zd_local_all_reduce,
    .barrier = zd_local_barrier,
    .destroy = zd_local_destroy,
};

zs_status_t zd_coll_local_create(const zk_exec_t *exec, zd_coll_t **coll_p)
{
    zd_coll_local_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    c->base.ops = &zd_coll_local_ops;
    c->base.rank = 0;
    c->base.world = 1;
    c->exec = *exec;
    snprintf(c->base.algo, sizeof(c->base.algo), "local (world 1)");
    *coll_p = &c->base;
    return ZS_OK;
}
