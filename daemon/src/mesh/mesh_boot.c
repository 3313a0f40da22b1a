/*
 * Forming a job's mesh (docs/architecture.md): rank 0 listens on the coordinator address (a
 * TCP-only bootstrap context), the other ranks connect until mesh_timeout, answer a challenge with
 * a MeshHello (HMAC under the job token), and once every rank said hello rank 0 sends each the
 * roster of data and heartbeat worker addresses -- or a Refuse naming what differs. Rank 0's side
 * is in mesh/mesh_boot_rank0.c, what both sides share in mesh/mesh_boot_common.c; here the other
 * ranks' side and the formation, which hands mesh/mesh.c the roster.
 */
#define _GNU_SOURCE
#include "mesh/mesh_boot_int.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/version.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static ucs_status_t zd_send_msg(ucp_ep_h ep, unsigned id, const zd_mesh_msg_t *msg, bool reply)
{
    return zd_ucx_send_msg(ep, id, msg, reply);
}

/* ---- bootstrap ------------------------------------------------------------------------ */

static void zd_boot_client_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    zd_boot_t *b = arg;

    b->client_failed = true;
    b->client_status = status;
}

/* ---- the other ranks --------------------------------------------------------------------- */

static ucp_ep_h zd_boot_connect(zd_boot_t *b, const struct sockaddr_storage *ss, socklen_t len)
{
    ucp_ep_params_t eps;
    ucp_ep_h ep = NULL;

    memset(&eps, 0, sizeof(eps));
    eps.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    eps.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    eps.sockaddr.addr = (const struct sockaddr *)ss;
    eps.sockaddr.addrlen = len;
    eps.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    eps.err_handler.cb = zd_boot_client_ep_err_cb;
    eps.err_handler.arg = b;
    b->client_failed = false;
    return ucp_ep_create(b->worker, &eps, &ep) == UCS_OK ? ep : NULL;
}

/* The answer to rank 0's challenge: who this rank is, and proof it holds the job token. */
static void zd_boot_send_hello(const zd_mesh_t *mesh, ucp_ep_h ep, const uint8_t *nonce)
{
    const zd_mesh_params_t *p = &mesh->p;
    Zerod__Mesh__V1__MeshMsg out = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__MeshHello h = ZEROD__MESH__V1__MESH_HELLO__INIT;
    uint8_t mac[ZD_HMAC_LEN];
    char ucxv[64];
    unsigned maj, min, rel;

    ucp_get_version(&maj, &min, &rel);
    snprintf(ucxv, sizeof(ucxv), "%u.%u.%u", maj, min, rel);
    zd_hmac(p->token, p->token_len, nonce, p->job_id, p->rank, mac);
    h.job_id = (char *)p->job_id;
    h.rank = p->rank;
    h.world = p->world;
    h.layout_hash = p->layout_hash;
    h.config_hash = p->config_hash;
    h.protocol = ZD_MESH_PROTOCOL;
    h.zerod_version = (char *)ZS_VERSION;
    h.ucx_version = ucxv;
    h.step = p->step;
    h.params_loaded = p->params_loaded;
    h.replication = p->replication;
    h.worker_address.data = (uint8_t *)mesh->address;
    h.worker_address.len = mesh->address_len;
    zd_heartbeat_address(mesh->heartbeat, (const uint8_t **)&h.heartbeat_address.data,
                         &h.heartbeat_address.len);
    h.hmac.data = mac;
    h.hmac.len = sizeof(mac);
    out.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_HELLO;
    out.hello = &h;
    zd_send_msg(ep, ZD_AM_BOOT, &out, true);
}

/* The roster in rank 0's Welcome; *welcome_p keeps the bytes the roster points to. */
static zs_status_t zd_boot_take_welcome(const zd_mesh_t *mesh, zd_mesh_msg_t *msg,
                                        zd_roster_t *roster, zd_mesh_msg_t **welcome_p, char *err,
                                        size_t errlen)
{
    uint32_t world = mesh->p.world;

    if (msg->welcome->n_roster != world || msg->welcome->n_heartbeat_roster != world) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "rank 0 sent a roster of %zu (heartbeat %zu) ranks for world %u",
                       msg->welcome->n_roster, msg->welcome->n_heartbeat_roster, world);
    }
    if (zd_roster_alloc(roster, world) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    for (uint32_t r = 0; r < world; r++) {
        roster->data[r] = msg->welcome->roster[r].data;
        roster->data_len[r] = msg->welcome->roster[r].len;
        roster->heartbeat[r] = msg->welcome->heartbeat_roster[r].data;
        roster->heartbeat_len[r] = msg->welcome->heartbeat_roster[r].len;
    }
    *welcome_p = msg;
    return ZS_OK;
}

/* One message from rank 0: ZS_IN_PROGRESS to wait for more, ZS_OK once the roster is in, or the
 * refusal. */
static zs_status_t zd_boot_client_msg(const zd_mesh_t *mesh, ucp_ep_h ep, const zd_boot_msg_t *m,
                                      bool *hello_sent_p, zd_roster_t *roster,
                                      zd_mesh_msg_t **welcome_p, char *err, size_t errlen)
{
    zd_mesh_msg_t *msg = NULL;
    zs_status_t st = ZS_IN_PROGRESS;

    if (zd_boot_unpack(m, &msg) != ZS_OK) {
        return ZS_IN_PROGRESS;
    }
    if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_CHALLENGE && !*hello_sent_p &&
        msg->challenge->nonce.len == ZD_NONCE_LEN) {
        zd_boot_send_hello(mesh, ep, msg->challenge->nonce.data);
        *hello_sent_p = true;
    } else if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_REFUSE) {
        st = (zs_status_t)msg->refuse->status;
        st = zs_errf(err, errlen, st != ZS_OK ? st : ZS_ERR_AUTH, "rank 0 refused this rank: %s",
                     msg->refuse->message);
    } else if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_WELCOME && *hello_sent_p) {
        st = zd_boot_take_welcome(mesh, msg, roster, welcome_p, err, errlen);
        if (st == ZS_OK) {
            return ZS_OK; /* msg is *welcome_p now */
        }
    }
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    return st;
}

/* Why a rank > 0 stops trying to join (the daemon shuts down, mesh_timeout ran out), or ZS_OK
 * to go on. */
static zs_status_t zd_boot_client_stopped(const zd_mesh_params_t *p, const zd_boot_t *b,
                                          zs_deadline_t deadline, bool hello_sent,
                                          unsigned attempts, char *err, size_t errlen)
{
    if (zd_mesh_params_cancelled(p)) {
        return zs_errf(err, errlen, ZS_ERR_ABORTED,
                       "mesh formation stopped: the daemon is shutting down");
    }
    if (zs_deadline_expired(deadline)) {
        return zs_errf(err, errlen, hello_sent ? ZS_ERR_TIMEOUT : ZS_ERR_UNREACHABLE,
                       "coordinator %s unreachable: no mesh after %.1f s (mesh_timeout, %u "
                       "connection attempts%s%s)",
                       p->coordinator, (double)p->mesh_timeout_ns * 1e-9, attempts,
                       b->client_status != UCS_OK ? ", last: " : "",
                       b->client_status != UCS_OK ? ucs_status_string(b->client_status) : "");
    }
    return ZS_OK;
}

static zs_status_t zd_boot_client(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster,
                                  zd_mesh_msg_t **welcome_p, char *err, size_t errlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    zs_deadline_t deadline = zs_deadline_in_ns(p->mesh_timeout_ns);
    struct sockaddr_storage ss;
    socklen_t sslen;
    ucp_ep_h ep = NULL;
    bool hello_sent = false;
    unsigned attempts = 0;
    zs_status_t st = zd_parse_hostport(p->coordinator, &ss, &sslen, err, errlen);

    while (st == ZS_OK || st == ZS_IN_PROGRESS) {
        zd_boot_msg_t *m;

        st = zd_boot_client_stopped(p, b, deadline, hello_sent, attempts, err, errlen);
        if (st != ZS_OK) {
            break;
        }
        if (ep == NULL) {
            attempts++;
            ep = zd_boot_connect(b, &ss, sslen);
            if (ep == NULL) {
                usleep(ZD_BOOT_RETRY_US);
                continue;
            }
        }
        zd_boot_progress(b);
        if (b->client_failed) {
            zd_ucx_ep_close(b->worker, ep, true); /* it failed: nothing to flush */
            ep = NULL;
            if (hello_sent) {
                st = zs_errf(err, errlen, ZS_ERR_PEER_LOST,
                             "coordinator %s closed the connection during mesh formation",
                             p->coordinator);
                break;
            }
            usleep(ZD_BOOT_RETRY_US); /* rank 0 may not listen yet: retry until mesh_timeout */
            continue;
        }
        st = ZS_IN_PROGRESS;
        while (st == ZS_IN_PROGRESS && (m = zd_boot_pop(b)) != NULL) {
            st = zd_boot_client_msg(mesh, ep, m, &hello_sent, roster, welcome_p, err, errlen);
            zd_boot_msg_free(m);
        }
        if (st == ZS_OK) {
            break;
        }
    }
    zd_ucx_ep_close(b->worker, ep, st != ZS_OK); /* a failed one may never answer a flush */
    return st;
}

/* ---- formation ---------------------------------------------------------------------------- */

zs_status_t zd_mesh_boot(zd_mesh_t *mesh, zd_roster_t *roster, char *err, size_t errlen)
{
    zd_boot_t boot;
    zd_mesh_msg_t *welcome = NULL;
    zs_status_t st;

    memset(roster, 0, sizeof(*roster));
    st = zd_boot_open(&boot, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    st = mesh->p.rank == 0 ? zd_boot_server(mesh, &boot, roster, err, errlen)
                           : zd_boot_client(mesh, &boot, roster, &welcome, err, errlen);
    /* the roster's bytes belong to the bootstrap connections or the Welcome: copy them out
     * before both go */
    if (st == ZS_OK && zd_roster_keep(roster, mesh->p.world) != ZS_OK) {
        st = zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    zd_boot_cleanup(&boot, st != ZS_OK);
    zerod__mesh__v1__mesh_msg__free_unpacked(welcome, NULL);
    if (st != ZS_OK) {
        zd_roster_free(roster);
    }
    return st;
}
