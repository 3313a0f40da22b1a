#include "zs/error.h"

#include <stdio.h>

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
