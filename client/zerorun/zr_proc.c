/*
 * zerorun's processes: spawning, reaping, trainer output prefixing, daemon readiness and the
 * bounded stop sequence (SIGTERM, grace period, SIGKILL, bounded wait).
 *
 * Every child runs in a process group of its own (so a terminal's Ctrl-C reaches zerorun only,
 * which stops trainers before daemons) and dies with zerorun (PR_SET_PDEATHSIG). When a child
 * exits, what it left in its process group is killed before the child is reaped, while the
 * zombie still holds the group id. Signals and child exits arrive on one signalfd.
 */
#define _GNU_SOURCE
#include "zr_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t zr_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *zr_signal_name(int sig)
{
    switch (sig) {
    case SIGINT:
        return "SIGINT";
    case SIGTERM:
        return "SIGTERM";
    case SIGHUP:
        return "SIGHUP";
    default:
        return "signal";
    }
}

void zr_describe_status(int wstatus, char *buf, size_t len)
{
    if (WIFEXITED(wstatus)) {
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(wstatus));
    } else if (WIFSIGNALED(wstatus)) {
        snprintf(buf, len, "killed by signal %d (%s)%s", WTERMSIG(wstatus),
                 strsignal(WTERMSIG(wstatus)), WCOREDUMP(wstatus) ? ", core dumped" : "");
    } else {
        snprintf(buf, len, "ended with wait status 0x%x", (unsigned)wstatus);
    }
}

pid_t zr_spawn(zr_run_t *r, char *const argv[], int out_fd, int err_fd, const zr_env_t *env,
               size_t n_env, int death_sig)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    int null_fd;

    if (pid != 0) {
        if (pid > 0) {
            (void)setpgid(pid, pid); /* also done by the child: whoever runs first */
        }
        return pid;
    }
    /* child: single-threaded parent, so setenv() and stdio are safe here */
    (void)setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, death_sig) != 0 || getppid() != parent) {
        _exit(127);
    }
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &r->old_mask, NULL);
    null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
        dup2(err_fd, STDERR_FILENO) < 0) {
        _exit(127);
    }
    for (size_t k = 0; k < n_env; k++) {
        if (setenv(env[k].name, env[k].value, 1) != 0) {
            _exit(127);
        }
    }
    execvp(argv[0], argv);
    dprintf(STDERR_FILENO, "zerorun: cannot execute '%s': %s\n", argv[0], strerror(errno));
    _exit(127);
}

static zr_child_t *zr_find(zr_run_t *r, pid_t pid)
{
    for (int i = 0; i < r->nproc; i++) {
        if (r->trainers[i].pid == pid) {
            return &r->trainers[i];
        }
        if (r->daemons != NULL && r->daemons[i].pid == pid) {
            return &r->daemons[i];
        }
    }
    return NULL;
}

static void zr_reap(zr_run_t *r)
{
    for (;;) {
        siginfo_t si;
        zr_child_t *c;
        int ws;

        memset(&si, 0, sizeof(si));
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == 0) {
            return;
        }
        /* The zombie still owns its process-group id: kill what it left behind in it. */
        (void)kill(-si.si_pid, SIGKILL);
        if (waitpid(si.si_pid, &ws, 0) != si.si_pid) {
            return;
        }
        c = zr_find(r, si.si_pid);
        if (c != NULL) {
            c->running = false;
            c->wstatus = ws;
        }
    }
}

void zr_handle_signals(zr_run_t *r)
{
    struct signalfd_siginfo si;

    while (read(r->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGCHLD) {
            continue;
        }
        if (r->stop_signal == 0) {
            r->stop_signal = (int)si.ssi_signo;
            fprintf(stderr, "zerorun: %s received; stopping the job\n",
                    zr_signal_name((int)si.ssi_signo));
        } else if (!r->force) {
            r->force = true;
            fprintf(stderr, "zerorun: %s received again; killing the job\n",
                    zr_signal_name((int)si.ssi_signo));
        }
    }
    zr_reap(r); /* SIGCHLDs coalesce: always look */
}

void zr_events(zr_run_t *r, int timeout_ms)
{
    struct pollfd pfd = {.fd = r->sfd, .events = POLLIN};

    if (poll(&pfd, 1, timeout_ms) > 0) {
        zr_handle_signals(r);
    }
}

void zr_log_tail(const char *path, int max_lines)
{
    char buf[4096];
    struct stat st;
    ssize_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    char *p, *line;
    int lines = 0;

    if (fd >= 0 && fstat(fd, &st) == 0) {
        off_t off = st.st_size > (off_t)sizeof(buf) - 1 ? st.st_size - (off_t)sizeof(buf) + 1 : 0;
        n = pread(fd, buf, sizeof(buf) - 1, off);
    }
    if (fd >= 0) {
        close(fd);
    }
    if (n < 0) {
        n = 0;
    }
    while (n > 0 && buf[n - 1] == '\n') {
        n--;
    }
    buf[n] = '\0';
    if (n == 0) {
        fprintf(stderr, "    (empty)\n");
        return;
    }
    for (p = buf + n; p > buf; p--) {
        if (p[-1] == '\n' && ++lines == max_lines) {
            break;
        }
    }
    for (line = strtok(p, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        fprintf(stderr, "    %s\n", line);
    }
}

/* ---- daemons --------------------------------------------------------------------------- */

int zr_daemon_start(zr_run_t *r, int i, const char *zerod, const char *token_path)
{
    zr_child_t *d = &r->daemons[i];
    char device[32];
    char *argv[] = {(char *)zerod,  "--device",         device, "--socket", d->socket_path,
                    "--token-file", (char *)token_path, NULL};
    int fd;

    snprintf(device, sizeof(device), "%s:%d", r->device, i);
    fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "zerorun: cannot create '%s': %s\n", d->log_path, strerror(errno));
        return -1;
    }
    d->pid = zr_spawn(r, argv, fd, fd, NULL, 0, SIGTERM);
    close(fd);
    if (d->pid < 0) {
        fprintf(stderr, "zerorun: cannot start zerod for rank %d: fork: %s\n", i, strerror(errno));
        d->pid = 0;
        return -1;
    }
    d->running = true;
    return 0;
}

/* Has the daemon printed its readiness line ("READY <socket>") into its log? */
static bool zr_log_has_ready(const char *path)
{
    FILE *f = fopen(path, "re");
    char *line = NULL;
    size_t cap = 0;
    bool ready = false;

    if (f == NULL) {
        return false;
    }
    while (!ready && getline(&line, &cap, f) > 0) {
        ready = strncmp(line, "READY ", 6) == 0;
    }
    free(line);
    fclose(f);
    return ready;
}

static void zr_daemon_report(zr_child_t *d, const char *what)
{
    d->reported = true;
    fprintf(stderr, "zerorun: zerod for rank %d (pid %d) %s; last lines of %s:\n", d->rank,
            (int)d->pid, what, d->log_path);
    zr_log_tail(d->log_path, 15);
}

int zr_daemons_wait_ready(zr_run_t *r)
{
    int64_t deadline = zr_now_ms() + (int64_t)(r->timeout_s * 1000.0);
    char what[128];

    for (;;) {
        bool all = true;
        int64_t now;

        for (int i = 0; i < r->nproc; i++) {
            zr_child_t *d = &r->daemons[i];
            if (!d->ready) {
                d->ready = zr_log_has_ready(d->log_path);
                all = all && d->ready;
            }
        }
        if (all) {
            return ZR_EXIT_OK;
        }
        if (r->stop_signal != 0) {
            return 128 + r->stop_signal;
        }
        for (int i = 0; i < r->nproc; i++) {
            zr_child_t *d = &r->daemons[i];
            if (!d->ready && !d->running) {
                char how[96];
                zr_describe_status(d->wstatus, how, sizeof(how));
                snprintf(what, sizeof(what), "%s before it was ready", how);
                zr_daemon_report(d, what);
                return ZR_EXIT_FAIL;
            }
        }
        now = zr_now_ms();
        if (now >= deadline) {
            for (int i = 0; i < r->nproc; i++) {
                if (!r->daemons[i].ready) {
                    snprintf(what, sizeof(what), "was not ready within %g s (--timeout)",
                             r->timeout_s);
                    zr_daemon_report(&r->daemons[i], what);
                }
            }
            return ZR_EXIT_FAIL;
        }
        zr_events(r, (int)(deadline - now < 50 ? deadline - now : 50));
    }
}

/* Wait until no daemon runs or the deadline passes; a second signal turns to SIGKILL. */
static void zr_daemons_wait(zr_run_t *r, int64_t deadline, bool killed)
{
    for (;;) {
        bool any = false;
        int64_t now = zr_now_ms();

        for (int i = 0; i < r->nproc; i++) {
            any = any || r->daemons[i].running;
        }
        if (!any || now >= deadline) {
            return;
        }
        if (r->force && !killed) {
            for (int i = 0; i < r->nproc; i++) {
                if (r->daemons[i].running) {
                    kill(r->daemons[i].pid, SIGKILL);
                }
            }
            killed = true;
        }
        zr_events(r, (int)(deadline - now < 100 ? deadline - now : 100));
    }
}

int zr_daemons_stop(zr_run_t *r)
{
    bool stopped[ZR_MAX_NPROC] = {false};
    int rc = ZR_EXIT_OK;
    char how[96], what[160];

    if (r->daemons == NULL) {
        return ZR_EXIT_OK;
    }
    /* Reap what already ended: a daemon that died on its own (kill -9 while the job ran) is
     * reported as what it was, not as something that happened after our SIGTERM. */
    zr_events(r, 0);
    for (int i = 0; i < r->nproc; i++) {
        zr_child_t *d = &r->daemons[i];
        if (!d->running && d->pid > 0 && d->ready && !d->reported) {
            zr_describe_status(d->wstatus, how, sizeof(how));
            snprintf(what, sizeof(what), "%s while the job ran", how);
            zr_daemon_report(d, what);
            rc = ZR_EXIT_FAIL;
        }
    }
    for (int i = 0; i < r->nproc; i++) {
        if (r->daemons[i].running) {
            kill(r->daemons[i].pid, r->force ? SIGKILL : SIGTERM);
            stopped[i] = r->daemons[i].ready; /* one that never was is reported already */
        }
    }
    zr_daemons_wait(r, zr_now_ms() + ZR_DAEMON_STOP_MS, r->force);
    for (int i = 0; i < r->nproc; i++) {
        if (r->daemons[i].running) {
            zr_daemon_report(&r->daemons[i], "did not stop within 10 s of SIGTERM; killing it");
            kill(r->daemons[i].pid, SIGKILL);
            rc = ZR_EXIT_FAIL;
        }
    }
    zr_daemons_wait(r, zr_now_ms() + ZR_KILL_WAIT_MS, true);
    for (int i = 0; i < r->nproc; i++) {
        zr_child_t *d = &r->daemons[i];
        if (d->running) {
            fprintf(stderr, "zerorun: zerod for rank %d (pid %d) did not exit after SIGKILL\n", i,
                    (int)d->pid);
            rc = ZR_EXIT_FAIL;
        } else if (stopped[i] && !r->force && !d->reported &&
                   !(WIFEXITED(d->wstatus) && WEXITSTATUS(d->wstatus) == 0)) {
            zr_describe_status(d->wstatus, how, sizeof(how));
            if (WIFSIGNALED(d->wstatus) && WTERMSIG(d->wstatus) != SIGTERM) {
                /* not our doing (we sent SIGTERM): say what it was, nothing more */
                snprintf(what, sizeof(what), "%s", how);
            } else {
                snprintf(what, sizeof(what), "%s after SIGTERM", how);
            }
            zr_daemon_report(d, what);
            rc = ZR_EXIT_FAIL;
        }
    }
    return rc;
}

/* ---- trainers -------------------------------------------------------------------------- */

static void zr_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return; /* our reader is gone (EPIPE): drop the output, keep the job */
        }
        p += w;
        n -= (size_t)w;
    }
}

static void zr_stream_emit(const zr_stream_t *s, int rank, const char *p, size_t n)
{
    char line[ZR_LINE_MAX + 32];
    int k = snprintf(line, 32, "[rank %d] ", rank);

    memcpy(line + k, p, n);
    line[(size_t)k + n] = '\n';
    zr_write_all(s->out_fd, line, (size_t)k + n + 1);
}

static void zr_stream_close(zr_stream_t *s, int rank)
{
    if (s->fd < 0) {
        return;
    }
    if (s->len > 0) {
        zr_stream_emit(s, rank, s->buf, s->len); /* a last line without '\n' */
        s->len = 0;
    }
    close(s->fd);
    s->fd = -1;
}

/* One read (poll is level-triggered: a busy pipe cannot starve the others). */
static void zr_stream_read(zr_stream_t *s, int rank)
{
    ssize_t got = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
    size_t start = 0;
    char *nl;

    if (got < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (got <= 0) {
        zr_stream_close(s, rank);
        return;
    }
    s->len += (size_t)got;
    while ((nl = memchr(s->buf + start, '\n', s->len - start)) != NULL) {
        zr_stream_emit(s, rank, s->buf + start, (size_t)(nl - (s->buf + start)));
        start = (size_t)(nl - s->buf) + 1;
    }
    if (start == 0 && s->len == sizeof(s->buf)) {
        zr_stream_emit(s, rank, s->buf, s->len); /* overlong line: cut it */
        s->len = 0;
    } else {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

int zr_trainer_start(zr_run_t *r, int i, char *const argv[], const zr_env_t *env, size_t n_env)
{
    zr_child_t *t = &r->trainers[i];
    int po[2], pe[2];

    if (pipe2(po, O_CLOEXEC) != 0) {
        fprintf(stderr, "zerorun: cannot start rank %d: pipe: %s\n", i, strerror(errno));
        return -1;
    }
    if (pipe2(pe, O_CLOEXEC) != 0) {
        fprintf(stderr, "zerorun: cannot start rank %d: pipe: %s\n", i, strerror(errno));
        close(po[0]);
        close(po[1]);
        return -1;
    }
    t->pid = zr_spawn(r, argv, po[1], pe[1], env, n_env, SIGKILL);
    close(po[1]);
    close(pe[1]);
    if (t->pid < 0) {
        fprintf(stderr, "zerorun: cannot start rank %d: fork: %s\n", i, strerror(errno));
        t->pid = 0;
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    (void)fcntl(po[0], F_SETFL, O_NONBLOCK);
    (void)fcntl(pe[0], F_SETFL, O_NONBLOCK);
    t->running = true;
    t->out.fd = po[0];
    t->out.out_fd = STDOUT_FILENO;
    t->err.fd = pe[0];
    t->err.out_fd = STDERR_FILENO;
    return 0;
}

static void zr_trainers_signal(zr_run_t *r, int sig)
{
    for (int i = 0; i < r->nproc; i++) {
        if (r->trainers[i].running) {
            (void)kill(-r->trainers[i].pid, sig); /* its process group */
        }
    }
}

/* The first trainer failure, daemon exit or signal: 0 if none, else the job's exit status. */
static int zr_first_failure(zr_run_t *r)
{
    char how[96];

    for (int i = 0; i < r->nproc; i++) {
        const zr_child_t *t = &r->trainers[i];
        if (t->pid > 0 && !t->running && !(WIFEXITED(t->wstatus) && WEXITSTATUS(t->wstatus) == 0)) {
            zr_describe_status(t->wstatus, how, sizeof(how));
            fprintf(stderr, "zerorun: rank %d %s\n", i, how);
            return ZR_EXIT_FAIL;
        }
    }
    for (int i = 0; r->daemons != NULL && i < r->nproc; i++) {
        if (!r->daemons[i].running && !r->daemons[i].reported) {
            char what[128];
            zr_describe_status(r->daemons[i].wstatus, how, sizeof(how));
            snprintf(what, sizeof(what), "%s while the job ran", how);
            zr_daemon_report(&r->daemons[i], what);
            return ZR_EXIT_FAIL;
        }
    }
    return r->stop_signal != 0 ? 128 + r->stop_signal : 0;
}

/* Poll the signalfd and every open trainer pipe and serve them. */
static void zr_poll(zr_run_t *r, int timeout_ms)
{
    struct pollfd *pfd = r->pfd;
    zr_stream_t **streams = r->streams;
    int *ranks = r->ranks;
    int n = 0;

    pfd[n++] = (struct pollfd){.fd = r->sfd, .events = POLLIN};
    for (int i = 0; i < r->nproc; i++) {
        zr_stream_t *two[2] = {&r->trainers[i].out, &r->trainers[i].err};
        for (int k = 0; k < 2; k++) {
            if (two[k]->fd >= 0) {
                streams[n] = two[k];
                ranks[n] = i;
                pfd[n++] = (struct pollfd){.fd = two[k]->fd, .events = POLLIN};
            }
        }
    }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0) {
        return;
    }
    for (int k = 1; k < n; k++) {
        if (pfd[k].revents != 0) {
            zr_stream_read(streams[k], ranks[k]);
        }
    }
    if (pfd[0].revents != 0) {
        zr_handle_signals(r);
    }
}

static int zr_min_timeout(int timeout, int64_t deadline, int64_t now)
{
    int64_t left;

    if (deadline < 0) {
        return timeout;
    }
    left = deadline > now ? deadline - now : 0;
    return (timeout < 0 || left < timeout) ? (int)left : timeout;
}

/* The grace after SIGTERM is over, or a second signal came: SIGKILL every trainer left, naming
 * each (unless the user forced it with that signal). */
static void zr_trainers_kill(zr_run_t *r)
{
    for (int i = 0; i < r->nproc && !r->force; i++) {
        if (r->trainers[i].running) {
            fprintf(stderr,
                    "zerorun: rank %d (pid %d) still runs %d s after SIGTERM; "
                    "killing it\n",
                    i, (int)r->trainers[i].pid, ZR_GRACE_MS / 1000);
        }
    }
    zr_trainers_signal(r, SIGKILL);
}

/* The trainers still running ZR_KILL_WAIT_MS after SIGKILL, named on stderr. */
static void zr_trainers_report_unkilled(const zr_run_t *r)
{
    for (int i = 0; i < r->nproc; i++) {
        if (r->trainers[i].running) {
            fprintf(stderr, "zerorun: rank %d (pid %d) did not exit after SIGKILL\n", i,
                    (int)r->trainers[i].pid);
        }
    }
}

int zr_trainers_supervise(zr_run_t *r, int started)
{
    int rc = ZR_EXIT_OK;
    bool stopping = false, killed = false;
    int64_t kill_at = -1, give_up_at = -1, drain = -1;

    if (started < r->nproc) { /* a start failed (reported) or a signal came first */
        rc = r->stop_signal != 0 ? 128 + r->stop_signal : ZR_EXIT_FAIL;
        stopping = true;
        kill_at = zr_now_ms() + ZR_GRACE_MS;
        zr_trainers_signal(r, SIGTERM);
    }
    for (;;) {
        int live = 0, open = 0, timeout = -1;
        int64_t now = zr_now_ms();

        for (int i = 0; i < r->nproc; i++) {
            live += r->trainers[i].running ? 1 : 0;
            open += (r->trainers[i].out.fd >= 0) + (r->trainers[i].err.fd >= 0);
        }
        if (live == 0) {
            drain = drain < 0 ? now + ZR_DRAIN_MS : drain;
            timeout = zr_min_timeout(timeout, drain, now);
            if (open == 0 || timeout == 0) {
                break; /* all read, or something outlived its trainer and holds a pipe */
            }
        }
        timeout = zr_min_timeout(timeout, kill_at, now);
        timeout = zr_min_timeout(timeout, give_up_at, now);
        zr_poll(r, timeout);
        if (!stopping && (rc = zr_first_failure(r)) != 0) {
            stopping = true;
            zr_trainers_signal(r, SIGTERM);
            kill_at = zr_now_ms() + ZR_GRACE_MS;
        }
        now = zr_now_ms();
        if (stopping && !killed && (r->force || (kill_at >= 0 && now >= kill_at))) {
            zr_trainers_kill(r);
            killed = true;
            kill_at = -1;
            give_up_at = now + ZR_KILL_WAIT_MS;
        }
        if (give_up_at >= 0 && now >= give_up_at && live > 0) {
            zr_trainers_report_unkilled(r);
            rc = ZR_EXIT_FAIL;
            break;
        }
    }
    for (int i = 0; i < r->nproc; i++) {
        zr_stream_close(&r->trainers[i].out, i);
        zr_stream_close(&r->trainers[i].err, i);
    }
    return rc;
}
