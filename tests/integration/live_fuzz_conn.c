/* zd_live_fuzz: one client connection (writes that never block for long, replies decoded and
 * checked, fds received) and the state of the run. */
#define _GNU_SOURCE
#include "live_fuzz.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

lf_state_t lf_g = {.fail_lock = PTHREAD_MUTEX_INITIALIZER, .big_lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- time and findings ---------------------------------------------------------------- */

uint64_t lf_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void lf_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void lf_max(atomic_ullong *a, unsigned long long v)
{
    unsigned long long cur = atomic_load(a);

    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v)) {
    }
}

void lf_fail(uint64_t conn_seed, const char *fmt, ...)
{
    va_list ap;
    int k;

    pthread_mutex_lock(&lf_g.fail_lock);
    k = atomic_fetch_add(&lf_g.failed, 1);
    if (k < LF_MAX_FINDINGS) {
        char *m = lf_g.fail_msg[k];
        int n = snprintf(m, sizeof(lf_g.fail_msg[k]), "connection 0x%016" PRIx64 ": ", conn_seed);
        va_start(ap, fmt);
        vsnprintf(m + n, sizeof(lf_g.fail_msg[k]) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&lf_g.fail_lock);
}

void lf_conn_drop_fds(lf_conn_t *c)
{
    for (int i = 0; i < c->n_fds; i++) {
        close(c->fds[i]);
    }
    c->n_fds = 0;
}

int lf_connect(void)
{
    return rf_connect(lf_g.socket, SOCK_NONBLOCK);
}

/* Decode the frames in rx; false on a frame no daemon may send. */
static bool lf_conn_parse(lf_conn_t *c)
{
    while (c->rx.len >= 4) {
        uint32_t n = rf_get_le32(c->rx.p);
        lf_frame_t *f;

        if (n == 0 || n > LF_MAX_FRAME) {
            lf_fail(c->seed, "the daemon sent a frame length of %u", n);
            return false;
        }
        if (c->rx.len < (size_t)n + 4) {
            return true;
        }
        f = zerod__ipc__v1__frame__unpack(NULL, n, c->rx.p + 4);
        if (f == NULL) {
            lf_fail(c->seed, "the daemon sent an undecodable frame of %u bytes", n);
            return false;
        }
        c->replies++;
        atomic_fetch_add(&lf_g.st.replies, 1);
        if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_ERROR) {
            atomic_fetch_add(&lf_g.st.error_replies, 1);
            c->errors++;
            if (f->error->result != NULL && f->error->result->message != NULL) {
                snprintf(c->last_error, sizeof(c->last_error), "%s", f->error->result->message);
            }
        }
        if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY &&
            f->attach_reply->result != NULL && f->attach_reply->result->status == 0) {
            atomic_fetch_add(&lf_g.st.attached, 1);
        }
        if (f->body_case == ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY &&
            f->step_reply->result != NULL && f->step_reply->result->status == 0) {
            atomic_fetch_add(&lf_g.st.steps_ok, 1);
        }
        if (lf_g.trace) {
            const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(
                &zerod__ipc__v1__frame__descriptor, (unsigned)f->body_case);
            printf("  <- %s seq %" PRIu64 "\n", fd != NULL ? fd->name : "?", f->seq);
        }
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
        memmove(c->rx.p, c->rx.p + n + 4, c->rx.len - n - 4);
        c->rx.len -= n + 4;
    }
    return true;
}

/* One recvmsg of up to `max` bytes; keeps fds that come along (closing older ones). Returns
 * bytes read, 0 at EOF, -1 when nothing was there, -2 on a protocol failure. */
ssize_t lf_conn_recv(lf_conn_t *c, size_t max)
{
    char cbuf[CMSG_SPACE(sizeof(int) * 8)];
    struct msghdr msg;
    struct iovec iov;
    ssize_t n;

    lf_buf_reserve(&c->rx, max);
    memset(&msg, 0, sizeof(msg));
    iov.iov_base = c->rx.p + c->rx.len;
    iov.iov_len = max;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
        if (errno == ECONNRESET) {
            c->eof = true;
            return 0;
        }
        return -1;
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);

            lf_conn_drop_fds(c);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                if (c->n_fds < 8) {
                    c->fds[c->n_fds++] = fd;
                } else {
                    close(fd);
                }
            }
            atomic_fetch_add(&lf_g.st.fds_received, nfd);
        }
    }
    if (n == 0) {
        c->eof = true;
        return 0;
    }
    c->rx.len += (size_t)n;
    return lf_conn_parse(c) ? n : -2;
}

/* Read until `want` more replies came, EOF, or ms passed (0: just what is there). Reads
 * `chunk` bytes at a time, sleeping `pause_ms` between reads. */
void lf_conn_read(lf_conn_t *c, unsigned want, unsigned ms, size_t chunk, unsigned pause_ms)
{
    uint64_t end = lf_now_ms() + ms;
    unsigned target = c->replies + want;

    while (!c->eof && c->replies < target) {
        struct pollfd p = {c->fd, POLLIN, 0};
        uint64_t now = lf_now_ms();
        ssize_t n;

        if (now >= end && ms > 0) {
            break;
        }
        if (poll(&p, 1, ms > 0 ? (int)(end - now) : 0) <= 0) {
            break;
        }
        n = lf_conn_recv(c, chunk);
        if (n == -2) {
            return;
        }
        if (pause_ms > 0) {
            lf_sleep_ms(pause_ms);
        }
    }
}

/* Write all of data (with fds on the first byte); false when the daemon is gone. A daemon
 * that does not take bytes for LF_WEDGE_MS is a failure. */
bool lf_conn_write(lf_conn_t *c, const uint8_t *data, size_t n, const int *pass, int n_pass)
{
    while (n > 0) {
        struct msghdr msg;
        struct iovec iov = {(void *)data, n};
        char cbuf[CMSG_SPACE(sizeof(int) * 4)];
        ssize_t w;

        if (c->dead) {
            return false;
        }
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        if (n_pass > 0) {
            struct cmsghdr *cm;

            memset(cbuf, 0, sizeof(cbuf));
            msg.msg_control = cbuf;
            msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_pass);
            cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_pass);
            memcpy(CMSG_DATA(cm), pass, sizeof(int) * (size_t)n_pass);
        }
        w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            if (n_pass > 0) {
                atomic_fetch_add(&lf_g.st.fds_passed, (unsigned long long)n_pass);
            }
            n_pass = 0;
            data += w;
            n -= (size_t)w;
            atomic_fetch_add(&lf_g.st.bytes_sent, (unsigned long long)w);
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {c->fd, POLLOUT, 0};
            uint64_t t0 = lf_now_ms();

            /* the daemon may be waiting for us to read: drain replies while we wait */
            while (poll(&p, 1, 50) == 0) {
                if (lf_conn_recv(c, 1u << 16) == -2) {
                    return false;
                }
                if (lf_now_ms() - t0 > LF_WEDGE_MS) {
                    lf_fatal(c->seed, "the daemon took no bytes for %d ms", LF_WEDGE_MS);
                    return false;
                }
            }
            continue;
        }
        if (w < 0 && errno == EINTR) {
            continue;
        }
        c->dead = true; /* EPIPE, ECONNRESET: the daemon closed on us */
        return false;
    }
    return true;
}

/* A partial frame sent: the daemon must answer with an ErrorReply and close within
 * frame_timeout (plus slack for a loaded machine). */
void lf_conn_expect_cut(lf_conn_t *c)
{
    uint64_t t0 = lf_now_ms();
    unsigned limit = lf_g.frame_timeout_ms + LF_STALL_SLACK;

    while (!c->eof) {
        struct pollfd p = {c->fd, POLLIN, 0};
        uint64_t el = lf_now_ms() - t0;

        if (el > limit) {
            lf_fail(c->seed, "a stalled frame was not cut within frame_timeout %u ms + %d ms",
                    lf_g.frame_timeout_ms, LF_STALL_SLACK);
            return;
        }
        if (poll(&p, 1, (int)(limit - el)) > 0 && lf_conn_recv(c, 1u << 16) == -2) {
            return;
        }
    }
    atomic_fetch_add(&lf_g.st.stalls_cut, 1);
    lf_max(&lf_g.st.stall_max_ms, lf_now_ms() - t0);
}

/* Map the regions of the last AttachReply, try to shrink them, write random bytes. */
void lf_conn_scribble(lf_conn_t *c, uint64_t *r)
{
    for (int i = 0; i < c->n_fds; i++) {
        struct stat sb;
        uint8_t *p;
        size_t n, a, len;

        if (fstat(c->fds[i], &sb) != 0 || sb.st_size <= 0) {
            continue;
        }
        if (ftruncate(c->fds[i], 0) == 0 || fallocate(c->fds[i], 0, sb.st_size, 4096) == 0) {
            lf_fail(c->seed, "a region fd from the daemon can be resized (not sealed)");
            return;
        }
        n = (size_t)sb.st_size;
        p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, c->fds[i], 0);
        if (p == MAP_FAILED) {
            continue;
        }
        a = lf_below(r, (uint32_t)n);
        len = 1 + lf_below(r, (uint32_t)(n - a));
        switch (lf_below(r, 3)) {
        case 0: /* NaN everywhere (0xff bytes) */
            memset(p + a, 0xff, len);
            break;
        case 1: /* infinities and huge values */
            for (size_t k = a; k + 4 <= a + len; k += 4) {
                uint32_t v = lf_chance(r, 50) ? 0x7f800000u : 0x7f7fffffu;
                memcpy(p + k, &v, 4);
            }
            break;
        default:
            for (size_t k = a; k < a + len; k++) {
                p[k] = (uint8_t)lf_rand(r);
            }
            break;
        }
        munmap(p, n);
        atomic_fetch_add(&lf_g.st.scribbles, 1);
    }
}
