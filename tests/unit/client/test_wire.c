/* zc_conn: frame decoding from a socketpair (length prefix, split and batched frames,
 * SCM_RIGHTS fds, bad lengths, EOF in the middle of a frame, a silent daemon); connecting to a
 * listener whose backlog is full (a stopped daemon): bounded by the deadline. */
#define _GNU_SOURCE
#include "zc_int.h"

#include "zs/frame.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct pair {
    zc_conn_t conn; /* client side */
    int peer;       /* raw "daemon" side */
} pair_t;

static void pair_init(pair_t *p)
{
    int sv[2];

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    cr_assert_eq(zc_conn_init(&p->conn, sv[0]), ZC_OK);
    p->peer = sv[1];
}

static void pair_cleanup(pair_t *p)
{
    zc_conn_cleanup(&p->conn);
    if (p->peer >= 0) {
        close(p->peer);
    }
}

/* A StepReply frame with this seq and step, length-prefixed; returns its size. */
static size_t pack_step_reply(uint64_t seq, uint64_t step, uint8_t *buf, size_t cap)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StepReply sr = ZEROD__IPC__V1__STEP_REPLY__INIT;
    size_t n;

    sr.step = step;
    sr.grad_norm = 0.5;
    f.seq = seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY;
    f.step_reply = &sr;
    n = zerod__ipc__v1__frame__get_packed_size(&f);
    cr_assert_leq(n + 4, cap);
    for (int i = 0; i < 4; i++) {
        buf[i] = (uint8_t)(n >> (8 * i));
    }
    zerod__ipc__v1__frame__pack(&f, buf + 4);
    return n + 4;
}

static void write_all(int fd, const uint8_t *buf, size_t n)
{
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
}

static zs_deadline_t soon(void)
{
    return zs_deadline_in_ms(2000);
}

/* A daemon that went silent (HelloReply.keepalive_timeout_ms) fails a wait long before the
 * call's deadline, naming the socket and the silence; each byte that comes restarts it. */
Test(zc_conn, silence_fails_a_wait_before_its_deadline)
{
    uint8_t buf[256];
    zc_frame_t *f = NULL;
    pair_t p;
    size_t n;
    uint64_t t0;

    pair_init(&p);
    p.conn.silence_ms = 300;
    snprintf(p.conn.path, sizeof(p.conn.path), "/run/zerod/test.sock");
    n = pack_step_reply(3, 1, buf, sizeof(buf));
    write_all(p.peer, buf, 2);
    usleep(200000);
    write_all(p.peer, buf + 2, n - 2); /* 200 ms after the first bytes: within the silence */
    cr_assert_eq(zc_conn_recv(&p.conn, zs_deadline_in_ms(60000), &f), ZC_OK, "%s", zc_last_error());
    zerod__ipc__v1__frame__free_unpacked(f, NULL);
    t0 = zs_time_now_ns();
    cr_assert_eq(zc_conn_recv(&p.conn, zs_deadline_in_ms(60000), &f), ZC_ERR_PEER_LOST);
    cr_assert_lt(zs_time_now_ns() - t0, 5 * ZS_NSEC_PER_SEC);
    cr_assert(strstr(zc_last_error(), "daemon at /run/zerod/test.sock sent nothing for 0.3 s"),
              "%s", zc_last_error());
    /* the call's own deadline, when it is the nearer one, stays a timeout */
    cr_assert_eq(zc_conn_recv(&p.conn, zs_deadline_in_ms(20), &f), ZC_ERR_TIMEOUT);
    pair_cleanup(&p);
}

Test(zc_conn, decodes_a_frame_split_across_writes)
{
    uint8_t buf[256];
    zc_frame_t *f = NULL;
    pair_t p;
    size_t n;

    pair_init(&p);
    n = pack_step_reply(7, 42, buf, sizeof(buf));
    write_all(p.peer, buf, 2); /* half the length prefix */
    cr_assert_eq(zc_conn_recv(&p.conn, zs_deadline_in_ms(20), &f), ZC_ERR_TIMEOUT);
    write_all(p.peer, buf + 2, 5);
    cr_assert_eq(zc_conn_recv(&p.conn, zs_deadline_in_ms(20), &f), ZC_ERR_TIMEOUT);
    write_all(p.peer, buf + 7, n - 7);
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(f->seq, 7);
    cr_assert_eq(f->body_case, ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY);
    cr_assert_eq(f->step_reply->step, 42);
    zerod__ipc__v1__frame__free_unpacked(f, NULL);
    pair_cleanup(&p);
}

Test(zc_conn, decodes_several_frames_from_one_write)
{
    uint8_t buf[1024];
    size_t n = 0;
    pair_t p;

    pair_init(&p);
    for (uint64_t i = 1; i <= 5; i++) {
        n += pack_step_reply(i, 100 + i, buf + n, sizeof(buf) - n);
    }
    write_all(p.peer, buf, n);
    for (uint64_t i = 1; i <= 5; i++) {
        zc_frame_t *f = NULL;
        cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_OK, "%s", zc_last_error());
        cr_assert_eq(f->seq, i);
        cr_assert_eq(f->step_reply->step, 100 + i);
        zerod__ipc__v1__frame__free_unpacked(f, NULL);
    }
    pair_cleanup(&p);
}

typedef struct writer {
    int fd;
    const uint8_t *buf;
    size_t n;
} writer_t;

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    size_t off = 0;

    while (off < w->n) {
        ssize_t rc = write(w->fd, w->buf + off, w->n - off);
        if (rc <= 0) {
            break;
        }
        off += (size_t)rc;
    }
    return NULL;
}

Test(zc_conn, decodes_a_frame_larger_than_the_initial_buffer)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StatusReply sr = ZEROD__IPC__V1__STATUS_REPLY__INIT;
    size_t big = 1024 * 1024, n;
    char *job = malloc(big + 1);
    uint8_t *buf;
    zc_frame_t *out = NULL;
    pthread_t th;
    writer_t w;
    pair_t p;

    cr_assert_not_null(job);
    memset(job, 'j', big);
    job[big] = '\0';
    sr.job_id = job;
    f.seq = 3;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY;
    f.status_reply = &sr;
    n = zerod__ipc__v1__frame__get_packed_size(&f);
    buf = malloc(n + 4);
    cr_assert_not_null(buf);
    for (int i = 0; i < 4; i++) {
        buf[i] = (uint8_t)(n >> (8 * i));
    }
    zerod__ipc__v1__frame__pack(&f, buf + 4);

    pair_init(&p);
    w.fd = p.peer;
    w.buf = buf;
    w.n = n + 4;
    cr_assert_eq(pthread_create(&th, NULL, writer_main, &w), 0);
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &out), ZC_OK, "%s", zc_last_error());
    pthread_join(th, NULL);
    cr_assert_eq(out->seq, 3);
    cr_assert_eq(strlen(out->status_reply->job_id), big);
    zerod__ipc__v1__frame__free_unpacked(out, NULL);
    pair_cleanup(&p);
    free(buf);
    free(job);
}

Test(zc_conn, collects_fds_sent_with_a_frame)
{
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cbuf;
    uint8_t buf[256];
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *c;
    int fds[2], got[ZC_MAX_PENDING_FDS];
    zc_frame_t *f = NULL;
    pair_t p;
    size_t n;

    pair_init(&p);
    n = pack_step_reply(9, 1, buf, sizeof(buf));
    fds[0] = memfd_create("zc-test-a", MFD_CLOEXEC);
    fds[1] = memfd_create("zc-test-b", MFD_CLOEXEC);
    cr_assert(fds[0] >= 0 && fds[1] >= 0);
    memset(&msg, 0, sizeof(msg));
    memset(&cbuf, 0, sizeof(cbuf));
    iov.iov_base = buf;
    iov.iov_len = n;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.buf;
    msg.msg_controllen = sizeof(cbuf.buf);
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    cr_assert_eq(sendmsg(p.peer, &msg, 0), (ssize_t)n);
    close(fds[0]);
    close(fds[1]);

    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(f->seq, 9);
    zerod__ipc__v1__frame__free_unpacked(f, NULL);
    cr_assert_eq(zc_conn_take_fds(&p.conn, got, ZC_MAX_PENDING_FDS), 2);
    for (int i = 0; i < 2; i++) {
        cr_assert(fcntl(got[i], F_GETFD) & FD_CLOEXEC, "fd %d is not close-on-exec", got[i]);
        close(got[i]);
    }
    cr_assert_eq(zc_conn_take_fds(&p.conn, got, ZC_MAX_PENDING_FDS), 0);
    pair_cleanup(&p);
}

Test(zc_conn, refuses_a_zero_length)
{
    uint8_t zero[4] = {0, 0, 0, 0};
    zc_frame_t *f = NULL;
    pair_t p;

    pair_init(&p);
    write_all(p.peer, zero, 4);
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_ERR_PROTOCOL);
    cr_assert(strstr(zc_last_error(), "out of range") != NULL, "%s", zc_last_error());
    pair_cleanup(&p);
}

Test(zc_conn, refuses_a_length_over_the_limit)
{
    uint32_t n = ZS_FRAME_MAX + 1;
    uint8_t hdr[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    zc_frame_t *f = NULL;
    pair_t p;

    pair_init(&p);
    write_all(p.peer, hdr, 4);
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_ERR_PROTOCOL);
    pair_cleanup(&p);
}

Test(zc_conn, refuses_an_undecodable_frame)
{
    uint8_t junk[8] = {4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    zc_frame_t *f = NULL;
    pair_t p;

    pair_init(&p);
    write_all(p.peer, junk, sizeof(junk));
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_ERR_PROTOCOL);
    cr_assert(strstr(zc_last_error(), "undecodable") != NULL, "%s", zc_last_error());
    pair_cleanup(&p);
}

Test(zc_conn, reports_eof_in_the_middle_of_a_frame)
{
    uint8_t buf[256];
    zc_frame_t *f = NULL;
    pair_t p;
    size_t n;

    pair_init(&p);
    n = pack_step_reply(1, 1, buf, sizeof(buf));
    write_all(p.peer, buf, n - 1);
    close(p.peer);
    p.peer = -1;
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_ERR_CLOSED);
    cr_assert(strstr(zc_last_error(), "middle of a frame") != NULL, "%s", zc_last_error());
    pair_cleanup(&p);
}

Test(zc_conn, reports_a_clean_eof)
{
    zc_frame_t *f = NULL;
    pair_t p;

    pair_init(&p);
    close(p.peer);
    p.peer = -1;
    cr_assert_eq(zc_conn_recv(&p.conn, soon(), &f), ZC_ERR_CLOSED);
    pair_cleanup(&p);
}

Test(zc_conn, sends_a_length_prefixed_frame)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    Zerod__Ipc__V1__Frame *back;
    uint8_t buf[256];
    uint32_t n;
    pair_t p;

    pair_init(&p);
    br.slot = 3;
    br.bucket = 5;
    br.micro_step = 1;
    f.seq = zc_conn_next_seq(&p.conn);
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
    f.bucket_ready = &br;
    cr_assert_eq(zc_conn_send(&p.conn, &f, -1, soon()), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(read(p.peer, buf, 4), 4);
    n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
    cr_assert_eq(n, zerod__ipc__v1__frame__get_packed_size(&f));
    cr_assert_eq(read(p.peer, buf, n), (ssize_t)n);
    back = zerod__ipc__v1__frame__unpack(NULL, n, buf);
    cr_assert_not_null(back);
    cr_assert_eq(back->seq, 1);
    cr_assert_eq(back->bucket_ready->slot, 3);
    cr_assert_eq(back->bucket_ready->bucket, 5);
    cr_assert_eq(back->bucket_ready->micro_step, 1);
    zerod__ipc__v1__frame__free_unpacked(back, NULL);
    pair_cleanup(&p);
}

/* ---- connect: a listener that accepts nothing (a stopped daemon) ------------------------- */

typedef struct stuck {
    char dir[64], path[96];
    int lfd;
    int fill[64]; /* the connections that fill its backlog */
    int n_fill;
} stuck_t;

/* A listening socket with the smallest backlog, filled with connections nobody accepts. */
static void stuck_init(stuck_t *st)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};

    snprintf(st->dir, sizeof(st->dir), "/tmp/zc-wire-XXXXXX");
    cr_assert_not_null(mkdtemp(st->dir));
    snprintf(st->path, sizeof(st->path), "%s/stuck.sock", st->dir);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", st->path);
    st->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(st->lfd, 0);
    cr_assert_eq(bind(st->lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    cr_assert_eq(listen(st->lfd, 0), 0);
    for (st->n_fill = 0; st->n_fill < 64; st->n_fill++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        cr_assert_geq(fd, 0);
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
            cr_assert_eq(errno, EAGAIN, "connect: %s", strerror(errno));
            close(fd);
            return; /* full */
        }
        st->fill[st->n_fill] = fd;
    }
    cr_assert_fail("a backlog of 0 took 64 connections");
}

static void stuck_cleanup(stuck_t *st)
{
    for (int i = 0; i < st->n_fill; i++) {
        close(st->fill[i]);
    }
    close(st->lfd);
    unlink(st->path);
    rmdir(st->dir);
}

static void *accept_one(void *arg)
{
    stuck_t *st = arg;
    int fd = accept4(st->lfd, NULL, NULL, SOCK_CLOEXEC); /* blocks until the backlog has one */

    if (fd >= 0) {
        close(fd);
    }
    return NULL;
}

Test(zc_conn, connect_to_a_full_backlog_ends_at_its_deadline)
{
    zc_conn_t c;
    stuck_t st = {.lfd = -1};

    stuck_init(&st);
    cr_assert_eq(zc_conn_connect(&c, st.path, zs_deadline_in_ms(200)), ZC_ERR_TIMEOUT);
    cr_assert(strstr(zc_last_error(), "backlog") != NULL, "%s", zc_last_error());
    stuck_cleanup(&st);
}

Test(zc_conn, connect_gets_in_once_the_backlog_has_room)
{
    pthread_t th;
    zc_conn_t c;
    stuck_t st = {.lfd = -1};

    stuck_init(&st);
    /* one accept frees one place, before or during the retries: either way it connects */
    cr_assert_eq(pthread_create(&th, NULL, accept_one, &st), 0);
    cr_assert_eq(zc_conn_connect(&c, st.path, zs_deadline_in_ms(10000)), ZC_OK, "%s",
                 zc_last_error());
    pthread_join(th, NULL);
    zc_conn_cleanup(&c);
    stuck_cleanup(&st);
}
