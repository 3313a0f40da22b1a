/*
 * zerorun: the local launcher, like torchrun --standalone. Starts N trainers with the job's
 * environment, optionally N private zerod daemons first, prefixes every output line with the
 * rank, stops the job on the first failure or on a signal, and never leaves a process behind.
 *
 *   zerorun --nproc N [--spawn-daemons] [OPTIONS] -- CMD [ARGS...]
 *
 * Exit status: 0 every rank exited 0; 1 a rank or a daemon failed (the first failure is
 * named), or a system error; 2 usage; 128+signal (130 SIGINT, 143 SIGTERM, 129 SIGHUP) when
 * stopped by a signal.
 */
#define _GNU_SOURCE
#include "zr_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ZR_TOKEN_BYTES 32
#define ZR_PORT_LO     20000u
#define ZR_PORT_HI     32768u

/* ---- job setup --------------------------------------------------------------------------- */

/* Whether TCP port p binds on the address of res now. */
static bool zr_port_binds(const struct addrinfo *res, unsigned p, int *err)
{
    struct sockaddr_storage ss;
    bool ok;
    int fd;

    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    if (ss.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)p);
    } else {
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)p);
    }
    fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0) {
        *err = errno;
        return false;
    }
    ok = bind(fd, (struct sockaddr *)&ss, res->ai_addrlen) == 0;
    *err = ok ? 0 : errno;
    close(fd);
    return ok;
}

/* MASTER_PORT: a port below the kernel's ephemeral range (32768+) that binds on MASTER_ADDR
 * now, and so does the next one (rank 0's daemon listens on MASTER_PORT + 1, torch's store on
 * MASTER_PORT: zc_coordinator_from_env). Not port 0: an ephemeral port is handed out again to any
 * socket that binds one, such as the TCP transport of a UCX worker, and rank 0's listener would
 * then find it taken. */
static int zr_free_port(const char *addr, char *port, size_t len)
{
    struct addrinfo hints, *res = NULL;
    int rc, err = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(addr, "0", &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "zerorun: --master-addr '%s': %s\n", addr, gai_strerror(rc));
        return -1;
    }
    for (int attempt = 0; attempt < 256; attempt++) {
        uint16_t r = 0;
        unsigned p;

        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
            r = (uint16_t)(getpid() + attempt * 7919);
        }
        p = ZR_PORT_LO + r % (ZR_PORT_HI - ZR_PORT_LO - 1);
        if (zr_port_binds(res, p, &err) && zr_port_binds(res, p + 1, &err)) {
            snprintf(port, len, "%u", p);
            freeaddrinfo(res);
            return 0;
        }
        if (err != EADDRINUSE) {
            break;
        }
    }
    freeaddrinfo(res);
    fprintf(stderr,
            "zerorun: cannot bind a TCP port on MASTER_ADDR '%s' (%s); give --master-port\n", addr,
            strerror(err));
    return -1;
}

/* The private runtime directory: mkdtemp makes it mode 0700. */
static int zr_make_dir(const zr_opts_t *o, char *dir, size_t len)
{
    const char *base = o->socket_dir;

    if (base == NULL) {
        base = getenv("XDG_RUNTIME_DIR");
    }
    if (base == NULL || base[0] == '\0') {
        base = "/tmp";
    }
    if ((size_t)snprintf(dir, len, "%s/zerorun-XXXXXX", base) >= len) {
        fprintf(stderr, "zerorun: directory name under '%s' is too long\n", base);
        return -1;
    }
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "zerorun: cannot create a private directory under '%s': %s\n", base,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* A fresh random job token, hex, in a file only we can read. */
static int zr_write_token(const char *path)
{
    unsigned char raw[ZR_TOKEN_BYTES];
    char hex[2 * ZR_TOKEN_BYTES + 2];
    size_t got = 0;
    int fd, rc = 0;

    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            fprintf(stderr, "zerorun: getrandom: %s\n", strerror(errno));
            return -1;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(raw); i++) {
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    }
    hex[2 * ZR_TOKEN_BYTES] = '\n';
    hex[2 * ZR_TOKEN_BYTES + 1] = '\0';
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || fchmod(fd, 0600) != 0 ||
        write(fd, hex, 2 * ZR_TOKEN_BYTES + 1) != 2 * ZR_TOKEN_BYTES + 1) {
        fprintf(stderr, "zerorun: cannot write the job token '%s': %s\n", path, strerror(errno));
        rc = -1;
    }
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        fprintf(stderr, "zerorun: cannot write the job token '%s': %s\n", path, strerror(errno));
        rc = -1;
    }
    explicit_bzero(raw, sizeof(raw));
    explicit_bzero(hex, sizeof(hex));
    return rc;
}

/* Remove the (flat) private directory: logs, token, sockets a killed daemon left. */
static void zr_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                (void)unlinkat(dirfd(d), e->d_name, 0);
            }
        }
        closedir(d);
    }
    if (rmdir(dir) != 0) {
        fprintf(stderr, "zerorun: cannot remove '%s': %s\n", dir, strerror(errno));
    }
}

/* The zerod binary: --daemon, else next to us (installed), else ../daemon (build tree). */
static void zr_find_daemon(const char *opt, char *buf, size_t len)
{
    static const char *const rel[] = {"zerod", "../daemon/zerod"};
    char exe[PATH_MAX];
    ssize_t n;
    char *slash;

    if (opt != NULL) {
        snprintf(buf, len, "%s", opt);
        return;
    }
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
            for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
                if ((size_t)snprintf(buf, len, "%s/%s", exe, rel[i]) < len &&
                    access(buf, X_OK) == 0) {
                    return;
                }
            }
        }
    }
    snprintf(buf, len, "zerod"); /* $PATH */
}

/* The GPUs of this host, as the NVIDIA driver's device nodes /dev/nvidia<N> (no CUDA needed). */
static int zr_gpu_count(void)
{
    int n = 0;

    for (int i = 0; i < 64; i++) {
        char path[32];
        snprintf(path, sizeof(path), "/dev/nvidia%d", i);
        if (access(path, F_OK) == 0) {
            n++;
        }
    }
    return n;
}

/* The daemons' device kind (r->device): --device, with auto resolved. */
static int zr_device(zr_run_t *r, const zr_opts_t *o)
{
    int gpus = zr_gpu_count();

    if (strcmp(o->device, "cpu") == 0 || (strcmp(o->device, "auto") == 0 && gpus < o->nproc)) {
        r->device = "cpu";
        return 0;
    }
    if (gpus < o->nproc) {
        fprintf(stderr,
                "zerorun: --device cuda: %d ranks need a GPU each, this host has %d "
                "(/dev/nvidia<N>); use --device cpu\n",
                o->nproc, gpus);
        return -1;
    }
    r->device = "cuda";
    return 0;
}

/* Per-rank socket paths, checked against the sockaddr_un limit. */
static int zr_socket_paths(zr_run_t *r, const zr_opts_t *o, const char *dir)
{
    const char *base = dir;
    struct sockaddr_un sun;

    if (base == NULL) {
        base = o->socket_dir != NULL ? o->socket_dir : getenv("ZEROD_SOCKET_DIR");
    }
    if (base == NULL || base[0] == '\0') {
        base = ZR_DEFAULT_SOCKET_DIR;
    }
    for (int i = 0; i < r->nproc; i++) {
        char *path;
        if (asprintf(&path, "%s/zerod-%s%d.sock", base, r->device, i) < 0) {
            fprintf(stderr, "zerorun: out of memory\n");
            return -1;
        }
        r->trainers[i].socket_path = path;
        if (strlen(path) >= sizeof(sun.sun_path)) {
            fprintf(stderr, "zerorun: socket path '%s' is longer than %zu bytes\n", path,
                    sizeof(sun.sun_path) - 1);
            return -1;
        }
        if (r->daemons != NULL) {
            r->daemons[i].socket_path = path;
            if (asprintf(&r->daemons[i].log_path, "%s/zerod-%d.log", dir, i) < 0) {
                r->daemons[i].log_path = NULL;
                fprintf(stderr, "zerorun: out of memory\n");
                return -1;
            }
        }
    }
    return 0;
}

/* Block the signals we take through the signalfd; SIGHUP only if not ignored (nohup). */
static int zr_signals_init(zr_run_t *r)
{
    struct sigaction sa;
    sigset_t mask;

    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    if (sigaction(SIGHUP, NULL, &sa) == 0 && sa.sa_handler != SIG_IGN) {
        sigaddset(&mask, SIGHUP);
    }
    /* A shell starts background jobs with SIGINT ignored; children get the default back. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the launcher */
    if (sigprocmask(SIG_BLOCK, &mask, &r->old_mask) != 0) {
        fprintf(stderr, "zerorun: sigprocmask: %s\n", strerror(errno));
        return -1;
    }
    r->sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (r->sfd < 0) {
        fprintf(stderr, "zerorun: signalfd: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Children's fds 0-2 must not land on our pipes: make sure ours are open. */
static void zr_std_fds_open(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) < 0) {
            int n = open("/dev/null", O_RDWR);
            if (n >= 0 && n != fd) {
                close(n);
            }
        }
    }
}

static zr_child_t *zr_children_alloc(int n)
{
    zr_child_t *c = calloc((size_t)n, sizeof(*c));

    for (int i = 0; c != NULL && i < n; i++) {
        c[i].rank = i;
        c[i].out.fd = -1;
        c[i].err.fd = -1;
    }
    return c;
}

/* ---- the job ------------------------------------------------------------------------------ */

/* Start the daemons; ZR_EXIT_OK once all are ready, else the exit status. */
static int zr_daemons_up(zr_run_t *r, const zr_opts_t *o, const char *dir)
{
    char zerod[PATH_MAX], token[PATH_MAX];

    snprintf(token, sizeof(token), "%s/token", dir);
    if (zr_write_token(token) != 0) {
        return ZR_EXIT_FAIL;
    }
    zr_find_daemon(o->daemon, zerod, sizeof(zerod));
    for (int i = 0; i < r->nproc; i++) {
        if (zr_daemon_start(r, i, zerod, token) != 0) {
            return ZR_EXIT_FAIL;
        }
    }
    return zr_daemons_wait_ready(r);
}

/* OMP_NUM_THREADS=1 for every rank when the user has not set it and there is more than one
 * rank: torchrun does the same (N ranks of N-thread OpenMP pools overload the host). */
static bool zr_omp_default(int nproc)
{
    if (nproc <= 1 || getenv("OMP_NUM_THREADS") != NULL) {
        return false;
    }
    fprintf(stderr, "zerorun: setting OMP_NUM_THREADS=1 for every rank (it is not set and "
                    "there are several ranks, as torchrun does); tune it for your job as "
                    "needed\n");
    return true;
}

/* The command as run: a CMD ending in ".py" runs as "$PYTHON -u CMD ARGS..." (python3 from
 * $PATH when PYTHON is unset or empty), as torchrun runs a script. *argv is the command itself
 * or a new array (*owned, to free). 0 or -1 (reported). */
static int zr_command(char **cmd, char ***argv, char ***owned)
{
    const char *py = getenv("PYTHON");
    size_t n = 0, len = strlen(cmd[0]);
    char **a;

    *argv = cmd;
    *owned = NULL;
    if (len < 3 || strcmp(cmd[0] + len - 3, ".py") != 0) {
        return 0;
    }
    while (cmd[n] != NULL) {
        n++;
    }
    a = calloc(n + 3, sizeof(*a));
    if (a == NULL) {
        fprintf(stderr, "zerorun: out of memory\n");
        return -1;
    }
    a[0] = (char *)(py != NULL && py[0] != '\0' ? py : "python3");
    a[1] = (char *)"-u"; /* unbuffered, as torchrun: lines come out as they are written */
    memcpy(a + 2, cmd, n * sizeof(*a));
    *argv = *owned = a;
    return 0;
}

/* Start every trainer with torchrun's environment of one node (group 0 of 1, role "default",
 * no restarts, the job id as run id) and zerod's, then supervise them. */
static int zr_trainers_run(zr_run_t *r, const zr_opts_t *o, const char *job, const char *port)
{
    char world[16], rank[16], **argv, **owned;
    bool omp = zr_omp_default(r->nproc);
    int started = 0;

    if (zr_command(o->cmd, &argv, &owned) != 0) {
        return ZR_EXIT_FAIL;
    }
    snprintf(world, sizeof(world), "%d", r->nproc);
    for (; started < r->nproc && r->stop_signal == 0; started++) {
        const zr_env_t env[] = {
            {"RANK", rank},
            {"LOCAL_RANK", rank},
            {"WORLD_SIZE", world},
            {"LOCAL_WORLD_SIZE", world},
            {"GROUP_RANK", "0"},
            {"GROUP_WORLD_SIZE", "1"},
            {"ROLE_NAME", "default"},
            {"ROLE_RANK", rank},
            {"ROLE_WORLD_SIZE", world},
            {"MASTER_ADDR", o->master_addr},
            {"MASTER_PORT", port},
            {"TORCHELASTIC_RESTART_COUNT", "0"},
            {"TORCHELASTIC_MAX_RESTARTS", "0"},
            {"TORCHELASTIC_RUN_ID", job},
            {"TORCHELASTIC_USE_AGENT_STORE", "False"}, /* rank 0's trainer holds torch's store */
            {"ZEROD_JOB", job},
            {"ZEROD_SOCKET", r->trainers[started].socket_path},
            {"OMP_NUM_THREADS", "1"}, /* last: only when zr_omp_default() */
        };
        snprintf(rank, sizeof(rank), "%d", started);
        if (zr_trainer_start(r, started, argv, env, ZR_ARRAY_SIZE(env) - (omp ? 0 : 1)) != 0) {
            break;
        }
        zr_handle_signals(r); /* an early exit shows up in the loop below */
    }
    free(owned);
    return zr_trainers_supervise(r, started);
}

/* The run's children and the supervision loop's arrays, for o->nproc ranks; 0 or -1 (out of
 * memory, reported). */
static int zr_run_alloc(zr_run_t *r, const zr_opts_t *o)
{
    size_t cap = 1 + 2 * (size_t)o->nproc;

    r->nproc = o->nproc;
    r->timeout_s = o->timeout_s;
    r->sfd = -1;
    r->trainers = zr_children_alloc(o->nproc);
    r->daemons = o->spawn_daemons ? zr_children_alloc(o->nproc) : NULL;
    r->pfd = calloc(cap, sizeof(*r->pfd));
    r->streams = calloc(cap, sizeof(*r->streams));
    r->ranks = calloc(cap, sizeof(*r->ranks));
    if (r->trainers == NULL || (o->spawn_daemons && r->daemons == NULL) || r->pfd == NULL ||
        r->streams == NULL || r->ranks == NULL) {
        fprintf(stderr, "zerorun: out of memory\n");
        return -1;
    }
    return 0;
}

static void zr_run_free(zr_run_t *r)
{
    for (int i = 0; i < r->nproc; i++) {
        free(r->trainers[i].socket_path);
        if (r->daemons != NULL) {
            free(r->daemons[i].log_path);
        }
    }
    free(r->trainers);
    free(r->daemons);
    free(r->pfd);
    free(r->streams);
    free(r->ranks);
    close(r->sfd);
}

/* The job's id (--job, else zerorun-<pid>-<unix time>) and MASTER_PORT (--master-port, else a
 * free one); 0 or -1 (reported). */
static int zr_job_names(const zr_opts_t *o, char *job, size_t job_len, char *port, size_t port_len)
{
    if (o->job != NULL) {
        snprintf(job, job_len, "%s", o->job);
    } else {
        snprintf(job, job_len, "zerorun-%d-%lld", (int)getpid(), (long long)time(NULL));
    }
    if (o->master_port != NULL) {
        snprintf(port, port_len, "%s", o->master_port);
        return 0;
    }
    return zr_free_port(o->master_addr, port, port_len);
}

/* The job once set up: the sockets, the daemons (with --spawn-daemons, in dir), the trainers,
 * then the daemons stopped. Returns the exit status. */
static int zr_job_run(zr_run_t *r, const zr_opts_t *o, const char *dir, const char *job,
                      const char *port)
{
    int rc, stop_rc;

    rc = zr_socket_paths(r, o, o->spawn_daemons ? dir : NULL) != 0 ? ZR_EXIT_FAIL : ZR_EXIT_OK;
    if (rc == ZR_EXIT_OK && o->spawn_daemons) {
        rc = zr_daemons_up(r, o, dir);
    }
    if (rc == ZR_EXIT_OK) {
        rc = zr_trainers_run(r, o, job, port);
    }
    stop_rc = zr_daemons_stop(r);
    if (rc == ZR_EXIT_OK) {
        rc = stop_rc;
    }
    if (rc == ZR_EXIT_OK && r->stop_signal != 0) {
        rc = 128 + r->stop_signal; /* a signal while the daemons stopped */
    }
    return rc;
}

int main(int argc, char **argv)
{
    zr_opts_t o;
    zr_run_t r;
    char job[128], port[16], dir[PATH_MAX] = "";
    int rc;

    rc = zr_opts_parse(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    zr_std_fds_open();
    memset(&r, 0, sizeof(r));
    if (zr_device(&r, &o) != 0) { /* before anything is allocated */
        return ZR_EXIT_USAGE;
    }
    if (zr_run_alloc(&r, &o) != 0 || zr_job_names(&o, job, sizeof(job), port, sizeof(port)) != 0 ||
        zr_signals_init(&r) != 0) {
        return ZR_EXIT_FAIL;
    }
    if (o.spawn_daemons && zr_make_dir(&o, dir, sizeof(dir)) != 0) {
        return ZR_EXIT_FAIL;
    }
    rc = zr_job_run(&r, &o, dir, job, port);
    if (dir[0] != '\0') {
        if (rc == ZR_EXIT_FAIL || o.keep_logs) {
            fprintf(stderr, "zerorun: daemon logs kept in %s\n", dir);
        } else {
            zr_remove_dir(dir);
        }
    }
    zr_run_free(&r);
    return rc;
}
