/*
 * live_fuzz: random and mutated frames from many concurrent connections against a running
 * zerod (issue "nothing a client can do can kill or wedge zerod"; docs/design-notes.md "bad
 * frame").
 *
 * Each thread opens connection after connection until the duration is over. A connection is a
 * plan drawn from its own 64-bit seed: valid frames of every request (Hello with each role,
 * Attach with random layouts, configs and job ids, ParamsReady, BucketReady, Step, Detach,
 * Status, ShardInfo, and reply types a client must not send), mutated (bit flips, truncation,
 * wrong lengths from 0 to 4 GiB, garbage, unknown fields, duplicates), and sent with a
 * behaviour: read every reply, pipeline and close at once, close mid-frame, never read, read
 * one byte at a time, drip the bytes, stall inside a frame (frame_timeout must cut it), attach
 * and scribble over the shared regions it receives, pass fds to the daemon, send frames of
 * megabytes; one connection in 25 also shuts its read side. Every run also quotes odd strings
 * (newlines, escapes, not UTF-8) as job ids and versions, and sends frames that straddle
 * writes while each arrives within frame_timeout. A prober thread asks for Status all along.
 *
 * Failures (exit 1): the daemon is unreachable, sends an undecodable or oversized frame, lets a
 * stalled frame live past frame_timeout + 5 s, cuts a frame that was not late, takes no bytes
 * for 10 s, leaves a Status probe unanswered for 10 s, or hands out a memfd that can be
 * resized; and this program leaking an fd of its own. The run is reproducible per connection:
 * the seed is printed, ZEROD_FUZZ_SEED (or --seed) replays a run, and --conn SEED replays one
 * connection with a trace of its ops. --hold, --vanish and --flood are single exercises for
 * the scripts (warm-ups, flood.sh); --help lists them.
 *
 *   zd_live_fuzz --socket PATH [--seconds N] [--threads N] [--seed S] [--frame-timeout-ms MS]
 */
#define _GNU_SOURCE
#include "live_fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- one connection ------------------------------------------------------------------- */

typedef enum lf_behaviour {
    LF_B_NORMAL,      /* lockstep: each frame, then its reply */
    LF_B_PIPELINE,    /* everything, then the replies */
    LF_B_CLOSE_WRITE, /* everything, then close without reading */
    LF_B_CLOSE_MID,   /* close in the middle of a frame */
    LF_B_NO_READ,     /* hundreds of requests, never a read, close after a pause */
    LF_B_SLOW_READ,   /* everything, then the replies a few bytes at a time */
    LF_B_DRIP,        /* the bytes a few at a time */
    LF_B_STALL,       /* inside a frame, then nothing: frame_timeout must cut it */
    LF_B_TRAINER,     /* attach, receive the regions, scribble, step, vanish mid-step */
    LF_B_PASS_FDS,    /* SCM_RIGHTS fds sent to the daemon with the frames */
    LF_B_BIG,         /* one frame of megabytes (up to the 16 MiB limit and just over) */
    LF_N_BEHAVIOURS
} lf_behaviour_t;
_Static_assert(LF_N_BEHAVIOURS <= sizeof(((lf_stats_t *)0)->beh_count) / sizeof(atomic_ullong),
               "lf_stats_t counts every behaviour");

static const char *const lf_behaviour_name[LF_N_BEHAVIOURS] = {
    "normal", "pipeline", "close-after-write", "close-mid-frame", "no-read", "slow-read",
    "drip",   "stall",    "trainer",           "pass-fds",        "big"};

/* The frames of a connection: a hello (usually), then random requests, some mutated.
 * Returns how many frames it appended. */
static unsigned lf_plan_frames(lf_gen_t *gn, lf_buf_t *b, unsigned n_frames, uint64_t *seq,
                               unsigned mutate_pct)
{
    uint64_t *r = gn->rng;
    unsigned n = n_frames;

    if (lf_chance(r, 90)) {
        n++;
        lf_kind_t k = (lf_kind_t)(LF_HELLO_TRAINER + lf_below(r, 2));
        if (lf_chance(r, 10)) {
            k = LF_HELLO_ODD;
        }
        lf_gen_frame(gn, k, ++*seq, b);
        atomic_fetch_add(&lf_g.st.frames_sent, 1);
    }
    for (unsigned i = 0; i < n_frames; i++) {
        size_t off = b->len;
        lf_kind_t k = (lf_kind_t)lf_below(r, LF_N_KINDS);

        lf_gen_frame(gn, k, ++*seq, b);
        atomic_fetch_add(&lf_g.st.frames_sent, 1);
        if (lf_chance(r, mutate_pct) && lf_mutate(r, b, off)) {
            atomic_fetch_add(&lf_g.st.frames_mutated, 1);
            if (lf_g.trace) {
                printf("     mutated: now %zu bytes, header says %u\n", b->len - off,
                       b->len - off >= 4 ? rf_get_le32(b->p + off) : 0);
            }
        }
    }
    return n;
}

/* Send b frame by frame (lockstep) with a short wait for each reply. */
static void lf_send_lockstep(lf_conn_t *c, const lf_buf_t *b)
{
    size_t off = 0;

    while (off < b->len && !c->dead) {
        size_t n = b->len - off;

        if (n >= 4) {
            uint32_t flen = rf_get_le32(b->p + off);
            if ((size_t)flen + 4 < n) {
                n = (size_t)flen + 4;
            }
        }
        if (!lf_conn_write(c, b->p + off, n, NULL, 0)) {
            return;
        }
        off += n;
        lf_conn_read(c, 1, 150, 1u << 16, 0);
    }
}

static void lf_trainer(lf_conn_t *c, lf_gen_t *gn, uint64_t *r, uint64_t *seq)
{
    /* mostly one job, so that trainers meet it lingering and resume it */
    const lf_job_t *j = &lf_jobs[lf_chance(r, 60) ? 0 : lf_below(r, LF_N_JOBS)];
    lf_buf_t b = {0};
    unsigned steps = 1 + lf_below(r, 4);

    lf_buf_hello(&b, ++*seq, 1, "live_fuzz");
    lf_buf_attach(&b, ++*seq, j->id, j, j->config);
    atomic_fetch_add(&lf_g.st.frames_sent, 2);
    lf_send_lockstep(c, &b);
    if (c->n_fds > 0 && lf_chance(r, 50)) {
        lf_conn_scribble(c, r);
    }
    for (unsigned s = 0; s < steps && !c->dead; s++) {
        unsigned n_frames = 1;

        b.len = 0;
        if (s == 0) {
            lf_gen_frame(gn, LF_PARAMS_READY, ++*seq, &b);
            n_frames++;
        }
        for (unsigned k = lf_below(r, 5); k > 0; k--, n_frames++) {
            size_t off = b.len;
            lf_gen_frame(gn, LF_BUCKET_READY, ++*seq, &b);
            if (lf_chance(r, 5) && lf_mutate(r, &b, off)) {
                atomic_fetch_add(&lf_g.st.frames_mutated, 1);
            }
            atomic_fetch_add(&lf_g.st.frames_sent, 1);
        }
        if (lf_chance(r, 15)) { /* die in the middle of the step */
            lf_conn_write(c, b.p, b.len, NULL, 0);
            atomic_fetch_add(&lf_g.st.frames_sent, 1);
            break;
        }
        lf_gen_frame(gn, LF_STEP, ++*seq, &b);
        atomic_fetch_add(&lf_g.st.frames_sent, 1);
        if (lf_chance(r, 50)) {
            lf_send_lockstep(c, &b);
        } else {
            lf_conn_write(c, b.p, b.len, NULL, 0);
            lf_conn_read(c, n_frames, 1000, 1u << 16, 0);
        }
        if (c->n_fds > 0 && lf_chance(r, 20)) {
            lf_conn_scribble(c, r);
        }
    }
    if (lf_chance(r, 40) && !c->dead) {
        b.len = 0;
        lf_gen_frame(gn, LF_DETACH, ++*seq, &b);
        atomic_fetch_add(&lf_g.st.frames_sent, 1);
        lf_send_lockstep(c, &b);
    }
    free(b.p);
}

/* One frame of megabytes: a long Step.group_lr, a huge Attach, or a header over the limit. */
static void lf_big(lf_conn_t *c, uint64_t *r, uint64_t *seq)
{
    static const size_t sizes[] = {1u << 20, 4u << 20, LF_MAX_FRAME - 16};
    lf_frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Hello h = ZEROD__IPC__V1__HELLO__INIT;
    Zerod__Ipc__V1__Step sp = ZEROD__IPC__V1__STEP__INIT;
    lf_buf_t b = {0};
    size_t target = sizes[lf_below(r, 3)], last = 0;
    double *lr = NULL;
    char *ver = NULL;
    bool over = lf_chance(r, 25);

    h.protocol = 1;
    h.role = ZEROD__IPC__V1__ROLE__ROLE_TRAINER;
    pthread_mutex_lock(&lf_g.big_lock);
    if (lf_chance(r, 50)) { /* Step with ~target/8 learning rates (packed doubles) */
        h.version = (char *)"live_fuzz";
        f.seq = ++*seq;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
        f.hello = &h;
        lf_buf_frame(&b, &f);
        sp.n_group_lr = target / 8 - 2;
        lr = calloc(sp.n_group_lr, sizeof(double));
        sp.group_lr = lr;
        last = b.len;
        f.seq = ++*seq;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP;
        f.step = &sp;
        lf_buf_frame(&b, &f);
    } else { /* a Hello whose version string is megabytes long */
        ver = malloc(target);
        memset(ver, 'v', target - 1);
        ver[target - 1] = '\0';
        h.version = ver;
        f.seq = ++*seq;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
        f.hello = &h;
        lf_buf_frame(&b, &f);
    }
    if (over) { /* the big frame's header one byte over ZS_MAX_FRAME */
        rf_put_le32(b.p + last, LF_MAX_FRAME + 1);
    }
    atomic_fetch_add(&lf_g.st.frames_sent, lr != NULL ? 2 : 1);
    atomic_fetch_add(&lf_g.st.big_frames, 1);
    if (lf_conn_write(c, b.p, b.len, NULL, 0)) {
        lf_conn_read(c, lr != NULL ? 2 : 1, 2000, 1u << 16, 0);
    }
    pthread_mutex_unlock(&lf_g.big_lock);
    free(lr);
    free(ver);
    free(b.p);
}

/* Weights in per mille: stalls cost frame_timeout and big frames tens of milliseconds each,
 * so they are rarer; trainers reach the deepest states. */
static unsigned lf_behaviour_mask = (1u << LF_N_BEHAVIOURS) - 1; /* --behaviours */

static lf_behaviour_t lf_pick_behaviour(uint64_t *r)
{
    static const unsigned weight[LF_N_BEHAVIOURS] = {150, 140, 100, 80, 60, 60,
                                                     60,  25,  250, 60, 15};
    unsigned total = 0, x;

    for (unsigned b = 0; b < LF_N_BEHAVIOURS; b++) {
        total += (lf_behaviour_mask >> b & 1u) ? weight[b] : 0;
    }
    x = lf_below(r, total);
    for (unsigned b = 0; b < LF_N_BEHAVIOURS; b++) {
        unsigned w = (lf_behaviour_mask >> b & 1u) ? weight[b] : 0;
        if (x < w) {
            return (lf_behaviour_t)b;
        }
        x -= w;
    }
    return LF_B_NORMAL;
}

/* "normal,stall": the behaviours a run may pick; false on an unknown name. */
static bool lf_parse_behaviours(const char *list)
{
    char buf[256], *save = NULL;
    unsigned mask = 0;

    snprintf(buf, sizeof(buf), "%s", list);
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
        unsigned b = 0;

        while (b < LF_N_BEHAVIOURS && strcmp(t, lf_behaviour_name[b]) != 0) {
            b++;
        }
        if (b == LF_N_BEHAVIOURS) {
            fprintf(stderr, "zd_live_fuzz: unknown behaviour '%s'\n", t);
            return false;
        }
        mask |= 1u << b;
    }
    if (mask == 0) {
        return false;
    }
    lf_behaviour_mask = mask;
    return true;
}

static void lf_run_connection(uint64_t seed)
{
    uint64_t rng = seed, seq = 0;
    lf_behaviour_t beh;
    lf_conn_t c = {.fd = -1, .seed = seed};
    lf_gen_t *gn = calloc(1, sizeof(*gn));
    lf_buf_t b = {0};
    uint64_t t0 = lf_now_ms();
    unsigned n;
    int tries = 0;

    gn->rng = &rng;
    beh = lf_pick_behaviour(&rng);
    if (lf_g.trace) {
        printf("connection 0x%016" PRIx64 ": %s\n", seed, lf_behaviour_name[beh]);
    }
    while ((c.fd = lf_connect()) < 0) {
        if (++tries > 50) { /* 5 s of refusals: the daemon is gone */
            lf_fatal(seed, "cannot connect to %s: %s", lf_g.socket, strerror(errno));
            free(gn);
            return;
        }
        lf_sleep_ms(100);
    }
    atomic_fetch_add(&lf_g.st.connections, 1);
    if (lf_chance(&rng, 4)) { /* every reply (and region fd) meets EPIPE, without an EOF */
        shutdown(c.fd, SHUT_RD);
    }

    switch (beh) {
    case LF_B_NORMAL:
        lf_plan_frames(gn, &b, 1 + lf_below(&rng, 12), &seq, 15);
        lf_send_lockstep(&c, &b);
        break;
    case LF_B_PIPELINE:
        n = lf_plan_frames(gn, &b, 1 + lf_below(&rng, 20), &seq, 25);
        if (lf_conn_write(&c, b.p, b.len, NULL, 0)) {
            lf_conn_read(&c, n, 1000, 1u << 16, 0);
        }
        break;
    case LF_B_CLOSE_WRITE:
        lf_plan_frames(gn, &b, 1 + lf_below(&rng, 20), &seq, 20);
        lf_conn_write(&c, b.p, b.len, NULL, 0);
        break;
    case LF_B_CLOSE_MID:
        lf_plan_frames(gn, &b, 1 + lf_below(&rng, 6), &seq, 10);
        lf_conn_write(&c, b.p, b.len - (b.len > 5 ? 1 + lf_below(&rng, 4) : 0), NULL, 0);
        break;
    case LF_B_NO_READ: {
        unsigned reps = 100 + lf_below(&rng, 2000);
        lf_kind_t k = lf_chance(&rng, 50) ? LF_STATUS : LF_SHARD_INFO;

        lf_gen_frame(gn, LF_HELLO_CONTROL, ++seq, &b);
        for (unsigned i = 0; i < reps; i++) {
            lf_gen_frame(gn, lf_chance(&rng, 90) ? k : LF_STEP, ++seq, &b);
        }
        atomic_fetch_add(&lf_g.st.frames_sent, reps + 1);
        lf_conn_write(&c, b.p, b.len, NULL, 0);
        lf_sleep_ms(lf_below(&rng, 300));
        break;
    }
    case LF_B_SLOW_READ:
        n = lf_plan_frames(gn, &b, 1 + lf_below(&rng, 8), &seq, 10);
        if (lf_conn_write(&c, b.p, b.len, NULL, 0)) {
            lf_conn_read(&c, n, 1000, 1 + lf_below(&rng, 16), 1);
        }
        break;
    case LF_B_DRIP: {
        size_t off = 0;

        n = lf_plan_frames(gn, &b, 1 + lf_below(&rng, 6), &seq, 10);
        /* a few bytes at a time, well within frame_timeout in all */
        while (off < b.len && !c.dead) {
            size_t n = 1 + lf_below(&rng, 7);
            n = n < b.len - off ? n : b.len - off;
            if (!lf_conn_write(&c, b.p + off, n, NULL, 0)) {
                break;
            }
            off += n;
            lf_sleep_ms(lf_below(&rng, 3));
            lf_conn_read(&c, 0, 0, 1u << 16, 0);
            if (off > 600) {
                break;
            }
        }
        lf_conn_read(&c, n, 1000, 1u << 16, 0);
        break;
    }
    case LF_B_STALL: {
        size_t cut;

        if (lf_chance(&rng, 70)) {
            lf_gen_frame(gn, (lf_kind_t)(LF_HELLO_TRAINER + lf_below(&rng, 2)), ++seq, &b);
        }
        cut = b.len;
        lf_gen_frame(gn, (lf_kind_t)(LF_ATTACH + lf_below(&rng, 8)), ++seq, &b);
        if (lf_chance(&rng, 20)) {
            rf_put_le32(b.p + cut, LF_MAX_FRAME); /* a header promising 16 MiB */
        }
        b.len = cut + 1 + lf_below(&rng, (uint32_t)(b.len - cut - 1)); /* never all of it */
        atomic_fetch_add(&lf_g.st.frames_sent, 1);
        if (lf_conn_write(&c, b.p, b.len, NULL, 0)) {
            lf_conn_expect_cut(&c);
        }
        break;
    }
    case LF_B_TRAINER:
        lf_trainer(&c, gn, &rng, &seq);
        break;
    case LF_B_PASS_FDS: {
        int pass[3] = {open("/dev/null", O_RDONLY | O_CLOEXEC), -1, -1};
        int pp[2];

        if (pipe2(pp, O_CLOEXEC) == 0) {
            pass[1] = pp[0];
            pass[2] = pp[1];
        }
        n = lf_plan_frames(gn, &b, 1 + lf_below(&rng, 6), &seq, 10);
        if (pass[0] >= 0 && pass[1] >= 0) {
            /* the fds ride on the first byte; the daemon must not keep them */
            lf_conn_write(&c, b.p, b.len, pass, 3);
        }
        lf_conn_read(&c, n, 1000, 1u << 16, 0);
        for (int i = 0; i < 3; i++) {
            if (pass[i] >= 0) {
                close(pass[i]);
            }
        }
        break;
    }
    default:
        lf_big(&c, &rng, &seq);
        break;
    }
    if (c.eof || c.dead) {
        atomic_fetch_add(&lf_g.st.daemon_closed, 1);
    }
    atomic_fetch_add(&lf_g.st.beh_count[beh], 1);
    lf_max(&lf_g.st.beh_max_ms[beh], lf_now_ms() - t0);
    if (lf_chance(&rng, 30)) { /* the regions outlive the connection a little */
        close(c.fd);
        lf_sleep_ms(lf_below(&rng, 20));
        lf_conn_drop_fds(&c);
    } else {
        lf_conn_drop_fds(&c);
        close(c.fd);
    }
    free(c.rx.p);
    free(b.p);
    free(gn);
}

/* Every run, whatever its seed: each odd string (newlines, escapes, not UTF-8, format
 * directives) as the job id of an Attach and as the version of a refused Hello, the two places
 * the daemon quotes a client's string in its log. */
static void lf_odd_probe(unsigned index, unsigned n_threads)
{
    for (unsigned i = index; i < LF_N_ODD; i += n_threads) {
        for (int which = 0; which < 2; which++) {
            lf_conn_t c = {.fd = lf_connect(), .seed = i};
            lf_buf_t b = {0};

            if (c.fd < 0) {
                lf_fatal(0, "cannot connect to %s: %s", lf_g.socket, strerror(errno));
                return;
            }
            atomic_fetch_add(&lf_g.st.connections, 1);
            lf_buf_hello(&b, 1, which == 0 ? 1 : 2, which == 0 ? "live_fuzz" : lf_odd_strings[i]);
            if (which == 0) {
                lf_buf_attach(&b, 2, lf_odd_strings[i], &lf_jobs[0], NULL);
            }
            atomic_fetch_add(&lf_g.st.frames_sent, which == 0 ? 2 : 1);
            if (lf_conn_write(&c, b.p, b.len, NULL, 0)) {
                lf_conn_read(&c, which == 0 ? 2 : 1, 2000, 1u << 16, 0);
            }
            lf_conn_drop_fds(&c);
            close(c.fd);
            free(c.rx.p);
            free(b.p);
        }
    }
}

/* Every run: frames that each arrive whole within frame_timeout of their first byte, but
 * straddle the writes (the rest of one frame and the start of the next in one write), so that
 * the daemon's buffer is never empty. No frame is late: the daemon must answer all of them. */
static void lf_straddle_probe(void)
{
    enum { N = 5 };
    lf_conn_t c = {.fd = lf_connect(), .seed = 0};
    lf_gen_t *gn = calloc(1, sizeof(*gn));
    uint64_t rng = 7, seq = 0;
    size_t start[N + 2];
    lf_buf_t b = {0};
    uint64_t wrote_ms, late_ms = 0; /* the longest a frame took to arrive, as sent */
    size_t off;

    if (c.fd < 0 || gn == NULL) {
        lf_fatal(0, "straddle probe: cannot connect to %s: %s", lf_g.socket, strerror(errno));
        free(gn);
        return;
    }
    atomic_fetch_add(&lf_g.st.connections, 1);
    gn->rng = &rng;
    start[0] = 0;
    lf_gen_frame(gn, LF_HELLO_CONTROL, ++seq, &b);
    for (int i = 1; i <= N; i++) {
        start[i] = b.len;
        lf_gen_frame(gn, LF_STATUS, ++seq, &b);
    }
    start[N + 1] = b.len;
    atomic_fetch_add(&lf_g.st.frames_sent, N + 1);
    off = start[1] + 2; /* the hello and 2 bytes of the first Status */
    lf_conn_write(&c, b.p, off, NULL, 0);
    wrote_ms = lf_now_ms();
    for (int i = 1; i <= N && !c.dead; i++) {
        size_t end = i < N ? start[i + 1] + 2 : b.len;
        uint64_t before;

        lf_sleep_ms(lf_g.frame_timeout_ms * 6 / 10);
        before = lf_now_ms();
        lf_conn_write(&c, b.p + off, end - off, NULL, 0);
        late_ms = before - wrote_ms > late_ms ? before - wrote_ms : late_ms;
        wrote_ms = lf_now_ms();
        off = end;
        lf_conn_read(&c, 0, 0, 1u << 16, 0);
    }
    lf_conn_read(&c, N + 1, 2000, 1u << 16, 0);
    if (late_ms >= lf_g.frame_timeout_ms) {
        /* this process was descheduled past the deadline: the daemon was right to cut */
        fprintf(stderr,
                "live_fuzz: straddle probe not judged: a frame took %llu ms to send, "
                "frame_timeout is %u ms\n",
                (unsigned long long)late_ms, lf_g.frame_timeout_ms);
    } else if (c.replies != N + 1 || c.errors != 0) {
        lf_fail(0,
                "straddle probe: %u of %d replies (%u ErrorReply): the daemon cut a connection "
                "whose every frame arrived within frame_timeout (%u ms) of its first byte",
                c.replies, N + 1, c.errors, lf_g.frame_timeout_ms);
    }
    lf_conn_drop_fds(&c);
    close(c.fd);
    free(c.rx.p);
    free(b.p);
    free(gn);
}

/* --hold N: N connections open at once, each with its HelloReply, then all closed. A
 * warm-up takes the daemon past the most connections a run holds at a time, so that what
 * grows with that high-water mark (libuv's table of watched fds) is in the baseline. */
static int lf_hold(unsigned n)
{
    lf_conn_t *cs = calloc(n, sizeof(*cs));
    lf_gen_t *gn = calloc(1, sizeof(*gn));
    uint64_t rng = 3, seq = 0;
    lf_buf_t b = {0};
    unsigned ok = 0;

    if (cs == NULL || gn == NULL) {
        free(cs);
        free(gn);
        return 1;
    }
    gn->rng = &rng;
    lf_gen_frame(gn, LF_HELLO_CONTROL, ++seq, &b);
    for (unsigned i = 0; i < n; i++) {
        cs[i].fd = lf_connect();
        if (cs[i].fd >= 0) {
            lf_conn_write(&cs[i], b.p, b.len, NULL, 0);
        }
    }
    for (unsigned i = 0; i < n; i++) {
        if (cs[i].fd >= 0) {
            lf_conn_read(&cs[i], 1, 5000, 1u << 16, 0);
            ok += cs[i].replies == 1;
        }
    }
    for (unsigned i = 0; i < n; i++) {
        if (cs[i].fd >= 0) {
            close(cs[i].fd);
        }
        free(cs[i].rx.p);
    }
    printf("live_fuzz: held %u connections at once, %u answered\n", n, ok);
    free(b.p);
    free(gn);
    free(cs);
    return ok == n ? 0 : 1;
}

/* Hello(trainer) + Attach of job fz-a, and the Detach that ends it, as raw frames in b. */
static void lf_vanish_frames(lf_buf_t *b, bool detach)
{
    lf_frame_t f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Detach dt = ZEROD__IPC__V1__DETACH__INIT;

    b->len = 0;
    lf_buf_hello(b, 1, 1, "live_fuzz");
    lf_buf_attach(b, 2, "live_fuzz_vanish", &lf_jobs[0], lf_jobs[0].config);
    if (detach) {
        dt.end_job = 1;
        f.seq = 3;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH;
        f.detach = &dt;
        lf_buf_frame(b, &f);
    }
}

/* --vanish N: N times a trainer shuts its socket for reading and attaches, so that the
 * daemon's sendmsg of the AttachReply and its regions fails with EPIPE (the path a trainer
 * killed at that moment takes; its first-time costs belong in a warm-up); then a trainer
 * re-attaches the job and ends it. Needs a daemon without a job. */
static int lf_vanish(unsigned n)
{
    lf_buf_t b = {0};
    unsigned ended = 0;

    for (unsigned i = 0; i < n; i++) {
        lf_conn_t c = {.fd = lf_connect()};

        if (c.fd < 0) {
            break;
        }
        lf_vanish_frames(&b, false);
        lf_conn_write(&c, b.p, rf_get_le32(b.p) + 4, NULL, 0); /* the Hello */
        lf_conn_read(&c, 1, 5000, 1u << 16, 0);
        shutdown(c.fd, SHUT_RD);
        lf_conn_write(&c, b.p + rf_get_le32(b.p) + 4, b.len - rf_get_le32(b.p) - 4, NULL, 0);
        lf_sleep_ms(50);
        close(c.fd);
        free(c.rx.p);
        for (int tries = 0; tries < 100; tries++) { /* until the daemon let it go */
            lf_conn_t e = {.fd = lf_connect()};
            bool busy;

            if (e.fd < 0) {
                break;
            }
            lf_vanish_frames(&b, true);
            lf_conn_write(&e, b.p, b.len, NULL, 0);
            lf_conn_read(&e, 3, 5000, 1u << 16, 0);
            busy = e.replies < 3 || e.errors > 0;
            lf_conn_drop_fds(&e);
            close(e.fd);
            free(e.rx.p);
            if (!busy) {
                ended++;
                break;
            }
            lf_sleep_ms(20);
        }
    }
    printf("live_fuzz: %u trainers vanished after Attach, %u jobs ended\n", n, ended);
    free(b.p);
    return ended == n ? 0 : 1;
}

/* --flood MB: a control client that pipelines MB megabytes of Status requests and never
 * reads a reply, then holds the connection for 2 s before closing it. Each 9-byte request
 * asks for a reply of a few hundred bytes: what the daemon keeps for a client that does not
 * read must be bounded (flood.sh samples its RSS meanwhile). Writes that stall for 5 s end
 * the flood early: that is the daemon pushing back, which is fine. */
static int lf_flood(unsigned mb)
{
    lf_conn_t c = {.fd = lf_connect()};
    lf_gen_t *gn = calloc(1, sizeof(*gn));
    uint64_t rng = 5, seq = 0, want = (uint64_t)mb << 20, sent = 0, t0 = lf_now_ms();
    lf_buf_t b = {0};

    if (c.fd < 0 || gn == NULL) {
        fprintf(stderr, "zd_live_fuzz: cannot connect to %s: %s\n", lf_g.socket, strerror(errno));
        free(gn);
        return 1;
    }
    gn->rng = &rng;
    lf_gen_frame(gn, LF_HELLO_CONTROL, ++seq, &b);
    lf_conn_write(&c, b.p, b.len, NULL, 0);
    b.len = 0;
    while (b.len < (64u << 10)) {
        lf_gen_frame(gn, LF_STATUS, ++seq, &b);
    }
    while (sent < want && !c.dead) {
        size_t off = (size_t)(sent % b.len); /* the buffer again and again, whole frames */
        ssize_t w = send(c.fd, b.p + off, b.len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        struct pollfd p = {c.fd, POLLOUT, 0};

        if (w > 0) {
            sent += (uint64_t)w;
            t0 = lf_now_ms();
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            break; /* the daemon closed the connection: also a bound */
        }
        if (lf_now_ms() - t0 > 5000) {
            break; /* the daemon stopped reading: back-pressure */
        }
        poll(&p, 1, 100);
    }
    printf("live_fuzz: flood: %llu bytes of Status requests sent (%llu wanted), no reply read\n",
           (unsigned long long)sent, (unsigned long long)want);
    fflush(stdout);
    lf_sleep_ms(2000);
    close(c.fd);
    free(c.rx.p);
    free(b.p);
    free(gn);
    return 0;
}

/* ---- threads -------------------------------------------------------------------------- */

typedef struct lf_thread {
    pthread_t tid;
    unsigned index, n_threads;
    uint64_t rng;
} lf_thread_t;

static void *lf_worker(void *arg)
{
    lf_thread_t *t = arg;

    lf_odd_probe(t->index, t->n_threads);
    if (t->index == 0) {
        lf_straddle_probe();
    }

    while (!atomic_load(&lf_g.stop) && lf_now_ms() < lf_g.deadline_ms) {
        uint64_t seed = lf_rand(&t->rng);

        lf_g.thread_conn[t->index] = seed;
        lf_run_connection(seed);
    }
    lf_g.thread_conn[t->index] = 0;
    return NULL;
}

/* Status on a control connection every 200 ms: the daemon answers within LF_WEDGE_MS. */
static void *lf_prober(void *arg)
{
    (void)arg;
    while (!atomic_load(&lf_g.stop) && lf_now_ms() < lf_g.deadline_ms) {
        lf_conn_t c = {.fd = -1, .seed = 0};
        lf_gen_t gn;
        uint64_t rng = 1, seq = 0, t0 = lf_now_ms();
        lf_buf_t b = {0};

        memset(&gn, 0, sizeof(gn));
        gn.rng = &rng;
        c.fd = lf_connect();
        if (c.fd < 0) {
            lf_fatal(0, "status probe: cannot connect to %s: %s", lf_g.socket, strerror(errno));
            break;
        }
        lf_gen_frame(&gn, LF_HELLO_CONTROL, ++seq, &b);
        lf_gen_frame(&gn, LF_STATUS, ++seq, &b);
        if (lf_conn_write(&c, b.p, b.len, NULL, 0)) {
            lf_conn_read(&c, 2, LF_WEDGE_MS, 1u << 16, 0);
        }
        if (c.replies < 2) {
            lf_fatal(0, "status probe: %u of 2 replies after %llu ms (limit %d ms), %s%s%s%s",
                     c.replies, (unsigned long long)(lf_now_ms() - t0), LF_WEDGE_MS,
                     c.eof ? "then the daemon closed the connection" : "daemon wedged?",
                     c.errors > 0 ? " (its ErrorReply: '" : "", c.errors > 0 ? c.last_error : "",
                     c.errors > 0 ? "')" : "");
        }
        atomic_fetch_add(&lf_g.st.probes, 1);
        lf_max(&lf_g.st.probe_max_ms, lf_now_ms() - t0);
        lf_conn_drop_fds(&c);
        close(c.fd);
        free(c.rx.p);
        free(b.p);
        lf_sleep_ms(200);
    }
    return NULL;
}

static int lf_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n - 1; /* the directory's own fd */
}

static bool lf_parse_u64(const char *s, uint64_t *v_p)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-') {
        return false;
    }
    *v_p = v;
    return true;
}

static void lf_usage(FILE *out)
{
    fprintf(out,
            "Usage: zd_live_fuzz --socket PATH [OPTIONS]\n"
            "Random and mutated frames from concurrent connections against a running zerod.\n"
            "\n"
            "  -s, --socket PATH         daemon socket (default $ZEROD_SOCKET)\n"
            "  -d, --seconds N           run for N seconds (default 10)\n"
            "  -t, --threads N           concurrent connections (default 8, at most %d)\n"
            "  -S, --seed S              run seed (default $ZEROD_FUZZ_SEED, else the clock)\n"
            "  -c, --conn SEED           replay one connection, printing its ops\n"
            "  -f, --frame-timeout-ms MS the daemon's frame_timeout (default 1000)\n"
            "  -H, --hold N              only hold N connections open at once, then close them\n"
            "  -V, --vanish N            only attach and vanish N times (a daemon without a job)\n"
            "  -F, --flood MB            only pipeline MB MiB of Status requests, never reading\n"
            "  -b, --behaviours LIST     only these (comma-separated): normal, pipeline,\n"
            "                            close-after-write, close-mid-frame, no-read, slow-read,\n"
            "                            drip, stall, trainer, pass-fds, big\n"
            "  -h, --help                print this help and exit\n"
            "\n"
            "Exit status: 0 the daemon survived, 1 a failure (printed), 2 usage.\n",
            LF_MAX_THREADS);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {{"socket", required_argument, NULL, 's'},
                                             {"seconds", required_argument, NULL, 'd'},
                                             {"threads", required_argument, NULL, 't'},
                                             {"seed", required_argument, NULL, 'S'},
                                             {"conn", required_argument, NULL, 'c'},
                                             {"frame-timeout-ms", required_argument, NULL, 'f'},
                                             {"behaviours", required_argument, NULL, 'b'},
                                             {"hold", required_argument, NULL, 'H'},
                                             {"vanish", required_argument, NULL, 'V'},
                                             {"flood", required_argument, NULL, 'F'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    static lf_thread_t threads[LF_MAX_THREADS];
    uint64_t seed = 0, seconds = 10, n_threads = 8, conn = 0, ft = 1000, hold = 0, vanish = 0,
             flood = 0;
    uint64_t t0;
    bool have_seed = false, have_conn = false;
    const char *env = getenv("ZEROD_FUZZ_SEED");
    pthread_t prober;
    int fds0, fds1, opt;
    lf_stats_t *s = &lf_g.st;

    lf_g.socket = getenv("ZEROD_SOCKET");
    if (env != NULL && env[0] != '\0') {
        if (!lf_parse_u64(env, &seed)) {
            fprintf(stderr, "zd_live_fuzz: ZEROD_FUZZ_SEED '%s' is not a number\n", env);
            return 2;
        }
        have_seed = true;
    }
    while ((opt = getopt_long(argc, argv, "s:d:t:S:c:f:b:H:V:F:h", longopts, NULL)) != -1) {
        bool ok = true;

        switch (opt) {
        case 's':
            lf_g.socket = optarg;
            break;
        case 'd':
            ok = lf_parse_u64(optarg, &seconds) && seconds > 0;
            break;
        case 't':
            ok = lf_parse_u64(optarg, &n_threads) && n_threads > 0 && n_threads <= LF_MAX_THREADS;
            break;
        case 'S':
            ok = have_seed = lf_parse_u64(optarg, &seed);
            break;
        case 'c':
            ok = have_conn = lf_parse_u64(optarg, &conn);
            break;
        case 'f':
            ok = lf_parse_u64(optarg, &ft) && ft > 0 && ft < 600000;
            break;
        case 'b':
            ok = lf_parse_behaviours(optarg);
            break;
        case 'H':
            ok = lf_parse_u64(optarg, &hold) && hold > 0 && hold <= 1000;
            break;
        case 'V':
            ok = lf_parse_u64(optarg, &vanish) && vanish > 0 && vanish <= 1000;
            break;
        case 'F':
            ok = lf_parse_u64(optarg, &flood) && flood > 0 && flood <= 4096;
            break;
        case 'h':
            lf_usage(stdout);
            return 0;
        default:
            lf_usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "zd_live_fuzz: bad value '%s' for option -%c\n", optarg, opt);
            return 2;
        }
    }
    if (lf_g.socket == NULL || lf_g.socket[0] == '\0' || optind != argc) {
        fprintf(stderr, "zd_live_fuzz: %s\n",
                optind != argc ? "unexpected argument" : "no socket: give --socket PATH");
        return 2;
    }
    lf_g.frame_timeout_ms = (unsigned)ft;
    fds0 = lf_count_fds();
    t0 = lf_now_ms();

    if (hold > 0) {
        return lf_hold((unsigned)hold);
    }
    if (vanish > 0) {
        return lf_vanish((unsigned)vanish);
    }
    if (flood > 0) {
        return lf_flood((unsigned)flood);
    }
    if (have_conn) {
        lf_g.trace = true;
        lf_g.deadline_ms = UINT64_MAX;
        lf_run_connection(conn);
    } else {
        if (!have_seed) {
            seed = lf_now_ms() ^ ((uint64_t)getpid() << 32);
        }
        printf("live_fuzz: seed 0x%016" PRIx64 " (replay: ZEROD_FUZZ_SEED=0x%016" PRIx64
               "), %u threads, %u s, frame_timeout %u ms\n",
               seed, seed, (unsigned)n_threads, (unsigned)seconds, lf_g.frame_timeout_ms);
        fflush(stdout);
        lf_g.deadline_ms = t0 + seconds * 1000u;
        for (unsigned i = 0; i < n_threads; i++) {
            uint64_t st = seed + i;

            threads[i].index = i;
            threads[i].n_threads = (unsigned)n_threads;
            threads[i].rng = lf_rand(&st);
            if (pthread_create(&threads[i].tid, NULL, lf_worker, &threads[i]) != 0) {
                fprintf(stderr, "zd_live_fuzz: pthread_create: %s\n", strerror(errno));
                return 1;
            }
        }
        if (pthread_create(&prober, NULL, lf_prober, NULL) != 0) {
            fprintf(stderr, "zd_live_fuzz: pthread_create: %s\n", strerror(errno));
            return 1;
        }
        /* a wedged worker is itself a finding: report what every thread was running */
        while (!atomic_load(&lf_g.stop) && lf_now_ms() < lf_g.deadline_ms + 30000u) {
            bool all_done = true;
            for (unsigned i = 0; i < n_threads; i++) {
                all_done = all_done && lf_g.thread_conn[i] == 0;
            }
            if (all_done && lf_now_ms() >= lf_g.deadline_ms) {
                break;
            }
            lf_sleep_ms(50);
        }
        if (atomic_load(&lf_g.stop) || lf_now_ms() >= lf_g.deadline_ms + 30000u) {
            for (unsigned i = 0; i < n_threads; i++) {
                if (lf_g.thread_conn[i] != 0) {
                    printf("live_fuzz: thread %u was running connection 0x%016" PRIx64
                           " (replay: --conn 0x%016" PRIx64 ")\n",
                           i, lf_g.thread_conn[i], lf_g.thread_conn[i]);
                }
            }
            if (!atomic_load(&lf_g.stop)) {
                lf_fatal(0, "workers still running 30 s after the deadline");
            }
            fflush(stdout);
        }
        for (unsigned i = 0; i < n_threads; i++) {
            pthread_join(threads[i].tid, NULL);
        }
        pthread_join(prober, NULL);
    }
    fds1 = lf_count_fds();
    printf("live_fuzz: %.1f s: connections %llu, bytes sent %llu, frames %llu (mutated "
           "%llu, %llu of megabytes), fds passed to the daemon %llu\n",
           (double)(lf_now_ms() - t0) / 1000.0, atomic_load(&s->connections),
           atomic_load(&s->bytes_sent), atomic_load(&s->frames_sent),
           atomic_load(&s->frames_mutated), atomic_load(&s->big_frames),
           atomic_load(&s->fds_passed));
    printf("live_fuzz: replies %llu (ErrorReply %llu), attaches %llu, steps %llu, fds received "
           "%llu, regions scribbled %llu, closed by the daemon %llu\n",
           atomic_load(&s->replies), atomic_load(&s->error_replies), atomic_load(&s->attached),
           atomic_load(&s->steps_ok), atomic_load(&s->fds_received), atomic_load(&s->scribbles),
           atomic_load(&s->daemon_closed));
    printf("live_fuzz: stalled frames cut %llu (slowest %llu ms, frame_timeout %u ms), status "
           "probes %llu (slowest %llu ms)\n",
           atomic_load(&s->stalls_cut), atomic_load(&s->stall_max_ms), lf_g.frame_timeout_ms,
           atomic_load(&s->probes), atomic_load(&s->probe_max_ms));
    printf("live_fuzz: behaviours (connections, slowest ms):");
    for (unsigned b = 0; b < LF_N_BEHAVIOURS; b++) {
        printf(" %s %llu/%llu", lf_behaviour_name[b], atomic_load(&s->beh_count[b]),
               atomic_load(&s->beh_max_ms[b]));
    }
    printf("\n");
    if (fds1 != fds0) {
        lf_fail(0, "live_fuzz itself holds %d fds, %d at the start: it leaked", fds1, fds0);
    }
    if (atomic_load(&lf_g.failed)) {
        int n = atomic_load(&lf_g.failed);

        for (int k = 0; k < n && k < 8; k++) {
            printf("live_fuzz: FAIL: %s\n", lf_g.fail_msg[k]);
        }
        if (n > 8) {
            printf("live_fuzz: FAIL: ... and %d more\n", n - 8);
        }
        return 1;
    }
    printf("live_fuzz: PASS\n");
    return 0;
}
