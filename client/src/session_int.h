/*
 * libzc internals of a session, shared by the files that make up zc_session (session.c: the
 * connection, frames and requests; attach.c: attach, ParamsReady and the region maps;
 * layout.c: the layout queries; train.c: slots, step and detach; device.c: CUDA copies into
 * device regions). Nothing else includes it: the rest of libzc goes through zc_int.h.
 */
#ifndef ZC_SESSION_INT_H
#define ZC_SESSION_INT_H

#include "zc_int.h"

#include "zk/cuda_share.h"
#include "zs/layout.h"
#include "zs/mem.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum zc_slot_state {
    ZC_SLOT_FREE = 0,
    ZC_SLOT_ACQUIRED, /* handed to the caller, being filled */
    ZC_SLOT_SUBMITTED /* BucketReady sent, SlotFree not yet received */
} zc_slot_state_t;

typedef struct zc_slot_rec {
    zc_slot_state_t state;
    uint32_t bucket;
    uint64_t seq; /* BucketReady seq while submitted */
} zc_slot_rec_t;

struct zc_session {
    zc_conn_t conn;
    int timeout_ms;
    bool
        timeout_set; /* the caller chose timeout_ms: the daemon's peer deadline does not raise it */
    int control;
    char socket_path[108];
    zc_daemon_info_t daemon;

    /* attached job */
    bool attached;
    bool resumed;
    bool params_ready; /* fresh job: ParamsReady acknowledged */
    bool restored;     /* ParamsReady: the daemons resumed from their checkpoint_dir */
    uint64_t restored_step;
    double restored_scale;
    /* ParamsReadyReply.restore_warning: why not from the checkpoint latest names, or "" */
    char restore_warning[1024];
    char ignored_keys[256]; /* AttachReply.ignored_keys */
    char replaced[512];     /* AttachReply.replaced */
    bool params_are_master; /* fp32: the params region is the daemon's master */
    bool params_shared;     /* one params region for the host's ranks: write only our slices */
    bool replicated;        /* AttachReply.replicated: buddy replicas of every shard */
    uint32_t rank;
    zs_layout_t *layout;
    zc_dtype_t dtype;
    size_t dsize;
    zc_dtype_t grads_dtype; /* stage 1's grads region (data_types.grad_accum_dtype) */
    size_t gsize;
    uint32_t train_batch, micro_batch; /* AttachReply: 0 when the config gives none */
    uint32_t stage;
    uint32_t accum_steps;
    uint32_t n_slots;
    uint64_t slot_bytes;
    /* The regions as this process sees them. A device session's (mem ZS_MEM_DEVICE) describe
     * the CUDA mappings below (addr: a device address, fd -1): the same offsets work, but only
     * CUDA may read or write there (zc_dev_*). */
    zs_region_t params;
    zs_region_t slots;
    zs_region_t grads;
    zs_mem_type_t mem; /* ZS_MEM_HOST: memfds mapped; ZS_MEM_DEVICE: CUDA regions imported */
    int device;        /* the CUDA ordinal of device regions; -1 for host */
    zk_cuda_region_t dev_params, dev_slots, dev_grads; /* what a device session releases */
    zc_slot_rec_t *slot_rec;                           /* [n_slots] */
    uint32_t n_outstanding;                            /* slots in ZC_SLOT_SUBMITTED */
    uint32_t slot_next;  /* where zc_session_slot_acquire looks for a free slot first */
    zc_copy_plan_t copy; /* how zc_session_slot_fill copies (the daemon's plan) */

    zc_frame_t *kept[ZC_KEPT_COUNT]; /* the latest control replies (zc_session_keep) */
};

/* The deadline of a call: timeout_ms, or the session's default when < 0. */
zs_deadline_t zc_deadline(const zc_session_t *s, int timeout_ms);
/* A broken connection stays broken: every later call gets ZC_ERR_CLOSED. Returns status. */
int zc_session_broken(zc_session_t *s, int status);
/* ZC_ERR_CLOSED (with the reason) once the connection is closed. */
int zc_session_check_conn(const zc_session_t *s);
/* Unmap the regions (device ones through zk, never munmap) and forget the job (the session
 * stays connected). */
void zc_session_unmap(zc_session_t *s);
/* Device sessions (device.c): bytes from src (host or device memory) to dst in a region, and
 * zeros into one. CUDA may still be writing when they return: a libzc call that writes calls
 * zc_dev_fence before it returns. Errors name `what` and the device. */
int zc_dev_copy(const zc_session_t *s, void *dst, const void *src, size_t bytes, const char *what);
int zc_dev_zero(const zc_session_t *s, void *dst, size_t bytes, const char *what);
/* Wait until every CUDA write libzc made into the session's regions is complete. */
int zc_dev_fence(const zc_session_t *s, const char *what);
/* Read one frame and dispatch SlotFree, StillWorking and ErrorReply; *frame_p is set (and
 * owned by the caller) only for any other frame. */
int zc_session_read(zc_session_t *s, zs_deadline_t deadline, zc_frame_t **frame_p);
/* Read frames until the one of body reply_case that echoes seq. */
int zc_session_wait_reply(zc_session_t *s, uint64_t seq, zc_body_case_t reply_case,
                          zs_deadline_t deadline, zc_frame_t **reply_p);
/* The session is attached to a job (errors named after `what`). */
int zc_session_check_attached(const zc_session_t *s, const char *what);
/* ... and its parameters are there (ParamsReady acknowledged, or a resumed job). */
int zc_session_check_ready(const zc_session_t *s, const char *what);
/* ... and `bucket` is one of its buckets (layout.c). */
int zc_session_check_bucket(zc_session_t *s, uint32_t bucket, const char *what);

#endif
