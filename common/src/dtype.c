#include "zs/dtype.h"

const char *zs_dtype_name(zs_dtype_t dtype)
{
    switch (dtype) {
    case ZS_DTYPE_F32:
        return "fp32";
    case ZS_DTYPE_F16:
        return "fp16";
    case ZS_DTYPE_BF16:
        return "bf16";
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
