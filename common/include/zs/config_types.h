/*
 * The rows of a config table and the types of their values (zs/config.h reads tables of them):
 * a row's name, default, doc, field and parser; the built-in parsers and the stand-alone
 * parsers of sizes, durations and booleans (common/src/config_types.c), which the JSON training
 * config uses too.
 */
#ifndef ZS_CONFIG_TYPES_H
#define ZS_CONFIG_TYPES_H

#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

typedef struct zs_config_row zs_config_row_t;

/* A value parser: parse `value` into `field`; on error write a reason (e.g. "expected a size
 * such as 512MiB") into err and return non-OK. format() prints the field back in a form parse()
 * accepts. */
typedef struct zs_config_parser {
    const char *name; /* "size", "duration", "bool", "enum", "path", "string", "int", "double" */
    zs_status_t (*parse)(const zs_config_row_t *row, const char *value, void *field, char *err,
                         size_t errlen);
    void (*format)(const zs_config_row_t *row, const void *field, char *buf, size_t len);
    void (*release)(void *field); /* NULL when the field owns nothing */
} zs_config_parser_t;

/* Storage types: size -> uint64_t bytes; duration -> uint64_t nanoseconds; bool -> int;
 * enum -> int (index into arg's NULL-terminated const char *[]); path/string -> char *;
 * int -> int64_t, double -> double, size, duration: arg is an optional const
 * zs_config_range_t * (bytes and nanoseconds for sizes and durations). */
extern const zs_config_parser_t zs_config_size;
extern const zs_config_parser_t zs_config_duration;
extern const zs_config_parser_t zs_config_bool;
extern const zs_config_parser_t zs_config_enum;
extern const zs_config_parser_t zs_config_path;
extern const zs_config_parser_t zs_config_string;
extern const zs_config_parser_t zs_config_int;
extern const zs_config_parser_t zs_config_double;

typedef struct zs_config_range {
    double min;
    double max;
} zs_config_range_t;

enum {
    ZS_CONFIG_RELOAD = 1u << 0, /* may change on SIGHUP */
    ZS_CONFIG_SECRET = 1u << 1, /* printed as "<hidden>" */
};

struct zs_config_row {
    const char *name; /* snake_case; flag --name-with-dashes; env ZEROD_NAME */
    const char *def;  /* default, as a string the parser accepts */
    const char *doc;  /* one line */
    size_t offset;    /* offsetof the field in the config struct */
    const zs_config_parser_t *parser;
    const void *arg; /* enum names, range, ... */
    unsigned flags;
};

/* The values a row accepts, for help and docs: "[100ms, 1h]", "[1, 64]", "a | b | c", or ""
 * when any value of its type is accepted. */
void zs_config_allowed(const zs_config_row_t *row, char *buf, size_t len);

/* Stand-alone parsers, also used by the JSON training config. Each returns ZS_ERR_INVALID on a
 * bad form and ZS_ERR_OVERFLOW when the value does not fit. */
zs_status_t zs_parse_size(const char *s, uint64_t *bytes_p);  /* 512MiB, 4k, 1GB, 1e6 */
zs_status_t zs_parse_duration(const char *s, uint64_t *ns_p); /* 60s, 250ms, 10min, 1h */
zs_status_t zs_parse_bool(const char *s, int *b_p);           /* true/false yes/no on/off 1/0 */

#ifdef __cplusplus
}
#endif
#endif
