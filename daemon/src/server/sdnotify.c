/*
 * The daemon's messages to its service manager (server/sdnotify.h). Two timers on the loop:
 *
 * - watchdog, every half $WATCHDOG_USEC: WATCHDOG=1, but only while the runner makes progress
 *   (the loop does, or the timer would not fire). The runner makes progress when one of these
 *   holds, checked at each tick:
 *     1. it beat within the last watchdog interval: it beats on every idle wake (the idle runner
 *        wakes at least every quarter interval for that), on entering and leaving a request,
 *        and whenever it publishes an activity ("forming the mesh", ...);
 *     2. it is inside one request (or the stop's teardown) that began less than the peer
 *        deadline ago: max(mesh_timeout, collective_timeout) + heartbeat_timeout. A collective,
 *        or the forming of a mesh, may legitimately wait that long for a slow or lost peer
 *        before its own deadline fails it; the daemon promises trainers the same bound
 *        (HelloReply's peer deadline);
 *     3. the request is a checkpoint save, load or wait, an export, or the stop's teardown
 *        (whose length grows with the shard and the disk, not with any deadline), and the
 *        threads other than the loop read or wrote bytes since the last tick (rchar + wchar of
 *        /proc/self/task/<tid>/io): a big write is slow but moves, a hung file system does not.
 *   Otherwise the pings stop (one ERROR says why) and, after WatchdogSec, systemd kills the
 *   daemon with SIGABRT -- its core shows where the runner hangs -- and restarts it.
 * - tick, every second: a STATUS= that the step rate limit held back, and during a stop that
 *   the runner still works on (a request to finish, a large job to tear down),
 *   EXTEND_TIMEOUT_USEC= under the same progress rule.
 */
#define _GNU_SOURCE
#include "server/sdnotify.h"

#include "zs/log.h"
#include "zs/time.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef ZD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#define ZD_SDNOTIFY_TICK_MS 1000u
#define ZD_SDNOTIFY_NO_IO   UINT64_MAX

struct zd_sdnotify {
    uv_timer_t watchdog;
    uv_timer_t tick;
    int open_handles;
    zd_runner_t *runner;
    const char *socket_path;
    uint64_t wd_ns, peer_deadline_ns;
    char status[512];   /* the last STATUS= sent */
    char key[256];      /* its job and state, without the step */
    uint64_t status_ns; /* when it went out */
    char last_job[ZD_JOB_ID_MAX];
    uint64_t last_step;
    bool stopping;
    bool wedged;            /* the watchdog holds its pings back */
    uint64_t wd_io, ext_io; /* zd_sdnotify_io_bytes at the last tick of each timer */
};

static void zd_sdnotify_send(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void zd_sdnotify_send(const char *fmt, ...)
{
#ifdef ZD_HAVE_SYSTEMD
    char msg[768];
    va_list ap;
    int rc;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    rc = sd_notify(0, msg); /* a datagram, sent with MSG_NOSIGNAL */
    if (rc < 0) {
        zs_debug(ZS_SUB_MAIN, "sd_notify(%s): %s", msg, strerror(-rc));
    }
#else
    (void)fmt;
#endif
}

uint64_t zd_sdnotify_watchdog_ns(void)
{
#ifdef ZD_HAVE_SYSTEMD
    uint64_t usec = 0;

    if (getenv("NOTIFY_SOCKET") != NULL && sd_watchdog_enabled(0, &usec) > 0) {
        return usec * ZS_NSEC_PER_USEC;
    }
#endif
    return 0;
}

/* ---- STATUS= ------------------------------------------------------------------------------- */

static uint64_t zd_sdnotify_job_bytes(const zd_runner_status_t *st)
{
    uint64_t sum = 0;

    for (int i = 0; st->has_job && i < ZD_MEM_COUNT; i++) {
        sum += st->job.mem_bytes[i];
    }
    return sum;
}

/* "job J step S STATE" (and the rank in a mesh); key: the same without the step. */
static void zd_sdnotify_describe(zd_sdnotify_t *n, const zd_runner_status_t *st, char *key,
                                 size_t klen, char *text, size_t tlen)
{
    const zd_job_status_t *j = &st->job;
    char rank[64] = "";

    if (st->has_job) {
        snprintf(n->last_job, sizeof(n->last_job), "%s", j->job_id);
        n->last_step = j->step;
    }
    if (n->stopping) {
        snprintf(key, klen, "stopping");
        if (st->has_job) {
            snprintf(text, tlen, "stopping: ending job %s at step %llu", j->job_id,
                     (unsigned long long)j->step);
        } else {
            snprintf(text, tlen, "stopping");
        }
    } else if (!st->has_job) {
        snprintf(key, klen, "none");
        if (n->last_job[0] != '\0') {
            snprintf(text, tlen, "job %s step %llu ended; serving %s, no job", n->last_job,
                     (unsigned long long)n->last_step, n->socket_path);
        } else {
            snprintf(text, tlen, "serving %s, no job", n->socket_path);
        }
    } else {
        const char *state = j->trainer_attached ? "training" : "lingering (no trainer)";

        if (j->world > 1) {
            snprintf(rank, sizeof(rank), ", rank %u of %u", j->rank, j->world);
        }
        snprintf(key, klen, "%s|%s", j->job_id, state);
        snprintf(text, tlen, "job %s step %llu %s%s", j->job_id, (unsigned long long)j->step, state,
                 rank);
    }
}

/* STATUS= when the job changed; a change of the step alone at most every ZD_SDNOTIFY_STEP_NS. */
static void zd_sdnotify_status(zd_sdnotify_t *n)
{
    zd_runner_status_t st;
    char key[sizeof(n->key)], text[sizeof(n->status)];
    uint64_t now = zs_time_now_ns();

    zd_runner_status_get(n->runner, &st);
    zd_sdnotify_describe(n, &st, key, sizeof(key), text, sizeof(text));
    if (strcmp(text, n->status) == 0 ||
        (strcmp(key, n->key) == 0 && now - n->status_ns < ZD_SDNOTIFY_STEP_NS)) {
        return;
    }
    zd_sdnotify_send("STATUS=%s", text);
    snprintf(n->status, sizeof(n->status), "%s", text);
    snprintf(n->key, sizeof(n->key), "%s", key);
    n->status_ns = now;
}

/* ---- progress -------------------------------------------------------------------------------- */

/* rchar + wchar of every thread but the loop (the main thread: its reads of clients, and of
 * these very files, say nothing of the runner); ZD_SDNOTIFY_NO_IO when /proc cannot tell. */
static uint64_t zd_sdnotify_io_bytes(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    uint64_t sum = 0;
    char path[64], line[128], self[32];
    unsigned long long v;

    if (d == NULL) {
        return ZD_SDNOTIFY_NO_IO;
    }
    snprintf(self, sizeof(self), "%d", (int)getpid());
    while ((de = readdir(d)) != NULL) {
        FILE *f;

        if (de->d_name[0] == '.' || strcmp(de->d_name, self) == 0) {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/self/task/%.16s/io", de->d_name);
        f = fopen(path, "re");
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            if (sscanf(line, "rchar: %llu", &v) == 1 || sscanf(line, "wchar: %llu", &v) == 1) {
                sum += v;
            }
        }
        if (f != NULL) {
            fclose(f);
        }
    }
    closedir(d);
    return sum;
}

static bool zd_sdnotify_io_phase(int phase)
{
    return phase == ZD_RUNNER_PHASE_TEARDOWN || phase == ZD_REQ_CKPT_SAVE ||
           phase == ZD_REQ_CKPT_LOAD || phase == ZD_REQ_CKPT_WAIT || phase == ZD_REQ_EXPORT;
}

/* The rule at the top of this file, over the last window_ns; io_p: that timer's I/O count. */
static bool zd_sdnotify_progress(zd_sdnotify_t *n, uint64_t window_ns, uint64_t *io_p, char *why,
                                 size_t len)
{
    zd_runner_health_t h;
    zd_runner_status_t st;
    uint64_t io = zd_sdnotify_io_bytes(), now = zs_time_now_ns();
    bool io_moved = io != ZD_SDNOTIFY_NO_IO && io != *io_p;

    *io_p = io;
    zd_runner_health(n->runner, &h);
    if (h.beat_ns >= now || now - h.beat_ns < window_ns) {
        return true;
    }
    if (h.phase != ZD_RUNNER_PHASE_IDLE && now - h.since_ns < n->peer_deadline_ns) {
        return true;
    }
    if (zd_sdnotify_io_phase(h.phase) && io_moved) {
        return true;
    }
    zd_runner_status_get(n->runner, &st);
    snprintf(why, len,
             "the engine shows no progress: %.200s for %.1f s, no sign of life for %.1f s",
             st.activity[0] != '\0' ? st.activity : "idle", (double)(now - h.since_ns) * 1e-9,
             (double)(now - h.beat_ns) * 1e-9);
    return false;
}

/* ---- the timers ----------------------------------------------------------------------------- */

static void zd_sdnotify_watchdog_cb(uv_timer_t *t)
{
    zd_sdnotify_t *n = t->data;
    char why[512];

    if (zd_sdnotify_progress(n, n->wd_ns, &n->wd_io, why, sizeof(why))) {
        if (n->wedged) {
            zs_info(ZS_SUB_MAIN, "watchdog: the engine makes progress again; pings resume");
            n->wedged = false;
        }
        zd_sdnotify_send("WATCHDOG=1");
        return;
    }
    if (!n->wedged) {
        zs_error(ZS_SUB_MAIN,
                 "watchdog: %s; no WATCHDOG=1 until it moves (systemd aborts the daemon after "
                 "WatchdogSec)",
                 why);
        n->wedged = true;
    }
}

static void zd_sdnotify_tick_cb(uv_timer_t *t)
{
    zd_sdnotify_t *n = t->data;
    char why[512];

    zd_sdnotify_status(n);
    if (n->stopping && !zd_runner_stopped(n->runner) &&
        zd_sdnotify_progress(n, n->wd_ns != 0 ? n->wd_ns : ZD_SDNOTIFY_EXTEND_NS, &n->ext_io, why,
                             sizeof(why))) {
        zd_sdnotify_send("EXTEND_TIMEOUT_USEC=%llu",
                         (unsigned long long)(ZD_SDNOTIFY_EXTEND_NS / ZS_NSEC_PER_USEC));
    }
}

zd_sdnotify_t *zd_sdnotify_start(uv_loop_t *loop, zd_runner_t *runner, const char *socket_path,
                                 uint64_t peer_deadline_ns)
{
#ifdef ZD_HAVE_SYSTEMD
    zd_sdnotify_t *n;
    uint64_t period_ms;

    if (getenv("NOTIFY_SOCKET") == NULL) {
        return NULL;
    }
    n = calloc(1, sizeof(*n));
    if (n == NULL) {
        zs_error(ZS_SUB_MAIN, "out of memory for the service manager's notifications");
        return NULL;
    }
    n->runner = runner;
    n->socket_path = socket_path;
    n->peer_deadline_ns = peer_deadline_ns;
    n->wd_ns = zd_sdnotify_watchdog_ns();
    n->wd_io = n->ext_io = ZD_SDNOTIFY_NO_IO;
    uv_timer_init(loop, &n->watchdog);
    uv_timer_init(loop, &n->tick);
    n->watchdog.data = n->tick.data = n;
    n->open_handles = 2;
    zd_sdnotify_send("READY=1");
    zd_sdnotify_status(n);
    if (n->wd_ns != 0) {
        period_ms = n->wd_ns / 2 / ZS_NSEC_PER_MSEC;
        period_ms = period_ms == 0 ? 1 : period_ms;
        uv_timer_start(&n->watchdog, zd_sdnotify_watchdog_cb, period_ms, period_ms);
        zs_info(ZS_SUB_MAIN, "watchdog: WATCHDOG=1 every %llu ms while the engine makes progress",
                (unsigned long long)period_ms);
    }
    uv_timer_start(&n->tick, zd_sdnotify_tick_cb, ZD_SDNOTIFY_TICK_MS, ZD_SDNOTIFY_TICK_MS);
    return n;
#else
    (void)loop;
    (void)runner;
    (void)socket_path;
    (void)peer_deadline_ns;
    return NULL;
#endif
}

void zd_sdnotify_update(zd_sdnotify_t *n)
{
    if (n != NULL) {
        zd_sdnotify_status(n);
    }
}

void zd_sdnotify_stopping(zd_sdnotify_t *n)
{
    zd_runner_status_t st;

    if (n == NULL || n->stopping) {
        return;
    }
    n->stopping = true;
    zd_sdnotify_send("STOPPING=1");
    zd_sdnotify_status(n);
    zd_runner_status_get(n->runner, &st);
    if (zd_sdnotify_job_bytes(&st) >= ZD_SDNOTIFY_LARGE_JOB) {
        zd_sdnotify_send("EXTEND_TIMEOUT_USEC=%llu",
                         (unsigned long long)(ZD_SDNOTIFY_EXTEND_NS / ZS_NSEC_PER_USEC));
    }
}

static void zd_sdnotify_closed(uv_handle_t *h)
{
    zd_sdnotify_t *n = h->data;

    if (--n->open_handles == 0) {
        free(n);
    }
}

void zd_sdnotify_close(zd_sdnotify_t *n)
{
    if (n == NULL) {
        return;
    }
    uv_close((uv_handle_t *)&n->watchdog, zd_sdnotify_closed);
    uv_close((uv_handle_t *)&n->tick, zd_sdnotify_closed);
}
