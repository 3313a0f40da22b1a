/*
 * Config tables: one row per key. The same table parses an INI file
 * (inih), ZEROD_<NAME> environment variables and command-line flags, in that rising order of
 * precedence; prints the effective config; and rejects a bad value naming key and value.
 *
 *   typedef struct { uint64_t job_linger_ns; uint64_t max_shard_bytes; char *socket; } cfg_t;
 *   static const zs_config_row_t rows[] = {
 *       {"job_linger", "10min", "keep a job this long with no trainer",
 *        offsetof(cfg_t, job_linger_ns), &zs_config_duration, NULL, ZS_CONFIG_RELOAD},
 *       ...
 *   };
 *   static const zs_config_table_t table = {"zerod", rows, ZS_ARRAY_SIZE(rows)};
 *
 * Values live in a caller-owned struct; string/path values are heap copies released by
 * zs_config_cleanup(). A row and its value types are zs/config_types.h's.
 */
#ifndef ZS_CONFIG_H
#define ZS_CONFIG_H

#include "zs/config_types.h"
#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zs_config_table {
    const char *section; /* INI section accepted besides the global one, e.g. "zerod" */
    const zs_config_row_t *rows;
    size_t n_rows;
} zs_config_table_t;

/* Where a value came from, for messages and --print-config. */
typedef enum zs_config_source {
    ZS_CONFIG_SRC_DEFAULT = 0,
    ZS_CONFIG_SRC_FILE,
    ZS_CONFIG_SRC_ENV,
    ZS_CONFIG_SRC_FLAG,
} zs_config_source_t;

const char *zs_config_source_name(zs_config_source_t src);

/* Error text buffer for all calls below: "config key 'job_linger' (from ZEROD_JOB_LINGER):
 * invalid value '10 parsecs': expected a duration such as 60s, 250ms, 10min". */
#define ZS_CONFIG_ERRLEN 512

/* Fill obj with every row's default. */
zs_status_t zs_config_init(const zs_config_table_t *t, void *obj, char *err, size_t errlen);
/* Free strings/paths held by obj. */
void zs_config_cleanup(const zs_config_table_t *t, void *obj);

const zs_config_row_t *zs_config_find(const zs_config_table_t *t, const char *name);
/* Set one key from text. `name` may use dashes or underscores. Unknown key: ZS_ERR_NOT_FOUND. */
zs_status_t zs_config_set(const zs_config_table_t *t, void *obj, const char *name,
                          const char *value, zs_config_source_t src, char *err, size_t errlen);
/* INI file: `key = value` lines at top level or in [section]; # and ; comments. An unknown key,
 * an unknown section or a bad value fails naming file, line and key. */
zs_status_t zs_config_load_file(const zs_config_table_t *t, void *obj, const char *path, char *err,
                                size_t errlen);
/* Every ZEROD_<NAME> variable in envp (NULL: environ) whose NAME is a key. Variables that are
 * not keys and not in `ignore` (NULL-terminated names without the prefix, e.g. "LOG_LEVEL")
 * produce one warning each through zs_warn(ZS_SUB_CFG, ...). */
zs_status_t zs_config_load_env(const zs_config_table_t *t, void *obj, char *const *envp,
                               const char *const *ignore, char *err, size_t errlen);

/* Command-line flags that are config keys: (--name value | --name=value). */
typedef struct zs_config_flag {
    const char *name;
    const char *value;
} zs_config_flag_t;

/* The whole rising-precedence load: defaults < file (if path != NULL) < env < flags. */
zs_status_t zs_config_load(const zs_config_table_t *t, void *obj, const char *file_path,
                           char *const *envp, const char *const *env_ignore,
                           const zs_config_flag_t *flags, size_t n_flags, char *err, size_t errlen);

/* Print `name = value   # doc` for every row (secrets hidden). */
void zs_config_print(const zs_config_table_t *t, const void *obj, FILE *out);
/* One value as text (secrets hidden). */
void zs_config_format(const zs_config_table_t *t, const void *obj, const char *name, char *buf,
                      size_t len);

#ifdef __cplusplus
}
#endif
#endif
