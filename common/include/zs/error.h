/*
 * Error messages into a caller's buffer: the one helper every module uses to say what went
 * wrong ("attach: world 0 is out of range 1..4096") and return the status in one line:
 *
 *     return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: world %u is out of range", w);
 */
#ifndef ZS_ERROR_H
#define ZS_ERROR_H

#include "zs/status.h"

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Format into err (NULL or errlen 0: nothing is written) and return status. */
zs_status_t zs_errf(char *err, size_t errlen, zs_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
zs_status_t zs_verrf(char *err, size_t errlen, zs_status_t status, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#ifdef __cplusplus
}
#endif
#endif
