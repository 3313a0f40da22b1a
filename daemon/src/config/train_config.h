/*
 * The training config a job attaches with: DeepSpeed key names and semantics
 * (docs/training-config.md), parsed with cJSON.
 *
 * One table (zd_train_config_keys()) describes every key: dotted path, JSON type, default,
 * range or allowed values, one line of doc, where it lands in zd_train_config_t, and its fate
 * (honoured, ignored with a warning, refused with a reason). Parsing, the messages for bad
 * values and unknown keys, the list of ignored keys, per-group overrides and the key table of
 * docs/training-config.md all come from it. The config's and the table's types are
 * config/train_config_types.h's, the table config/train_config_keys.h's.
 */
#ifndef ZD_TRAIN_CONFIG_H
#define ZD_TRAIN_CONFIG_H

#include "config/train_config_keys.h"
#include "config/train_config_types.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Parse a DeepSpeed-style JSON config (NULL or "": every default). On error: ZS_ERR_CONFIG and
 * a message naming the dotted key and the value in err, e.g. "config key
 * 'zero_optimization.reduce_bucket_size': expected a positive integer, got -3". Keys that are
 * accepted but not used (the table's ignored keys, and top-level keys of other DeepSpeed
 * features) come back in `ignored` as a comma list of dotted keys ("" when none; ends in
 * ", ..." when cut short), for the caller to warn about once; ignored may be NULL. */
zs_status_t zd_train_config_parse(const char *json, zd_train_config_t *cfg, char *ignored,
                                  size_t ignored_len, char *err, size_t errlen);

/* DeepSpeed's batch triple: train_batch_size = micro x gradient_accumulation_steps x world;
 * any two given determine the third, one alone sets gradient_accumulation_steps 1, all three must
 * agree. Neither batch size given: gradient_accumulation_steps as given (zerod needs no batch
 * size; DeepSpeed would refuse). ZS_ERR_CONFIG naming all three values when they disagree. */
zs_status_t zd_train_config_resolve_batch(zd_train_config_t *cfg, uint32_t world, char *err,
                                          size_t errlen);

/* The resolved config (parsed and resolved into cfg) key by key, as a JSON array of {"key",
 * "value", "source"} with source "config" (given), "default" or "derived" (the batch triple,
 * grad_accum_dtype's default); malloc'd, NULL when out of memory. */
char *zd_train_config_explain(const char *json, const zd_train_config_t *cfg);
/* That array as a table (KEY VALUE SOURCE). */
void zd_train_config_print_explained(FILE *out, const char *explained);

/* Parse one group's options JSON (keys of optimizer.params) over `base`. NULL/empty: base.
 * Messages name the key as groups[<group>].options.<key>. */
zs_status_t zd_group_opts_parse(const char *json, const zd_group_opts_t *base, uint32_t group,
                                zd_group_opts_t *opts, char *err, size_t errlen);

/* Stable hash of the parsed config (every field that changes the math; key order and keys
 * that do not change the math play no part). Compared across daemons and on re-attach. */
uint64_t zd_train_config_hash(const zd_train_config_t *cfg);

typedef enum zd_train_config_format {
    ZD_TC_FORMAT_TEXT,     /* one key per line, for a terminal */
    ZD_TC_FORMAT_MARKDOWN, /* the table of docs/training-config.md */
} zd_train_config_format_t;

/* Print every key of the table: path, type, default, allowed values, fate, doc. */
void zd_train_config_print_keys(FILE *out, zd_train_config_format_t fmt);

#endif
