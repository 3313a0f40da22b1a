/* zc_last_error(): one message per thread, kept where a failure is decided. */
#include "zc_int.h"

#include "zs/status.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char zc_errmsg[ZC_ERRMSG_LEN];

int zc_fail(int status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(zc_errmsg, sizeof(zc_errmsg), fmt, ap);
    va_end(ap);
    return status;
}

int zc_fail_prefix(int status, const char *what)
{
    char tmp[ZC_ERRMSG_LEN];
    size_t n;

    if (zc_errmsg[0] == '\0') {
        snprintf(zc_errmsg, sizeof(zc_errmsg), "%s: %s", what, zs_status_string(status));
        return status;
    }
    memcpy(tmp, zc_errmsg, sizeof(tmp));
    n = (size_t)snprintf(zc_errmsg, sizeof(zc_errmsg), "%s: ", what);
    if (n < sizeof(zc_errmsg)) {
        memcpy(zc_errmsg + n, tmp, sizeof(zc_errmsg) - n - 1);
        zc_errmsg[sizeof(zc_errmsg) - 1] = '\0';
    }
    return status;
}

void zc_error_clear(void)
{
    zc_errmsg[0] = '\0';
}

ZC_API const char *zc_last_error(void)
{
    return zc_errmsg;
}

ZC_API const char *zc_status_name(int status)
{
    return zs_status_name(status);
}

ZC_API const char *zc_version(void)
{
    return ZC_VERSION_STRING;
}

int zc_result_status(const Zerod__Ipc__V1__Result *result, const char *what)
{
    int status;

    if (result == NULL) {
        return ZC_OK;
    }
    status = (int)result->status;
    if (status == ZC_OK) {
        return ZC_OK;
    }
    return zc_fail(status, "%s: %s: %s", what, zs_status_name(status),
                   (result->message != NULL && result->message[0] != '\0')
                       ? result->message
                       : zs_status_string(status));
}
