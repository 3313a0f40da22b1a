/*
 * The engine: one thread that owns the job and runs every trainer and control request in
 * arrival order (design.md §3). The libuv loop thread decodes frames and hands them over; the
 * engine computes and queues replies; the loop sends them. The loop never waits on the engine.
 */
#ifndef ZD_ENGINE_H
#define ZD_ENGINE_H

#include "job.h"
#include "zerod/ipc/v1/ipc.pb-c.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZD_IPC_PROTOCOL 1
#define ZD_MAX_FRAME    (16u << 20)

typedef Zerod__Ipc__V1__Frame zd_frame_t;

typedef struct zd_engine zd_engine_t;

/* A reply for the loop to send on connection conn_id. */
typedef struct zd_reply {
    struct zd_reply *next;
    uint64_t conn_id;
    uint8_t *buf; /* 4-byte length + packed Frame */
    size_t len;
    int fds[3]; /* sent with SCM_RIGHTS, closed by the loop after sending */
    int n_fds;
    int slot_freed;   /* >= 0: this reply frees that slot of the connection */
    uint32_t n_slots; /* > 0 on a successful attach: the connection's slot count */
    bool detached;    /* the connection no longer holds a job */
} zd_reply_t;

void zd_reply_free(zd_reply_t *reply);

typedef struct zd_engine_params {
    uint32_t bucket_slots;
    uint64_t max_shard_bytes;
    uint64_t job_linger_ns;
    unsigned threads;
    const char *device;
    const char *socket_path;
    const char *token_file; /* mesh authentication (world > 1) */
    uint64_t mesh_timeout_ns;
    uint64_t collective_timeout_ns;
    uint64_t heartbeat_interval_ns;
    uint64_t heartbeat_timeout_ns;
    bool direct_collectives;
    void (*notify)(void *arg); /* replies are ready (called from the engine thread) */
    void *notify_arg;
} zd_engine_params_t;

zs_status_t zd_engine_create(const zd_engine_params_t *params, zd_engine_t **engine_p);
/* Joins the thread; call after zd_engine_shutdown. NULL is a no-op. */
void zd_engine_destroy(zd_engine_t *engine);

/* Hand a decoded request over (the engine frees it). */
void zd_engine_submit(zd_engine_t *engine, uint64_t conn_id, zd_frame_t *request);
/* The connection closed: a trainer's partial micro-step is dropped and the job lingers. */
void zd_engine_disconnect(zd_engine_t *engine, uint64_t conn_id);
/* Replies ready to send, oldest first; the caller frees each with zd_reply_free. */
zd_reply_t *zd_engine_take_replies(zd_engine_t *engine);
/* Finish the request in progress, fail the queued ones with ERR_ABORTED, stop the thread. */
void zd_engine_shutdown(zd_engine_t *engine);
/* True once the thread has stopped and every reply was queued. */
bool zd_engine_stopped(zd_engine_t *engine);

/* What Status reports. The engine thread publishes it whenever it changes, and says what it is
 * busy with, so that the loop answers Status at once even while the engine is occupied for
 * long (forming a mesh, waiting for a peer, a step on a big shard). */
typedef struct zd_engine_status {
    uint64_t start_ns;
    bool has_job;
    char job_id[ZD_JOB_ID_MAX];
    uint32_t rank, world, stage;
    zs_dtype_t dtype;
    uint64_t step, skipped_steps;
    double loss_scale, grad_norm;
    bool trainer_attached;
    uint64_t param_numel, layout_hash;
    char collectives[256];
    uint64_t mem_bytes[ZD_MEM_COUNT], mem_formula[ZD_MEM_COUNT];
    char activity[256]; /* what the engine is doing; "" when it waits for work */
    uint64_t activity_since_ns;
} zd_engine_status_t;

/* A copy of the last published status (any thread). */
void zd_engine_status_get(zd_engine_t *engine, zd_engine_status_t *status_p);

/* Reloadable settings (SIGHUP). */
void zd_engine_set_limits(zd_engine_t *engine, uint64_t max_shard_bytes, uint64_t job_linger_ns);

/* Pack a frame with its length prefix into a new reply. NULL on allocation failure. */
zd_reply_t *zd_reply_pack(uint64_t conn_id, const zd_frame_t *frame);

#endif
