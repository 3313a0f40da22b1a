/*
 * zc_session's layout queries: the element types, and where each parameter and bucket lies in
 * the regions an attach mapped (attach.c), plus a fresh job's initial values written there.
 * Part of zc_session (session_int.h).
 */
#include "session_int.h"

#include "zs/dtype.h"

#include <stdint.h>
#include <string.h>

/* The public zc_dtype_t, ipc.proto's DType and zs_dtype_t carry the same values: codes.c
 * checks both against ZS_DTYPE_MAP. */

ZC_API size_t zc_dtype_size(zc_dtype_t dtype)
{
    zs_dtype_t d;

    return zs_dtype_from_int((long)dtype, &d) == ZS_OK ? zs_dtype_size(d) : 0;
}

ZC_API const char *zc_dtype_name(zc_dtype_t dtype)
{
    zs_dtype_t d;

    return zs_dtype_from_int((long)dtype, &d) == ZS_OK ? zs_dtype_name(d) : "unknown";
}

ZC_API zc_dtype_t zc_session_dtype(zc_session_t *session)
{
    return (session != NULL && session->attached) ? session->dtype : ZC_DTYPE_F32;
}

ZC_API zc_dtype_t zc_session_grads_dtype(zc_session_t *session)
{
    return session != NULL && session->attached ? session->grads_dtype : ZC_DTYPE_F32;
}

static int zc_session_check_param(zc_session_t *s, uint32_t id, const char *what)
{
    int status = zc_session_check_attached(s, what);

    if (status == ZC_OK && id >= s->layout->n_params) {
        status = zc_fail(ZC_ERR_INVALID, "%s: parameter %u is not below %u", what, id,
                         s->layout->n_params);
    }
    return status;
}

ZC_API void *zc_session_param_ptr(zc_session_t *session, uint32_t id)
{
    if (zc_session_check_param(session, id, "param_ptr") != ZC_OK) {
        return NULL;
    }
    return (uint8_t *)session->params.addr +
           zs_layout_param_by_id(session->layout, id)->offset * session->dsize;
}

ZC_API int zc_session_params_shared(zc_session_t *session)
{
    return zc_session_check_attached(session, "params_shared") == ZC_OK && session->params_shared;
}

ZC_API int zc_session_replicated(zc_session_t *session)
{
    return session != NULL && session->attached && session->replicated;
}

ZC_API int zc_session_memory(zc_session_t *session, int *device_p)
{
    int status = zc_session_check_attached(session, "memory");

    if (device_p != NULL) {
        *device_p = status == ZC_OK ? session->device : -1;
    }
    if (status != ZC_OK) {
        return status;
    }
    return session->mem == ZS_MEM_DEVICE ? ZC_MEMORY_DEVICE : ZC_MEMORY_HOST;
}

ZC_API int zc_session_init_param(zc_session_t *session, uint32_t id, const void *src)
{
    const zs_layout_param_t *p;
    int status = zc_session_check_param(session, id, "init_param");

    if (status != ZC_OK) {
        return status;
    }
    if (session->params_ready) {
        return zc_fail(ZC_ERR_STATE, "init_param: the job already has its parameters");
    }
    if (src == NULL) {
        return zc_fail(ZC_ERR_INVALID, "init_param: src is NULL");
    }
    p = zs_layout_param_by_id(session->layout, id);
    for (uint32_t b = p->bucket; b <= p->last_bucket; b++) {
        const zs_layout_bucket_t *bk = &session->layout->buckets[b];
        /* this rank's slice of bucket b, or the whole bucket */
        uint64_t lo = session->params_shared ? bk->offset + session->rank * bk->slice : bk->offset;
        uint64_t hi = session->params_shared ? lo + bk->slice : bk->offset + bk->padded;

        lo = lo > p->offset ? lo : p->offset;
        hi = hi < p->offset + p->numel ? hi : p->offset + p->numel;
        if (lo < hi) {
            uint8_t *dst = (uint8_t *)session->params.addr + lo * session->dsize;
            const uint8_t *from = (const uint8_t *)src + (lo - p->offset) * session->dsize;
            size_t bytes = (size_t)(hi - lo) * session->dsize;

            if (session->mem != ZS_MEM_DEVICE) {
                memcpy(dst, from, bytes);
            } else if ((status = zc_dev_copy(session, dst, from, bytes, "init_param")) != ZC_OK) {
                return status;
            }
        }
    }
    /* a device session's copies are complete before ParamsReady can follow */
    return session->mem == ZS_MEM_DEVICE ? zc_dev_fence(session, "init_param") : ZC_OK;
}

ZC_API uint64_t zc_session_param_numel(zc_session_t *session, uint32_t id)
{
    if (zc_session_check_param(session, id, "param_numel") != ZC_OK) {
        return 0;
    }
    return zs_layout_param_by_id(session->layout, id)->numel;
}

int zc_session_check_bucket(zc_session_t *s, uint32_t bucket, const char *what)
{
    int status = zc_session_check_attached(s, what);

    if (status == ZC_OK && bucket >= s->layout->n_buckets) {
        status = zc_fail(ZC_ERR_INVALID, "%s: bucket %u is not below %u", what, bucket,
                         s->layout->n_buckets);
    }
    return status;
}

ZC_API int zc_session_bucket_info(zc_session_t *session, uint32_t bucket, zc_bucket_info_t *info_p)
{
    const zs_layout_bucket_t *b;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_info");
    if (status != ZC_OK) {
        return status;
    }
    if (info_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_info: info_p is NULL");
    }
    b = &session->layout->buckets[bucket];
    info_p->group = b->group;
    info_p->n_params = b->n_params;
    info_p->numel = b->numel;
    info_p->padded = b->padded;
    return ZC_OK;
}

ZC_API int zc_session_param_bucket(zc_session_t *session, uint32_t id, uint32_t *bucket_p,
                                   uint64_t *offset_p)
{
    const zs_layout_param_t *p;
    int status;

    status = zc_session_check_param(session, id, "param_bucket");
    if (status != ZC_OK) {
        return status;
    }
    p = zs_layout_param_by_id(session->layout, id);
    if (bucket_p != NULL) {
        *bucket_p = p->bucket;
    }
    if (offset_p != NULL) {
        *offset_p = p->offset - session->layout->buckets[p->bucket].offset;
    }
    return ZC_OK;
}

ZC_API int zc_session_bucket_param(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   uint32_t *id_p)
{
    const zs_layout_bucket_t *b;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_param");
    if (status != ZC_OK) {
        return status;
    }
    b = &session->layout->buckets[bucket];
    if (i >= b->n_params) {
        return zc_fail(ZC_ERR_INVALID,
                       "bucket_param: index %u is not below bucket %u's %u "
                       "params",
                       i, bucket, b->n_params);
    }
    if (id_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_param: id_p is NULL");
    }
    *id_p = session->layout->params[b->first_param + i].id;
    return ZC_OK;
}

ZC_API int zc_session_bucket_piece(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   zc_bucket_piece_t *piece_p)
{
    zs_layout_piece_t pc;
    int status;

    status = zc_session_check_bucket(session, bucket, "bucket_piece");
    if (status != ZC_OK) {
        return status;
    }
    if (i >= session->layout->buckets[bucket].n_params) {
        return zc_fail(ZC_ERR_INVALID, "bucket_piece: index %u is not below bucket %u's %u pieces",
                       i, bucket, session->layout->buckets[bucket].n_params);
    }
    if (piece_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "bucket_piece: piece_p is NULL");
    }
    zs_layout_bucket_piece(session->layout, bucket, i, &pc);
    piece_p->id = session->layout->params[pc.param].id;
    piece_p->param_offset = pc.param_offset;
    piece_p->slot_offset = pc.bucket_offset;
    piece_p->numel = pc.numel;
    return ZC_OK;
}

ZC_API void *zc_session_grads_ptr(zc_session_t *session)
{
    if (zc_session_check_attached(session, "grads_ptr") != ZC_OK) {
        return NULL;
    }
    if (session->stage != 1) {
        zc_fail(ZC_ERR_STATE, "grads_ptr: stage %u has no full-gradient region", session->stage);
        return NULL;
    }
    return session->grads.addr;
}

ZC_API void *zc_session_param_grad_ptr(zc_session_t *session, uint32_t id)
{
    uint8_t *grads = zc_session_grads_ptr(session);

    if (grads == NULL || zc_session_check_param(session, id, "param_grad_ptr") != ZC_OK) {
        return NULL;
    }
    return grads + zs_layout_param_by_id(session->layout, id)->offset * session->gsize;
}
