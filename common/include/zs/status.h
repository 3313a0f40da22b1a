/*
 * zs_status_t: the one status enum of the whole project.
 *
 * Generated from ZS_STATUS_MAP so names, strings, the protobuf enum
 * (proto/zerod/common/v1/status.proto) and the Python package's codes
 * (client/python/zerod/_codes.py), both written at build time by zs_gen_codes
 * (common/src/gen_codes.c), can never drift; libzc checks zerod/zc.h's ZC_* codes against it
 * at build time (client/src/codes.c, client/check_codes.cmake). Values go on the wire: never
 * renumber, only append.
 */
#ifndef ZS_STATUS_H
#define ZS_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* XX(NAME, value, "description") */
#define ZS_STATUS_MAP(XX)                                                                          \
    XX(OK, 0, "success")                                                                           \
    XX(IN_PROGRESS, 1, "in progress")                                                              \
    XX(ERR_NO_MEMORY, -1, "out of memory")                                                         \
    XX(ERR_INVALID, -2, "invalid argument")                                                        \
    XX(ERR_IO, -3, "input/output error")                                                           \
    XX(ERR_NOT_FOUND, -4, "not found")                                                             \
    XX(ERR_EXISTS, -5, "already exists")                                                           \
    XX(ERR_BUSY, -6, "busy")                                                                       \
    XX(ERR_TIMEOUT, -7, "timed out")                                                               \
    XX(ERR_UNSUPPORTED, -8, "not supported")                                                       \
    XX(ERR_OVERFLOW, -9, "arithmetic overflow")                                                    \
    XX(ERR_LIMIT, -10, "limit exceeded")                                                           \
    XX(ERR_PERMISSION, -11, "permission denied")                                                   \
    XX(ERR_PROTOCOL, -20, "protocol error")                                                        \
    XX(ERR_VERSION, -21, "version mismatch")                                                       \
    XX(ERR_FRAME_TOO_LARGE, -22, "frame too large")                                                \
    XX(ERR_CLOSED, -23, "connection closed")                                                       \
    XX(ERR_CONFIG, -30, "configuration error")                                                     \
    XX(ERR_LAYOUT_MISMATCH, -31, "layout mismatch")                                                \
    XX(ERR_STATE, -32, "invalid state")                                                            \
    XX(ERR_LOSS_SCALE, -33, "loss scale already at minimum")                                       \
    XX(ERR_JOB_ENDED, -34, "job ended")                                                            \
    XX(ERR_PEER_LOST, -40, "peer lost")                                                            \
    XX(ERR_ABORTED, -41, "aborted")                                                                \
    XX(ERR_AUTH, -42, "authentication failed")                                                     \
    XX(ERR_UNREACHABLE, -43, "unreachable")                                                        \
    XX(ERR_UCX, -44, "UCX error")                                                                  \
    XX(ERR_CUDA, -50, "CUDA error")                                                                \
    XX(ERR_NCCL, -51, "NCCL error")                                                                \
    XX(ERR_NO_DEVICE, -52, "no such device")

typedef enum zs_status {
#define ZS_STATUS_ENUM_(name, value, str) ZS_##name = (value),
    ZS_STATUS_MAP(ZS_STATUS_ENUM_)
#undef ZS_STATUS_ENUM_
} zs_status_t;

/* "ERR_INVALID"; "UNKNOWN" for a value not in the map. */
const char *zs_status_name(int status);
/* "invalid argument"; "unknown status" for a value not in the map. */
const char *zs_status_string(int status);
/* Parse a name ("ERR_INVALID" or "ZS_ERR_INVALID"); 0 on success, -1 if unknown. */
int zs_status_from_name(const char *name, zs_status_t *status_p);

#ifdef __cplusplus
}
#endif
#endif
