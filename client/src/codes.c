/*
 * The public header's codes against common's tables, at compile time. zerod/zc.h stands alone
 * (it includes no internal header), so it spells its ZC_* status codes and zc_dtype_t values
 * out; this list, expanded from ZS_STATUS_MAP and ZS_DTYPE_MAP, stops the build when one of
 * them is missing or differs. client/check_codes.cmake checks the other way round: that zc.h
 * names no code the tables lack. The protobuf-c enums libzc reads off the wire are checked here
 * too: ipc.proto's DType, and Status although status.proto is itself generated from
 * ZS_STATUS_MAP.
 */
#include "zc_int.h"

#include "zerod/common/v1/status.pb-c.h"
#include "zs/dtype.h"
#include "zs/status.h"

/*
 * Statuses deliberately left out of zc.h, and why; each is given its ZC_ name here only, so
 * that the list below still covers the whole table.
 *   IN_PROGRESS: the only positive status, the daemon's "not done yet" inside its engine; no
 *   reply carries it and no libzc call returns it (zc.h: "ZC_OK or a negative status").
 */
#define ZC_IN_PROGRESS ZS_IN_PROGRESS

#define ZC_CHECK_STATUS_(name, value, str)                                                         \
    _Static_assert(ZC_##name == (value), "zerod/zc.h: ZC_" #name " differs from ZS_STATUS_MAP");   \
    _Static_assert(ZEROD__COMMON__V1__STATUS__ZS_##name == (value),                                \
                   "status.pb-c.h: ZS_" #name " differs from ZS_STATUS_MAP");
ZS_STATUS_MAP(ZC_CHECK_STATUS_)
#undef ZC_CHECK_STATUS_

#define ZC_CHECK_DTYPE_(name, value, str, bytes)                                                   \
    _Static_assert(ZC_DTYPE_##name == (value),                                                     \
                   "zerod/zc.h: ZC_DTYPE_" #name " differs from ZS_DTYPE_MAP");                    \
    _Static_assert(ZEROD__IPC__V1__DTYPE__DTYPE_##name == (value),                                 \
                   "ipc.pb-c.h: DTYPE_" #name " differs from ZS_DTYPE_MAP");
ZS_DTYPE_MAP(ZC_CHECK_DTYPE_)
#undef ZC_CHECK_DTYPE_
