/*
 * The element types of parameters and gradients: the one definition that kernels, daemon and
 * tools share. The wire (ipc.proto DType) and the public client API (zerod/zc.h zc_dtype_t)
 * carry the same values; the files that convert between them check that at compile time, and a
 * number off the wire becomes a dtype only through zs_dtype_from_int.
 */
#ifndef ZS_DTYPE_H
#define ZS_DTYPE_H

#include "zs/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XX(NAME, value, "name", bytes per element). Values go on the wire and into zerod/zc.h's
 * zc_dtype_t and the Python package (generated and checked at build time from this map):
 * never renumber, only append, keeping them 0..ZS_DTYPE_COUNT-1. */
#define ZS_DTYPE_MAP(XX)                                                                           \
    XX(F32, 0, "fp32", 4)                                                                          \
    XX(F16, 1, "fp16", 2)                                                                          \
    XX(BF16, 2, "bf16", 2)

typedef enum zs_dtype {
#define ZS_DTYPE_ENUM_(name, value, str, bytes) ZS_DTYPE_##name = (value),
    ZS_DTYPE_MAP(ZS_DTYPE_ENUM_)
#undef ZS_DTYPE_ENUM_
} zs_dtype_t;

#define ZS_DTYPE_COUNT 3

/* Bytes of one element: 4, 2, 2; 0 for a value that is no dtype. */
static inline size_t zs_dtype_size(zs_dtype_t dtype)
{
    switch (dtype) {
#define ZS_DTYPE_SIZE_(name, value, str, bytes)                                                    \
    case ZS_DTYPE_##name:                                                                          \
        return (bytes);
        ZS_DTYPE_MAP(ZS_DTYPE_SIZE_)
#undef ZS_DTYPE_SIZE_
    }
    return 0;
}

/* "fp32", "fp16", "bf16"; "unknown" for a value that is no dtype. */
const char *zs_dtype_name(zs_dtype_t dtype);

/* A dtype from a number that came from outside (the wire, a caller): ZS_ERR_INVALID unless it
 * is one. */
zs_status_t zs_dtype_from_int(long value, zs_dtype_t *dtype_p);

#ifdef __cplusplus
}
#endif
#endif
