/* zc_last_error(): one message per thread, kept where a failure is decided. */
#include "zc_int.h"

#include "zs/error.h"
#include "zs/status.h"
#include "zs/version.h"

/* libzc's own message per thread, apart from the kernels' (zk_last_error) */
static _Thread_local zs_lasterr_t zc_lasterr;

int zc_fail(int status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    zs_lasterr_vset(&zc_lasterr, (zs_status_t)status, fmt, ap);
    va_end(ap);
    return status;
}

int zc_fail_prefix(int status, const char *what)
{
    zs_lasterr_prefix(&zc_lasterr, (zs_status_t)status, what);
    return status;
}

void zc_error_clear(void)
{
    zs_lasterr_clear(&zc_lasterr);
}

ZC_API const char *zc_last_error(void)
{
    return zs_lasterr_get(&zc_lasterr);
}

ZC_API const char *zc_status_name(int status)
{
    return zs_status_name(status);
}

ZC_API const char *zc_version(void)
{
    return ZS_VERSION;
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
    return zc_fail(status, "%s%s%s: %s", what != NULL ? what : "", what != NULL ? ": " : "",
                   zs_status_name(status),
                   (result->message != NULL && result->message[0] != '\0')
                       ? result->message
                       : zs_status_string(status));
}
