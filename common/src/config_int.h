/* Private to the config tables: the helpers of config_types.c (value parsers) that config.c
 * (tables, files, environment, flags) uses too. Includes nothing of zerod's, so that both
 * include it from above. */
#ifndef ZS_CONFIG_INT_H
#define ZS_CONFIG_INT_H

#include <stddef.h>

struct zs_config_parser;

#define ZS_CONFIG_NAME_MAX 128

/* Whitespace: space, tab, newline, CR, FF or VT. */
int zs_is_blank(char c);
/* Copy s without surrounding blanks into buf; -1 if it does not fit. */
int zs_trim_copy(const char *s, char *buf, size_t len);
/* Storage size of a built-in parser's field; 0 for a parser defined elsewhere. */
size_t zs_config_field_size(const struct zs_config_parser *parser);

#endif
