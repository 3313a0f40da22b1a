/* Private to the server: the listening daemon (server/server.c) and its client connections
 * (server/conn.c). One loop thread owns both; nothing here is shared with the runner thread. */
#ifndef ZD_SERVER_INT_H
#define ZD_SERVER_INT_H

#include "config/daemon_config.h"
#include "rpc/rpc.h"
#include "server/unix_listen.h"
#include "zs/log.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define ZD_READ_CHUNK (256u << 10)
/* Warnings a local user can cause at will (bad frames, refused connections): per uid, a burst
 * of ZD_WARN_BURST per ZD_WARN_INTERVAL_NS, then a count of what was suppressed. */
/* Back-pressure: a connection whose requests wait in the runner beyond these bounds, or whose
 * replies wait for it to read beyond ZD_CONN_MAX_UNREAD, is not read from until they drain
 * (its writes then stall in the kernel), so what one client makes the daemon hold is bounded
 * whatever it sends. A trainer has at most bucket_slots (<= ZD_MAX_SLOTS) BucketReady and one
 * Step outstanding. */
#define ZD_CONN_MAX_INFLIGHT       256
#define ZD_CONN_MAX_INFLIGHT_BYTES (64u << 20)
#define ZD_CONN_MAX_UNREAD         (4u << 20)
_Static_assert(ZD_CONN_MAX_INFLIGHT > ZD_MAX_SLOTS + 1, "a trainer's own requests never stall it");
/* What all connections together may hold in frame buffers (each frame is at most 16 MiB and
 * must arrive within frame_timeout): beyond it a connection is refused, so that no number of
 * clients can exhaust the daemon's memory. */
#define ZD_BUFFER_BUDGET (512u << 20)
#define ZD_BUFFER_KEEP   (1u << 20) /* a buffer above this shrinks once its frame is out */
/* Who gets in (server/admit.c; docs/design-notes.md "Nothing a client can do kills the
 * daemon"). Each kind of connection has its own cap per uid, so that a pile of one kind
 * (half-open connections, idle trainer sessions) never locks the uid's operator tools or its
 * job's trainer out. Past a cap the uid's oldest idle connection of that kind is closed (idle:
 * no request in progress and no job held), so the newcomer gets in; only when none is idle is
 * the newcomer refused. */
#define ZD_MAX_UNNAMED_PER_UID  32u  /* connected, Hello not yet answered */
#define ZD_MAX_TRAINERS_PER_UID 256u /* trainer role */
#define ZD_MAX_CONTROL_PER_UID  64u  /* control role (zeroctl) */

#define ZD_WARN_PEERS           8
#define ZD_WARN_BURST           20
#define ZD_WARN_INTERVAL_NS     (10ull * 1000000000ull)

typedef struct zd_server zd_server_t;

typedef struct zd_warn_peer {
    bool used;
    uid_t uid;
    uint64_t last_ns;
    zs_ratelimit_t rl;
} zd_warn_peer_t;

typedef enum zd_conn_kind {
    ZD_CONN_UNNAMED = 0, /* its Hello not yet answered */
    ZD_CONN_TRAINER,
    ZD_CONN_CONTROL,
} zd_conn_kind_t;

typedef struct zd_conn {
    uv_pipe_t pipe; /* first: the handle's data points back here too */
    uv_timer_t timer;
    uv_timer_t name_timer; /* unnamed: frame_timeout to send its Hello (server/admit.c) */
    zd_server_t *srv;
    uint64_t id;
    uid_t uid; /* SO_PEERCRED; (uid_t)-1 when unknown */
    zd_rpc_session_t *session;
    zd_fdq_t fds; /* descriptors received, not yet claimed by a frame (rpc/rpc.h) */
    uint8_t *buf;
    size_t len, cap, need;
    bool closing;
    bool reading; /* uv_read_start is in effect (false while throttled) */
    /* frame_timeout passed with bytes waiting in the socket: they arrived in time, so they are
     * read once before the frame is judged (zd_frame_timer_cb) */
    bool late_read;
    zd_conn_kind_t kind; /* the cap it counts against (server/admit.c) */
    int open_handles;
    /* requests with the runner, oldest first: each gets exactly one reply, in order */
    uint32_t inflight, inflight_head;
    uint64_t inflight_bytes;
    uint32_t inflight_len[ZD_CONN_MAX_INFLIGHT];
    struct zd_conn *prev, *next;
} zd_conn_t;

struct zd_server {
    uv_loop_t *loop;
    uv_pipe_t listener;
    uv_async_t async;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t keepalive; /* every heartbeat_interval: StillWorking where a request waits */
    zd_runner_t *runner;
    struct zd_sdnotify
        *notify; /* READY, STATUS, WATCHDOG to systemd (server/sdnotify.h); NULL: none */
    /* metrics_listen: the snapshot (obs/metrics.h) and its HTTP endpoint (server/metrics_http.h);
     * NULL when off */
    zd_metrics_t *metrics;
    struct zd_metrics_http *http;
    zd_rpc_t rpc;
    const struct zd_server_params *params; /* server/server.h */
    uint64_t frame_timeout_ms;
    gid_t allowed_gid;
    bool has_allowed_gid;
    zd_conn_t *conns;
    uint64_t next_conn_id;
    bool stopping;
    bool listening;
    size_t buffered;      /* bytes of every connection's frame buffer (ZD_BUFFER_BUDGET) */
    zd_unix_id_t sock_id; /* the socket file we bound: removed at stop only if still ours */
    zd_warn_peer_t warn[ZD_WARN_PEERS];
    char read_buf[ZD_READ_CHUNK];
};

typedef struct zd_write {
    uv_write_t req;
    zd_conn_t *conn;
    zd_reply_t *reply;
    bool close_after;
} zd_write_t;

/* A connection for a just-accepted client: linked into srv->conns, not yet reading; NULL when
 * out of memory (logged). */
zd_conn_t *zd_conn_new(zd_server_t *srv);
/* Read and frame the client's requests (within back-pressure bounds); call again when a bound
 * may have cleared. */
void zd_conn_pump(zd_conn_t *c);
/* Queue a reply (takes it). */
void zd_conn_send(zd_conn_t *c, zd_reply_t *reply);
/* A runner result for this connection: its reply goes out and one request leaves the
 * back-pressure count. Takes r. */
void zd_conn_result(zd_conn_t *c, zd_resp_t *r);
/* An ErrorReply naming the problem, then close (bad frame, wrong role, ...). */
void zd_conn_fail(zd_conn_t *c, uint64_t seq, zs_status_t st, const char *msg);
/* Close after every queued write went out. */
void zd_conn_close_soon(zd_conn_t *c);
/* Close now. */
void zd_conn_close(zd_conn_t *c);
/* A StillWorking, when the client asked for keepalives and has a request in progress. */
void zd_conn_keepalive(zd_conn_t *c);
/* c counts as `kind` from now (accepted: unnamed, with frame_timeout to send its Hello; its
 * Hello answered: its role), within its uid's cap of the kind: the uid's oldest idle one of the
 * kind is closed to make room where needed. False when c was refused (it is failing with
 * ERR_LIMIT naming the cap and the uid). */
bool zd_conn_admit(zd_conn_t *c, zd_conn_kind_t kind);

/* ---- admission (server/admit.c) ------------------------------------------------------- */

/* The decision of zd_conn_admit: true when c may stay, *victim_p the connection to close to
 * make room (NULL: none) with msg for it; false with msg for c when none could. */
bool zd_admit(zd_conn_t *c, zd_conn_kind_t kind, zd_conn_t **victim_p, char *msg, size_t len);

#endif
