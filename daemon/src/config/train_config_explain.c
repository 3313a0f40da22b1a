/*
 * The resolved training config of a job, key by key, with where each value came from
 * (`zeroctl config`, `zerod --print-training-config`): the config as given, the table's
 * default, or derived (the batch triple, grad_accum_dtype's default).
 */
#include "config/train_config.h"
#include "config/train_config_int.h"

#include "zs/dtype.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The item at a dotted path of the JSON object root (NULL when absent). */
static const cJSON *zd_tce_lookup(const cJSON *root, const char *path)
{
    char name[128];
    const cJSON *item = root;

    while (item != NULL && *path != '\0') {
        const char *dot = strchr(path, '.');
        size_t n = dot != NULL ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof(name) || !cJSON_IsObject(item)) {
            return NULL;
        }
        memcpy(name, path, n);
        name[n] = '\0';
        item = cJSON_GetObjectItemCaseSensitive(item, name);
        path += n + (dot != NULL);
    }
    return item;
}

/* A value the daemon derived (not given): the batch triple and grad_accum_dtype. */
static cJSON *zd_tce_derived(const zd_tc_key_t *k, const zd_train_config_t *cfg)
{
    if (strcmp(k->path, "train_batch_size") == 0 && cfg->train_batch_size > 0) {
        return cJSON_CreateNumber(cfg->train_batch_size);
    }
    if (strcmp(k->path, "train_micro_batch_size_per_gpu") == 0 && cfg->micro_batch_size > 0) {
        return cJSON_CreateNumber(cfg->micro_batch_size);
    }
    if (strcmp(k->path, "gradient_accumulation_steps") == 0 && !cfg->gas_given &&
        cfg->train_batch_size > 0) {
        return cJSON_CreateNumber(cfg->gradient_accumulation_steps);
    }
    if (strcmp(k->path, "data_types.grad_accum_dtype") == 0) {
        return cJSON_CreateString(zs_dtype_name(cfg->grad_accum_dtype));
    }
    return NULL;
}

/* A given value as the parser read it: a string of a section DeepSpeed validates with pydantic
 * converted ("2" is 2), Infinity and NaN as strings (JSON has no such numbers). */
static cJSON *zd_tce_as_read(const zd_tc_key_t *k, const cJSON *given)
{
    char parent[ZD_TC_PATHLEN];
    size_t n = (size_t)(zd_tc_leaf(k) - k->path);
    const zd_tc_key_t *p;
    cJSON *lax, *value;

    snprintf(parent, sizeof(parent), "%.*s", (int)(n > 0 ? n - 1 : 0), k->path);
    p = zd_tc_find(parent);
    lax = p != NULL && (p->flags & ZD_TC_LAX) ? zd_tc_lax(k, given) : NULL;
    value = lax != NULL ? lax : cJSON_Duplicate(given, true);
    if (cJSON_IsNumber(value) && !isfinite(value->valuedouble)) {
        double v = value->valuedouble;
        cJSON_Delete(value);
        value = cJSON_CreateString(isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity"));
    }
    return value;
}

/* One row: {"key", "value", "source"}; NULL when the key has no value (not given, no
 * default). */
static cJSON *zd_tce_row(const zd_tc_key_t *k, const cJSON *root, const zd_train_config_t *cfg)
{
    const cJSON *given = root != NULL ? zd_tce_lookup(root, k->path) : NULL;
    cJSON *value = NULL, *row;
    const char *source = "config";

    if (given != NULL && !cJSON_IsNull(given)) {
        value = zd_tce_as_read(k, given);
    } else if ((value = zd_tce_derived(k, cfg)) != NULL) {
        source = "derived";
    } else if (k->def != NULL && strcmp(k->def, "null") != 0) {
        value = cJSON_Parse(k->def);
        source = "default";
    }
    if (value == NULL) {
        return NULL;
    }
    row = cJSON_CreateObject();
    cJSON_AddStringToObject(row, "key", k->path);
    cJSON_AddItemToObject(row, "value", value);
    cJSON_AddStringToObject(row, "source", source);
    return row;
}

/* A section given by its alias (DeepSpeed's "bfloat16") renamed to the section it stands for,
 * where the section itself is not given (as the parser reads it). */
static void zd_tce_resolve_aliases(cJSON *root)
{
    for (size_t i = 1; i < zd_tc_n_keys && cJSON_IsObject(root); i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        const char *name = zd_tc_leaf(k);
        const cJSON *section;
        cJSON *alias;
        if (!(k->flags & ZD_TC_ALIAS) || cJSON_GetObjectItemCaseSensitive(root, name) == NULL) {
            continue;
        }
        section = cJSON_GetObjectItemCaseSensitive(root, k->def);
        if (section == NULL || cJSON_IsNull(section)) {
            cJSON_DeleteItemFromObjectCaseSensitive(root, k->def);
            alias = cJSON_DetachItemFromObjectCaseSensitive(root, name);
            cJSON_AddItemToObject(root, k->def, alias);
        }
    }
}

char *zd_train_config_explain(const char *json, const zd_train_config_t *cfg)
{
    cJSON *root = NULL;
    cJSON *rows = cJSON_CreateArray();
    char *text;

    /* a config that does not parse has no given values: every row is a default */
    if (json != NULL && *json != '\0' &&
        zd_tc_json_parse(json, "config", &root, NULL, 0) == ZS_OK) {
        zd_tce_resolve_aliases(root);
    }

    for (size_t i = 1; i < zd_tc_n_keys && rows != NULL; i++) {
        const zd_tc_key_t *k = &zd_tc_keys[i];
        cJSON *row;
        if (k->fate != ZD_TC_HONOURED || (k->type == ZD_TC_OBJECT && !(k->flags & ZD_TC_OPAQUE))) {
            continue;
        }
        row = zd_tce_row(k, root, cfg);
        if (row != NULL) {
            cJSON_AddItemToArray(rows, row);
        }
    }
    text = rows != NULL ? cJSON_PrintUnformatted(rows) : NULL;
    cJSON_Delete(rows);
    cJSON_Delete(root);
    return text;
}

void zd_train_config_print_explained(FILE *out, const char *explained)
{
    cJSON *rows = explained != NULL ? cJSON_Parse(explained) : NULL;
    const cJSON *row;

    fprintf(out, "%-50s %-24s %s\n", "KEY", "VALUE", "SOURCE");
    cJSON_ArrayForEach(row, rows)
    {
        char *v = cJSON_PrintUnformatted(cJSON_GetObjectItem(row, "value"));
        fprintf(out, "%-50s %-24s %s\n", cJSON_GetStringValue(cJSON_GetObjectItem(row, "key")),
                v != NULL ? v : "?", cJSON_GetStringValue(cJSON_GetObjectItem(row, "source")));
        cJSON_free(v);
    }
    cJSON_Delete(rows);
}
