#include "zs/dtype.h"

/* zs_dtype_from_int and ZS_DTYPE_COUNT take the map's values to be 0..ZS_DTYPE_COUNT-1 */
enum {
#define ZS_DTYPE_ONE_(name, value, str, bytes) +1
    ZS_DTYPE_MAP_ROWS = 0 ZS_DTYPE_MAP(ZS_DTYPE_ONE_),
#undef ZS_DTYPE_ONE_
};
_Static_assert(ZS_DTYPE_MAP_ROWS == ZS_DTYPE_COUNT,
               "ZS_DTYPE_COUNT is not the rows of ZS_DTYPE_MAP");
#define ZS_DTYPE_DENSE_(name, value, str, bytes)                                                   \
    _Static_assert((value) >= 0 && (value) < ZS_DTYPE_COUNT,                                       \
                   "ZS_DTYPE_" #name " is out of 0..count-1");
ZS_DTYPE_MAP(ZS_DTYPE_DENSE_)
#undef ZS_DTYPE_DENSE_

const char *zs_dtype_name(zs_dtype_t dtype)
{
    switch (dtype) {
#define ZS_DTYPE_NAME_(name, value, str, bytes)                                                    \
    case ZS_DTYPE_##name:                                                                          \
        return (str);
        ZS_DTYPE_MAP(ZS_DTYPE_NAME_)
#undef ZS_DTYPE_NAME_
    }
    return "unknown";
}

zs_status_t zs_dtype_from_int(long value, zs_dtype_t *dtype_p)
{
    if (value < 0 || value >= ZS_DTYPE_COUNT) {
        return ZS_ERR_INVALID;
    }
    *dtype_p = (zs_dtype_t)value;
    return ZS_OK;
}
