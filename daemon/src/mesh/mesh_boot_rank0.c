/*
 * Rank 0's side of forming a mesh (mesh/mesh_boot.c): listen on the coordinator address (retrying
 * while an earlier mesh's port is in TIME_WAIT), challenge each rank that connects, check its
 * MeshHello, and once every rank said hello send each the roster -- or a Refuse naming what
 * differs.
 */
#define _GNU_SOURCE
#include "config/daemon_config.h"
#include "mesh/mesh_boot_int.h"
#include "zs/error.h"
#include "zs/log.h"
#include "zs/version.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- rank 0 ------------------------------------------------------------------------------ */

static void zd_boot_conn_request_cb(ucp_conn_request_h req, void *arg)
{
    zd_boot_t *b = arg;

    if (b->n_requests == b->cap_requests) {
        size_t cap = b->cap_requests ? 2 * b->cap_requests : 8;
        ucp_conn_request_h *nr = realloc(b->requests, cap * sizeof(*nr));
        if (nr == NULL) {
            ucp_listener_reject(b->listener, req);
            return;
        }
        b->requests = nr;
        b->cap_requests = cap;
    }
    b->requests[b->n_requests++] = req;
}

static void zd_boot_server_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)status;
    zd_boot_t *b = arg;

    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].ep == ep) {
            b->conns[i].failed = true;
        }
    }
}

/* A hello with the right token: does the rank belong to this job as rank 0 sees it? */
static zs_status_t zd_boot_check_match(const zd_mesh_params_t *p, const zd_boot_t *b,
                                       const Zerod__Mesh__V1__MeshHello *h, char *why, size_t wlen)
{
    if (h->protocol != ZD_MESH_PROTOCOL) {
        return zs_errf(why, wlen, ZS_ERR_VERSION,
                       "rank %u speaks mesh protocol %u (zerod %s), rank 0 speaks %d (%s)", h->rank,
                       h->protocol, h->zerod_version, ZD_MESH_PROTOCOL, ZS_VERSION);
    }
    if (strcmp(h->job_id, p->job_id) != 0) {
        return zs_errf(why, wlen, ZS_ERR_INVALID, "rank %u attached job '%s', rank 0 job '%s'",
                       h->rank, h->job_id, p->job_id);
    }
    if (h->world != p->world) {
        return zs_errf(why, wlen, ZS_ERR_INVALID, "rank %u says world %u, rank 0 says world %u",
                       h->rank, h->world, p->world);
    }
    if (h->rank == 0 || h->rank >= p->world) {
        return zs_errf(why, wlen, ZS_ERR_INVALID, "rank %u is out of range 1..%u", h->rank,
                       p->world - 1);
    }
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined && b->conns[i].rank == h->rank) {
            return zs_errf(why, wlen, ZS_ERR_INVALID, "duplicate rank %u: two daemons claim it",
                           h->rank);
        }
    }
    if (h->layout_hash != p->layout_hash) {
        return zs_errf(why, wlen, ZS_ERR_LAYOUT_MISMATCH,
                       "rank %u has layout hash 0x%016llx, rank 0 has 0x%016llx", h->rank,
                       (unsigned long long)h->layout_hash, (unsigned long long)p->layout_hash);
    }
    if (h->config_hash != p->config_hash) {
        return zs_errf(why, wlen, ZS_ERR_CONFIG,
                       "rank %u has config hash 0x%016llx, rank 0 has 0x%016llx", h->rank,
                       (unsigned long long)h->config_hash, (unsigned long long)p->config_hash);
    }
    if (h->replication != p->replication) {
        return zs_errf(why, wlen, ZS_ERR_CONFIG,
                       "rank %u has replication = %s, rank 0 has replication = %s (every daemon "
                       "of a job needs the same)",
                       h->rank, zd_replication_name(h->replication),
                       zd_replication_name(p->replication));
    }
    /* with buddy replicas a fresh daemon may join ranks that kept the job: the job settles it
     * once the mesh is up (job/replica.c) */
    if (p->replication == 0 && (h->step != p->step || h->params_loaded != p->params_loaded)) {
        return zs_errf(why, wlen, ZS_ERR_STATE,
                       "rank %u is at step %llu (params %s), rank 0 at step %llu (params %s)",
                       h->rank, (unsigned long long)h->step,
                       h->params_loaded ? "loaded" : "not loaded", (unsigned long long)p->step,
                       p->params_loaded ? "loaded" : "not loaded");
    }
    if (h->worker_address.len == 0 || h->worker_address.len > 65536 ||
        h->heartbeat_address.len == 0 || h->heartbeat_address.len > 65536) {
        return zs_errf(why, wlen, ZS_ERR_INVALID,
                       "rank %u sent worker addresses of %zu and %zu bytes", h->rank,
                       h->worker_address.len, h->heartbeat_address.len);
    }
    return ZS_OK;
}

/* Does the hello prove it holds the job token (an HMAC of c's nonce)? */
static zs_status_t zd_boot_check_token(const zd_mesh_params_t *p, const zd_boot_conn_t *c,
                                       const Zerod__Mesh__V1__MeshHello *h, char *why, size_t wlen)
{
    uint8_t mac[ZD_HMAC_LEN];

    if (h->hmac.len != ZD_HMAC_LEN || h->rank >= 65536) {
        return zs_errf(why, wlen, ZS_ERR_AUTH, "mesh hello from %s: malformed authentication",
                       h->rank < 65536 ? "a peer" : "a peer with an invalid rank");
    }
    zd_hmac(p->token, p->token_len, c->nonce, h->job_id, h->rank, mac);
    if (CRYPTO_memcmp(mac, h->hmac.data, ZD_HMAC_LEN) != 0) {
        return zs_errf(why, wlen, ZS_ERR_AUTH,
                       "mesh hello claiming rank %u of job '%s' from %s has a wrong token (HMAC "
                       "mismatch: every daemon of a job needs the same token_file)",
                       h->rank, h->job_id, c->from);
    }
    return ZS_OK;
}

/* Rank 0: check one hello. Fatal mismatches fail formation; a bad token only refuses. */
static zs_status_t zd_boot_check_hello(const zd_mesh_t *mesh, zd_boot_t *b, zd_boot_conn_t *c,
                                       const Zerod__Mesh__V1__MeshHello *h, bool *fatal_p,
                                       char *why, size_t wlen)
{
    zs_status_t st = zd_boot_check_token(&mesh->p, c, h, why, wlen);

    *fatal_p = st == ZS_OK;
    return st == ZS_OK ? zd_boot_check_match(&mesh->p, b, h, why, wlen) : st;
}

static void zd_boot_refuse(ucp_ep_h ep, zs_status_t st, const char *why)
{
    Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__Refuse r = ZEROD__MESH__V1__REFUSE__INIT;

    r.status = (Zerod__Common__V1__Status)st;
    r.message = (char *)why;
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_REFUSE;
    msg.refuse = &r;
    zd_ucx_send_msg(ep, ZD_AM_BOOT, &msg, false);
}

/* Let the clients close their bootstrap connections first (bounded): the side that closes
 * first keeps the TCP port in TIME_WAIT, and rank 0's port must stay free for the next mesh
 * of the job. */
static void zd_boot_wait_closed(zd_boot_t *b)
{
    zs_deadline_t d = zs_deadline_in_ms(2000);

    while (!zs_deadline_expired(d)) {
        bool open = false;
        for (size_t i = 0; i < b->n_conns; i++) {
            open |= b->conns[i].joined && !b->conns[i].failed;
        }
        if (!open) {
            return;
        }
        zd_boot_progress(b);
    }
}

/* UCX does not set SO_REUSEADDR: a bootstrap connection of an earlier mesh may still hold the
 * port in TIME_WAIT, so retry until mesh_timeout. */
static zs_status_t zd_boot_listen(const zd_mesh_t *mesh, zd_boot_t *b, zs_deadline_t deadline,
                                  char *err, size_t errlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    ucp_listener_params_t lp;
    struct sockaddr_storage ss;
    socklen_t sslen;
    ucs_status_t us;
    zs_status_t st;

    st = zd_parse_hostport(p->coordinator, &ss, &sslen, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sslen;
    lp.conn_handler.cb = zd_boot_conn_request_cb;
    lp.conn_handler.arg = b;
    while ((us = ucp_listener_create(b->worker, &lp, &b->listener)) != UCS_OK) {
        if (us != UCS_ERR_BUSY || zs_deadline_expired(deadline)) {
            return zs_errf(err, errlen, ZS_ERR_UNREACHABLE,
                           "rank 0 cannot listen on coordinator %s: %s", p->coordinator,
                           ucs_status_string(us));
        }
        usleep(250000);
    }
    zs_info(ZS_SUB_MESH, "rank 0 listening on %s for %u ranks of job '%s'", p->coordinator,
            p->world - 1, p->job_id);
    return ZS_OK;
}

/* mesh_timeout passed: name the ranks that did not join. */
static zs_status_t zd_boot_timed_out(const zd_mesh_t *mesh, const zd_boot_t *b, char *err,
                                     size_t errlen)
{
    char missing[256] = "";
    size_t used = 0;

    for (uint32_t r = 1; r < mesh->p.world && used + 12 < sizeof(missing); r++) {
        bool have = false;
        for (size_t i = 0; i < b->n_conns; i++) {
            have |= b->conns[i].joined && b->conns[i].rank == r;
        }
        if (!have) {
            used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%u",
                                     used ? ", " : "", r);
        }
    }
    return zs_errf(err, errlen, ZS_ERR_TIMEOUT,
                   "mesh formation timed out after %.1f s (mesh_timeout): rank(s) %s did not join",
                   (double)mesh->p.mesh_timeout_ns * 1e-9, missing);
}

static zd_boot_conn_t *zd_boot_conn_add(zd_boot_t *b)
{
    zd_boot_conn_t *c;

    if (b->n_conns == b->cap_conns) {
        size_t cap = b->cap_conns ? 2 * b->cap_conns : 8;
        zd_boot_conn_t *nc = realloc(b->conns, cap * sizeof(*nc));
        if (nc == NULL) {
            return NULL;
        }
        b->conns = nc;
        b->cap_conns = cap;
    }
    c = &b->conns[b->n_conns];
    memset(c, 0, sizeof(*c));
    return c;
}

/* Where a connection request came from, "address:port" (or "an unknown address"). */
static void zd_boot_peer_name(ucp_conn_request_h req, char *out, size_t len)
{
    ucp_conn_request_attr_t attr;
    char host[INET6_ADDRSTRLEN], port[8];

    snprintf(out, len, "an unknown address");
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &attr) != UCS_OK ||
        getnameinfo((const struct sockaddr *)&attr.client_address, sizeof(attr.client_address),
                    host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        return;
    }
    snprintf(out, len, strchr(host, ':') != NULL ? "[%s]:%s" : "%s:%s", host, port);
}

/* New connections: each gets an endpoint and a challenge (a fresh nonce). */
static void zd_boot_challenge(const zd_mesh_t *mesh, zd_boot_t *b)
{
    while (b->n_requests > 0) {
        ucp_conn_request_h req = b->requests[--b->n_requests];
        Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
        Zerod__Mesh__V1__Challenge ch = ZEROD__MESH__V1__CHALLENGE__INIT;
        zd_boot_conn_t *c = zd_boot_conn_add(b);
        ucp_ep_params_t ep;

        if (c == NULL) {
            ucp_listener_reject(b->listener, req);
            continue;
        }
        zd_boot_peer_name(req, c->from, sizeof(c->from));
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.conn_request = req;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = zd_boot_server_ep_err_cb;
        ep.err_handler.arg = b;
        if (ucp_ep_create(b->worker, &ep, &c->ep) != UCS_OK) {
            continue;
        }
        if (getrandom(c->nonce, sizeof(c->nonce), 0) != (ssize_t)sizeof(c->nonce)) {
            zd_ucx_ep_close(b->worker, c->ep, true);
            continue;
        }
        b->n_conns++;
        ch.nonce.data = c->nonce;
        ch.nonce.len = sizeof(c->nonce);
        ch.protocol = ZD_MESH_PROTOCOL;
        ch.job_id = (char *)mesh->p.job_id;
        msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_CHALLENGE;
        msg.challenge = &ch;
        zd_ucx_send_msg(c->ep, ZD_AM_BOOT, &msg, false);
    }
}

/* The hello of c was accepted: keep its rank and worker addresses. */
static zs_status_t zd_boot_join(const zd_mesh_t *mesh, zd_boot_conn_t *c,
                                const Zerod__Mesh__V1__MeshHello *h, uint32_t joined, char *err,
                                size_t errlen)
{
    c->address = malloc(h->worker_address.len);
    c->heartbeat_address = malloc(h->heartbeat_address.len);
    if (c->address == NULL || c->heartbeat_address == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    c->joined = true;
    c->rank = h->rank;
    memcpy(c->address, h->worker_address.data, h->worker_address.len);
    c->address_len = h->worker_address.len;
    memcpy(c->heartbeat_address, h->heartbeat_address.data, h->heartbeat_address.len);
    c->heartbeat_address_len = h->heartbeat_address.len;
    zs_info(ZS_SUB_MESH, "rank %u joined (%u of %u)", c->rank, joined, mesh->p.world - 1);
    return ZS_OK;
}

static bool zd_boot_rank_joined(const zd_boot_t *b, uint32_t rank)
{
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined && b->conns[i].rank == rank) {
            return true;
        }
    }
    return false;
}

/* A hello refused for its token claimed `rank` of this job: unless that rank joins within one
 * heartbeat_interval, formation fails with ZS_ERR_AUTH naming it (zd_boot_auth_check) instead
 * of waiting out mesh_timeout for a rank whose daemon was just told no and stopped trying.
 *
 * Why a grace and not at once: a hello is unauthenticated until it passes, so anyone who can
 * reach the coordinator's port can claim any rank of a job whose id they know (a daemon of an
 * earlier job, a stray zerod with another token). Failing at once would let that stranger kill
 * every formation it races. With the grace, the real rank -- whose daemon retries the
 * coordinator every 20 ms from the moment its trainer attached -- has a heartbeat_interval to
 * join and cancel the charge; a job only fails when the claimed rank really did not come,
 * which is then almost surely the one that was refused. The earliest refusal is kept: a stream
 * of them cannot push the deadline back. */
static void zd_boot_auth_note(const zd_mesh_t *mesh, zd_boot_t *b,
                              const Zerod__Mesh__V1__MeshHello *h, const char *why)
{
    const zd_mesh_params_t *p = &mesh->p;

    if (b->auth_pending || h->rank == 0 || h->rank >= p->world || h->job_id == NULL ||
        strcmp(h->job_id, p->job_id) != 0 || zd_boot_rank_joined(b, h->rank)) {
        return;
    }
    b->auth_pending = true;
    b->auth_rank = h->rank;
    b->auth_deadline = zs_deadline_in_ns(p->heartbeat_interval_ns);
    snprintf(b->auth_why, sizeof(b->auth_why), "%s", why);
}

/* The refusal noted by zd_boot_auth_note: forgotten once its rank joined, ZS_ERR_AUTH once its
 * grace is over. */
static zs_status_t zd_boot_auth_check(const zd_mesh_t *mesh, zd_boot_t *b, char *err, size_t errlen)
{
    if (!b->auth_pending) {
        return ZS_OK;
    }
    if (zd_boot_rank_joined(b, b->auth_rank)) {
        b->auth_pending = false;
        return ZS_OK;
    }
    if (!zs_deadline_expired(b->auth_deadline)) {
        return ZS_OK;
    }
    return zs_errf(err, errlen, ZS_ERR_AUTH,
                   "mesh formation failed: rank %u did not join within %.1f s "
                   "(heartbeat_interval) of rank 0 refusing its hello: %s",
                   b->auth_rank, (double)mesh->p.heartbeat_interval_ns * 1e-9, b->auth_why);
}

static zd_boot_conn_t *zd_boot_conn_of(zd_boot_t *b, const zd_boot_msg_t *m)
{
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].ep == m->reply_ep) {
            return &b->conns[i];
        }
    }
    return NULL;
}

/* After formation failed: a hello that came in is answered with the refusal `told` (a wrong
 * token only learns that). */
static void zd_boot_tell_hello(const zd_mesh_t *mesh, zd_boot_t *b, const zd_boot_msg_t *m,
                               zs_status_t st, const char *told)
{
    zd_boot_conn_t *c = zd_boot_conn_of(b, m);
    zd_mesh_msg_t *msg = NULL;
    char why[512];

    if (c == NULL || c->joined || c->told || zd_boot_unpack(m, &msg) != ZS_OK ||
        msg->body_case != ZEROD__MESH__V1__MESH_MSG__BODY_HELLO) {
        zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
        return;
    }
    if (zd_boot_check_token(&mesh->p, c, msg->hello, why, sizeof(why)) != ZS_OK) {
        zd_boot_refuse(c->ep, ZS_ERR_AUTH, why);
        c->failed = true;
    } else {
        zd_boot_refuse(c->ep, st, told);
        c->told = true;
        c->rank = msg->hello->rank;
    }
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
}

/* Has every rank > 0 been told, and closed its connection (it closes on the Refuse)? */
static bool zd_boot_all_told(const zd_mesh_t *mesh, const zd_boot_t *b)
{
    for (uint32_t r = 1; r < mesh->p.world; r++) {
        bool told = false;
        for (size_t i = 0; i < b->n_conns; i++) {
            told |= b->conns[i].told && b->conns[i].rank == r;
        }
        if (!told) {
            return false;
        }
    }
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].told && !b->conns[i].failed) {
            return false;
        }
    }
    return true;
}

/* Formation failed on a hello (`why`, already sent to that rank): tell every other rank of the
 * job instead of letting it wait out mesh_timeout. The ranks that joined get a Refuse naming
 * it. A rank whose daemon was still connecting -- its trainer attached a moment later, or its
 * hello was still on the way -- would find the port closed and retry until mesh_timeout: so for
 * up to ZD_BOOT_LINGER_MS rank 0 keeps its port, challenges whoever connects and refuses their
 * hello the same way, until every rank was told and closed. A rank that comes later than that
 * still waits out its mesh_timeout. */
static void zd_boot_tell_all(const zd_mesh_t *mesh, zd_boot_t *b, zs_status_t st, const char *why)
{
    zs_deadline_t d = zs_deadline_in_ms(ZD_BOOT_LINGER_MS);
    char told[600];
    zd_boot_msg_t *m;

    snprintf(told, sizeof(told), "mesh formation of job '%s' failed: %s", mesh->p.job_id, why);
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined && !b->conns[i].failed) {
            zd_boot_refuse(b->conns[i].ep, st, told);
            b->conns[i].told = true;
        }
    }
    while (!zs_deadline_expired(d) && !zd_boot_all_told(mesh, b)) {
        zd_boot_progress(b);
        zd_boot_challenge(mesh, b);
        while ((m = zd_boot_pop(b)) != NULL) {
            zd_boot_tell_hello(mesh, b, m, st, told);
            zd_boot_msg_free(m);
        }
    }
}

/* One message on rank 0's side: a hello from a connection that has not joined yet. A bad
 * token refuses that connection (and may fail formation a heartbeat_interval later:
 * zd_boot_auth_note); any other mismatch refuses it and fails formation. */
static zs_status_t zd_boot_hello(const zd_mesh_t *mesh, zd_boot_t *b, const zd_boot_msg_t *m,
                                 uint32_t *joined_p, char *err, size_t errlen)
{
    zd_mesh_msg_t *msg = NULL;
    zd_boot_conn_t *c = NULL;
    char why[512];
    bool fatal = false;
    uint32_t msg_rank;
    zs_status_t st;

    c = zd_boot_conn_of(b, m);
    if (c == NULL || zd_boot_unpack(m, &msg) != ZS_OK ||
        msg->body_case != ZEROD__MESH__V1__MESH_MSG__BODY_HELLO || c->joined) {
        zs_warn(ZS_SUB_MESH, "dropping an unexpected bootstrap message (%zu bytes)", m->len);
        zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
        return ZS_OK;
    }
    st = zd_boot_check_hello(mesh, b, c, msg->hello, &fatal, why, sizeof(why));
    if (st == ZS_OK) {
        st = zd_boot_join(mesh, c, msg->hello, ++*joined_p, err, errlen);
        zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
        return st;
    }
    if (st == ZS_ERR_AUTH) {
        zd_boot_auth_note(mesh, b, msg->hello, why);
    }
    msg_rank = msg->hello->rank;
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    zs_warn(ZS_SUB_MESH, "refused: %s", why);
    zd_boot_refuse(c->ep, st, why);
    if (!fatal) {
        c->failed = true;
        return ZS_OK;
    }
    c->told = true;
    c->rank = msg_rank;
    zd_boot_tell_all(mesh, b, st, why);
    return zs_errf(err, errlen, st, "%s", why);
}

/* Everyone is here: the roster of data and heartbeat addresses, sent to each rank. */
static zs_status_t zd_boot_welcome(const zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster,
                                   char *err, size_t errlen)
{
    uint32_t world = mesh->p.world;
    Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__Welcome w = ZEROD__MESH__V1__WELCOME__INIT;
    ProtobufCBinaryData *rb = calloc(2 * (size_t)world, sizeof(*rb));

    if (rb == NULL || zd_roster_alloc(roster, world) != ZS_OK) {
        free(rb);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    roster->data[0] = (uint8_t *)mesh->address;
    roster->data_len[0] = mesh->address_len;
    zd_heartbeat_address(mesh->heartbeat, (const uint8_t **)&roster->heartbeat[0],
                         &roster->heartbeat_len[0]);
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined) {
            uint32_t r = b->conns[i].rank;
            roster->data[r] = b->conns[i].address;
            roster->data_len[r] = b->conns[i].address_len;
            roster->heartbeat[r] = b->conns[i].heartbeat_address;
            roster->heartbeat_len[r] = b->conns[i].heartbeat_address_len;
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        rb[r] = (ProtobufCBinaryData){roster->data_len[r], roster->data[r]};
        rb[world + r] = (ProtobufCBinaryData){roster->heartbeat_len[r], roster->heartbeat[r]};
    }
    w.n_roster = w.n_heartbeat_roster = world;
    w.roster = rb;
    w.heartbeat_roster = rb + world;
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_WELCOME;
    msg.welcome = &w;
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined) {
            zd_ucx_send_msg(b->conns[i].ep, ZD_AM_BOOT, &msg, false);
        }
    }
    free(rb);
    zd_boot_wait_closed(b);
    return ZS_OK;
}

zs_status_t zd_boot_server(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster, char *err,
                           size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(mesh->p.mesh_timeout_ns);
    uint32_t joined = 0;
    zs_status_t st = zd_boot_listen(mesh, b, deadline, err, errlen);

    while (st == ZS_OK && joined < mesh->p.world - 1) {
        zd_boot_msg_t *m;

        if (zd_mesh_params_cancelled(&mesh->p)) {
            return zs_errf(err, errlen, ZS_ERR_ABORTED,
                           "mesh formation stopped: the daemon is shutting down");
        }
        if (zs_deadline_expired(deadline)) {
            return zd_boot_timed_out(mesh, b, err, errlen);
        }
        zd_boot_progress(b);
        zd_boot_challenge(mesh, b);
        while (st == ZS_OK && (m = zd_boot_pop(b)) != NULL) {
            st = zd_boot_hello(mesh, b, m, &joined, err, errlen);
            zd_boot_msg_free(m);
        }
        for (size_t i = 0; st == ZS_OK && i < b->n_conns; i++) {
            if (b->conns[i].joined && b->conns[i].failed) {
                st = zs_errf(err, errlen, ZS_ERR_PEER_LOST,
                             "rank %u disconnected during mesh formation", b->conns[i].rank);
            }
        }
        if (st == ZS_OK && joined < mesh->p.world - 1) {
            st = zd_boot_auth_check(mesh, b, err, errlen);
        }
    }
    return st == ZS_OK ? zd_boot_welcome(mesh, b, roster, err, errlen) : st;
}
