#include "mesh/ucx_util.h"

#include "zs/error.h"
#include "zs/log.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zs_status_t zd_ucx_init(const char *tls, uint64_t features, ucp_context_h *ctx_p,
                        ucp_worker_h *worker_p, char *err, size_t errlen)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_config_t *config = NULL;
    ucs_status_t us;
    sigset_t old;

    us = ucp_config_read(NULL, NULL, &config);
    if (us != UCS_OK) {
        return zs_errf(err, errlen, ZS_ERR_UCX, "UCX: reading config: %s", ucs_status_string(us));
    }
    if (tls != NULL) {
        ucp_config_modify(config, "TLS", tls);
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = features;
    params.mt_workers_shared = 0;
    /* UCX's async thread inherits this mask: it never takes the daemon's signals */
    zs_signals_block(&old);
    us = ucp_init(&params, config, ctx_p);
    zs_signals_restore(&old);
    ucp_config_release(config);
    if (us != UCS_OK) {
        return zs_errf(err, errlen, ZS_ERR_UCX, "UCX: ucp_init: %s", ucs_status_string(us));
    }
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    zs_signals_block(&old);
    us = ucp_worker_create(*ctx_p, &wparams, worker_p);
    zs_signals_restore(&old);
    if (us != UCS_OK) {
        ucp_cleanup(*ctx_p);
        *ctx_p = NULL;
        return zs_errf(err, errlen, ZS_ERR_UCX, "UCX: ucp_worker_create: %s",
                       ucs_status_string(us));
    }
    return ZS_OK;
}

/* An endpoint close that did not finish (its flush never answered): destroying the worker then
 * aborts the process inside UCX ("pending request ... should have been flushed"), so the worker
 * and its context are left behind instead -- a leak on a rare path, never a dead daemon. */
static atomic_bool zd_ucx_stuck;

void zd_ucx_cleanup(ucp_context_h ctx, ucp_worker_h worker)
{
    if (atomic_load(&zd_ucx_stuck)) {
        zs_warn(ZS_SUB_MESH, "UCX: an endpoint's close never finished; its worker is left "
                             "behind rather than destroyed");
        atomic_store(&zd_ucx_stuck, false);
        return;
    }
    if (worker != NULL) {
        ucp_worker_destroy(worker);
    }
    if (ctx != NULL) {
        ucp_cleanup(ctx);
    }
}

static void zd_ucx_send_free_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    free(user_data);
    ucp_request_free(request);
}

ucs_status_t zd_ucx_send_msg(ucp_ep_h ep, unsigned id, const Zerod__Mesh__V1__MeshMsg *msg,
                             bool reply)
{
    size_t len = zerod__mesh__v1__mesh_msg__get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    ucp_request_param_t prm;
    void *req;

    if (buf == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    zerod__mesh__v1__mesh_msg__pack(msg, buf);
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = zd_ucx_send_free_cb;
    prm.user_data = buf;
    prm.flags = reply ? UCP_AM_SEND_FLAG_REPLY : UCP_AM_SEND_FLAG_EAGER;
    req = ucp_am_send_nbx(ep, id, NULL, 0, buf, len, &prm);
    if (req == NULL) {
        free(buf);
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        free(buf);
        return UCS_PTR_STATUS(req);
    }
    return UCS_INPROGRESS;
}

void zd_ucx_send_control(ucp_ep_h ep, unsigned id, Zerod__Mesh__V1__Control__Type type,
                         uint32_t origin, uint64_t seq, uint32_t lost_rank, const char *reason)
{
    Zerod__Mesh__V1__MeshMsg msg = ZEROD__MESH__V1__MESH_MSG__INIT;
    Zerod__Mesh__V1__Control c = ZEROD__MESH__V1__CONTROL__INIT;

    if (ep == NULL) {
        return;
    }
    c.type = type;
    c.origin = origin;
    c.seq = seq;
    c.lost_rank = lost_rank;
    c.reason = (char *)(reason != NULL ? reason : "");
    msg.body_case = ZEROD__MESH__V1__MESH_MSG__BODY_CONTROL;
    msg.control = &c;
    (void)zd_ucx_send_msg(ep, id, &msg, false);
}

void zd_ucx_ep_close(ucp_worker_h worker, ucp_ep_h ep, bool force)
{
    ucp_request_param_t prm;
    void *req;
    zs_deadline_t d = zs_deadline_in_ms(1000);

    if (ep == NULL) {
        return;
    }
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    req = ucp_ep_close_nbx(ep, &prm);
    if (req == NULL || UCS_PTR_IS_ERR(req)) {
        return;
    }
    while (ucp_request_check_status(req) == UCS_INPROGRESS && !zs_deadline_expired(d)) {
        ucp_worker_progress(worker);
    }
    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
        atomic_store(&zd_ucx_stuck, true);
    }
    ucp_request_free(req);
}
