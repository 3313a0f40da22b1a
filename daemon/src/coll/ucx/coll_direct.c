/*
 * The direct algorithm of the `ucx` collectives, between ranks on one host: each rank offers
 * its memfd regions (params, gradient slots, stage-1 grads); the peers open them through
 * /proc/<pid>/fd/<fd> (as UCX's posix transport does), check device and inode, and map them
 * read-only. A collective is then: CollReady to every peer (where the buffer lies), each rank
 * reads what it needs straight from its peers' buffers (reduce-scatter: its slice of every
 * rank's bucket, summed in rank order into the accumulator; all-gather: every peer's slice into
 * its own params region), CollDone to every peer, and return once all peers are done reading
 * this rank's buffer. One copy, no staging, no chunking.
 */
#define _GNU_SOURCE
#include "coll/ucx/coll_ucx_int.h"
#include "zerod/mesh/v1/mesh.pb-c.h"
#include "zs/error.h"
#include "zs/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* reduce-scatter of more than two sources: elements per block, so that the accumulator block
 * stays in cache while every source is added to it */
#define ZD_RS_BLOCK 32768u
_Static_assert(ZD_RS_BLOCK % ZK_SUMSQ_BLOCK == 0,
               "a block of the reduce-scatter is whole super-blocks");

void zd_direct_unmap(zd_coll_ucx_t *c)
{
    for (size_t i = 0; c->peer != NULL && i < (size_t)c->base.world * ZD_COLL_MAX_REGIONS; i++) {
        if (c->peer[i].addr != NULL) {
            munmap((void *)c->peer[i].addr, c->peer[i].size);
        }
        c->peer[i].addr = NULL;
        c->peer[i].size = 0;
    }
    c->direct = false;
}

static uint64_t zd_ns_inode(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* This process's host identity; false when it cannot be read. */
static bool zd_host_identity(char *boot_id, size_t len, uint64_t *net_ns, uint64_t *pid_ns)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    bool ok = f != NULL && fgets(boot_id, (int)len, f) != NULL;

    if (f != NULL) {
        fclose(f);
    }
    boot_id[ok ? strcspn(boot_id, "\n") : 0] = '\0';
    *net_ns = zd_ns_inode("/proc/self/ns/net");
    *pid_ns = zd_ns_inode("/proc/self/ns/pid");
    return ok && boot_id[0] != '\0' && *net_ns != 0 && *pid_ns != 0;
}

/* Open peer q's offered region i (flags: O_RDONLY or O_RDWR) and check it is the size-sealed
 * zerod memfd the peer described; -1 with why. */
static int zd_direct_open(const zd_coll_ucx_t *c, uint32_t q, uint32_t pid, unsigned i,
                          const Zerod__Mesh__V1__SharedRegion *sr, int flags, char *why,
                          size_t whylen)
{
    char path[64], target[64] = "";
    struct stat sb;
    int fd;

    snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, sr->fd);
    fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "rank %u cannot open rank %u's region %u (%s): %s", c->base.rank, q,
                 i, path, strerror(errno));
        return -1;
    }
    /* only a size-sealed zerod memfd: it cannot shrink under the mapping (no SIGBUS) */
    if (readlink(path, target, sizeof(target) - 1) < 0 ||
        strncmp(target, "/memfd:zerod", 12) != 0 || (fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) == 0) {
        snprintf(why, whylen, "rank %u: %s is not a size-sealed zerod memfd", c->base.rank, path);
        close(fd);
        return -1;
    }
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_dev != sr->dev || (uint64_t)sb.st_ino != sr->ino ||
        (uint64_t)sb.st_size < sr->size || sr->size > SIZE_MAX) {
        snprintf(why, whylen,
                 "rank %u: %s is not the region rank %u offered (device, inode or "
                 "size differ)",
                 c->base.rank, path, q);
        close(fd);
        return -1;
    }
    return fd;
}

/* Map peer q's offered region i read-only; false with why. */
static bool zd_direct_map(zd_coll_ucx_t *c, uint32_t q, uint32_t pid, unsigned i,
                          const Zerod__Mesh__V1__SharedRegion *sr, char *why, size_t whylen)
{
    void *addr;
    int fd;

    if (sr->fd < 0 || sr->size == 0) {
        return true;
    }
    fd = zd_direct_open(c, q, pid, i, sr, O_RDONLY, why, whylen);
    if (fd < 0) {
        return false;
    }
    addr = mmap(NULL, (size_t)sr->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (addr == MAP_FAILED) {
        snprintf(why, whylen, "rank %u cannot map rank %u's region %u (%llu bytes): %s",
                 c->base.rank, q, i, (unsigned long long)sr->size, strerror(errno));
        return false;
    }
    c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + i].addr = addr;
    c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + i].size = (size_t)sr->size;
    return true;
}

/* This rank's offer: its host identity and, per region, the memfd a peer can open. `why`
 * says why the offer is disabled. */
typedef struct zd_offer {
    Zerod__Mesh__V1__RegionOffer offer;
    Zerod__Mesh__V1__HostIdentity host;
    Zerod__Mesh__V1__SharedRegion sr[ZD_COLL_MAX_REGIONS];
    Zerod__Mesh__V1__SharedRegion *srp[ZD_COLL_MAX_REGIONS];
    char boot_id[64];
    char why[320];
    /* the params region offer: every rank's wish so far, rank 0's pid and region 0, and (ranks
     * > 0) that region mapped read-write */
    bool all_want;
    uint32_t pid0;
    Zerod__Mesh__V1__SharedRegion sr0;
    zs_region_t adopt;
    char adopt_why[320];
} zd_offer_t;

static void zd_offer_build(zd_coll_ucx_t *c, zd_offer_t *o, const zs_region_t *const *regions,
                           unsigned n, bool want_params)
{
    const uint32_t r = c->base.rank;

    memset(o, 0, sizeof(*o));
    zerod__mesh__v1__region_offer__init(&o->offer);
    zerod__mesh__v1__host_identity__init(&o->host);
    zerod__mesh__v1__shared_region__init(&o->sr0);
    o->adopt = (zs_region_t)ZS_REGION_INIT;
    o->all_want = want_params && n > 0;
    o->offer.share_params = o->all_want;
    o->offer.enabled = c->direct_allowed;
    if (!c->direct_allowed) {
        snprintf(o->why, sizeof(o->why), "direct_collectives = false on rank %u", r);
    } else if (!zd_host_identity(o->boot_id, sizeof(o->boot_id), &o->host.net_ns,
                                 &o->host.pid_ns)) {
        o->offer.enabled = false;
        snprintf(o->why, sizeof(o->why),
                 "rank %u cannot read its boot id and namespaces from /proc", r);
    }
    o->host.boot_id = o->boot_id;
    o->offer.host = &o->host;
    o->offer.pid = (uint32_t)getpid();
    for (unsigned i = 0; i < n; i++) {
        Zerod__Mesh__V1__SharedRegion *sr = &o->sr[i];
        struct stat sb;

        zerod__mesh__v1__shared_region__init(sr);
        o->srp[i] = sr;
        sr->fd = -1;
        c->local[i].addr = regions[i]->addr;
        c->local[i].size = regions[i]->addr != NULL ? regions[i]->size : 0;
        if (regions[i]->fd >= 0 && regions[i]->size > 0 && fstat(regions[i]->fd, &sb) == 0) {
            sr->fd = regions[i]->fd;
            sr->size = regions[i]->size;
            sr->dev = (uint64_t)sb.st_dev;
            sr->ino = (uint64_t)sb.st_ino;
        }
    }
    c->n_local = n;
    o->offer.n_regions = n;
    o->offer.regions = o->srp;
}

/* Peer q's offer (as packed in c->in): check it matches this host and map its regions; false
 * with o->why. */
static bool zd_offer_take(zd_coll_ucx_t *c, zd_offer_t *o, uint32_t q)
{
    Zerod__Mesh__V1__RegionOffer *po;
    bool ok = true;

    po = zerod__mesh__v1__region_offer__unpack(NULL, c->in_info[q].length,
                                               c->in + (size_t)q * ZD_COLL_MSG_MAX);
    if (po == NULL) {
        snprintf(o->why, sizeof(o->why), "rank %u sent an unreadable region offer", q);
        return false;
    }
    if (!po->enabled) {
        snprintf(o->why, sizeof(o->why),
                 "rank %u cannot take part (direct_collectives = false or no /proc)", q);
        ok = false;
    } else if (po->host == NULL || strcmp(po->host->boot_id, o->boot_id) != 0 ||
               po->host->net_ns != o->host.net_ns || po->host->pid_ns != o->host.pid_ns) {
        snprintf(o->why, sizeof(o->why), "rank %u runs on another host or in other namespaces", q);
        ok = false;
    } else if (po->n_regions > ZD_COLL_MAX_REGIONS) {
        snprintf(o->why, sizeof(o->why), "rank %u offered %zu regions (at most %u)", q,
                 po->n_regions, ZD_COLL_MAX_REGIONS);
        ok = false;
    }
    for (unsigned i = 0; ok && i < po->n_regions; i++) {
        ok = zd_direct_map(c, q, po->pid, i, po->regions[i], o->why, sizeof(o->why));
    }
    if (!po->share_params || po->n_regions == 0) {
        o->all_want = false;
    } else if (q == 0) {
        o->pid0 = po->pid;
        o->sr0.fd = po->regions[0]->fd;
        o->sr0.size = po->regions[0]->size;
        o->sr0.dev = po->regions[0]->dev;
        o->sr0.ino = po->regions[0]->ino;
    }
    zerod__mesh__v1__region_offer__free_unpacked(po, NULL);
    return ok;
}

/* Ranks > 0, when every rank wants one params region: map rank 0's region 0 read-write into
 * o->adopt; false with o->adopt_why. */
static bool zd_offer_adopt(zd_coll_ucx_t *c, zd_offer_t *o)
{
    int fd;

    if (c->base.rank == 0 || !o->all_want) {
        return true;
    }
    if (o->sr0.fd < 0 || o->sr0.size == 0 || o->sr0.size != c->local[0].size) {
        snprintf(o->adopt_why, sizeof(o->adopt_why),
                 "rank 0's params region (%llu bytes) is not the size of rank %u's (%zu)",
                 (unsigned long long)o->sr0.size, c->base.rank, c->local[0].size);
        return false;
    }
    fd = zd_direct_open(c, 0, o->pid0, 0, &o->sr0, O_RDWR, o->adopt_why, sizeof(o->adopt_why));
    if (fd < 0) {
        return false;
    }
    if (zs_region_map_fd(fd, (size_t)o->sr0.size, &o->adopt) != ZS_OK) {
        snprintf(o->adopt_why, sizeof(o->adopt_why),
                 "rank %u cannot map rank 0's params region read-write (%llu bytes): %s",
                 c->base.rank, (unsigned long long)o->sr0.size, strerror(errno));
        close(fd);
        return false;
    }
    return true;
}

/* Every rank's verdict on the direct path and on one params region, agreed (MAX of failures);
 * sets c->direct, coll->algo and sp (which takes o->adopt; the caller unmaps what is left). */
static zs_status_t zd_share_agree(zd_coll_ucx_t *c, zd_offer_t *o, bool ok, zd_share_params_t *sp,
                                  char *err, size_t errlen)
{
    static const zd_reduce_op_t max_op[2] = {ZD_REDUCE_MAX, ZD_REDUCE_MAX};
    zd_coll_t *coll = &c->base;
    bool adopted = ok && zd_offer_adopt(c, o);
    /* [0]: no direct path here; [1]: no shared params region here */
    double fail[2] = {ok ? 0.0 : 1.0, ok && o->all_want && adopted ? 0.0 : 1.0};
    zs_status_t st = zd_ucx_all_reduce(coll, fail, max_op, 2, err, errlen);

    if (st != ZS_OK || fail[0] != 0.0) {
        zd_direct_unmap(c);
        snprintf(coll->algo, sizeof(coll->algo), "ring over UCX (no direct path: %.120s)",
                 ok ? "another rank cannot use it" : o->why);
    } else {
        c->direct = true;
        snprintf(coll->algo, sizeof(coll->algo),
                 "direct (%u ranks on this host read each other's regions in place)", coll->world);
    }
    if (st == ZS_OK && fail[0] == 0.0 && fail[1] == 0.0 && sp != NULL) {
        sp->agreed = true;
        sp->region = o->adopt;
        o->adopt = (zs_region_t)ZS_REGION_INIT;
    } else if (o->all_want && st == ZS_OK) {
        zs_info(ZS_SUB_MESH, "params region: one per rank (%.200s)",
                o->adopt_why[0] != '\0' ? o->adopt_why : "another rank cannot share it");
    }
    return st;
}

zs_status_t zd_direct_share(zd_coll_t *coll, const zs_region_t *const *regions, unsigned n,
                            zd_share_params_t *sp, char *err, size_t errlen)
{
    zd_coll_ucx_t *c = (zd_coll_ucx_t *)coll;
    zs_deadline_t deadline = zs_deadline_in_ns(zd_mesh_collective_timeout_ns(c->mesh));
    zd_offer_t *o;
    bool ok;
    zs_status_t st;

    zd_direct_unmap(c);
    c->n_local = 0;
    if (n > ZD_COLL_MAX_REGIONS) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "share: %u regions (at most %u)", n,
                       ZD_COLL_MAX_REGIONS);
    }
    o = malloc(sizeof(*o));
    if (o == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "share: out of memory");
    }
    zd_offer_build(c, o, regions, n, sp != NULL && sp->want);
    if (zerod__mesh__v1__region_offer__get_packed_size(&o->offer) > ZD_COLL_MSG_MAX) {
        free(o);
        return zs_errf(err, errlen, ZS_ERR_INVALID, "share: region offer larger than %u bytes",
                       ZD_COLL_MSG_MAX);
    }
    st = zd_ucx_exchange(c, zerod__mesh__v1__region_offer__pack(&o->offer, c->out), ++c->seq,
                         ZD_SEG_SHARE, deadline, "share", err, errlen);
    ok = st == ZS_OK && o->offer.enabled;
    for (uint32_t q = 0; ok && q < coll->world; q++) {
        ok = q == coll->rank || zd_offer_take(c, o, q);
    }
    /* every rank must choose the same algorithm */
    if (st == ZS_OK) {
        st = zd_share_agree(c, o, ok, sp, err, errlen);
    }
    zs_region_cleanup(&o->adopt);
    free(o);
    if (st == ZS_OK) {
        zs_info(ZS_SUB_MESH, "collectives: %s", coll->algo);
    }
    return st;
}

/* Where [buf, buf + bytes) lies in this rank's offered regions. */
static bool zd_direct_locate(const zd_coll_ucx_t *c, const void *buf, size_t bytes,
                             uint32_t *region, uint64_t *offset)
{
    for (unsigned i = 0; i < c->n_local; i++) {
        const char *lo = c->local[i].addr;
        if (lo != NULL && (const char *)buf >= lo && bytes <= c->local[i].size &&
            (size_t)((const char *)buf - lo) <= c->local[i].size - bytes) {
            *region = i;
            *offset = (uint64_t)((const char *)buf - lo);
            return true;
        }
    }
    return false;
}

/* Opening round: tell every peer where this rank's buffer is, learn theirs (c->peer_buf).
 * *direct false: some rank's buffer is outside its regions, every rank falls back to the
 * ring for this collective. */
zs_status_t zd_direct_begin(zd_coll_ucx_t *c, const void *buf, size_t bytes, uint64_t seq,
                            zs_deadline_t deadline, bool *direct, const char *what, char *err,
                            size_t errlen)
{
    const uint32_t N = c->base.world, r = c->base.rank;
    Zerod__Mesh__V1__CollReady ready = ZEROD__MESH__V1__COLL_READY__INIT;
    uint32_t region = 0;
    uint64_t offset = 0;
    zs_status_t st;

    ready.direct = zd_direct_locate(c, buf, bytes, &region, &offset);
    ready.region = region;
    ready.offset = offset;
    st = zd_ucx_exchange(c, zerod__mesh__v1__coll_ready__pack(&ready, c->out), seq, ZD_SEG_READY,
                         deadline, what, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    *direct = ready.direct;
    c->peer_buf[r] = buf;
    for (uint32_t q = 0; q < N; q++) {
        Zerod__Mesh__V1__CollReady *pr;
        const zd_map_t *m;

        if (q == r) {
            continue;
        }
        pr = zerod__mesh__v1__coll_ready__unpack(NULL, c->in_info[q].length,
                                                 c->in + (size_t)q * ZD_COLL_MSG_MAX);
        if (pr == NULL) {
            zd_mesh_abort(c->mesh, q, "rank %u sent an unreadable CollReady", q);
            snprintf(err, errlen, "%s: rank %u sent an unreadable CollReady", what, q);
            return ZS_ERR_PEER_LOST;
        }
        if (!pr->direct) {
            *direct = false;
        }
        m = pr->region < ZD_COLL_MAX_REGIONS
                ? &c->peer[(size_t)q * ZD_COLL_MAX_REGIONS + pr->region]
                : NULL;
        if (pr->direct &&
            (m == NULL || m->addr == NULL || bytes > m->size || pr->offset > m->size - bytes)) {
            zd_mesh_abort(c->mesh, q,
                          "rank %u announced %zu bytes at offset %llu of its region %u, outside "
                          "what it offered",
                          q, bytes, (unsigned long long)pr->offset, pr->region);
            snprintf(err, errlen, "%s: rank %u announced a buffer outside its regions", what, q);
            zerod__mesh__v1__coll_ready__free_unpacked(pr, NULL);
            return ZS_ERR_PEER_LOST;
        }
        c->peer_buf[q] = pr->direct ? m->addr + pr->offset : NULL;
        zerod__mesh__v1__coll_ready__free_unpacked(pr, NULL);
    }
    return ZS_OK;
}

/* Closing round: this rank is done reading; return once every peer is done with ours. */
zs_status_t zd_direct_end(zd_coll_ucx_t *c, uint64_t seq, zs_deadline_t deadline, const char *what,
                          char *err, size_t errlen)
{
    Zerod__Mesh__V1__CollDone done = ZEROD__MESH__V1__COLL_DONE__INIT;

    return zd_ucx_exchange(c, zerod__mesh__v1__coll_done__pack(&done, c->out), seq, ZD_SEG_DONE,
                           deadline, what, err, errlen);
}

#define ZD_RS_MAX_WORKERS 256u /* the threads key's upper bound */

typedef struct zd_rs_job {
    const zd_coll_ucx_t *c;
    zs_dtype_t dtype;
    size_t dsz;
    uint64_t slice;
    float *acc;
    unsigned flags;
    double *part; /* the slice's super-block sums of squares, or NULL: not asked */
    zs_status_t st[ZD_RS_MAX_WORKERS];
} zd_rs_job_t;

/* One worker's range of the direct reduce-scatter: acc (=|+=) Σ_q src_q, in rank order, and
 * with j->part the squares of the result (b, each block start: super-block starts). */
static void zd_rs_chunk(void *arg, unsigned worker, size_t b, size_t e)
{
    zd_rs_job_t *j = arg;
    const uint32_t N = j->c->base.world, r = j->c->base.rank;
    const zk_exec_t one = {.variant = j->c->exec.variant, .pool = NULL};
    const uint64_t at = (uint64_t)r * j->slice;
    const bool overwrite = (j->flags & ZD_COLL_OVERWRITE) != 0;
    const char *const *src = j->c->peer_buf;
    zs_status_t st = ZS_OK;

    if (N == 2 && j->dtype == ZS_DTYPE_F32 && overwrite) {
        /* one pass; streaming stores for large ranges; the squares from registers */
        const float *s0 = (const float *)(const void *)src[0] + at + b;
        const float *s1 = (const float *)(const void *)src[1] + at + b;

        st = j->part != NULL ? zk_reduce_sumsq_parts(&one, j->acc + b, s0, s1, e - b,
                                                     j->part + b / ZK_SUMSQ_BLOCK)
                             : zk_reduce(&one, j->acc + b, s0, s1, ZS_DTYPE_F32, e - b);
    } else {
        /* block by block, so the accumulator block stays in cache across the sources and for
         * its squares */
        for (size_t lo = b; lo < e && st == ZS_OK; lo += ZD_RS_BLOCK) {
            size_t n = e - lo < ZD_RS_BLOCK ? e - lo : ZD_RS_BLOCK;
            for (uint32_t q = 0; q < N && st == ZS_OK; q++) {
                const char *s = src[q] + (at + lo) * j->dsz;
                st = q == 0 && overwrite ? zk_cast(&one, j->acc + lo, ZS_DTYPE_F32, s, j->dtype, n)
                                         : zk_accumulate(&one, j->acc + lo, s, j->dtype, 1.0f, n);
            }
            if (st == ZS_OK && j->part != NULL) {
                st = zk_sumsq_parts(&one, j->acc + lo, n, j->part + lo / ZK_SUMSQ_BLOCK);
            }
        }
    }
    if (worker < ZD_RS_MAX_WORKERS) {
        j->st[worker] = st;
    }
}

/* Room for n super-block sums (c->norm_part grown to it), or NULL: the caller's norm pass
 * takes the squares instead. */
static double *zd_rs_parts(zd_coll_ucx_t *c, size_t n)
{
    if (n > c->norm_parts) {
        double *p = realloc(c->norm_part, n * sizeof(double));
        if (p == NULL) {
            return NULL;
        }
        c->norm_part = p;
        c->norm_parts = n;
    }
    return c->norm_part;
}

zs_status_t zd_direct_reduce_scatter(zd_coll_ucx_t *c, zs_dtype_t dtype, uint64_t slice, float *acc,
                                     unsigned flags, zd_coll_norm_t *norm, char *err, size_t errlen)
{
    const size_t nparts = (size_t)((slice + ZK_SUMSQ_BLOCK - 1) / ZK_SUMSQ_BLOCK);
    zd_rs_job_t job;
    zs_status_t st;

    memset(&job, 0, sizeof(job));
    job.c = c;
    job.dtype = dtype;
    job.dsz = zs_dtype_size(dtype);
    job.slice = slice;
    job.acc = acc;
    job.flags = flags;
    job.part = norm != NULL ? zd_rs_parts(c, nparts) : NULL;
    /* with the squares, chunks start at super-block starts (the slice's start is one) */
    st = zk_pool_run(c->exec.pool, slice, job.part != NULL ? ZK_SUMSQ_BLOCK : 1024, zd_rs_chunk,
                     &job);
    for (unsigned w = 0; w < ZD_RS_MAX_WORKERS && st == ZS_OK; w++) {
        st = job.st[w];
    }
    if (st != ZS_OK) {
        snprintf(err, errlen, "reduce_scatter: %s", zk_last_error());
    } else if (job.part != NULL) {
        norm->sumsq = zk_sumsq_total(job.part, nparts, &norm->nonfinite);
        norm->done = true;
    }
    return st;
}

zs_status_t zd_direct_all_gather(zd_coll_ucx_t *c, void *buf, zs_dtype_t dtype, uint64_t slice,
                                 char *err, size_t errlen)
{
    const size_t bytes = slice * zs_dtype_size(dtype);
    zs_status_t st = ZS_OK;

    for (uint32_t q = 0; q < c->base.world && st == ZS_OK; q++) {
        if (q != c->base.rank) {
            st = zk_cast(&c->exec, (char *)buf + q * bytes, dtype, c->peer_buf[q] + q * bytes,
                         dtype, slice);
        }
    }
    if (st != ZS_OK) {
        snprintf(err, errlen, "all_gather: %s", zk_last_error());
    }
    return st;
}
