/*
 * bench_util: what the benchmark programs of bench/ share: option errors, a median of doubles,
 * whole-buffer pipe I/O, a free loopback port, the load average, a private temp directory and a
 * token file, forked children that report through pipes, and the zerod processes they start
 * (fork + exec with stdout and stderr to a log file, ready once its `READY <socket>` line is in
 * the log, stopped with SIGTERM, then SIGKILL after a bounded wait) and their /metrics. The clock
 * is zs_time_now_s() (zs/time.h).
 *
 * Errors are printed here, once, prefixed with the program's name (`prog`).
 */
#ifndef ZB_BENCH_UTIL_H
#define ZB_BENCH_UTIL_H

#include "zs/time.h"

#include <stddef.h>
#include <sys/types.h>

#define ZB_ZEROD_READY_S 10.0 /* start: the READY line within this */
#define ZB_ZEROD_STOP_S  30.0 /* stop: exit after SIGTERM within this, else SIGKILL */

/* Sorts v[0..n) ascending. */
void zb_sort(double *v, unsigned n);

/* Sorts v[0..n) and returns its median (n >= 1). */
double zb_median(double *v, unsigned n);

/* Bandwidth of one memcpy of `bytes` in this process: the median of `reps` (at most
 * ZB_MAX_REPS) copies after a warm-up, GB/s = bytes / t (GB = 1e9 B); 0 when out of memory. */
#define ZB_MAX_REPS 64u
double zb_memcpy_gbps(const char *prog, size_t bytes, unsigned reps);

/* The default case of a getopt_long loop: "Try 'prog --help'." on stderr; returns 2 (usage). */
int zb_usage_error(const char *prog);

/* After the getopt_long loop: 2 after "prog: unexpected argument 'x'" on stderr when an operand
 * is left, else 0. */
int zb_no_operands(const char *prog, int argc, char *const argv[]);

/* An integer option value in lo..hi into *out: 0, or -1 after printing
 * "prog: --opt 'arg' is not in lo..hi". */
int zb_parse_uint(const char *prog, const char *opt, const char *arg, unsigned lo, unsigned hi,
                  unsigned *out);

/* A comma-separated list of sizes in MiB, each in 1..1024, at most `max` of them, into
 * sizes[]: their count, or 0 after printing what is wrong (prog: --sizes: ...). arg is
 * modified (strtok_r). */
unsigned zb_parse_sizes(const char *prog, char *arg, unsigned *sizes, unsigned max);

/* All of len bytes, retrying on EINTR: 0, or -1 on an error or end of file. */
int zb_write_all(int fd, const void *buf, size_t len);
int zb_read_all(int fd, void *buf, size_t len);

/* A TCP port on 127.0.0.1 that was free a moment ago, or -1. */
int zb_free_port(void);

/* The first line of /proc/loadavg, or "?". */
void zb_loadavg(char *buf, size_t len);

/* *zerod_p NULL: <dir of /proc/self/exe>/../daemon/zerod. Either way it must be executable;
 * -1 with a message naming --zerod otherwise. */
int zb_zerod_locate(const char *prog, const char **zerod_p);

/* mkdtemp of /tmp/<prog>.XXXXXX into dir. */
int zb_tmpdir_create(const char *prog, char *dir, size_t len);

/* A 64-hex-digit random token in a new file of mode 0600: <dir>/token, or with dir NULL a
 * mkstemp file /tmp/<prog>.token.XXXXXX. Its path goes to path. */
int zb_token_create(const char *prog, const char *dir, char *path, size_t len);

/* Forks child r of a group that reports to the parent through pipes. Parent: returns the pid,
 * fds[r] is the read end. Child: returns 0, *out_fd_p is the write end, fds[0..r) closed.
 * -1 on an error. */
pid_t zb_child_fork(const char *prog, int fds[], unsigned r, int *out_fd_p);

/* Closes each fds[i] >= 0 and reaps each pids[i] > 0, sending SIGTERM first when `failed`.
 * Returns 1 when failed or a child did not exit 0; the first such child is named as
 * "<what> <i>" unless failed was set already (what NULL: never). */
int zb_children_reap(const char *prog, const char *what, const pid_t pids[], const int fds[],
                     unsigned n, int failed);

/* Prints the last `lines` lines of a log file to stderr. */
void zb_log_tail(const char *prog, const char *path, unsigned lines);

/* One zerod process; the caller sets prog, name, sock, log and tail_lines. */
typedef struct zb_zerod {
    const char *prog;    /* prefix of messages: "step_bench" */
    char name[16];       /* in messages: "zerod", "zerod 1" */
    char sock[128];      /* its --socket */
    char log[128];       /* its stdout and stderr */
    unsigned tail_lines; /* of the log, printed on a failure */
    pid_t pid;           /* 0: not running */
} zb_zerod_t;

/* Runs `zerod --socket <sock> args...` (args NULL-terminated) and returns once its READY line
 * is in the log. On a failure the process is gone and its log tail printed. */
int zb_zerod_start(zb_zerod_t *z, const char *zerod, const char *const args[]);

/* SIGTERM, then SIGKILL after ZB_ZEROD_STOP_S; -1 unless it exited 0 (the log tail printed).
 * Removes the socket and the log either way. */
int zb_zerod_stop(zb_zerod_t *z);

/* GET /metrics from z's metrics socket (metrics_listen auto: its socket's name with
 * ".metrics.sock" for ".sock") into buf, NUL-terminated: the body only. -1 when it cannot be
 * read; nothing printed. */
int zb_zerod_metrics(const zb_zerod_t *z, char *buf, size_t cap);

/* In a /metrics body, the value of the first sample of `name` whose labels hold `label`
 * (`phase="adam"`); 0 when there is none. */
double zb_metric(const char *text, const char *name, const char *label);

#endif
