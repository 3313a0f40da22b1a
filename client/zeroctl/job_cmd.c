/*
 * zeroctl job: the jobs the daemons hold, and ending one (docs/design-notes.md "A job's life").
 *
 *   zeroctl [--json] job ls  [-s SOCKET]... [--dir DIR] [-t MS]
 *   zeroctl [--json] job end JOB|--all [--checkpoint DIR] [-s SOCKET]... [--dir DIR] [-t MS]
 *
 * The daemons asked: every -s SOCKET (also one given before `job`), else every socket in DIR
 * (default: the directory of $ZEROD_SOCKET, else /run/zerod). `job end` asks each daemon that
 * holds the job, all at once (a final checkpoint at world > 1 is a collective of them all).
 * Exit codes as zeroctl's: 0 ok, 1 a daemon returned an error (or none holds JOB), 2 usage, 7 a
 * daemon unreachable.
 */
#define _GNU_SOURCE
#include "job_cmd.h"

#include "cli.h"
#include "zerod/zc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JOB_MAX_DAEMONS    ZCTL_MAX_DAEMONS
#define JOB_LS_TIMEOUT_MS  10000
#define JOB_END_TIMEOUT_MS 600000 /* a final checkpoint may form a mesh and write a large shard */

enum { JOB_EXIT_OK = 0, JOB_EXIT_DAEMON = 1, JOB_EXIT_USAGE = 2, JOB_EXIT_UNREACHABLE = 7 };

/* One daemon: what it said. */
typedef struct job_daemon {
    char socket[ZCTL_SOCKET_MAX];
    int status; /* of the last call: ZC_OK, or the failure (msg) */
    char msg[512];
    int has_job;
    char job_id[128], state[16], coordinator[256];
    uint32_t rank, world;
    uint64_t step;
    double age_s, idle_s, linger_left_s;
    int32_t trainer_pid;
    int mesh_up;
    /* job end */
    int end; /* 1: this daemon is asked to end its job */
    zc_job_end_result_t res;
    char checkpoint[4096];
    int already; /* it had ended already (a peer's END) */
} job_daemon_t;

typedef struct job_opts {
    int json;
    int timeout_ms;
    const char *dir;
    const char *sockets[JOB_MAX_DAEMONS];
    int n_sockets;
    const char *job_id; /* end */
    int all;            /* end */
    const char *checkpoint;
} job_opts_t;

static void job_usage(FILE *out)
{
    fprintf(out,
            "Usage: zeroctl [--json] job ls  [-s SOCKET]... [--dir DIR] [-t MS]\n"
            "       zeroctl [--json] job end JOB|--all [--checkpoint DIR] [-s SOCKET]... [--dir "
            "DIR]\n"
            "The jobs the daemons hold, and ending one on every daemon that holds it.\n"
            "\n"
            "  ls                  one row per daemon: its job, state (attached, kept, orphaned,\n"
            "                      lost), step, age and how long job_linger still keeps it\n"
            "  end JOB             end JOB: its trainers' next call fails with ERR_JOB_ENDED; a\n"
            "                      daemon whose mesh is up tells the job's other daemons too\n"
            "  end --all           end every job of the daemons asked\n"
            "  --checkpoint DIR    end: save a final checkpoint of the job in DIR first (at world\n"
            "                      > 1 every daemon of the job must be asked, its trainers gone);\n"
            "                      a failed save leaves the job as it was\n"
            "  -s, --socket PATH   a daemon to ask (repeat for several)\n"
            "  --dir DIR           ask every daemon socket in DIR (default: the directory of\n"
            "                      $ZEROD_SOCKET, else /run/zerod), when no -s is given\n"
            "  -t, --timeout MS    deadline of each daemon's answer (ls: 10000, end: 600000)\n"
            "  -h, --help          print this help and exit\n"
            "\n"
            "Exit status: 0 ok, 1 a daemon returned an error (or none holds JOB), 2 usage "
            "error,\n7 a daemon unreachable.\n");
}

/* ---- which daemons ------------------------------------------------------------------------ */

/* Every socket in dir, into d after the n_p there, by name; 0, or -1 when dir cannot be read. */
static int job_scan_dir(const char *dir, job_daemon_t *d, int *n_p)
{
    char(*sockets)[ZCTL_SOCKET_MAX] = calloc(JOB_MAX_DAEMONS, ZCTL_SOCKET_MAX);
    int n = sockets != NULL ? zctl_scan_dir(dir, sockets, JOB_MAX_DAEMONS - *n_p) : -1;

    int e = errno; /* opendir's, for the caller's %m */

    for (int i = 0; i < n; i++) {
        memcpy(d[(*n_p)++].socket, sockets[i], ZCTL_SOCKET_MAX);
    }
    free(sockets);
    errno = e;
    return n < 0 ? -1 : 0;
}

static int job_targets(const job_opts_t *o, job_daemon_t *d, int *n_p)
{
    char dflt[4096];
    const char *dir = o->dir;

    *n_p = 0;
    for (int i = 0; i < o->n_sockets; i++) {
        snprintf(d[(*n_p)++].socket, sizeof(d->socket), "%s", o->sockets[i]);
    }
    if (o->n_sockets > 0 && o->dir == NULL) {
        return JOB_EXIT_OK;
    }
    if (dir == NULL) {
        dir = zctl_default_dir(1, dflt, sizeof(dflt));
    }
    if (job_scan_dir(dir, d, n_p) != 0) {
        zctl_error(ZC_ERR_UNREACHABLE, "job: cannot read the socket directory %s: %m", dir);
        return JOB_EXIT_UNREACHABLE;
    }
    if (*n_p == 0) {
        zctl_error(ZC_ERR_UNREACHABLE, "job: no daemon socket in %s (give -s SOCKET or --dir DIR)",
                   dir);
        return JOB_EXIT_UNREACHABLE;
    }
    return JOB_EXIT_OK;
}

/* A control session on d's daemon; on failure d->status and d->msg say why. */
static zc_session_t *job_open(job_daemon_t *d, int timeout_ms)
{
    zc_open_params_t op = {.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS |
                                         ZC_OPEN_FIELD_CONTROL,
                           .socket_path = d->socket,
                           .timeout_ms = timeout_ms,
                           .control = 1};
    zc_session_t *s = NULL;

    d->status = zc_session_open(&op, &s);
    if (d->status != ZC_OK) {
        snprintf(d->msg, sizeof(d->msg), "%s", zc_last_error());
        return NULL;
    }
    return s;
}

/* What d's daemon holds, into d. */
static void job_list_one(job_daemon_t *d, int timeout_ms)
{
    zc_job_info_t ji = {.field_mask = ZC_JOB_INFO_FIELD_JOB | ZC_JOB_INFO_FIELD_LIFE};
    zc_session_t *s = job_open(d, timeout_ms);
    uint32_t n = 0;

    if (s == NULL) {
        return;
    }
    d->status = zc_session_job_list(s, timeout_ms, &n);
    if (d->status == ZC_OK && n > 0) {
        d->status = zc_session_job_info(s, 0, &ji);
    }
    if (d->status != ZC_OK) {
        snprintf(d->msg, sizeof(d->msg), "%s", zc_last_error());
    } else if (n > 0) {
        d->has_job = 1;
        snprintf(d->job_id, sizeof(d->job_id), "%s", ji.job_id);
        snprintf(d->state, sizeof(d->state), "%s", ji.state);
        snprintf(d->coordinator, sizeof(d->coordinator), "%s", ji.coordinator);
        d->rank = ji.rank;
        d->world = ji.world;
        d->step = ji.step;
        d->age_s = ji.age_s;
        d->idle_s = ji.idle_s;
        d->linger_left_s = ji.linger_left_s;
        d->trainer_pid = ji.trainer_pid;
        d->mesh_up = ji.mesh_up;
    }
    zc_session_close(s);
}

/* The exit status of the calls made: 7 when a daemon was unreachable, 1 when one failed. */
static int job_exit_of(const job_daemon_t *d, int n)
{
    int rc = JOB_EXIT_OK;

    for (int i = 0; i < n; i++) {
        if (d[i].status == ZC_ERR_UNREACHABLE || d[i].status == ZC_ERR_PERMISSION) {
            return JOB_EXIT_UNREACHABLE;
        }
        if (d[i].status != ZC_OK) {
            rc = JOB_EXIT_DAEMON;
        }
    }
    return rc;
}

static int job_print_json(cJSON *root)
{
    return zctl_print_json(root, 0);
}

static cJSON *job_json_root(const char *command)
{
    return zctl_json_root(command);
}

/* ---- job ls -------------------------------------------------------------------------------- */

static cJSON *job_ls_json_one(const job_daemon_t *d)
{
    cJSON *o = cJSON_CreateObject(), *j;

    cJSON_AddStringToObject(o, "socket", d->socket);
    if (d->status != ZC_OK) {
        cJSON_AddStringToObject(o, "error", zc_status_name(d->status));
        cJSON_AddStringToObject(o, "message", d->msg);
    }
    if (!d->has_job) {
        cJSON_AddNullToObject(o, "job");
        return o;
    }
    j = cJSON_AddObjectToObject(o, "job");
    cJSON_AddStringToObject(j, "id", d->job_id);
    cJSON_AddNumberToObject(j, "rank", d->rank);
    cJSON_AddNumberToObject(j, "world", d->world);
    cJSON_AddNumberToObject(j, "step", (double)d->step);
    cJSON_AddStringToObject(j, "state", d->state);
    cJSON_AddNumberToObject(j, "age_s", d->age_s);
    cJSON_AddNumberToObject(j, "idle_s", d->idle_s);
    cJSON_AddNumberToObject(j, "linger_left_s", d->linger_left_s);
    cJSON_AddNumberToObject(j, "trainer_pid", d->trainer_pid);
    cJSON_AddStringToObject(j, "coordinator", d->coordinator);
    cJSON_AddBoolToObject(j, "mesh_up", d->mesh_up);
    return o;
}

static void job_ls_table(const job_daemon_t *d, int n)
{
    printf("%-36s %-20s %9s %-9s %10s %8s %9s %9s %8s\n", "SOCKET", "JOB", "RANK", "STATE", "STEP",
           "AGE (s)", "IDLE (s)", "LEFT (s)", "PID");
    for (int i = 0; i < n; i++) {
        char rank[32];
        if (d[i].status != ZC_OK) {
            printf("%-36s %s: %s\n", d[i].socket, zc_status_name(d[i].status), d[i].msg);
            continue;
        }
        if (!d[i].has_job) {
            printf("%-36s %-20s\n", d[i].socket, "-");
            continue;
        }
        snprintf(rank, sizeof(rank), "%u/%u", d[i].rank, d[i].world);
        printf("%-36s %-20s %9s %-9s %10" PRIu64 " %8.0f %9.0f %9.0f %8d\n", d[i].socket,
               d[i].job_id, rank, d[i].state, d[i].step, d[i].age_s, d[i].idle_s,
               d[i].linger_left_s, (int)d[i].trainer_pid);
    }
}

static int job_ls(const job_opts_t *o, job_daemon_t *d, int n)
{
    cJSON *root, *arr;
    int rc;

    for (int i = 0; i < n; i++) {
        job_list_one(&d[i], o->timeout_ms);
    }
    rc = job_exit_of(d, n);
    if (!o->json) {
        job_ls_table(d, n);
        return rc;
    }
    root = job_json_root("job ls");
    arr = cJSON_AddArrayToObject(root, "daemons");
    for (int i = 0; i < n; i++) {
        cJSON_AddItemToArray(arr, job_ls_json_one(&d[i]));
    }
    return job_print_json(root) != JOB_EXIT_OK ? JOB_EXIT_DAEMON : rc;
}

/* ---- job end ------------------------------------------------------------------------------- */

typedef struct job_end_arg {
    job_daemon_t *d;
    const job_opts_t *o;
} job_end_arg_t;

/* One daemon's JobEnd (a thread of its own: at world > 1 a final checkpoint needs them all). */
static void *job_end_one(void *arg)
{
    job_end_arg_t *a = arg;
    job_daemon_t *d = a->d;
    zc_job_end_params_t p = {.field_mask = ZC_JOB_END_FIELD_TIMEOUT_MS,
                             .timeout_ms = a->o->timeout_ms};
    zc_session_t *s = job_open(d, a->o->timeout_ms);

    if (s == NULL) {
        return NULL;
    }
    if (a->o->checkpoint != NULL) {
        p.field_mask |= ZC_JOB_END_FIELD_CHECKPOINT_DIR;
        p.checkpoint_dir = a->o->checkpoint;
    }
    d->res.field_mask = ZC_JOB_END_FIELD_RESULT;
    d->status = zc_session_job_end(s, d->job_id, &p, &d->res);
    if (d->status == ZC_ERR_NOT_FOUND && a->o->checkpoint == NULL) {
        d->status = ZC_OK; /* it listed the job: a peer's END ended it meanwhile */
        d->already = 1;
    } else if (d->status != ZC_OK) {
        snprintf(d->msg, sizeof(d->msg), "%s", zc_last_error());
    } else {
        snprintf(d->checkpoint, sizeof(d->checkpoint), "%s", d->res.checkpoint);
    }
    zc_session_close(s);
    return NULL;
}

/* Run job_end_one on every daemon marked end, at once. */
static void job_end_run(const job_opts_t *o, job_daemon_t *d, int n)
{
    pthread_t th[JOB_MAX_DAEMONS];
    job_end_arg_t args[JOB_MAX_DAEMONS];
    int started[JOB_MAX_DAEMONS] = {0};

    for (int i = 0; i < n; i++) {
        args[i] = (job_end_arg_t){&d[i], o};
        if (d[i].end && pthread_create(&th[i], NULL, job_end_one, &args[i]) == 0) {
            started[i] = 1;
        } else if (d[i].end) {
            job_end_one(&args[i]); /* no thread: in turn */
        }
    }
    for (int i = 0; i < n; i++) {
        if (started[i]) {
            pthread_join(th[i], NULL);
        }
    }
}

static cJSON *job_end_json_one(const job_daemon_t *d)
{
    cJSON *o = cJSON_CreateObject();

    cJSON_AddStringToObject(o, "socket", d->socket);
    cJSON_AddStringToObject(o, "job_id", d->job_id);
    cJSON_AddNumberToObject(o, "rank", d->rank);
    cJSON_AddNumberToObject(o, "world", d->world);
    if (d->status != ZC_OK) {
        cJSON_AddStringToObject(o, "error", zc_status_name(d->status));
        cJSON_AddStringToObject(o, "message", d->msg);
        return o;
    }
    cJSON_AddBoolToObject(o, "already_ended", d->already);
    cJSON_AddNumberToObject(o, "step", (double)(d->already ? d->step : d->res.step));
    if (d->checkpoint[0] != '\0') {
        cJSON_AddStringToObject(o, "checkpoint", d->checkpoint);
    } else {
        cJSON_AddNullToObject(o, "checkpoint");
    }
    cJSON_AddBoolToObject(o, "peers_told", !d->already && d->res.peers_told);
    return o;
}

static void job_end_print(const job_daemon_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (!d[i].end) {
            continue;
        }
        if (d[i].status != ZC_OK) {
            fprintf(stderr, "zeroctl: %s: %s\n", d[i].socket, d[i].msg);
        } else if (d[i].already) {
            printf("%s: job '%s' (rank %u of %u) had ended already (its mesh told it)\n",
                   d[i].socket, d[i].job_id, d[i].rank, d[i].world);
        } else {
            printf("%s: job '%s' (rank %u of %u) ended at step %" PRIu64 "%s%s%s\n", d[i].socket,
                   d[i].job_id, d[i].rank, d[i].world, d[i].res.step,
                   d[i].checkpoint[0] ? "; final checkpoint " : "", d[i].checkpoint,
                   d[i].res.peers_told ? "; its other daemons told" : "");
        }
    }
}

/* A job of world > 1 ended on fewer of its daemons than its world, none of whose mesh was up:
 * its other daemons keep it until job_linger. Say so. */
static void job_end_note(const job_daemon_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        int ended = 0, told = 0, first = 1;
        for (int k = 0; k < n && first; k++) {
            first = !(k < i && d[k].end && strcmp(d[k].job_id, d[i].job_id) == 0);
        }
        if (!d[i].end || !first || d[i].world <= 1) {
            continue;
        }
        for (int k = 0; k < n; k++) {
            if (d[k].end && d[k].status == ZC_OK && strcmp(d[k].job_id, d[i].job_id) == 0) {
                ended++;
                told |= d[k].already || d[k].res.peers_told;
            }
        }
        if (!told && ended < (int)d[i].world) {
            fprintf(stderr,
                    "zeroctl: note: job '%s' has %u daemons; %d of them were asked, and its mesh "
                    "was down: the others keep it until job_linger (end it there too)\n",
                    d[i].job_id, d[i].world, ended);
        }
    }
}

/* Which daemons hold the job (or any, --all); 0 when none does. */
static int job_end_mark(const job_opts_t *o, job_daemon_t *d, int n)
{
    int marked = 0;

    for (int i = 0; i < n; i++) {
        job_list_one(&d[i], o->timeout_ms < JOB_LS_TIMEOUT_MS ? o->timeout_ms : JOB_LS_TIMEOUT_MS);
        if (d[i].status == ZC_OK && d[i].has_job &&
            (o->all || strcmp(d[i].job_id, o->job_id) == 0)) {
            d[i].end = 1;
            marked++;
        } else if (d[i].status != ZC_OK) {
            fprintf(stderr, "zeroctl: %s: %s\n", d[i].socket, d[i].msg);
        }
    }
    return marked;
}

static int job_end(const job_opts_t *o, job_daemon_t *d, int n)
{
    cJSON *root, *arr;
    int rc;

    if (job_end_mark(o, d, n) == 0) {
        rc = job_exit_of(d, n);
        if (o->all) {
            printf("no job to end on the %d daemon%s asked\n", n, n == 1 ? "" : "s");
            return rc;
        }
        zctl_error(ZC_ERR_NOT_FOUND, "no daemon of the %d asked holds job '%s' (zeroctl job ls)", n,
                   o->job_id);
        return rc == JOB_EXIT_OK ? JOB_EXIT_DAEMON : rc;
    }
    job_end_run(o, d, n);
    rc = job_exit_of(d, n);
    job_end_note(d, n);
    if (!o->json) {
        job_end_print(d, n);
        return rc;
    }
    root = job_json_root("job end");
    arr = cJSON_AddArrayToObject(root, "daemons");
    for (int i = 0; i < n; i++) {
        if (d[i].end) {
            cJSON_AddItemToArray(arr, job_end_json_one(&d[i]));
        }
    }
    return job_print_json(root) != JOB_EXIT_OK ? JOB_EXIT_DAEMON : rc;
}

/* ---- command line -------------------------------------------------------------------------- */

static int job_parse_timeout(const char *arg, int *ms_p)
{
    char *end = NULL;
    long v = strtol(arg, &end, 10);

    if (end == arg || *end != '\0' || v <= 0 || v > 3600L * 1000L) {
        zctl_usage_error("zeroctl job --help",
                         "--timeout '%s' is not a number of milliseconds in 1..3600000", arg);
        return -1;
    }
    *ms_p = (int)v;
    return 0;
}

/* Options after `job`: into o; -1 to go on, else the exit status. */
static int job_parse(int argc, char **argv, job_opts_t *o)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"dir", required_argument, NULL, 'd'},
        {"timeout", required_argument, NULL, 't'},
        {"all", no_argument, NULL, 'a'},
        {"checkpoint", required_argument, NULL, 'c'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    optind = 1;
    opterr = 0; /* zctl_getopt_error says it, under --json as JSON too */
    while ((c = getopt_long(argc, argv, ":s:t:jh", longopts, NULL)) != -1) {
        if (c == 's' && o->n_sockets < JOB_MAX_DAEMONS) {
            o->sockets[o->n_sockets++] = optarg;
        } else if (c == 'd') {
            o->dir = optarg;
        } else if (c == 't') {
            if (job_parse_timeout(optarg, &o->timeout_ms) != 0) {
                return JOB_EXIT_USAGE;
            }
        } else if (c == 'a') {
            o->all = 1;
        } else if (c == 'c') {
            o->checkpoint = optarg;
        } else if (c == 'j') {
            o->json = 1;
            zctl_set_json(1);
        } else if (c == 'h') {
            job_usage(stdout);
            return JOB_EXIT_OK;
        } else {
            return zctl_getopt_error(c, argv, "zeroctl job --help");
        }
    }
    return -1;
}

/* The subcommand and its operands; -1 to go on, else the exit status. */
static int job_check(int argc, char **argv, job_opts_t *o, const char **cmd_p)
{
    const char *cmd = optind < argc ? argv[optind] : NULL;
    int operands = argc - optind - 1;

    if (cmd == NULL || (strcmp(cmd, "ls") != 0 && strcmp(cmd, "end") != 0)) {
        zctl_error(ZC_ERR_INVALID, "job: %s%s%s (expected ls or end); try 'zeroctl job --help'",
                   cmd == NULL ? "missing COMMAND" : "unknown command '", cmd == NULL ? "" : cmd,
                   cmd == NULL ? "" : "'");
        return JOB_EXIT_USAGE;
    }
    zctl_set_command(strcmp(cmd, "ls") == 0 ? "job ls" : "job end");
    if (strcmp(cmd, "ls") == 0 && (operands > 0 || o->all || o->checkpoint != NULL)) {
        zctl_error(ZC_ERR_INVALID, "job ls takes no JOB, --all or --checkpoint");
        return JOB_EXIT_USAGE;
    }
    if (strcmp(cmd, "end") == 0) {
        if ((operands == 1) == (o->all != 0) || operands > 1) {
            zctl_error(ZC_ERR_INVALID, "job end needs exactly one of JOB and --all");
            return JOB_EXIT_USAGE;
        }
        o->job_id = operands == 1 ? argv[optind + 1] : NULL;
    }
    *cmd_p = cmd;
    return -1;
}

int zeroctl_job_main(int argc, char **argv, int json, const char *socket_path, int timeout_ms)
{
    job_opts_t o = {.json = json, .timeout_ms = timeout_ms};
    const char *cmd = NULL;
    job_daemon_t *d;
    int rc, n = 0;

    if (socket_path != NULL) {
        o.sockets[o.n_sockets++] = socket_path;
    }
    rc = job_parse(argc, argv, &o);
    if (rc < 0) {
        rc = job_check(argc, argv, &o, &cmd);
    }
    if (rc >= 0) {
        return rc;
    }
    if (o.timeout_ms == 0) {
        o.timeout_ms = strcmp(cmd, "ls") == 0 ? JOB_LS_TIMEOUT_MS : JOB_END_TIMEOUT_MS;
    }
    d = calloc(JOB_MAX_DAEMONS, sizeof(*d));
    if (d == NULL) {
        zctl_error(ZC_ERR_NO_MEMORY, "out of memory");
        return JOB_EXIT_DAEMON;
    }
    rc = job_targets(&o, d, &n);
    if (rc == JOB_EXIT_OK) {
        rc = strcmp(cmd, "ls") == 0 ? job_ls(&o, d, n) : job_end(&o, d, n);
    }
    free(d);
    return rc;
}
