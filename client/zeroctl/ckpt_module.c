/*
 * module.safetensors of a checkpoint, read for `zeroctl export` (ckpt_module.h): the file is
 * verified against the manifest, its tensors (any safetensors dtype) and its tied names
 * (metadata zerod_aliases) checked before anything is written.
 */
#include "ckpt_module.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned ckpt_st_size(const char *dtype)
{
    static const struct {
        const char *name;
        unsigned size;
    } sizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
                 {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        if (strcmp(dtype, sizes[i].name) == 0) {
            return sizes[i].size;
        }
    }
    return 0;
}

static float ckpt_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    float f;

    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else { /* zero or subnormal: man x 2^-24 */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Element i of a tensor of dtype (ckpt_st_size knows it) at p, as fp32. */
static float ckpt_st_float(const char *dtype, const uint8_t *p, uint64_t i)
{
    unsigned size = ckpt_st_size(dtype);
    uint64_t u = 0;
    float f;

    memcpy(&u, p + i * size, size); /* little-endian, as safetensors and this host are */
    if (strcmp(dtype, "F64") == 0) {
        double d;
        memcpy(&d, &u, sizeof(d));
        return (float)d;
    }
    if (strcmp(dtype, "F32") == 0 || strcmp(dtype, "BF16") == 0) {
        uint32_t w = strcmp(dtype, "F32") == 0 ? (uint32_t)u : (uint32_t)u << 16;
        memcpy(&f, &w, sizeof(f));
        return f;
    }
    if (strcmp(dtype, "F16") == 0) {
        return ckpt_f16((uint16_t)u);
    }
    if (dtype[0] == 'I') { /* signed: extend from its width */
        unsigned shift = 64 - 8 * size;
        return (float)((int64_t)(u << shift) >> shift);
    }
    return (float)u; /* U8, BOOL */
}

/* Tensor `name` of module.safetensors's header into e; 0, or -1 with err. */
static int ckpt_module_tensor(ckpt_module_t *mod, const cJSON *t, ckpt_extra_t *e, char *err,
                              size_t errlen)
{
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const cJSON *d;
    uint64_t a, b;

    e->name = t->string;
    e->param = -1;
    e->numel = 1;
    e->ndim = 0;
    if (!cJSON_IsString(dt) || ckpt_st_size(dt->valuestring) == 0 || !cJSON_IsArray(shape) ||
        cJSON_GetArraySize(shape) > (int)ZS_CKPT_MAX_DIMS || cJSON_GetArraySize(offs) != 2) {
        snprintf(err, errlen, "%s: tensor '%s' has no dtype, shape or data_offsets zerod knows",
                 CKPT_MODULE, t->string);
        return -1;
    }
    e->dtype = dt->valuestring;
    cJSON_ArrayForEach(d, shape)
    {
        /* every size within the file's: no product overflows */
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > (double)mod->len ||
            (d->valuedouble > 0 && (double)e->numel > (double)mod->len / d->valuedouble)) {
            snprintf(err, errlen, "%s: tensor '%s' has a bad shape", CKPT_MODULE, t->string);
            return -1;
        }
        e->dims[e->ndim++] = (uint64_t)d->valuedouble;
        e->numel *= (uint64_t)d->valuedouble;
    }
    d = cJSON_GetArrayItem(offs, 0);
    a = cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble <= (double)mod->len
            ? (uint64_t)d->valuedouble
            : UINT64_MAX;
    d = cJSON_GetArrayItem(offs, 1);
    b = cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble <= (double)mod->len
            ? (uint64_t)d->valuedouble
            : 0;
    if (b < a || b - a != e->numel * ckpt_st_size(e->dtype) || mod->data + b > mod->len) {
        snprintf(err, errlen, "%s: tensor '%s' lies outside the file or has the wrong size",
                 CKPT_MODULE, t->string);
        return -1;
    }
    e->at = mod->data + a;
    return 0;
}

/* The tied names (mod->aliases: name -> parameter name) as extras. */
static int ckpt_module_aliases(ckpt_module_t *mod, const zs_ckpt_manifest_t *m, char *err,
                               size_t errlen)
{
    const cJSON *al;

    cJSON_ArrayForEach(al, mod->aliases)
    {
        ckpt_extra_t *e = &mod->x[mod->n];
        e->param = -1;
        for (uint32_t i = 0; cJSON_IsString(al) && i < m->n_params; i++) {
            if (strcmp(m->params[i].name, al->valuestring) == 0) {
                e->param = i;
            }
        }
        if (e->param < 0) {
            snprintf(err, errlen, "%s: tied name '%s' names no parameter of the checkpoint",
                     CKPT_MODULE, al->string);
            return -1;
        }
        e->name = al->string;
        e->ndim = m->params[e->param].ndim;
        memcpy(e->dims, m->params[e->param].dims, sizeof(e->dims));
        e->numel = m->params[e->param].numel;
        mod->n++;
    }
    return 0;
}

/* module.safetensors's header and its metadata's tied names (zerod_aliases, a JSON object),
 * parsed; 0, or -1 with err. */
static int ckpt_module_header(ckpt_module_t *mod, char *err, size_t errlen)
{
    uint64_t hlen = 0;
    const cJSON *meta;

    for (unsigned i = 0; i < 8 && mod->len >= 8; i++) {
        hlen |= (uint64_t)(uint8_t)mod->file[i] << (8 * i);
    }
    mod->data = 8 + hlen;
    if (mod->len >= 8 && hlen <= mod->len - 8) {
        mod->header = cJSON_ParseWithLength(mod->file + 8, (size_t)hlen);
    }
    if (!cJSON_IsObject(mod->header)) {
        snprintf(err, errlen, "%s: not a safetensors file", CKPT_MODULE);
        return -1;
    }
    meta = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(mod->header, "__metadata__"), "zerod_aliases");
    mod->aliases = cJSON_IsString(meta) ? cJSON_Parse(meta->valuestring) : cJSON_CreateObject();
    if (!cJSON_IsObject(mod->aliases)) {
        snprintf(err, errlen, "%s: its zerod_aliases is not a JSON object", CKPT_MODULE);
        return -1;
    }
    return 0;
}

/* module.safetensors of the checkpoint (when its manifest lists it), checked and parsed. */
int ckpt_module_open(const zs_dir_t *ckpt, const zs_ckpt_manifest_t *m, ckpt_module_t *mod,
                     char *err, size_t errlen)
{
    const zs_ckpt_file_t *fe = zs_ckpt_find_file(m, CKPT_MODULE);
    const cJSON *t;
    zs_status_t st;

    memset(mod, 0, sizeof(*mod));
    if (fe == NULL) {
        return 0;
    }
    st = zs_ckpt_verify_file(ckpt, fe, NULL, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_read_file(ckpt, CKPT_MODULE, fe->bytes, &mod->file, &mod->len, err, errlen);
    }
    if (st != ZS_OK || ckpt_module_header(mod, err, errlen) != 0) {
        return -1;
    }
    mod->x = calloc((size_t)cJSON_GetArraySize(mod->header) +
                        (size_t)cJSON_GetArraySize(mod->aliases) + 1,
                    sizeof(*mod->x));
    if (mod->x == NULL) {
        snprintf(err, errlen, "%s: out of memory", CKPT_MODULE);
        return -1;
    }
    cJSON_ArrayForEach(t, mod->header)
    {
        if (strcmp(t->string, "__metadata__") != 0 &&
            ckpt_module_tensor(mod, t, &mod->x[mod->n++], err, errlen) != 0) {
            return -1;
        }
    }
    return ckpt_module_aliases(mod, m, err, errlen);
}

void ckpt_module_close(ckpt_module_t *mod)
{
    cJSON_Delete(mod->header);
    cJSON_Delete(mod->aliases);
    free(mod->x);
    free(mod->file);
}

float ckpt_extra_float(const ckpt_module_t *mod, const ckpt_extra_t *e, uint64_t i)
{
    return ckpt_st_float(e->dtype, (const uint8_t *)mod->file + e->at, i);
}
