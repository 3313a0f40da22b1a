/*
 * Helpers of the rpc tests (test_rpc.c, test_rpc_session.c): rpc driven without a socket or an
 * engine. Frames go in through zd_rpc_frame; what comes out is a reply built by rpc (Hello, a
 * refusal) or an engine request (zd_req_t) taken by the submit callback of zd_rpc_t. Engine
 * results (zd_resp_t) made up by a test come back out through zd_rpc_result as reply frames,
 * which are checked to carry a length prefix that frames them exactly.
 */
#ifndef ZD_RPC_TEST_H
#define ZD_RPC_TEST_H

#include "rpc/rpc.h"
#include "rpc/rpc_check.h"
#include "zd_test.h"
#include "zs/frame.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef Zerod__Ipc__V1__Frame frame_t;

#define MAX_TRACKED 64

/* One rpc and one session (connection 7) per test; what a test makes is freed at teardown. */
static zd_rpc_t rpc;
static zd_rpc_session_t *sess;
static zd_req_t *reqs[MAX_TRACKED]; /* submitted requests, in order */
static int n_reqs;
static zd_reply_t *replies[MAX_TRACKED]; /* freed at teardown */
static int n_replies;
static frame_t *unpacked[MAX_TRACKED]; /* freed at teardown */
static int n_unpacked;
static char why[ZS_MSG_MAX];
static zd_fdq_t fdq; /* descriptors "received" on the connection, closed at teardown */

static inline void capture_req(void *arg, zd_req_t *req)
{
    (void)arg;
    cr_assert_lt(n_reqs, MAX_TRACKED);
    reqs[n_reqs++] = req;
}

static inline void rpct_setup(void)
{
    rpc = (zd_rpc_t){.device = "cpu (test)",
                     .socket_path = "/run/zerod/test.sock",
                     .peer_deadline_ms = 4321,
                     .submit = capture_req};
    sess = zd_rpc_session_create(7);
    cr_assert_not_null(sess);
    n_reqs = n_replies = n_unpacked = 0;
    fdq.n = 0;
}

static inline void rpct_teardown(void)
{
    for (int i = 0; i < n_reqs; i++) {
        zd_req_free(reqs[i]);
    }
    for (int i = 0; i < n_replies; i++) {
        zd_reply_free(replies[i]);
    }
    for (int i = 0; i < n_unpacked; i++) {
        zerod__ipc__v1__frame__free_unpacked(unpacked[i], NULL);
    }
    zd_rpc_session_destroy(sess);
    zd_fdq_close(&fdq);
}

/* A directory descriptor, as if it came with the next frame (SCM_RIGHTS). */
static inline int queue_dir_fd(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    cr_assert_geq(fd, 0, "open %s", path);
    cr_assert_lt(fdq.n, ZD_FDQ_MAX);
    fdq.fd[fdq.n++] = fd;
    return fd;
}

/* ---- frames in ------------------------------------------------------------------------------ */

/* A frame with body `body` (every member of the body union is a pointer to its message). */
static inline frame_t frame_of(uint64_t seq, Zerod__Ipc__V1__Frame__BodyCase body_case, void *body)
{
    frame_t f = ZEROD__IPC__V1__FRAME__INIT;

    f.seq = seq;
    f.body_case = body_case;
    f.hello = body;
    return f;
}

static inline zd_reply_t *track_reply(zd_reply_t *reply)
{
    cr_assert_lt(n_replies, MAX_TRACKED);
    replies[n_replies++] = reply;
    return reply;
}

typedef struct outcome {
    zs_status_t st;
    zd_reply_t *reply;
    bool submitted;
    bool close;
} outcome_t;

static inline outcome_t send_payload(zd_rpc_session_t *s, const uint8_t *payload, size_t len)
{
    outcome_t o;

    why[0] = '\0';
    o.st = zd_rpc_frame(&rpc, s, payload, len, &fdq, &o.reply, &o.submitted, &o.close, why,
                        sizeof(why));
    track_reply(o.reply);
    return o;
}

static inline outcome_t send_frame(zd_rpc_session_t *s, const frame_t *f)
{
    size_t len = zerod__ipc__v1__frame__get_packed_size(f);
    uint8_t *buf = malloc(len ? len : 1);
    outcome_t o;

    cr_assert_not_null(buf);
    zerod__ipc__v1__frame__pack(f, buf);
    o = send_payload(s, buf, len);
    free(buf);
    return o;
}

/* A frame that is answered or queued, neither refused nor closing. */
static inline outcome_t send_ok(zd_rpc_session_t *s, const frame_t *f)
{
    outcome_t o = send_frame(s, f);

    cr_assert_eq(o.st, ZS_OK, "frame %s refused: %s (%s)", zd_rpc_body_name(f->body_case),
                 zs_status_string(o.st), why);
    cr_assert(!o.close);
    return o;
}

/* The request the last accepted frame became. */
static inline zd_req_t *queued(const outcome_t *o, zd_req_kind_t kind, uint64_t seq)
{
    zd_req_t *req;

    cr_assert(o->submitted, "the frame was not handed to the engine");
    cr_assert_null(o->reply, "a frame handed to the engine got a reply too");
    cr_assert_gt(n_reqs, 0);
    req = reqs[n_reqs - 1];
    cr_assert_eq(req->kind, kind);
    cr_assert_eq(req->conn_id, 7);
    cr_assert_eq(req->seq, seq);
    return req;
}

static inline void hello(zd_rpc_session_t *s, Zerod__Ipc__V1__Role role)
{
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    frame_t f = frame_of(1, ZEROD__IPC__V1__FRAME__BODY_HELLO, &h);
    outcome_t o;

    h.protocol = ZD_IPC_PROTOCOL;
    h.version = (char *)"test";
    h.role = role;
    o = send_ok(s, &f);
    cr_assert_not_null(o.reply);
    cr_assert(!o.submitted);
}

/* ---- replies out ---------------------------------------------------------------------------- */

/* The frame of a reply: a length prefix that frames exactly the reply's bytes, then a Frame of
 * the expected body and seq. */
static inline frame_t *reply_frame(const zd_reply_t *reply,
                                   Zerod__Ipc__V1__Frame__BodyCase body_case, uint64_t seq)
{
    size_t frame_len = 0, need = 0;
    char err[128];
    frame_t *f;

    cr_assert_not_null(reply, "no reply");
    cr_assert_eq(zs_frame_parse(reply->buf, reply->len, &frame_len, &need, err, sizeof(err)), ZS_OK,
                 "%s", err);
    cr_assert_eq(frame_len, reply->len, "the length prefix says %zu bytes, the reply has %zu",
                 frame_len, reply->len);
    f = zerod__ipc__v1__frame__unpack(NULL, reply->len - ZS_FRAME_HEADER,
                                      reply->buf + ZS_FRAME_HEADER);
    cr_assert_not_null(f, "the reply is not a Frame");
    cr_assert_lt(n_unpacked, MAX_TRACKED);
    unpacked[n_unpacked++] = f;
    cr_assert_eq(f->body_case, body_case, "reply is %s, expected %s",
                 zd_rpc_body_name(f->body_case), zd_rpc_body_name(body_case));
    cr_assert_eq(f->seq, seq);
    return f;
}

static inline void expect_result(const Zerod__Ipc__V1__Result *r, zs_status_t st,
                                 const char *needle)
{
    cr_assert_not_null(r);
    cr_assert_eq((int)r->status, (int)st, "status %d, expected %s", (int)r->status,
                 zs_status_name(st));
    if (needle != NULL) {
        cr_assert(strstr(r->message, needle) != NULL, "'%s' not in: %s", needle, r->message);
    }
}

/* A frame refused with an ErrorReply, closing the connection. */
static inline void expect_closed(const outcome_t *o, uint64_t seq, zs_status_t st,
                                 const char *needle)
{
    frame_t *f;

    cr_assert_eq(o->st, st, "%s, expected %s (%s)", zs_status_name(o->st), zs_status_name(st), why);
    cr_assert(o->close, "the connection is kept");
    cr_assert(!o->submitted);
    cr_assert_eq(n_reqs, 0);
    f = reply_frame(o->reply, ZEROD__IPC__V1__FRAME__BODY_ERROR, seq);
    expect_result(f->error->result, st, needle);
}

static inline zd_resp_t *resp_of(zd_req_kind_t kind, uint64_t seq, zs_status_t st, const char *msg)
{
    zd_resp_t *r = calloc(1, sizeof(*r));

    cr_assert_not_null(r);
    r->kind = kind;
    r->conn_id = 7;
    r->seq = seq;
    r->status = st;
    snprintf(r->msg, sizeof(r->msg), "%s", msg != NULL ? msg : "");
    return r;
}

/* The session's job was attached with n_slots slots. */
static inline void attached(zd_rpc_session_t *s, uint32_t n_slots)
{
    zd_resp_t *r = resp_of(ZD_REQ_ATTACH, 2, ZS_OK, NULL);

    r->u.attach.n_slots = n_slots;
    reply_frame(track_reply(zd_rpc_result(s, r)), ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY, 2);
}

#endif
