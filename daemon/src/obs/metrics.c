/*
 * The metrics snapshot and its Prometheus text (obs/metrics.h, docs/metrics.md). Publishers take
 * the one mutex for a copy or an increment; readers copy the snapshot under it and format the
 * copy without it.
 */
#define _GNU_SOURCE
#include "obs/metrics.h"

#include "zs/dtype.h"
#include "zs/time.h"
#include "zs/version.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const double zd_hist_bounds[ZD_HIST_BOUNDS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    30,     60};
const char *const zd_phase_names[ZD_PHASE_COUNT] = {"bucket_wait", "reduce_scatter", "norm", "adam",
                                                    "all_gather"};
const char *const zd_xfer_names[ZD_XFER_COUNT] = {"reduce_scatter", "all_gather"};

void zd_hist_observe(zd_hist_t *h, double seconds)
{
    h->count++;
    h->sum += seconds;
    for (int i = 0; i < ZD_HIST_BOUNDS; i++) {
        if (seconds <= zd_hist_bounds[i]) {
            h->in[i]++;
            return;
        }
    }
    /* above the last bound: only in +Inf, which is count */
}

void zd_step_rate_note(zd_step_stats_t *s, uint64_t now_ns)
{
    s->step_end_ns[s->n_step_ends % ZD_RATE_STEPS] = now_ns;
    s->n_step_ends++;
}

double zd_step_rate(const zd_step_stats_t *s, uint64_t since_ns, uint64_t now_ns)
{
    uint64_t from = now_ns > ZD_RATE_WINDOW_NS ? now_ns - ZD_RATE_WINDOW_NS : 0;
    uint64_t held = s->n_step_ends < ZD_RATE_STEPS ? s->n_step_ends : ZD_RATE_STEPS;
    uint64_t count = 0;

    from = since_ns > from ? since_ns : from;
    while (count < held && s->step_end_ns[(s->n_step_ends - 1 - count) % ZD_RATE_STEPS] > from) {
        count++;
    }
    if (count == ZD_RATE_STEPS && s->n_step_ends > ZD_RATE_STEPS) {
        /* the window holds more steps than the ring: the oldest held one opens it */
        from = s->step_end_ns[s->n_step_ends % ZD_RATE_STEPS];
        count = ZD_RATE_STEPS - 1;
    }
    if (count == 0 || now_ns <= from) {
        return 0;
    }
    return (double)count / ((double)(now_ns - from) * 1e-9);
}

const char *zd_job_state_name(const zd_job_status_t *s)
{
    if (s->trainer_attached) {
        return s->mesh_lost ? "lost" : "attached";
    }
    return s->kept && !s->mesh_lost ? "kept" : "orphaned";
}

const char *const zd_mem_term_names[ZD_MEM_COUNT] = {"params", "slots", "grads",      "master",
                                                     "m",      "v",     "accumulator"};

/* ---- the snapshot ---------------------------------------------------------------------- */

typedef struct zd_metrics_snap {
    char device[64];
    double start_unix_s;
    uint64_t heartbeat_ns; /* the loop's last beat (monotonic); 0: none yet */
    bool listening;
    uint64_t conn_refused, protocol_errors;
    bool has_job;
    zd_job_status_t job;
} zd_metrics_snap_t;

struct zd_metrics {
    pthread_mutex_t lock;
    zd_metrics_snap_t snap; /* under lock */
};

zs_status_t zd_metrics_create(const char *device, zd_metrics_t **metrics_p)
{
    zd_metrics_t *m = calloc(1, sizeof(*m));
    struct timespec ts;

    if (m == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&m->lock, NULL);
    snprintf(m->snap.device, sizeof(m->snap.device), "%s", device);
    clock_gettime(CLOCK_REALTIME, &ts);
    m->snap.start_unix_s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    *metrics_p = m;
    return ZS_OK;
}

void zd_metrics_destroy(zd_metrics_t *m)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void zd_metrics_publish_job(zd_metrics_t *m, const zd_job_status_t *job)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    m->snap.has_job = job != NULL;
    if (job != NULL) {
        m->snap.job = *job;
    }
    pthread_mutex_unlock(&m->lock);
}

void zd_metrics_heartbeat(zd_metrics_t *m, uint64_t now_ns)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    m->snap.heartbeat_ns = now_ns;
    pthread_mutex_unlock(&m->lock);
}

void zd_metrics_set_listening(zd_metrics_t *m, bool listening)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    m->snap.listening = listening;
    pthread_mutex_unlock(&m->lock);
}

void zd_metrics_conn_refused(zd_metrics_t *m)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    m->snap.conn_refused++;
    pthread_mutex_unlock(&m->lock);
}

void zd_metrics_protocol_error(zd_metrics_t *m)
{
    if (m == NULL) {
        return;
    }
    pthread_mutex_lock(&m->lock);
    m->snap.protocol_errors++;
    pthread_mutex_unlock(&m->lock);
}

static void zd_metrics_copy(zd_metrics_t *m, zd_metrics_snap_t *snap)
{
    pthread_mutex_lock(&m->lock);
    *snap = m->snap;
    pthread_mutex_unlock(&m->lock);
}

/* ---- health --------------------------------------------------------------------------- */

bool zd_metrics_healthy(zd_metrics_t *m, uint64_t now_ns, char *why, size_t len)
{
    uint64_t beat;

    pthread_mutex_lock(&m->lock);
    beat = m->snap.heartbeat_ns;
    pthread_mutex_unlock(&m->lock);
    if (beat == 0) {
        snprintf(why, len, "unhealthy: the event loop has not beaten yet\n");
        return false;
    }
    if (now_ns > beat && now_ns - beat > ZD_METRICS_HEALTH_STALE_NS) {
        snprintf(why, len,
                 "unhealthy: the event loop's last heartbeat was %.1f s ago (limit %.0f s)\n",
                 (double)(now_ns - beat) * 1e-9, (double)ZD_METRICS_HEALTH_STALE_NS * 1e-9);
        return false;
    }
    snprintf(why, len, "ok: event loop heartbeat %.1f s ago\n",
             now_ns > beat ? (double)(now_ns - beat) * 1e-9 : 0.0);
    return true;
}

/* Peers the mesh is up with: all or none (a lost peer aborts the whole mesh). */
static uint32_t zd_peers_up(const zd_job_status_t *j)
{
    return j->world > 1 && j->mesh_up ? j->world - 1 : 0;
}

bool zd_metrics_ready(zd_metrics_t *m, char *why, size_t len)
{
    zd_metrics_snap_t *s = malloc(sizeof(*s));
    const zd_job_status_t *j;
    bool ready = false;

    if (s == NULL) {
        snprintf(why, len, "not ready: out of memory\n");
        return false;
    }
    zd_metrics_copy(m, s);
    j = &s->job;
    if (!s->listening) {
        snprintf(why, len, "not ready: the daemon socket is not listening\n");
    } else if (!s->has_job) {
        snprintf(why, len, "ready: listening, no job\n");
        ready = true;
    } else if (j->mesh_lost || zd_peers_up(j) + 1 < j->world) {
        snprintf(why, len,
                 "not ready: job '%s' rank %u of %u: %u of %u peers up; collectives: %s\n",
                 j->job_id, j->rank, j->world, zd_peers_up(j), j->world - 1, j->collectives);
    } else {
        snprintf(why, len, "ready: job '%s' rank %u of %u, %u of %u peers up\n", j->job_id, j->rank,
                 j->world, zd_peers_up(j), j->world - 1);
        ready = true;
    }
    free(s);
    return ready;
}

/* ---- the text format ------------------------------------------------------------------ */

#define ZD_METRICS_TEXT_MAX (1u << 20)

typedef struct zd_text {
    char *buf;
    size_t len, cap;
    bool failed;
} zd_text_t;

static void zd_text_printf(zd_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void zd_text_printf(zd_text_t *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->failed) {
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < t->cap - t->len) {
        t->len += (size_t)n;
        return;
    }
    if (n < 0 || t->len + (size_t)n + 1 > ZD_METRICS_TEXT_MAX) {
        t->failed = true;
        return;
    }
    {
        size_t cap = t->cap * 2 > t->len + (size_t)n + 1 ? t->cap * 2 : t->len + (size_t)n + 1;
        char *nb = realloc(t->buf, cap);
        if (nb == NULL) {
            t->failed = true;
            return;
        }
        t->buf = nb;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* A label value, escaped as the text format wants (\\, \" and \n). */
static void zd_escape(const char *in, char *out, size_t len)
{
    size_t o = 0;

    for (; *in != '\0' && o + 3 < len; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    out[o] = '\0';
}

/* A float as Prometheus reads it: NaN, +Inf, -Inf, or the shortest digits that round-trip. */
static const char *zd_num(double v, char *buf, size_t len)
{
    if (isnan(v)) {
        return "NaN";
    }
    if (isinf(v)) {
        return v > 0 ? "+Inf" : "-Inf";
    }
    snprintf(buf, len, "%.15g", v);
    if (strtod(buf, NULL) != v) {
        snprintf(buf, len, "%.17g", v);
    }
    return buf;
}

static void zd_family(zd_text_t *t, const char *name, const char *type, const char *help)
{
    zd_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{labels} value, labels already escaped and comma-joined. */
static void zd_gauge(zd_text_t *t, const char *name, const char *labels, double v)
{
    char num[40];

    zd_text_printf(t, "%s{%s} %s\n", name, labels, zd_num(v, num, sizeof(num)));
}

static void zd_counter(zd_text_t *t, const char *name, const char *labels, uint64_t v)
{
    zd_text_printf(t, "%s{%s} %llu\n", name, labels, (unsigned long long)v);
}

static void zd_format_daemon(zd_text_t *t, const zd_metrics_snap_t *s, const char *dl,
                             uint64_t now_ns)
{
    zd_family(t, "zerod_build_info", "gauge", "Always 1; the daemon's version in a label.");
    zd_text_printf(t, "zerod_build_info{%s,version=\"%s\"} 1\n", dl, ZS_VERSION);
    zd_family(t, "zerod_start_time_seconds", "gauge",
              "When the daemon started, in seconds since the Unix epoch.");
    zd_gauge(t, "zerod_start_time_seconds", dl, s->start_unix_s);
    zd_family(t, "zerod_loop_heartbeat_age_seconds", "gauge",
              "Seconds since the event loop's last heartbeat (it beats every second).");
    zd_gauge(t, "zerod_loop_heartbeat_age_seconds", dl,
             s->heartbeat_ns != 0 && now_ns > s->heartbeat_ns
                 ? (double)(now_ns - s->heartbeat_ns) * 1e-9
                 : 0.0);
    zd_family(t, "zerod_jobs", "gauge", "Jobs this daemon holds (0 or 1).");
    zd_gauge(t, "zerod_jobs", dl, s->has_job ? 1 : 0);
    zd_family(t, "zerod_connections_refused_total", "counter",
              "Connections to the daemon socket refused: permission, per-uid limit, buffer "
              "budget.");
    zd_counter(t, "zerod_connections_refused_total", dl, s->conn_refused);
    zd_family(t, "zerod_protocol_errors_total", "counter",
              "Frames or requests refused as malformed, truncated or not allowed.");
    zd_counter(t, "zerod_protocol_errors_total", dl, s->protocol_errors);
}

/* replication = buddy (docs/design-notes.md "Buddy replicas") */
static void zd_format_job_replica(zd_text_t *t, const zd_job_status_t *j, const char *jl)
{
    static const char *const dir[2] = {"sent", "received"};

    zd_family(t, "zerod_replication_bytes_total", "counter",
              "Bytes of buddy replication: this rank's gradients and shard sent to its buddy, "
              "its owner's received (recoveries included).");
    for (int d = 0; d < 2; d++) {
        zd_text_printf(t, "zerod_replication_bytes_total{%s,direction=\"%s\"} %llu\n", jl, dir[d],
                       (unsigned long long)j->stats.replica_bytes[d]);
    }
    zd_family(t, "zerod_recoveries_total", "counter",
              "Mesh formations that gave fresh daemons of the job their shards from their "
              "buddies' replicas.");
    zd_counter(t, "zerod_recoveries_total", jl, j->stats.recoveries);
    zd_family(t, "zerod_recovery_fallbacks_total", "counter",
              "Mesh formations that found a shard and its replica both lost: the job went back to "
              "its last checkpoint.");
    zd_counter(t, "zerod_recovery_fallbacks_total", jl, j->stats.recovery_fallbacks);
    zd_family(t, "zerod_replica_step", "gauge",
              "Step of the replica of another rank's shard this daemon holds; NaN when it holds "
              "none.");
    zd_gauge(t, "zerod_replica_step", jl,
             j->replication && j->replica_valid ? (double)j->replica_step : NAN);
}

static void zd_format_job_state(zd_text_t *t, const zd_job_status_t *j, const char *jl)
{
    zd_family(t, "zerod_job_info", "gauge", "Always 1; the job's world size, stage and dtype.");
    zd_text_printf(t, "zerod_job_info{%s,world=\"%u\",stage=\"%u\",dtype=\"%s\"} 1\n", jl, j->world,
                   j->stage, zs_dtype_name(j->dtype));
    zd_family(t, "zerod_steps_total", "counter", "Optimizer steps the job has committed.");
    zd_counter(t, "zerod_steps_total", jl, j->step);
    zd_family(t, "zerod_skipped_steps_total", "counter",
              "Steps skipped because the gradients overflowed.");
    zd_counter(t, "zerod_skipped_steps_total", jl, j->skipped_steps);
    zd_family(t, "zerod_loss_scale", "gauge", "The loss scale of the next step.");
    zd_gauge(t, "zerod_loss_scale", jl, j->loss_scale);
    zd_family(t, "zerod_grad_norm", "gauge",
              "Global gradient norm of the last step; NaN when it was skipped.");
    zd_gauge(t, "zerod_grad_norm", jl, j->grad_norm < 0 ? NAN : j->grad_norm);
    zd_family(t, "zerod_trainers_attached", "gauge", "Trainers attached to the job (0 or 1).");
    zd_gauge(t, "zerod_trainers_attached", jl, j->trainer_attached ? 1 : 0);
    zd_family(t, "zerod_mesh_peers", "gauge", "Other daemons in the job's mesh (world - 1).");
    zd_gauge(t, "zerod_mesh_peers", jl, j->world - 1);
    zd_family(t, "zerod_mesh_peers_up", "gauge",
              "Peers the mesh is up with (all or none: a lost peer aborts the mesh).");
    zd_gauge(t, "zerod_mesh_peers_up", jl, zd_peers_up(j));
    zd_family(t, "zerod_reattaches_total", "counter",
              "Times a trainer re-attached to the job on this daemon.");
    zd_counter(t, "zerod_reattaches_total", jl, j->stats.reattaches);
    zd_format_job_replica(t, j, jl);
}

static void zd_format_job_memory(zd_text_t *t, const zd_job_status_t *j, const char *jl)
{
    zd_family(t, "zerod_memory_bytes", "gauge",
              "Bytes of each term of the job's model state on this daemon, as allocated.");
    for (int m = 0; m < ZD_MEM_COUNT; m++) {
        zd_text_printf(t, "zerod_memory_bytes{%s,term=\"%s\"} %llu\n", jl, zd_mem_term_names[m],
                       (unsigned long long)j->mem_bytes[m]);
    }
    zd_family(t, "zerod_memory_formula_bytes", "gauge",
              "Bytes of each term by the formula of docs/semantics.md (2Psi + 16Psi/N, ...).");
    for (int m = 0; m < ZD_MEM_COUNT; m++) {
        zd_text_printf(t, "zerod_memory_formula_bytes{%s,term=\"%s\"} %llu\n", jl,
                       zd_mem_term_names[m], (unsigned long long)j->mem_formula[m]);
    }
}

/* The collectives' bytes, wait, transfer time and bandwidth (docs/metrics.md). */
static void zd_format_job_colls(zd_text_t *t, const zd_job_status_t *j, const char *jl)
{
    char num[40];

    zd_family(t, "zerod_collective_bytes_total", "counter",
              "Bytes of the collectives' buffers (world x slice, as nccl-tests count size).");
    for (int x = 0; x < ZD_XFER_COUNT; x++) {
        zd_text_printf(t, "zerod_collective_bytes_total{%s,collective=\"%s\"} %llu\n", jl,
                       zd_xfer_names[x], (unsigned long long)j->stats.xfer_bytes[x]);
    }
    zd_family(t, "zerod_collective_wait_seconds_total", "counter",
              "Time the collectives waited for the other ranks to enter them (a shared params "
              "region's all-gather: all of its barrier).");
    for (int x = 0; x < ZD_XFER_COUNT; x++) {
        zd_text_printf(t, "zerod_collective_wait_seconds_total{%s,collective=\"%s\"} %s\n", jl,
                       zd_xfer_names[x],
                       zd_num((double)j->stats.xfer_wait_ns[x] * 1e-9, num, sizeof(num)));
    }
    zd_family(t, "zerod_collective_transfer_seconds_total", "counter",
              "Time the collectives moved and summed bytes: their time less the wait.");
    for (int x = 0; x < ZD_XFER_COUNT; x++) {
        zd_text_printf(t, "zerod_collective_transfer_seconds_total{%s,collective=\"%s\"} %s\n", jl,
                       zd_xfer_names[x],
                       zd_num((double)j->stats.xfer_busy_ns[x] * 1e-9, num, sizeof(num)));
    }
    zd_family(t, "zerod_collective_bus_bandwidth_bytes_per_second", "gauge",
              "Bus bandwidth of the last step's collective over its transfer time: size / "
              "(time - wait) x (N - 1) / N. No all_gather series with a shared params region.");
    for (int x = 0; x < ZD_XFER_COUNT; x++) {
        if (x == ZD_XFER_ALL_GATHER && j->params_shared) {
            continue; /* a barrier moves no bytes: it has no bandwidth */
        }
        zd_text_printf(t,
                       "zerod_collective_bus_bandwidth_bytes_per_second{%s,collective=\"%s\"} %s\n",
                       jl, zd_xfer_names[x], zd_num(j->stats.busbw[x], num, sizeof(num)));
    }
    zd_family(t, "zerod_collective_last_wait_seconds", "gauge",
              "Time the last step's collective waited for the other ranks.");
    for (int x = 0; x < ZD_XFER_COUNT; x++) {
        zd_text_printf(t, "zerod_collective_last_wait_seconds{%s,collective=\"%s\"} %s\n", jl,
                       zd_xfer_names[x], zd_num(j->stats.last_wait_s[x], num, sizeof(num)));
    }
    zd_family(t, "zerod_params_region_shared", "gauge",
              "1 when the daemons of this host share one params region (the all-gather is a "
              "barrier).");
    zd_gauge(t, "zerod_params_region_shared", jl, j->params_shared ? 1 : 0);
}

static void zd_format_job_steps(zd_text_t *t, const zd_job_status_t *j, const char *jl)
{
    const char *name = "zerod_step_phase_duration_seconds";
    char num[40], le[40];

    zd_family(t, name, "histogram", "Duration of each phase of a step.");
    for (int p = 0; p < ZD_PHASE_COUNT; p++) {
        const zd_hist_t *h = &j->stats.phase[p];
        uint64_t cum = 0;

        for (int i = 0; i < ZD_HIST_BOUNDS; i++) {
            cum += h->in[i];
            zd_text_printf(t, "%s_bucket{%s,phase=\"%s\",le=\"%s\"} %llu\n", name, jl,
                           zd_phase_names[p], zd_num(zd_hist_bounds[i], le, sizeof(le)),
                           (unsigned long long)cum);
        }
        zd_text_printf(t, "%s_bucket{%s,phase=\"%s\",le=\"+Inf\"} %llu\n", name, jl,
                       zd_phase_names[p], (unsigned long long)h->count);
        zd_text_printf(t, "%s_sum{%s,phase=\"%s\"} %s\n", name, jl, zd_phase_names[p],
                       zd_num(h->sum, num, sizeof(num)));
        zd_text_printf(t, "%s_count{%s,phase=\"%s\"} %llu\n", name, jl, zd_phase_names[p],
                       (unsigned long long)h->count);
    }
}

zs_status_t zd_metrics_format(zd_metrics_t *m, char **text_p, size_t *len_p)
{
    zd_metrics_snap_t *s = malloc(sizeof(*s));
    zd_text_t t = {.cap = 16384};
    char dev[160], job[300], dl[200], jl[600];

    t.buf = malloc(t.cap);
    if (s == NULL || t.buf == NULL) {
        free(s);
        free(t.buf);
        return ZS_ERR_NO_MEMORY;
    }
    zd_metrics_copy(m, s);
    zd_escape(s->device, dev, sizeof(dev));
    snprintf(dl, sizeof(dl), "device=\"%s\"", dev);
    zd_format_daemon(&t, s, dl, zs_time_now_ns());
    if (s->has_job) {
        zd_escape(s->job.job_id, job, sizeof(job));
        snprintf(jl, sizeof(jl), "job=\"%s\",rank=\"%u\",device=\"%s\"", job, s->job.rank, dev);
        zd_format_job_state(&t, &s->job, jl);
        zd_format_job_memory(&t, &s->job, jl);
        zd_format_job_steps(&t, &s->job, jl);
        zd_format_job_colls(&t, &s->job, jl);
    }
    free(s);
    if (t.failed) {
        free(t.buf);
        return ZS_ERR_NO_MEMORY;
    }
    *text_p = t.buf;
    *len_p = t.len;
    return ZS_OK;
}

/* ---- metrics_listen ---------------------------------------------------------------------- */

static zs_status_t zd_listen_bad(const char *value, const char *why, char *err, size_t errlen)
{
    snprintf(err, errlen, "config key 'metrics_listen': invalid value '%s': %s", value, why);
    return ZS_ERR_CONFIG;
}

static zs_status_t zd_listen_port(const char *value, const char *p, zd_listen_t *out, char *err,
                                  size_t errlen)
{
    long port = 0;
    size_t n = strlen(p);

    if (n == 0 || n > 5 || strspn(p, "0123456789") != n) {
        return zd_listen_bad(value, "the port must be a number 1..65535", err, errlen);
    }
    port = strtol(p, NULL, 10);
    if (port < 1 || port > 65535) {
        return zd_listen_bad(value, "the port must be a number 1..65535", err, errlen);
    }
    snprintf(out->port, sizeof(out->port), "%ld", port);
    return ZS_OK;
}

zs_status_t zd_listen_parse(const char *value, zd_listen_t *out, char *err, size_t errlen)
{
    const char *host, *colon;
    size_t hlen;

    memset(out, 0, sizeof(*out));
    if (value == NULL || value[0] == '\0' || strcmp(value, "off") == 0 ||
        strcmp(value, "none") == 0) {
        return ZS_OK;
    }
    if (strcmp(value, "auto") == 0) {
        out->kind = ZD_LISTEN_AUTO;
        return ZS_OK;
    }
    if (value[0] == '/') {
        if (strlen(value) >= sizeof(out->path)) {
            return zd_listen_bad(value, "a unix socket path must be shorter than 108 bytes", err,
                                 errlen);
        }
        out->kind = ZD_LISTEN_UNIX;
        snprintf(out->path, sizeof(out->path), "%s", value);
        return ZS_OK;
    }
    host = value;
    if (value[0] == '[') { /* [v6]:port */
        const char *close = strchr(value, ']');
        if (close == NULL || close[1] != ':') {
            return zd_listen_bad(value, "expected [IPV6]:PORT", err, errlen);
        }
        host = value + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(value, ':');
        if (colon == NULL || strchr(value, ':') != colon) {
            return zd_listen_bad(value,
                                 "expected HOST:PORT (127.0.0.1:9400), [IPV6]:PORT or an "
                                 "absolute unix socket path",
                                 err, errlen);
        }
        hlen = (size_t)(colon - value);
    }
    if (hlen == 0 || hlen >= sizeof(out->host) ||
        strspn(host, "0123456789abcdefABCDEFghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ.-:") < hlen) {
        return zd_listen_bad(value, "the host must be an address or a host name", err, errlen);
    }
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';
    if (zd_listen_port(value, colon + 1, out, err, errlen) != ZS_OK) {
        memset(out, 0, sizeof(*out));
        return ZS_ERR_CONFIG;
    }
    out->kind = ZD_LISTEN_TCP;
    return ZS_OK;
}

zs_status_t zd_listen_auto_path(const char *socket_path, char *out, size_t len, char *err,
                                size_t errlen)
{
    static const char sock[] = ".sock";
    size_t n = strlen(socket_path), k = sizeof(sock) - 1;
    char path[sizeof(((zd_listen_t *)NULL)->path)];
    int w;

    if (n > k && strcmp(socket_path + n - k, sock) == 0) {
        n -= k;
    }
    w = snprintf(path, sizeof(path), "%.*s%s", (int)n, socket_path, ZD_METRICS_SOCK_SUFFIX);
    if (w < 0 || (size_t)w >= sizeof(path) || (size_t)w >= len) {
        snprintf(err, errlen,
                 "config key 'metrics_listen' (auto): the socket beside '%s' would be %zu bytes "
                 "long, over the 107 a unix socket path may have; set metrics_listen to a "
                 "shorter path, HOST:PORT or off",
                 socket_path, n + sizeof(ZD_METRICS_SOCK_SUFFIX) - 1);
        return ZS_ERR_INVALID;
    }
    memcpy(out, path, (size_t)w + 1);
    return ZS_OK;
}
