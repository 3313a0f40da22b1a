/*
 * zeroctl status: what a daemon holds and how fast its job goes.
 *
 *   zeroctl [--json] [-t MS] -s SOCKET status [-l SECONDS]   one daemon (or $ZEROD_SOCKET's)
 *   zeroctl [--json] [-t MS] [--dir DIR] status [-l SECONDS] every daemon of DIR (/run/zerod)
 *
 * The host table has one row per socket of the directory, asked all at once, each within the
 * timeout (a stopped daemon makes its row an error, not the command hang); an unreachable daemon
 * is a row with its error. -l redraws every SECONDS until SIGINT or SIGTERM: the screen cleared
 * (ANSI) before each frame, or under --json one object per line. The signals stay blocked while
 * a frame is asked for, so one ends the loop after that frame, within the timeout.
 */
#define _GNU_SOURCE
#include "status_cmd.h"

#include "cli.h"
#include "zerod/zc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ZST_TIMEOUT_MS      10000 /* one daemon */
#define ZST_HOST_TIMEOUT_MS 5000  /* each daemon of the host table */
#define ZST_MIB             (1024.0 * 1024.0)

/* One daemon asked: what it said, or why not. Its strings are its session's: the session stays
 * open until the daemon is printed (zst_release). */
typedef struct zst_daemon {
    char socket[ZCTL_SOCKET_MAX]; /* the socket asked (the host table) */
    const char *path;             /* the socket asked; NULL: $ZEROD_SOCKET, else zc.h's */
    int timeout_ms;
    zc_session_t *s;
    int opened; /* the session opened (a failure after it is the daemon's) */
    int status; /* ZC_OK, or why not (msg) */
    char msg[512];
    zc_daemon_status_t st;
    zc_memory_term_t *memory; /* [st.n_memory] */
    int has_info;             /* ji: JobList's view of the job (state, trainer) */
    zc_job_info_t ji;
} zst_daemon_t;

/* ---- asking ---------------------------------------------------------------------------- */

/* CLOCK_MONOTONIC in milliseconds: the deadlines of a frame */
static uint64_t zst_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* What is left of a deadline for a libzc call: at least 1 ms (a call then fails at once). */
static int zst_left_ms(uint64_t deadline_ms)
{
    uint64_t now = zst_now_ms();

    return now < deadline_ms ? (int)(deadline_ms - now) : 1;
}

/* Status, the memory terms and the job's state, on d's open session. */
static int zst_fetch(zst_daemon_t *d, uint64_t deadline_ms)
{
    uint32_t n_jobs = 0;
    int status;

    d->st.field_mask = ZC_DAEMON_STATUS_FIELD_DAEMON | ZC_DAEMON_STATUS_FIELD_ACTIVITY |
                       ZC_DAEMON_STATUS_FIELD_JOB | ZC_DAEMON_STATUS_FIELD_MEMORY |
                       ZC_DAEMON_STATUS_FIELD_RATE | ZC_DAEMON_STATUS_FIELD_DEVICE |
                       ZC_DAEMON_STATUS_FIELD_REPLICA | ZC_DAEMON_STATUS_FIELD_WAIT;
    status = zc_session_daemon_status(d->s, zst_left_ms(deadline_ms), &d->st);
    if (status != ZC_OK) {
        return status;
    }
    d->memory = calloc(d->st.n_memory > 0 ? d->st.n_memory : 1, sizeof(*d->memory));
    if (d->memory == NULL) {
        return ZC_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < d->st.n_memory; i++) {
        d->memory[i].field_mask = ZC_MEMORY_TERM_FIELD_MEASURED | ZC_MEMORY_TERM_FIELD_FORMULA;
        status = zc_session_memory_term(d->s, i, &d->memory[i]);
        if (status != ZC_OK) {
            return status;
        }
    }
    if (!d->st.has_job) {
        return ZC_OK;
    }
    status = zc_session_job_list(d->s, zst_left_ms(deadline_ms), &n_jobs);
    if (status == ZC_OK && n_jobs > 0) {
        d->ji.field_mask = ZC_JOB_INFO_FIELD_JOB | ZC_JOB_INFO_FIELD_LIFE;
        status = zc_session_job_info(d->s, 0, &d->ji);
        d->has_info = status == ZC_OK;
    }
    return status;
}

/* Ask d's daemon, within d->timeout_ms in all. */
static void zst_query(zst_daemon_t *d)
{
    zc_open_params_t op = {.field_mask = ZC_OPEN_FIELD_TIMEOUT_MS | ZC_OPEN_FIELD_CONTROL,
                           .timeout_ms = d->timeout_ms,
                           .control = 1};
    uint64_t deadline_ms = zst_now_ms() + (uint64_t)d->timeout_ms;

    if (d->path != NULL) {
        op.field_mask |= ZC_OPEN_FIELD_SOCKET_PATH;
        op.socket_path = d->path;
    }
    d->status = zc_session_open(&op, &d->s);
    if (d->status == ZC_OK) {
        d->opened = 1;
        d->status = zst_fetch(d, deadline_ms);
    }
    if (d->status == ZC_ERR_NO_MEMORY && zc_last_error()[0] == '\0') {
        snprintf(d->msg, sizeof(d->msg), "out of memory");
    } else if (d->status != ZC_OK) {
        snprintf(d->msg, sizeof(d->msg), "%s", zc_last_error()); /* this thread's */
    }
}

static void *zst_query_thread(void *arg)
{
    zst_query(arg);
    return NULL;
}

/* Every daemon at once: a thread each (in turn where none can be had). */
static void zst_query_all(zst_daemon_t *d, int n)
{
    pthread_t th[ZCTL_MAX_DAEMONS];
    int started[ZCTL_MAX_DAEMONS] = {0};

    for (int i = 0; i < n; i++) {
        started[i] = pthread_create(&th[i], NULL, zst_query_thread, &d[i]) == 0;
        if (!started[i]) {
            zst_query(&d[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        if (started[i]) {
            pthread_join(th[i], NULL);
        }
    }
}

static void zst_release(zst_daemon_t *d)
{
    zc_session_close(d->s);
    d->s = NULL;
    free(d->memory);
    d->memory = NULL;
}

/* ---- cells ----------------------------------------------------------------------------- */

static const char *zst_steps_cell(const zc_daemon_status_t *r, char *buf, size_t len)
{
    if (!r->has_job) {
        return "-";
    }
    snprintf(buf, len, "%.2f", r->steps_per_s);
    return buf;
}

/* samples/s: the job's (every rank's), from the step rate and train_batch_size */
static const char *zst_samples_cell(const zc_daemon_status_t *r, char *buf, size_t len)
{
    if (!r->has_job || r->train_batch_size == 0) {
        return "-";
    }
    snprintf(buf, len, "%.1f", r->steps_per_s * r->train_batch_size);
    return buf;
}

/* replication = buddy: "of rank O at step S; ours on rank B" */
static const char *zst_replica_cell(const zc_daemon_status_t *r, char *buf, size_t len)
{
    if (!r->has_job || !r->replication) {
        return "off";
    }
    if (!r->replica_valid) {
        snprintf(buf, len, "of rank %u: none yet; ours on rank %u", r->replica_owner,
                 r->replica_buddy);
        return buf;
    }
    snprintf(buf, len, "of rank %u at step %" PRIu64 "; ours on rank %u", r->replica_owner,
             r->replica_step, r->replica_buddy);
    return buf;
}

/* One figure of a cell: GB/s, or "-" for none. */
static const char *zst_gbps(double bytes_per_s, char *buf, size_t len)
{
    if (bytes_per_s <= 0) {
        return "-";
    }
    snprintf(buf, len, "%.2f", bytes_per_s * 1e-9);
    return buf;
}

/* "RS/AG" over the transfer time; AG "shared" when the all-gather is a shared params region's
 * barrier (no bytes, no bandwidth: its time is all wait) */
static const char *zst_busbw_cell(const zc_daemon_status_t *r, char *buf, size_t len)
{
    char rs[24], ag[24];
    bool shared = r->params_shared && r->world > 1;

    if (!r->has_job || (r->busbw_reduce_scatter <= 0 && r->busbw_all_gather <= 0 && !shared)) {
        return "-";
    }
    snprintf(buf, len, "%s/%s", zst_gbps(r->busbw_reduce_scatter, rs, sizeof(rs)),
             shared ? "shared" : zst_gbps(r->busbw_all_gather, ag, sizeof(ag)));
    return buf;
}

/* "RS/AG": how long the last step's collectives waited for the other ranks, ms */
static const char *zst_wait_cell(const zc_daemon_status_t *r, char *buf, size_t len)
{
    if (!r->has_job || r->world < 2 ||
        (r->wait_reduce_scatter_s <= 0 && r->wait_all_gather_s <= 0 &&
         r->busbw_reduce_scatter <= 0)) {
        return "-";
    }
    snprintf(buf, len, "%.1f/%.1f", r->wait_reduce_scatter_s * 1e3, r->wait_all_gather_s * 1e3);
    return buf;
}

static const char *zst_memory_cell(const zst_daemon_t *d, char *buf, size_t len)
{
    double used = 0, formula = 0;

    if (!d->st.has_job) {
        return "-";
    }
    for (uint32_t i = 0; i < d->st.n_memory; i++) {
        used += (double)d->memory[i].bytes;
        formula += (double)d->memory[i].formula_bytes;
    }
    snprintf(buf, len, "%.2f/%.2f", used / ZST_MIB, formula / ZST_MIB);
    return buf;
}

/* ---- JSON ------------------------------------------------------------------------------ */

static void zst_json_rate(cJSON *job, const zst_daemon_t *d)
{
    const zc_daemon_status_t *r = &d->st;
    cJSON *bw;

    cJSON_AddNumberToObject(job, "steps_per_s", r->steps_per_s);
    cJSON_AddNumberToObject(job, "train_batch_size", r->train_batch_size);
    if (r->train_batch_size > 0) {
        cJSON_AddNumberToObject(job, "samples_per_s", r->steps_per_s * r->train_batch_size);
    } else {
        cJSON_AddNullToObject(job, "samples_per_s");
    }
    bw = cJSON_AddObjectToObject(job, "busbw_bytes_per_s");
    cJSON_AddNumberToObject(bw, "reduce_scatter", r->busbw_reduce_scatter);
    if (r->params_shared) { /* a barrier: no bandwidth */
        cJSON_AddNullToObject(bw, "all_gather");
    } else {
        cJSON_AddNumberToObject(bw, "all_gather", r->busbw_all_gather);
    }
    bw = cJSON_AddObjectToObject(job, "wait_s");
    cJSON_AddNumberToObject(bw, "reduce_scatter", r->wait_reduce_scatter_s);
    cJSON_AddNumberToObject(bw, "all_gather", r->wait_all_gather_s);
    cJSON_AddBoolToObject(job, "params_shared", r->params_shared);
    if (d->has_info) {
        cJSON_AddStringToObject(job, "state", d->ji.state);
    } else {
        cJSON_AddNullToObject(job, "state");
    }
    cJSON_AddNumberToObject(job, "trainer_pid", d->has_info ? d->ji.trainer_pid : 0);
}

static void zst_json_job(cJSON *o, const zst_daemon_t *d)
{
    const zc_daemon_status_t *r = &d->st;
    cJSON *job;
    char hash[32];

    cJSON_AddBoolToObject(o, "has_job", r->has_job);
    if (!r->has_job) {
        cJSON_AddNullToObject(o, "job");
        return;
    }
    job = cJSON_AddObjectToObject(o, "job");
    cJSON_AddStringToObject(job, "id", r->job_id);
    cJSON_AddNumberToObject(job, "rank", r->rank);
    cJSON_AddNumberToObject(job, "world", r->world);
    cJSON_AddNumberToObject(job, "stage", r->stage);
    cJSON_AddStringToObject(job, "dtype", zc_dtype_name(r->dtype));
    cJSON_AddNumberToObject(job, "step", (double)r->step);
    cJSON_AddNumberToObject(job, "skipped_steps", (double)r->skipped_steps);
    cJSON_AddNumberToObject(job, "loss_scale", r->loss_scale);
    cJSON_AddNumberToObject(job, "grad_norm", r->grad_norm);
    cJSON_AddBoolToObject(job, "trainer_attached", r->trainer_attached);
    cJSON_AddNumberToObject(job, "param_numel", (double)r->param_numel);
    /* a 64-bit identifier: a string, since JSON numbers are doubles */
    snprintf(hash, sizeof(hash), "0x%016" PRIx64, r->layout_hash);
    cJSON_AddStringToObject(job, "layout_hash", hash);
    cJSON_AddStringToObject(job, "collectives", r->collectives);
    zst_json_rate(job, d);
    if (r->replication) { /* replication = buddy; the key is absent with it off */
        cJSON *rep = cJSON_AddObjectToObject(job, "replica");
        cJSON_AddNumberToObject(rep, "owner", r->replica_owner);
        cJSON_AddBoolToObject(rep, "valid", r->replica_valid);
        cJSON_AddNumberToObject(rep, "step", (double)r->replica_step);
        cJSON_AddNumberToObject(rep, "buddy", r->replica_buddy);
    }
}

/* What the daemon said, into o; with_socket: the socket it listens on too. */
static void zst_json_fill(cJSON *o, const zst_daemon_t *d, int with_socket)
{
    const zc_daemon_status_t *r = &d->st;
    cJSON *mem;

    cJSON_AddStringToObject(o, "version", r->version);
    cJSON_AddNumberToObject(o, "pid", r->pid);
    cJSON_AddStringToObject(o, "device", r->device);
    if (with_socket) {
        cJSON_AddStringToObject(o, "socket", r->socket);
    }
    cJSON_AddNumberToObject(o, "uptime_s", r->uptime_s);
    cJSON_AddNumberToObject(o, "heap_in_use_bytes", (double)r->heap_in_use);
    if (strncmp(r->device, "cuda:", 5) == 0) {
        cJSON_AddNumberToObject(o, "device_free_bytes", (double)r->device_free_bytes);
        cJSON_AddNumberToObject(o, "device_total_bytes", (double)r->device_total_bytes);
        cJSON_AddBoolToObject(o, "mps", r->mps);
    }
    if (r->activity[0] != '\0') {
        cJSON_AddStringToObject(o, "activity", r->activity);
        cJSON_AddNumberToObject(o, "activity_s", r->activity_s);
    } else {
        cJSON_AddNullToObject(o, "activity");
        cJSON_AddNumberToObject(o, "activity_s", 0);
    }
    zst_json_job(o, d);
    mem = cJSON_AddArrayToObject(o, "memory");
    for (uint32_t i = 0; i < r->n_memory; i++) {
        const zc_memory_term_t *t = &d->memory[i];
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "name", t->name);
        cJSON_AddNumberToObject(m, "bytes", (double)t->bytes);
        cJSON_AddNumberToObject(m, "formula_bytes", (double)t->formula_bytes);
        cJSON_AddStringToObject(m, "formula", t->formula);
        cJSON_AddItemToArray(mem, m);
    }
}

/* The host table: {"schema_version", "command", "dir", "daemons": [{"socket", "error", ...}]},
 * "error" null or {"status", "message"}. */
static cJSON *zst_json_host(const char *dir, const zst_daemon_t *d, int n)
{
    cJSON *root = zctl_json_root("status"), *arr;

    cJSON_AddStringToObject(root, "dir", dir);
    arr = cJSON_AddArrayToObject(root, "daemons");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "socket", d[i].socket);
        if (d[i].status != ZC_OK) {
            cJSON_AddItemToObject(o, "error", zctl_json_error(d[i].status, d[i].msg));
        } else {
            cJSON_AddNullToObject(o, "error");
            zst_json_fill(o, &d[i], 0);
        }
        cJSON_AddItemToArray(arr, o);
    }
    return root;
}

/* ---- one daemon ------------------------------------------------------------------------ */

static void zst_job_table(const zst_daemon_t *d)
{
    const zc_daemon_status_t *r = &d->st;
    char buf[64];

    printf("%-20s %s\n", "job", r->job_id);
    printf("%-20s %u/%u\n", "rank/world", r->rank, r->world);
    printf("%-20s %u\n", "stage", r->stage);
    printf("%-20s %s\n", "dtype", zc_dtype_name(r->dtype));
    printf("%-20s %s\n", "trainer", r->trainer_attached ? "attached" : "detached");
    printf("%-20s %" PRIu64 "\n", "step", r->step);
    printf("%-20s %" PRIu64 "\n", "skipped steps", r->skipped_steps);
    printf("%-20s %g\n", "loss scale", r->loss_scale);
    if (r->grad_norm < 0) {
        printf("%-20s %s\n", "last grad norm", "not finite");
    } else {
        printf("%-20s %.6g\n", "last grad norm", r->grad_norm);
    }
    printf("%-20s %" PRIu64 "\n", "params (elements)", r->param_numel);
    printf("%-20s 0x%016" PRIx64 "\n", "layout hash", r->layout_hash);
    printf("%-20s %s\n", "collectives", r->collectives);
    printf("%-20s %s\n", "state", d->has_info ? d->ji.state : "-");
    printf("%-20s %s\n", "steps/s", zst_steps_cell(r, buf, sizeof(buf)));
    printf("%-20s %s\n", "samples/s", zst_samples_cell(r, buf, sizeof(buf)));
    printf("%-20s %s\n", "busbw rs/ag (GB/s)", zst_busbw_cell(r, buf, sizeof(buf)));
    printf("%-20s %s\n", "wait rs/ag (ms)", zst_wait_cell(r, buf, sizeof(buf)));
    printf("%-20s %s\n", "replica", zst_replica_cell(r, buf, sizeof(buf)));
}

static void zst_memory_table(const zst_daemon_t *d)
{
    uint64_t total = 0, total_formula = 0;

    if (d->st.n_memory == 0) {
        return;
    }
    printf("\n%-12s %16s %16s %10s  %s\n", "MEMORY", "MEASURED (B)", "FORMULA (B)", "MEAS (MiB)",
           "FORMULA");
    for (uint32_t i = 0; i < d->st.n_memory; i++) {
        const zc_memory_term_t *t = &d->memory[i];
        printf("%-12s %16" PRIu64 " %16" PRIu64 " %10.2f  %s\n", t->name, t->bytes,
               t->formula_bytes, (double)t->bytes / ZST_MIB, t->formula);
        total += t->bytes;
        total_formula += t->formula_bytes;
    }
    printf("%-12s %16" PRIu64 " %16" PRIu64 " %10.2f\n", "total", total, total_formula,
           (double)total / ZST_MIB);
}

static void zst_table(const zst_daemon_t *d)
{
    const zc_daemon_status_t *r = &d->st;

    printf("%-20s %s\n", "FIELD", "VALUE");
    printf("%-20s %s\n", "version", r->version);
    printf("%-20s %d\n", "pid", r->pid);
    printf("%-20s %s\n", "device", r->device);
    printf("%-20s %s\n", "socket", r->socket);
    printf("%-20s %.1f\n", "uptime (s)", r->uptime_s);
    printf("%-20s %" PRIu64 "\n", "heap in use (B)", r->heap_in_use);
    if (strncmp(r->device, "cuda:", 5) == 0) {
        if (r->device_total_bytes > 0) {
            printf("%-20s %.2f GiB free of %.2f GiB\n", "device memory",
                   (double)r->device_free_bytes / (1024.0 * ZST_MIB),
                   (double)r->device_total_bytes / (1024.0 * ZST_MIB));
        }
        printf("%-20s %s\n", "MPS",
               r->mps ? "running"
                      : "not running: the trainer's and zerod's kernels time-slice the GPU");
    }
    if (r->activity[0] != '\0') {
        printf("%-20s %s (%.1f s)\n", "busy with", r->activity, r->activity_s);
    } else {
        printf("%-20s %s\n", "busy with", "nothing (waiting for work)");
    }
    if (!r->has_job) {
        printf("%-20s %s\n", "job", "-");
    } else {
        zst_job_table(d);
    }
    zst_memory_table(d);
}

/* One frame of one daemon: -s SOCKET, else $ZEROD_SOCKET (else zc.h's default). */
static int zst_single(const zeroctl_status_opts_t *o)
{
    zst_daemon_t d = {.path = o->socket_path,
                      .timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : ZST_TIMEOUT_MS};
    cJSON *root;
    int rc = ZCTL_EXIT_OK;

    zst_query(&d);
    if (d.status != ZC_OK) {
        /* a session that did not open is unreachable (7) or a bad path (2) */
        zctl_error_json(o->loop_s > 0, d.status, "%s", d.msg);
        rc = d.opened ? ZCTL_EXIT_DAEMON
                      : (d.status == ZC_ERR_INVALID ? ZCTL_EXIT_USAGE : zctl_exit_of(d.status));
    } else if (o->json) {
        root = zctl_json_root("status");
        zst_json_fill(root, &d, 1);
        rc = zctl_print_json(root, o->loop_s > 0);
    } else {
        zst_table(&d);
    }
    zst_release(&d);
    return rc;
}

/* ---- every daemon of the host ---------------------------------------------------------- */

static void zst_host_row(const zst_daemon_t *d, int w_sock, int w_dev, int w_job)
{
    const zc_daemon_status_t *r = &d->st;
    char rank[32] = "-", pid[16] = "-", step[24] = "-", sps[32], sam[32], bw[48], wt[48], mem[48];
    char rep[48] = "-"; /* the replica held: "OWNER@STEP" */
    const char *state = r->has_job ? "-" : "idle";

    if (d->status != ZC_OK) {
        printf("%-*s %s: %s\n", w_sock, d->socket, zc_status_name(d->status), d->msg);
        return;
    }
    if (r->has_job) {
        snprintf(rank, sizeof(rank), "%u/%u", r->rank, r->world);
        snprintf(step, sizeof(step), "%" PRIu64, r->step);
        state = d->has_info ? d->ji.state : "-";
    }
    if (r->has_job && r->replication && r->replica_valid) {
        snprintf(rep, sizeof(rep), "%u@%" PRIu64, r->replica_owner, r->replica_step);
    } else if (r->has_job && r->replication) {
        snprintf(rep, sizeof(rep), "%u@none", r->replica_owner);
    }
    if (d->has_info && d->ji.trainer_pid > 0) {
        snprintf(pid, sizeof(pid), "%d", (int)d->ji.trainer_pid);
    }
    printf("%-*s %-*s %8d %-*s %7s %-9s %10s %8s %10s %18s %15s %18s %8s %12s\n", w_sock, d->socket,
           w_dev, r->device, (int)r->pid, w_job, r->has_job ? r->job_id : "-", rank, state, step,
           zst_steps_cell(r, sps, sizeof(sps)), zst_samples_cell(r, sam, sizeof(sam)),
           zst_busbw_cell(r, bw, sizeof(bw)), zst_wait_cell(r, wt, sizeof(wt)),
           zst_memory_cell(d, mem, sizeof(mem)), pid, rep);
}

static int zst_width(int w, const char *s)
{
    int len = (int)strlen(s);
    return len > w ? len : w;
}

/* One row per daemon, its columns as wide as their widest cell; units in the header. */
static void zst_host_table(const zst_daemon_t *d, int n)
{
    int w_sock = 6, w_dev = 6, w_job = 3;

    for (int i = 0; i < n; i++) {
        w_sock = zst_width(w_sock, d[i].socket);
        if (d[i].status == ZC_OK) {
            w_dev = zst_width(w_dev, d[i].st.device);
            w_job = zst_width(w_job, d[i].st.has_job ? d[i].st.job_id : "-");
        }
    }
    printf("%-*s %-*s %8s %-*s %7s %-9s %10s %8s %10s %18s %15s %18s %8s %12s\n", w_sock, "SOCKET",
           w_dev, "DEVICE", "PID", w_job, "JOB", "RANK", "STATE", "STEP", "STEPS/S", "SAMPLES/S",
           "BUSBW RS/AG (GB/s)", "WAIT RS/AG (ms)", "MEM/FORMULA (MiB)", "TRAINER", "REPLICA@STEP");
    for (int i = 0; i < n; i++) {
        zst_host_row(&d[i], w_sock, w_dev, w_job);
    }
}

/* 7 when a daemon was unreachable, else 1 when one failed, else 0 */
static int zst_host_exit(const zst_daemon_t *d, int n)
{
    int rc = ZCTL_EXIT_OK;

    for (int i = 0; i < n; i++) {
        int one = zctl_exit_of(d[i].status);
        rc = one == ZCTL_EXIT_UNREACHABLE || rc == ZCTL_EXIT_UNREACHABLE ? ZCTL_EXIT_UNREACHABLE
             : one != ZCTL_EXIT_OK                                       ? one
                                                                         : rc;
    }
    return rc;
}

/* The daemons of dir into d, each to be asked within timeout_ms; their count, or -1 reported. */
static int zst_host_targets(const zeroctl_status_opts_t *o, const char *dir, zst_daemon_t *d)
{
    char(*sockets)[ZCTL_SOCKET_MAX] = calloc(ZCTL_MAX_DAEMONS, ZCTL_SOCKET_MAX);
    int n;

    if (sockets == NULL) {
        zctl_error_json(o->loop_s > 0, ZC_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    n = zctl_scan_dir(dir, sockets, ZCTL_MAX_DAEMONS);
    if (n < 0) {
        zctl_error_json(o->loop_s > 0, ZC_ERR_UNREACHABLE,
                        "cannot read the socket directory %s: %s", dir, strerror(errno));
    } else if (n == 0) {
        zctl_error_json(o->loop_s > 0, ZC_ERR_UNREACHABLE,
                        "no daemon socket in %s (give -s SOCKET or --dir DIR)", dir);
        n = -1;
    }
    for (int i = 0; i < n; i++) {
        memcpy(d[i].socket, sockets[i], ZCTL_SOCKET_MAX);
        d[i].path = d[i].socket;
        d[i].timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : ZST_HOST_TIMEOUT_MS;
    }
    free(sockets);
    return n;
}

/* One frame of the host table. */
static int zst_host(const zeroctl_status_opts_t *o, const char *dir)
{
    zst_daemon_t *d = calloc(ZCTL_MAX_DAEMONS, sizeof(*d));
    int n, rc;

    if (d == NULL) {
        zctl_error_json(o->loop_s > 0, ZC_ERR_NO_MEMORY, "out of memory");
        return ZCTL_EXIT_DAEMON;
    }
    n = zst_host_targets(o, dir, d);
    if (n < 0) {
        free(d);
        return ZCTL_EXIT_UNREACHABLE;
    }
    zst_query_all(d, n);
    rc = zst_host_exit(d, n);
    if (o->json) {
        int prc = zctl_print_json(zst_json_host(dir, d, n), o->loop_s > 0);
        rc = prc != ZCTL_EXIT_OK ? prc : rc;
    } else {
        zst_host_table(d, n);
    }
    for (int i = 0; i < n; i++) {
        zst_release(&d[i]);
    }
    free(d);
    return rc;
}

/* ---- the loop -------------------------------------------------------------------------- */

/* Until the deadline (monotonic ms) or one of set; 1: a signal came. */
static int zst_wait_signal(const sigset_t *set, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = zst_now_ms(), ms = now < deadline_ms ? deadline_ms - now : 0;
        struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                              .tv_nsec = (long)(ms % 1000) * 1000000L};
        if (sigtimedwait(set, NULL, &ts) > 0) {
            return 1;
        }
        if (errno == EAGAIN) {
            return 0;
        }
        /* EINTR: a signal not in set, handled; wait on */
    }
}

/* One frame: the host table of dir, or (dir NULL) the one daemon. */
static int zst_frame(const zeroctl_status_opts_t *o, const char *dir)
{
    const char *env = getenv("ZEROD_SOCKET");
    char when[64] = "";
    time_t now = time(NULL);
    struct tm tm;

    if (o->loop_s > 0 && !o->json) {
        if (localtime_r(&now, &tm) != NULL) {
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        }
        /* home and clear (ANSI), whatever stdout is: the format never depends on a terminal */
        printf("\033[H\033[2JEvery %ds: zeroctl status (%s)   %s\n\n", o->loop_s,
               dir != NULL ? dir : (o->socket_path != NULL ? o->socket_path : env), when);
    }
    return dir != NULL ? zst_host(o, dir) : zst_single(o);
}

int zeroctl_status_main(const zeroctl_status_opts_t *o)
{
    const char *env = getenv("ZEROD_SOCKET");
    int host = o->socket_path == NULL && (o->dir != NULL || env == NULL || env[0] == '\0');
    char dflt[4096];
    const char *dir = !host            ? NULL
                      : o->dir != NULL ? o->dir
                                       : zctl_default_dir(0, dflt, sizeof(dflt));
    sigset_t set, old;
    int rc;

    if (o->loop_s == 0) {
        return zst_frame(o, dir);
    }
    /* blocked in every query thread too: taken by sigtimedwait between frames */
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    for (;;) {
        uint64_t next_ms = zst_now_ms() + (uint64_t)o->loop_s * 1000u;
        rc = zst_frame(o, dir);
        fflush(stdout);
        if (zst_wait_signal(&set, next_ms)) {
            break;
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
