/* zerorun internals: the command line (zr_opts.c), the job's processes and their supervision
 * (zr_proc.c), shared with zerorun.c, which sets the job up and runs it. */
#ifndef ZEROD_ZERORUN_ZR_INT_H
#define ZEROD_ZERORUN_ZR_INT_H

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum {
    ZR_EXIT_OK = 0,
    ZR_EXIT_FAIL = 1,
    ZR_EXIT_USAGE = 2,
};

#define ZR_MAX_NPROC      1024
#define ZR_LINE_MAX       8192  /* longer trainer lines are cut into pieces of this size */
#define ZR_GRACE_MS       5000  /* trainers: SIGTERM, then SIGKILL after this */
#define ZR_DAEMON_STOP_MS 10000 /* daemons: SIGTERM, then SIGKILL after this */
#define ZR_KILL_WAIT_MS   2000  /* after SIGKILL, give up waiting after this */
#define ZR_DRAIN_MS       500   /* read what is left in the pipes after the last trainer exits */

#define ZR_ARRAY_SIZE(a)  (sizeof(a) / sizeof((a)[0]))

/* The command line's defaults (zr_opts.c; --help says them). */
#define ZR_DEFAULT_SOCKET_DIR "/run/zerod" /* of the daemons' sockets, without --spawn-daemons */
#define ZR_DEFAULT_TIMEOUT_S  30.0         /* --timeout */

/* The command line. */
typedef struct zr_opts {
    int nproc;
    bool spawn_daemons;
    bool keep_logs;
    const char *master_addr;
    const char *master_port; /* NULL: find a free one */
    const char *job;         /* NULL: zerorun-<pid>-<time> */
    const char *socket_dir;
    const char *daemon;
    const char *device; /* cpu, cuda or auto */
    double timeout_s;
    char **cmd;
} zr_opts_t;

/* argv into o (zr_opts.c). Returns -1 to go on, else the exit status: ZR_EXIT_OK after --help
 * or --version, ZR_EXIT_USAGE for a bad command line (reported on stderr). */
int zr_opts_parse(int argc, char **argv, zr_opts_t *o);

/* One variable set in a child's environment. */
typedef struct zr_env {
    const char *name;
    const char *value;
} zr_env_t;

/* One output pipe of a trainer, cut into lines that are written with a "[rank i] " prefix. */
typedef struct zr_stream {
    int fd;     /* read end; -1 when closed */
    int out_fd; /* STDOUT_FILENO or STDERR_FILENO */
    size_t len;
    char buf[ZR_LINE_MAX];
} zr_stream_t;

/* A child process: a trainer (with its pipes) or a daemon (with its log). */
typedef struct zr_child {
    int rank;
    pid_t pid;     /* 0 before the start */
    bool running;  /* started and not yet reaped */
    bool ready;    /* daemons: printed READY */
    bool reported; /* daemons: its end was already reported */
    int wstatus;   /* waitpid() status once reaped */
    zr_stream_t out, err;
    char *log_path;    /* daemons */
    char *socket_path; /* ZEROD_SOCKET of this rank */
} zr_child_t;

typedef struct zr_run {
    int nproc;
    const char *device; /* "cpu" or "cuda": rank i's daemon runs on <device>:<i> */
    int sfd;            /* signalfd for SIGCHLD, SIGINT, SIGTERM, SIGHUP */
    sigset_t old_mask;  /* restored in the children */
    int stop_signal;    /* first SIGINT/SIGTERM/SIGHUP received; 0 if none */
    bool force;         /* a second signal: SIGKILL at once */
    double timeout_s;   /* daemon readiness deadline */
    zr_child_t *trainers;
    zr_child_t *daemons; /* NULL without --spawn-daemons */
    struct pollfd *pfd;  /* 1 + 2 * nproc entries for the supervision loop */
    zr_stream_t **streams;
    int *ranks;
} zr_run_t;

int64_t zr_now_ms(void);

/* Describe a waitpid() status: "exited with code 3", "killed by signal 9 (Killed)". */
void zr_describe_status(int wstatus, char *buf, size_t len);

/* Fork and exec argv (PATH search) in a new process group, stdin from /dev/null, stdout and
 * stderr to out_fd and err_fd, with the n_env variables of env added to the environment.
 * The child gets death_sig when zerorun dies. Returns the pid, or -1 with errno set. */
pid_t zr_spawn(zr_run_t *r, char *const argv[], int out_fd, int err_fd, const zr_env_t *env,
               size_t n_env, int death_sig);

/* Wait (poll) up to timeout_ms for a signal or a child exit and process them: reaped children
 * get running = false and their wstatus. A timeout of -1 waits for the next event; 0 polls. */
void zr_events(zr_run_t *r, int timeout_ms);

/* Process what the signalfd holds (signals and child exits). */
void zr_handle_signals(zr_run_t *r);

/* Print the last lines of a daemon's log to stderr, indented. */
void zr_log_tail(const char *path, int max_lines);

/* Start rank i's daemon; 0 or -1 (reported). */
int zr_daemon_start(zr_run_t *r, int i, const char *zerod, const char *token_path);

/* Wait until every daemon printed READY; 0, ZR_EXIT_FAIL (reported), or 128+signal. */
int zr_daemons_wait_ready(zr_run_t *r);

/* SIGTERM every running daemon, SIGKILL after ZR_DAEMON_STOP_MS; 0 if all of them exited 0
 * after SIGTERM, else ZR_EXIT_FAIL (reported). */
int zr_daemons_stop(zr_run_t *r);

/* Start rank i's trainer with its pipes; 0 or -1 (reported). */
int zr_trainer_start(zr_run_t *r, int i, char *const argv[], const zr_env_t *env, size_t n_env);

/* Supervise the trainers until all of them exited; on the first failure, a daemon exit or a
 * signal, stop the others (SIGTERM, SIGKILL after ZR_GRACE_MS). Returns the exit status. */
int zr_trainers_supervise(zr_run_t *r, int started);

#endif
