/*
 * libzc: the zerod client library. docs/semantics.md in zerod's sources says what a step
 * computes; docs/request-flow.md follows these calls through the daemon.
 *
 * A trainer opens a session on its local daemon's socket, attaches a job (layout + DeepSpeed
 * JSON config), writes the initial parameter values into the shared params region (fresh job)
 * or finds the job's current values there (resumed job), and then, each step:
 *   - stage 2: for each bucket, acquires a gradient slot, writes the bucket's gradients into it
 *     (zero-copy: the slot is shared memory) and submits it;
 *   - stage 1: accumulates gradients into the full-gradient region (zc_session_grads_ptr);
 *   - at the accumulation boundary, steps; the params region then holds the new values.
 * A daemon on the CUDA backend shares its regions as device memory instead of host memory:
 * the same calls and offsets, with device addresses (zc_session_memory).
 *
 * Errors: every function returns ZC_OK (0) or a negative status whose name zc_status_name()
 * gives (the values are zerod's wire status codes); zc_last_error() returns a message for the
 * last failure in the calling thread. The library never prints.
 *
 * Timeouts: every call that waits for the daemon has a deadline: the session's timeout_ms
 * (zc_open_params_t) or a per-call value; ZC_ERR_TIMEOUT when it passes. The default is 60000
 * ms, raised to twice the daemon's peer deadline (max(mesh_timeout, collective_timeout) +
 * heartbeat_timeout, told at Hello) plus 10 s, so that a lost or hung peer is reported as
 * ZC_ERR_PEER_LOST naming its rank before a call gives up on its own. A timeout_ms the caller
 * sets is used as given.
 *
 * Thread safety: a zc_session_t is not thread-safe; use it from one thread at a time (calls
 * may come from different threads if the caller serializes them). Distinct sessions are
 * independent. zc_last_error() is per thread.
 */
#ifndef ZEROD_ZC_H
#define ZEROD_ZC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ZC_API __attribute__((visibility("default")))
#else
#define ZC_API
#endif

/* zerod's version (the build checks these against the project's); zc_version() at run time. */
#define ZC_VERSION_MAJOR 0
#define ZC_VERSION_MINOR 1
#define ZC_VERSION_PATCH 0

/* The socket a session opens when neither zc_open_params_t nor $ZEROD_SOCKET names one. */
#define ZC_DEFAULT_SOCKET "/run/zerod/zerod-cpu0.sock"

/* Status codes: zerod's wire values (common/include/zs/status.h, ZS_STATUS_MAP); libzc's build
 * checks each against that table. zc_status_name() gives the name without "ZC_". */
#define ZC_OK                  0
#define ZC_ERR_NO_MEMORY       (-1)
#define ZC_ERR_INVALID         (-2)
#define ZC_ERR_IO              (-3)
#define ZC_ERR_NOT_FOUND       (-4)
#define ZC_ERR_EXISTS          (-5)
#define ZC_ERR_BUSY            (-6)
#define ZC_ERR_TIMEOUT         (-7)
#define ZC_ERR_UNSUPPORTED     (-8)
#define ZC_ERR_OVERFLOW        (-9)
#define ZC_ERR_LIMIT           (-10)
#define ZC_ERR_PERMISSION      (-11)
#define ZC_ERR_PROTOCOL        (-20)
#define ZC_ERR_VERSION         (-21)
#define ZC_ERR_FRAME_TOO_LARGE (-22)
#define ZC_ERR_CLOSED          (-23)
#define ZC_ERR_CONFIG          (-30)
#define ZC_ERR_LAYOUT_MISMATCH (-31)
#define ZC_ERR_STATE           (-32)
#define ZC_ERR_LOSS_SCALE      (-33)
#define ZC_ERR_JOB_ENDED       (-34)
#define ZC_ERR_PEER_LOST       (-40)
#define ZC_ERR_ABORTED         (-41)
#define ZC_ERR_AUTH            (-42)
#define ZC_ERR_UNREACHABLE     (-43)
#define ZC_ERR_UCX             (-44)
#define ZC_ERR_CUDA            (-50)
#define ZC_ERR_NCCL            (-51)
#define ZC_ERR_NO_DEVICE       (-52)

/* Element types: zerod's (common/include/zs/dtype.h, ZS_DTYPE_MAP), checked the same way. */
typedef enum zc_dtype {
    ZC_DTYPE_F32 = 0,
    ZC_DTYPE_F16 = 1,
    ZC_DTYPE_BF16 = 2,
} zc_dtype_t;

typedef struct zc_session zc_session_t;

/* ---- open ---------------------------------------------------------------------------- */

enum {
    ZC_OPEN_FIELD_SOCKET_PATH = 1u << 0,
    ZC_OPEN_FIELD_TIMEOUT_MS = 1u << 1,
    ZC_OPEN_FIELD_CONTROL = 1u << 2,
};

typedef struct zc_open_params {
    uint64_t field_mask;
    const char *socket_path; /* default: $ZEROD_SOCKET, else ZC_DEFAULT_SOCKET */
    int timeout_ms;          /* default deadline of every call; see "Timeouts" above */
    int control;             /* 1: open with the control role (status only), as zeroctl */
} zc_open_params_t;

/* Connect and exchange Hello. ZC_ERR_UNREACHABLE when nothing listens on the socket;
 * ZC_ERR_TIMEOUT when its daemon accepts nothing (stopped: its listen backlog full) or does not
 * answer Hello within timeout_ms. */
ZC_API int zc_session_open(const zc_open_params_t *params, zc_session_t **session_p);
/* Close the connection and unmap the regions; NULL is a no-op. Closing without a detach
 * leaves the job on the daemon for job_linger (a new session may re-attach). */
ZC_API void zc_session_close(zc_session_t *session);
/* Close the connection only: the regions stay mapped (memory views of them stay valid) until
 * zc_session_close, and every later call to the daemon gets ZC_ERR_CLOSED. For a trainer that
 * re-attaches in place after a lost daemon (zc_session_replicated): the daemon drops this
 * session's attach, a new session re-attaches the job, and the trainer moves its views to the
 * new regions before it closes this one. NULL is a no-op. */
ZC_API void zc_session_disconnect(zc_session_t *session);

/* ---- attach -------------------------------------------------------------------------- */

typedef struct zc_group {
    uint32_t n_params;
    const uint64_t *numel;    /* [n_params], registration order */
    const char *options_json; /* NULL, or {"lr":..,"weight_decay":..,"betas":[..],"eps":..} */
} zc_group_t;

/* A parameter's name and shape, kept in checkpoints (zc_checkpoint_save, `zeroctl export`). */
#define ZC_MAX_DIMS 8
typedef struct zc_param_info {
    const char *name; /* as the model's state_dict(); NULL or "": "param.<id>" */
    uint32_t ndim;    /* 0: a 1-D shape of numel */
    uint64_t dims[ZC_MAX_DIMS];
} zc_param_info_t;

enum {
    ZC_ATTACH_FIELD_JOB_ID = 1u << 0,
    ZC_ATTACH_FIELD_RANK = 1u << 1,
    ZC_ATTACH_FIELD_WORLD = 1u << 2,
    ZC_ATTACH_FIELD_COORDINATOR = 1u << 3,
    ZC_ATTACH_FIELD_DTYPE = 1u << 4,
    ZC_ATTACH_FIELD_GROUPS = 1u << 5,
    ZC_ATTACH_FIELD_CONFIG_JSON = 1u << 6,
    ZC_ATTACH_FIELD_PARAM_INFO = 1u << 7,
    ZC_ATTACH_FIELD_RESUME = 1u << 8, /* resume and restart */
    ZC_ATTACH_FIELD_OWN_SLICES = 1u << 9,
};

/* What an attach does with a job the daemon keeps for a re-attach: one whose trainer went
 * without ending it (crashed, killed, or detached with end_job = 0) within job_linger. Only a
 * job of the same id is ever re-attached or replaced; a daemon holding another job, or one with
 * a live trainer, answers ZC_ERR_BUSY naming it, its age and `zeroctl job end`. The daemon
 * decides, so that every rank of a job decides alike (docs/design-notes.md "A job's life"). */
typedef enum zc_resume {
    ZC_RESUME_IF_KEPT = 0, /* re-attach it when its layout and config match (the default) */
    ZC_RESUME_AUTO = 1,    /* re-attach it only when restart is 1 or its trainer detached keeping
                              it, and its layout and config match; otherwise a new job replaces
                              it (the daemon logs the replaced job's id and step) */
    ZC_RESUME_NEVER = 2,   /* a new job always replaces it */
    ZC_RESUME_MUST = 3,    /* re-attach it; ZC_ERR_NOT_FOUND when the daemon keeps none */
} zc_resume_t;

typedef struct zc_attach_params {
    uint64_t field_mask;
    const char *job_id;      /* required */
    uint32_t rank;           /* default 0 */
    uint32_t world;          /* default 1 */
    const char *coordinator; /* host:port of rank 0's daemon; required when world > 1 */
    zc_dtype_t dtype;        /* default ZC_DTYPE_F32 */
    uint32_t n_groups;       /* required, >= 1 */
    const zc_group_t *groups;
    const char *config_json;           /* default "{}" */
    const zc_param_info_t *param_info; /* optional: one per parameter, registration order */
    zc_resume_t resume;                /* default ZC_RESUME_IF_KEPT */
    int restart;                       /* 1: the launcher says this process is a restart
                                          (torchrun's TORCHELASTIC_RESTART_COUNT > 0) */
    int own_slices_only;               /* 1: a fresh job's initial values are written with
                                          zc_session_init_param(), which writes only this rank's
                                          slices when the region is shared; the daemons of one
                                          host may then give all its ranks one params region
                                          (zc_session_params_shared) */
} zc_attach_params_t;

/* The coordinator of a world > 1 job ("host:port" of rank 0's daemon) from a launcher's
 * environment: ZEROD_COORDINATOR when set, else MASTER_ADDR and MASTER_PORT + 1. The daemons
 * never take MASTER_PORT itself: under torchrun, or with torch.distributed initialised, torch's
 * own store listens there. ZC_ERR_NOT_FOUND when the environment names none;
 * ZC_ERR_INVALID (naming the variable) for a bad port. */
ZC_API int zc_coordinator_from_env(char *buf, size_t len);

typedef struct zc_attach_info {
    uint64_t layout_hash;
    uint64_t step;     /* last completed optimizer step */
    int resumed;       /* 1: the params region already holds the job's values */
    double loss_scale; /* scale for the next backward */
    uint32_t stage;    /* 1 or 2 */
    uint32_t gradient_accumulation_steps;
    uint32_t n_params;
    uint32_t n_buckets;
    uint32_t n_slots;
    uint64_t total_numel; /* params region elements (bucket-padded) */
} zc_attach_info_t;

/* Attach the job, map the shared regions. A fresh job (info.resumed == 0) must then have its
 * initial values written at zc_session_param_ptr() (or, with own_slices_only, through
 * zc_session_init_param()) and be confirmed with
 * zc_session_params_ready(). With fp32 parameters the params region is the daemon's fp32
 * master itself (no second copy): a later write into it changes the master (weights loaded
 * after attach); with 16-bit parameters follow such a write with zc_session_params_reload().
 * A daemon on the CUDA backend sends device regions,
 * imported here on its GPU: ZC_ERR_UNSUPPORTED when libzc was built without CUDA,
 * ZC_ERR_NO_DEVICE when this process sees no GPU, ZC_ERR_CUDA when the driver refuses. */
ZC_API int zc_session_attach(zc_session_t *session, const zc_attach_params_t *params,
                             zc_attach_info_t *info_p);
ZC_API int zc_session_params_ready(zc_session_t *session);
/* Once the job has its parameters (after zc_session_params_ready, or on a resumed attach), the
 * trainer wrote new values into the params region (weights loaded after attach): the daemon
 * loads its fp32 master shard from them again, keeping Adam's moments and the step. Every
 * rank's trainer writes the same values and calls it before its next step; with fp32
 * parameters the region is the master already, and the call tells the daemon (whose buddy
 * replica, with replication = buddy, must take the write too). */
ZC_API int zc_session_params_reload(zc_session_t *session);
/* After an attach: the kept job it replaced and why ("job 'x' at step 12, kept 40 s: ..."), or
 * "" (never NULL). */
ZC_API const char *zc_session_replaced(zc_session_t *session);
/* After an attach: the config keys the daemon accepted but does not use, as a comma list of
 * dotted keys ("" when none; never NULL): a trainer should tell its user. */
ZC_API const char *zc_session_ignored_keys(zc_session_t *session);
/* After an attach: DeepSpeed's batch triple as the daemon resolved it from the config and the
 * world (train_batch_size = micro x gradient_accumulation_steps x world); 0 for both when the
 * config gives no batch size. Either pointer may be NULL. */
ZC_API int zc_session_batch(zc_session_t *session, uint32_t *train_batch_p, uint32_t *micro_p);
/* Stage 1: the dtype of the full-gradient region, where micro-steps are summed: the config's
 * data_types.grad_accum_dtype, by default the session dtype (as in DeepSpeed), or fp32. */
ZC_API zc_dtype_t zc_session_grads_dtype(zc_session_t *session);
/* 1 when, at zc_session_params_ready(), the daemons (config checkpoint_dir) resumed the job from
 * their last checkpoint instead: the params region holds its values, *step_p its step and
 * *loss_scale_p its scale (either may be NULL); 0 otherwise. */
ZC_API int zc_session_restored(zc_session_t *session, uint64_t *step_p, double *loss_scale_p);
/* After a resume: why the daemons resumed from an older checkpoint than the one latest names
 * (it could not be read or loaded; the message names the file), or "". */
ZC_API const char *zc_session_restore_warning(zc_session_t *session);

/* 1 when every rank of the job on this host maps this one params region (the attach asked for
 * own_slices_only on every rank and the daemons read each other's memory): each daemon writes
 * its rank's slices there, so no all-gather copies them; 0 otherwise. */
ZC_API int zc_session_params_shared(zc_session_t *session);

/* 1 when the attached job keeps a buddy replica of every rank's shard (the daemons run with
 * replication = buddy at world > 1): a daemon lost mid-step costs no step, and a trainer that
 * kept its gradients may re-attach (a new session, after zc_session_disconnect) and send them
 * again; 0 otherwise. */
ZC_API int zc_session_replicated(zc_session_t *session);

/* Where an attached session's regions live (zc_session_memory's values; ipc.proto MemoryKind,
 * zerod's memory types). */
#define ZC_MEMORY_HOST   0 /* shared host memory (a CPU-backend daemon): the CPU reads and writes */
#define ZC_MEMORY_DEVICE 2 /* CUDA device memory (`zerod --device cuda:N`): see below */

/* ZC_MEMORY_HOST or ZC_MEMORY_DEVICE, and the CUDA ordinal of device regions in *device_p (-1
 * for host; device_p may be NULL); ZC_ERR_STATE when the session is not attached, ZC_ERR_INVALID
 * for NULL (*device_p -1). On a device session every region pointer libzc gives
 * (zc_session_param_ptr, a slot's data, zc_session_grads_ptr, zc_session_param_grad_ptr) is a
 * device address on that GPU, for CUDA kernels and copies only, never for the CPU. libzc's own
 * writes there (init_param, slot_fill, the zeroed gaps of an acquired slot) go through CUDA on the
 * calling thread's current device (the attach makes the session's current on its thread) and are
 * complete when the call returns. The trainer's own writes must be complete (its stream
 * synchronized) before it calls zc_session_params_ready, zc_session_slot_submit (the slot's bucket;
 * or use zc_session_slot_submit_event) or zc_session_step (stage 1's grads region); after the step
 * reply the params region holds the new values. fp32 params are still the daemon's master: a
 * write after zc_session_params_ready changes it, as on the host. */
ZC_API int zc_session_memory(zc_session_t *session, int *device_p);

/* A fresh job, before zc_session_params_ready(): parameter `id`'s initial values (numel
 * elements of the session dtype at src) into the params region; the whole parameter, or, when
 * the region is shared, only its elements in this rank's slices (the other ranks write theirs,
 * as an all-gather of each rank's own values would give). ZC_ERR_STATE once the parameters are
 * there. On a device session src may be host or device memory (CUDA tells them apart); device
 * memory must hold its values already (its stream synchronized). */
ZC_API int zc_session_init_param(zc_session_t *session, uint32_t id, const void *src);

/* Parameter `id` (registration index, group-major) inside the params region. */
ZC_API void *zc_session_param_ptr(zc_session_t *session, uint32_t id);
ZC_API uint64_t zc_session_param_numel(zc_session_t *session, uint32_t id);
ZC_API zc_dtype_t zc_session_dtype(zc_session_t *session);
ZC_API size_t zc_dtype_size(zc_dtype_t dtype);
/* "fp32", "fp16", "bf16"; "unknown" for a value that is no zc_dtype_t. */
ZC_API const char *zc_dtype_name(zc_dtype_t dtype);

/* ---- buckets and gradient slots (stage 2) -------------------------------------------- */

/* Buckets are reduce_bucket_size elements of a group's parameters, laid one after another: a
 * parameter that crosses a bucket's end is split, so a bucket holds pieces of parameters. */
typedef struct zc_bucket_info {
    uint32_t group;
    uint32_t n_params; /* parameters with a piece in it (the first and last may be parts) */
    uint64_t numel;    /* elements spanned by its pieces */
    uint64_t padded;   /* elements of its slot image (numel rounded up) */
} zc_bucket_info_t;

ZC_API int zc_session_bucket_info(zc_session_t *session, uint32_t bucket, zc_bucket_info_t *info_p);
/* The first bucket holding (part of) a parameter, and the parameter's element offset inside
 * that bucket's slot image (its first element's). A split parameter continues at offset 0 of
 * the next buckets: zc_session_bucket_piece() says how much of it each holds. */
ZC_API int zc_session_param_bucket(zc_session_t *session, uint32_t id, uint32_t *bucket_p,
                                   uint64_t *offset_p);
/* The i-th parameter (registration id) of a bucket, i < bucket n_params, in layout order. */
ZC_API int zc_session_bucket_param(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   uint32_t *id_p);

/* Piece i (< n_params) of a bucket: elements [param_offset, param_offset + numel) of parameter
 * `id` go to elements [slot_offset, slot_offset + numel) of the bucket's slot image. */
typedef struct zc_bucket_piece {
    uint32_t id;
    uint64_t param_offset;
    uint64_t slot_offset;
    uint64_t numel;
} zc_bucket_piece_t;
ZC_API int zc_session_bucket_piece(zc_session_t *session, uint32_t bucket, uint32_t i,
                                   zc_bucket_piece_t *piece_p);

typedef struct zc_slot {
    uint32_t index;
    uint32_t bucket;
    void *data; /* bucket.padded elements of the session dtype. On acquire the gaps between
                 * parameters and the padding are zero; the caller writes every parameter's
                 * range (zeros for a parameter that got no gradient). */
    size_t bytes;
} zc_slot_t;

/* A free slot for `bucket`; waits (back-pressure) up to timeout_ms (< 0: session default).
 * Slots are taken round the ring (the first free one after the last taken), so with at least
 * buckets x gradient_accumulation_steps slots an accumulation window never takes a slot twice
 * and each keeps its bucket until the step (a job with buddy replicas gets that many on host
 * memory, up to 64: zc_session_replicated). */
ZC_API int zc_session_slot_acquire(zc_session_t *session, uint32_t bucket, int timeout_ms,
                                   zc_slot_t *slot_p);
/* Copy numel elements (session dtype) from src into an acquired slot, from element `offset`
 * of it (a parameter's piece: zc_session_bucket_piece's slot_offset). Large copies stream
 * past the caches where the daemon measured that to be faster (its kernels' plan, received
 * with each step reply; regular stores before the first). On a device session it is a CUDA
 * copy from host or device memory, complete on return. ZC_ERR_INVALID when the range is
 * outside the bucket, ZC_ERR_STATE when the slot is not acquired. */
ZC_API int zc_session_slot_fill(zc_session_t *session, const zc_slot_t *slot, uint64_t offset,
                                const void *src, uint64_t numel);
/* Copy an acquired slot's whole bucket (its padded elements, session dtype) out into dst (host
 * memory), streaming as slot_fill does: a trainer that keeps its window's buckets as it submits
 * them, to send them again after re-attaching in place (zc_session_replicated). Also after the
 * connection closed (the slot stays mapped until zc_session_close). ZC_ERR_STATE when the slot
 * is not acquired, ZC_ERR_INVALID for a NULL dst or a device session. */
ZC_API int zc_session_slot_copy_out(zc_session_t *session, const zc_slot_t *slot, void *dst);
/* How zc_session_slot_fill copies numel elements now: *nt_p 1 for non-temporal stores,
 * *prefetch_p the software prefetch distance in elements (0: none), *planned_p 1 when that
 * is the daemon's plan (0: regular stores, the daemon sent none or one for another kernel
 * variant). Any pointer may be NULL. ZC_ERR_UNSUPPORTED on a device session (CUDA copies). */
ZC_API int zc_session_fill_stores(zc_session_t *session, uint64_t numel, int *nt_p,
                                  unsigned *prefetch_p, int *planned_p);
/* Hand the filled slot to the daemon; returns without waiting for it to be consumed. On a
 * device session the trainer's writes into it must be complete first (zc_session_memory), or
 * use zc_session_slot_submit_event. */
ZC_API int zc_session_slot_submit(zc_session_t *session, const zc_slot_t *slot,
                                  uint32_t micro_step);
/* Device sessions: submit with the handle (cudaIpcEventHandle_t, ZC_EVENT_HANDLE_BYTES) of an
 * interprocess CUDA event recorded on the trainer's stream after its writes into the slot; the
 * daemon waits for the event before it reads the slot, so the trainer's CPU goes on at once.
 * Use one event per slot: the slot's SlotFree comes after the daemon's wait, so the event may
 * be recorded again for the slot's next bucket. event NULL and event_len 0: as slot_submit. */
#define ZC_EVENT_HANDLE_BYTES 64
ZC_API int zc_session_slot_submit_event(zc_session_t *session, const zc_slot_t *slot,
                                        uint32_t micro_step, const void *event, size_t event_len);

/* Stage 1: the full-gradient region (total_numel elements of zc_session_grads_dtype(), the
 * same layout as the params region). The trainer adds each micro-step's gradients; the daemon
 * consumes and zeroes it at the step. NULL in stage 2. */
ZC_API void *zc_session_grads_ptr(zc_session_t *session);
/* Stage 1: parameter `id`'s place in the full-gradient region. NULL in stage 2. */
ZC_API void *zc_session_param_grad_ptr(zc_session_t *session, uint32_t id);

/* ---- step ---------------------------------------------------------------------------- */

enum {
    ZC_STEP_FIELD_GROUP_LR = 1u << 0,
    ZC_STEP_FIELD_TIMEOUT_MS = 1u << 1,
};

typedef struct zc_step_params {
    uint64_t field_mask;
    uint32_t n_group_lr;
    const double *group_lr; /* one per group: learning rates from this step on */
    int timeout_ms;
} zc_step_params_t;

typedef struct zc_step_result {
    uint64_t step;     /* optimizer steps completed */
    int skipped;       /* 1: overflow, parameters unchanged */
    double grad_norm;  /* -1 when not finite */
    double loss_scale; /* for the next backward */
    uint64_t skipped_steps;
} zc_step_result_t;

/* Waits for every submitted slot to be consumed, then steps. params may be NULL. */
ZC_API int zc_session_step(zc_session_t *session, const zc_step_params_t *params,
                           zc_step_result_t *result_p);

/* ---- checkpoints (docs/checkpoints.md) ---------------------------------------------- */

typedef struct zc_checkpoint_params {
    const char *dir;           /* the checkpoint directory (made absolute here) */
    const char *tag;           /* NULL: save "global_step<N>"; load the tag DIR/latest names */
    const void *trainer_state; /* save: bytes stored as TAG/trainer_state.pt by rank 0 */
    size_t trainer_state_len;  /* at most ZC_CHECKPOINT_STATE_MAX */
    int load_optimizer_states; /* load: 1 loads exp_avg, exp_avg_sq and the step; 0 the weights */
    int timeout_ms;            /* <= 0: one hour */
} zc_checkpoint_params_t;

#define ZC_CHECKPOINT_STATE_MAX (12u << 20)

typedef struct zc_checkpoint_info {
    char path[4096]; /* DIR/TAG */
    char tag[128];
    uint64_t step;     /* the job's optimizer step (after a load: the loaded one) */
    double loss_scale; /* load: for the next backward */
    uint32_t saved_world;
    int has_trainer_state; /* load: path/trainer_state.pt exists */
} zc_checkpoint_info_t;

/* Every rank's trainer calls it at the same step (a collective of the job's daemons): each
 * daemon writes its shard, rank 0 commits DIR/TAG and DIR/latest once all are on disk. A
 * failure anywhere leaves the previous checkpoints as they were. info_p may be NULL. With the
 * daemon's checkpoint_async (the default) it returns once every daemon holds a copy of its
 * shard, and the files are written while training goes on: zc_checkpoint_wait() waits for
 * them; a later save or load, and the job's end, wait too. */
ZC_API int zc_checkpoint_save(zc_session_t *session, const zc_checkpoint_params_t *params,
                              zc_checkpoint_info_t *info_p);
/* Every rank: wait until the last save, written in the background (the daemon's
 * checkpoint_async), is on disk and committed; its failure, if any, on every rank. info_p
 * (may be NULL) names that save (empty path: there was none). timeout_ms <= 0: one hour. */
ZC_API int zc_checkpoint_wait(zc_session_t *session, int timeout_ms, zc_checkpoint_info_t *info_p);
/* After zc_session_params_ready(), every rank: load a checkpoint saved at any world size; the
 * params region then holds the loaded weights. */
ZC_API int zc_checkpoint_load(zc_session_t *session, const zc_checkpoint_params_t *params,
                              zc_checkpoint_info_t *info_p);

/* end_job = 1: the daemon drops the job; 0: it keeps it for job_linger. A save still being
 * written is finished before the job is dropped, within this call's deadline (the session's):
 * call zc_checkpoint_wait() first after a large save. */
ZC_API int zc_session_detach(zc_session_t *session, int end_job);

/* ---- device regions (CUDA backend) --------------------------------------------------- */

/* A daemon on the CUDA backend shares its regions as device memory: CUDA virtual-memory
 * allocations exported as file descriptors, sent over the socket like the CPU backend's memfds.
 * zc_device_map_import maps one such fd, of `size` bytes as the daemon created it, on CUDA
 * device `device` in this process, read-write; the pointer is a device address for kernels on
 * that GPU (or a framework's tensor over it). Closes fd on success; on failure the fd stays the
 * caller's. ZC_ERR_UNSUPPORTED when libzc was built without CUDA, ZC_ERR_NO_DEVICE without a
 * GPU, ZC_ERR_CUDA when the driver refuses (zc_last_error() names the call). */
typedef struct zc_device_map zc_device_map_t;

ZC_API int zc_device_map_import(int device, int fd, uint64_t size, zc_device_map_t **map_p);
/* The device address of the mapping; NULL for NULL. */
ZC_API void *zc_device_map_ptr(const zc_device_map_t *map);
/* The bytes asked for at import (the mapping is rounded up to the driver's granularity). */
ZC_API uint64_t zc_device_map_size(const zc_device_map_t *map);
/* Unmap and free; NULL is a no-op. */
ZC_API void zc_device_map_close(zc_device_map_t *map);

/* ---- errors -------------------------------------------------------------------------- */

ZC_API const char *zc_last_error(void);
ZC_API const char *zc_status_name(int status);
ZC_API const char *zc_version(void);

#ifdef __cplusplus
}
#endif

/* The queries of a daemon that zeroctl makes: its status, this rank's shard, its job, its step
 * trace. */
#include "zc_control.h"

#endif
