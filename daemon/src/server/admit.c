/*
 * Who gets in, per uid and kind of connection: unnamed (connected, Hello not yet answered),
 * trainer, control. Each kind has its own cap (server_int.h), so that no pile of one kind --
 * half-open connections, trainer sessions opened and never used -- locks the same uid's
 * `zeroctl status` or its job's re-attaching trainer out. Past a cap the uid's oldest idle
 * connection of the kind makes room: a newcomer is refused only when every one of its kind
 * has a request in progress or holds the job. This file decides; server/conn.c closes.
 */
#include "server/server_int.h"

#include <stdio.h>
#include <sys/ioctl.h>

static const char *zd_admit_kind_name(zd_conn_kind_t kind)
{
    return kind == ZD_CONN_UNNAMED   ? "connections that have not sent their Hello"
           : kind == ZD_CONN_TRAINER ? "trainer connections"
                                     : "control connections";
}

static unsigned zd_admit_cap(zd_conn_kind_t kind)
{
    return kind == ZD_CONN_UNNAMED   ? ZD_MAX_UNNAMED_PER_UID
           : kind == ZD_CONN_TRAINER ? ZD_MAX_TRAINERS_PER_UID
                                     : ZD_MAX_CONTROL_PER_UID;
}

/* No request in progress, no job held, nothing received that is not handled yet. */
static bool zd_admit_idle(const zd_conn_t *c)
{
    zd_rpc_peer_t peer;
    uv_os_fd_t fd;
    int waiting = 0;

    zd_rpc_session_peer(c->session, &peer);
    if (c->inflight > 0 || peer.holds_job || c->len > 0) {
        return false;
    }
    /* bytes the loop has not read yet: a Hello or a request is on its way */
    return uv_fileno((const uv_handle_t *)&c->pipe, &fd) != 0 ||
           ioctl(fd, FIONREAD, &waiting) != 0 || waiting == 0;
}

bool zd_admit(zd_conn_t *c, zd_conn_kind_t kind, zd_conn_t **victim_p, char *msg, size_t len)
{
    zd_conn_t *oldest = NULL, *oldest_any = NULL;
    unsigned n = 0, cap = zd_admit_cap(kind);

    c->kind = kind;
    *victim_p = NULL;
    for (zd_conn_t *o = c->srv->conns; o != NULL; o = o->next) {
        if (o->closing || o->uid != c->uid || o->kind != kind) {
            continue;
        }
        n++;
        if (o == c) {
            continue;
        }
        if (oldest_any == NULL || o->id < oldest_any->id) {
            oldest_any = o;
        }
        if (zd_admit_idle(o) && (oldest == NULL || o->id < oldest->id)) {
            oldest = o;
        }
    }
    if (n <= cap) {
        return true;
    }
    /* an unnamed one always makes room: when every other is on its way to a Hello (bytes
     * came), the oldest goes all the same */
    if (oldest == NULL && kind == ZD_CONN_UNNAMED) {
        oldest = oldest_any;
    }
    if (oldest == NULL) {
        snprintf(msg, len,
                 "too many %s from uid %u (at most %u, and each has a request in progress or "
                 "holds the job)",
                 zd_admit_kind_name(kind), (unsigned)c->uid, cap);
        return false;
    }
    snprintf(msg, len,
             "closed to make room for a newer connection: uid %u has more than %u %s, and this "
             "was the oldest",
             (unsigned)c->uid, cap, zd_admit_kind_name(kind));
    *victim_p = oldest;
    return true;
}
