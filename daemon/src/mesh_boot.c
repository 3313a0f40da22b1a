/*
 * Forming a job's mesh (docs/architecture.md): rank 0 listens on the coordinator address (a
 * TCP-only bootstrap context), the other ranks connect until mesh_timeout, answer a challenge with
 * a MeshHello (HMAC under the job token), and once every rank said hello rank 0 sends each the
 * roster of data and watch worker addresses -- or a Refuse naming what differs.
 */
#define _GNU_SOURCE
#include "mesh_int.h"
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

#define ZD_NONCE_LEN    32
#define ZD_HMAC_LEN     32
#define ZD_BOOT_MSG_MAX (1u << 20)

/* A bootstrap message received on some endpoint, queued by the AM callback. */
typedef struct zd_boot_msg {
    struct zd_boot_msg *next;
    ucp_ep_h reply_ep;
    uint8_t *data;
    size_t len;
    bool ready; /* false while a rendezvous receive is in flight */
} zd_boot_msg_t;

typedef struct zd_boot_conn {
    ucp_ep_h ep;
    bool failed;
    bool joined;
    uint32_t rank;
    uint8_t nonce[ZD_NONCE_LEN];
    uint8_t *address;
    size_t address_len;
    uint8_t *watch_address;
    size_t watch_address_len;
} zd_boot_conn_t;

/* The TCP-only bootstrap side: lives only while the mesh forms. */
typedef struct zd_boot {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    ucp_conn_request_h *requests; /* pending connection requests */
    size_t n_requests, cap_requests;
    zd_boot_msg_t *head, *tail;
    zd_boot_conn_t *conns;
    size_t n_conns, cap_conns;
    bool client_failed; /* rank > 0: the coordinator endpoint failed */
    ucs_status_t client_status;
} zd_boot_t;

static zs_status_t zd_roster_alloc(zd_roster_t *r, uint32_t world)
{
    r->data = calloc(world, sizeof(*r->data));
    r->data_len = calloc(world, sizeof(*r->data_len));
    r->watch = calloc(world, sizeof(*r->watch));
    r->watch_len = calloc(world, sizeof(*r->watch_len));
    if (r->data == NULL || r->data_len == NULL || r->watch == NULL || r->watch_len == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    return ZS_OK;
}

static void zd_roster_free(zd_roster_t *r)
{
    free(r->data);
    free(r->data_len);
    free(r->watch);
    free(r->watch_len);
    memset(r, 0, sizeof(*r));
}

static void zd_hmac(const uint8_t *token, size_t token_len, const uint8_t *nonce,
                    const char *job_id, uint32_t rank, uint8_t out[ZD_HMAC_LEN])
{
    uint8_t msg[ZD_NONCE_LEN + 128 + 4];
    size_t n = 0, jl = strlen(job_id);
    unsigned int outlen = ZD_HMAC_LEN;

    if (jl > 128) {
        jl = 128;
    }
    memcpy(msg, nonce, ZD_NONCE_LEN);
    n += ZD_NONCE_LEN;
    memcpy(msg + n, job_id, jl);
    n += jl;
    for (int i = 0; i < 4; i++) {
        msg[n++] = (uint8_t)(rank >> (8 * i));
    }
    HMAC(EVP_sha256(), token, (int)token_len, msg, n, out, &outlen);
}

zs_status_t zd_mesh_read_token(const char *path, uint8_t *buf, size_t *len_p, char *err,
                               size_t errlen)
{
    struct stat st;
    ssize_t n;
    int fd;

    if (path == NULL || path[0] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "a job with world > 1 needs a shared token: set config key 'token_file' "
                       "(zerorun --spawn-daemons writes one)");
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        return zs_errf(err, errlen, ZS_ERR_CONFIG, "config key 'token_file' ('%s'): %s", path,
                       strerror(errno));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "config key 'token_file' ('%s'): not a regular file", path);
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        return zs_errf(
            err, errlen, ZS_ERR_PERMISSION,
            "config key 'token_file' ('%s'): must be owned by uid %u with mode 0600 (it is uid "
            "%u mode %04o)",
            path, (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
    }
    n = read(fd, buf, ZD_TOKEN_MAX);
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) {
        n--;
    }
    if (n < 16) {
        return zs_errf(err, errlen, ZS_ERR_CONFIG,
                       "config key 'token_file' ('%s'): holds %zd bytes; at least 16 are needed",
                       path, n < 0 ? 0 : n);
    }
    *len_p = (size_t)n;
    return ZS_OK;
}

static ucs_status_t zd_send_msg(ucp_ep_h ep, unsigned id, const zd_mesh_msg_t *msg, bool reply)
{
    return zd_ucx_send_msg(ep, id, msg, reply);
}

/* ---- bootstrap ------------------------------------------------------------------------ */

static void zd_boot_rndv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    zd_boot_msg_t *m = user_data;

    m->ready = true;
    if (status != UCS_OK) {
        m->len = 0;
    }
    ucp_request_free(request);
}

static ucs_status_t zd_boot_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    (void)header_length;
    zd_boot_t *b = arg;
    zd_boot_msg_t *m;

    if (length > ZD_BOOT_MSG_MAX) {
        return UCS_OK; /* dropped: a bootstrap message is never this large */
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return UCS_OK;
    }
    m->data = malloc(length ? length : 1);
    if (m->data == NULL) {
        free(m);
        return UCS_OK;
    }
    m->len = length;
    m->reply_ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        ucp_request_param_t prm;
        void *req;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        prm.cb.recv_am = zd_boot_rndv_cb;
        prm.user_data = m;
        req = ucp_am_recv_data_nbx(b->worker, data, m->data, length, &prm);
        if (req == NULL) {
            m->ready = true;
        } else if (UCS_PTR_IS_ERR(req)) {
            free(m->data);
            free(m);
            return UCS_OK;
        }
    } else {
        memcpy(m->data, data, length);
        m->ready = true;
    }
    if (b->tail != NULL) {
        b->tail->next = m;
    } else {
        b->head = m;
    }
    b->tail = m;
    return UCS_OK;
}

/* Oldest message that is ready, or NULL. */
static zd_boot_msg_t *zd_boot_pop(zd_boot_t *b)
{
    zd_boot_msg_t *m = b->head, *prev = NULL;

    while (m != NULL && !m->ready) {
        prev = m;
        m = m->next;
    }
    if (m == NULL) {
        return NULL;
    }
    if (prev != NULL) {
        prev->next = m->next;
    } else {
        b->head = m->next;
    }
    if (b->tail == m) {
        b->tail = prev;
    }
    return m;
}

static void zd_boot_msg_free(zd_boot_msg_t *m)
{
    if (m != NULL) {
        free(m->data);
        free(m);
    }
}

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

static void zd_boot_client_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    zd_boot_t *b = arg;

    b->client_failed = true;
    b->client_status = status;
}

/* force: the formation failed, and an endpoint's peer may never answer a flush (a stranger on
 * the coordinator's port, a dead daemon): close without one. */
static void zd_boot_cleanup(zd_boot_t *b, bool force)
{
    zd_boot_msg_t *m;

    for (size_t i = 0; i < b->n_conns; i++) {
        zd_ucx_ep_close(b->worker, b->conns[i].ep, force);
        free(b->conns[i].address);
        free(b->conns[i].watch_address);
    }
    free(b->conns);
    for (size_t i = 0; i < b->n_requests; i++) {
        ucp_listener_reject(b->listener, b->requests[i]);
    }
    free(b->requests);
    if (b->listener != NULL) {
        ucp_listener_destroy(b->listener);
    }
    /* flush anything still in flight (a Welcome, a Refuse) before the worker goes */
    for (int i = 0; i < 1000 && b->worker != NULL; i++) {
        if (ucp_worker_progress(b->worker) == 0) {
            break;
        }
    }
    while ((m = b->head) != NULL) {
        b->head = m->next;
        if (!m->ready) {
            /* a rendezvous receive still owns m->data; leaking it beats a use-after-free */
            continue;
        }
        zd_boot_msg_free(m);
    }
    zd_ucx_cleanup(b->ctx, b->worker);
    memset(b, 0, sizeof(*b));
}

static zs_status_t zd_parse_hostport(const char *coordinator, struct sockaddr_storage *ss,
                                     socklen_t *len_p, char *err, size_t errlen)
{
    char host[256];
    const char *colon = strrchr(coordinator ? coordinator : "", ':');
    struct addrinfo hints, *res = NULL;
    size_t hl;
    int rc;

    if (coordinator == NULL || colon == NULL || colon == coordinator || colon[1] == '\0') {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach.coordinator '%s' is not host:port",
                       coordinator ? coordinator : "");
    }
    hl = (size_t)(colon - coordinator);
    if (hl >= sizeof(host)) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach.coordinator host is too long");
    }
    memcpy(host, coordinator, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0 || res == NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "attach.coordinator '%s': %s", coordinator,
                       gai_strerror(rc));
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len_p = res->ai_addrlen;
    freeaddrinfo(res);
    return ZS_OK;
}

/* Progress the bootstrap worker; sleep briefly when nothing happened. */
static void zd_boot_progress(zd_boot_t *b)
{
    if (ucp_worker_progress(b->worker) == 0) {
        usleep(200);
    }
}

static zs_status_t zd_boot_unpack(const zd_boot_msg_t *m, zd_mesh_msg_t **msg_p)
{
    *msg_p = zerod__mesh__v1__mesh_msg__unpack(NULL, m->len, m->data);
    return *msg_p != NULL ? ZS_OK : ZS_ERR_PROTOCOL;
}

/* Rank 0: check one hello. Fatal mismatches fail formation; a bad token only refuses. */
static zs_status_t zd_boot_check_hello(const zd_mesh_t *mesh, zd_boot_t *b, zd_boot_conn_t *c,
                                       const Zerod__Mesh__V1__MeshHello *h, bool *fatal_p,
                                       char *why, size_t wlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    uint8_t mac[ZD_HMAC_LEN];

    *fatal_p = false;
    if (h->hmac.len != ZD_HMAC_LEN || h->rank >= 65536) {
        return zs_errf(why, wlen, ZS_ERR_AUTH, "mesh hello from %s: malformed authentication",
                       h->rank < 65536 ? "a peer" : "a peer with an invalid rank");
    }
    zd_hmac(p->token, p->token_len, c->nonce, h->job_id, h->rank, mac);
    if (CRYPTO_memcmp(mac, h->hmac.data, ZD_HMAC_LEN) != 0) {
        return zs_errf(why, wlen, ZS_ERR_AUTH,
                       "mesh hello claiming rank %u of job '%s' has a wrong token (HMAC mismatch)",
                       h->rank, h->job_id);
    }
    *fatal_p = true;
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
    if (h->step != p->step || h->params_loaded != p->params_loaded) {
        return zs_errf(why, wlen, ZS_ERR_STATE,
                       "rank %u is at step %llu (params %s), rank 0 at step %llu (params %s)",
                       h->rank, (unsigned long long)h->step,
                       h->params_loaded ? "loaded" : "not loaded", (unsigned long long)p->step,
                       p->params_loaded ? "loaded" : "not loaded");
    }
    if (h->worker_address.len == 0 || h->worker_address.len > 65536 || h->watch_address.len == 0 ||
        h->watch_address.len > 65536) {
        return zs_errf(why, wlen, ZS_ERR_INVALID,
                       "rank %u sent worker addresses of %zu and %zu bytes", h->rank,
                       h->worker_address.len, h->watch_address.len);
    }
    return ZS_OK;
}

static void zd_boot_refuse(ucp_ep_h ep, zs_status_t st, const char *why)
{
    Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__Refuse r = ZEROD__MESH__V1__REFUSE__INIT;

    r.status = (Zerod__Common__V1__Status)st;
    r.message = (char *)why;
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_REFUSE;
    msg.refuse = &r;
    zd_send_msg(ep, ZD_AM_BOOT, &msg, false);
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

/* ---- rank 0 ------------------------------------------------------------------------------ */

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
        zd_send_msg(c->ep, ZD_AM_BOOT, &msg, false);
    }
}

/* The hello of c was accepted: keep its rank and worker addresses. */
static zs_status_t zd_boot_join(const zd_mesh_t *mesh, zd_boot_conn_t *c,
                                const Zerod__Mesh__V1__MeshHello *h, uint32_t joined, char *err,
                                size_t errlen)
{
    c->address = malloc(h->worker_address.len);
    c->watch_address = malloc(h->watch_address.len);
    if (c->address == NULL || c->watch_address == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    c->joined = true;
    c->rank = h->rank;
    memcpy(c->address, h->worker_address.data, h->worker_address.len);
    c->address_len = h->worker_address.len;
    memcpy(c->watch_address, h->watch_address.data, h->watch_address.len);
    c->watch_address_len = h->watch_address.len;
    zs_info(ZS_SUB_MESH, "rank %u joined (%u of %u)", c->rank, joined, mesh->p.world - 1);
    return ZS_OK;
}

/* One message on rank 0's side: a hello from a connection that has not joined yet. A bad
 * token only refuses that connection; any other mismatch refuses it and fails formation. */
static zs_status_t zd_boot_hello(const zd_mesh_t *mesh, zd_boot_t *b, const zd_boot_msg_t *m,
                                 uint32_t *joined_p, char *err, size_t errlen)
{
    zd_mesh_msg_t *msg = NULL;
    zd_boot_conn_t *c = NULL;
    char why[512];
    bool fatal = false;
    zs_status_t st;

    for (size_t i = 0; i < b->n_conns; i++) {
        c = b->conns[i].ep == m->reply_ep ? &b->conns[i] : c;
    }
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
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    zs_warn(ZS_SUB_MESH, "refused: %s", why);
    zd_boot_refuse(c->ep, st, why);
    if (!fatal) {
        c->failed = true;
        return ZS_OK;
    }
    c->joined = true; /* let the refusal reach the peer (it closes on it) before failing */
    zd_boot_wait_closed(b);
    return zs_errf(err, errlen, st, "%s", why);
}

/* Everyone is here: the roster of data and watch addresses, sent to each rank. */
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
    zd_watch_address(mesh->watch, (const uint8_t **)&roster->watch[0], &roster->watch_len[0]);
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined) {
            uint32_t r = b->conns[i].rank;
            roster->data[r] = b->conns[i].address;
            roster->data_len[r] = b->conns[i].address_len;
            roster->watch[r] = b->conns[i].watch_address;
            roster->watch_len[r] = b->conns[i].watch_address_len;
        }
    }
    for (uint32_t r = 0; r < world; r++) {
        rb[r] = (ProtobufCBinaryData){roster->data_len[r], roster->data[r]};
        rb[world + r] = (ProtobufCBinaryData){roster->watch_len[r], roster->watch[r]};
    }
    w.n_roster = w.n_watch_roster = world;
    w.roster = rb;
    w.watch_roster = rb + world;
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_WELCOME;
    msg.welcome = &w;
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined) {
            zd_send_msg(b->conns[i].ep, ZD_AM_BOOT, &msg, false);
        }
    }
    free(rb);
    zd_boot_wait_closed(b);
    return ZS_OK;
}

static zs_status_t zd_boot_server(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster, char *err,
                                  size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(mesh->p.mesh_timeout_ns);
    uint32_t joined = 0;
    zs_status_t st = zd_boot_listen(mesh, b, deadline, err, errlen);

    while (st == ZS_OK && joined < mesh->p.world - 1) {
        zd_boot_msg_t *m;

        if (zd_mesh_cancelled(mesh)) {
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
    }
    return st == ZS_OK ? zd_boot_welcome(mesh, b, roster, err, errlen) : st;
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
    h.worker_address.data = (uint8_t *)mesh->address;
    h.worker_address.len = mesh->address_len;
    zd_watch_address(mesh->watch, (const uint8_t **)&h.watch_address.data, &h.watch_address.len);
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

    if (msg->welcome->n_roster != world || msg->welcome->n_watch_roster != world) {
        return zs_errf(err, errlen, ZS_ERR_PROTOCOL,
                       "rank 0 sent a roster of %zu (watch %zu) ranks for world %u",
                       msg->welcome->n_roster, msg->welcome->n_watch_roster, world);
    }
    if (zd_roster_alloc(roster, world) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory in mesh formation");
    }
    for (uint32_t r = 0; r < world; r++) {
        roster->data[r] = msg->welcome->roster[r].data;
        roster->data_len[r] = msg->welcome->roster[r].len;
        roster->watch[r] = msg->welcome->watch_roster[r].data;
        roster->watch_len[r] = msg->welcome->watch_roster[r].len;
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

        if (zd_mesh_cancelled(mesh)) {
            st = zs_errf(err, errlen, ZS_ERR_ABORTED,
                         "mesh formation stopped: the daemon is shutting down");
            break;
        }
        if (zs_deadline_expired(deadline)) {
            st = zs_errf(err, errlen, hello_sent ? ZS_ERR_TIMEOUT : ZS_ERR_UNREACHABLE,
                         "coordinator %s unreachable: no mesh after %.1f s (mesh_timeout, %u "
                         "connection attempts%s%s)",
                         p->coordinator, (double)p->mesh_timeout_ns * 1e-9, attempts,
                         b->client_status != UCS_OK ? ", last: " : "",
                         b->client_status != UCS_OK ? ucs_status_string(b->client_status) : "");
            break;
        }
        if (ep == NULL) {
            attempts++;
            ep = zd_boot_connect(b, &ss, sslen);
            if (ep == NULL) {
                usleep(200000);
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
            usleep(200000); /* rank 0 may not listen yet: retry until mesh_timeout */
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

zs_status_t zd_mesh_boot(zd_mesh_t *mesh, char *err, size_t errlen)
{
    ucp_am_handler_param_t ah;
    zd_boot_t boot;
    zd_roster_t roster;
    zd_mesh_msg_t *welcome = NULL;
    zs_status_t st;

    memset(&boot, 0, sizeof(boot));
    memset(&roster, 0, sizeof(roster));
    /* ucp_listener connections need TCP here (UCX 1.13: "no remote ep address for lane" with
     * the default transports); the data worker keeps every transport */
    st = zd_ucx_init("tcp", UCP_FEATURE_AM, &boot.ctx, &boot.worker, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = ZD_AM_BOOT;
    ah.cb = zd_boot_am_cb;
    ah.arg = &boot;
    ucp_worker_set_am_recv_handler(boot.worker, &ah);
    st = mesh->p.rank == 0 ? zd_boot_server(mesh, &boot, &roster, err, errlen)
                           : zd_boot_client(mesh, &boot, &roster, &welcome, err, errlen);
    if (st == ZS_OK) {
        st = zd_mesh_connect(mesh, &roster, err, errlen);
    }
    zd_boot_cleanup(&boot, st != ZS_OK);
    zd_roster_free(&roster);
    zerod__mesh__v1__mesh_msg__free_unpacked(welcome, NULL);
    return st;
}
