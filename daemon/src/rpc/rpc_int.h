/*
 * Shared by the files of rpc (rpc/rpc.c, rpc/rpc_result.c, rpc/rpc_job.c, rpc/rpc_stores.c,
 * rpc/rpc_trace.c): never included elsewhere.
 */
#ifndef ZD_RPC_INT_H
#define ZD_RPC_INT_H

#include "rpc/rpc_check.h"
#include "rpc/rpc_types.h"

struct zd_rpc_session {
    uint64_t conn_id;
    zs_cred_t cred; /* SO_PEERCRED, SO_PEERGROUPS */
    bool has_cred;  /* false: unknown (no request naming a directory is accepted) */
    int32_t pid;    /* SO_PEERCRED; 0 when unknown */
    zd_role_t role;
    uint32_t n_slots;   /* given by the attach; 0 when no job is attached */
    uint64_t slot_busy; /* bit s: slot s has a BucketReady in flight */
    bool holds_job;     /* an attach succeeded and no detach followed */
    bool keepalive;     /* Hello.keepalive: StillWorking while a request is in progress */
};

/* ---- rpc_reply.c: the one place each reply is framed ------------------------------------------
 */

/* The length prefix and the packed frame, in a new reply (NULL on allocation failure). */
zd_reply_t *zd_rpc_pack(const zd_frame_t *frame);
/* A Result pointing at msg (not copied). */
Zerod__Ipc__V1__Result zd_rpc_result_of(zs_status_t status, const char *msg);
/* A SlotFree for seq: slot back, bucket done (or refused: status and msg). */
zd_reply_t *zd_rpc_slot_free(uint64_t seq, uint32_t slot, uint32_t bucket, zs_status_t status,
                             const char *msg);

/* ---- rpc_request.c: frames to runner requests ------------------------------------------------ */

/* The runner request of a checked frame; takes the frame and fd (its directory, or -1). */
zs_status_t zd_rpc_request(zd_rpc_session_t *s, zd_frame_t *f, int fd, zd_req_t **req_p, char *err,
                           size_t errlen);

/* ---- rpc/rpc_job.c: the operator's job control
 * --------------------------------------------------- */

/* JobListReply, from what the runner last published: at once, like Status. */
zd_reply_t *zd_rpc_job_list(const zd_rpc_t *rpc, uint64_t seq);
/* JobEndReply of a runner result (r: its Result). */
zd_reply_t *zd_rpc_job_end_reply(const zd_resp_t *resp, Zerod__Ipc__V1__Result *r);

/* ---- rpc/rpc_stores.c: the kernels' copy plan, for the trainer
 * ----------------------------------- */

/* cs filled from this process's measured store plan (zk_store_plan_measured): cs, or NULL
 * while the plan is not measured yet. */
Zerod__Ipc__V1__CopyStores *zd_rpc_copy_stores(Zerod__Ipc__V1__CopyStores *cs);

/* ---- rpc/rpc_trace.c: the step trace
 * ------------------------------------------------------------- */

/* TraceReply, from the trace's ring (rpc->trace): at once, like Status. */
zd_reply_t *zd_rpc_trace(const zd_rpc_t *rpc, const zd_frame_t *f);

#endif
