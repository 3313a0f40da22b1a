/*
 * Framed connection to zerod: the length prefix and its limit are common's codec (zs/frame.h,
 * the daemon's too); this file adds the socket, the receive buffer and the protobuf Frame.
 * Reads go through recvmsg with room for SCM_RIGHTS, so file descriptors are collected
 * whichever frame they ride on; the frame that owns them (AttachReply) claims them.
 */
#define _GNU_SOURCE
#include "zc_int.h"

#include "zs/frame.h"
#include "zs/status.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ZC_RX_MIN_CAP (64u * 1024u)

int zc_conn_init(zc_conn_t *conn, int fd)
{
    int flags;

    memset(conn, 0, sizeof(*conn));
    conn->fd = -1;
    conn->next_seq = 1;
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        return zc_fail(ZC_ERR_IO, "fcntl(O_NONBLOCK): %s", strerror(errno));
    }
    conn->fd = fd;
    return ZC_OK;
}

void zc_conn_close_fds(zc_conn_t *conn)
{
    for (uint32_t i = 0; i < conn->n_fds; i++) {
        close(conn->fds[i]);
    }
    conn->n_fds = 0;
}

void zc_conn_cleanup(zc_conn_t *conn)
{
    if (conn == NULL) {
        return;
    }
    zc_conn_close_fds(conn);
    if (conn->fd >= 0) {
        close(conn->fd);
        conn->fd = -1;
    }
    free(conn->buf);
    conn->buf = NULL;
    conn->off = conn->len = conn->cap = 0;
}

/* The backlog of a listener that does not accept is full: a non-blocking connect says EAGAIN
 * (Unix sockets never answer EINPROGRESS), and nothing can be polled for room in it. Try again
 * after a pause (10 ms, doubling to 100 ms) until the deadline. */
static int zc_conn_backlog_wait(const char *path, zs_deadline_t deadline, uint64_t *pause_ns)
{
    uint64_t left = zs_deadline_remaining_ns(deadline);
    uint64_t ns = *pause_ns < left ? *pause_ns : left;
    struct timespec ts = {.tv_sec = (time_t)(ns / ZS_NSEC_PER_SEC),
                          .tv_nsec = (long)(ns % ZS_NSEC_PER_SEC)};

    if (left == 0) {
        return zc_fail(ZC_ERR_TIMEOUT,
                       "connect(%s): the daemon accepts no connection (its listen backlog stayed "
                       "full: is it stopped or wedged?)",
                       path);
    }
    (void)nanosleep(&ts, NULL); /* EINTR: the loop tries again */
    *pause_ns = *pause_ns * 2 < 100 * ZS_NSEC_PER_MSEC ? *pause_ns * 2 : 100 * ZS_NSEC_PER_MSEC;
    return ZC_OK;
}

int zc_conn_connect(zc_conn_t *conn, const char *path, zs_deadline_t deadline)
{
    uint64_t pause_ns = 10 * ZS_NSEC_PER_MSEC;
    struct sockaddr_un addr;
    int status;
    int fd;

    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (path == NULL || path[0] == '\0') {
        status = zc_fail(ZC_ERR_INVALID, "socket path is empty");
        goto err;
    }
    if (strlen(path) >= sizeof(addr.sun_path)) {
        status = zc_fail(ZC_ERR_INVALID, "socket path '%s' is longer than %zu bytes", path,
                         sizeof(addr.sun_path) - 1);
        goto err;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        status = zc_fail(ZC_ERR_IO, "socket(AF_UNIX): %s", strerror(errno));
        goto err;
    }
    while (connect(fd, (const struct sockaddr *)&addr, sizeof(addr)) != 0) {
        int e = errno;
        if (e == EINTR) {
            continue;
        }
        if (e == EAGAIN) {
            status = zc_conn_backlog_wait(path, deadline, &pause_ns);
            if (status == ZC_OK) {
                continue;
            }
            goto err_close;
        }
        if (e == EACCES || e == EPERM) {
            status = zc_fail(ZC_ERR_PERMISSION, "connect(%s): %s", path, strerror(e));
        } else {
            status = zc_fail(ZC_ERR_UNREACHABLE, "connect(%s): %s (is zerod running?)", path,
                             strerror(e));
        }
        goto err_close;
    }
    status = zc_conn_init(conn, fd);
    if (status != ZC_OK) {
        goto err_close;
    }
    snprintf(conn->path, sizeof(conn->path), "%s", path);
    return ZC_OK;

err_close:
    close(fd);
err:
    return status;
}

uint64_t zc_conn_next_seq(zc_conn_t *conn)
{
    uint64_t seq = conn->next_seq++;
    if (conn->next_seq == 0) {
        conn->next_seq = 1;
    }
    return seq;
}

/* Wait until the socket is ready for events, or the deadline. A wait for data also ends when
 * nothing came for silence_ms: a daemon with a request in progress sends StillWorking every
 * heartbeat_interval, so its silence means it is stopped, hung or cut off, however long the
 * request itself may take. */
static int zc_conn_wait(zc_conn_t *conn, short events, zs_deadline_t deadline, const char *what)
{
    struct pollfd pfd = {.fd = conn->fd, .events = events, .revents = 0};
    zs_deadline_t until = deadline;
    bool silence = false;
    int rc;

    if (events == POLLIN && conn->silence_ms > 0) {
        zs_deadline_t quiet = zs_deadline_in_ms(conn->silence_ms);
        if (quiet.at_ns < deadline.at_ns) {
            until = quiet;
            silence = true;
        }
    }
    for (;;) {
        rc = poll(&pfd, 1, zs_deadline_poll_ms(until));
        if (rc > 0) {
            return ZC_OK;
        }
        if (rc == 0 && silence) {
            return zc_fail(ZC_ERR_PEER_LOST,
                           "the daemon at %s sent nothing for %.1f s while a request was in "
                           "progress (its heartbeat_timeout; it sends a keepalive every "
                           "heartbeat_interval): it is stopped, hung or cut off; connection "
                           "closed",
                           conn->path[0] != '\0' ? conn->path : "the socket",
                           (double)conn->silence_ms / 1000.0);
        }
        if (rc == 0) {
            return zc_fail(ZC_ERR_TIMEOUT, "timed out %s the daemon", what);
        }
        if (errno != EINTR) {
            return zc_fail(ZC_ERR_IO, "poll: %s", strerror(errno));
        }
    }
}

/* The first bytes of a frame with fd (SCM_RIGHTS): the kernel delivers the descriptor with
 * them, before the frame is whole at the daemon. */
static ssize_t zc_conn_send_fd(int sock, const uint8_t *buf, size_t n, int fd)
{
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {(void *)buf, n};
    struct msghdr msg;
    struct cmsghdr *cm;

    memset(&msg, 0, sizeof(msg));
    memset(cbuf, 0, sizeof(cbuf));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    return sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

int zc_conn_send(zc_conn_t *conn, zc_frame_t *frame, int fd, zs_deadline_t deadline)
{
    uint8_t hdr[ZS_FRAME_HEADER];
    size_t n, sent = 0;
    uint8_t *buf;
    int status;

    if (conn->fd < 0) {
        return zc_fail(ZC_ERR_CLOSED, "the connection to the daemon is closed");
    }
    frame->fds = fd >= 0 ? 1 : 0;
    n = zerod__ipc__v1__frame__get_packed_size(frame);
    if (zs_frame_header(n, hdr, NULL, 0) != ZS_OK) { /* 0 or over the limit: our message */
        return zc_fail(ZC_ERR_INVALID, "a %s frame of %zu bytes is over the limit of %u bytes",
                       zc_body_name(frame->body_case), n, ZS_FRAME_MAX);
    }
    buf = malloc(n + ZS_FRAME_HEADER);
    if (buf == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "out of memory for a %zu-byte frame", n);
    }
    memcpy(buf, hdr, ZS_FRAME_HEADER);
    zerod__ipc__v1__frame__pack(frame, buf + ZS_FRAME_HEADER);
    n += ZS_FRAME_HEADER;

    while (sent < n) {
        ssize_t rc = sent == 0 && fd >= 0
                         ? zc_conn_send_fd(conn->fd, buf, n, fd)
                         : send(conn->fd, buf + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc >= 0) {
            sent += (size_t)rc;
            continue;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            status = zc_conn_wait(conn, POLLOUT, deadline, "sending to");
            if (status != ZC_OK) {
                goto out;
            }
            continue;
        }
        if (errno == EPIPE || errno == ECONNRESET) {
            status =
                zc_fail(ZC_ERR_CLOSED, "the daemon closed the connection (%s)", strerror(errno));
        } else {
            status = zc_fail(ZC_ERR_IO, "send: %s", strerror(errno));
        }
        goto out;
    }
    status = ZC_OK;

out:
    free(buf);
    return status;
}

/* Keep fds that came with the data; excess ones are closed and reported. */
static int zc_conn_collect_fds(zc_conn_t *conn, struct msghdr *msg)
{
    int status = ZC_OK;

    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        size_t n;
        const unsigned char *data;

        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        data = CMSG_DATA(c);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, data + i * sizeof(int), sizeof(int));
            if (conn->n_fds < ZC_MAX_PENDING_FDS) {
                conn->fds[conn->n_fds++] = fd;
            } else {
                close(fd);
                status = zc_fail(ZC_ERR_PROTOCOL, "the daemon sent more than %u file descriptors",
                                 ZC_MAX_PENDING_FDS);
            }
        }
    }
    return status;
}

/* Make room for `need` undecoded bytes. */
static int zc_conn_reserve(zc_conn_t *conn, size_t need)
{
    size_t cap;
    uint8_t *nbuf;

    if (conn->off > 0) {
        memmove(conn->buf, conn->buf + conn->off, conn->len - conn->off);
        conn->len -= conn->off;
        conn->off = 0;
    }
    if (need <= conn->cap) {
        return ZC_OK;
    }
    cap = conn->cap > ZC_RX_MIN_CAP ? conn->cap : ZC_RX_MIN_CAP;
    while (cap < need) {
        cap *= 2;
    }
    nbuf = realloc(conn->buf, cap);
    if (nbuf == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "out of memory for a %zu-byte receive buffer", cap);
    }
    conn->buf = nbuf;
    conn->cap = cap;
    return ZC_OK;
}

/* One recvmsg into the buffer; waits until the deadline for data. */
static int zc_conn_fill(zc_conn_t *conn, zs_deadline_t deadline)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * ZC_MAX_PENDING_FDS)];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov;
    struct msghdr msg;
    ssize_t rc;
    int status;

    for (;;) {
        memset(&msg, 0, sizeof(msg));
        iov.iov_base = conn->buf + conn->len;
        iov.iov_len = conn->cap - conn->len;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = sizeof(cbuf.buf);
        rc = recvmsg(conn->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (rc > 0 || (rc == 0 && msg.msg_controllen > 0)) {
            status = zc_conn_collect_fds(conn, &msg);
            if (status == ZC_OK && (msg.msg_flags & MSG_CTRUNC)) {
                status = zc_fail(ZC_ERR_PROTOCOL, "file descriptors from the daemon were "
                                                  "truncated (MSG_CTRUNC)");
            }
            if (status != ZC_OK) {
                return status;
            }
            conn->len += (size_t)rc;
            if (rc > 0) {
                return ZC_OK;
            }
        }
        if (rc == 0) {
            if (conn->len > conn->off) {
                return zc_fail(ZC_ERR_CLOSED,
                               "the daemon closed the connection in the middle "
                               "of a frame (%zu bytes received)",
                               conn->len - conn->off);
            }
            return zc_fail(ZC_ERR_CLOSED, "the daemon closed the connection");
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            status = zc_conn_wait(conn, POLLIN, deadline, "waiting for");
            if (status != ZC_OK) {
                return status;
            }
            continue;
        }
        if (errno == ECONNRESET) {
            return zc_fail(ZC_ERR_CLOSED, "the daemon reset the connection");
        }
        return zc_fail(ZC_ERR_IO, "recvmsg: %s", strerror(errno));
    }
}

/* The whole frame at the front of the buffer (*frame_len_p bytes, header included), reading
 * from the socket until it is in. */
static int zc_conn_next_frame(zc_conn_t *conn, zs_deadline_t deadline, size_t *frame_len_p)
{
    size_t frame_len, need;
    int status;

    for (;;) {
        const uint8_t *p = (conn->buf != NULL) ? conn->buf + conn->off : NULL;
        if (zs_frame_parse(p, conn->len - conn->off, &frame_len, &need, NULL, 0) != ZS_OK) {
            /* length 0 or over the limit: one status and message from the client's side */
            return zc_fail(ZC_ERR_PROTOCOL, "frame length %u from the daemon is out of range 1..%u",
                           zs_frame_length(p), ZS_FRAME_MAX);
        }
        if (frame_len > 0) {
            *frame_len_p = frame_len;
            return ZC_OK;
        }
        status = zc_conn_reserve(conn, need);
        if (status != ZC_OK) {
            return status;
        }
        status = zc_conn_fill(conn, deadline);
        if (status != ZC_OK) {
            return status;
        }
    }
}

int zc_conn_recv(zc_conn_t *conn, zs_deadline_t deadline, zc_frame_t **frame_p)
{
    zc_frame_t *frame;
    size_t frame_len = 0, n;
    int status;

    if (conn->fd < 0) {
        return zc_fail(ZC_ERR_CLOSED, "the connection to the daemon is closed");
    }
    status = zc_conn_next_frame(conn, deadline, &frame_len);
    if (status != ZC_OK) {
        return status;
    }
    n = frame_len - ZS_FRAME_HEADER;
    frame = zerod__ipc__v1__frame__unpack(NULL, n, conn->buf + conn->off + ZS_FRAME_HEADER);
    conn->off += frame_len;
    if (frame == NULL) {
        return zc_fail(ZC_ERR_PROTOCOL, "undecodable %zu-byte frame from the daemon", n);
    }
    if (conn->off == conn->len) {
        conn->off = conn->len = 0;
    }
    *frame_p = frame;
    return ZC_OK;
}

uint32_t zc_conn_take_fds(zc_conn_t *conn, int *fds, uint32_t max)
{
    uint32_t n = conn->n_fds < max ? conn->n_fds : max;

    memcpy(fds, conn->fds, n * sizeof(int));
    memmove(conn->fds, conn->fds + n, (conn->n_fds - n) * sizeof(int));
    conn->n_fds -= n;
    return n;
}

const char *zc_body_name(zc_body_case_t body)
{
    /* the oneof member's name from the generated descriptor: never out of step with the
     * .proto */
    const ProtobufCFieldDescriptor *fd;

    if (body == ZEROD__IPC__V1__FRAME__BODY__NOT_SET) {
        return "empty";
    }
    fd =
        protobuf_c_message_descriptor_get_field(&zerod__ipc__v1__frame__descriptor, (unsigned)body);
    return fd != NULL ? fd->name : "unknown";
}

const Zerod__Ipc__V1__Result *zc_frame_result(const zc_frame_t *frame)
{
    /* The body's oneof member (its field number is the body case) and, in its message, the
     * field `result` of type Result: found through the generated descriptors, so that a reply
     * added to ipc.proto needs nothing here. */
    const ProtobufCFieldDescriptor *body, *result;
    const ProtobufCMessage *msg;

    if (frame->body_case == ZEROD__IPC__V1__FRAME__BODY__NOT_SET) {
        return NULL;
    }
    body = protobuf_c_message_descriptor_get_field(&zerod__ipc__v1__frame__descriptor,
                                                   (unsigned)frame->body_case);
    if (body == NULL || body->type != PROTOBUF_C_TYPE_MESSAGE) {
        return NULL;
    }
    msg = *(const ProtobufCMessage *const *)((const uint8_t *)frame + body->offset);
    result = protobuf_c_message_descriptor_get_field_by_name(
        (const ProtobufCMessageDescriptor *)body->descriptor, "result");
    if (msg == NULL || result == NULL || result->type != PROTOBUF_C_TYPE_MESSAGE ||
        result->descriptor != &zerod__ipc__v1__result__descriptor) {
        return NULL;
    }
    return *(const Zerod__Ipc__V1__Result *const *)((const uint8_t *)msg + result->offset);
}
