/*
 * safetensors files (zs/ckpt.h): a streaming writer that checksums what it writes, and a reader
 * that parses the header and preads tensor bytes.
 */
#define _GNU_SOURCE
#include "zs/ckpt.h"
#include "zs/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* A header larger than this is refused when read (safetensors' own limit is 100 MB). */
#define ZS_ST_MAX_HEADER (100u << 20)

static const char *zs_st_dtype_name(zs_dtype_t d)
{
    switch (d) {
    case ZS_DTYPE_F16:
        return "F16";
    case ZS_DTYPE_BF16:
        return "BF16";
    default:
        return "F32";
    }
}

static int zs_st_dtype_parse(const char *s, zs_dtype_t *d)
{
    if (strcmp(s, "F32") == 0) {
        *d = ZS_DTYPE_F32;
    } else if (strcmp(s, "F16") == 0) {
        *d = ZS_DTYPE_F16;
    } else if (strcmp(s, "BF16") == 0) {
        *d = ZS_DTYPE_BF16;
    } else {
        return -1;
    }
    return 0;
}

/* ---- writer --------------------------------------------------------------------------- */

struct zs_st_writer {
    int fd;
    char path[4096];
    XXH3_state_t *hash;
    uint64_t written, total;
};

static zs_status_t zs_st_write_all(zs_st_writer_t *w, const void *data, size_t len, char *err,
                                   size_t errlen)
{
    const char *p = data;

    XXH3_64bits_update(w->hash, data, len);
    while (len > 0) {
        ssize_t n = write(w->fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return zs_errf(err, errlen, ZS_ERR_IO, "writing %s: %s", w->path,
                           n < 0 ? strerror(errno) : "no progress");
        }
        p += n;
        len -= (size_t)n;
        w->written += (uint64_t)n;
    }
    return ZS_OK;
}

/* The header's JSON text, and the data size it describes. */
static char *zs_st_header_json(const zs_st_meta_t *t, unsigned n, const char *const *kv,
                               unsigned n_kv, uint64_t *data_bytes_p)
{
    cJSON *root = cJSON_CreateObject();
    uint64_t off = 0;
    char *text = NULL;

    if (root == NULL) {
        return NULL;
    }
    if (n_kv > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (unsigned i = 0; meta != NULL && i < n_kv; i++) {
            cJSON_AddStringToObject(meta, kv[2 * i], kv[2 * i + 1]);
        }
    }
    for (unsigned i = 0; i < n; i++) {
        cJSON *o = cJSON_AddObjectToObject(root, t[i].name);
        cJSON *shape = o != NULL ? cJSON_AddArrayToObject(o, "shape") : NULL;
        cJSON *offs = o != NULL ? cJSON_AddArrayToObject(o, "data_offsets") : NULL;
        uint64_t numel = 1;

        if (offs == NULL || shape == NULL) {
            goto out;
        }
        cJSON_AddStringToObject(o, "dtype", zs_st_dtype_name(t[i].dtype));
        for (uint32_t d = 0; d < t[i].ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].dims[d]));
            numel *= t[i].dims[d];
        }
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += numel * zs_dtype_size(t[i].dtype);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    text = cJSON_PrintUnformatted(root);
    *data_bytes_p = off;
out:
    cJSON_Delete(root);
    return text;
}

zs_status_t zs_st_create(const zs_dir_t *d, const char *name, const zs_st_meta_t *tensors,
                         unsigned n, const char *const *metadata, unsigned n_kv,
                         zs_st_writer_t **w_p, char *err, size_t errlen)
{
    char path[4096];
    zs_st_writer_t *w = calloc(1, sizeof(*w));
    uint64_t data_bytes = 0, hlen;
    char *json = zs_st_header_json(tensors, n, metadata, n_kv, &data_bytes);
    uint8_t len8[8];
    zs_status_t st;

    *w_p = NULL;
    zs_ckpt_pathf(path, sizeof(path), "%s/%s", d->shown, name);
    if (w == NULL || json == NULL || (w->hash = XXH3_createState()) == NULL) {
        free(json);
        if (w != NULL) {
            XXH3_freeState(w->hash);
        }
        free(w);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "%s: out of memory for the header", path);
    }
    XXH3_64bits_reset(w->hash);
    zs_ckpt_pathf(w->path, sizeof(w->path), "%s", path);
    st = zs_dir_create(d, name, &w->fd, err, errlen);
    if (st != ZS_OK) {
        free(json);
        XXH3_freeState(w->hash);
        free(w);
        return st;
    }
    hlen = (strlen(json) + 7) & ~(uint64_t)7; /* padded with spaces: data 8-byte aligned */
    for (int i = 0; i < 8; i++) {
        len8[i] = (uint8_t)(hlen >> (8 * i));
    }
    st = zs_st_write_all(w, len8, 8, err, errlen);
    if (st == ZS_OK) {
        size_t jl = strlen(json);
        char pad[8] = "        ";
        st = zs_st_write_all(w, json, jl, err, errlen);
        if (st == ZS_OK && hlen > jl) {
            st = zs_st_write_all(w, pad, (size_t)(hlen - jl), err, errlen);
        }
    }
    free(json);
    w->total = 8 + hlen + data_bytes;
    if (st != ZS_OK) {
        zs_st_abort(w);
        return st;
    }
    *w_p = w;
    return ZS_OK;
}

zs_status_t zs_st_put(zs_st_writer_t *w, const void *data, size_t bytes, char *err, size_t errlen)
{
    if (w->written + bytes > w->total) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "%s: %zu bytes more than the header says",
                       w->path, (size_t)(w->written + bytes - w->total));
    }
    return zs_st_write_all(w, data, bytes, err, errlen);
}

zs_status_t zs_st_finish(zs_st_writer_t *w, uint64_t *bytes_p, uint64_t *xxh3_p, char *err,
                         size_t errlen)
{
    zs_status_t st = ZS_OK;

    if (w->written != w->total) {
        st = zs_errf(err, errlen, ZS_ERR_INVALID, "%s: %" PRIu64 " of %" PRIu64 " bytes written",
                     w->path, w->written, w->total);
    } else if (fsync(w->fd) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "fsync of %s: %s", w->path, strerror(errno));
    }
    if (close(w->fd) != 0 && st == ZS_OK) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "closing %s: %s", w->path, strerror(errno));
    }
    if (bytes_p != NULL) {
        *bytes_p = w->written;
    }
    if (xxh3_p != NULL) {
        *xxh3_p = XXH3_64bits_digest(w->hash);
    }
    XXH3_freeState(w->hash);
    free(w);
    return st;
}

void zs_st_abort(zs_st_writer_t *w)
{
    if (w != NULL) {
        close(w->fd);
        XXH3_freeState(w->hash);
        free(w);
    }
}

/* ---- reader --------------------------------------------------------------------------- */

struct zs_st_file {
    int fd;
    char path[4096];
    uint64_t size, data_start;
    cJSON *header;
};

static zs_status_t zs_st_read_header(zs_st_file_t *f, char *err, size_t errlen)
{
    uint8_t len8[8];
    uint64_t hlen = 0;
    char *text;

    if (f->size < 8) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: %" PRIu64 " bytes is too short for safetensors",
                       f->path, f->size);
    }
    if (zs_st_pread(f, 0, len8, 8, err, errlen) != ZS_OK) {
        return ZS_ERR_IO;
    }
    for (int i = 0; i < 8; i++) {
        hlen |= (uint64_t)len8[i] << (8 * i);
    }
    if (hlen > ZS_ST_MAX_HEADER || hlen > f->size - 8) {
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "%s: header length %" PRIu64 " does not fit the file (%" PRIu64 " bytes)",
                       f->path, hlen, f->size);
    }
    text = malloc(hlen + 1);
    if (text == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "%s: out of memory", f->path);
    }
    if (zs_st_pread(f, 8, text, hlen, err, errlen) != ZS_OK) {
        free(text);
        return ZS_ERR_IO;
    }
    text[hlen] = '\0';
    f->header = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(f->header)) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: the safetensors header is not a JSON object",
                       f->path);
    }
    f->data_start = 8 + hlen;
    return ZS_OK;
}

zs_status_t zs_st_open(const zs_dir_t *d, const char *name, uint64_t bytes, zs_st_file_t **f_p,
                       char *err, size_t errlen)
{
    zs_st_file_t *f = calloc(1, sizeof(*f));
    zs_status_t st;

    *f_p = NULL;
    if (f == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory opening %s/%s", d->shown,
                       name);
    }
    f->fd = -1;
    zs_ckpt_pathf(f->path, sizeof(f->path), "%s/%s", d->shown, name);
    st = zs_dir_open_file(d, name, bytes, true, &f->fd, &f->size, err, errlen);
    if (st != ZS_OK) {
        zs_st_close(f);
        return st;
    }
    st = zs_st_read_header(f, err, errlen);
    if (st != ZS_OK) {
        zs_st_close(f);
        return st;
    }
    *f_p = f;
    return ZS_OK;
}

zs_status_t zs_st_find(const zs_st_file_t *f, const char *name, zs_dtype_t *dtype_p,
                       uint64_t *numel_p, uint64_t *offset_p, char *err, size_t errlen)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const cJSON *d;
    uint64_t numel = 1, a, b;

    if (t == NULL) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: no tensor '%s'", f->path, name);
    }
    if (!cJSON_IsString(dt) || zs_st_dtype_parse(dt->valuestring, dtype_p) != 0 ||
        !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "%s: tensor '%s' has no F32/F16/BF16 dtype, shape or data_offsets", f->path,
                       name);
    }
    cJSON_ArrayForEach(d, shape)
    {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0) {
            return zs_errf(err, errlen, ZS_ERR_IO, "%s: tensor '%s' has a bad shape", f->path,
                           name);
        }
        numel *= (uint64_t)d->valuedouble;
    }
    a = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
    b = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
    if (b < a || b - a != numel * zs_dtype_size(*dtype_p) || f->data_start + b > f->size) {
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       ") do not match its shape or the file's %" PRIu64 " bytes",
                       f->path, name, a, b, f->size);
    }
    *numel_p = numel;
    *offset_p = f->data_start + a;
    return ZS_OK;
}

zs_status_t zs_st_pread(const zs_st_file_t *f, uint64_t offset, void *dst, size_t bytes, char *err,
                        size_t errlen)
{
    char *p = dst;

    while (bytes > 0) {
        ssize_t n = pread(f->fd, p, bytes > (1u << 30) ? (1u << 30) : bytes, (off_t)offset);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return zs_errf(err, errlen, ZS_ERR_IO, "reading %s at byte %" PRIu64 ": %s", f->path,
                           offset, n < 0 ? strerror(errno) : "unexpected end of file");
        }
        p += n;
        bytes -= (size_t)n;
        offset += (uint64_t)n;
    }
    return ZS_OK;
}

void zs_st_close(zs_st_file_t *f)
{
    if (f != NULL) {
        if (f->fd >= 0) {
            close(f->fd);
        }
        cJSON_Delete(f->header);
        free(f);
    }
}

/* ---- a checkpoint's rank files -------------------------------------------------------- */

struct zs_ckpt_reader {
    zs_dir_t dir;
    const zs_ckpt_manifest_t *m;
    zs_st_file_t **files;                   /* [world] */
    uint64_t (*offsets)[ZS_CKPT_N_TENSORS]; /* [world] */
};

zs_status_t zs_ckpt_reader_open(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                                zs_ckpt_reader_t **rd_p, char *err, size_t errlen)
{
    zs_ckpt_reader_t *rd = calloc(1, sizeof(*rd));
    zs_status_t st;

    *rd_p = NULL;
    if (rd == NULL || (rd->files = calloc(m->world, sizeof(*rd->files))) == NULL ||
        (rd->offsets = calloc(m->world, sizeof(*rd->offsets))) == NULL) {
        if (rd != NULL) {
            rd->dir = (zs_dir_t)ZS_DIR_INIT;
            rd->m = m;
        }
        zs_ckpt_reader_close(rd);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory reading %s", ckpt->shown);
    }
    rd->m = m;
    st = zs_dir_dup(ckpt, &rd->dir, err, errlen);
    if (st != ZS_OK) {
        rd->dir = (zs_dir_t)ZS_DIR_INIT;
        zs_ckpt_reader_close(rd);
        return st;
    }
    *rd_p = rd;
    return ZS_OK;
}

zs_status_t zs_ckpt_reader_open_rank(zs_ckpt_reader_t *rd, uint32_t r, char *err, size_t errlen)
{
    char name[64], file[4096];
    const zs_ckpt_file_t *fe;
    zs_status_t st;

    if (rd->files[r] != NULL) {
        return ZS_OK;
    }
    zs_ckpt_rank_file(r, name, sizeof(name));
    zs_ckpt_pathf(file, sizeof(file), "%s/%s", rd->dir.shown, name);
    fe = zs_ckpt_find_file(rd->m, name);
    if (fe == NULL) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s/%s lists no %s", rd->dir.shown, ZS_CKPT_MANIFEST,
                       name);
    }
    st = zs_st_open(&rd->dir, name, fe->bytes, &rd->files[r], err, errlen);
    for (unsigned t = 0; t < ZS_CKPT_N_TENSORS && st == ZS_OK; t++) {
        zs_dtype_t dt;
        uint64_t numel;
        st = zs_st_find(rd->files[r], zs_ckpt_tensor_names[t], &dt, &numel, &rd->offsets[r][t], err,
                        errlen);
        if (st == ZS_OK && (dt != ZS_DTYPE_F32 || numel != rd->m->shard_numel)) {
            st = zs_errf(err, errlen, ZS_ERR_IO,
                         "%s: tensor '%s' is %s[%" PRIu64 "]; the manifest says fp32[%" PRIu64 "]",
                         file, zs_ckpt_tensor_names[t], zs_dtype_name(dt), numel,
                         rd->m->shard_numel);
        }
    }
    if (st != ZS_OK) {
        zs_st_close(rd->files[r]);
        rd->files[r] = NULL;
    }
    return st;
}

zs_status_t zs_ckpt_reader_read(zs_ckpt_reader_t *rd, unsigned t, uint32_t rank, uint64_t shard_off,
                                float *dst, uint64_t n, char *err, size_t errlen)
{
    zs_status_t st;

    if (rank >= rd->m->world || t >= ZS_CKPT_N_TENSORS || shard_off + n > rd->m->shard_numel) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "%s: rank %u tensor %u [%" PRIu64 ", +%" PRIu64
                       ") is outside the checkpoint",
                       rd->dir.shown, rank, t, shard_off, n);
    }
    st = zs_ckpt_reader_open_rank(rd, rank, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    return zs_st_pread(rd->files[rank], rd->offsets[rank][t] + shard_off * sizeof(float), dst,
                       (size_t)n * sizeof(float), err, errlen);
}

void zs_ckpt_reader_close(zs_ckpt_reader_t *rd)
{
    if (rd == NULL) {
        return;
    }
    for (uint32_t r = 0; rd->files != NULL && r < rd->m->world; r++) {
        zs_st_close(rd->files[r]);
    }
    zs_dir_close(&rd->dir);
    free(rd->files);
    free(rd->offsets);
    free(rd);
}

zs_status_t zs_ckpt_runs(const zs_layout_t *layout, uint32_t id, uint64_t a, uint64_t n,
                         zs_ckpt_run_fn fn, void *arg, char *err, size_t errlen)
{
    const zs_layout_param_t *p;
    uint64_t f, dst = 0;

    if (id >= layout->n_params) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "parameter %u is not in the layout", id);
    }
    p = zs_layout_param_by_id(layout, id);
    if (a + n > p->numel) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "parameter %u: elements [%" PRIu64 ", %" PRIu64 ") past its %" PRIu64, id, a,
                       a + n, p->numel);
    }
    f = p->offset + a;
    while (n > 0) {
        zs_layout_loc_t loc;
        const zs_layout_bucket_t *bk;
        uint64_t end, run;
        zs_status_t st;

        if (zs_layout_locate(layout, f, &loc) != ZS_OK) {
            return zs_errf(err, errlen, ZS_ERR_INVALID, "element %" PRIu64 " is outside the layout",
                           f);
        }
        bk = &layout->buckets[loc.bucket];
        end = bk->offset + (uint64_t)(loc.rank + 1) * bk->slice; /* the end of its rank's slice */
        run = end - f < n ? end - f : n;
        st = fn(arg, loc.rank, loc.shard_offset, run, dst, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
        f += run;
        n -= run;
        dst += run;
    }
    return ZS_OK;
}
