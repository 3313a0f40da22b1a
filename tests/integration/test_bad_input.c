/*
 * Bad input on the daemon's socket (docs/design-notes.md "bad frame / bad sizes"): hand-packed
 * frames on a raw Unix socket. A frame-level fault is answered by an ErrorReply naming the problem
 * and the connection is closed; a request-level fault is answered by the request's own reply
 * (SlotFree, AttachReply) with an error Result and the connection stays usable. After every
 * case a fresh, well-behaved trainer still attaches, loads its parameters and steps.
 */
#include "harness.h"
#include "raw_frame.h"

#include "zerod/ipc/v1/ipc.pb-c.h"
#include "zs/status.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef Zerod__Ipc__V1__Frame frame_t;

#define RAW_MAX_FRAME (16u * 1024u * 1024u)

/* A raw connection: socket and a receive buffer of undecoded bytes. */
typedef struct raw_conn {
    int fd;
    uint8_t buf[1u << 16];
    size_t len;
    uint64_t seq;
} raw_conn_t;

static raw_conn_t *raw_open(void)
{
    raw_conn_t *c = calloc(1, sizeof(*c));
    struct timeval tv = {10, 0}; /* a daemon that never answers fails the test, not ctest */
    const char *path = th_socket();

    cr_assert_not_null(c);
    c->fd = rf_connect(path, 0);
    cr_assert_geq(c->fd, 0, "connect %s: %s", path, strerror(errno));
    cr_assert_eq(setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    return c;
}

static void raw_close(raw_conn_t *c)
{
    close(c->fd);
    free(c);
}

static void raw_write(raw_conn_t *c, const void *data, size_t n)
{
    cr_assert_eq(rf_send_all(c->fd, data, n), 0, "send: %s", strerror(errno));
}

/* Length header + packed frame at out; returns the bytes used. Sets a fresh seq if 0. */
static size_t raw_pack(raw_conn_t *c, frame_t *f, uint8_t *out, size_t cap)
{
    if (f->seq == 0) {
        f->seq = ++c->seq;
    }
    cr_assert_leq(rf_frame_size(f), cap);
    return rf_frame_pack(f, out);
}

static void raw_send(raw_conn_t *c, frame_t *f)
{
    uint8_t buf[4096];
    size_t n = raw_pack(c, f, buf, sizeof(buf));

    raw_write(c, buf, n);
}

/* The next frame, or NULL at EOF. File descriptors that come along are closed. */
static frame_t *raw_recv(raw_conn_t *c)
{
    for (;;) {
        char cbuf[CMSG_SPACE(sizeof(int) * 8)];
        struct iovec iov;
        struct msghdr msg;
        ssize_t n;

        if (c->len >= 4) {
            uint32_t flen = rf_get_le32(c->buf);
            cr_assert(flen > 0 && flen + 4 <= sizeof(c->buf), "daemon sent a frame of %u bytes",
                      flen);
            if (c->len >= flen + 4) {
                frame_t *f = zerod__ipc__v1__frame__unpack(NULL, flen, c->buf + 4);
                cr_assert_not_null(f, "daemon sent an undecodable frame of %u bytes", flen);
                memmove(c->buf, c->buf + 4 + flen, c->len - 4 - flen);
                c->len -= 4 + flen;
                return f;
            }
        }
        memset(&msg, 0, sizeof(msg));
        iov.iov_base = c->buf + c->len;
        iov.iov_len = sizeof(c->buf) - c->len;
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf;
        msg.msg_controllen = sizeof(cbuf);
        n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        cr_assert_geq(n, 0, "recv: %s (no answer from the daemon within 10 s?)", strerror(errno));
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < nfd; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
                    close(fd);
                }
            }
        }
        if (n == 0) {
            cr_assert_eq(c->len, 0, "EOF inside a frame from the daemon");
            return NULL;
        }
        c->len += (size_t)n;
    }
}

static frame_t *raw_expect(raw_conn_t *c, Zerod__Ipc__V1__Frame__BodyCase body, const char *what)
{
    frame_t *f = raw_recv(c);

    cr_assert_not_null(f, "%s: connection closed instead of a reply", what);
    cr_assert_eq(f->body_case, body, "%s: got body %d, expected %d", what, (int)f->body_case,
                 (int)body);
    return f;
}

static void expect_result(const Zerod__Ipc__V1__Result *r, zs_status_t want, const char *what,
                          const char *needle1, const char *needle2)
{
    const char *msg;

    cr_assert_not_null(r, "%s: reply without a Result", what);
    msg = r->message != NULL ? r->message : "";
    cr_assert_eq((int)r->status, (int)want, "%s: status %s, expected %s (message: %s)", what,
                 zs_status_name((zs_status_t)r->status), zs_status_name(want), msg);
    cr_assert_not_null(strstr(msg, needle1), "%s: message '%s' does not name '%s'", what, msg,
                       needle1);
    if (needle2 != NULL) {
        cr_assert_not_null(strstr(msg, needle2), "%s: message '%s' does not say '%s'", what, msg,
                           needle2);
    }
    if (want != ZS_OK) {
        cr_log_info("%s: %s: %s", what, zs_status_name(want), msg);
    }
}

/* The daemon still serves a fresh, well-behaved trainer: attach, params, one step, detach. */
static void daemon_still_serves(void)
{
    th_model_t m = {.n_groups = 1, .gnp = {2}, .numel = {24, 9}, .n_params = 2, .total = 33};
    th_session_t ts;
    zc_step_result_t res;
    float init[33], grads[33], after[33];

    for (int i = 0; i < 33; i++) {
        init[i] = 0.5f;
        grads[i] = (i % 2) ? 0.25f : -0.25f;
    }
    th_attach(&ts, "bad_input_probe", &m, ZC_DTYPE_F32, NULL);
    cr_assert_eq(ts.info.resumed, 0, "the probe job should be fresh");
    th_init_params(&ts, init);
    th_submit(&ts, grads, 0);
    cr_assert_eq(th_step(&ts, &res), ZC_OK, "probe step: %s", zc_last_error());
    cr_assert_eq(res.step, 1);
    th_read_params(&ts, after);
    /* Adam's first step moves every element by lr against its gradient's sign */
    cr_assert(after[0] > init[0] && after[1] < init[1], "probe params did not move: %g %g",
              after[0], after[1]);
    th_end(&ts);
}

/* A frame-level fault: ErrorReply (echoing seq) naming the problem, then the daemon closes. The
 * connection is freed, and a fresh trainer is still served. */
static void expect_error_then_close(raw_conn_t *c, uint64_t seq, zs_status_t want, const char *what,
                                    const char *needle1, const char *needle2)
{
    frame_t *f = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_ERROR, what);

    cr_assert_eq(f->seq, seq, "%s: ErrorReply seq %llu, expected %llu", what,
                 (unsigned long long)f->seq, (unsigned long long)seq);
    expect_result(f->error->result, want, what, needle1, needle2);
    zerod__ipc__v1__frame__free_unpacked(f, NULL);
    cr_assert_null(raw_recv(c), "%s: the daemon kept the connection open after an ErrorReply",
                   what);
    raw_close(c);
    daemon_still_serves();
}

/* Sends a Hello (version NULL: none); returns its seq. */
static uint64_t raw_send_hello(raw_conn_t *c, uint32_t protocol, const char *version,
                               Zerod__Ipc__V1__Role role)
{
    frame_t f;
    Zerod__Ipc__V1__Hello h;

    rf_hello_init(&f, &h, protocol, version, role);
    raw_send(c, &f);
    return f.seq;
}

/* Sends a StatusRequest; returns its seq. */
static uint64_t raw_send_status(raw_conn_t *c)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;

    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS;
    f.status = &sr;
    raw_send(c, &f);
    return f.seq;
}

static void raw_hello(raw_conn_t *c, Zerod__Ipc__V1__Role role)
{
    uint64_t seq = raw_send_hello(c, 1, "test_bad_input", role);
    frame_t *r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY, "hello");

    cr_assert_eq(r->seq, seq);
    cr_assert_eq(r->hello_reply->result->status, ZEROD__COMMON__V1__STATUS__ZS_OK);
    cr_assert_eq(r->hello_reply->protocol, 1);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
}

/* Attach one group of params; returns the AttachReply frame (caller frees). */
static frame_t *raw_attach(raw_conn_t *c, const char *job, const uint64_t *numel, size_t n,
                           const char *config_json)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    Zerod__Ipc__V1__Group g = ZEROD__IPC__V1__GROUP__INIT;
    Zerod__Ipc__V1__Group *gp = &g;
    frame_t *r;

    g.n_numel = n;
    g.numel = (uint64_t *)numel;
    at.job_id = (char *)job;
    at.world = 1;
    at.dtype = ZEROD__IPC__V1__DTYPE__DTYPE_F32;
    at.n_groups = 1;
    at.groups = &gp;
    at.config_json = (char *)config_json;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    f.attach = &at;
    raw_send(c, &f);
    r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, "attach");
    cr_assert_eq(r->seq, f.seq, "attach reply seq");
    return r;
}

/* A tiny model whose two params are two buckets (reduce_bucket_size 64). */
static const uint64_t small_numel[2] = {100, 37};
#define SMALL_CONFIG "{\"zero_optimization\": {\"reduce_bucket_size\": 64}}"

/* A raw trainer with an attached job and loaded params; returns the job's slot count. */
static uint32_t raw_trainer(raw_conn_t *c, const char *job)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__ParamsReady pr = ZEROD__IPC__V1__PARAMS_READY__INIT;
    frame_t *r;
    uint32_t n_slots;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    for (int i = 0; i < 100; i++) { /* a job of a failed earlier test may still linger */
        r = raw_attach(c, job, small_numel, 2, SMALL_CONFIG);
        if (r->attach_reply->result->status != ZEROD__COMMON__V1__STATUS__ZS_ERR_BUSY) {
            break;
        }
        zerod__ipc__v1__frame__free_unpacked(r, NULL);
        usleep(100000);
    }
    expect_result(r->attach_reply->result, ZS_OK, "attach", "", NULL);
    cr_assert_eq(r->attach_reply->stage, 2);
    n_slots = r->attach_reply->n_slots;
    cr_assert_gt(n_slots, 0);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);

    f.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY;
    f.params_ready = &pr;
    raw_send(c, &f);
    r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY, "params_ready");
    expect_result(r->params_ready_reply->result, ZS_OK, "params_ready", "", NULL);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
    return n_slots;
}

static size_t pack_bucket_ready(raw_conn_t *c, uint32_t slot, uint32_t bucket, uint8_t *out,
                                size_t cap, uint64_t *seq_p)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__BucketReady br = ZEROD__IPC__V1__BUCKET_READY__INIT;
    size_t n;

    br.slot = slot;
    br.bucket = bucket;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY;
    f.bucket_ready = &br;
    n = raw_pack(c, &f, out, cap);
    *seq_p = f.seq;
    return n;
}

/* BucketReady and its SlotFree (caller frees). */
static frame_t *raw_bucket(raw_conn_t *c, uint32_t slot, uint32_t bucket)
{
    uint8_t buf[64];
    uint64_t seq;
    size_t n = pack_bucket_ready(c, slot, bucket, buf, sizeof(buf), &seq);
    frame_t *r;

    raw_write(c, buf, n);
    r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE, "bucket_ready");
    cr_assert_eq(r->seq, seq, "SlotFree seq %llu, expected %llu", (unsigned long long)r->seq,
                 (unsigned long long)seq);
    cr_assert_eq(r->slot_free->slot, slot);
    cr_assert_eq(r->slot_free->bucket, bucket);
    return r;
}

/* BucketReady; its SlotFree's Result must be `want` naming needle1 (and needle2). */
static void raw_bucket_expect(raw_conn_t *c, uint32_t slot, uint32_t bucket, zs_status_t want,
                              const char *what, const char *needle1, const char *needle2)
{
    frame_t *r = raw_bucket(c, slot, bucket);

    expect_result(r->slot_free->result, want, what, needle1, needle2);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
}

static void raw_step_ok(raw_conn_t *c, uint64_t want_step)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Step sp = ZEROD__IPC__V1__STEP__INIT;
    frame_t *r;

    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
    f.step = &sp;
    raw_send(c, &f);
    r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY, "step");
    expect_result(r->step_reply->result, ZS_OK, "step", "", NULL);
    cr_assert_eq(r->step_reply->step, want_step);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
}

static void raw_detach_end(raw_conn_t *c)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Detach d = ZEROD__IPC__V1__DETACH__INIT;
    frame_t *r;

    d.end_job = 1;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH;
    f.detach = &d;
    raw_send(c, &f);
    r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY, "detach");
    expect_result(r->detach_reply->result, ZS_OK, "detach", "", NULL);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
}

/* The end of a request-level case: the connection still steps and ends its job; then a fresh
 * trainer is served. */
static void raw_finish(raw_conn_t *c)
{
    raw_step_ok(c, 1);
    raw_detach_end(c);
    raw_close(c);
    daemon_still_serves();
}

/* ---- frame-level faults: ErrorReply, connection closed ------------------------------- */

Test(zerod_bad_input, truncated_frame_then_eof)
{
    raw_conn_t *c = raw_open();
    uint8_t buf[14] = {0};

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    rf_put_le32(buf, 100);
    raw_write(c, buf, sizeof(buf)); /* header + 10 of 100 bytes */
    cr_assert_eq(shutdown(c->fd, SHUT_WR), 0);
    expect_error_then_close(c, 0, ZS_ERR_PROTOCOL, "truncated frame", "truncated frame",
                            "14 of 104 bytes");
}

Test(zerod_bad_input, truncated_frame_times_out)
{
    raw_conn_t *c = raw_open();
    uint8_t buf[14] = {0};

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    rf_put_le32(buf, 100);
    raw_write(c, buf, sizeof(buf)); /* and then nothing: frame_timeout is 2 s */
    expect_error_then_close(c, 0, ZS_ERR_TIMEOUT, "stalled frame", "truncated frame",
                            "frame_timeout (2000 ms)");
}

Test(zerod_bad_input, no_hello_times_out)
{
    raw_conn_t *c = raw_open(); /* and then nothing: it would count against the uid's cap */

    expect_error_then_close(c, 0, ZS_ERR_TIMEOUT, "no hello", "no Hello within frame_timeout",
                            "(2000 ms)");
}

Test(zerod_bad_input, still_working_from_a_client)
{
    raw_conn_t *c = raw_open();
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StillWorking sw = ZEROD__IPC__V1__STILL_WORKING__INIT;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_STILL_WORKING;
    f.still_working = &sw;
    raw_send(c, &f);
    expect_error_then_close(c, f.seq, ZS_ERR_PROTOCOL, "still_working from a client",
                            "still_working", "not a request");
}

/* Keepalives only where the Hello asks for them: an older client would not know the frame. */
Test(zerod_bad_input, keepalive_only_when_asked)
{
    for (int ask = 0; ask < 2; ask++) {
        raw_conn_t *c = raw_open();
        Zerod__Ipc__V1__Hello h;
        frame_t f, *r;

        rf_hello_init(&f, &h, 1, "test_bad_input", ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
        h.keepalive = ask;
        raw_send(c, &f);
        r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY, "hello");
        /* the fixture's heartbeat_interval and heartbeat_timeout: the defaults */
        cr_assert_eq(r->hello_reply->keepalive_interval_ms, ask ? 1000u : 0u);
        cr_assert_eq(r->hello_reply->keepalive_timeout_ms, ask ? 5000u : 0u);
        zerod__ipc__v1__frame__free_unpacked(r, NULL);
        raw_close(c);
    }
}

Test(zerod_bad_input, frame_over_16_mib)
{
    raw_conn_t *c = raw_open();
    uint8_t hdr[4];

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    rf_put_le32(hdr, RAW_MAX_FRAME + 1); /* the header alone must be refused */
    raw_write(c, hdr, sizeof(hdr));
    expect_error_then_close(c, 0, ZS_ERR_FRAME_TOO_LARGE, "frame over 16 MiB",
                            "frame length 16777217", "ZS_MAX_FRAME");
}

Test(zerod_bad_input, zero_length_frame)
{
    raw_conn_t *c = raw_open();
    uint8_t hdr[4] = {0, 0, 0, 0};

    raw_write(c, hdr, sizeof(hdr));
    expect_error_then_close(c, 0, ZS_ERR_PROTOCOL, "zero-length frame", "frame length is 0", NULL);
}

Test(zerod_bad_input, unknown_message)
{
    raw_conn_t *c = raw_open();
    /* Frame{seq = 7, field 99 (varint) = 42}: no body this daemon knows */
    uint8_t buf[4 + 5] = {5, 0, 0, 0, 0x08, 0x07, 0x98, 0x06, 0x2a};

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    raw_write(c, buf, sizeof(buf));
    expect_error_then_close(c, 7, ZS_ERR_PROTOCOL, "unknown message", "unknown message",
                            "protocol 1");
}

Test(zerod_bad_input, undecodable_frame)
{
    raw_conn_t *c = raw_open();
    /* field 10 (hello) with length 100 in a 3-byte body */
    uint8_t buf[4 + 3] = {3, 0, 0, 0, 0x52, 0x64, 0x00};

    raw_write(c, buf, sizeof(buf));
    expect_error_then_close(c, 0, ZS_ERR_PROTOCOL, "undecodable frame",
                            "is not a valid zerod.ipc.v1.Frame", NULL);
}

Test(zerod_bad_input, message_before_hello)
{
    raw_conn_t *c = raw_open();
    uint64_t seq = raw_send_status(c);

    expect_error_then_close(c, seq, ZS_ERR_PROTOCOL, "message before hello", "status before hello",
                            "the first frame must be hello");
}

Test(zerod_bad_input, hello_twice)
{
    raw_conn_t *c = raw_open();
    uint64_t seq;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    seq = raw_send_hello(c, 1, NULL, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    expect_error_then_close(c, seq, ZS_ERR_PROTOCOL, "hello twice", "hello",
                            "sent twice on one connection");
}

Test(zerod_bad_input, hello_without_role)
{
    raw_conn_t *c = raw_open();
    uint64_t seq = raw_send_hello(c, 1, NULL, ZEROD__IPC__V1__ROLE__ROLE_UNSPECIFIED);

    expect_error_then_close(c, seq, ZS_ERR_PROTOCOL, "hello without role", "hello.role",
                            "neither trainer (1) nor control (2)");
}

Test(zerod_bad_input, control_role_sends_attach)
{
    raw_conn_t *c = raw_open();
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_CONTROL);
    at.job_id = (char *)"bad_role";
    at.world = 1;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    f.attach = &at;
    raw_send(c, &f);
    expect_error_then_close(c, f.seq, ZS_ERR_PERMISSION, "wrong role", "attach",
                            "not allowed for role control");
}

Test(zerod_bad_input, trainer_role_sends_status)
{
    raw_conn_t *c = raw_open();
    uint64_t seq;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    seq = raw_send_status(c);
    expect_error_then_close(c, seq, ZS_ERR_PERMISSION, "wrong role", "status",
                            "not allowed for role trainer");
}

Test(zerod_bad_input, protocol_version_mismatch)
{
    raw_conn_t *c = raw_open();
    uint64_t seq = raw_send_hello(c, 2, "9.9.9", ZEROD__IPC__V1__ROLE__ROLE_TRAINER);

    /* both versions in the message */
    expect_error_then_close(c, seq, ZS_ERR_VERSION, "version mismatch",
                            "hello.protocol: client speaks protocol 2 (version 9.9.9)",
                            "daemon speaks protocol 1");
}

/* ---- request-level faults: an error Result, the connection goes on -------------------- */

Test(zerod_bad_input, unknown_bucket)
{
    raw_conn_t *c = raw_open();

    raw_trainer(c, "bad_unknown_bucket");
    raw_bucket_expect(c, 0, 99, ZS_ERR_INVALID, "unknown bucket", "BucketReady.bucket 99",
                      "unknown (layout has 3)");
    /* the slot came back and the connection still works */
    raw_bucket_expect(c, 0, 1, ZS_OK, "bucket 1", "", NULL);
    raw_finish(c);
}

Test(zerod_bad_input, slot_submitted_twice_in_one_write)
{
    raw_conn_t *c = raw_open();
    uint8_t buf[128];
    uint64_t seq1, seq2;
    size_t n;
    int ok = 0, dup = 0;

    raw_trainer(c, "bad_slot_twice");
    n = pack_bucket_ready(c, 1, 0, buf, sizeof(buf), &seq1);
    n += pack_bucket_ready(c, 1, 1, buf + n, sizeof(buf) - n, &seq2);
    raw_write(c, buf, n); /* one write: the daemon sees both before any SlotFree */
    for (int i = 0; i < 2; i++) {
        frame_t *r = raw_expect(c, ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE, "slot twice");
        cr_assert_eq(r->slot_free->slot, 1);
        if (r->seq == seq1) {
            expect_result(r->slot_free->result, ZS_OK, "first submit of slot 1", "", NULL);
            ok++;
        } else {
            cr_assert_eq(r->seq, seq2, "SlotFree for an unknown seq %llu",
                         (unsigned long long)r->seq);
            expect_result(r->slot_free->result, ZS_ERR_INVALID, "second submit of slot 1",
                          "BucketReady.slot 1", "submitted twice");
            cr_assert_eq(r->slot_free->bucket, 1);
            dup++;
        }
        zerod__ipc__v1__frame__free_unpacked(r, NULL);
    }
    cr_assert(ok == 1 && dup == 1, "%d good and %d refused SlotFree", ok, dup);
    /* after its SlotFree the slot is free again */
    raw_bucket_expect(c, 1, 1, ZS_OK, "slot 1 again", "", NULL);
    raw_finish(c);
}

Test(zerod_bad_input, slot_out_of_range)
{
    raw_conn_t *c = raw_open();
    uint32_t n_slots;
    char needle[64];

    n_slots = raw_trainer(c, "bad_slot_range");
    snprintf(needle, sizeof(needle), "BucketReady.slot %u is out of range (%u slots)", n_slots,
             n_slots);
    raw_bucket_expect(c, n_slots, 0, ZS_ERR_INVALID, "slot out of range", needle, NULL);
    raw_bucket_expect(c, 1000000, 0, ZS_ERR_INVALID, "slot far out of range",
                      "BucketReady.slot 1000000", NULL);
    raw_finish(c);
}

/* A refused Attach: AttachReply with an error naming the key, no fds, connection usable. */
static void attach_refused(const char *job, const uint64_t *numel, size_t n, const char *config,
                           zs_status_t want, const char *needle1, const char *needle2)
{
    raw_conn_t *c = raw_open();
    frame_t *r;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    r = raw_attach(c, job, numel, n, config);
    expect_result(r->attach_reply->result, want, job, needle1, needle2);
    cr_assert_eq(r->attach_reply->n_slots, 0, "a refused attach announces slots");
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
    /* the same connection attaches a good job afterwards */
    r = raw_attach(c, job, small_numel, 2, SMALL_CONFIG);
    expect_result(r->attach_reply->result, ZS_OK, "attach after a refused one", "", NULL);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
    raw_detach_end(c);
    raw_close(c);
    daemon_still_serves();
}

Test(zerod_bad_input, layout_total_over_max_shard_bytes)
{
    /* fp32, 3M elements: params 12 MB + 2 slots (bucket_slots' default) x 12 MB + shard
     * 3 x 12 MB (m, v, acc: the master is the params region's slice) = 72 MB > 64 MiB */
    static const uint64_t big[1] = {3000000};

    attach_refused("bad_too_big", big, 1, NULL, ZS_ERR_LIMIT, "layout needs 72000000 bytes",
                   "over max_shard_bytes = 67108864");
}

Test(zerod_bad_input, layout_params_over_max_shard_bytes)
{
    /* 20M fp32 elements alone exceed 64 MiB / 4 bytes = 16 Mi elements */
    static const uint64_t huge[2] = {10000000, 10000000};

    attach_refused("bad_huge", huge, 2, NULL, ZS_ERR_LIMIT, "exceeds the limit of 16777216",
                   "max_shard_bytes = 67108864");
}

Test(zerod_bad_input, config_unknown_key)
{
    attach_refused("bad_cfg_key", small_numel, 2,
                   "{\"optimizer\": {\"params\": {\"lr\": 0.01, \"lr_warp\": 2}}}", ZS_ERR_CONFIG,
                   "'optimizer.params.lr_warp'", "unknown");
}

Test(zerod_bad_input, config_wrong_type)
{
    attach_refused("bad_cfg_type", small_numel, 2,
                   "{\"optimizer\": {\"params\": {\"lr\": \"fast\"}}}", ZS_ERR_CONFIG,
                   "'optimizer.params.lr': expected a non-negative number",
                   "got a string \"fast\"");
}

Test(zerod_bad_input, config_negative_lr)
{
    attach_refused("bad_cfg_lr", small_numel, 2, "{\"optimizer\": {\"params\": {\"lr\": -0.1}}}",
                   ZS_ERR_CONFIG, "'optimizer.params.lr': expected a non-negative number",
                   "got -0.1");
}

/* A job id with a newline cannot forge a line in the daemon's log: the refusal that quotes it
 * is one line, the newline written as \n. */
/* How many lines of the daemon's log contain `needle`; `starts` counts those that begin with
 * `prefix` (NULL: none). */
static int daemon_log_count(const char *needle, const char *prefix, int *starts)
{
    char log_path[512], line[4096];
    const char *sock = th_socket();
    const char *slash = strrchr(sock, '/');
    int n = 0;
    FILE *f;

    cr_assert_not_null(slash);
    snprintf(log_path, sizeof(log_path), "%.*s/zerod.log", (int)(slash - sock), sock);
    f = fopen(log_path, "r");
    cr_assert_not_null(f, "cannot read the daemon's log %s", log_path);
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, needle) != NULL;
        if (prefix != NULL && starts != NULL) {
            *starts += strncmp(line, prefix, strlen(prefix)) == 0;
        }
    }
    fclose(f);
    return n;
}

Test(zerod_bad_input, job_id_cannot_forge_a_log_line)
{
    int forged = 0, quoted;
    raw_conn_t *c = raw_open();
    frame_t *r;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    r = raw_attach(c, "forge\nERROR forged by a client", small_numel, 2, NULL);
    expect_result(r->attach_reply->result, ZS_ERR_INVALID, "attach",
                  "job_id has a non-printable or space character", NULL);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
    raw_close(c);
    quoted =
        daemon_log_count("job 'forge\\nERROR forged by a client' refused", "ERROR forged", &forged);
    cr_assert_eq(forged, 0, "a client's job id started a line of the daemon's log");
    cr_assert_eq(quoted, 1, "the refusal is not logged (once) with the newline escaped");
}

Test(zerod_bad_input, unused_config_keys_are_named_in_the_log_once)
{
    raw_conn_t *c = raw_open();
    frame_t *r;

    raw_hello(c, ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    r = raw_attach(c, "unused-keys", small_numel, 2,
                   "{\"dump_state\": true, \"wall_clock_breakdown\": false}");
    expect_result(r->attach_reply->result, ZS_OK, "attach", "", NULL);
    zerod__ipc__v1__frame__free_unpacked(r, NULL);
    raw_detach_end(c);
    raw_close(c);
    cr_assert_eq(daemon_log_count("job 'unused-keys': config keys zerod does not use, ignored: "
                                  "dump_state, wall_clock_breakdown",
                                  NULL, NULL),
                 1, "the unused keys are not logged once, by name");
}
