/* bench_util: see bench_util.h. */
#define _GNU_SOURCE
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define ZB_ZEROD_MAX_ARGS 32
#define ZB_POLL_US        10000

static int zb_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

void zb_sort(double *v, unsigned n)
{
    qsort(v, n, sizeof(double), zb_cmp_double);
}

double zb_median(double *v, unsigned n)
{
    zb_sort(v, n);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double zb_memcpy_gbps(const char *prog, size_t bytes, unsigned reps)
{
    char *a = NULL, *b = NULL;
    double t[ZB_MAX_REPS] = {0}, med;

    if (bytes == 0 || posix_memalign((void **)&a, 64, bytes) != 0) {
        return 0.0;
    }
    if (posix_memalign((void **)&b, 64, bytes) != 0) {
        free(a);
        return 0.0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    memcpy(b, a, bytes); /* warm-up */
    reps = reps == 0 ? 1 : reps > ZB_MAX_REPS ? ZB_MAX_REPS : reps;
    for (unsigned i = 0; i < reps; i++) {
        double t0 = zs_time_now_s();
        a[i % bytes] = (char)i; /* keep the copies from being folded */
        memcpy(b, a, bytes);
        t[i] = zs_time_now_s() - t0;
    }
    med = zb_median(t, reps);
    if (b[0] == 3) {
        fprintf(stderr, "%s: (impossible memcpy result)\n", prog);
    }
    free(a);
    free(b);
    return (double)bytes / med / 1e9;
}

int zb_usage_error(const char *prog)
{
    fprintf(stderr, "Try '%s --help'.\n", prog);
    return 2;
}

int zb_no_operands(const char *prog, int argc, char *const argv[])
{
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return 2;
    }
    return 0;
}

int zb_parse_uint(const char *prog, const char *opt, const char *arg, unsigned lo, unsigned hi,
                  unsigned *out)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);

    if (end == arg || *end != '\0' || v < (long)lo || v > (long)hi) {
        fprintf(stderr, "%s: --%s '%s' is not in %u..%u\n", prog, opt, arg, lo, hi);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

unsigned zb_parse_sizes(const char *prog, char *arg, unsigned *sizes, unsigned max)
{
    char *save = NULL;
    unsigned n = 0;

    for (char *tok = strtok_r(arg, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char *end = NULL;
        long v = strtol(tok, &end, 10);

        if (end == tok || *end != '\0' || v < 1 || v > 1024) {
            fprintf(stderr, "%s: --sizes: '%s' is not in 1..1024 MiB\n", prog, tok);
            return 0;
        }
        if (n == max) {
            fprintf(stderr, "%s: --sizes: more than %u sizes\n", prog, max);
            return 0;
        }
        sizes[n++] = (unsigned)v;
    }
    if (n == 0) {
        fprintf(stderr, "%s: --sizes is empty\n", prog);
    }
    return n;
}

int zb_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int zb_read_all(int fd, void *buf, size_t len)
{
    char *p = buf;

    while (len > 0) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int zb_free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

    if (fd < 0) {
        return -1;
    }
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0) {
        port = ntohs(a.sin_port);
    }
    close(fd);
    return port;
}

void zb_loadavg(char *buf, size_t len)
{
    FILE *f = fopen("/proc/loadavg", "re");

    snprintf(buf, len, "?");
    if (f != NULL) {
        if (fgets(buf, (int)len, f) != NULL) {
            buf[strcspn(buf, "\n")] = '\0';
        } else {
            snprintf(buf, len, "?");
        }
        fclose(f);
    }
}

int zb_zerod_locate(const char *prog, const char **zerod_p)
{
    static char self_zerod[PATH_MAX];
    const char *zerod = *zerod_p;

    if (zerod == NULL) {
        ssize_t len = readlink("/proc/self/exe", self_zerod, sizeof(self_zerod) - 1);
        char *slash;

        if (len > 0) {
            self_zerod[len] = '\0';
            slash = strrchr(self_zerod, '/');
            if (slash != NULL && (size_t)(slash - self_zerod) + 20 < sizeof(self_zerod)) {
                strcpy(slash, "/../daemon/zerod");
                zerod = self_zerod;
            }
        }
    }
    if (zerod == NULL || access(zerod, X_OK) != 0) {
        fprintf(stderr, "%s: no zerod binary at '%s' (use --zerod PATH)\n", prog,
                zerod ? zerod : "?");
        return -1;
    }
    *zerod_p = zerod;
    return 0;
}

int zb_tmpdir_create(const char *prog, char *dir, size_t len)
{
    snprintf(dir, len, "/tmp/%s.XXXXXX", prog);
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "%s: mkdtemp: %s\n", prog, strerror(errno));
        return -1;
    }
    return 0;
}

int zb_token_create(const char *prog, const char *dir, char *path, size_t len)
{
    unsigned char raw[32];
    char hex[65];
    FILE *f = fopen("/dev/urandom", "rbe");
    int fd;

    if (f == NULL || fread(raw, 1, sizeof(raw), f) != sizeof(raw)) {
        fprintf(stderr, "%s: /dev/urandom: %s\n", prog, strerror(errno));
        if (f != NULL) {
            fclose(f);
        }
        return -1;
    }
    fclose(f);
    for (size_t i = 0; i < sizeof(raw); i++) {
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    }
    if (dir != NULL) {
        snprintf(path, len, "%s/token", dir);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    } else {
        snprintf(path, len, "/tmp/%s.token.XXXXXX", prog);
        fd = mkostemp(path, O_CLOEXEC); /* mode 0600 */
    }
    if (fd < 0 || zb_write_all(fd, hex, 64) != 0) {
        fprintf(stderr, "%s: writing %s: %s\n", prog, path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        return -1;
    }
    close(fd);
    return 0;
}

void zb_log_tail(const char *prog, const char *path, unsigned lines)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "tail -n %u '%s' >&2", lines, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "%s: (no log at %s)\n", prog, path);
    }
}

pid_t zb_child_fork(const char *prog, int fds[], unsigned r, int *out_fd_p)
{
    int p[2];
    pid_t pid;

    fflush(NULL);
    if (pipe2(p, O_CLOEXEC) != 0) {
        fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[0]);
        for (unsigned q = 0; q < r; q++) {
            close(fds[q]);
        }
        *out_fd_p = p[1];
        return 0;
    }
    close(p[1]);
    fds[r] = p[0];
    return pid;
}

int zb_children_reap(const char *prog, const char *what, const pid_t pids[], const int fds[],
                     unsigned n, int failed)
{
    for (unsigned i = 0; i < n; i++) {
        int wst = 0;

        if (fds[i] >= 0) {
            close(fds[i]);
        }
        if (pids[i] <= 0) {
            continue;
        }
        if (failed) {
            kill(pids[i], SIGTERM);
        }
        if (waitpid(pids[i], &wst, 0) != pids[i] || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
            if (!failed && what != NULL) {
                fprintf(stderr, "%s: %s %u exited with status 0x%x\n", prog, what, i, wst);
            }
            failed = 1;
        }
    }
    return failed;
}

/* ---- zerod processes ------------------------------------------------------------------- */

/* Whether a line of the log starts with "READY ". */
static int zb_log_has_ready(const char *path)
{
    char line[512];
    FILE *f = fopen(path, "re");
    int at_start = 1, found = 0;

    if (f == NULL) {
        return 0;
    }
    while (!found && fgets(line, sizeof(line), f) != NULL) {
        found = at_start && strncmp(line, "READY ", 6) == 0;
        at_start = strchr(line, '\n') != NULL;
    }
    fclose(f);
    return found;
}

/* The child: stdout and stderr to the log, then exec. Never returns. */
static void zb_zerod_exec(const zb_zerod_t *z, const char *zerod, const char *const args[])
{
    const char *argv[ZB_ZEROD_MAX_ARGS + 4];
    unsigned n = 0;
    FILE *log = freopen(z->log, "w", stdout);

    if (log == NULL || dup2(fileno(stdout), STDERR_FILENO) < 0) {
        _exit(127);
    }
    argv[n++] = zerod;
    argv[n++] = "--socket";
    argv[n++] = z->sock;
    for (unsigned i = 0; args != NULL && args[i] != NULL && i < ZB_ZEROD_MAX_ARGS; i++) {
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    execv(zerod, (char *const *)argv);
    fprintf(stderr, "%s: exec %s: %s\n", z->prog, zerod, strerror(errno));
    _exit(127);
}

int zb_zerod_start(zb_zerod_t *z, const char *zerod, const char *const args[])
{
    double deadline;
    int wst;

    fflush(NULL);
    z->pid = fork();
    if (z->pid < 0) {
        fprintf(stderr, "%s: fork: %s\n", z->prog, strerror(errno));
        z->pid = 0;
        return -1;
    }
    if (z->pid == 0) {
        zb_zerod_exec(z, zerod, args);
    }
    deadline = zs_time_now_s() + ZB_ZEROD_READY_S;
    while (!zb_log_has_ready(z->log)) {
        if (waitpid(z->pid, &wst, WNOHANG) == z->pid) {
            fprintf(stderr, "%s: %s exited before it was ready:\n", z->prog, z->name);
            zb_log_tail(z->prog, z->log, z->tail_lines);
            z->pid = 0;
            return -1;
        }
        if (zs_time_now_s() >= deadline) {
            fprintf(stderr, "%s: %s not ready within %.0f s\n", z->prog, z->name, ZB_ZEROD_READY_S);
            zb_log_tail(z->prog, z->log, z->tail_lines);
            kill(z->pid, SIGKILL);
            waitpid(z->pid, &wst, 0);
            z->pid = 0;
            return -1;
        }
        usleep(ZB_POLL_US);
    }
    return 0;
}

int zb_zerod_stop(zb_zerod_t *z)
{
    double deadline = zs_time_now_s() + ZB_ZEROD_STOP_S;
    pid_t got = 0;
    int wst = 0, rc = 0;

    if (z->pid > 0) {
        kill(z->pid, SIGTERM);
        while ((got = waitpid(z->pid, &wst, WNOHANG)) == 0 && zs_time_now_s() < deadline) {
            usleep(ZB_POLL_US);
        }
        if (got == 0) {
            fprintf(stderr, "%s: %s still running %.0f s after SIGTERM: SIGKILL\n", z->prog,
                    z->name, ZB_ZEROD_STOP_S);
            kill(z->pid, SIGKILL);
            got = waitpid(z->pid, &wst, 0);
        }
        if (got != z->pid || !WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
            fprintf(stderr, "%s: %s did not exit cleanly (status 0x%x):\n", z->prog, z->name, wst);
            zb_log_tail(z->prog, z->log, z->tail_lines);
            rc = -1;
        }
        z->pid = 0;
    }
    unlink(z->sock);
    unlink(z->log);
    return rc;
}

int zb_zerod_metrics(const zb_zerod_t *z, char *buf, size_t cap)
{
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t len = 0, base = strlen(z->sock) - strlen(".sock");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char *body;
    ssize_t n;
    int ok;

    snprintf(a.sun_path, sizeof(a.sun_path), "%.*s.metrics.sock", (int)base, z->sock);
    ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
         zb_write_all(fd, req, sizeof(req) - 1) == 0;
    while (ok && len + 1 < cap && (n = read(fd, buf + len, cap - 1 - len)) > 0) {
        len += (size_t)n;
    }
    buf[len] = '\0';
    body = strstr(buf, "\r\n\r\n");
    ok = ok && body != NULL && strncmp(buf, "HTTP/1.1 200", 12) == 0;
    if (ok) {
        memmove(buf, body + 4, strlen(body + 4) + 1);
    }
    if (fd >= 0) {
        close(fd);
    }
    return ok ? 0 : -1;
}

double zb_metric(const char *text, const char *name, const char *label)
{
    size_t nl = strlen(name);

    for (const char *l = text; l != NULL; l = strchr(l, '\n'), l = l != NULL ? l + 1 : NULL) {
        const char *sp = strchr(l, ' ');
        if (strncmp(l, name, nl) == 0 && l[nl] == '{' && sp != NULL) {
            const char *lab = strstr(l, label); /* the labels end at the line's first space */
            if (lab != NULL && lab < sp) {
                return strtod(sp + 1, NULL);
            }
        }
    }
    return 0;
}
