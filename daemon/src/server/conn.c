/*
 * One client connection of the server: frames in (length prefix, size limit, frame_timeout,
 * a buffer budget shared by all connections), replies out (fds with the first bytes), and the
 * back-pressure bounds that stop reading from a client whose requests or replies pile up. What
 * a frame means is rpc/rpc.c's business.
 */
#define _GNU_SOURCE
#include "server/server_int.h"
#include "zs/frame.h"
#include "zs/log.h"
#include "zs/time.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

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
    (void)status;
    zd_conn_t *c = req->data;

    free(req);
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) {
        zd_conn_close(c);
    }
}

void zd_conn_close_soon(zd_conn_t *c)
{
    uv_shutdown_t *req;

    if (c->closing) {
        return;
    }
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->name_timer);
    req = malloc(sizeof(*req));
    if (req == NULL || uv_shutdown(req, (uv_stream_t *)&c->pipe, zd_shutdown_cb) != 0) {
        free(req);
        zd_conn_close(c);
        return;
    }
    req->data = c;
}

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

void zd_conn_send(zd_conn_t *c, zd_reply_t *reply)
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

void zd_conn_fail(zd_conn_t *c, uint64_t seq, zs_status_t st, const char *msg)
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

/* ---- admission ------------------------------------------------------------------------ */

/* Bytes the kernel holds for c that the loop has not read yet. */
static bool zd_conn_bytes_waiting(zd_conn_t *c)
{
    uv_os_fd_t fd;
    int waiting = 0;

    return uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 && ioctl(fd, FIONREAD, &waiting) == 0 &&
           waiting > 0;
}

/* A deadline that finds bytes unread may only be the loop's own delay (a long callback ran
 * between the accept or the last read and this timer): the poll phase that follows the timers
 * reads them, so the verdict waits for it, once. */
static bool zd_conn_grace(zd_conn_t *c, uv_timer_t *t, uv_timer_cb cb)
{
    if (c->late_read || !c->reading || !zd_conn_bytes_waiting(c)) {
        return false;
    }
    c->late_read = true;
    uv_timer_start(t, cb, 1, 0);
    return true;
}

static void zd_name_timer_cb(uv_timer_t *t)
{
    zd_conn_t *c = t->data;
    char msg[160];

    if (zd_conn_grace(c, t, zd_name_timer_cb)) {
        return; /* the Hello may be there: read it first */
    }
    snprintf(msg, sizeof(msg), "no Hello within frame_timeout (%llu ms) of connecting",
             (unsigned long long)c->srv->frame_timeout_ms);
    zd_metrics_protocol_error(c->srv->metrics);
    zd_conn_fail(c, 0, ZS_ERR_TIMEOUT, msg);
}

bool zd_conn_admit(zd_conn_t *c, zd_conn_kind_t kind)
{
    zd_conn_t *victim;
    char msg[200];
    bool in = zd_admit(c, kind, &victim, msg, sizeof(msg));

    if (victim != NULL) {
        zd_metrics_conn_refused(c->srv->metrics);
        zd_conn_fail(victim, 0, ZS_ERR_LIMIT, msg);
    }
    if (!in) {
        zd_metrics_conn_refused(c->srv->metrics);
        zd_conn_fail(c, 0, ZS_ERR_LIMIT, msg);
        return false;
    }
    if (kind == ZD_CONN_UNNAMED) {
        uv_update_time(c->srv->loop); /* from the accept, not from the iteration's start */
        c->late_read = false;
        uv_timer_start(&c->name_timer, zd_name_timer_cb, c->srv->frame_timeout_ms, 0);
    } else {
        uv_timer_stop(&c->name_timer);
    }
    return true;
}

/* ---- receiving ------------------------------------------------------------------------ */

/* One whole frame (length prefix and payload) to rpc: answered here, or sent to the runner
 * (counted for back-pressure). Returns false when the connection is being closed. */
static bool zd_conn_frame(zd_conn_t *c, const uint8_t *frame, size_t len)
{
    zd_reply_t *reply = NULL;
    bool submitted = false, close = false, keep;
    char why[ZS_MSG_MAX];
    zd_rpc_peer_t peer;
    zs_status_t st =
        zd_rpc_frame(&c->srv->rpc, c->session, frame + ZS_FRAME_HEADER, len - ZS_FRAME_HEADER,
                     &c->fds, &reply, &submitted, &close, why, sizeof(why));

    keep = !close;
    zd_rpc_session_peer(c->session, &peer);
    if (c->kind == ZD_CONN_UNNAMED && peer.hello &&
        !zd_conn_admit(c, peer.control ? ZD_CONN_CONTROL : ZD_CONN_TRAINER)) {
        zd_reply_free(reply); /* the HelloReply: the client reads the refusal instead */
        return false;
    }
    if (st != ZS_OK) {
        zd_metrics_protocol_error(c->srv->metrics);
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

    /* Bytes the kernel holds arrived before this deadline: the frame is judged again once they
     * are read. Once per frame, so a trickle cannot keep a frame alive. */
    if (zd_conn_grace(c, t, zd_frame_timer_cb)) {
        return;
    }
    snprintf(msg, sizeof(msg),
             "truncated frame: got %zu of %zu bytes within frame_timeout (%llu ms)", c->len,
             c->need, (unsigned long long)c->srv->frame_timeout_ms);
    zd_metrics_protocol_error(c->srv->metrics);
    zd_conn_fail(c, 0, ZS_ERR_TIMEOUT, msg);
}

static void zd_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
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
            zd_metrics_conn_refused(c->srv->metrics);
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

static void zd_fd_handle_closed(uv_handle_t *h)
{
    free(h);
}

/* The descriptors that came with the bytes just read. The pipe is an IPC pipe, so libuv keeps
 * each for uv_accept: it goes into a throwaway pipe handle, is duplicated into c->fds, and the
 * handle closes the original. Called from the read callback only, while reading is on (an
 * accept restarts the pipe's read interest). More descriptors than a frame may claim, or one
 * that cannot be taken, close the connection: none is left behind. */
static bool zd_conn_take_fds(zd_conn_t *c)
{
    while (uv_pipe_pending_count(&c->pipe) > 0) {
        uv_pipe_t *h = malloc(sizeof(*h));
        uv_os_fd_t fd = -1;
        int mine = -1;

        if (h == NULL || uv_pipe_init(c->srv->loop, h, 0) != 0) {
            free(h);
            zd_conn_fail(c, 0, ZS_ERR_NO_MEMORY, "out of memory taking a file descriptor");
            return false;
        }
        if (uv_accept((uv_stream_t *)&c->pipe, (uv_stream_t *)h) == 0 &&
            uv_fileno((uv_handle_t *)h, &fd) == 0) {
            mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        }
        uv_close((uv_handle_t *)h, zd_fd_handle_closed);
        if (mine < 0 || c->fds.n == ZD_FDQ_MAX) {
            char msg[160];
            if (mine >= 0) {
                close(mine);
            }
            snprintf(msg, sizeof(msg), "%s (at most %u may wait for the frame that claims them)",
                     mine < 0 ? "a file descriptor that came could not be taken"
                              : "too many file descriptors came",
                     ZD_FDQ_MAX);
            zd_metrics_protocol_error(c->srv->metrics);
            zd_conn_fail(c, 0, ZS_ERR_PROTOCOL, msg);
            return false;
        }
        c->fds.fd[c->fds.n++] = mine;
    }
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
            zd_metrics_protocol_error(c->srv->metrics);
            zd_conn_fail(c, 0, ZS_ERR_PROTOCOL, msg);
            return;
        }
        zs_debug(ZS_SUB_IPC, "connection %llu closed: %s", (unsigned long long)c->id,
                 uv_strerror((int)nread));
        zd_conn_close(c);
        return;
    }
    if (!zd_conn_take_fds(c)) {
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

/* After a pump that read on: give back the memory of a big frame that is out, and run
 * frame_timeout from the first byte of the frame still incomplete (a frame that completed
 * restarts it for the next one). */
static void zd_conn_settle(zd_conn_t *c, bool progressed)
{
    if (progressed && c->cap > ZD_BUFFER_KEEP && c->len <= c->cap / 4) {
        size_t cap = ZD_BUFFER_KEEP;
        while (cap < c->len) {
            cap *= 2;
        }
        (void)zd_conn_resize(c, cap); /* the big frame is out: give its memory back */
    }
    if (c->len > 0) {
        if (progressed || !uv_is_active((uv_handle_t *)&c->timer)) {
            /* from now, not from the start of a loop iteration that may have run long */
            uv_update_time(c->srv->loop);
            c->late_read = false;
            uv_timer_start(&c->timer, zd_frame_timer_cb, c->srv->frame_timeout_ms, 0);
        }
    } else {
        uv_timer_stop(&c->timer);
    }
}

/* Decode and dispatch the buffered frames while the connection may hand the runner more, and
 * read from it only then (back-pressure, ZD_CONN_MAX_*). */
void zd_conn_pump(zd_conn_t *c)
{
    char err[ZS_MSG_MAX];
    bool progressed = false;
    size_t off = 0; /* frames consumed; the rest moves to the front once, not once a frame */

    if (c->closing) {
        return;
    }
    while (!zd_conn_throttled(c)) {
        size_t used = 0;
        zs_status_t st =
            zs_frame_parse(c->buf + off, c->len - off, &used, &c->need, err, sizeof(err));

        if (st != ZS_OK) {
            zd_metrics_protocol_error(c->srv->metrics);
            zd_conn_fail(c, 0, st, err);
            return;
        }
        if (used == 0) {
            break;
        }
        progressed = true;
        if (!zd_conn_frame(c, c->buf + off, used)) {
            return; /* closing: the buffer goes with the connection */
        }
        off += used;
    }
    if (off > 0) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
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
    zd_conn_settle(c, progressed);
}

/* ---- connections ---------------------------------------------------------------------- */

static void zd_conn_handle_closed(uv_handle_t *h)
{
    zd_conn_t *c = h->data;

    if (--c->open_handles > 0) {
        return;
    }
    c->srv->buffered -= c->cap;
    zd_fdq_close(&c->fds);
    zd_rpc_session_destroy(c->session);
    free(c->buf);
    free(c);
}

void zd_conn_close(zd_conn_t *c)
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
    uv_close((uv_handle_t *)&c->name_timer, zd_conn_handle_closed);
}

zd_conn_t *zd_conn_new(zd_server_t *srv)
{
    zd_conn_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        zs_error(ZS_SUB_IPC, "out of memory accepting a connection");
        return NULL;
    }
    c->srv = srv;
    c->id = ++srv->next_conn_id;
    c->uid = (uid_t)-1;
    c->session = zd_rpc_session_create(c->id);
    uv_pipe_init(srv->loop, &c->pipe, 1); /* IPC: descriptors come with some requests */
    uv_timer_init(srv->loop, &c->timer);
    uv_timer_init(srv->loop, &c->name_timer);
    c->pipe.data = c;
    c->timer.data = c;
    c->name_timer.data = c;
    c->open_handles = 3;
    c->next = srv->conns;
    if (srv->conns != NULL) {
        srv->conns->prev = c;
    }
    srv->conns = c;
    return c;
}

void zd_conn_result(zd_conn_t *c, zd_resp_t *r)
{
    zd_reply_t *reply = zd_rpc_result(c->session, r); /* takes r */

    if (c->inflight > 0) {
        c->inflight_bytes -= c->inflight_len[c->inflight_head];
        c->inflight_head = (c->inflight_head + 1) % ZD_CONN_MAX_INFLIGHT;
        c->inflight--;
    }
    if (reply != NULL) {
        zd_conn_send(c, reply);
    }
    zd_conn_pump(c);
}

void zd_conn_keepalive(zd_conn_t *c)
{
    zd_rpc_peer_t peer;
    zd_reply_t *reply;
    uv_os_fd_t fd;
    int unread = 0;

    if (c->closing || c->inflight == 0 ||
        uv_stream_get_write_queue_size((const uv_stream_t *)&c->pipe) > 0) {
        return;
    }
    zd_rpc_session_peer(c->session, &peer);
    /* Bytes the client has not read yet: it is not waiting, and when it reads them they tell
     * it the daemon lives. So at most one StillWorking piles up behind a busy client, and a
     * reply with descriptors never finds the kernel's buffer full of them. */
    if (!peer.keepalive || uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
        ioctl(fd, SIOCOUTQ, &unread) != 0 || unread > 0) {
        return;
    }
    reply = zd_rpc_still_working(c->inflight);
    if (reply != NULL) {
        zd_conn_send(c, reply);
    }
}
