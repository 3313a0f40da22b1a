/*
 * How the ranks of a checkpoint save or load agree (docs/checkpoints.md "Commit protocol"): each
 * phase ends with an all-reduce of every rank's outcome, and a failure reaches every rank as the
 * first failed rank's own message (the file and the cause); the files' sizes and checksums reach
 * rank 0 the same way; every rank numbers the save alike.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"
#include "mesh/mesh.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long the ranks wait for each other in a save or load: the slowest disk's write of a
 * shard; a rank that dies meanwhile is noticed by its heartbeat instead. */
#define ZD_CKPT_AGREE_NS (3600ull * 1000000000ull)
/* The most of a failed rank's message that every rank gets (one double a byte). */
#define ZD_CKPT_CAUSE_MAX 400u

/* ---- agreement between the ranks -------------------------------------------------------- */

/* The all-reduce of a save or a load: the other ranks may still be writing, so it waits for
 * their disks (a lost rank is still noticed by its heartbeat). */
static zs_status_t zd_ckpt_all_reduce(const zd_ckpt_shard_t *sh, double *v,
                                      const zd_reduce_op_t *ops, unsigned n, char *why, size_t wlen)
{
    zs_status_t st;
    uint64_t was;

    if (sh->mesh == NULL) {
        return sh->coll->ops->all_reduce(sh->coll, v, ops, n, why, wlen);
    }
    was = zd_mesh_collective_timeout_ns(sh->mesh);
    zd_mesh_set_collective_timeout_ns(sh->mesh, ZD_CKPT_AGREE_NS);
    st = sh->coll->ops->all_reduce(sh->coll, v, ops, n, why, wlen);
    zd_mesh_set_collective_timeout_ns(sh->mesh, was);
    return st;
}

zs_status_t zd_ckpt_share_text(const zd_ckpt_shard_t *sh, uint32_t from, double head,
                               const char *text, size_t max, double *head_p, char *out,
                               size_t outlen, char *why, size_t wlen)
{
    size_t n = 1 + max;
    double *v = calloc(n, sizeof(double));
    zd_reduce_op_t *ops = calloc(n, sizeof(*ops));
    zs_status_t st;
    size_t i = 0;

    if (v == NULL || ops == NULL) {
        free(v);
        free(ops);
        snprintf(why, wlen, "out of memory");
        return ZS_ERR_NO_MEMORY;
    }
    if (sh->rank == from) {
        v[0] = head;
        for (size_t k = 0; k < max && text[k] != '\0'; k++) {
            v[1 + k] = (double)(unsigned char)text[k];
        }
    }
    for (size_t k = 0; k < n; k++) {
        ops[k] = ZD_REDUCE_SUM; /* every other rank adds zeros */
    }
    st = zd_ckpt_all_reduce(sh, v, ops, (unsigned)n, why, wlen);
    for (; st == ZS_OK && i < max && i + 1 < outlen && v[1 + i] != 0; i++) {
        out[i] = (char)(unsigned char)v[1 + i];
    }
    if (outlen > 0) {
        out[i] = '\0';
    }
    if (head_p != NULL) {
        *head_p = st == ZS_OK ? v[0] : 0;
    }
    free(v);
    free(ops);
    return st;
}

/* The first failed rank's status and message, to every rank. */
static zs_status_t zd_ckpt_first_cause(const zd_ckpt_shard_t *sh, uint32_t first, zs_status_t mine,
                                       const char *what, char *err, size_t errlen)
{
    char why[ZS_MSG_MAX] = "", cause[ZD_CKPT_CAUSE_MAX + 1] = "";
    double status = 0;
    zs_status_t st = zd_ckpt_share_text(sh, first, (double)mine, err, ZD_CKPT_CAUSE_MAX, &status,
                                        cause, sizeof(cause), why, sizeof(why));

    if (sh->rank == first) {
        return mine; /* err holds its own message */
    }
    if (st != ZS_OK) {
        return mine != ZS_OK ? mine : zs_errf(err, errlen, st, "%s: %s", what, why);
    }
    return zs_errf(err, errlen, mine != ZS_OK ? mine : (zs_status_t)(int)status,
                   "%s failed on rank %u: %s; nothing was changed", what, first, cause);
}

/* Every rank passes its own outcome (its message in err); all learn whether every rank
 * succeeded, and when not, every rank's error is the first failed rank's (lowest rank): its
 * status and its message, which names the file and the cause. */
zs_status_t zd_ckpt_agree(const zd_ckpt_shard_t *sh, zs_status_t mine, const char *what, char *err,
                          size_t errlen)
{
    double v = mine != ZS_OK ? (double)(sh->world - sh->rank) : 0;
    zd_reduce_op_t op = ZD_REDUCE_MAX;
    char why[ZS_MSG_MAX] = "";
    zs_status_t st;

    if (sh->coll == NULL) {
        return mine != ZS_OK ? mine
                             : zs_errf(err, errlen, ZS_ERR_PEER_LOST, "%s: the mesh is down", what);
    }
    st = zd_ckpt_all_reduce(sh, &v, &op, 1, why, sizeof(why));
    if (st != ZS_OK) {
        return mine != ZS_OK ? mine : zs_errf(err, errlen, st, "%s: %s", what, why);
    }
    if (v == 0) {
        return mine;
    }
    return zd_ckpt_first_cause(sh, sh->world - (uint32_t)v, mine, what, err, errlen);
}

/* Every rank's file size and checksum to every rank (rank 0 writes them into the manifest):
 * bytes, and the checksum's two halves, each exact as a double. */
zs_status_t zd_ckpt_gather_sums(const zd_ckpt_shard_t *sh, uint64_t bytes, uint64_t xxh3,
                                zs_ckpt_file_t *files, char *err, size_t errlen)
{
    size_t n = 3 * (size_t)sh->world;
    double *v = calloc(n, sizeof(double));
    zd_reduce_op_t *ops = calloc(n, sizeof(*ops));
    char why[ZS_MSG_MAX] = "";
    zs_status_t st;

    if (v == NULL || ops == NULL) {
        free(v);
        free(ops);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    v[3 * sh->rank] = (double)bytes;
    v[3 * sh->rank + 1] = (double)(xxh3 >> 32);
    v[3 * sh->rank + 2] = (double)(xxh3 & 0xffffffffu);
    st = zd_ckpt_all_reduce(sh, v, ops, (unsigned)n, why, sizeof(why)); /* ops: all SUM */
    for (uint32_t r = 0; st == ZS_OK && r < sh->world; r++) {
        zs_ckpt_rank_file(r, files[r].name, sizeof(files[r].name));
        files[r].rank = (int32_t)r;
        files[r].bytes = (uint64_t)v[3 * r];
        files[r].xxh3 = ((uint64_t)v[3 * r + 1] << 32) | (uint64_t)v[3 * r + 2];
    }
    if (st != ZS_OK) {
        st = zs_errf(err, errlen, st, "checkpoint save (collecting the files' checksums): %s", why);
    }
    free(v);
    free(ops);
    return st;
}

/* Which save this is, the same on every rank: rank 0's count (a re-formed job may count
 * differently on each rank), so that the writers' reports (mesh/heartbeat.h) name it alike. */
zs_status_t zd_ckpt_number(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, char *err, size_t errlen)
{
    double v = (double)(ck->seq + 1);
    zd_reduce_op_t op = ZD_REDUCE_MAX;
    char why[ZS_MSG_MAX];
    zs_status_t st = zd_ckpt_all_reduce(sh, &v, &op, 1, why, sizeof(why));

    if (st != ZS_OK) {
        return zs_errf(err, errlen, st, "checkpoint save: %s", why);
    }
    ck->seq = (uint64_t)v;
    return ZS_OK;
}
