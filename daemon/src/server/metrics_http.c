/*
 * The metrics endpoint (server/metrics_http.h, docs/metrics.md): a listening socket made here (TCP,
 * or a unix socket of mode 0660), handed to libmicrohttpd, whose one internal thread answers every
 * request from the metrics snapshot; connections, their idle time and their memory are bounded
 * so that no HTTP client can wedge or exhaust the daemon.
 */
#define _GNU_SOURCE
#include "server/metrics_http.h"
#include "server/unix_listen.h"

#include "zs/log.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef ZD_HAVE_MHD
#include <microhttpd.h>
#endif

struct zd_metrics_http {
    uv_timer_t timer; /* the loop's heartbeat; the object is freed in its close callback */
    zd_metrics_t *metrics;
    zd_listen_t where;
    struct MHD_Daemon *mhd;
    zd_unix_id_t sock_id; /* the unix socket bound: removed at stop only while still ours */
};

static void zd_http_beat_cb(uv_timer_t *t)
{
    zd_metrics_http_t *h = t->data;

    zd_metrics_heartbeat(h->metrics, zs_time_now_ns());
}

static void zd_http_closed_cb(uv_handle_t *handle)
{
    free(handle->data);
}

/* ---- the listening socket --------------------------------------------------------------- */

static int zd_http_tcp_socket(const zd_listen_t *l)
{
    struct addrinfo hints, *res = NULL;
    int fd, rc, one = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(l->host, l->port, &hints, &res);
    if (rc != 0 || res == NULL) {
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': cannot resolve '%s': %s", l->host,
                 gai_strerror(rc));
        return -1;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
    if (fd < 0) {
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': socket: %m");
        freeaddrinfo(res);
        return -1;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': cannot listen on %s:%s: %m", l->host,
                 l->port);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int zd_http_unix_socket(zd_metrics_http_t *h, bool has_gid, gid_t gid)
{
    const char *path = h->where.path;
    struct sockaddr_un sa;
    int fd;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    if (zd_unix_clear_stale(&sa, "metrics_listen") != ZS_OK) {
        return -1;
    }
    fd = zd_unix_bind(&sa, 64);
    if (fd < 0) {
        return -1;
    }
    if (zd_unix_identify(path, &h->sock_id) != ZS_OK ||
        (has_gid && chown(path, (uid_t)-1, gid) != 0) || chmod(path, 0660) != 0) {
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': cannot set the access of %s: %m", path);
        unlink(path); /* bound a moment ago: ours */
        close(fd);
        return -1;
    }
    return fd;
}

static void zd_http_unlink(const zd_metrics_http_t *h)
{
    if (h->where.kind == ZD_LISTEN_UNIX) {
        zd_unix_unlink_if_ours(h->where.path, &h->sock_id);
    }
}

/* ---- requests (libmicrohttpd's thread: reads the snapshot, nothing else) ------------------ */

#ifdef ZD_HAVE_MHD

#define ZD_HTTP_NO_SERVER "libmicrohttpd failed to start (ZEROD_LOG_LEVEL=debug shows its messages)"

/* Queue body (malloc'd; MHD frees it) as the reply; MHD_NO closes the connection. */
static enum MHD_Result zd_http_reply(struct MHD_Connection *conn, unsigned code, const char *type,
                                     char *body, size_t len)
{
    struct MHD_Response *r;
    enum MHD_Result ret;

    if (body == NULL) {
        return MHD_NO;
    }
    r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    }
    ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result zd_http_text(struct MHD_Connection *conn, unsigned code, const char *text)
{
    char *body = strdup(text);

    return zd_http_reply(conn, code, "text/plain; charset=utf-8", body,
                         body != NULL ? strlen(body) : 0);
}

static enum MHD_Result zd_http_answer(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **req_cls)
{
    zd_metrics_http_t *h = cls;
    char why[1024];
    char *text = NULL;
    size_t len = 0;

    (void)version, (void)upload_data, (void)upload_data_size, (void)req_cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
        return zd_http_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n");
    }
    if (strcmp(url, "/metrics") == 0) {
        if (zd_metrics_format(h->metrics, &text, &len) != ZS_OK) {
            return zd_http_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
        }
        return zd_http_reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text,
                             len);
    }
    if (strcmp(url, "/healthz") == 0) {
        bool ok = zd_metrics_healthy(h->metrics, zs_time_now_ns(), why, sizeof(why));
        return zd_http_text(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, why);
    }
    if (strcmp(url, "/readyz") == 0) {
        bool ok = zd_metrics_ready(h->metrics, why, sizeof(why));
        return zd_http_text(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, why);
    }
    if (strcmp(url, "/") == 0) {
        return zd_http_text(conn, MHD_HTTP_OK, "zerod: /metrics /healthz /readyz\n");
    }
    return zd_http_text(conn, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz, /readyz\n");
}

/* libmicrohttpd's messages (a client's bad request, a connection over a limit): debug lines,
 * since any client can cause them. */
static void zd_http_log(void *cls, const char *fmt, va_list ap)
{
    char buf[256];
    size_t n;

    (void)cls;
    vsnprintf(buf, sizeof(buf), fmt, ap);
    n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) {
        buf[--n] = '\0';
    }
    zs_debug(ZS_SUB_MAIN, "metrics_listen: %s", buf);
}

static bool zd_http_serve(zd_metrics_http_t *h, int fd)
{
    unsigned flags =
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    /* the per-IP limit keys on an IPv4/IPv6 address: it would refuse every AF_UNIX client */
    unsigned per_ip = h->where.kind == ZD_LISTEN_TCP ? ZD_HTTP_PER_IP : 0;
    sigset_t old;

    /* libmicrohttpd's thread inherits a mask that blocks every signal (zs/thread.h) */
    zs_signals_block(&old);
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, zd_http_answer, h, MHD_OPTION_LISTEN_SOCKET,
                              (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)ZD_HTTP_MAX_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                              per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ZD_HTTP_TIMEOUT_S,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)ZD_HTTP_CONN_MEMORY,
                              MHD_OPTION_EXTERNAL_LOGGER, zd_http_log, (void *)h, MHD_OPTION_END);
    zs_signals_restore(&old);
    return h->mhd != NULL;
}

static void zd_http_unserve(zd_metrics_http_t *h)
{
    MHD_stop_daemon(h->mhd); /* joins its thread, closes the listening socket */
    h->mhd = NULL;
}

#else /* no libmicrohttpd in this build */

#define ZD_HTTP_NO_SERVER "this zerod was built without libmicrohttpd (libmicrohttpd-dev)"

static bool zd_http_serve(zd_metrics_http_t *h, int fd)
{
    (void)h, (void)fd;
    errno = ENOTSUP;
    return false;
}

static void zd_http_unserve(zd_metrics_http_t *h)
{
    (void)h;
}

#endif

/* ---- start and stop ----------------------------------------------------------------------- */

bool zd_metrics_http_available(void)
{
#ifdef ZD_HAVE_MHD
    return true;
#else
    return false;
#endif
}

/* Where the endpoints listen, and who can read them. */
static void zd_http_log_listening(const zd_metrics_http_t *h, const char *listen)
{
    if (h->where.kind == ZD_LISTEN_TCP) {
        /* INFO, not WARN: TCP is what the operator asked for explicitly, on every start; a WARN
         * that is always there teaches to ignore WARN lines (tests fail on unexpected ones) */
        zs_info(ZS_SUB_MAIN,
                "metrics_listen %s (TCP): /metrics /healthz /readyz; any local user (and any host "
                "that reaches this address) can read them -- a unix socket path, or the default "
                "auto, admits only the daemon socket's users",
                listen);
    } else {
        zs_info(ZS_SUB_MAIN,
                "metrics_listen %s (unix socket, mode 0660): /metrics /healthz /readyz", listen);
    }
}

zs_status_t zd_metrics_http_start(uv_loop_t *loop, zd_metrics_t *m, const char *listen,
                                  bool has_gid, gid_t gid, zd_metrics_http_t **http_p)
{
    char err[512];
    zd_listen_t where;
    zd_metrics_http_t *h;
    int fd;

    *http_p = NULL;
    if (zd_listen_parse(listen, &where, err, sizeof(err)) != ZS_OK) {
        zs_error(ZS_SUB_CFG, "%s", err);
        return ZS_ERR_CONFIG;
    }
    if (where.kind == ZD_LISTEN_OFF) {
        return ZS_OK;
    }
    if (where.kind == ZD_LISTEN_AUTO) { /* main.c resolves it */
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': '%s' was not resolved", listen);
        return ZS_ERR_INVALID;
    }
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    h->metrics = m;
    h->where = where;
    fd = h->where.kind == ZD_LISTEN_UNIX ? zd_http_unix_socket(h, has_gid, gid)
                                         : zd_http_tcp_socket(&h->where);
    if (fd < 0) {
        free(h);
        return ZS_ERR_IO;
    }
    zd_metrics_set_listening(m, true);
    zd_metrics_heartbeat(m, zs_time_now_ns());
    if (!zd_http_serve(h, fd)) {
        zs_error(ZS_SUB_CFG, "config key 'metrics_listen': cannot serve HTTP on %s: %s", listen,
                 ZD_HTTP_NO_SERVER);
        if (fcntl(fd, F_GETFD) != -1) { /* start-up: no other thread opens fds yet */
            close(fd);
        }
        zd_http_unlink(h);
        free(h);
        return ZS_ERR_IO;
    }
    uv_timer_init(loop, &h->timer);
    h->timer.data = h;
    uv_timer_start(&h->timer, zd_http_beat_cb, ZD_METRICS_HEARTBEAT_NS / 1000000u,
                   ZD_METRICS_HEARTBEAT_NS / 1000000u);
    zd_http_log_listening(h, listen);
    *http_p = h;
    return ZS_OK;
}

void zd_metrics_http_stop(zd_metrics_http_t *h)
{
    if (h == NULL) {
        return;
    }
    zd_http_unserve(h);
    zd_http_unlink(h);
    uv_close((uv_handle_t *)&h->timer, zd_http_closed_cb);
}
