/*
 * Error messages. zs_errf is the one helper every module uses to say what went wrong into a
 * caller's buffer ("attach: world 0 is out of range 1..4096") and return the status in one
 * line:
 *
 *     return zs_errf(err, errlen, ZS_ERR_INVALID, "attach: world %u is out of range", w);
 *
 * zs_lasterr_t is the one per-thread last-error record, behind zk_last_error() (kernels) and
 * zc_last_error() (libzc). Each module owns its record, one per thread, so that a kernels
 * error never overwrites the message a libzc caller is about to read:
 *
 *     static _Thread_local zs_lasterr_t zk_lasterr;
 *     ...
 *     return zs_lasterr_set(&zk_lasterr, ZS_ERR_INVALID, "zk_adam_step: params is NULL");
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

/* A message for one request: returned to a client (Result.message) or logged. */
#define ZS_MSG_MAX 512

/* Room for one kept message, terminator included; longer messages are truncated. */
#define ZS_ERRMSG_LEN 1024

/* One module's last error in one thread: declare it `static _Thread_local`. Zero-initialized,
 * it holds the empty message. */
typedef struct zs_lasterr {
    char msg[ZS_ERRMSG_LEN];
} zs_lasterr_t;

/* Keep a message and return status. */
zs_status_t zs_lasterr_set(zs_lasterr_t *lasterr, zs_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
zs_status_t zs_lasterr_vset(zs_lasterr_t *lasterr, zs_status_t status, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* Prefix the kept message: "what: <message>", or "what: <status string>" when none is kept.
 * Returns status. */
zs_status_t zs_lasterr_prefix(zs_lasterr_t *lasterr, zs_status_t status, const char *what);
/* Forget the kept message: zs_lasterr_get() returns "" until the next set. */
void zs_lasterr_clear(zs_lasterr_t *lasterr);
/* The kept message, "" when none; valid until the next call on the same record. */
const char *zs_lasterr_get(const zs_lasterr_t *lasterr);

#ifdef __cplusplus
}
#endif
#endif
