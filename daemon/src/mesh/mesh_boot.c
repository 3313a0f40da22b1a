/*
 * Forming a job's mesh (docs/architecture.md): rank 0 listens on the coordinator address (a
 * TCP-only bootstrap context), the other ranks connect until mesh_timeout, answer a challenge with
 * a MeshHello (HMAC under the job token), and once every rank said hello rank 0 sends each the
 * roster of data and watch worker addresses -- or a Refuse naming what differs. Rank 0's side
 * is in mesh/mesh_boot_rank0.c; here the bootstrap's common steps, the other ranks' side and the
 * formation.
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

zs_status_t zd_roster_alloc(zd_roster_t *r, uint32_t world)
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

void zd_hmac(const uint8_t *token, size_t token_len, const uint8_t *nonce, const char *job_id,
             uint32_t rank, uint8_t out[ZD_HMAC_LEN])
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
zd_boot_msg_t *zd_boot_pop(zd_boot_t *b)
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

void zd_boot_msg_free(zd_boot_msg_t *m)
{
    if (m != NULL) {
        free(m->data);
        free(m);
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

zs_status_t zd_parse_hostport(const char *coordinator, struct sockaddr_storage *ss,
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
void zd_boot_progress(zd_boot_t *b)
{
    if (ucp_worker_progress(b->worker) == 0) {
        usleep(200);
    }
}

zs_status_t zd_boot_unpack(const zd_boot_msg_t *m, zd_mesh_msg_t **msg_p)
{
    *msg_p = zerod__mesh__v1__mesh_msg__unpack(NULL, m->len, m->data);
    return *msg_p != NULL ? ZS_OK : ZS_ERR_PROTOCOL;
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
    zd_heartbeat_address(mesh->watch, (const uint8_t **)&h.watch_address.data,
                         &h.watch_address.len);
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
