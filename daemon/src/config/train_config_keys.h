/*
 * The key table of the training config (config/train_config_keys.c): every key of DeepSpeed's
 * ZeRO-1/2 config, in document order, with its type, default, range, fate and doc.
 */
#ifndef ZD_TRAIN_CONFIG_KEYS_H
#define ZD_TRAIN_CONFIG_KEYS_H

#include "config/train_config_types.h"

#include <stddef.h>

/* The rows and their count. */
extern const zd_tc_key_t zd_tc_keys[];
extern const size_t zd_tc_n_keys;

/* The table, in document order (n_p may be NULL). */
const zd_tc_key_t *zd_train_config_keys(size_t *n_p);

#endif
