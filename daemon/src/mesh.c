#define _GNU_SOURCE
#include "mesh.h"
#include "zs/version.h"

#include "ucx_util.h"
#include "watch.h"
#include "zerod/mesh/v1/mesh.pb-c.h"
#include "zs/log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* a barrier polls without sleeping this long, then sleeps 50 us between polls */
#define ZD_BARRIER_SPIN_NS (2u * 1000u * 1000u)

#define ZD_NONCE_LEN       32
#define ZD_HMAC_LEN        32
#define ZD_MSG_MAX         (1u << 20)
#define ZD_IDLE_SPINS      2000

typedef Zerod__Mesh__V1__MeshMsg zd_mesh_msg_t;

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

/* Every rank's worker addresses, by rank: the data worker and the watch worker. The bytes
 * belong to the bootstrap connections, the Welcome or this mesh. */
typedef struct zd_roster {
    uint8_t **data;
    size_t *data_len;
    uint8_t **watch;
    size_t *watch_len;
} zd_roster_t;

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

typedef struct zd_peer_ref {
    zd_mesh_t *mesh;
    uint32_t rank;
} zd_peer_ref_t;

struct zd_mesh {
    zd_mesh_params_t p;
    char job_id[128];
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *address;
    size_t address_len;
    ucp_ep_h *eps;
    zd_peer_ref_t *refs;
    uint64_t *barrier_seen;
    bool *left; /* ranks whose job ended normally (LEAVE) */
    uint64_t barrier_seq;
    zd_watch_t *watch; /* liveness: heartbeats and endpoint errors, on a thread of its own */
    int efd;
    bool aborted;
    char why[512];
    bool closing;
};

/* ---- small helpers -------------------------------------------------------------------- */

static void zd_mesh_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void zd_mesh_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
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
        zd_mesh_fail(err, errlen,
                     "a job with world > 1 needs a shared token: set config key 'token_file' "
                     "(zerorun --spawn-daemons writes one)");
        return ZS_ERR_CONFIG;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        zd_mesh_fail(err, errlen, "config key 'token_file' ('%s'): %s", path, strerror(errno));
        return ZS_ERR_CONFIG;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        zd_mesh_fail(err, errlen, "config key 'token_file' ('%s'): not a regular file", path);
        return ZS_ERR_CONFIG;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        close(fd);
        zd_mesh_fail(
            err, errlen,
            "config key 'token_file' ('%s'): must be owned by uid %u with mode 0600 (it is uid "
            "%u mode %04o)",
            path, (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        return ZS_ERR_PERMISSION;
    }
    n = read(fd, buf, ZD_TOKEN_MAX);
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) {
        n--;
    }
    if (n < 16) {
        zd_mesh_fail(err, errlen,
                     "config key 'token_file' ('%s'): holds %zd bytes; at least 16 are needed",
                     path, n < 0 ? 0 : n);
        return ZS_ERR_CONFIG;
    }
    *len_p = (size_t)n;
    return ZS_OK;
}

static ucs_status_t zd_send_msg(ucp_ep_h ep, unsigned id, const zd_mesh_msg_t *msg, bool reply)
{
    return zd_ucx_send_msg(ep, id, msg, reply);
}

/* ---- bootstrap ------------------------------------------------------------------------ */

typedef struct zd_rndv_ctx {
    zd_boot_msg_t *msg;
} zd_rndv_ctx_t;

static void zd_boot_rndv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
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
    zd_boot_t *b = arg;
    zd_boot_msg_t *m;

    if (length > ZD_MSG_MAX) {
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
    zd_boot_t *b = arg;

    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].ep == ep) {
            b->conns[i].failed = true;
        }
    }
}

static void zd_boot_client_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    zd_boot_t *b = arg;

    b->client_failed = true;
    b->client_status = status;
}

static void zd_boot_cleanup(zd_boot_t *b)
{
    zd_boot_msg_t *m;

    for (size_t i = 0; i < b->n_conns; i++) {
        zd_ucx_ep_close(b->worker, b->conns[i].ep, false);
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
        zd_mesh_fail(err, errlen, "attach.coordinator '%s' is not host:port",
                     coordinator ? coordinator : "");
        return ZS_ERR_INVALID;
    }
    hl = (size_t)(colon - coordinator);
    if (hl >= sizeof(host)) {
        zd_mesh_fail(err, errlen, "attach.coordinator host is too long");
        return ZS_ERR_INVALID;
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
        zd_mesh_fail(err, errlen, "attach.coordinator '%s': %s", coordinator, gai_strerror(rc));
        return ZS_ERR_INVALID;
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
static zs_status_t zd_boot_check_hello(zd_mesh_t *mesh, zd_boot_t *b, zd_boot_conn_t *c,
                                       const Zerod__Mesh__V1__MeshHello *h, bool *fatal_p,
                                       char *why, size_t wlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    uint8_t mac[ZD_HMAC_LEN];

    *fatal_p = false;
    if (h->hmac.len != ZD_HMAC_LEN || h->rank >= 65536) {
        zd_mesh_fail(why, wlen, "mesh hello from %s: malformed authentication",
                     h->rank < 65536 ? "a peer" : "a peer with an invalid rank");
        return ZS_ERR_AUTH;
    }
    zd_hmac(p->token, p->token_len, c->nonce, h->job_id, h->rank, mac);
    if (CRYPTO_memcmp(mac, h->hmac.data, ZD_HMAC_LEN) != 0) {
        zd_mesh_fail(why, wlen,
                     "mesh hello claiming rank %u of job '%s' has a wrong token (HMAC mismatch)",
                     h->rank, h->job_id);
        return ZS_ERR_AUTH;
    }
    *fatal_p = true;
    if (h->protocol != ZD_MESH_PROTOCOL) {
        zd_mesh_fail(why, wlen, "rank %u speaks mesh protocol %u (zerod %s), rank 0 speaks %d (%s)",
                     h->rank, h->protocol, h->zerod_version, ZD_MESH_PROTOCOL, ZS_VERSION);
        return ZS_ERR_VERSION;
    }
    if (strcmp(h->job_id, p->job_id) != 0) {
        zd_mesh_fail(why, wlen, "rank %u attached job '%s', rank 0 job '%s'", h->rank, h->job_id,
                     p->job_id);
        return ZS_ERR_INVALID;
    }
    if (h->world != p->world) {
        zd_mesh_fail(why, wlen, "rank %u says world %u, rank 0 says world %u", h->rank, h->world,
                     p->world);
        return ZS_ERR_INVALID;
    }
    if (h->rank == 0 || h->rank >= p->world) {
        zd_mesh_fail(why, wlen, "rank %u is out of range 1..%u", h->rank, p->world - 1);
        return ZS_ERR_INVALID;
    }
    for (size_t i = 0; i < b->n_conns; i++) {
        if (b->conns[i].joined && b->conns[i].rank == h->rank) {
            zd_mesh_fail(why, wlen, "duplicate rank %u: two daemons claim it", h->rank);
            return ZS_ERR_INVALID;
        }
    }
    if (h->layout_hash != p->layout_hash) {
        zd_mesh_fail(why, wlen, "rank %u has layout hash 0x%016llx, rank 0 has 0x%016llx", h->rank,
                     (unsigned long long)h->layout_hash, (unsigned long long)p->layout_hash);
        return ZS_ERR_LAYOUT_MISMATCH;
    }
    if (h->config_hash != p->config_hash) {
        zd_mesh_fail(why, wlen, "rank %u has config hash 0x%016llx, rank 0 has 0x%016llx", h->rank,
                     (unsigned long long)h->config_hash, (unsigned long long)p->config_hash);
        return ZS_ERR_CONFIG;
    }
    if (h->step != p->step || h->params_loaded != p->params_loaded) {
        zd_mesh_fail(
            why, wlen, "rank %u is at step %llu (params %s), rank 0 at step %llu (params %s)",
            h->rank, (unsigned long long)h->step, h->params_loaded ? "loaded" : "not loaded",
            (unsigned long long)p->step, p->params_loaded ? "loaded" : "not loaded");
        return ZS_ERR_STATE;
    }
    if (h->worker_address.len == 0 || h->worker_address.len > 65536 || h->watch_address.len == 0 ||
        h->watch_address.len > 65536) {
        zd_mesh_fail(why, wlen, "rank %u sent worker addresses of %zu and %zu bytes", h->rank,
                     h->worker_address.len, h->watch_address.len);
        return ZS_ERR_INVALID;
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

static zs_status_t zd_boot_server(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster, char *err,
                                  size_t errlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    ucp_listener_params_t lp;
    struct sockaddr_storage ss;
    socklen_t sslen;
    zs_deadline_t deadline = zs_deadline_in_ns(p->mesh_timeout_ns);
    uint32_t joined = 0;
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
    /* UCX does not set SO_REUSEADDR: a bootstrap connection of an earlier mesh may still hold
     * the port in TIME_WAIT, so retry until mesh_timeout. */
    for (;;) {
        us = ucp_listener_create(b->worker, &lp, &b->listener);
        if (us == UCS_OK) {
            break;
        }
        if (us != UCS_ERR_BUSY || zs_deadline_expired(deadline)) {
            zd_mesh_fail(err, errlen, "rank 0 cannot listen on coordinator %s: %s", p->coordinator,
                         ucs_status_string(us));
            return ZS_ERR_UNREACHABLE;
        }
        usleep(250000);
    }
    zs_info(ZS_SUB_MESH, "rank 0 listening on %s for %u ranks of job '%s'", p->coordinator,
            p->world - 1, p->job_id);

    while (joined < p->world - 1) {
        zd_boot_msg_t *m;

        if (zd_mesh_cancelled(mesh)) {
            zd_mesh_fail(err, errlen, "mesh formation stopped: the daemon is shutting down");
            return ZS_ERR_ABORTED;
        }
        if (zs_deadline_expired(deadline)) {
            char missing[256] = "";
            size_t used = 0;
            for (uint32_t r = 1; r < p->world && used + 12 < sizeof(missing); r++) {
                bool have = false;
                for (size_t i = 0; i < b->n_conns; i++) {
                    have |= b->conns[i].joined && b->conns[i].rank == r;
                }
                if (!have) {
                    used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%u",
                                             used ? ", " : "", r);
                }
            }
            zd_mesh_fail(err, errlen,
                         "mesh formation timed out after %.1f s (mesh_timeout): rank(s) %s did "
                         "not join",
                         (double)p->mesh_timeout_ns * 1e-9, missing);
            return ZS_ERR_TIMEOUT;
        }
        zd_boot_progress(b);
        /* new connections: challenge them */
        while (b->n_requests > 0) {
            ucp_conn_request_h req = b->requests[--b->n_requests];
            ucp_ep_params_t ep;
            zd_boot_conn_t *c;
            Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
            Zerod__Mesh__V1__Challenge ch = ZEROD__MESH__V1__CHALLENGE__INIT;

            if (b->n_conns == b->cap_conns) {
                size_t cap = b->cap_conns ? 2 * b->cap_conns : 8;
                zd_boot_conn_t *nc = realloc(b->conns, cap * sizeof(*nc));
                if (nc == NULL) {
                    ucp_listener_reject(b->listener, req);
                    continue;
                }
                b->conns = nc;
                b->cap_conns = cap;
            }
            c = &b->conns[b->n_conns];
            memset(c, 0, sizeof(*c));
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
            ch.job_id = (char *)p->job_id;
            msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_CHALLENGE;
            msg.challenge = &ch;
            zd_send_msg(c->ep, ZD_AM_BOOT, &msg, false);
        }
        /* hellos */
        while ((m = zd_boot_pop(b)) != NULL) {
            zd_mesh_msg_t *msg = NULL;
            zd_boot_conn_t *c = NULL;
            char why[512];
            bool fatal = false;

            for (size_t i = 0; i < b->n_conns; i++) {
                if (b->conns[i].ep == m->reply_ep) {
                    c = &b->conns[i];
                }
            }
            if (c == NULL || zd_boot_unpack(m, &msg) != ZS_OK ||
                msg->body_case != ZEROD__MESH__V1__MESH_MSG__BODY_HELLO || c->joined) {
                zs_warn(ZS_SUB_MESH, "dropping an unexpected bootstrap message (%zu bytes)",
                        m->len);
                if (msg != NULL) {
                    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                }
                zd_boot_msg_free(m);
                continue;
            }
            st = zd_boot_check_hello(mesh, b, c, msg->hello, &fatal, why, sizeof(why));
            if (st != ZS_OK) {
                zs_warn(ZS_SUB_MESH, "refused: %s", why);
                zd_boot_refuse(c->ep, st, why);
                zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                zd_boot_msg_free(m);
                if (fatal) {
                    /* let the refusal reach the peer (it closes on it) before failing */
                    c->joined = true;
                    zd_boot_wait_closed(b);
                    zd_mesh_fail(err, errlen, "%s", why);
                    return st;
                }
                c->failed = true;
                continue;
            }
            c->joined = true;
            c->rank = msg->hello->rank;
            c->address = malloc(msg->hello->worker_address.len);
            c->watch_address = malloc(msg->hello->watch_address.len);
            if (c->address == NULL || c->watch_address == NULL) {
                zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                zd_boot_msg_free(m);
                zd_mesh_fail(err, errlen, "out of memory in mesh formation");
                return ZS_ERR_NO_MEMORY;
            }
            memcpy(c->address, msg->hello->worker_address.data, msg->hello->worker_address.len);
            c->address_len = msg->hello->worker_address.len;
            memcpy(c->watch_address, msg->hello->watch_address.data, msg->hello->watch_address.len);
            c->watch_address_len = msg->hello->watch_address.len;
            joined++;
            zs_info(ZS_SUB_MESH, "rank %u joined (%u of %u)", c->rank, joined, p->world - 1);
            zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
            zd_boot_msg_free(m);
        }
        for (size_t i = 0; i < b->n_conns; i++) {
            if (b->conns[i].joined && b->conns[i].failed) {
                zd_mesh_fail(err, errlen, "rank %u disconnected during mesh formation",
                             b->conns[i].rank);
                return ZS_ERR_PEER_LOST;
            }
        }
    }
    /* everyone is here: the roster */
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
    {
        Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
        Zerod__Mesh__V1__Welcome w = ZEROD__MESH__V1__WELCOME__INIT;
        ProtobufCBinaryData *rb = calloc(2 * (size_t)p->world, sizeof(*rb));

        if (rb == NULL) {
            zd_mesh_fail(err, errlen, "out of memory in mesh formation");
            return ZS_ERR_NO_MEMORY;
        }
        for (uint32_t r = 0; r < p->world; r++) {
            rb[r].data = roster->data[r];
            rb[r].len = roster->data_len[r];
            rb[p->world + r].data = roster->watch[r];
            rb[p->world + r].len = roster->watch_len[r];
        }
        w.n_roster = p->world;
        w.roster = rb;
        w.n_watch_roster = p->world;
        w.watch_roster = rb + p->world;
        msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_WELCOME;
        msg.welcome = &w;
        for (size_t i = 0; i < b->n_conns; i++) {
            if (b->conns[i].joined) {
                zd_send_msg(b->conns[i].ep, ZD_AM_BOOT, &msg, false);
            }
        }
        free(rb);
    }
    zd_boot_wait_closed(b);
    return ZS_OK;
}

static zs_status_t zd_boot_client(zd_mesh_t *mesh, zd_boot_t *b, zd_roster_t *roster,
                                  zd_mesh_msg_t **welcome_p, char *err, size_t errlen)
{
    const zd_mesh_params_t *p = &mesh->p;
    struct sockaddr_storage ss;
    socklen_t sslen;
    zs_deadline_t deadline = zs_deadline_in_ns(p->mesh_timeout_ns);
    ucp_ep_h ep = NULL;
    bool hello_sent = false;
    unsigned attempts = 0;
    zs_status_t st;

    st = zd_parse_hostport(p->coordinator, &ss, &sslen, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    for (;;) {
        zd_boot_msg_t *m;

        if (zd_mesh_cancelled(mesh)) {
            zd_mesh_fail(err, errlen, "mesh formation stopped: the daemon is shutting down");
            zd_ucx_ep_close(b->worker, ep, true);
            return ZS_ERR_ABORTED;
        }
        if (zs_deadline_expired(deadline)) {
            zd_mesh_fail(err, errlen,
                         "coordinator %s unreachable: no mesh after %.1f s (mesh_timeout, %u "
                         "connection attempts%s%s)",
                         p->coordinator, (double)p->mesh_timeout_ns * 1e-9, attempts,
                         b->client_status != UCS_OK ? ", last: " : "",
                         b->client_status != UCS_OK ? ucs_status_string(b->client_status) : "");
            zd_ucx_ep_close(b->worker, ep, false);
            return hello_sent ? ZS_ERR_TIMEOUT : ZS_ERR_UNREACHABLE;
        }
        if (ep == NULL) {
            ucp_ep_params_t eps;
            memset(&eps, 0, sizeof(eps));
            eps.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
            eps.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
            eps.sockaddr.addr = (struct sockaddr *)&ss;
            eps.sockaddr.addrlen = sslen;
            eps.err_mode = UCP_ERR_HANDLING_MODE_PEER;
            eps.err_handler.cb = zd_boot_client_ep_err_cb;
            eps.err_handler.arg = b;
            b->client_failed = false;
            attempts++;
            if (ucp_ep_create(b->worker, &eps, &ep) != UCS_OK) {
                ep = NULL;
                usleep(200000);
                continue;
            }
        }
        zd_boot_progress(b);
        if (b->client_failed) {
            zd_ucx_ep_close(b->worker, ep, false);
            ep = NULL;
            if (hello_sent) {
                zd_mesh_fail(err, errlen,
                             "coordinator %s closed the connection during mesh "
                             "formation",
                             p->coordinator);
                return ZS_ERR_PEER_LOST;
            }
            usleep(200000); /* rank 0 may not listen yet: retry until mesh_timeout */
            continue;
        }
        while ((m = zd_boot_pop(b)) != NULL) {
            zd_mesh_msg_t *msg = NULL;

            if (zd_boot_unpack(m, &msg) != ZS_OK) {
                zd_boot_msg_free(m);
                continue;
            }
            zd_boot_msg_free(m);
            if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_CHALLENGE && !hello_sent &&
                msg->challenge->nonce.len == ZD_NONCE_LEN) {
                Zerod__Mesh__V1__MeshMsg out = ZEROD__MESH__V1__MESH_MSG__INIT;
                Zerod__Mesh__V1__MeshHello h = ZEROD__MESH__V1__MESH_HELLO__INIT;
                uint8_t mac[ZD_HMAC_LEN];
                char ucxv[64];
                unsigned maj, min, rel;

                ucp_get_version(&maj, &min, &rel);
                snprintf(ucxv, sizeof(ucxv), "%u.%u.%u", maj, min, rel);
                zd_hmac(p->token, p->token_len, msg->challenge->nonce.data, p->job_id, p->rank,
                        mac);
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
                zd_watch_address(mesh->watch, (const uint8_t **)&h.watch_address.data,
                                 &h.watch_address.len);
                h.hmac.data = mac;
                h.hmac.len = sizeof(mac);
                out.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_HELLO;
                out.hello = &h;
                zd_send_msg(ep, ZD_AM_BOOT, &out, true);
                hello_sent = true;
            } else if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_REFUSE) {
                zd_mesh_fail(err, errlen, "rank 0 refused this rank: %s", msg->refuse->message);
                st = (zs_status_t)msg->refuse->status;
                zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                zd_ucx_ep_close(b->worker, ep, false);
                return st != ZS_OK ? st : ZS_ERR_AUTH;
            } else if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_WELCOME && hello_sent) {
                if (msg->welcome->n_roster != p->world ||
                    msg->welcome->n_watch_roster != p->world) {
                    zd_mesh_fail(err, errlen,
                                 "rank 0 sent a roster of %zu (watch %zu) ranks for world %u",
                                 msg->welcome->n_roster, msg->welcome->n_watch_roster, p->world);
                    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                    zd_ucx_ep_close(b->worker, ep, false);
                    return ZS_ERR_PROTOCOL;
                }
                if (zd_roster_alloc(roster, p->world) != ZS_OK) {
                    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
                    zd_ucx_ep_close(b->worker, ep, false);
                    return ZS_ERR_NO_MEMORY;
                }
                for (uint32_t r = 0; r < p->world; r++) {
                    roster->data[r] = msg->welcome->roster[r].data;
                    roster->data_len[r] = msg->welcome->roster[r].len;
                    roster->watch[r] = msg->welcome->watch_roster[r].data;
                    roster->watch_len[r] = msg->welcome->watch_roster[r].len;
                }
                *welcome_p = msg; /* owns the roster bytes */
                zd_ucx_ep_close(b->worker, ep, false);
                return ZS_OK;
            }
            zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
        }
    }
}

/* ---- data side: endpoints, control messages ------------------------------------------- */

static void zd_mesh_mark_lost(zd_mesh_t *mesh, uint32_t rank, const char *why)
{
    if (mesh->aborted || mesh->closing) {
        return;
    }
    mesh->aborted = true;
    snprintf(mesh->why, sizeof(mesh->why), "%s", why);
    zs_error(ZS_SUB_MESH, "job '%s' aborted: %s", mesh->job_id, why);
    (void)rank;
}

static void zd_data_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    zd_peer_ref_t *ref = arg;
    char why[256];

    if (ref->mesh->left[ref->rank]) {
        return; /* it said goodbye: its endpoint closing is expected */
    }
    snprintf(why, sizeof(why), "rank %u lost: endpoint error (%s)", ref->rank,
             ucs_status_string(status));
    zd_mesh_mark_lost(ref->mesh, ref->rank, why);
}

static ucs_status_t zd_ctrl_am_cb(void *arg, const void *header, size_t header_length, void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    zd_mesh_t *mesh = arg;
    zd_mesh_msg_t *msg;

    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > 65536) {
        return UCS_OK; /* control messages are small and eager */
    }
    msg = zerod__mesh__v1__mesh_msg__unpack(NULL, length, data);
    if (msg == NULL) {
        return UCS_OK;
    }
    if (msg->body_case == ZEROD__MESH__V1__MESH_MSG__BODY_CONTROL &&
        msg->control->origin < mesh->p.world) {
        const Zerod__Mesh__V1__Control *c = msg->control;
        switch (c->type) {
        case ZEROD__MESH__V1__CONTROL__TYPE__ABORT: {
            char why[512];
            snprintf(why, sizeof(why), "%s (abort from rank %u)", c->reason, c->origin);
            zd_mesh_mark_lost(mesh, c->lost_rank, why);
            break;
        }
        case ZEROD__MESH__V1__CONTROL__TYPE__LEAVE:
            mesh->left[c->origin] = true;
            break;
        case ZEROD__MESH__V1__CONTROL__TYPE__BARRIER:
            if (c->seq > mesh->barrier_seen[c->origin]) {
                mesh->barrier_seen[c->origin] = c->seq;
            }
            break;
        default:
            break;
        }
    }
    zerod__mesh__v1__mesh_msg__free_unpacked(msg, NULL);
    return UCS_OK;
}

static void zd_mesh_send_ctrl(zd_mesh_t *mesh, uint32_t to, Zerod__Mesh__V1__Control__Type type,
                              uint64_t seq, uint32_t lost, const char *reason)
{
    zd_ucx_send_control(mesh->eps[to], ZD_AM_CTRL, type, mesh->p.rank, seq, lost, reason);
}

uint64_t zd_mesh_tick(zd_mesh_t *mesh)
{
    char why[512];
    uint32_t lost;

    while (ucp_worker_progress(mesh->worker) != 0) {
    }
    if (!mesh->aborted && zd_watch_lost(mesh->watch, &lost, why, sizeof(why))) {
        zd_mesh_mark_lost(mesh, lost, why);
    }
    return UINT64_MAX; /* heartbeats are the watch thread's: nothing is due here */
}

void zd_mesh_leave(zd_mesh_t *mesh)
{
    if (mesh == NULL || mesh->aborted) {
        return;
    }
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__LEAVE, 0, 0, NULL);
        }
    }
    zd_watch_leave(mesh->watch);
    for (int i = 0; i < 100; i++) {
        if (ucp_worker_progress(mesh->worker) == 0) {
            usleep(100);
        }
    }
}

bool zd_mesh_cancelled(const zd_mesh_t *mesh)
{
    return mesh->p.cancel != NULL && atomic_load(mesh->p.cancel);
}

void zd_mesh_abort(zd_mesh_t *mesh, uint32_t lost_rank, const char *fmt, ...)
{
    char why[512];
    va_list ap;

    if (mesh == NULL || mesh->aborted) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    zd_mesh_mark_lost(mesh, lost_rank, why);
    zd_watch_abort(mesh->watch, lost_rank, why);
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank && r != lost_rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__ABORT, 0, lost_rank, why);
        }
    }
    /* give the aborts a moment to leave */
    for (int i = 0; i < 100; i++) {
        if (ucp_worker_progress(mesh->worker) == 0) {
            usleep(100);
        }
    }
}

bool zd_mesh_aborted(const zd_mesh_t *mesh, char *why, size_t len)
{
    if (mesh->aborted && why != NULL) {
        snprintf(why, len, "%s", mesh->why);
    }
    return mesh->aborted;
}

int zd_mesh_arm(zd_mesh_t *mesh)
{
    if (mesh->efd < 0) {
        return -1;
    }
    while (ucp_worker_progress(mesh->worker) != 0) {
    }
    if (ucp_worker_arm(mesh->worker) == UCS_ERR_BUSY) {
        return -2; /* events pending: do not sleep */
    }
    return mesh->efd;
}

zs_status_t zd_mesh_wait(zd_mesh_t *mesh, void *request, zs_deadline_t deadline, const char *what,
                         uint32_t peer, char *err, size_t errlen)
{
    unsigned idle = 0;
    ucs_status_t us;

    if (request == NULL) {
        return ZS_OK;
    }
    if (UCS_PTR_IS_ERR(request)) {
        zd_mesh_fail(err, errlen, "%s with rank %u failed: %s", what, peer,
                     ucs_status_string(UCS_PTR_STATUS(request)));
        return ZS_ERR_PEER_LOST;
    }
    while ((us = ucp_request_check_status(request)) == UCS_INPROGRESS) {
        if (ucp_worker_progress(mesh->worker) == 0 && ++idle > ZD_IDLE_SPINS) {
            idle = 0;
            zd_mesh_tick(mesh);
            if (mesh->aborted) {
                ucp_request_cancel(mesh->worker, request);
                while (ucp_request_check_status(request) == UCS_INPROGRESS) {
                    ucp_worker_progress(mesh->worker);
                }
                ucp_request_free(request);
                zd_mesh_fail(err, errlen, "%s: %s", what, mesh->why);
                return ZS_ERR_PEER_LOST;
            }
            if (zd_mesh_cancelled(mesh)) {
                zd_mesh_abort(mesh, mesh->p.rank, "rank %u: its daemon is shutting down",
                              mesh->p.rank);
            }
            if (zs_deadline_expired(deadline)) {
                ucp_request_cancel(mesh->worker, request);
                while (ucp_request_check_status(request) == UCS_INPROGRESS) {
                    ucp_worker_progress(mesh->worker);
                }
                ucp_request_free(request);
                zd_mesh_abort(mesh, peer,
                              "rank %u lost: %s timed out after %.1f s "
                              "(collective_timeout)",
                              peer, what, (double)mesh->p.collective_timeout_ns * 1e-9);
                zd_mesh_fail(err, errlen, "%s", mesh->why);
                return ZS_ERR_PEER_LOST;
            }
            sched_yield();
        }
    }
    ucp_request_free(request);
    if (us != UCS_OK) {
        zd_mesh_fail(err, errlen, "%s with rank %u failed: %s", what, peer, ucs_status_string(us));
        zd_mesh_abort(mesh, peer, "rank %u lost: %s failed (%s)", peer, what,
                      ucs_status_string(us));
        return ZS_ERR_PEER_LOST;
    }
    return ZS_OK;
}

zs_status_t zd_mesh_barrier(zd_mesh_t *mesh, char *err, size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(mesh->p.collective_timeout_ns);
    uint64_t seq = ++mesh->barrier_seq;
    uint64_t spin_until = zs_time_now_ns() + ZD_BARRIER_SPIN_NS;

    for (uint32_t r = 0; r < mesh->p.world; r++) {
        if (r != mesh->p.rank) {
            zd_mesh_send_ctrl(mesh, r, ZEROD__MESH__V1__CONTROL__TYPE__BARRIER, seq, 0, NULL);
        }
    }
    for (;;) {
        uint32_t missing = UINT32_MAX;
        for (uint32_t r = 0; r < mesh->p.world; r++) {
            if (r != mesh->p.rank && mesh->barrier_seen[r] < seq) {
                missing = r;
                break;
            }
        }
        if (missing == UINT32_MAX) {
            return ZS_OK;
        }
        zd_mesh_tick(mesh);
        if (zd_mesh_cancelled(mesh)) {
            zd_mesh_abort(mesh, mesh->p.rank, "rank %u: its daemon is shutting down", mesh->p.rank);
        }
        if (mesh->aborted) {
            zd_mesh_fail(err, errlen, "barrier: %s", mesh->why);
            return ZS_ERR_PEER_LOST;
        }
        if (zs_deadline_expired(deadline)) {
            zd_mesh_abort(mesh, missing, "rank %u lost: barrier timed out after %.1f s", missing,
                          (double)mesh->p.collective_timeout_ns * 1e-9);
            zd_mesh_fail(err, errlen, "%s", mesh->why);
            return ZS_ERR_PEER_LOST;
        }
        /* spin first (ranks leave within microseconds of each other), then sleep */
        if (zs_time_now_ns() < spin_until) {
            sched_yield();
        } else {
            usleep(50);
        }
    }
}

static zs_status_t zd_mesh_connect(zd_mesh_t *mesh, const zd_roster_t *roster, char *err,
                                   size_t errlen)
{
    for (uint32_t r = 0; r < mesh->p.world; r++) {
        ucp_ep_params_t ep;
        ucs_status_t us;

        if (r == mesh->p.rank) {
            continue;
        }
        mesh->refs[r].mesh = mesh;
        mesh->refs[r].rank = r;
        memset(&ep, 0, sizeof(ep));
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        ep.address = (const ucp_address_t *)roster->data[r];
        /* UCX 1.13 refuses the shared-memory transports (posix, sysv, cma) under
         * UCP_ERR_HANDLING_MODE_PEER, which would push same-host traffic onto TCP loopback at a
         * fraction of memory bandwidth. A lost peer is caught by the watch (its own TCP
         * endpoints in peer-failure mode, and heartbeats) and the collective deadline instead
         * (TCP data endpoints still report a reset through the handler). */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        ep.err_handler.cb = zd_data_ep_err_cb;
        ep.err_handler.arg = &mesh->refs[r];
        us = ucp_ep_create(mesh->worker, &ep, &mesh->eps[r]);
        if (us != UCS_OK) {
            zd_mesh_fail(err, errlen, "cannot reach rank %u's worker address: %s", r,
                         ucs_status_string(us));
            return ZS_ERR_UNREACHABLE;
        }
    }
    return zd_watch_start(mesh->watch, roster->watch, roster->watch_len, err, errlen);
}

/* ---- lifetime ------------------------------------------------------------------------- */

zs_status_t zd_mesh_create(const zd_mesh_params_t *params, zd_mesh_t **mesh_p, char *err,
                           size_t errlen)
{
    zd_mesh_t *mesh;
    zd_boot_t boot;
    ucp_am_handler_param_t ah;
    zd_roster_t roster;
    zd_mesh_msg_t *welcome = NULL;
    zs_status_t st;

    memset(&boot, 0, sizeof(boot));
    memset(&roster, 0, sizeof(roster));
    mesh = calloc(1, sizeof(*mesh));
    if (mesh == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    mesh->p = *params;
    snprintf(mesh->job_id, sizeof(mesh->job_id), "%s", params->job_id);
    mesh->p.job_id = mesh->job_id;
    mesh->efd = -1;
    mesh->eps = calloc(params->world, sizeof(*mesh->eps));
    mesh->refs = calloc(params->world, sizeof(*mesh->refs));
    mesh->barrier_seen = calloc(params->world, sizeof(uint64_t));
    mesh->left = calloc(params->world, sizeof(bool));
    if (mesh->eps == NULL || mesh->refs == NULL || mesh->barrier_seen == NULL ||
        mesh->left == NULL) {
        st = ZS_ERR_NO_MEMORY;
        goto err_destroy;
    }
    st = zd_ucx_init(NULL, UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP, &mesh->ctx,
                     &mesh->worker, err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    {
        zd_watch_params_t wp;

        memset(&wp, 0, sizeof(wp));
        wp.job_id = mesh->job_id;
        wp.rank = params->rank;
        wp.world = params->world;
        wp.interval_ns = params->heartbeat_interval_ns;
        wp.timeout_ns = params->heartbeat_timeout_ns;
        wp.notify = params->wake;
        wp.notify_arg = params->wake_arg;
        st = zd_watch_create(&wp, &mesh->watch, err, errlen);
        if (st != ZS_OK) {
            goto err_destroy;
        }
    }
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = ZD_AM_CTRL;
    ah.cb = zd_ctrl_am_cb;
    ah.arg = mesh;
    ucp_worker_set_am_recv_handler(mesh->worker, &ah);
    if (ucp_worker_get_address(mesh->worker, &mesh->address, &mesh->address_len) != UCS_OK) {
        zd_mesh_fail(err, errlen, "UCX: cannot get the worker address");
        st = ZS_ERR_UCX;
        goto err_destroy;
    }
    if (ucp_worker_get_efd(mesh->worker, &mesh->efd) != UCS_OK) {
        mesh->efd = -1;
    }

    /* ucp_listener connections need TCP here (UCX 1.13: "no remote ep address for lane" with
     * the default transports); the data worker keeps every transport */
    st = zd_ucx_init("tcp", UCP_FEATURE_AM, &boot.ctx, &boot.worker, err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    ah.id = ZD_AM_BOOT;
    ah.cb = zd_boot_am_cb;
    ah.arg = &boot;
    ucp_worker_set_am_recv_handler(boot.worker, &ah);

    if (params->rank == 0) {
        st = zd_roster_alloc(&roster, params->world);
        if (st != ZS_OK) {
            goto err_boot;
        }
        st = zd_boot_server(mesh, &boot, &roster, err, errlen);
    } else {
        st = zd_boot_client(mesh, &boot, &roster, &welcome, err, errlen);
    }
    if (st != ZS_OK) {
        goto err_boot;
    }
    st = zd_mesh_connect(mesh, &roster, err, errlen);
    if (st != ZS_OK) {
        goto err_boot;
    }
    zd_boot_cleanup(&boot);
    zd_roster_free(&roster);
    if (welcome != NULL) {
        zerod__mesh__v1__mesh_msg__free_unpacked(welcome, NULL);
        welcome = NULL;
    }
    /* every data endpoint works in both directions before anyone uses the mesh */
    st = zd_mesh_barrier(mesh, err, errlen);
    if (st != ZS_OK) {
        goto err_destroy;
    }
    zs_info(ZS_SUB_MESH, "mesh of job '%s' formed: rank %u of %u", mesh->job_id, params->rank,
            params->world);
    *mesh_p = mesh;
    return ZS_OK;

err_boot:
    zd_boot_cleanup(&boot);
    zd_roster_free(&roster);
    if (welcome != NULL) {
        zerod__mesh__v1__mesh_msg__free_unpacked(welcome, NULL);
    }
err_destroy:
    zd_mesh_destroy(mesh);
    return st;
}

void zd_mesh_destroy(zd_mesh_t *mesh)
{
    if (mesh == NULL) {
        return;
    }
    mesh->closing = true;
    zd_watch_destroy(mesh->watch);
    if (mesh->eps != NULL) {
        for (uint32_t r = 0; r < mesh->p.world; r++) {
            zd_ucx_ep_close(mesh->worker, mesh->eps[r], mesh->aborted);
        }
    }
    if (mesh->address != NULL) {
        ucp_worker_release_address(mesh->worker, mesh->address);
    }
    zd_ucx_cleanup(mesh->ctx, mesh->worker);
    free(mesh->eps);
    free(mesh->refs);
    free(mesh->barrier_seen);
    free(mesh->left);
    free(mesh);
}

uint32_t zd_mesh_rank(const zd_mesh_t *mesh)
{
    return mesh->p.rank;
}

uint32_t zd_mesh_world(const zd_mesh_t *mesh)
{
    return mesh->p.world;
}

ucp_worker_h zd_mesh_worker(zd_mesh_t *mesh)
{
    return mesh->worker;
}

ucp_ep_h zd_mesh_ep(zd_mesh_t *mesh, uint32_t rank)
{
    return mesh->eps[rank];
}

uint64_t zd_mesh_collective_timeout_ns(const zd_mesh_t *mesh)
{
    return mesh->p.collective_timeout_ns;
}
