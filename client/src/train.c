/*
 * The trainer's calls of zc_session: gradient slots (acquire, fill, submit), the step and
 * detach. SlotFree frames come back through zc_session_read whichever call reads them. Part
 * of zc_session (session_int.h).
 */
#define _GNU_SOURCE
#include "session_int.h"

#include "zs/dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- slots ------------------------------------------------------------------------- */

/* Zero elements [from, to) of a slot image: memset, or CUDA's for a device session. */
static int zc_slot_zero(const zc_session_t *s, uint8_t *data, uint64_t from, uint64_t to)
{
    if (s->mem == ZS_MEM_DEVICE) {
        return zc_dev_zero(s, data + from * s->dsize, (size_t)(to - from) * s->dsize,
                           "slot_acquire");
    }
    memset(data + from * s->dsize, 0, (size_t)(to - from) * s->dsize);
    return ZC_OK;
}

/* Zero the alignment gaps between the bucket's params and its tail padding; a device
 * session's zeros are in place when this returns. */
static int zc_slot_zero_gaps(const zc_session_t *s, uint32_t bucket, uint8_t *data)
{
    const zs_layout_bucket_t *b = &s->layout->buckets[bucket];
    uint64_t pos = 0;
    int status = ZC_OK;

    for (uint32_t i = 0; i < b->n_params && status == ZC_OK; i++) {
        zs_layout_piece_t pc; /* the first and last may be parts of split parameters */
        zs_layout_bucket_piece(s->layout, bucket, i, &pc);
        if (pc.bucket_offset > pos) {
            status = zc_slot_zero(s, data, pos, pc.bucket_offset);
        }
        pos = pc.bucket_offset + pc.numel > pos ? pc.bucket_offset + pc.numel : pos;
    }
    if (status == ZC_OK && b->padded > pos) {
        status = zc_slot_zero(s, data, pos, b->padded);
    }
    if (status == ZC_OK && s->mem == ZS_MEM_DEVICE) {
        status = zc_dev_fence(s, "slot_acquire");
    }
    return status;
}

/* The first free slot from slot_next on, round the ring: a slot taken is not taken again
 * before every other slot was, so with at least buckets x gradient_accumulation_steps slots
 * (every slot free after a step) an accumulation window never reuses one, and its slots keep
 * its buckets until the step (zc_session_slot_acquire). */
static int zc_slot_find_free(zc_session_t *s)
{
    for (uint32_t k = 0; k < s->n_slots; k++) {
        uint32_t i = (s->slot_next + k) % s->n_slots;

        if (s->slot_rec[i].state == ZC_SLOT_FREE) {
            s->slot_next = (i + 1) % s->n_slots;
            return (int)i;
        }
    }
    return -1;
}

/* Read frames until a submitted slot comes back (or the deadline passes). */
static int zc_session_wait_slot_free(zc_session_t *s, zs_deadline_t deadline)
{
    uint32_t before = s->n_outstanding;
    zc_frame_t *f = NULL;
    int status;

    while (s->n_outstanding == before) {
        status = zc_session_read(s, deadline, &f);
        if (status != ZC_OK) {
            return status;
        }
        if (f != NULL) {
            status = zc_fail(ZC_ERR_PROTOCOL,
                             "unexpected %s frame (seq %llu) while waiting for "
                             "a SlotFree",
                             zc_body_name(f->body_case), (unsigned long long)f->seq);
            zerod__ipc__v1__frame__free_unpacked(f, NULL);
            return zc_session_broken(s, status);
        }
    }
    return ZC_OK;
}

ZC_API int zc_session_slot_acquire(zc_session_t *session, uint32_t bucket, int timeout_ms,
                                   zc_slot_t *slot_p)
{
    zc_session_t *s = session;
    zs_deadline_t deadline;
    uint8_t *data;
    int status;
    int idx;

    zc_error_clear();
    status = zc_session_check_bucket(s, bucket, "slot_acquire");
    if (status == ZC_OK) {
        status = zc_session_check_ready(s, "slot_acquire");
    }
    if (status != ZC_OK) {
        return status;
    }
    if (slot_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "slot_acquire: slot_p is NULL");
    }
    if (s->stage != 2) {
        return zc_fail(ZC_ERR_STATE,
                       "slot_acquire: stage %u has no gradient slots; add "
                       "gradients at zc_session_grads_ptr()",
                       s->stage);
    }
    deadline = zc_deadline(s, timeout_ms);
    while ((idx = zc_slot_find_free(s)) < 0) {
        if (s->n_outstanding == 0) {
            return zc_fail(ZC_ERR_STATE,
                           "slot_acquire: all %u slots are acquired and none is "
                           "submitted",
                           s->n_slots);
        }
        status = zc_session_wait_slot_free(s, deadline);
        if (status == ZC_ERR_TIMEOUT) {
            return zc_fail(status,
                           "slot_acquire: no slot came back within the deadline "
                           "(%u submitted)",
                           s->n_outstanding);
        }
        if (status != ZC_OK) {
            return status;
        }
    }
    data = (uint8_t *)s->slots.addr + (size_t)idx * s->slot_bytes;
    status = zc_slot_zero_gaps(s, bucket, data);
    if (status != ZC_OK) {
        return status; /* the slot stays free */
    }
    s->slot_rec[idx].state = ZC_SLOT_ACQUIRED;
    s->slot_rec[idx].bucket = bucket;
    s->slot_rec[idx].seq = 0;
    slot_p->index = (uint32_t)idx;
    slot_p->bucket = bucket;
    slot_p->data = data;
    slot_p->bytes = (size_t)(s->layout->buckets[bucket].padded * s->dsize);
    return ZC_OK;
}

/* `slot` is one of this session's slots, acquired for its bucket and not submitted (the
 * connection may be closed since): *rec_p is its record. Errors are named after `what`. */
static int zc_slot_check_held(zc_session_t *s, const zc_slot_t *slot, const char *what,
                              zc_slot_rec_t **rec_p)
{
    if (slot == NULL || slot->index >= s->n_slots) {
        return zc_fail(ZC_ERR_INVALID, "%s: not a slot of this session", what);
    }
    *rec_p = &s->slot_rec[slot->index];
    if ((*rec_p)->state != ZC_SLOT_ACQUIRED || (*rec_p)->bucket != slot->bucket) {
        return zc_fail(ZC_ERR_STATE, "%s: slot %u is not acquired for bucket %u", what, slot->index,
                       slot->bucket);
    }
    return ZC_OK;
}

/* The same, on an attached session whose connection is open. */
static int zc_slot_check_acquired(zc_session_t *s, const zc_slot_t *slot, const char *what,
                                  zc_slot_rec_t **rec_p)
{
    int status = zc_session_check_attached(s, what);

    return status != ZC_OK ? status : zc_slot_check_held(s, slot, what, rec_p);
}

ZC_API int zc_session_slot_fill(zc_session_t *session, const zc_slot_t *slot, uint64_t offset,
                                const void *src, uint64_t numel)
{
    zc_session_t *s = session;
    zc_slot_rec_t *rec;
    uint64_t padded;
    uint8_t *dst;
    zk_exec_t ex;
    int status;

    zc_error_clear();
    status = zc_slot_check_acquired(s, slot, "slot_fill", &rec);
    if (status != ZC_OK) {
        return status;
    }
    padded = s->layout->buckets[rec->bucket].padded;
    if (offset > padded || numel > padded - offset || (src == NULL && numel > 0)) {
        return zc_fail(ZC_ERR_INVALID,
                       "slot_fill: elements [%llu, %llu + %llu) of bucket %u (%llu elements)%s",
                       (unsigned long long)offset, (unsigned long long)offset,
                       (unsigned long long)numel, rec->bucket, (unsigned long long)padded,
                       src == NULL && numel > 0 ? ": src is NULL" : " are outside it");
    }
    dst =
        (uint8_t *)s->slots.addr + (size_t)slot->index * s->slot_bytes + (size_t)offset * s->dsize;
    if (s->mem == ZS_MEM_DEVICE) { /* src on the host or the device; in place on return */
        status = zc_dev_copy(s, dst, src, (size_t)(numel * s->dsize), "slot_fill");
        return status == ZC_OK ? zc_dev_fence(s, "slot_fill") : status;
    }
    ex = zc_copy_exec(&s->copy, numel * s->dsize);
    if (zk_cast(&ex, dst, (zs_dtype_t)s->dtype, src, (zs_dtype_t)s->dtype, (size_t)numel) !=
        ZS_OK) {
        return zc_fail(ZC_ERR_INVALID, "slot_fill: %s", zk_last_error());
    }
    return ZC_OK;
}

ZC_API int zc_session_slot_copy_out(zc_session_t *session, const zc_slot_t *slot, void *dst)
{
    zc_session_t *s = session;
    zc_slot_rec_t *rec;
    uint64_t padded;
    zk_exec_t ex;
    int status;

    zc_error_clear();
    if (s == NULL || !s->attached) {
        return zc_fail(ZC_ERR_STATE, "slot_copy_out: the session is not attached to a job");
    }
    status = zc_slot_check_held(s, slot, "slot_copy_out", &rec);
    if (status != ZC_OK) {
        return status;
    }
    if (s->mem == ZS_MEM_DEVICE || dst == NULL) {
        return zc_fail(ZC_ERR_INVALID, "slot_copy_out: %s",
                       dst == NULL ? "dst is NULL" : "a device session's slot (host memory only)");
    }
    padded = s->layout->buckets[rec->bucket].padded;
    ex = zc_copy_exec(&s->copy, padded * s->dsize);
    if (zk_cast(&ex, dst, (zs_dtype_t)s->dtype,
                (const uint8_t *)s->slots.addr + (size_t)slot->index * s->slot_bytes,
                (zs_dtype_t)s->dtype, (size_t)padded) != ZS_OK) {
        return zc_fail(ZC_ERR_INVALID, "slot_copy_out: %s", zk_last_error());
    }
    return ZC_OK;
}

ZC_API int zc_session_fill_stores(zc_session_t *session, uint64_t numel, int *nt_p,
                                  unsigned *prefetch_p, int *planned_p)
{
    zk_exec_t ex;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "fill_stores");
    if (status != ZC_OK) {
        return status;
    }
    if (session->mem == ZS_MEM_DEVICE) {
        return zc_fail(ZC_ERR_UNSUPPORTED,
                       "fill_stores: a device session (cuda:%d) has no store plan: its "
                       "slot_fill copies with CUDA",
                       session->device);
    }
    ex = zc_copy_exec(&session->copy,
                      numel > UINT64_MAX / session->dsize ? UINT64_MAX : numel * session->dsize);
    if (nt_p != NULL) {
        *nt_p = ex.stores == ZK_STORES_NT;
    }
    if (prefetch_p != NULL) {
        *prefetch_p = ex.prefetch > 0 ? (unsigned)ex.prefetch : 0;
    }
    if (planned_p != NULL) {
        *planned_p = session->copy.valid;
    }
    return ZC_OK;
}

ZC_API int zc_session_slot_submit(zc_session_t *session, const zc_slot_t *slot, uint32_t micro_step)
{
    return zc_session_slot_submit_event(session, slot, micro_step, NULL, 0);
}

ZC_API int zc_session_slot_submit_event(zc_session_t *session, const zc_slot_t *slot,
                                        uint32_t micro_step, const void *event, size_t event_len)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    zc_session_t *s = session;
    zc_slot_rec_t *rec;
    int status;

    zc_error_clear();
    status = zc_slot_check_acquired(s, slot, "slot_submit", &rec);
    if (status != ZC_OK) {
        return status;
    }
    if (micro_step >= s->accum_steps) {
        return zc_fail(ZC_ERR_INVALID,
                       "slot_submit: micro_step %u is not below "
                       "gradient_accumulation_steps %u",
                       micro_step, s->accum_steps);
    }
    if (event_len != 0 &&
        (event == NULL || event_len != ZC_EVENT_HANDLE_BYTES || s->mem != ZS_MEM_DEVICE)) {
        return zc_fail(ZC_ERR_INVALID,
                       "slot_submit: an event of %zu bytes%s (a device session's interprocess "
                       "CUDA event handle has %d)",
                       event_len, s->mem != ZS_MEM_DEVICE ? " on a host session" : "",
                       ZC_EVENT_HANDLE_BYTES);
    }
    br.slot = slot->index;
    br.bucket = slot->bucket;
    br.micro_step = micro_step;
    br.event.data = (uint8_t *)event;
    br.event.len = event_len;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
    req.bucket_ready = &br;
    req.seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, &req, -1, zc_deadline(s, -1));
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    rec->state = ZC_SLOT_SUBMITTED;
    rec->seq = req.seq;
    s->n_outstanding++;
    return ZC_OK;
}

/* ---- step / detach ----------------------------------------------------------------- */

static int zc_session_drain(zc_session_t *s, zs_deadline_t deadline, const char *what);

int zc_session_prepare_call(zc_session_t *s, int timeout_ms, const char *what)
{
    int status = zc_session_check_ready(s, what);

    return status == ZC_OK ? zc_session_drain(s, zc_deadline(s, timeout_ms), what) : status;
}

static int zc_session_drain(zc_session_t *s, zs_deadline_t deadline, const char *what)
{
    int status;

    while (s->n_outstanding > 0) {
        status = zc_session_wait_slot_free(s, deadline);
        if (status != ZC_OK) {
            return zc_fail_prefix(status, what);
        }
    }
    return ZC_OK;
}

/* The Step message from the caller's params (NULL: none), and its deadline's timeout_ms; every
 * acquired slot must have been submitted. */
static int zc_step_prepare(const zc_session_t *s, const zc_step_params_t *params,
                           Zerod__Ipc__V1__Step *st, int *timeout_ms_p)
{
    uint64_t mask = params ? params->field_mask : 0;

    if (mask & ZC_STEP_FIELD_GROUP_LR) {
        if (params->n_group_lr != s->layout->n_groups || params->group_lr == NULL) {
            return zc_fail(ZC_ERR_INVALID, "step: %u learning rates for %u groups",
                           params->n_group_lr, s->layout->n_groups);
        }
        st->n_group_lr = params->n_group_lr;
        st->group_lr = (double *)params->group_lr;
    }
    *timeout_ms_p = (mask & ZC_STEP_FIELD_TIMEOUT_MS) ? params->timeout_ms : -1;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        if (s->slot_rec[i].state == ZC_SLOT_ACQUIRED) {
            return zc_fail(ZC_ERR_STATE,
                           "step: slot %u was acquired for bucket %u but never "
                           "submitted",
                           i, s->slot_rec[i].bucket);
        }
    }
    return ZC_OK;
}

static void zc_step_result_fill(const Zerod__Ipc__V1__StepReply *sr, zc_step_result_t *r)
{
    r->step = sr->step;
    r->skipped = sr->skipped ? 1 : 0;
    r->grad_norm = sr->grad_norm;
    r->loss_scale = sr->loss_scale;
    r->skipped_steps = sr->skipped_steps;
}

/* The step does not go through zc_session_call: one deadline covers the drain of the slots and
 * the reply, and the reply's copy plan is taken whatever its Result says. */
ZC_API int zc_session_step(zc_session_t *session, const zc_step_params_t *params,
                           zc_step_result_t *result_p)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Step st = ZEROD__IPC__V1__STEP__INIT;
    const Zerod__Ipc__V1__StepReply *sr;
    zc_session_t *s = session;
    zc_frame_t *reply = NULL;
    zs_deadline_t deadline;
    int timeout_ms = -1;
    int status;

    zc_error_clear();
    status = zc_session_check_ready(s, "step");
    if (status == ZC_OK) {
        status = zc_step_prepare(s, params, &st, &timeout_ms);
    }
    if (status != ZC_OK) {
        return status;
    }
    deadline = zc_deadline(s, timeout_ms);
    status = zc_session_drain(s, deadline, "step");
    if (status != ZC_OK) {
        return status;
    }
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
    req.step = &st;
    req.seq = zc_conn_next_seq(&s->conn);
    status = zc_conn_send(&s->conn, &req, -1, deadline);
    if (status != ZC_OK) {
        return zc_session_broken(s, status);
    }
    status =
        zc_session_wait_reply(s, req.seq, ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY, deadline, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "step");
    }
    sr = reply->step_reply;
    zc_copy_plan_take(&s->copy, sr->copy_stores);
    status = zc_result_status(sr->result, "step");
    if (status == ZC_OK && result_p != NULL) {
        zc_step_result_fill(sr, result_p);
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    return status;
}

ZC_API int zc_session_detach(zc_session_t *session, int end_job)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Detach dt = ZEROD__IPC__V1__DETACH__INIT;
    zc_frame_t *reply = NULL;
    zs_deadline_t deadline;
    int status;

    zc_error_clear();
    status = zc_session_check_attached(session, "detach");
    if (status != ZC_OK) {
        return status;
    }
    deadline = zc_deadline(session, -1);
    status = zc_session_drain(session, deadline, "detach");
    if (status != ZC_OK) {
        return status;
    }
    dt.end_job = end_job ? 1 : 0;
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH;
    req.detach = &dt;
    status =
        zc_session_call(session, &req, ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY, -1, NULL, &reply);
    if (status != ZC_OK) {
        return zc_fail_prefix(status, "detach");
    }
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    zc_session_unmap(session);
    return ZC_OK;
}
