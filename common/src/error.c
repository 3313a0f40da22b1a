#include "zs/error.h"

#include <stdio.h>
#include <string.h>

zs_status_t zs_verrf(char *err, size_t errlen, zs_status_t status, const char *fmt, va_list ap)
{
    if (err != NULL && errlen > 0) {
        vsnprintf(err, errlen, fmt, ap);
    }
    return status;
}

zs_status_t zs_errf(char *err, size_t errlen, zs_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    status = zs_verrf(err, errlen, status, fmt, ap);
    va_end(ap);
    return status;
}

zs_status_t zs_lasterr_vset(zs_lasterr_t *lasterr, zs_status_t status, const char *fmt, va_list ap)
{
    return zs_verrf(lasterr->msg, sizeof(lasterr->msg), status, fmt, ap);
}

zs_status_t zs_lasterr_set(zs_lasterr_t *lasterr, zs_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    status = zs_lasterr_vset(lasterr, status, fmt, ap);
    va_end(ap);
    return status;
}

zs_status_t zs_lasterr_prefix(zs_lasterr_t *lasterr, zs_status_t status, const char *what)
{
    char kept[sizeof(lasterr->msg)];

    if (lasterr->msg[0] == '\0') {
        return zs_lasterr_set(lasterr, status, "%s: %s", what, zs_status_string(status));
    }
    memcpy(kept, lasterr->msg, sizeof(kept));
    kept[sizeof(kept) - 1] = '\0';
    return zs_lasterr_set(lasterr, status, "%s: %s", what, kept);
}

void zs_lasterr_clear(zs_lasterr_t *lasterr)
{
    lasterr->msg[0] = '\0';
}

const char *zs_lasterr_get(const zs_lasterr_t *lasterr)
{
    return lasterr->msg;
}
