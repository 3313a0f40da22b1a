/*
 * What both sides of a mesh's formation share (mesh/mesh_boot.c for ranks > 0,
 * mesh/mesh_boot_rank0.c for rank 0): the TCP-only bootstrap worker and its queue of received
 * messages, the roster, the HELLO's HMAC, the coordinator's address, and the job token file.
 * Calls nothing else in mesh/ but ucx_util.c.
 */
#define _GNU_SOURCE
#include "mesh/mesh_boot_int.h"
#include "zs/error.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

zs_status_t zd_roster_alloc(zd_roster_t *r, uint32_t world)
{
    r->data = calloc(world, sizeof(*r->data));
    r->data_len = calloc(world, sizeof(*r->data_len));
    r->heartbeat = calloc(world, sizeof(*r->heartbeat));
    r->heartbeat_len = calloc(world, sizeof(*r->heartbeat_len));
    if (r->data == NULL || r->data_len == NULL || r->heartbeat == NULL ||
        r->heartbeat_len == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    return ZS_OK;
}

void zd_roster_free(zd_roster_t *r)
{
    free(r->bytes);
    free(r->data);
    free(r->data_len);
    free(r->heartbeat);
    free(r->heartbeat_len);
    memset(r, 0, sizeof(*r));
}

zs_status_t zd_roster_keep(zd_roster_t *r, uint32_t world)
{
    size_t total = 0, off = 0;
    uint8_t *bytes;

    for (uint32_t i = 0; i < world; i++) {
        total += r->data_len[i] + r->heartbeat_len[i];
    }
    bytes = malloc(total ? total : 1);
    if (bytes == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < world; i++) {
        memcpy(bytes + off, r->data[i], r->data_len[i]);
        r->data[i] = bytes + off;
        off += r->data_len[i];
        memcpy(bytes + off, r->heartbeat[i], r->heartbeat_len[i]);
        r->heartbeat[i] = bytes + off;
        off += r->heartbeat_len[i];
    }
    free(r->bytes);
    r->bytes = bytes;
    return ZS_OK;
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

/* force: the formation failed, and an endpoint's peer may never answer a flush (a stranger on
 * the coordinator's port, a dead daemon): close without one. */
void zd_boot_cleanup(zd_boot_t *b, bool force)
{
    zd_boot_msg_t *m;

    for (size_t i = 0; i < b->n_conns; i++) {
        zd_ucx_ep_close(b->worker, b->conns[i].ep, force);
        free(b->conns[i].address);
        free(b->conns[i].heartbeat_address);
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

zs_status_t zd_boot_open(zd_boot_t *b, char *err, size_t errlen)
{
    ucp_am_handler_param_t ah;
    zs_status_t st;

    memset(b, 0, sizeof(*b));
    /* ucp_listener connections need TCP here (UCX 1.13: "no remote ep address for lane" with
     * the default transports); the data worker keeps every transport */
    st = zd_ucx_init("tcp", UCP_FEATURE_AM, &b->ctx, &b->worker, err, errlen);
    if (st != ZS_OK) {
        return st;
    }
    memset(&ah, 0, sizeof(ah));
    ah.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ah.id = ZD_AM_BOOT;
    ah.cb = zd_boot_am_cb;
    ah.arg = b;
    ucp_worker_set_am_recv_handler(b->worker, &ah);
    return ZS_OK;
}
