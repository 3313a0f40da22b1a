/*
 * zd_live_fuzz (live_fuzz.c): the pieces its files share. live_fuzz_gen.c builds valid frames
 * of every message and mutates them; live_fuzz_conn.c is one client connection (writes that
 * never block for long, replies decoded and checked, fds received) and the run's state.
 */
#ifndef LF_LIVE_FUZZ_H
#define LF_LIVE_FUZZ_H

#include "raw_frame.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef Zerod__Ipc__V1__Frame lf_frame_t;

#define LF_MAX_FRAME    (16u << 20) /* ZS_MAX_FRAME */
#define LF_MAX_THREADS  64
#define LF_WEDGE_MS     10000 /* no progress for this long is a wedged daemon */
#define LF_STALL_SLACK  5000  /* a stalled frame must be cut within frame_timeout + this */
#define LF_MAX_FINDINGS 8

/* ---- random numbers (splitmix64) ------------------------------------------------------ */

static inline uint64_t lf_rand(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n); n > 0. */
static inline uint32_t lf_below(uint64_t *st, uint32_t n)
{
    return (uint32_t)(lf_rand(st) % n);
}

/* True with probability pct %. */
static inline bool lf_chance(uint64_t *st, uint32_t pct)
{
    return lf_below(st, 100) < pct;
}

/* ---- the run (live_fuzz_conn.c) ------------------------------------------------------- */

typedef struct lf_stats {
    atomic_ullong connections, bytes_sent, frames_sent, frames_mutated, replies, error_replies;
    atomic_ullong fds_received, fds_passed, stalls_cut, stall_max_ms, daemon_closed;
    atomic_ullong attached, steps_ok, scribbles, big_frames, probes, probe_max_ms;
    atomic_ullong beh_count[16], beh_max_ms[16];
} lf_stats_t;

typedef struct lf_state {
    const char *socket;
    unsigned frame_timeout_ms;
    uint64_t deadline_ms;
    bool trace; /* print every frame (--conn) */
    lf_stats_t st;
    atomic_int failed; /* findings so far */
    atomic_int stop;   /* the daemon is gone or wedged: no point going on */
    pthread_mutex_t fail_lock;
    char fail_msg[LF_MAX_FINDINGS][512];
    pthread_mutex_t big_lock;                     /* one frame of megabytes in flight at a time */
    _Atomic uint64_t thread_conn[LF_MAX_THREADS]; /* the connection each thread is running */
} lf_state_t;

extern lf_state_t lf_g;

uint64_t lf_now_ms(void);
void lf_sleep_ms(unsigned ms);
void lf_max(atomic_ullong *a, unsigned long long v);

/* A finding: the first LF_MAX_FINDINGS are kept for the report; the run goes on (more
 * findings, and the driver's checks of fds, memory and the log still mean something).
 * lf_fatal() also stops every thread at its next connection. */
void lf_fail(uint64_t conn_seed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define lf_fatal(...)                                                                              \
    do {                                                                                           \
        lf_fail(__VA_ARGS__);                                                                      \
        atomic_store(&lf_g.stop, 1);                                                               \
    } while (0)

/* ---- bytes and frames (live_fuzz_gen.c) ----------------------------------------------- */

typedef struct lf_buf {
    uint8_t *p;
    size_t len, cap;
} lf_buf_t;

void lf_buf_reserve(lf_buf_t *b, size_t more);
void lf_buf_put(lf_buf_t *b, const void *data, size_t n);
/* Length header + packed frame (raw_frame.h has the header's rf_put_le32 / rf_get_le32). */
void lf_buf_frame(lf_buf_t *b, const lf_frame_t *f);

/* Jobs a well-behaved trainer would attach (re-attach, resume, stage 1, accumulation, fp16,
 * bf16), so that the random traffic meets live jobs; then random ones. */
typedef struct lf_job {
    const char *id;
    uint64_t numel[4];
    size_t n;
    Zerod__Ipc__V1__DType dtype;
    const char *config;
} lf_job_t;

#define LF_N_JOBS 4
extern const lf_job_t lf_jobs[LF_N_JOBS];
/* A trainer's Hello (protocol, version) with seq, appended to b. */
void lf_buf_hello(lf_buf_t *b, uint64_t seq, uint32_t protocol, const char *version);
/* An Attach with seq, appended to b: job `id` (world 1) with j's params in one group, j's
 * dtype, and `config` (NULL: none). */
void lf_buf_attach(lf_buf_t *b, uint64_t seq, const char *id, const lf_job_t *j,
                   const char *config);
/* Strings with newlines, escapes, bytes that are not UTF-8, format directives. */
#define LF_N_ODD 7
extern const char *const lf_odd_strings[LF_N_ODD];

/* Strings a frame holds: built here, valid until the next lf_gen_frame of this generator. */
typedef struct lf_gen {
    uint64_t *rng;
    char job[5000];
    char text[3][2048];
    char version[64];
    uint64_t numel[3][64];
    Zerod__Ipc__V1__Group groups[3];
    Zerod__Ipc__V1__Group *pgroups[5000];
    double lr[8];
} lf_gen_t;

typedef enum lf_kind {
    LF_HELLO_TRAINER,
    LF_HELLO_CONTROL,
    LF_HELLO_ODD,
    LF_ATTACH,
    LF_PARAMS_READY,
    LF_BUCKET_READY,
    LF_STEP,
    LF_DETACH,
    LF_STATUS,
    LF_SHARD_INFO,
    LF_REPLY_TYPE,
    LF_EMPTY,
    LF_N_KINDS
} lf_kind_t;

/* One valid frame of `kind` (random content) appended to b. */
void lf_gen_frame(lf_gen_t *gn, lf_kind_t kind, uint64_t seq, lf_buf_t *b);
/* Mutates the frame at b->p[off..b->len); returns true when it changed it. */
bool lf_mutate(uint64_t *r, lf_buf_t *b, size_t off);

/* ---- one connection (live_fuzz_conn.c) ------------------------------------------------ */

typedef struct lf_conn {
    int fd;
    uint64_t seed;
    lf_buf_t rx;
    int fds[8]; /* regions of the last AttachReply */
    int n_fds;
    bool eof;
    bool dead; /* our writes fail: the daemon closed */
    unsigned replies, errors;
    char last_error[200]; /* the message of the last ErrorReply */
} lf_conn_t;

/* A non-blocking connection to lf_g.socket, or -1 with errno. */
int lf_connect(void);
void lf_conn_drop_fds(lf_conn_t *c);
/* One recvmsg of up to `max` bytes; keeps fds that come along (closing older ones). Returns
 * bytes read, 0 at EOF, -1 when nothing was there, -2 on a frame no daemon may send. */
ssize_t lf_conn_recv(lf_conn_t *c, size_t max);
/* Read until `want` more replies came, EOF, or ms passed (0: just what is there). Reads
 * `chunk` bytes at a time, sleeping `pause_ms` between reads. */
void lf_conn_read(lf_conn_t *c, unsigned want, unsigned ms, size_t chunk, unsigned pause_ms);
/* Write all of data (with fds on the first byte); false when the daemon is gone. A daemon
 * that does not take bytes for LF_WEDGE_MS is a failure. */
bool lf_conn_write(lf_conn_t *c, const uint8_t *data, size_t n, const int *pass, int n_pass);
/* A partial frame sent: the daemon must answer with an ErrorReply and close within
 * frame_timeout (plus slack for a loaded machine). */
void lf_conn_expect_cut(lf_conn_t *c);
/* Map the regions of the last AttachReply, try to resize them, write random bytes. */
void lf_conn_scribble(lf_conn_t *c, uint64_t *r);

#endif
