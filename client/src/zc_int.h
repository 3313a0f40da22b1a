/*
 * libzc internals: the framed connection (wire.c), the error buffer (error.c) and the session's
 * request API (session.c) on which the public calls are built, e.g. the control queries
 * (control.c). Never installed, and nothing outside libzc and its unit tests includes it:
 * zeroctl too uses only the public face, client/include/zerod/zc.h, which stays free of
 * protobuf types.
 */
#ifndef ZC_INT_H
#define ZC_INT_H

#include "zerod/zc.h"

#include "zerod/ipc/v1/ipc.pb-c.h"
#include "zk/kernels.h"
#include "zs/error.h"
#include "zs/time.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ipc.proto header: PROTOCOL_VERSION. The frame (length prefix, limit) is zs/frame.h's. */
#define ZC_PROTOCOL_VERSION 1u
/* File descriptors a connection holds between receiving them and the frame that owns them
 * (AttachReply carries 3 at most). */
#define ZC_MAX_PENDING_FDS    8u
#define ZC_DEFAULT_TIMEOUT_MS 60000
/* The default deadline is at least 2 x the daemon's peer deadline + this (HelloReply). */
#define ZC_PEER_DEADLINE_MARGIN_MS 10000
#define ZC_ERRMSG_LEN              ZS_ERRMSG_LEN

typedef Zerod__Ipc__V1__Frame zc_frame_t;
typedef Zerod__Ipc__V1__Frame__BodyCase zc_body_case_t;

/* ---- errors (error.c) ---------------------------------------------------------------- */

/* Keep a message for zc_last_error() in this thread and return status (zs_lasterr_t). */
int zc_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message: "what: <message>". Returns status. */
int zc_fail_prefix(int status, const char *what);
void zc_error_clear(void);

/* ---- framed connection (wire.c) ------------------------------------------------------ */

typedef struct zc_conn {
    int fd;       /* connected Unix stream socket, non-blocking; -1 when closed */
    uint8_t *buf; /* receive buffer: bytes [off, len) are not yet decoded */
    size_t off, len, cap;
    int fds[ZC_MAX_PENDING_FDS]; /* received with SCM_RIGHTS, not yet claimed */
    uint32_t n_fds;
    uint64_t next_seq;
    /* HelloReply.keepalive_timeout_ms: a wait for data fails with ZC_ERR_PEER_LOST after this
     * long without a byte (the daemon sends StillWorking while a request is in progress); 0:
     * only the call's deadline bounds it */
    uint64_t silence_ms;
    char path[108]; /* the socket, for messages ("" when not known) */
} zc_conn_t;

/* Take over a connected socket (sets O_NONBLOCK). */
int zc_conn_init(zc_conn_t *conn, int fd);
/* Close the socket and any unclaimed fds, free the buffer. Safe twice. */
void zc_conn_cleanup(zc_conn_t *conn);
/* Connect to a Unix socket path: ZC_ERR_UNREACHABLE (nothing listens / no such socket),
 * ZC_ERR_PERMISSION, ZC_ERR_INVALID (path too long), ZC_ERR_TIMEOUT (the listener's backlog
 * stayed full until the deadline: a stopped or wedged daemon). */
int zc_conn_connect(zc_conn_t *conn, const char *path, zs_deadline_t deadline);

/* A new request sequence number (never 0). */
uint64_t zc_conn_next_seq(zc_conn_t *conn);
/* Pack and send one frame, waiting for socket space until the deadline. fd >= 0: a descriptor
 * to pass with the frame's first bytes (SCM_RIGHTS; the frame's `fds` says 1). */
int zc_conn_send(zc_conn_t *conn, zc_frame_t *frame, int fd, zs_deadline_t deadline);
/* Receive and decode one frame (caller frees with zerod__ipc__v1__frame__free_unpacked).
 * File descriptors that arrive on the way are kept in conn->fds. Errors: ZC_ERR_TIMEOUT,
 * ZC_ERR_PEER_LOST (nothing came for silence_ms), ZC_ERR_CLOSED (EOF, also in the middle of a
 * frame), ZC_ERR_PROTOCOL (length 0 or over ZS_FRAME_MAX, undecodable frame, truncated fds),
 * ZC_ERR_IO. */
int zc_conn_recv(zc_conn_t *conn, zs_deadline_t deadline, zc_frame_t **frame_p);
/* Move up to max received fds to fds[] (in arrival order); returns how many. */
uint32_t zc_conn_take_fds(zc_conn_t *conn, int *fds, uint32_t max);
/* Close every unclaimed fd. */
void zc_conn_close_fds(zc_conn_t *conn);

/* "hello_reply", "slot_free", ... for messages. */
const char *zc_body_name(zc_body_case_t body);
/* The Result of a frame's body (every reply has one: ipc.proto `Result result = 1`); NULL when
 * the body carries none or left it out (both read as OK). */
const Zerod__Ipc__V1__Result *zc_frame_result(const zc_frame_t *frame);

/* ---- request API (session.c) --------------------------------------------------------- */

typedef struct zc_daemon_info {
    char version[64];
    char device[64];
    int32_t pid;
    uint32_t protocol;
    uint64_t peer_deadline_ms; /* see HelloReply */
} zc_daemon_info_t;

/* What the daemon said in its HelloReply. */
const zc_daemon_info_t *zc_session_daemon_info(const zc_session_t *session);
/* The session's default call deadline (after the HelloReply raised it). */
int zc_session_timeout_ms(const zc_session_t *session);

/* Send `request` (its seq is set here) and wait for the frame of body `reply_case` that echoes
 * the seq; SlotFree frames that arrive meanwhile are processed. timeout_ms < 0: session
 * default. The caller owns *reply_p (zerod__ipc__v1__frame__free_unpacked). The reply's own
 * Result is not interpreted: zc_session_call does that. */
int zc_session_request(zc_session_t *session, zc_frame_t *request, zc_body_case_t reply_case,
                       int timeout_ms, zc_frame_t **reply_p);
/* The same, with a directory descriptor passed along (ipc.proto: the daemon works in it with
 * this process's rights). fd stays the caller's. */
int zc_session_request_fd(zc_session_t *session, zc_frame_t *request, int fd,
                          zc_body_case_t reply_case, int timeout_ms, zc_frame_t **reply_p);

/* zc_session_request(_fd), then the reply's Result (zc_frame_result): OK only when both are,
 * and then *reply_p is the reply, the caller's to free or to keep (zc_session_keep). A failed
 * Result frees the reply and keeps "what: NAME: message" for zc_last_error(), or "NAME:
 * message" with what NULL, for a caller that names every failure itself (zc_fail_prefix). A
 * failed exchange keeps its own message. */
int zc_session_call(zc_session_t *session, zc_frame_t *request, zc_body_case_t reply_case,
                    int timeout_ms, const char *what, zc_frame_t **reply_p);
int zc_session_call_fd(zc_session_t *session, zc_frame_t *request, int fd,
                       zc_body_case_t reply_case, int timeout_ms, const char *what,
                       zc_frame_t **reply_p);

/* A trainer call that needs the job's parameters: the session is attached, ParamsReady was
 * sent, and every submitted slot came back (train.c). */
int zc_session_prepare_call(zc_session_t *session, int timeout_ms, const char *what);

/* path made absolute against this process's working directory (a daemon's is not ours), into
 * buf; ZC_ERR_INVALID / ZC_ERR_IO named after `what` otherwise (dir.c, as the next). */
int zc_abs_path(const char *what, const char *path, char *buf, size_t len);
/* The directory `path` (made absolute into abs) opened with this process's rights, for the
 * daemon to work in (*fd_p: close it after the request); create: made first when missing, as
 * `mkdir -p` would (mode 0777 less the umask). Errors name `what` and the path. */
int zc_dir_open(const char *what, const char *path, bool create, char *abs, size_t len, int *fd_p);

/* Status of a reply's Result (OK when absent); when not OK, keeps "what: NAME: message" ("NAME:
 * message" when what is NULL) (error.c). */
int zc_result_status(const Zerod__Ipc__V1__Result *result, const char *what);

/* Replies the session keeps for the public calls that read them by index afterwards
 * (zc_session_memory_term, zc_session_group_shard): one of each kind, the latest. */
typedef enum zc_kept {
    ZC_KEPT_STATUS = 0, /* StatusReply */
    ZC_KEPT_SHARD,      /* ShardInfoReply */
    ZC_KEPT_JOB_LIST,   /* JobListReply */
    ZC_KEPT_JOB_END,    /* JobEndReply */
    ZC_KEPT_TRACE,      /* TraceReply */
    ZC_KEPT_COUNT
} zc_kept_t;

/* Keep `reply` (the session now owns it), freeing the one kept before. */
void zc_session_keep(zc_session_t *session, zc_kept_t kind, zc_frame_t *reply);
/* The reply kept of that kind; NULL when none. */
const zc_frame_t *zc_session_kept(const zc_session_t *session, zc_kept_t kind);

/* ---- gradient copies into slots (fill.c) --------------------------------------------- */

/* The daemon's plan for same-type copies (StepReply.copy_stores), as a zk plan whose other
 * families never stream nor prefetch; valid only when its variant is this process's. */
typedef struct zc_copy_plan {
    int valid;
    zk_store_plan_t plan;
} zc_copy_plan_t;

/* Take what a step reply says (cs NULL: nothing yet, keep what there is). */
void zc_copy_plan_take(zc_copy_plan_t *cp, const Zerod__Ipc__V1__CopyStores *cs);
/* How a copy of `bytes` bytes streams under cp: zk's exec for it. */
zk_exec_t zc_copy_exec(const zc_copy_plan_t *cp, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
