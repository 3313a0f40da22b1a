/*
 * zerorun's command line: the options (getopt_long, stopping at CMD) into zr_opts_t, and
 * --help. zerorun.c runs the job they describe.
 */
#define _GNU_SOURCE
#include "zr_int.h"
#include "zs/version.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    OPT_SPAWN = 1000,
    OPT_ADDR,
    OPT_PORT,
    OPT_JOB,
    OPT_SOCKET_DIR,
    OPT_DAEMON,
    OPT_TIMEOUT,
    OPT_KEEP_LOGS,
    OPT_DEVICE,
    OPT_VERSION,
};

/* --help, the part after the options: what each rank gets, and how the job runs and stops. */
static void zr_usage_job(FILE *out)
{
    fprintf(
        out,
        "Each rank i gets torchrun's environment of one node: RANK=i, LOCAL_RANK=i,\n"
        "ROLE_RANK=i, WORLD_SIZE=N, LOCAL_WORLD_SIZE=N, ROLE_WORLD_SIZE=N, GROUP_RANK=0,\n"
        "GROUP_WORLD_SIZE=1, ROLE_NAME=default, MASTER_ADDR, MASTER_PORT (rank 0's daemon\n"
        "listens on MASTER_PORT + 1; torch's store may take MASTER_PORT),\n"
        "TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0, TORCHELASTIC_RUN_ID=<job>,\n"
        "TORCHELASTIC_USE_AGENT_STORE=False, and OMP_NUM_THREADS=1 when N > 1 and it is not\n"
        "set (a notice says so); and zerod's: ZEROD_JOB=<job> and ZEROD_SOCKET, the socket of\n"
        "daemon i with --spawn-daemons, else DIR/zerod-cpu<i>.sock (or zerod-cuda<i>.sock; DIR\n"
        "as for --socket-dir), the name zerod gives itself with --device cpu:<i> (cuda:<i>)\n"
        "--socket auto. A trainer on a GPU uses cuda:$LOCAL_RANK, its daemon's.\n"
        "zerorun never restarts a trainer (TORCHELASTIC_RESTART_COUNT stays 0): a job whose\n"
        "trainer died, run again, starts afresh with zerod.torch's resume=\"auto\".\n"
        "\n"
        "A CMD ending in .py runs as \"$PYTHON -u CMD ARGS...\" (python3 from $PATH when PYTHON\n"
        "is unset), as torchrun runs a script. Trainers read /dev/null as stdin; every line\n"
        "they write to stdout or stderr comes out on zerorun's stdout or stderr as\n"
        "\"[rank i] line\".\n"
        "\n"
        "With --spawn-daemons, the private directory (mode 0700) holds the sockets, a random\n"
        "job token (token, mode 0600, given to each zerod as --token-file) and each daemon's\n"
        "output (zerod-<i>.log). It is removed at the end, unless the job failed or --keep-logs\n"
        "is given: then its path is printed.\n"
        "\n"
        "On the first rank that fails, zerorun prints its rank and exit code or signal, sends\n"
        "SIGTERM to the others (SIGKILL %d s later) and exits 1. SIGINT, SIGTERM or SIGHUP stop\n"
        "the trainers, then the daemons, the same way (a second signal kills at once); zerorun\n"
        "then exits 128+signal. Each child runs in a process group of its own, killed when the\n"
        "child exits. Children die with zerorun even if it is SIGKILLed (their own children\n"
        "and the private directory then outlive it).\n"
        "\n"
        "Exit status: 0 every rank succeeded, 1 a rank or daemon failed, 2 usage error,\n"
        "130/143/129 stopped by SIGINT/SIGTERM/SIGHUP.\n",
        ZR_GRACE_MS / 1000);
}

static void zr_usage(FILE *out)
{
    fprintf(
        out,
        "Usage: zerorun --nproc N [OPTIONS] -- CMD [ARGS...]\n"
        "Run N ranks of a training command on this host (like torchrun), optionally with a\n"
        "private zerod per rank.\n"
        "\n"
        "Options:\n"
        "  -n, --nproc N          number of ranks (1..%d)\n"
        "      --spawn-daemons    start one zerod per rank (--device cpu:<rank> or\n"
        "                         cuda:<rank>) in a private directory, wait for each to be\n"
        "                         ready, stop them at the end\n"
        "      --device KIND      the daemons' devices: cpu (cpu:<rank>), cuda (cuda:<rank>:\n"
        "                         one GPU per rank) or auto (default: cuda when this host has\n"
        "                         a GPU per rank, /dev/nvidia<N>, else cpu)\n"
        "      --master-addr A    MASTER_ADDR (default 127.0.0.1)\n"
        "      --master-port P    MASTER_PORT (default: a free TCP port on MASTER_ADDR)\n"
        "      --job ID           ZEROD_JOB (default: zerorun-<pid>-<unix time>)\n"
        "      --socket-dir DIR   without --spawn-daemons: where the daemons' sockets are\n"
        "                         (default $ZEROD_SOCKET_DIR, else %s); with it: where the\n"
        "                         private directory is made (default $XDG_RUNTIME_DIR, else /tmp)\n"
        "      --daemon PATH      zerod binary (default: zerod next to zerorun, then\n"
        "                         ../daemon/zerod from a build tree, then $PATH)\n"
        "      --timeout SEC      deadline for the daemons to be ready (default %g)\n"
        "      --keep-logs        keep the private directory (daemon logs) after a good run\n"
        "  -h, --help             print this help and exit\n"
        "      --version          print the version and exit\n"
        "\n",
        ZR_MAX_NPROC, ZR_DEFAULT_SOCKET_DIR, ZR_DEFAULT_TIMEOUT_S);
    zr_usage_job(out);
}

static int zr_usage_error(void)
{
    fprintf(stderr, "Try 'zerorun --help'.\n");
    return ZR_EXIT_USAGE;
}

/* --NAME ARG, a string that must not be empty, into *field_p. -1 to go on, else the exit
 * status (reported). */
static int zr_opt_nonempty(const char *name, const char *arg, const char **field_p)
{
    if (arg[0] == '\0') {
        fprintf(stderr, "zerorun: --%s is empty\n", name);
        return zr_usage_error();
    }
    *field_p = arg;
    return -1;
}

/* --NAME ARG, a decimal integer in lo..hi (`what` says which kind), into *v_p. -1 to go on,
 * else the exit status (reported). */
static int zr_opt_long(const char *name, const char *arg, long lo, long hi, const char *what,
                       long *v_p)
{
    char *end;
    long v = strtol(arg, &end, 10);

    if (arg[0] == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "zerorun: --%s '%s' is not %s in %ld..%ld\n", name, arg, what, lo, hi);
        return zr_usage_error();
    }
    *v_p = v;
    return -1;
}

/* --timeout SEC: seconds in (0, 86400]. */
static int zr_opt_timeout(const char *arg, double *timeout_s_p)
{
    char *end;
    double v = strtod(arg, &end);

    if (arg[0] == '\0' || *end != '\0' || !isfinite(v) || v <= 0.0 || v > 86400.0) {
        fprintf(stderr, "zerorun: --timeout '%s' is not a number of seconds in (0, 86400]\n", arg);
        return zr_usage_error();
    }
    *timeout_s_p = v;
    return -1;
}

/* One option c (getopt_long's value) with its argument into o. -1 to go on, else the exit
 * status: ZR_EXIT_OK after --help or --version, ZR_EXIT_USAGE for a bad one (reported). */
static int zr_opt(int c, const char *arg, zr_opts_t *o)
{
    long v = 0;
    int rc;

    switch (c) {
    case 'n':
        rc = zr_opt_long("nproc", arg, 1, ZR_MAX_NPROC, "an integer", &v);
        o->nproc = rc < 0 ? (int)v : o->nproc;
        return rc;
    case OPT_PORT:
        rc = zr_opt_long("master-port", arg, 1, 65535, "a port", &v);
        o->master_port = rc < 0 ? arg : o->master_port;
        return rc;
    case OPT_ADDR:
        return zr_opt_nonempty("master-addr", arg, &o->master_addr);
    case OPT_JOB:
        return zr_opt_nonempty("job", arg, &o->job);
    case OPT_SOCKET_DIR:
        return zr_opt_nonempty("socket-dir", arg, &o->socket_dir);
    case OPT_DAEMON:
        if (strchr(arg, '/') != NULL && access(arg, X_OK) != 0) {
            fprintf(stderr, "zerorun: --daemon '%s': %s\n", arg, strerror(errno));
            return zr_usage_error();
        }
        o->daemon = arg;
        return -1;
    case OPT_TIMEOUT:
        return zr_opt_timeout(arg, &o->timeout_s);
    case OPT_DEVICE:
        if (strcmp(arg, "cpu") != 0 && strcmp(arg, "cuda") != 0 && strcmp(arg, "auto") != 0) {
            fprintf(stderr, "zerorun: --device '%s' is not cpu, cuda or auto\n", arg);
            return zr_usage_error();
        }
        o->device = arg;
        return -1;
    case OPT_SPAWN:
        o->spawn_daemons = true;
        return -1;
    case OPT_KEEP_LOGS:
        o->keep_logs = true;
        return -1;
    case 'h':
        zr_usage(stdout);
        return ZR_EXIT_OK;
    case OPT_VERSION:
        printf("zerorun %s\n", ZS_VERSION);
        return ZR_EXIT_OK;
    default:
        return zr_usage_error();
    }
}

int zr_opts_parse(int argc, char **argv, zr_opts_t *o)
{
    static const struct option longopts[] = {
        {"nproc", required_argument, NULL, 'n'},
        {"spawn-daemons", no_argument, NULL, OPT_SPAWN},
        {"master-addr", required_argument, NULL, OPT_ADDR},
        {"master-port", required_argument, NULL, OPT_PORT},
        {"job", required_argument, NULL, OPT_JOB},
        {"socket-dir", required_argument, NULL, OPT_SOCKET_DIR},
        {"daemon", required_argument, NULL, OPT_DAEMON},
        {"timeout", required_argument, NULL, OPT_TIMEOUT},
        {"keep-logs", no_argument, NULL, OPT_KEEP_LOGS},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    int c, rc = -1;

    memset(o, 0, sizeof(*o));
    o->master_addr = "127.0.0.1";
    o->device = "auto";
    o->timeout_s = ZR_DEFAULT_TIMEOUT_S;
    /* '+': stop at CMD, so that its own options are not ours even without "--" */
    while (rc < 0 && (c = getopt_long(argc, argv, "+n:h", longopts, NULL)) != -1) {
        rc = zr_opt(c, optarg, o);
    }
    if (rc >= 0) {
        return rc;
    }
    if (o->nproc == 0) {
        fprintf(stderr, "zerorun: --nproc is required\n");
        return zr_usage_error();
    }
    if (optind >= argc) {
        fprintf(stderr, "zerorun: no command to run (zerorun --nproc N -- CMD [ARGS...])\n");
        return zr_usage_error();
    }
    o->cmd = argv + optind;
    return -1;
}
