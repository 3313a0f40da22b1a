/*
 * zs_ckpt: the on-disk checkpoint format of docs/checkpoints.md, shared by the daemon (save,
 * load) and zeroctl (ls, verify, export).
 *
 * A checkpoint is a directory DIR/TAG holding
 *  - manifest.json: format and version, the job, step, world, bucket size and layout inputs,
 *    the parameter list (names, shapes, groups), the loss scaler, and every file's size and
 *    XXH3-64 checksum;
 *  - manifest.xxh3: manifest.json's own XXH3-64 and size, so that no field of it (a step, a
 *    dtype, the loss scaler) changes unnoticed;
 *  - rank_NNNNN.safetensors, one per rank of the saving world: tensors "master", "exp_avg" and
 *    "exp_avg_sq", F32, each that rank's whole shard (the layout, rebuilt from the manifest,
 *    says which (parameter, element range) each shard element holds);
 *  - trainer_state.pt (optional): bytes the trainer of rank 0 handed over (lr scheduler, client
 *    state), stored as they came.
 * DIR/latest holds the tag of the last committed checkpoint.
 *
 * Every file is reached through zs_dir_t (zs/dir.h): relative to an open directory, no link
 * followed, regular files only, never read past the size the manifest gives.
 *
 * safetensors (https://github.com/huggingface/safetensors): 8-byte little-endian header length
 * N, N bytes of JSON (tensor name -> dtype, shape, data_offsets; "__metadata__" -> string map),
 * padded with spaces to a multiple of 8, then the tensors' bytes. The writer streams: header
 * first (sizes are known), then the data in tensor order, checksummed as it goes.
 */
#ifndef ZS_CKPT_H
#define ZS_CKPT_H

#include "zs/dir.h"
#include "zs/dtype.h"
#include "zs/layout.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_CKPT_FORMAT        "zerod-checkpoint"
#define ZS_CKPT_VERSION       2u /* 2: manifest.xxh3 */
#define ZS_CKPT_MANIFEST      "manifest.json"
#define ZS_CKPT_MANIFEST_SUM  "manifest.xxh3"
#define ZS_CKPT_MANIFEST_MAX  (1u << 30)
#define ZS_CKPT_LATEST        "latest"
#define ZS_CKPT_TRAINER_STATE "trainer_state.pt"
#define ZS_CKPT_TMP_PREFIX    ".zerod-tmp-"
#define ZS_CKPT_OLD_PREFIX    ".zerod-old-"
#define ZS_CKPT_MAX_DIMS      8u
#define ZS_CKPT_TAG_MAX       128u
#define ZS_CKPT_NAME_MAX      512u
/* the tensors of a rank file, in file order */
#define ZS_CKPT_N_TENSORS 3u
extern const char *const zs_ckpt_tensor_names[ZS_CKPT_N_TENSORS]; /* master exp_avg exp_avg_sq */

typedef struct zs_ckpt_param {
    char *name;
    uint32_t group;
    uint64_t numel;
    uint32_t ndim;
    uint64_t dims[ZS_CKPT_MAX_DIMS];
} zs_ckpt_param_t;

typedef struct zs_ckpt_file {
    char name[64];
    int32_t rank; /* the rank whose shard it holds; -1 for trainer_state.pt */
    uint64_t bytes;
    uint64_t xxh3;
} zs_ckpt_file_t;

typedef struct zs_ckpt_scaler {
    double cur_scale;
    uint32_t cur_hysteresis;
    int64_t cur_iter, last_overflow_iter;
} zs_ckpt_scaler_t;

typedef struct zs_ckpt_manifest {
    uint32_t version;
    char job_id[128];
    char tag[ZS_CKPT_TAG_MAX];
    uint64_t step, skipped_steps;
    uint32_t world, stage;
    zs_dtype_t dtype;
    uint64_t bucket_size;
    uint32_t elem_align;
    bool round_robin;
    uint64_t layout_hash, config_hash, shard_numel;
    bool optimizer_states; /* exp_avg and exp_avg_sq hold the moments (not zeros) */
    zs_ckpt_scaler_t scaler;
    uint32_t n_groups;
    uint32_t *group_n_params; /* [n_groups] */
    char **group_options;     /* [n_groups]: JSON object text or NULL */
    uint32_t n_params;
    zs_ckpt_param_t *params; /* [n_params], registration (group-major) order */
    uint32_t n_files;
    zs_ckpt_file_t *files; /* [n_files]: rank files in rank order, then the others */
} zs_ckpt_manifest_t;

/* Allocate the arrays of a manifest for n_groups groups and n_params parameters (zeroed). */
zs_status_t zs_ckpt_manifest_alloc(zs_ckpt_manifest_t *m, uint32_t n_groups, uint32_t n_params,
                                   uint32_t n_files);
/* Write d/manifest.json and d/manifest.xxh3 (replacing them), fsync'd. */
zs_status_t zs_ckpt_manifest_write(const zs_dir_t *d, const zs_ckpt_manifest_t *m, char *err,
                                   size_t errlen);
/* Read d/manifest.json and trust it only when all of it verifies: its checksum is manifest.xxh3's,
 * every field parses, and its layout_hash is the hash of the layout its fields give. *m_p is
 * freed with zs_ckpt_manifest_free. Errors name the file and the field: ZS_ERR_NOT_FOUND (no
 * manifest), ZS_ERR_VERSION (a newer format), ZS_ERR_IO (unreadable, edited, malformed). */
zs_status_t zs_ckpt_manifest_read(const zs_dir_t *d, zs_ckpt_manifest_t **m_p, char *err,
                                  size_t errlen);
/* d/manifest.json as it is, unverified (`zeroctl checkpoint seal`, which makes it trusted). */
zs_status_t zs_ckpt_manifest_read_unsealed(const zs_dir_t *d, zs_ckpt_manifest_t **m_p, char *err,
                                           size_t errlen);
void zs_ckpt_manifest_free(zs_ckpt_manifest_t *m);
/* The layout the manifest's world saved with (zs_layout_destroy frees it). */
zs_status_t zs_ckpt_layout(const zs_ckpt_manifest_t *m, zs_layout_t **layout_p, char *err,
                           size_t errlen);
/* snprintf for paths and names: false (out holds a truncated string) when it did not fit. */
bool zs_ckpt_pathf(char *out, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "rank_NNNNN.safetensors" */
void zs_ckpt_rank_file(uint32_t rank, char *name, size_t len);
/* The file entry named `name`, or NULL. */
const zs_ckpt_file_t *zs_ckpt_find_file(const zs_ckpt_manifest_t *m, const char *name);

/* A tag is a plain name: no '/', not "." or "..", not starting with '.', not "latest", at most
 * ZS_CKPT_TAG_MAX - 1 bytes. */
zs_status_t zs_ckpt_tag_check(const char *tag, char *err, size_t errlen);
/* The tag: `tag`, or the one dir/latest names when tag is NULL or "". */
zs_status_t zs_ckpt_resolve(const zs_dir_t *dir, const char *tag, char *tag_out, size_t taglen,
                            char *err, size_t errlen);
/* Open the checkpoint dir/TAG (TAG as zs_ckpt_resolve gives it; tag_out may be NULL). */
zs_status_t zs_ckpt_open(const zs_dir_t *dir, const char *tag, zs_dir_t *ckpt, char *tag_out,
                         size_t taglen, char *err, size_t errlen);

/* XXH3-64 of the first `bytes` bytes of fd (shown: for messages); stops early on cancel. */
zs_status_t zs_ckpt_hash_fd(int fd, uint64_t bytes, const zs_cancel_t *cancel, const char *shown,
                            uint64_t *xxh3_p, char *err, size_t errlen);
/* Size and XXH3-64 of the regular file d/name of at most max bytes. */
zs_status_t zs_ckpt_hash_file(const zs_dir_t *d, const char *name, uint64_t max,
                              const zs_cancel_t *cancel, uint64_t *bytes_p, uint64_t *xxh3_p,
                              char *err, size_t errlen);
/* Check file fe of the checkpoint ckpt against its manifest entry (size, then checksum). */
zs_status_t zs_ckpt_verify_file(const zs_dir_t *ckpt, const zs_ckpt_file_t *fe,
                                const zs_cancel_t *cancel, char *err, size_t errlen);
/* A name two of the parameters share, or NULL when every name is distinct. */
const char *zs_ckpt_duplicate_name(const zs_ckpt_param_t *params, uint32_t n);
/* Check every file the manifest lists (trainer_state.pt too) against it. */
zs_status_t zs_ckpt_verify(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                           const zs_cancel_t *cancel, char *err, size_t errlen);
/* A name zerod writes inside a checkpoint directory. */
bool zs_ckpt_own_file(const char *name);
/* Is dir/name a checkpoint zerod wrote (a directory whose manifest.json parses as one)? */
bool zs_ckpt_is_checkpoint(const zs_dir_t *dir, const char *name);
/* Remove the checkpoint directory dir/name (or a temporary one): only when everything in it
 * is a file zerod writes there, and (with a cred) it is the cred's. */
zs_status_t zs_ckpt_remove(const zs_dir_t *dir, const char *name, char *err, size_t errlen);

/* ---- reading shards by (parameter, element range) ---------------------------------------- */

/* The runs of saved elements that parameter `id`'s elements [a, a + n) occupy in the shards of
 * `layout` (the saving world's): fn(arg, rank, shard_off, len, dst_off) for each, in order,
 * dst_off counting from 0 at element a. */
typedef zs_status_t (*zs_ckpt_run_fn)(void *arg, uint32_t rank, uint64_t shard_off, uint64_t len,
                                      uint64_t dst_off, char *err, size_t errlen);
zs_status_t zs_ckpt_runs(const zs_layout_t *layout, uint32_t id, uint64_t a, uint64_t n,
                         zs_ckpt_run_fn fn, void *arg, char *err, size_t errlen);

/* The saved ranks' files of the checkpoint ckpt (its descriptor is duplicated), opened on
 * first use and checked against the manifest's sizes. */
typedef struct zs_ckpt_reader zs_ckpt_reader_t;
zs_status_t zs_ckpt_reader_open(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                                zs_ckpt_reader_t **rd_p, char *err, size_t errlen);
/* Open saved rank `rank`'s file now and check its tensors (reads open it on first use). */
zs_status_t zs_ckpt_reader_open_rank(zs_ckpt_reader_t *rd, uint32_t rank, char *err, size_t errlen);
/* n fp32 elements of tensor t (index into zs_ckpt_tensor_names) of saved rank `rank` from
 * shard offset shard_off. */
zs_status_t zs_ckpt_reader_read(zs_ckpt_reader_t *rd, unsigned t, uint32_t rank, uint64_t shard_off,
                                float *dst, uint64_t n, char *err, size_t errlen);
void zs_ckpt_reader_close(zs_ckpt_reader_t *rd);

/* ---- safetensors ---------------------------------------------------------------------- */

typedef struct zs_st_meta {
    const char *name;
    zs_dtype_t dtype;
    uint32_t ndim;
    const uint64_t *dims;
} zs_st_meta_t;

typedef struct zs_st_writer zs_st_writer_t;
/* Create d/name (zs_dir_create: new, for d's cred) and write the header of n tensors
 * (metadata: NULL, or n_kv key/value pairs). The caller then zs_st_put()s every tensor's bytes
 * in order. */
zs_status_t zs_st_create(const zs_dir_t *d, const char *name, const zs_st_meta_t *tensors,
                         unsigned n, const char *const *metadata, unsigned n_kv,
                         zs_st_writer_t **w_p, char *err, size_t errlen);
zs_status_t zs_st_put(zs_st_writer_t *w, const void *data, size_t bytes, char *err, size_t errlen);
/* Check every byte came, fsync, close; size and checksum of the whole file out (NULL: not
 * wanted). On error the file is left for the caller to remove. Frees w either way. */
zs_status_t zs_st_finish(zs_st_writer_t *w, uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                         size_t errlen);
/* Abandon a writer (the file stays). */
void zs_st_abort(zs_st_writer_t *w);

typedef struct zs_st_file zs_st_file_t;
/* Open the regular file d/name of exactly `bytes` bytes and read its header. */
zs_status_t zs_st_open(const zs_dir_t *d, const char *name, uint64_t bytes, zs_st_file_t **f_p,
                       char *err, size_t errlen);
/* Tensor `name`: dtype, element count, and the file offset of its first byte. */
zs_status_t zs_st_find(const zs_st_file_t *f, const char *name, zs_dtype_t *dtype_p,
                       uint64_t *numel_p, uint64_t *offset_p, char *err, size_t errlen);
zs_status_t zs_st_pread(const zs_st_file_t *f, uint64_t offset, void *dst, size_t bytes, char *err,
                        size_t errlen);
void zs_st_close(zs_st_file_t *f);

#ifdef __cplusplus
}
#endif
#endif
