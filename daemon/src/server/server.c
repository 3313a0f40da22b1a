/*
 * The daemon's front: the listening Unix socket (bound and removed with care), accepting a
 * client (SO_PEERCRED; the per-uid caps are server/admit.c's), keepalives, routing the runner's
 * results to their connections, signals and an orderly stop. A connection's own framing and
 * back-pressure are in server/conn.c.
 */
#define _GNU_SOURCE
#include "server/server.h"
#include "obs/testpoint.h"
#include "server/metrics_http.h"
#include "server/sdnotify.h"
#include "server/server_int.h"
#include "zs/log.h"
#include "zs/version.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

static zd_conn_t *zd_server_find_conn(zd_server_t *srv, uint64_t id)
{
    for (zd_conn_t *c = srv->conns; c != NULL; c = c->next) {
        if (c->id == id) {
            return c;
        }
    }
    return NULL;
}

/* SO_PEERCRED: the daemon's uid, root, or a member of allowed_group. */
static bool zd_server_peer_allowed(zd_server_t *srv, zd_conn_t *c, int fd, char *who, size_t wlen)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    zs_cred_t peer;
    char err[160];

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        zs_cred_of_peer(fd, &peer, err, sizeof(err)) != ZS_OK) {
        snprintf(who, wlen, "unknown peer (SO_PEERCRED: %s)", strerror(errno));
        return false;
    }
    c->uid = cred.uid;
    zd_rpc_session_set_cred(c->session, &peer);
    zd_rpc_session_set_pid(c->session, (int32_t)cred.pid);
    snprintf(who, wlen, "pid %d uid %u gid %u", (int)cred.pid, (unsigned)cred.uid,
             (unsigned)cred.gid);
    if (cred.uid == 0 || cred.uid == geteuid()) {
        return true;
    }
    if (srv->has_allowed_gid) {
        struct passwd pw, *pwp = NULL;
        char pwbuf[4096];
        gid_t groups[256];
        int ngroups = 256;

        if (cred.gid == srv->allowed_gid) {
            return true;
        }
        if (getpwuid_r(cred.uid, &pw, pwbuf, sizeof(pwbuf), &pwp) == 0 && pwp != NULL &&
            getgrouplist(pw.pw_name, pw.pw_gid, groups, &ngroups) >= 0) {
            for (int i = 0; i < ngroups; i++) {
                if (groups[i] == srv->allowed_gid) {
                    return true;
                }
            }
        }
    }
    return false;
}

static void zd_connection_cb(uv_stream_t *server, int status)
{
    zd_server_t *srv = server->data;
    zd_conn_t *c;
    uv_os_fd_t fd;
    char who[128];

    if (status != 0) {
        zs_warn(ZS_SUB_IPC, "accept failed: %s", uv_strerror(status));
        return;
    }
    c = zd_conn_new(srv);
    if (c == NULL) {
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 || c->session == NULL) {
        zd_conn_close(c);
        return;
    }
    uv_fileno((uv_handle_t *)&c->pipe, &fd);
    if (!zd_server_peer_allowed(srv, c, fd, who, sizeof(who))) {
        char msg[200];
        snprintf(msg, sizeof(msg), "permission denied for %s (allowed: uid %u, root%s%s)", who,
                 (unsigned)geteuid(), srv->has_allowed_gid ? ", group " : "",
                 srv->has_allowed_gid ? srv->params->config->allowed_group : "");
        zd_metrics_conn_refused(srv->metrics);
        zd_conn_fail(c, 0, ZS_ERR_PERMISSION, msg);
        return;
    }
    (void)zd_conn_admit(c, ZD_CONN_UNNAMED); /* always in: the uid's oldest unnamed one goes */
    zd_test_pause("accept", NULL, 0);
    zs_debug(ZS_SUB_IPC, "connection %llu from %s", (unsigned long long)c->id, who);
    zd_conn_pump(c);
}

/* ---- runner replies, signals, shutdown ------------------------------------------------ */

static void zd_server_close_all(zd_server_t *srv)
{
    zd_conn_t *c = srv->conns;

    while (c != NULL) {
        zd_conn_t *next = c->next;
        zd_conn_close_soon(c);
        c = next;
    }
    uv_close((uv_handle_t *)&srv->async, NULL);
    uv_close((uv_handle_t *)&srv->keepalive, NULL);
    uv_close((uv_handle_t *)&srv->sig_term, NULL);
    uv_close((uv_handle_t *)&srv->sig_int, NULL);
    uv_close((uv_handle_t *)&srv->sig_hup, NULL);
    zd_sdnotify_close(srv->notify);
    srv->notify = NULL;
    zd_metrics_http_stop(srv->http); /* /healthz answered until the runner stopped */
    srv->http = NULL;
}

/* Hand runner results to their connections as replies (a result for a closed connection is
 * dropped); each ends one request of the connection's back-pressure count. */
static void zd_server_deliver(zd_server_t *srv, zd_resp_t *r)
{
    while (r != NULL) {
        zd_resp_t *next = r->next;
        zd_conn_t *c = zd_server_find_conn(srv, r->conn_id);

        r->next = NULL;
        if (c != NULL) {
            zd_conn_result(c, r);
        } else {
            zd_resp_free(r);
        }
        r = next;
    }
}

static void zd_async_cb(uv_async_t *a)
{
    zd_server_t *srv = a->data;

    zd_server_deliver(srv, zd_runner_take_results(srv->runner));
    zd_sdnotify_update(srv->notify); /* STATUS= when the job changed */
    if (srv->stopping && zd_runner_stopped(srv->runner) && !uv_is_closing((uv_handle_t *)a)) {
        /* every reply is out (or queued in libuv): close connections after their writes */
        zd_resp_t *late = zd_runner_take_results(srv->runner);
        if (late == NULL) {
            zd_server_close_all(srv);
        } else {
            zd_server_deliver(srv, late);
            uv_async_send(a); /* go round again to close */
        }
    }
}

/* The runner has results (called on its thread): wake the loop. */
static void zd_server_results_ready(void *arg)
{
    uv_async_send(arg);
}

/* Close the listener and remove its socket file, unless something else replaced it since. */
static void zd_server_unlisten(zd_server_t *srv)
{
    uv_close((uv_handle_t *)&srv->listener, NULL);
    zd_unix_unlink_if_ours(srv->params->socket_path, &srv->sock_id);
    srv->listening = false;
}

static void zd_server_stop(zd_server_t *srv, const char *why)
{
    if (srv->stopping) {
        return;
    }
    srv->stopping = true;
    zd_metrics_set_listening(srv->metrics, false); /* /readyz: 503 from now on */
    zd_sdnotify_stopping(srv->notify);
    zs_info(ZS_SUB_MAIN, "%s: finishing the request in progress and stopping", why);
    if (srv->listening) {
        zd_server_unlisten(srv);
    }
    zd_runner_shutdown(srv->runner);
    uv_async_send(&srv->async);
}

static void zd_signal_cb(uv_signal_t *h, int signum)
{
    zd_server_t *srv = h->data;

    if (signum == SIGHUP) {
        zd_config_t fresh;
        char err[ZS_CONFIG_ERRLEN];
        const zd_server_params_t *p = srv->params;
        zs_status_t st;

        memset(&fresh, 0, sizeof(fresh));
        st = zs_config_load(&zd_config_table, &fresh, p->config_path, NULL, zd_config_env_ignore,
                            p->flags, p->n_flags, err, sizeof(err));
        if (st != ZS_OK) {
            zs_error(ZS_SUB_CFG, "SIGHUP: reload failed, keeping the running config: %s", err);
            return;
        }
        zd_runner_set_limits(srv->runner, fresh.max_shard_bytes, fresh.job_linger_ns);
        srv->frame_timeout_ms = fresh.frame_timeout_ns / 1000000ull;
        zs_info(ZS_SUB_CFG,
                "SIGHUP: reloaded job_linger=%llu ms max_shard_bytes=%llu frame_timeout=%llu ms",
                (unsigned long long)(fresh.job_linger_ns / 1000000ull),
                (unsigned long long)fresh.max_shard_bytes,
                (unsigned long long)srv->frame_timeout_ms);
        zs_config_cleanup(&zd_config_table, &fresh);
        return;
    }
    zd_server_stop(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- the socket ----------------------------------------------------------------------- */

/* The socket's directory exists (created 0755 when missing). */
static zs_status_t zd_socket_dir(const char *path)
{
    char dir[sizeof(((struct sockaddr_un *)NULL)->sun_path)];
    char *slash;

    snprintf(dir, sizeof(dir), "%s", path);
    slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            zs_error(ZS_SUB_IPC, "cannot create socket directory %s: %m", dir);
            return ZS_ERR_IO;
        }
    }
    return ZS_OK;
}

/* Mode 0660, and allowed_group as the socket's group so that its members can connect at all
 * (SO_PEERCRED then admits them). */
static zs_status_t zd_socket_set_access(zd_server_t *srv, const char *path)
{
    if (srv->has_allowed_gid && chown(path, (uid_t)-1, srv->allowed_gid) != 0) {
        zs_error(ZS_SUB_IPC, "config key 'allowed_group': cannot give %s to group '%s': %m", path,
                 srv->params->config->allowed_group);
        return ZS_ERR_PERMISSION;
    }
    if (chmod(path, 0660) != 0) {
        zs_error(ZS_SUB_IPC, "cannot set the mode of %s: %m", path);
        return ZS_ERR_IO;
    }
    return ZS_OK;
}

static zs_status_t zd_server_listen(zd_server_t *srv)
{
    const char *path = srv->params->socket_path;
    struct sockaddr_un sa;
    zs_status_t s;
    int rc, fd;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        zs_error(ZS_SUB_IPC, "socket path '%s' is longer than %zu bytes", path,
                 sizeof(sa.sun_path) - 1);
        return ZS_ERR_INVALID;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    s = zd_socket_dir(path);
    if (s == ZS_OK) {
        s = zd_unix_clear_stale(&sa, "socket");
    }
    if (s != ZS_OK) {
        return s;
    }
    /* bound here, not by uv_pipe_bind: libuv would unlink the path on close whatever then lies
     * there; zd_server_unlisten removes it only while it is still this socket */
    fd = zd_unix_bind(&sa, 128);
    if (fd < 0) {
        return ZS_ERR_IO;
    }
    uv_pipe_init(srv->loop, &srv->listener, 0);
    srv->listener.data = srv;
    rc = uv_pipe_open(&srv->listener, fd);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&srv->listener, 128, zd_connection_cb);
    }
    if (rc != 0) {
        zs_error(ZS_SUB_IPC, "cannot listen on %s: %s", path, uv_strerror(rc));
        unlink(path);
        uv_close((uv_handle_t *)&srv->listener, NULL); /* closes fd */
        return ZS_ERR_IO;
    }
    if (zd_unix_identify(path, &srv->sock_id) != ZS_OK) {
        uv_close((uv_handle_t *)&srv->listener, NULL);
        return ZS_ERR_IO;
    }
    srv->listening = true;
    s = zd_socket_set_access(srv, path);
    if (s != ZS_OK) {
        zd_server_unlisten(srv);
    }
    return s;
}

/* The runner, with the config's limits; false when it cannot start (logged). */
static bool zd_server_start_runner(zd_server_t *srv)
{
    const zd_config_t *cfg = srv->params->config;
    zd_runner_params_t ep;

    memset(&ep, 0, sizeof(ep));
    if (strncmp(srv->params->device, "cuda:", 5) == 0) { /* main.c normalized it */
        ep.cuda = true;
        ep.cuda_device = atoi(srv->params->device + 5);
    }
    ep.bucket_slots = (uint32_t)cfg->bucket_slots;
    ep.max_shard_bytes = cfg->max_shard_bytes;
    ep.job_linger_ns = cfg->job_linger_ns;
    ep.threads = (unsigned)cfg->threads;
    ep.token_file = cfg->token_file;
    ep.mesh_timeout_ns = cfg->mesh_timeout_ns;
    ep.collective_timeout_ns = cfg->collective_timeout_ns;
    ep.heartbeat_interval_ns = cfg->heartbeat_interval_ns;
    ep.heartbeat_timeout_ns = cfg->heartbeat_timeout_ns;
    ep.direct_collectives = cfg->direct_collectives != 0;
    ep.replication = (uint32_t)cfg->replication;
    ep.stores_file = srv->params->stores_file;
    ep.ckpt_dir = cfg->checkpoint_dir;
    ep.ckpt_every_steps = (uint64_t)cfg->checkpoint_every_steps;
    ep.ckpt_every_seconds = (uint64_t)cfg->checkpoint_every_seconds;
    ep.ckpt_keep_last = (uint32_t)cfg->checkpoint_keep_last;
    ep.ckpt_async = cfg->checkpoint_async != 0;
    ep.ckpt_staging_keep = cfg->checkpoint_staging_keep != 0;
    ep.notify = zd_server_results_ready;
    ep.notify_arg = &srv->async;
    if (cfg->metrics_listen != NULL && cfg->metrics_listen[0] != '\0' &&
        zd_metrics_create(srv->params->device, &srv->metrics) != ZS_OK) {
        return false;
    }
    ep.metrics = srv->metrics;
    ep.trace_spans = (uint32_t)cfg->trace_buffer;
    ep.beat_interval_ns =
        zd_sdnotify_watchdog_ns() / 4; /* server/sdnotify.c: the watchdog's rule */
    if (zd_runner_create(&ep, &srv->runner) != ZS_OK) {
        return false;
    }
    srv->rpc.runner = srv->runner;
    srv->rpc.trace = zd_runner_trace(srv->runner);
    srv->rpc.device = srv->params->device;
    srv->rpc.socket_path = srv->params->socket_path;
    srv->rpc.peer_deadline_ms = zd_config_peer_deadline_ns(cfg) / 1000000u;
    srv->rpc.keepalive_interval_ms = cfg->heartbeat_interval_ns / 1000000u;
    srv->rpc.keepalive_timeout_ms = cfg->heartbeat_timeout_ns / 1000000u;
    return true;
}

/* SIGTERM and SIGINT stop, SIGHUP reloads; handled on the loop, never in a signal handler. */
static void zd_server_watch_signals(zd_server_t *srv)
{
    uv_signal_init(srv->loop, &srv->sig_term);
    uv_signal_init(srv->loop, &srv->sig_int);
    uv_signal_init(srv->loop, &srv->sig_hup);
    srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
    uv_signal_start(&srv->sig_term, zd_signal_cb, SIGTERM);
    uv_signal_start(&srv->sig_int, zd_signal_cb, SIGINT);
    uv_signal_start(&srv->sig_hup, zd_signal_cb, SIGHUP);
}

static void zd_keepalive_cb(uv_timer_t *t)
{
    zd_server_t *srv = t->data;

    for (zd_conn_t *c = srv->conns; c != NULL; c = c->next) {
        zd_conn_keepalive(c);
    }
}

/* A StillWorking every heartbeat_interval to each client that waits for a request in progress
 * (HelloReply.keepalive_*): from the loop, which never waits on the runner, so a client can
 * tell a long request from a stopped or hung daemon. */
static void zd_server_start_keepalive(zd_server_t *srv)
{
    uint64_t ms = srv->rpc.keepalive_interval_ms;

    uv_timer_init(srv->loop, &srv->keepalive);
    srv->keepalive.data = srv;
    uv_timer_start(&srv->keepalive, zd_keepalive_cb, ms, ms);
}

/* Tell launchers the daemon serves: a READY line on stdout (READY=1 to systemd: server/sdnotify.c).
 */
static void zd_server_announce(const zd_server_params_t *params)
{
    zs_info(ZS_SUB_MAIN, "zerod %s ready on %s (device %s, pid %d)", ZS_VERSION,
            params->socket_path, params->device, (int)getpid());
    printf("READY %s\n", params->socket_path);
    fflush(stdout);
}

int zd_server_run(const zd_server_params_t *params)
{
    zd_server_t *srv;
    const zd_config_t *cfg = params->config;
    int rc = 1;

    srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        return 1;
    }
    srv->params = params;
    srv->loop = uv_default_loop();
    srv->frame_timeout_ms = cfg->frame_timeout_ns / 1000000ull;
    if (cfg->allowed_group != NULL && cfg->allowed_group[0] != '\0') {
        struct group *gr = getgrnam(cfg->allowed_group);
        if (gr == NULL) {
            zs_error(ZS_SUB_CFG, "config key 'allowed_group': no group named '%s'",
                     cfg->allowed_group);
            goto out_free;
        }
        srv->allowed_gid = gr->gr_gid;
        srv->has_allowed_gid = true;
    }
    uv_async_init(srv->loop, &srv->async, zd_async_cb);
    srv->async.data = srv;
    if (!zd_server_start_runner(srv)) {
        uv_close((uv_handle_t *)&srv->async, NULL);
        uv_run(srv->loop, UV_RUN_DEFAULT);
        goto out_free;
    }
    zd_server_watch_signals(srv);
    zd_server_start_keepalive(srv);
    if (zd_server_listen(srv) != ZS_OK ||
        zd_metrics_http_start(srv->loop, srv->metrics, cfg->metrics_listen, srv->has_allowed_gid,
                              srv->allowed_gid, &srv->http) != ZS_OK) {
        zd_server_stop(srv, "start-up failed");
        uv_run(srv->loop, UV_RUN_DEFAULT);
        goto out_runner;
    }
    zd_server_announce(params);
    srv->notify = zd_sdnotify_start(srv->loop, srv->runner, params->socket_path,
                                    zd_config_peer_deadline_ns(cfg));
    uv_run(srv->loop, UV_RUN_DEFAULT);
    rc = 0;
    zs_info(ZS_SUB_MAIN, "stopped");

out_runner:
    zd_runner_destroy(srv->runner);
out_free:
    zd_metrics_destroy(srv->metrics); /* after the runner and the HTTP thread stopped */
    uv_loop_close(srv->loop);
    free(srv);
    return rc;
}
