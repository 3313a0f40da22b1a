/*
 * Shared by the files of ckpt/ (ckpt_save.c, ckpt_agree.c, ckpt_async.c, ckpt_load.c,
 * ckpt_export.c, ckpt_own.c): never included elsewhere.
 */
#ifndef ZD_CKPT_INT_H
#define ZD_CKPT_INT_H

#include "ckpt/ckpt.h"
#include "zs/error.h"
#include "zs/log.h"

typedef struct zd_ckpt_async zd_ckpt_async_t;

struct zd_ckpt {
    uint64_t seq;           /* saves so far, agreed by the ranks at each save */
    zd_ckpt_async_t *async; /* a save being written in the background (ckpt_async.c) */
    float *stage;           /* checkpoint_staging_keep: the last save's copy, for the next */
    size_t stage_bytes;
};

/* ---- ckpt_agree.c ------------------------------------------------------------------------ */

/* Every rank's file size and checksum (files[world]) to every rank. */
zs_status_t zd_ckpt_gather_sums(const zd_ckpt_shard_t *sh, uint64_t bytes, uint64_t xxh3,
                                zs_ckpt_file_t *files, char *err, size_t errlen);
/* Rank from's text (at most max bytes) and a number, head, to every rank (a collective): out
 * gets the text, *head_p (may be NULL) the number; why says what failed. */
zs_status_t zd_ckpt_share_text(const zd_ckpt_shard_t *sh, uint32_t from, double head,
                               const char *text, size_t max, double *head_p, char *out,
                               size_t outlen, char *why, size_t wlen);
/* ck->seq: which save this is, rank 0's count, the same on every rank. */
zs_status_t zd_ckpt_number(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, char *err, size_t errlen);

/* ---- ckpt_save.c: the pieces of a save both ways share ------------------------------------ */

/* The request's directory for `want` (zs/dir.h): the client's descriptor, or the daemon's own
 * directory by path. */
zs_status_t zd_ckpt_open_dir(const zd_ckpt_req_t *req, int want, zs_dir_t *dir, char *err,
                             size_t errlen);
/* ".zerod-tmp-TAG": where a save of TAG is written before its commit. */
#define ZD_CKPT_TMP_NAME_MAX (ZS_CKPT_TAG_MAX + 16)
void zd_ckpt_tmp_name(const char *tag, char *name, size_t len);
/* This rank's file into tmp: from stage (master, m, v one after another), or, stage NULL, from
 * the shard itself. */
zs_status_t zd_ckpt_write_rank(const zd_ckpt_shard_t *sh, const float *stage, uint64_t step,
                               const zs_dir_t *tmp, uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                               size_t errlen);
/* The manifest of a save as the shard stands now, without its files (added once written); borrows
 * the shard's names, shapes and group options. */
zs_status_t zd_ckpt_manifest_head(const zd_ckpt_shard_t *sh, const char *tag,
                                  zs_ckpt_manifest_t *m);
/* What rank 0's trainer hands over (zd_ckpt_req_t.trainer_state) is the bytes of
 * trainer_state.pt, or a bundle of them and module.safetensors (the module's tied names and
 * buffers): "ZDBUNDL1", trainer_state.pt's size (8 bytes, little-endian), its bytes, then
 * module.safetensors to the end (docs/checkpoints.md). */
#define ZD_CKPT_MODULE "module.safetensors"
/* Rank 0's files beside the rank files, as written (size and checksum each). */
typedef struct zd_ckpt_state_sums {
    bool has_state, has_module;
    uint64_t state_bytes, state_xxh3, module_bytes, module_xxh3;
} zd_ckpt_state_sums_t;
/* Rank 0: the trainer's bytes (len of them; NULL: none) into tmp, as one file or two. */
zs_status_t zd_ckpt_write_state(const zs_dir_t *tmp, const void *bytes, size_t len,
                                zd_ckpt_state_sums_t *sums, char *err, size_t errlen);
zs_status_t zd_ckpt_manifest_finish(zs_ckpt_manifest_t *m, const zs_dir_t *tmp,
                                    const zs_ckpt_file_t *files, const zd_ckpt_state_sums_t *sums,
                                    char *err, size_t errlen);
void zd_ckpt_manifest_release(zs_ckpt_manifest_t *m);
/* Rank 0: the directory made ready, the temporary directory created. */
zs_status_t zd_ckpt_prepare(const zs_dir_t *dir, const char *tag, zs_dir_t *tmp, char *err,
                            size_t errlen);
/* Rank 0: the temporary directory becomes dir/tag, then latest names it (onward: unless it
 * names a later step than `step`). */
zs_status_t zd_ckpt_commit(const char *job_id, uint64_t step, bool onward, const zs_dir_t *dir,
                           const char *tag, const zs_dir_t *tmp, char *err, size_t errlen);
/* A committed checkpoint of a job: its tag and step. */
typedef struct zd_ckpt_entry {
    char tag[ZS_CKPT_TAG_MAX];
    uint64_t step;
} zd_ckpt_entry_t;
/* The checkpoints of job_id in dir whose manifest verifies, by tag and step (*n_p of them, in
 * directory order; NULL and 0 when none, or when dir cannot be read). */
zd_ckpt_entry_t *zd_ckpt_list_job(const zs_dir_t *dir, const char *job_id, size_t *n_p);
/* Rank 0 after a commit: keep the newest keep_last of this job's checkpoints. */
void zd_ckpt_prune(const zs_dir_t *dir, const char *job_id, const char *keep_tag,
                   uint32_t keep_last);
/* The shard's master, m and v one after another into stage (3 x shard_numel floats of host
 * memory), from the host or the device. */
zs_status_t zd_ckpt_stage_copy(const zd_ckpt_shard_t *sh, float *stage);

/* ---- ckpt_async.c: saves written in the background ---------------------------------------- */

/* Stage this rank's shard and start its writer, which waits for release (every rank staged)
 * or cancel. */
zs_status_t zd_ckpt_async_start(zd_ckpt_t *ck, const zd_ckpt_shard_t *sh, const zd_ckpt_req_t *req,
                                const char *tag, const zs_dir_t *dir, const zs_dir_t *tmp,
                                char *err, size_t errlen);
void zd_ckpt_async_release(zd_ckpt_t *ck);
void zd_ckpt_async_cancel(zd_ckpt_t *ck);
/* Join the writer (none: ZS_OK and an empty out). */
zs_status_t zd_ckpt_async_join(zd_ckpt_t *ck, zd_ckpt_out_t *out, char *err, size_t errlen);

#endif
