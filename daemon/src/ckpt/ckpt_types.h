/*
 * What a checkpoint request says and what it answers (docs/checkpoints.md): plain types that the
 * runner's requests carry, apart from ckpt/ckpt.h's API.
 */
#ifndef ZD_CKPT_TYPES_H
#define ZD_CKPT_TYPES_H

#include "zs/dir.h"
#include "zs/dtype.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest checkpoint directory path a request may name. */
#define ZD_CKPT_DIR_MAX 3800u

/* CheckpointSave / CheckpointLoad. */
typedef struct zd_ckpt_req {
    const char *dir;           /* absolute, as the client named it: for messages */
    int dir_fd;                /* that directory, opened by the client (the request's: closed
                                * with it); -1: the daemon's own, opened by path */
    const zs_cred_t *cred;     /* whose rights dir_fd is used with (zs/dir.h); NULL: the
                                * daemon's own */
    zs_cancel_t cancel;        /* loads and verifies stop when the daemon stops */
    const char *tag;           /* NULL or "": global_step<N> (save), DIR/latest (load) */
    const void *trainer_state; /* save, rank 0: stored as trainer_state.pt; may be NULL */
    size_t trainer_state_len;
    bool load_optimizer_states;
    uint32_t keep_last; /* save: keep the newest keep_last checkpoints of dir; 0 keeps all */
    bool async;         /* save: reply once every rank holds a staging copy (checkpoint_async) */
    bool keep_staging;  /* async: keep the copy's memory for the next save */
    bool latest_onward; /* save: leave latest as it is when it names a later step (the
                         * daemon's automatic saves; a trainer's save moves it, as DeepSpeed's) */
} zd_ckpt_req_t;

typedef struct zd_ckpt_out {
    char path[4096];
    char tag[128];
    uint64_t step;
    double loss_scale;
    uint32_t saved_world;
    bool has_trainer_state;
    uint64_t bytes;     /* export: the file's size (saved_world: its tensor count) */
    char warning[1024]; /* a resume: why it is not from the checkpoint latest names, or "" */
} zd_ckpt_out_t;

/* ExportRequest (control role). */
typedef struct zd_export_req {
    const char *path;      /* absolute, for messages; its last component is the file's name */
    int dir_fd;            /* path's directory, opened by the requester (the request's) */
    const zs_cred_t *cred; /* the requester's: the file is created with its rights, for it */
    zs_dtype_t dtype;
} zd_export_req_t;

#endif
