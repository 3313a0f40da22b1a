#define _GNU_SOURCE
#include "server.h"

#include "dconfig.h"
#include "rpc.h"
#include "zs/frame.h"
#include "zs/log.h"
#include "zs/time.h"
#include "zs/version.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>
#ifdef ZD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#define ZD_READ_CHUNK (256u << 10)
/* Warnings a local user can cause at will (bad frames, refused connections): per uid, a burst
 * of ZD_WARN_BURST per ZD_WARN_INTERVAL_NS, then a count of what was suppressed. */
/* Back-pressure: a connection whose requests wait in the engine beyond these bounds, or whose
 * replies wait for it to read beyond ZD_CONN_MAX_UNREAD, is not read from until they drain
 * (its writes then stall in the kernel), so what one client makes the daemon hold is bounded
 * whatever it sends. A trainer has at most bucket_slots (<= ZD_MAX_SLOTS) BucketReady and one
 * Step outstanding. */
#define ZD_CONN_MAX_INFLIGHT       256
#define ZD_CONN_MAX_INFLIGHT_BYTES (64u << 20)
#define ZD_CONN_MAX_UNREAD         (4u << 20)
_Static_assert(ZD_CONN_MAX_INFLIGHT > ZD_MAX_SLOTS + 1, "a trainer's own requests never stall it");
/* What all connections together may hold in frame buffers (each frame is at most 16 MiB and
 * must arrive within frame_timeout), and how many connections one uid may have open: beyond
 * these a connection is refused, so that no number of clients can exhaust the daemon's memory. */
#define ZD_BUFFER_BUDGET     (512u << 20)
#define ZD_BUFFER_KEEP       (1u << 20) /* a buffer above this shrinks once its frame is out */
#define ZD_MAX_CONNS_PER_UID 256u
#define ZD_WARN_PEERS        8
#define ZD_WARN_BURST        20
#define ZD_WARN_INTERVAL_NS  (10ull * 1000000000ull)

typedef struct zd_server zd_server_t;

typedef struct zd_warn_peer {
    bool used;
    uid_t uid;
    uint64_t last_ns;
    zs_ratelimit_t rl;
} zd_warn_peer_t;

typedef struct zd_conn {
    uv_pipe_t pipe; /* first: the handle's data points back here too */
    uv_timer_t timer;
    zd_server_t *srv;
    uint64_t id;
    uid_t uid; /* SO_PEERCRED; (uid_t)-1 when unknown */
    zd_rpc_session_t *session;
    uint8_t *buf;
    size_t len, cap, need;
    bool closing;
    bool reading; /* uv_read_start is in effect (false while throttled) */
    int open_handles;
    /* requests with the engine, oldest first: each gets exactly one reply, in order */
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
    zd_engine_t *engine;
    zd_rpc_t rpc;
    const zd_server_params_t *params;
    uint64_t frame_timeout_ms;
    gid_t allowed_gid;
    bool has_allowed_gid;
    zd_conn_t *conns;
    uint64_t next_conn_id;
    bool stopping;
    bool listening;
    size_t buffered; /* bytes of every connection's frame buffer (ZD_BUFFER_BUDGET) */
    dev_t sock_dev;  /* the socket file we bound: removed at stop only if it is still ours */
    ino_t sock_ino;
    zd_warn_peer_t warn[ZD_WARN_PEERS];
    char read_buf[ZD_READ_CHUNK];
};

typedef struct zd_write {
    uv_write_t req;
    zd_conn_t *conn;
    zd_reply_t *reply;
    bool close_after;
} zd_write_t;

static void zd_conn_close(zd_conn_t *c);

/* The warning limiter of a connection's uid (the least recently used one is recycled). */
static zs_ratelimit_t *zd_conn_warn_rl(zd_conn_t *c)
{
    zd_server_t *srv = c->srv;
    zd_warn_peer_t *slot = &srv->warn[0];
    uint64_t now = zs_time_now_ns();

    for (int i = 0; i < ZD_WARN_PEERS; i++) {
        zd_warn_peer_t *p = &srv->warn[i];
        if (p->used && p->uid == c->uid) {
            slot = p;
            goto found;
        }
        if (!p->used || p->last_ns < slot->last_ns) {
            slot = p;
        }
    }
    slot->used = true;
    slot->uid = c->uid;
    slot->rl = (zs_ratelimit_t)ZS_RATELIMIT_INIT(ZD_WARN_INTERVAL_NS, ZD_WARN_BURST);
found:
    slot->last_ns = now;
    return &slot->rl;
}

/* ---- sending -------------------------------------------------------------------------- */

static void zd_shutdown_cb(uv_shutdown_t *req, int status)
{
    zd_conn_t *c = req->data;

    free(req);
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) {
        zd_conn_close(c);
    }
}

/* Close after every queued write went out. */
static void zd_conn_close_soon(zd_conn_t *c)
{
    uv_shutdown_t *req;

    if (c->closing) {
        return;
    }
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
    uv_timer_stop(&c->timer);
    req = malloc(sizeof(*req));
    if (req == NULL || uv_shutdown(req, (uv_stream_t *)&c->pipe, zd_shutdown_cb) != 0) {
        free(req);
        zd_conn_close(c);
        return;
    }
    req->data = c;
}

static void zd_conn_pump(zd_conn_t *c);

static void zd_write_cb(uv_write_t *req, int status)
{
    zd_write_t *w = (zd_write_t *)req;
    zd_conn_t *c = w->conn; /* alive: a closed handle cancels its writes before its close cb */

    if (status != 0 && status != UV_ECANCELED) {
        zs_debug(ZS_SUB_IPC, "write failed: %s", uv_strerror(status));
    }
    zd_reply_free(w->reply);
    free(w);
    if (status == 0) {
        zd_conn_pump(c); /* the client read: take more of its requests if it was throttled */
    } else if (status != UV_ECANCELED) {
        zd_conn_close(c); /* the client is gone (EPIPE): an ordinary disconnect */
    }
}

/* Send the reply's fds with its first bytes (SCM_RIGHTS), then the rest through libuv. */
static int zd_conn_send_fds(zd_conn_t *c, zd_reply_t *reply, size_t *sent_p)
{
    struct msghdr msg;
    struct iovec iov = {reply->buf, reply->len};
    char cbuf[CMSG_SPACE(sizeof(int) * 3)];
    struct cmsghdr *cmsg;
    uv_os_fd_t fd;
    ssize_t n;

    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
        uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) != 0) {
        return -1;
    }
    memset(&msg, 0, sizeof(msg));
    memset(cbuf, 0, sizeof(cbuf));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)reply->n_fds);
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)reply->n_fds);
    memcpy(CMSG_DATA(cmsg), reply->fds, sizeof(int) * (size_t)reply->n_fds);
    do {
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        zs_warn_limited(zd_conn_warn_rl(c), ZS_SUB_IPC,
                        "connection %llu: sending shared regions failed: %m",
                        (unsigned long long)c->id);
        return -1;
    }
    *sent_p = (size_t)n;
    return 0;
}

static void zd_conn_send(zd_conn_t *c, zd_reply_t *reply)
{
    zd_write_t *w;
    uv_buf_t b;
    size_t sent = 0;

    if (c->closing || uv_is_closing((uv_handle_t *)&c->pipe)) {
        zd_reply_free(reply);
        return;
    }
    if (reply->n_fds > 0) {
        if (zd_conn_send_fds(c, reply, &sent) != 0) {
            zd_reply_free(reply);
            zd_conn_close_soon(c);
            return;
        }
        if (sent == reply->len) {
            zd_reply_free(reply);
            return;
        }
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        zs_error(ZS_SUB_IPC, "connection %llu: out of memory for a reply; closing",
                 (unsigned long long)c->id);
        zd_reply_free(reply);
        zd_conn_close_soon(c);
        return;
    }
    w->conn = c;
    w->reply = reply;
    b = uv_buf_init((char *)reply->buf + sent, (unsigned)(reply->len - sent));
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, zd_write_cb) != 0) {
        zd_reply_free(reply);
        free(w);
        zd_conn_close_soon(c);
    }
}

/* An ErrorReply naming the problem, then close (bad frame, wrong role, ...). */
static void zd_conn_fail(zd_conn_t *c, uint64_t seq, zs_status_t st, const char *msg)
{
    zd_reply_t *reply;

    zs_warn_limited(zd_conn_warn_rl(c), ZS_SUB_IPC, "connection %llu: %s (%s); closing it",
                    (unsigned long long)c->id, msg, zs_status_name(st));
    reply = zd_rpc_error(seq, st, msg);
    if (reply != NULL) {
        zd_conn_send(c, reply);
    }
    zd_conn_close_soon(c);
}

/* ---- receiving ------------------------------------------------------------------------ */

/* One whole frame (length prefix and payload) to rpc: answered here, or sent to the engine
 * (counted for back-pressure). Returns false when the connection is being closed. */
static bool zd_conn_frame(zd_conn_t *c, const uint8_t *frame, size_t len)
{
    zd_reply_t *reply = NULL;
    bool submitted = false, close = false, keep;
    char why[ZD_MAX_MSG];
    zs_status_t st =
        zd_rpc_frame(&c->srv->rpc, c->session, frame + ZS_FRAME_HEADER, len - ZS_FRAME_HEADER,
                     &reply, &submitted, &close, why, sizeof(why));

    keep = !close;
    if (st != ZS_OK) {
        zs_warn_limited(zd_conn_warn_rl(c), ZS_SUB_IPC, "connection %llu: %s (%s)%s",
                        (unsigned long long)c->id, why, zs_status_name(st),
                        close ? "; closing it" : "");
    }
    if (reply != NULL) {
        zd_conn_send(c, reply);
    }
    if (submitted) {
        c->inflight_len[(c->inflight_head + c->inflight) % ZD_CONN_MAX_INFLIGHT] = (uint32_t)len;
        c->inflight++;
        c->inflight_bytes += len;
    }
    if (!keep) {
        zd_conn_close_soon(c);
    }
    return keep;
}

static void zd_frame_timer_cb(uv_timer_t *t)
{
    zd_conn_t *c = t->data;
    char msg[160];

    snprintf(msg, sizeof(msg),
             "truncated frame: got %zu of %zu bytes within frame_timeout (%llu ms)", c->len,
             c->need, (unsigned long long)c->srv->frame_timeout_ms);
    zd_conn_fail(c, 0, ZS_ERR_TIMEOUT, msg);
}

static void zd_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    zd_conn_t *c = h->data;

    buf->base = c->srv->read_buf;
    buf->len = sizeof(c->srv->read_buf);
}

/* Resize the frame buffer, within the budget all connections share. */
static zs_status_t zd_conn_resize(zd_conn_t *c, size_t cap)
{
    zd_server_t *srv = c->srv;
    uint8_t *nb;

    if (cap > c->cap && srv->buffered - c->cap + cap > ZD_BUFFER_BUDGET) {
        return ZS_ERR_LIMIT;
    }
    nb = realloc(c->buf, cap);
    if (nb == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    srv->buffered = srv->buffered - c->cap + cap;
    c->buf = nb;
    c->cap = cap;
    return ZS_OK;
}

static bool zd_conn_append(zd_conn_t *c, const char *data, size_t n)
{
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        zs_status_t st;

        while (cap < c->len + n) {
            cap *= 2;
        }
        if (c->need >= c->len + n && c->need < cap) {
            cap = c->need; /* the frame in progress, exactly: a 16 MiB frame takes 16 MiB */
        }
        st = zd_conn_resize(c, cap);
        if (st == ZS_ERR_LIMIT) {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "the frame buffers of all connections are full (%u MiB); try again",
                     ZD_BUFFER_BUDGET >> 20);
            zd_conn_fail(c, 0, st, msg);
            return false;
        }
        if (st != ZS_OK) {
            zd_conn_fail(c, 0, st, "out of memory buffering a frame");
            return false;
        }
    }
    memcpy(c->buf + c->len, data, n);
    c->len += n;
    return true;
}

static void zd_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    zd_conn_t *c = s->data;

    if (c->closing) {
        return;
    }
    if (nread < 0) {
        if (c->len > 0 && nread == UV_EOF) {
            char msg[160];
            snprintf(msg, sizeof(msg), "truncated frame: connection closed after %zu of %zu bytes",
                     c->len, c->need);
            zd_conn_fail(c, 0, ZS_ERR_PROTOCOL, msg);
            return;
        }
        zs_debug(ZS_SUB_IPC, "connection %llu closed: %s", (unsigned long long)c->id,
                 uv_strerror((int)nread));
        zd_conn_close(c);
        return;
    }
    if (nread == 0) {
        return;
    }
    if (!zd_conn_append(c, buf->base, (size_t)nread)) {
        return; /* failed, naming why */
    }
    zd_conn_pump(c);
}

static bool zd_conn_throttled(zd_conn_t *c)
{
    return c->inflight >= ZD_CONN_MAX_INFLIGHT || c->inflight_bytes >= ZD_CONN_MAX_INFLIGHT_BYTES ||
           uv_stream_get_write_queue_size((const uv_stream_t *)&c->pipe) > ZD_CONN_MAX_UNREAD;
}

/* Decode and dispatch the buffered frames while the connection may hand the engine more, and
 * read from it only then (back-pressure, ZD_CONN_MAX_*). */
static void zd_conn_pump(zd_conn_t *c)
{
    char err[ZD_MAX_MSG];
    bool progressed = false;

    if (c->closing) {
        return;
    }
    while (!zd_conn_throttled(c)) {
        size_t used = 0;
        bool keep;
        zs_status_t st = zs_frame_parse(c->buf, c->len, &used, &c->need, err, sizeof(err));

        if (st != ZS_OK) {
            zd_conn_fail(c, 0, st, err);
            return;
        }
        if (used == 0) {
            break;
        }
        keep = zd_conn_frame(c, c->buf, used);
        memmove(c->buf, c->buf + used, c->len - used);
        c->len -= used;
        progressed = true;
        if (!keep) {
            return;
        }
    }
    if (zd_conn_throttled(c)) {
        if (c->reading) {
            uv_read_stop((uv_stream_t *)&c->pipe);
            c->reading = false;
        }
        uv_timer_stop(&c->timer); /* the wait is the daemon's, not the client's */
        return;
    }
    if (!c->reading) {
        uv_read_start((uv_stream_t *)&c->pipe, zd_alloc_cb, zd_read_cb);
        c->reading = true;
    }
    if (progressed && c->cap > ZD_BUFFER_KEEP && c->len <= c->cap / 4) {
        size_t cap = ZD_BUFFER_KEEP;
        while (cap < c->len) {
            cap *= 2;
        }
        (void)zd_conn_resize(c, cap); /* the big frame is out: give its memory back */
    }
    /* frame_timeout runs from the first byte of the frame still incomplete: a frame that
     * completed restarts it for the next one */
    if (c->len > 0) {
        if (progressed || !uv_is_active((uv_handle_t *)&c->timer)) {
            uv_timer_start(&c->timer, zd_frame_timer_cb, c->srv->frame_timeout_ms, 0);
        }
    } else {
        uv_timer_stop(&c->timer);
    }
}

/* ---- connections ---------------------------------------------------------------------- */

static void zd_conn_handle_closed(uv_handle_t *h)
{
    zd_conn_t *c = h->data;

    if (--c->open_handles > 0) {
        return;
    }
    c->srv->buffered -= c->cap;
    zd_rpc_session_destroy(c->session);
    free(c->buf);
    free(c);
}

static void zd_conn_close(zd_conn_t *c)
{
    zd_server_t *srv = c->srv;

    if (uv_is_closing((uv_handle_t *)&c->pipe)) {
        return;
    }
    c->closing = true;
    if (c->prev != NULL) {
        c->prev->next = c->next;
    } else {
        srv->conns = c->next;
    }
    if (c->next != NULL) {
        c->next->prev = c->prev;
    }
    if (c->session != NULL) {
        zd_rpc_closed(&srv->rpc, c->session);
    }
    uv_close((uv_handle_t *)&c->pipe, zd_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, zd_conn_handle_closed);
}

static zd_conn_t *zd_server_find_conn(zd_server_t *srv, uint64_t id)
{
    for (zd_conn_t *c = srv->conns; c != NULL; c = c->next) {
        if (c->id == id) {
            return c;
        }
    }
    return NULL;
}

/* SO_PEERCRED: the daemon's uid, root, or a member of allowed_group. */
static bool zd_server_peer_allowed(zd_server_t *srv, zd_conn_t *c, int fd, char *who, size_t wlen)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        snprintf(who, wlen, "unknown peer (SO_PEERCRED: %s)", strerror(errno));
        return false;
    }
    c->uid = cred.uid;
    snprintf(who, wlen, "pid %d uid %u gid %u", (int)cred.pid, (unsigned)cred.uid,
             (unsigned)cred.gid);
    if (cred.uid == 0 || cred.uid == geteuid()) {
        return true;
    }
    if (srv->has_allowed_gid) {
        struct passwd pw, *pwp = NULL;
        char pwbuf[4096];
        gid_t groups[256];
        int ngroups = 256;

        if (cred.gid == srv->allowed_gid) {
            return true;
        }
        if (getpwuid_r(cred.uid, &pw, pwbuf, sizeof(pwbuf), &pwp) == 0 && pwp != NULL &&
            getgrouplist(pw.pw_name, pw.pw_gid, groups, &ngroups) >= 0) {
            for (int i = 0; i < ngroups; i++) {
                if (groups[i] == srv->allowed_gid) {
                    return true;
                }
            }
        }
    }
    return false;
}

/* Open connections of a uid (this one included). */
static unsigned zd_server_count_uid(const zd_server_t *srv, uid_t uid)
{
    unsigned n = 0;

    for (const zd_conn_t *c = srv->conns; c != NULL; c = c->next) {
        n += c->uid == uid && !c->closing;
    }
    return n;
}

static void zd_connection_cb(uv_stream_t *server, int status)
{
    zd_server_t *srv = server->data;
    zd_conn_t *c;
    uv_os_fd_t fd;
    char who[128];

    if (status != 0) {
        zs_warn(ZS_SUB_IPC, "accept failed: %s", uv_strerror(status));
        return;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        zs_error(ZS_SUB_IPC, "out of memory accepting a connection");
        return;
    }
    c->srv = srv;
    c->id = ++srv->next_conn_id;
    c->uid = (uid_t)-1;
    c->session = zd_rpc_session_create(c->id);
    uv_pipe_init(srv->loop, &c->pipe, 0);
    uv_timer_init(srv->loop, &c->timer);
    c->pipe.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    c->next = srv->conns;
    if (srv->conns != NULL) {
        srv->conns->prev = c;
    }
    srv->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 || c->session == NULL) {
        zd_conn_close(c);
        return;
    }
    uv_fileno((uv_handle_t *)&c->pipe, &fd);
    if (!zd_server_peer_allowed(srv, c, fd, who, sizeof(who))) {
        char msg[200];
        snprintf(msg, sizeof(msg), "permission denied for %s (allowed: uid %u, root%s%s)", who,
                 (unsigned)geteuid(), srv->has_allowed_gid ? ", group " : "",
                 srv->has_allowed_gid ? srv->params->config->allowed_group : "");
        zd_conn_fail(c, 0, ZS_ERR_PERMISSION, msg);
        return;
    }
    if (zd_server_count_uid(srv, c->uid) > ZD_MAX_CONNS_PER_UID) {
        char msg[160];
        snprintf(msg, sizeof(msg), "too many connections from uid %u (at most %u)",
                 (unsigned)c->uid, ZD_MAX_CONNS_PER_UID);
        zd_conn_fail(c, 0, ZS_ERR_LIMIT, msg);
        return;
    }
    zs_debug(ZS_SUB_IPC, "connection %llu from %s", (unsigned long long)c->id, who);
    zd_conn_pump(c);
}

/* ---- engine replies, signals, shutdown ------------------------------------------------ */

static void zd_server_close_all(zd_server_t *srv)
{
    zd_conn_t *c = srv->conns;

    while (c != NULL) {
        zd_conn_t *next = c->next;
        zd_conn_close_soon(c);
        c = next;
    }
    uv_close((uv_handle_t *)&srv->async, NULL);
    uv_close((uv_handle_t *)&srv->sig_term, NULL);
    uv_close((uv_handle_t *)&srv->sig_int, NULL);
    uv_close((uv_handle_t *)&srv->sig_hup, NULL);
}

/* Hand engine results to their connections as replies (a result for a closed connection is
 * dropped); each ends one request of the connection's back-pressure count. */
static void zd_server_deliver(zd_server_t *srv, zd_resp_t *r)
{
    while (r != NULL) {
        zd_resp_t *next = r->next;
        zd_conn_t *c = zd_server_find_conn(srv, r->conn_id);
        zd_reply_t *reply;

        r->next = NULL;
        if (c == NULL) {
            zd_resp_free(r);
            r = next;
            continue;
        }
        reply = zd_rpc_result(c->session, r); /* takes r */
        if (c->inflight > 0) {
            c->inflight_bytes -= c->inflight_len[c->inflight_head];
            c->inflight_head = (c->inflight_head + 1) % ZD_CONN_MAX_INFLIGHT;
            c->inflight--;
        }
        if (reply != NULL) {
            zd_conn_send(c, reply);
        }
        zd_conn_pump(c);
        r = next;
    }
}

static void zd_async_cb(uv_async_t *a)
{
    zd_server_t *srv = a->data;

    zd_server_deliver(srv, zd_engine_take_results(srv->engine));
    if (srv->stopping && zd_engine_stopped(srv->engine) && !uv_is_closing((uv_handle_t *)a)) {
        /* every reply is out (or queued in libuv): close connections after their writes */
        zd_resp_t *late = zd_engine_take_results(srv->engine);
        if (late == NULL) {
            zd_server_close_all(srv);
        } else {
            zd_server_deliver(srv, late);
            uv_async_send(a); /* go round again to close */
        }
    }
}

static void zd_engine_notify(void *arg)
{
    uv_async_send(arg);
}

/* Close the listener and remove its socket file, unless something else replaced it since. */
static void zd_server_unlisten(zd_server_t *srv)
{
    const char *path = srv->params->socket_path;
    struct stat st;

    uv_close((uv_handle_t *)&srv->listener, NULL);
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == srv->sock_dev &&
        st.st_ino == srv->sock_ino) {
        unlink(path);
    }
    srv->listening = false;
}

static void zd_server_stop(zd_server_t *srv, const char *why)
{
    if (srv->stopping) {
        return;
    }
    srv->stopping = true;
#ifdef ZD_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    zs_info(ZS_SUB_MAIN, "%s: finishing the request in progress and stopping", why);
    if (srv->listening) {
        zd_server_unlisten(srv);
    }
    zd_engine_shutdown(srv->engine);
    uv_async_send(&srv->async);
}

static void zd_signal_cb(uv_signal_t *h, int signum)
{
    zd_server_t *srv = h->data;

    if (signum == SIGHUP) {
        zd_config_t fresh;
        char err[ZS_CONFIG_ERRLEN];
        const zd_server_params_t *p = srv->params;
        zs_status_t st;

        memset(&fresh, 0, sizeof(fresh));
        st = zs_config_load(&zd_config_table, &fresh, p->config_path, NULL, zd_config_env_ignore,
                            p->flags, p->n_flags, err, sizeof(err));
        if (st != ZS_OK) {
            zs_error(ZS_SUB_CFG, "SIGHUP: reload failed, keeping the running config: %s", err);
            return;
        }
        zd_engine_set_limits(srv->engine, fresh.max_shard_bytes, fresh.job_linger_ns);
        srv->frame_timeout_ms = fresh.frame_timeout_ns / 1000000ull;
        zs_info(ZS_SUB_CFG,
                "SIGHUP: reloaded job_linger=%llu ms max_shard_bytes=%llu frame_timeout=%llu ms",
                (unsigned long long)(fresh.job_linger_ns / 1000000ull),
                (unsigned long long)fresh.max_shard_bytes,
                (unsigned long long)srv->frame_timeout_ms);
        zs_config_cleanup(&zd_config_table, &fresh);
        return;
    }
    zd_server_stop(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- the socket ----------------------------------------------------------------------- */

/* The socket's directory exists (created 0755 when missing). */
static zs_status_t zd_socket_dir(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)NULL)->sun_path)];
    char *slash;

    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            zs_error(ZS_SUB_IPC, "cannot create socket directory %s: %m", dir);
            return ZS_ERR_IO;
        }
    }
    return ZS_OK;
}

/* Only a stale socket is replaced: anything else on the path (a file, a directory, a socket
 * something listens on) is refused and left alone. */
static zs_status_t zd_socket_clear_stale(const struct sockaddr_un *sa)
{
    const char *path = sa->sun_path;
    struct stat st;
    int probe, rc, e;

    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) {
            return ZS_OK;
        }
        zs_error(ZS_SUB_IPC, "config key 'socket': cannot check '%s': %m", path);
        return ZS_ERR_IO;
    }
    if (!S_ISSOCK(st.st_mode)) {
        zs_error(ZS_SUB_IPC,
                 "config key 'socket': '%s' exists and is not a socket; refusing to replace "
                 "it (remove it or choose another path)",
                 path);
        return ZS_ERR_EXISTS;
    }
    probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        zs_error(ZS_SUB_IPC, "socket: %m");
        return ZS_ERR_IO;
    }
    rc = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
    e = errno;
    close(probe);
    if (rc == 0) {
        zs_error(ZS_SUB_IPC, "another zerod (or something else) is listening on %s", path);
        return ZS_ERR_EXISTS;
    }
    if (e != ECONNREFUSED) {
        errno = e;
        zs_error(ZS_SUB_IPC, "cannot tell whether the socket %s is stale: %m; leaving it", path);
        return ZS_ERR_IO;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        zs_error(ZS_SUB_IPC, "cannot remove the stale socket %s: %m", path);
        return ZS_ERR_IO;
    }
    zs_info(ZS_SUB_IPC, "replaced a stale socket at %s (nothing listened on it)", path);
    return ZS_OK;
}

/* A listening socket bound at sa, born 0660; -1 on error (logged). Bound here, not by
 * uv_pipe_bind: libuv would unlink the path on close whatever then lies there;
 * zd_server_unlisten removes it only while it is still this socket. */
static int zd_socket_bind(const struct sockaddr_un *sa)
{
    mode_t old_mask;
    int fd, rc;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        zs_error(ZS_SUB_IPC, "socket: %m");
        return -1;
    }
    old_mask = umask(0117);
    rc = bind(fd, (const struct sockaddr *)sa, sizeof(*sa));
    umask(old_mask);
    if (rc != 0) {
        zs_error(ZS_SUB_IPC, "cannot bind %s: %m", sa->sun_path);
        close(fd);
        return -1;
    }
    if (listen(fd, 128) != 0) {
        zs_error(ZS_SUB_IPC, "cannot listen on %s: %m", sa->sun_path);
        unlink(sa->sun_path); /* bound a moment ago: ours */
        close(fd);
        return -1;
    }
    return fd;
}

/* Mode 0660, and allowed_group as the socket's group so that its members can connect at all
 * (SO_PEERCRED then admits them). */
static zs_status_t zd_socket_set_access(zd_server_t *srv, const char *path)
{
    if (srv->has_allowed_gid && chown(path, (uid_t)-1, srv->allowed_gid) != 0) {
        zs_error(ZS_SUB_IPC, "config key 'allowed_group': cannot give %s to group '%s': %m", path,
                 srv->params->config->allowed_group);
        return ZS_ERR_PERMISSION;
    }
    if (chmod(path, 0660) != 0) {
        zs_error(ZS_SUB_IPC, "cannot set the mode of %s: %m", path);
        return ZS_ERR_IO;
    }
    return ZS_OK;
}

static zs_status_t zd_server_listen(zd_server_t *srv)
{
    const char *path = srv->params->socket_path;
    struct sockaddr_un sa;
    struct stat st;
    zs_status_t s;
    int rc, fd;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        zs_error(ZS_SUB_IPC, "socket path '%s' is longer than %zu bytes", path,
                 sizeof(sa.sun_path) - 1);
        return ZS_ERR_INVALID;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    s = zd_socket_dir(path);
    if (s == ZS_OK) {
        s = zd_socket_clear_stale(&sa);
    }
    if (s != ZS_OK) {
        return s;
    }
    fd = zd_socket_bind(&sa);
    if (fd < 0) {
        return ZS_ERR_IO;
    }
    uv_pipe_init(srv->loop, &srv->listener, 0);
    srv->listener.data = srv;
    rc = uv_pipe_open(&srv->listener, fd);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&srv->listener, 128, zd_connection_cb);
    }
    if (rc != 0) {
        zs_error(ZS_SUB_IPC, "cannot listen on %s: %s", path, uv_strerror(rc));
        unlink(path);
        uv_close((uv_handle_t *)&srv->listener, NULL); /* closes fd */
        return ZS_ERR_IO;
    }
    if (lstat(path, &st) != 0) {
        zs_error(ZS_SUB_IPC, "the socket %s vanished after bind: %m", path);
        uv_close((uv_handle_t *)&srv->listener, NULL);
        return ZS_ERR_IO;
    }
    srv->sock_dev = st.st_dev;
    srv->sock_ino = st.st_ino;
    srv->listening = true;
    s = zd_socket_set_access(srv, path);
    if (s != ZS_OK) {
        zd_server_unlisten(srv);
    }
    return s;
}

/* The engine, with the config's limits; false when it cannot start (logged). */
static bool zd_server_start_engine(zd_server_t *srv)
{
    const zd_config_t *cfg = srv->params->config;
    zd_engine_params_t ep;

    memset(&ep, 0, sizeof(ep));
    ep.bucket_slots = (uint32_t)cfg->bucket_slots;
    ep.max_shard_bytes = cfg->max_shard_bytes;
    ep.job_linger_ns = cfg->job_linger_ns;
    ep.threads = (unsigned)cfg->threads;
    ep.token_file = cfg->token_file;
    ep.mesh_timeout_ns = cfg->mesh_timeout_ns;
    ep.collective_timeout_ns = cfg->collective_timeout_ns;
    ep.heartbeat_interval_ns = cfg->heartbeat_interval_ns;
    ep.heartbeat_timeout_ns = cfg->heartbeat_timeout_ns;
    ep.direct_collectives = cfg->direct_collectives != 0;
    ep.notify = zd_engine_notify;
    ep.notify_arg = &srv->async;
    if (zd_engine_create(&ep, &srv->engine) != ZS_OK) {
        return false;
    }
    srv->rpc.engine = srv->engine;
    srv->rpc.device = srv->params->device;
    srv->rpc.socket_path = srv->params->socket_path;
    srv->rpc.peer_deadline_ms = zd_config_peer_deadline_ns(cfg) / 1000000u;
    return true;
}

/* SIGTERM and SIGINT stop, SIGHUP reloads; handled on the loop, never in a signal handler. */
static void zd_server_watch_signals(zd_server_t *srv)
{
    uv_signal_init(srv->loop, &srv->sig_term);
    uv_signal_init(srv->loop, &srv->sig_int);
    uv_signal_init(srv->loop, &srv->sig_hup);
    srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
    uv_signal_start(&srv->sig_term, zd_signal_cb, SIGTERM);
    uv_signal_start(&srv->sig_int, zd_signal_cb, SIGINT);
    uv_signal_start(&srv->sig_hup, zd_signal_cb, SIGHUP);
}

/* Tell launchers the daemon serves: a READY line on stdout, and sd_notify under systemd. */
static void zd_server_announce(const zd_server_params_t *params)
{
    zs_info(ZS_SUB_MAIN, "zerod %s ready on %s (device %s, pid %d)", ZS_VERSION,
            params->socket_path, params->device, (int)getpid());
    printf("READY %s\n", params->socket_path);
    fflush(stdout);
#ifdef ZD_HAVE_SYSTEMD
    sd_notifyf(0, "READY=1\nSTATUS=serving %s", params->socket_path);
#endif
}

int zd_server_run(const zd_server_params_t *params)
{
    zd_server_t *srv;
    const zd_config_t *cfg = params->config;
    int rc = 1;

    srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return 1;
    }
    srv->params = params;
    srv->loop = uv_default_loop();
    srv->frame_timeout_ms = cfg->frame_timeout_ns / 1000000ull;
    if (cfg->allowed_group != NULL && cfg->allowed_group[0] != '\0') {
        struct group *gr = getgrnam(cfg->allowed_group);
        if (gr == NULL) {
            zs_error(ZS_SUB_CFG, "config key 'allowed_group': no group named '%s'",
                     cfg->allowed_group);
            goto out_free;
        }
        srv->allowed_gid = gr->gr_gid;
        srv->has_allowed_gid = true;
    }
    uv_async_init(srv->loop, &srv->async, zd_async_cb);
    srv->async.data = srv;
    if (!zd_server_start_engine(srv)) {
        uv_close((uv_handle_t *)&srv->async, NULL);
        uv_run(srv->loop, UV_RUN_DEFAULT);
        goto out_free;
    }
    zd_server_watch_signals(srv);
    if (zd_server_listen(srv) != ZS_OK) {
        zd_server_stop(srv, "start-up failed");
        uv_run(srv->loop, UV_RUN_DEFAULT);
        goto out_engine;
    }
    zd_server_announce(params);
    uv_run(srv->loop, UV_RUN_DEFAULT);
    rc = 0;
    zs_info(ZS_SUB_MAIN, "stopped");

out_engine:
    zd_engine_destroy(srv->engine);
out_free:
    uv_loop_close(srv->loop);
    free(srv);
    return rc;
}
