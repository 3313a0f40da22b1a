/* Private to the config tables: what config.c (tables, files, environment, flags) and
 * config_types.c (value parsers) share. */
#ifndef ZS_CONFIG_INT_H
#define ZS_CONFIG_INT_H

#include "zs/config.h"

#include <stddef.h>

#define ZS_CONFIG_NAME_MAX 128

/* Whitespace: space, tab, newline, CR, FF or VT. */
int zs_is_blank(char c);
/* Copy s without surrounding blanks into buf; -1 if it does not fit. */
int zs_trim_copy(const char *s, char *buf, size_t len);
/* Storage size of a built-in parser's field; 0 for a parser defined elsewhere. */
size_t zs_config_field_size(const zs_config_parser_t *parser);

#endif
