/*
 * The runner's results as replies (rpc/rpc.h, zd_rpc_result): an attach's reply with its regions'
 * fds, a step's, the shard's info, a checkpoint's, a slot freed; the session's slots follow.
 */
#define _GNU_SOURCE
#include "rpc/rpc_int.h"
#include "rpc/rpc_reply.h"

#include "config/daemon_config.h"
#include "zs/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- results ------------------------------------------------------------------------------------
 */

static void zd_rpc_attach_reply(zd_rpc_session_t *s, const zd_resp_t *resp,
                                Zerod__Ipc__V1__AttachReply *ar)
{
    const zd_attach_out_t *a = &resp->u.attach;

    if (resp->status != ZS_OK) {
        return;
    }
    ar->layout_hash = a->layout_hash;
    ar->step = a->step;
    ar->resumed = a->resumed;
    ar->loss_scale = a->loss_scale;
    ar->n_slots = a->n_slots;
    ar->slot_bytes = a->slot_bytes;
    ar->params_bytes = a->params_bytes;
    ar->grads_bytes = a->grads_bytes;
    ar->stage = a->stage;
    ar->gradient_accumulation_steps = a->gradient_accumulation_steps;
    ar->config_hash = a->config_hash;
    ar->bucket_size = a->bucket_size;
    ar->round_robin = a->round_robin;
    ar->elem_align = a->elem_align;
    ar->params_are_master = a->params_are_master;
    ar->params_shared = a->params_shared;
    ar->replicated = a->replicated;
    ar->memory = a->memory == ZS_MEM_DEVICE ? ZEROD__IPC__V1__MEMORY_KIND__MEMORY_DEVICE
                                            : ZEROD__IPC__V1__MEMORY_KIND__MEMORY_HOST;
    ar->device = a->device;
    ar->ignored_keys = (char *)a->ignored_keys;
    ar->train_batch_size = a->train_batch_size;
    ar->train_micro_batch_size = a->micro_batch_size;
    ar->grads_dtype = (Zerod__Ipc__V1__DType)a->grads_dtype;
    ar->replaced = (char *)a->replaced;
    s->n_slots = a->n_slots;
    s->slot_busy = 0;
    s->holds_job = true;
}

static void zd_rpc_shard_reply(const zd_shard_out_t *o, Zerod__Ipc__V1__ShardInfoReply *si,
                               Zerod__Ipc__V1__GroupShard *groups,
                               Zerod__Ipc__V1__GroupShard **group_ptrs)
{
    si->job_id = (char *)o->job_id;
    si->rank = o->rank;
    si->world = o->world;
    si->total_numel = o->total_numel;
    si->param_numel = o->param_numel;
    si->shard_numel = o->shard_numel;
    si->n_buckets = o->n_buckets;
    si->max_bucket_numel = o->max_bucket_numel;
    si->bucket_size = o->bucket_size;
    si->layout_hash = o->layout_hash;
    si->master_sumsq = o->master_sumsq;
    si->training_config = o->training_config != NULL ? o->training_config : "";
    for (uint32_t g = 0; g < o->n_groups; g++) {
        const zd_group_shard_t *in = &o->groups[g];
        zerod__ipc__v1__group_shard__init(&groups[g]);
        groups[g].group = g;
        groups[g].n_params = in->n_params;
        groups[g].n_buckets = in->n_buckets;
        groups[g].flat_offset = in->flat_offset;
        groups[g].flat_numel = in->flat_numel;
        groups[g].shard_offset = in->shard_offset;
        groups[g].shard_numel = in->shard_numel;
        groups[g].lr = in->lr;
        groups[g].weight_decay = in->weight_decay;
        group_ptrs[g] = &groups[g];
    }
    si->n_groups = o->n_groups;
    si->groups = group_ptrs;
}

/* Pack the frame of a result; an AttachReply carries the job's fds. */
static zd_reply_t *zd_rpc_pack_result(zd_resp_t *resp, const zd_frame_t *f)
{
    zd_reply_t *reply = zd_rpc_pack(f);

    if (reply != NULL && resp->kind == ZD_REQ_ATTACH && resp->status == ZS_OK) {
        memcpy(reply->fds, resp->u.attach.fds, sizeof(reply->fds));
        reply->n_fds = resp->u.attach.n_fds;
        resp->u.attach.n_fds = 0; /* the reply owns them now */
    }
    return reply;
}

static zd_reply_t *zd_rpc_encode_shard(const zd_resp_t *resp, Zerod__Ipc__V1__Result *r)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ShardInfoReply si = ZEROD__IPC__V1__SHARD_INFO_REPLY__INIT;
    Zerod__Ipc__V1__GroupShard *groups = NULL;
    Zerod__Ipc__V1__GroupShard **ptrs = NULL;
    zd_reply_t *reply;
    uint32_t n = resp->status == ZS_OK ? resp->u.shard.n_groups : 0;

    if (n > 0) {
        groups = calloc(n, sizeof(*groups));
        ptrs = calloc(n, sizeof(*ptrs));
        if (groups == NULL || ptrs == NULL) {
            free(groups);
            free(ptrs);
            return NULL;
        }
        zd_rpc_shard_reply(&resp->u.shard, &si, groups, ptrs);
    }
    si.result = r;
    f.seq = resp->seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY;
    f.shard_info_reply = &si;
    reply = zd_rpc_pack(&f);
    free(groups);
    free(ptrs);
    return reply;
}

static zd_reply_t *zd_rpc_encode_ckpt(const zd_resp_t *resp, Zerod__Ipc__V1__Result *r)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__CheckpointSaveReply sr = ZEROD__IPC__V1__CHECKPOINT_SAVE_REPLY__INIT;
    Zerod__Ipc__V1__CheckpointLoadReply lr = ZEROD__IPC__V1__CHECKPOINT_LOAD_REPLY__INIT;
    Zerod__Ipc__V1__ExportReply er = ZEROD__IPC__V1__EXPORT_REPLY__INIT;
    const zd_ckpt_out_t *o = &resp->u.ckpt;

    f.seq = resp->seq;
    if (resp->kind == ZD_REQ_EXPORT) {
        er.result = r;
        er.path = (char *)o->path;
        er.step = o->step;
        er.n_tensors = o->saved_world;
        er.bytes = o->bytes;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_EXPORT_REPLY;
        f.export_reply = &er;
    } else if (resp->kind != ZD_REQ_CKPT_LOAD) { /* save and wait */
        sr.result = r;
        sr.path = (char *)o->path;
        sr.tag = (char *)o->tag;
        sr.step = o->step;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_SAVE_REPLY;
        f.checkpoint_save_reply = &sr;
    } else {
        lr.result = r;
        lr.path = (char *)o->path;
        lr.tag = (char *)o->tag;
        lr.step = o->step;
        lr.loss_scale = o->loss_scale;
        lr.saved_world = o->saved_world;
        lr.has_trainer_state = o->has_trainer_state;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_CHECKPOINT_LOAD_REPLY;
        f.checkpoint_load_reply = &lr;
    }
    return zd_rpc_pack(&f);
}

/* The reply to a training request (attach, params ready, step, detach), which may change what
 * the connection holds. */
static zd_reply_t *zd_rpc_encode_train(zd_rpc_session_t *s, zd_resp_t *resp,
                                       Zerod__Ipc__V1__Result *r)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__AttachReply ar = ZEROD__IPC__V1__ATTACH_REPLY__INIT;
    Zerod__Ipc__V1__ParamsReadyReply pr = ZEROD__IPC__V1__PARAMS_READY_REPLY__INIT;
    Zerod__Ipc__V1__StepReply sr = ZEROD__IPC__V1__STEP_REPLY__INIT;
    Zerod__Ipc__V1__CopyStores cs = ZEROD__IPC__V1__COPY_STORES__INIT;
    Zerod__Ipc__V1__DetachReply dr = ZEROD__IPC__V1__DETACH_REPLY__INIT;

    f.seq = resp->seq;
    if (resp->kind == ZD_REQ_ATTACH) {
        zd_rpc_attach_reply(s, resp, &ar);
        ar.result = r;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY;
        f.attach_reply = &ar;
    } else if (resp->kind == ZD_REQ_PARAMS_READY) {
        pr.result = r;
        pr.step = resp->u.ckpt.step;
        pr.restored_from = (char *)resp->u.ckpt.path;
        pr.loss_scale = resp->u.ckpt.loss_scale;
        pr.restore_warning = (char *)resp->u.ckpt.warning;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY;
        f.params_ready_reply = &pr;
    } else if (resp->kind == ZD_REQ_STEP) {
        sr.result = r;
        sr.step = resp->u.step.step;
        sr.loss_scale = resp->u.step.loss_scale;
        sr.skipped_steps = resp->u.step.skipped_steps;
        sr.skipped = resp->u.step.skipped;
        sr.grad_norm = resp->u.step.grad_norm;
        sr.copy_stores = zd_rpc_copy_stores(&cs);
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY;
        f.step_reply = &sr;
    } else {            /* ZD_REQ_DETACH */
        s->n_slots = 0; /* the connection holds no job any more */
        s->slot_busy = 0;
        s->holds_job = false;
        dr.result = r;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY;
        f.detach_reply = &dr;
    }
    return zd_rpc_pack_result(resp, &f);
}

/* The one reply of a finished request, built from its response; NULL for none. */
static zd_reply_t *zd_rpc_encode(zd_rpc_session_t *s, zd_resp_t *resp)
{
    Zerod__Ipc__V1__Result r = zd_rpc_result_of(resp->status, resp->msg);

    if (resp->status == ZS_ERR_ABORTED) { /* the daemon stops: the request did not run */
        return zd_rpc_error(resp->seq, resp->status, resp->msg);
    }
    switch (resp->kind) {
    case ZD_REQ_ATTACH:
    case ZD_REQ_PARAMS_READY:
    case ZD_REQ_STEP:
    case ZD_REQ_DETACH:
        return zd_rpc_encode_train(s, resp, &r);
    case ZD_REQ_BUCKET_READY:
        if (resp->u.slot_free.slot < ZD_MAX_SLOTS) {
            s->slot_busy &= ~(1ull << resp->u.slot_free.slot);
        }
        return zd_rpc_slot_free(resp->seq, resp->u.slot_free.slot, resp->u.slot_free.bucket,
                                resp->status, resp->msg);
    case ZD_REQ_SHARD_INFO:
        return zd_rpc_encode_shard(resp, &r);
    case ZD_REQ_CKPT_SAVE:
    case ZD_REQ_CKPT_WAIT:
    case ZD_REQ_CKPT_LOAD:
    case ZD_REQ_EXPORT:
        return zd_rpc_encode_ckpt(resp, &r);
    case ZD_REQ_JOB_END: /* rpc/rpc_job.c */
        return zd_rpc_job_end_reply(resp, &r);
    case ZD_REQ_DISCONNECT:
        break;
    }
    return NULL;
}

zd_reply_t *zd_rpc_result(zd_rpc_session_t *s, zd_resp_t *resp)
{
    zd_reply_t *reply = zd_rpc_encode(s, resp);

    zd_resp_free(resp);
    return reply;
}
