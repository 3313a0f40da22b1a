/*
 * Checkpoint manifests, tags and files (zs/ckpt.h, docs/checkpoints.md).
 */
#define _GNU_SOURCE
#include "zs/ckpt.h"
#include "zs/dir.h"
#include "zs/error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

const char *const zs_ckpt_tensor_names[ZS_CKPT_N_TENSORS] = {"master", "exp_avg", "exp_avg_sq"};

bool zs_ckpt_pathf(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < len;
}

void zs_ckpt_rank_file(uint32_t rank, char *name, size_t len)
{
    zs_ckpt_pathf(name, len, "rank_%05u.safetensors", rank);
}

const zs_ckpt_file_t *zs_ckpt_find_file(const zs_ckpt_manifest_t *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_files; i++) {
        if (strcmp(m->files[i].name, name) == 0) {
            return &m->files[i];
        }
    }
    return NULL;
}

zs_status_t zs_ckpt_manifest_alloc(zs_ckpt_manifest_t *m, uint32_t n_groups, uint32_t n_params,
                                   uint32_t n_files)
{
    m->n_groups = n_groups;
    m->n_params = n_params;
    m->n_files = n_files;
    m->group_n_params = calloc(n_groups ? n_groups : 1, sizeof(*m->group_n_params));
    m->group_options = calloc(n_groups ? n_groups : 1, sizeof(*m->group_options));
    m->params = calloc(n_params ? n_params : 1, sizeof(*m->params));
    m->files = calloc(n_files ? n_files : 1, sizeof(*m->files));
    if (m->group_n_params == NULL || m->group_options == NULL || m->params == NULL ||
        m->files == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    return ZS_OK;
}

void zs_ckpt_manifest_free(zs_ckpt_manifest_t *m)
{
    if (m == NULL) {
        return;
    }
    for (uint32_t g = 0; m->group_options != NULL && g < m->n_groups; g++) {
        free(m->group_options[g]);
    }
    for (uint32_t i = 0; m->params != NULL && i < m->n_params; i++) {
        free(m->params[i].name);
    }
    free(m->group_options);
    free(m->group_n_params);
    free(m->params);
    free(m->files);
    free(m);
}

/* ---- writing -------------------------------------------------------------------------- */

static void zs_ckpt_add_hex(cJSON *o, const char *key, uint64_t v)
{
    char hex[24];
    snprintf(hex, sizeof(hex), "%016" PRIx64, v);
    cJSON_AddStringToObject(o, key, hex);
}

static cJSON *zs_ckpt_manifest_json(const zs_ckpt_manifest_t *m)
{
    cJSON *root = cJSON_CreateObject(), *sc, *groups, *params, *files;

    cJSON_AddStringToObject(root, "format", ZS_CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "format_version", m->version);
    cJSON_AddStringToObject(root, "job_id", m->job_id);
    cJSON_AddStringToObject(root, "tag", m->tag);
    cJSON_AddNumberToObject(root, "step", (double)m->step);
    cJSON_AddNumberToObject(root, "skipped_steps", (double)m->skipped_steps);
    cJSON_AddNumberToObject(root, "world", m->world);
    cJSON_AddNumberToObject(root, "stage", m->stage);
    cJSON_AddStringToObject(root, "dtype", zs_dtype_name(m->dtype));
    cJSON_AddNumberToObject(root, "bucket_size", (double)m->bucket_size);
    cJSON_AddNumberToObject(root, "elem_align", m->elem_align);
    cJSON_AddBoolToObject(root, "round_robin", m->round_robin);
    cJSON_AddNumberToObject(root, "shard_numel", (double)m->shard_numel);
    zs_ckpt_add_hex(root, "layout_hash", m->layout_hash);
    zs_ckpt_add_hex(root, "config_hash", m->config_hash);
    cJSON_AddBoolToObject(root, "optimizer_states", m->optimizer_states);
    sc = cJSON_AddObjectToObject(root, "loss_scaler");
    cJSON_AddNumberToObject(sc, "cur_scale", m->scaler.cur_scale);
    cJSON_AddNumberToObject(sc, "cur_hysteresis", m->scaler.cur_hysteresis);
    cJSON_AddNumberToObject(sc, "cur_iter", (double)m->scaler.cur_iter);
    cJSON_AddNumberToObject(sc, "last_overflow_iter", (double)m->scaler.last_overflow_iter);
    groups = cJSON_AddArrayToObject(root, "groups");
    for (uint32_t g = 0; g < m->n_groups; g++) {
        cJSON *o = cJSON_CreateObject();
        cJSON *opts = m->group_options[g] != NULL ? cJSON_Parse(m->group_options[g]) : NULL;
        cJSON_AddNumberToObject(o, "n_params", m->group_n_params[g]);
        cJSON_AddItemToObject(o, "options", opts != NULL ? opts : cJSON_CreateObject());
        cJSON_AddItemToArray(groups, o);
    }
    params = cJSON_AddArrayToObject(root, "params");
    for (uint32_t i = 0; i < m->n_params; i++) {
        const zs_ckpt_param_t *p = &m->params[i];
        cJSON *o = cJSON_CreateObject(), *shape;
        cJSON_AddStringToObject(o, "name", p->name != NULL ? p->name : "");
        cJSON_AddNumberToObject(o, "group", p->group);
        cJSON_AddNumberToObject(o, "numel", (double)p->numel);
        shape = cJSON_AddArrayToObject(o, "shape");
        for (uint32_t d = 0; d < p->ndim; d++) {
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->dims[d]));
        }
        cJSON_AddItemToArray(params, o);
    }
    files = cJSON_AddArrayToObject(root, "files");
    for (uint32_t i = 0; i < m->n_files; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", m->files[i].name);
        cJSON_AddNumberToObject(o, "rank", m->files[i].rank);
        cJSON_AddNumberToObject(o, "bytes", (double)m->files[i].bytes);
        zs_ckpt_add_hex(o, "xxh3", m->files[i].xxh3);
        cJSON_AddItemToArray(files, o);
    }
    return root;
}

zs_status_t zs_ckpt_manifest_write(const zs_dir_t *d, const zs_ckpt_manifest_t *m, char *err,
                                   size_t errlen)
{
    cJSON *root = zs_ckpt_manifest_json(m);
    char *text = root != NULL ? cJSON_Print(root) : NULL;
    char sum[64];
    uint64_t xxh3 = 0;
    zs_status_t st;

    cJSON_Delete(root);
    if (text == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory writing the manifest");
    }
    /* a manifest written again (seal) replaces the old one */
    st = zs_dir_unlink(d, ZS_CKPT_MANIFEST_SUM, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_unlink(d, ZS_CKPT_MANIFEST, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_write_file(d, ZS_CKPT_MANIFEST, text, strlen(text), &xxh3, err, errlen);
    }
    if (st == ZS_OK) {
        snprintf(sum, sizeof(sum), "%016" PRIx64 " %zu\n", xxh3, strlen(text));
        st = zs_dir_write_file(d, ZS_CKPT_MANIFEST_SUM, sum, strlen(sum), NULL, err, errlen);
    }
    free(text);
    return st;
}

/* ---- reading -------------------------------------------------------------------------- */

typedef struct zs_ckpt_rd {
    const char *path;
    char *err;
    size_t errlen;
    zs_status_t st;
} zs_ckpt_rd_t;

static const cJSON *zs_ckpt_get(zs_ckpt_rd_t *rd, const cJSON *o, const char *key, int type)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    bool ok = v != NULL && (type == cJSON_Number   ? cJSON_IsNumber(v)
                            : type == cJSON_String ? cJSON_IsString(v)
                            : type == cJSON_Array  ? cJSON_IsArray(v)
                            : type == cJSON_Object ? cJSON_IsObject(v)
                                                   : cJSON_IsBool(v));

    if (!ok && rd->st == ZS_OK) {
        rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO, "%s: field '%s' is missing or not a %s",
                         rd->path, key,
                         type == cJSON_Number   ? "number"
                         : type == cJSON_String ? "string"
                         : type == cJSON_Array  ? "list"
                         : type == cJSON_Object ? "object"
                                                : "boolean");
    }
    return ok ? v : NULL;
}

static uint64_t zs_ckpt_u64(zs_ckpt_rd_t *rd, const cJSON *o, const char *key, uint64_t max)
{
    const cJSON *v = zs_ckpt_get(rd, o, key, cJSON_Number);

    if (v == NULL) {
        return 0;
    }
    if (v->valuedouble < 0 || v->valuedouble > (double)max ||
        v->valuedouble != (double)(uint64_t)v->valuedouble) {
        if (rd->st == ZS_OK) {
            rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO,
                             "%s: field '%s' = %g is not an integer in 0..%" PRIu64, rd->path, key,
                             v->valuedouble, max);
        }
        return 0;
    }
    return (uint64_t)v->valuedouble;
}

static uint64_t zs_ckpt_hex(zs_ckpt_rd_t *rd, const cJSON *o, const char *key)
{
    const cJSON *v = zs_ckpt_get(rd, o, key, cJSON_String);
    char *end = NULL;
    uint64_t x;

    if (v == NULL) {
        return 0;
    }
    x = strtoull(v->valuestring, &end, 16);
    if (end == v->valuestring || *end != '\0') {
        if (rd->st == ZS_OK) {
            rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO, "%s: field '%s' = '%s' is not hex",
                             rd->path, key, v->valuestring);
        }
    }
    return x;
}

static void zs_ckpt_read_params(zs_ckpt_rd_t *rd, const cJSON *root, zs_ckpt_manifest_t *m)
{
    const cJSON *params = zs_ckpt_get(rd, root, "params", cJSON_Array), *p;
    uint32_t i = 0;

    cJSON_ArrayForEach(p, params)
    {
        zs_ckpt_param_t *q = &m->params[i++];
        const cJSON *name = zs_ckpt_get(rd, p, "name", cJSON_String);
        const cJSON *shape = zs_ckpt_get(rd, p, "shape", cJSON_Array), *d;

        q->name = strdup(name != NULL ? name->valuestring : "");
        q->group = (uint32_t)zs_ckpt_u64(rd, p, "group", m->n_groups ? m->n_groups - 1 : 0);
        q->numel = zs_ckpt_u64(rd, p, "numel", (uint64_t)1 << 53);
        cJSON_ArrayForEach(d, shape)
        {
            if (q->ndim == ZS_CKPT_MAX_DIMS || !cJSON_IsNumber(d) || d->valuedouble < 0) {
                if (rd->st == ZS_OK) {
                    rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO,
                                     "%s: params[%u].shape is not a list of at most %u sizes",
                                     rd->path, i - 1, ZS_CKPT_MAX_DIMS);
                }
                break;
            }
            q->dims[q->ndim++] = (uint64_t)d->valuedouble;
        }
    }
}

static void zs_ckpt_read_lists(zs_ckpt_rd_t *rd, const cJSON *root, zs_ckpt_manifest_t *m)
{
    const cJSON *groups = zs_ckpt_get(rd, root, "groups", cJSON_Array), *g;
    const cJSON *files = zs_ckpt_get(rd, root, "files", cJSON_Array), *f;
    const cJSON *params = zs_ckpt_get(rd, root, "params", cJSON_Array);
    uint32_t i = 0;

    if (rd->st != ZS_OK || zs_ckpt_manifest_alloc(m, (uint32_t)cJSON_GetArraySize(groups),
                                                  (uint32_t)cJSON_GetArraySize(params),
                                                  (uint32_t)cJSON_GetArraySize(files)) != ZS_OK) {
        if (rd->st == ZS_OK) {
            rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_NO_MEMORY, "%s: out of memory", rd->path);
        }
        return;
    }
    cJSON_ArrayForEach(g, groups)
    {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(g, "options");
        m->group_n_params[i] = (uint32_t)zs_ckpt_u64(rd, g, "n_params", ZS_LAYOUT_MAX_PARAMS);
        m->group_options[i++] = cJSON_IsObject(o) ? cJSON_PrintUnformatted(o) : NULL;
    }
    zs_ckpt_read_params(rd, root, m);
    i = 0;
    cJSON_ArrayForEach(f, files)
    {
        zs_ckpt_file_t *q = &m->files[i++];
        const cJSON *name = zs_ckpt_get(rd, f, "name", cJSON_String);
        const cJSON *rank = zs_ckpt_get(rd, f, "rank", cJSON_Number);
        zs_ckpt_pathf(q->name, sizeof(q->name), "%s", name != NULL ? name->valuestring : "");
        q->rank = rank != NULL ? (int32_t)rank->valuedouble : -1;
        q->bytes = zs_ckpt_u64(rd, f, "bytes", UINT64_MAX >> 11);
        q->xxh3 = zs_ckpt_hex(rd, f, "xxh3");
        if (strchr(q->name, '/') != NULL || q->name[0] == '.' || q->name[0] == '\0') {
            rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO,
                             "%s: files[%u].name '%s' is not a "
                             "plain file name",
                             rd->path, i - 1, q->name);
        }
    }
}

static void zs_ckpt_read_scalars(zs_ckpt_rd_t *rd, const cJSON *root, zs_ckpt_manifest_t *m)
{
    const cJSON *job = zs_ckpt_get(rd, root, "job_id", cJSON_String);
    const cJSON *tag = zs_ckpt_get(rd, root, "tag", cJSON_String);
    const cJSON *dtype = zs_ckpt_get(rd, root, "dtype", cJSON_String);
    const cJSON *sc = zs_ckpt_get(rd, root, "loss_scaler", cJSON_Object);
    const cJSON *rr = zs_ckpt_get(rd, root, "round_robin", cJSON_True);
    const cJSON *opt = zs_ckpt_get(rd, root, "optimizer_states", cJSON_True);
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(sc, "cur_scale");

    zs_ckpt_pathf(m->job_id, sizeof(m->job_id), "%s", job != NULL ? job->valuestring : "");
    zs_ckpt_pathf(m->tag, sizeof(m->tag), "%s", tag != NULL ? tag->valuestring : "");
    m->step = zs_ckpt_u64(rd, root, "step", (uint64_t)1 << 53);
    m->skipped_steps = zs_ckpt_u64(rd, root, "skipped_steps", (uint64_t)1 << 53);
    m->world = (uint32_t)zs_ckpt_u64(rd, root, "world", ZS_LAYOUT_MAX_WORLD);
    m->stage = (uint32_t)zs_ckpt_u64(rd, root, "stage", 2);
    m->bucket_size = zs_ckpt_u64(rd, root, "bucket_size", (uint64_t)1 << 53);
    m->elem_align = (uint32_t)zs_ckpt_u64(rd, root, "elem_align", 1u << 20);
    m->shard_numel = zs_ckpt_u64(rd, root, "shard_numel", (uint64_t)1 << 53);
    m->layout_hash = zs_ckpt_hex(rd, root, "layout_hash");
    m->config_hash = zs_ckpt_hex(rd, root, "config_hash");
    m->round_robin = cJSON_IsTrue(rr);
    m->optimizer_states = cJSON_IsTrue(opt);
    m->dtype = ZS_DTYPE_F32;
    for (int d = 0; dtype != NULL && d < ZS_DTYPE_COUNT; d++) {
        if (strcmp(dtype->valuestring, zs_dtype_name((zs_dtype_t)d)) == 0) {
            m->dtype = (zs_dtype_t)d;
        }
    }
    m->scaler.cur_scale = cJSON_IsNumber(cs) ? cs->valuedouble : 1.0;
    m->scaler.cur_hysteresis = (uint32_t)zs_ckpt_u64(rd, sc, "cur_hysteresis", UINT32_MAX);
    m->scaler.cur_iter =
        (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sc, "cur_iter"));
    m->scaler.last_overflow_iter =
        (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(sc, "last_overflow_iter"));
    if (rd->st == ZS_OK && (m->world == 0 || m->bucket_size == 0 || m->stage == 0)) {
        rd->st = zs_errf(rd->err, rd->errlen, ZS_ERR_IO,
                         "%s: world %u, stage %u, bucket_size %" PRIu64 ": none may be 0", rd->path,
                         m->world, m->stage, m->bucket_size);
    }
}

/* The manifest's text as parsed into m (path: for messages). */
static zs_status_t zs_ckpt_manifest_parse(const char *text, size_t len, const char *path,
                                          zs_ckpt_manifest_t **m_p, char *err, size_t errlen)
{
    zs_ckpt_rd_t rd = {path, err, errlen, ZS_OK};
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *fmt;
    zs_ckpt_manifest_t *m;

    *m_p = NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: not a JSON object", path);
    }
    fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, ZS_CKPT_FORMAT) != 0) {
        cJSON_Delete(root);
        return zs_errf(err, errlen, ZS_ERR_IO, "%s: field 'format' is not '%s'", path,
                       ZS_CKPT_FORMAT);
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        cJSON_Delete(root);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    m->version = (uint32_t)zs_ckpt_u64(&rd, root, "format_version", UINT32_MAX);
    if (rd.st == ZS_OK && m->version > ZS_CKPT_VERSION) {
        rd.st = zs_errf(err, errlen, ZS_ERR_VERSION,
                        "%s: format_version %u is newer than this zerod reads (%u); use a newer "
                        "zerod",
                        path, m->version, ZS_CKPT_VERSION);
    }
    if (rd.st == ZS_OK) {
        zs_ckpt_read_scalars(&rd, root, m);
        zs_ckpt_read_lists(&rd, root, m);
    }
    cJSON_Delete(root);
    if (rd.st != ZS_OK) {
        zs_ckpt_manifest_free(m);
        return rd.st;
    }
    *m_p = m;
    return ZS_OK;
}

zs_status_t zs_ckpt_manifest_read_unsealed(const zs_dir_t *d, zs_ckpt_manifest_t **m_p, char *err,
                                           size_t errlen)
{
    char path[ZS_DIR_SHOWN_MAX + 32], *text = NULL;
    size_t len = 0;
    zs_status_t st;

    *m_p = NULL;
    zs_ckpt_pathf(path, sizeof(path), "%s/%s", d->shown, ZS_CKPT_MANIFEST);
    st = zs_dir_read_file(d, ZS_CKPT_MANIFEST, ZS_CKPT_MANIFEST_MAX, &text, &len, err, errlen);
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_parse(text, len, path, m_p, err, errlen);
    }
    free(text);
    return st;
}

/* manifest.xxh3: "<16 hex digits> <bytes>" of manifest.json. */
static zs_status_t zs_ckpt_manifest_sum(const zs_dir_t *d, uint64_t *xxh3_p, uint64_t *bytes_p,
                                        char *err, size_t errlen)
{
    char *text = NULL, *end = NULL;
    size_t len = 0;
    zs_status_t st = zs_dir_read_file(d, ZS_CKPT_MANIFEST_SUM, 64, &text, &len, err, errlen);

    if (st == ZS_ERR_NOT_FOUND) {
        zs_ckpt_manifest_t *m = NULL;
        /* say which zerod wrote it, when the manifest says */
        if (zs_ckpt_manifest_read_unsealed(d, &m, NULL, 0) == ZS_OK && m->version < 2) {
            st = zs_errf(err, errlen, ZS_ERR_IO,
                         "%s/%s: format_version %u has no manifest checksum (an older zerod "
                         "wrote it); `zeroctl checkpoint seal %s` trusts it as it is now",
                         d->shown, ZS_CKPT_MANIFEST, m->version, d->shown);
        } else {
            st = zs_errf(err, errlen, ZS_ERR_IO,
                         "%s/%s is missing: the manifest cannot be verified, so the checkpoint "
                         "is not trusted",
                         d->shown, ZS_CKPT_MANIFEST_SUM);
        }
        zs_ckpt_manifest_free(m);
        return st;
    }
    if (st != ZS_OK) {
        return st;
    }
    *xxh3_p = strtoull(text, &end, 16);
    if (end != text + 16 || *end != ' ') {
        st = ZS_ERR_IO;
    } else {
        char *e2 = NULL;
        *bytes_p = strtoull(end + 1, &e2, 10);
        st = e2 == end + 1 || (*e2 != '\n' && *e2 != '\0') ? ZS_ERR_IO : ZS_OK;
    }
    if (st != ZS_OK) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "%s/%s: '%.40s' is not '<xxh3 hex> <bytes>'", d->shown,
                     ZS_CKPT_MANIFEST_SUM, text);
    }
    free(text);
    return st;
}

zs_status_t zs_ckpt_manifest_read(const zs_dir_t *d, zs_ckpt_manifest_t **m_p, char *err,
                                  size_t errlen)
{
    char path[ZS_DIR_SHOWN_MAX + 32], *text = NULL, perr[1024] = "";
    uint64_t want_xxh3 = 0, want_bytes = 0;
    size_t len = 0;
    zs_layout_t *layout = NULL;
    zs_status_t st, pst = ZS_OK;

    *m_p = NULL;
    zs_ckpt_pathf(path, sizeof(path), "%s/%s", d->shown, ZS_CKPT_MANIFEST);
    st = zs_ckpt_manifest_sum(d, &want_xxh3, &want_bytes, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_read_file(d, ZS_CKPT_MANIFEST, ZS_CKPT_MANIFEST_MAX, &text, &len, err, errlen);
    }
    if (st == ZS_OK) { /* a newer format says so first: it may check itself differently */
        pst = zs_ckpt_manifest_parse(text, len, path, m_p, perr, sizeof(perr));
        if (pst == ZS_ERR_VERSION) {
            st = zs_errf(err, errlen, pst, "%s", perr);
        }
    }
    if (st == ZS_OK && (len != want_bytes || XXH3_64bits(text, len) != want_xxh3)) {
        st =
            zs_errf(err, errlen, ZS_ERR_IO,
                    "%s was changed or is corrupt: it is not what %s says (xxh3 %016" PRIx64
                    " of %zu bytes; expected %016" PRIx64 " of %" PRIu64 ")",
                    path, ZS_CKPT_MANIFEST_SUM, XXH3_64bits(text, len), len, want_xxh3, want_bytes);
    }
    if (st == ZS_OK && pst != ZS_OK) {
        st = zs_errf(err, errlen, pst, "%s", perr);
    }
    free(text);
    if (st == ZS_OK) {
        st = zs_ckpt_layout(*m_p, &layout, err, errlen);
    }
    if (st == ZS_OK && layout->hash != (*m_p)->layout_hash) {
        st = zs_errf(err, errlen, ZS_ERR_IO,
                     "%s: layout_hash %016" PRIx64 " is not the hash of the layout its fields "
                     "give (%016" PRIx64 "): the manifest is inconsistent",
                     path, (*m_p)->layout_hash, layout->hash);
    }
    zs_layout_destroy(layout);
    if (st != ZS_OK) {
        zs_ckpt_manifest_free(*m_p);
        *m_p = NULL;
    }
    return st;
}

zs_status_t zs_ckpt_layout(const zs_ckpt_manifest_t *m, zs_layout_t **layout_p, char *err,
                           size_t errlen)
{
    uint64_t *numel = calloc(m->n_params ? m->n_params : 1, sizeof(*numel));
    zs_layout_spec_t spec = {.world = m->world,
                             .bucket_size = m->bucket_size,
                             .elem_align = m->elem_align,
                             .round_robin = m->round_robin,
                             .n_groups = m->n_groups,
                             .group_n_params = m->group_n_params,
                             .numel = numel};
    uint64_t sum = 0;
    zs_status_t st;

    if (numel == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    for (uint32_t g = 0; g < m->n_groups; g++) {
        sum += m->group_n_params[g];
    }
    if (sum != m->n_params) {
        free(numel);
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "manifest: the groups hold %" PRIu64 " parameters, the list has %u", sum,
                       m->n_params);
    }
    for (uint32_t i = 0; i < m->n_params; i++) {
        numel[i] = m->params[i].numel;
    }
    st = zs_layout_create(&spec, layout_p, err, errlen);
    free(numel);
    if (st == ZS_OK && (*layout_p)->shard_numel != m->shard_numel) {
        zs_layout_destroy(*layout_p);
        *layout_p = NULL;
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "manifest: shard_numel %" PRIu64 " is not what its layout gives",
                       m->shard_numel);
    }
    return st;
}

/* ---- tags, files, directories ----------------------------------------------------------- */

zs_status_t zs_ckpt_tag_check(const char *tag, char *err, size_t errlen)
{
    size_t n = strlen(tag);

    if (n == 0 || n >= ZS_CKPT_TAG_MAX || tag[0] == '.' || strchr(tag, '/') != NULL ||
        strcmp(tag, ZS_CKPT_LATEST) == 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "checkpoint tag '%.*s' must be a plain name of 1..%u bytes, not starting "
                       "with '.', without '/', and not 'latest'",
                       (int)(n > 200 ? 200 : n), tag, ZS_CKPT_TAG_MAX - 1);
    }
    return ZS_OK;
}

zs_status_t zs_ckpt_resolve(const zs_dir_t *dir, const char *tag, char *tag_out, size_t taglen,
                            char *err, size_t errlen)
{
    char buf[ZS_CKPT_TAG_MAX + 2];
    zs_status_t st;

    if (tag == NULL || tag[0] == '\0') {
        size_t len = 0;
        char *text = NULL;
        st = zs_dir_read_file(dir, ZS_CKPT_LATEST, ZS_CKPT_TAG_MAX + 1, &text, &len, err, errlen);
        if (st == ZS_ERR_NOT_FOUND) {
            return zs_errf(err, errlen, st, "no checkpoint in %s: %s/%s does not exist", dir->shown,
                           dir->shown, ZS_CKPT_LATEST);
        }
        if (st != ZS_OK) {
            return st;
        }
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == ' ')) {
            text[--len] = '\0';
        }
        zs_ckpt_pathf(buf, sizeof(buf), "%s", text);
        free(text);
        tag = buf;
    }
    st = zs_ckpt_tag_check(tag, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    zs_ckpt_pathf(tag_out, taglen, "%s", tag);
    return ZS_OK;
}

zs_status_t zs_ckpt_open(const zs_dir_t *dir, const char *tag, zs_dir_t *ckpt, char *tag_out,
                         size_t taglen, char *err, size_t errlen)
{
    char t[ZS_CKPT_TAG_MAX];
    zs_status_t st = zs_ckpt_resolve(dir, tag, t, sizeof(t), err, errlen);

    if (st == ZS_OK) {
        st = zs_dir_sub(dir, t, ZS_MAY_READ | ZS_MAY_EXEC, ckpt, err, errlen);
        if (st == ZS_ERR_NOT_FOUND && (tag == NULL || tag[0] == '\0')) {
            st = zs_errf(err, errlen, st, "%s/%s names '%s', which is not there", dir->shown,
                         ZS_CKPT_LATEST, t);
        }
    }
    if (st == ZS_OK && tag_out != NULL) {
        zs_ckpt_pathf(tag_out, taglen, "%s", t);
    }
    return st;
}

zs_status_t zs_ckpt_hash_fd(int fd, uint64_t bytes, const zs_cancel_t *cancel, const char *shown,
                            uint64_t *xxh3_p, char *err, size_t errlen)
{
    XXH3_state_t *h = XXH3_createState();
    size_t cap = 4u << 20;
    char *buf = malloc(cap);
    uint64_t done = 0;
    zs_status_t st = ZS_OK;

    if (h == NULL || buf == NULL) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory hashing %s", shown);
        goto out;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    XXH3_64bits_reset(h);
    while (done < bytes) { /* never past the size the manifest gives */
        size_t want = bytes - done < cap ? (size_t)(bytes - done) : cap;
        ssize_t n = pread(fd, buf, want, (off_t)done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            st = n < 0 ? zs_errf(err, errlen, ZS_ERR_IO, "reading %s: %s", shown, strerror(errno))
                       : zs_errf(err, errlen, ZS_ERR_IO,
                                 "%s ended after %" PRIu64 " of %" PRIu64 " bytes (truncated)",
                                 shown, done, bytes);
            goto out;
        }
        XXH3_64bits_update(h, buf, (size_t)n);
        done += (uint64_t)n;
        st = zs_cancel_check(cancel, shown, err, errlen);
        if (st != ZS_OK) {
            goto out;
        }
    }
    *xxh3_p = XXH3_64bits_digest(h);
out:
    XXH3_freeState(h);
    free(buf);
    return st;
}

zs_status_t zs_ckpt_hash_file(const zs_dir_t *d, const char *name, uint64_t max,
                              const zs_cancel_t *cancel, uint64_t *bytes_p, uint64_t *xxh3_p,
                              char *err, size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX + 80];
    uint64_t size = 0;
    int fd = -1;
    zs_status_t st = zs_dir_open_file(d, name, max, false, &fd, &size, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    zs_ckpt_pathf(shown, sizeof(shown), "%s/%s", d->shown, name);
    st = zs_ckpt_hash_fd(fd, size, cancel, shown, xxh3_p, err, errlen);
    close(fd);
    if (st == ZS_OK) {
        *bytes_p = size;
    }
    return st;
}

zs_status_t zs_ckpt_verify_file(const zs_dir_t *ckpt, const zs_ckpt_file_t *fe,
                                const zs_cancel_t *cancel, char *err, size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX + 80];
    uint64_t size = 0, h = 0;
    int fd = -1;
    zs_status_t st = zs_dir_open_file(ckpt, fe->name, fe->bytes, true, &fd, &size, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    zs_ckpt_pathf(shown, sizeof(shown), "%s/%s", ckpt->shown, fe->name);
    st = zs_ckpt_hash_fd(fd, fe->bytes, cancel, shown, &h, err, errlen);
    close(fd);
    if (st == ZS_OK && h != fe->xxh3) {
        st = zs_errf(err, errlen, ZS_ERR_IO,
                     "%s: checksum xxh3 %016" PRIx64 ", the manifest says %016" PRIx64
                     " (the file is corrupt)",
                     shown, h, fe->xxh3);
    }
    return st;
}

static int zs_ckpt_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *zs_ckpt_duplicate_name(const zs_ckpt_param_t *params, uint32_t n)
{
    const char **names = malloc((n ? n : 1) * sizeof(*names));
    const char *dup = NULL;

    if (names == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        names[i] = params[i].name != NULL ? params[i].name : "";
    }
    qsort(names, n, sizeof(*names), zs_ckpt_name_cmp);
    for (uint32_t i = 1; i < n && dup == NULL; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            dup = names[i];
        }
    }
    free(names);
    return dup;
}

zs_status_t zs_ckpt_verify(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m,
                           const zs_cancel_t *cancel, char *err, size_t errlen)
{
    for (uint32_t r = 0; r < m->world; r++) {
        char name[64];
        zs_ckpt_rank_file(r, name, sizeof(name));
        if (zs_ckpt_find_file(m, name) == NULL) {
            return zs_errf(err, errlen, ZS_ERR_IO, "%s/%s: the manifest lists no %s for rank %u",
                           ckpt->shown, ZS_CKPT_MANIFEST, name, r);
        }
    }
    for (uint32_t i = 0; i < m->n_files; i++) {
        zs_status_t st = zs_ckpt_verify_file(ckpt, &m->files[i], cancel, err, errlen);
        if (st != ZS_OK) {
            return st;
        }
    }
    return ZS_OK;
}

bool zs_ckpt_own_file(const char *name)
{
    unsigned r;
    char rest[32];

    if (strcmp(name, ZS_CKPT_MANIFEST) == 0 || strcmp(name, ZS_CKPT_MANIFEST_SUM) == 0 ||
        strcmp(name, ZS_CKPT_TRAINER_STATE) == 0 || strcmp(name, "module.safetensors") == 0) {
        return true;
    }
    /* rank_NNNNN.safetensors; the reports older zerods left beside them (.rank_NNNNN.sum, .err,
     * and their .part) */
    return (sscanf(name, "rank_%5u%31s", &r, rest) == 2 && strcmp(rest, ".safetensors") == 0) ||
           (sscanf(name, ".rank_%5u%31s", &r, rest) == 2 &&
            (strcmp(rest, ".sum") == 0 || strcmp(rest, ".err") == 0 ||
             strcmp(rest, ".sum.part") == 0 || strcmp(rest, ".err.part") == 0));
}

bool zs_ckpt_is_checkpoint(const zs_dir_t *dir, const char *name)
{
    zs_dir_t sub = ZS_DIR_INIT;
    zs_ckpt_manifest_t *m = NULL;
    bool ours;

    if (zs_dir_sub(dir, name, ZS_MAY_READ | ZS_MAY_EXEC, &sub, NULL, 0) != ZS_OK) {
        return false;
    }
    ours = zs_ckpt_manifest_read_unsealed(&sub, &m, NULL, 0) == ZS_OK;
    zs_ckpt_manifest_free(m);
    zs_dir_close(&sub);
    return ours;
}

zs_status_t zs_ckpt_remove(const zs_dir_t *dir, const char *name, char *err, size_t errlen)
{
    return zs_dir_remove_flat(dir, name, zs_ckpt_own_file, err, errlen);
}
