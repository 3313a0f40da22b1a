/*
 * Inside the training config: the key table (config/train_config_keys.c) that the parser and the
 * printers of config/train_config.c walk.
 */
#ifndef ZD_TRAIN_CONFIG_INT_H
#define ZD_TRAIN_CONFIG_INT_H

#include "config/train_config.h"

/* Rows a table may have (the parser's per-call `seen` flags). */
#define ZD_TC_MAX_KEYS 320

extern const zd_tc_key_t zd_tc_keys[];
extern const size_t zd_tc_n_keys;

#endif
