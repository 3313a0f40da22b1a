/*
 * Inside the training config: what the parser (config/train_config.c) and the printers share
 * besides the key table (config/train_config_keys.h): the table's navigation and an unknown
 * key's hint (config/train_config_table.c), and the JSON read as DeepSpeed reads it
 * (config/train_config_json.c).
 */
#ifndef ZD_TRAIN_CONFIG_INT_H
#define ZD_TRAIN_CONFIG_INT_H

#include "config/train_config_types.h"
#include "zs/status.h"

#include <stddef.h>

struct cJSON;

/* The longest key path a message shows. */
#define ZD_TC_PATHLEN 192

/* Rows a table may have (the parser's per-call `seen` flags). */
#define ZD_TC_MAX_KEYS 320

/* ---- config/train_config_table.c ------------------------------------------------------------ */

/* The last component of k's path. */
const char *zd_tc_leaf(const zd_tc_key_t *k);
/* Is k a direct child of parent ("" is the root)? */
bool zd_tc_is_child(const zd_tc_key_t *parent, const zd_tc_key_t *k);
/* parent's child named `name` (case as written), or NULL. */
const zd_tc_key_t *zd_tc_child(const zd_tc_key_t *parent, const char *name);
/* The row of a full path, or NULL. */
const zd_tc_key_t *zd_tc_find(const char *path);
/* `shown` "." `name`, the name as printable ASCII (a client's key must not forge a log line). */
void zd_tc_join(char *buf, size_t len, const char *shown, const char *name);
/* "; did you mean 'fp16.loss_scale'?" or "; 'stage' is a key of 'zero_optimization'" for an
 * unknown key `name` under parent; "" when nothing is close. */
void zd_tc_suggest(const zd_tc_key_t *parent, const char *shown_parent, const char *name, char *buf,
                   size_t len);
/* " (known keys of 'optimizer.params': lr, betas, ...)" */
void zd_tc_known(const zd_tc_key_t *parent, const char *shown_parent, char *buf, size_t len);

/* ---- config/train_config_json.c ------------------------------------------------------------- */

/* Parse text as Python's json.loads does (DeepSpeed reads the config with it): the bare tokens
 * Infinity, -Infinity and NaN are numbers, nothing may follow the value. *root_p: the tree, for
 * cJSON_Delete. ZS_ERR_CONFIG: "<what>: not valid JSON at line L, column C, near '...'". */
zs_status_t zd_tc_json_parse(const char *text, const char *what, struct cJSON **root_p, char *err,
                             size_t errlen);

/* item as pydantic's lax mode converts it for a field of k's type (DeepSpeed validates its
 * zero_optimization, fp16 and bf16 sections with pydantic models): for a bool "true"/"false",
 * "yes"/"no", "on"/"off", "1"/"0", "t"/"f", "y"/"n" (any case) and the numbers 1 and 0; for an
 * int an integer string ("2", " +2 ", "1_000", "2.00"); for a number a float string ("1e-3",
 * "inf", "nan"). A new item (cJSON_Delete it), or NULL: item is taken as it is. */
struct cJSON *zd_tc_lax(const zd_tc_key_t *k, const struct cJSON *item);

#endif
