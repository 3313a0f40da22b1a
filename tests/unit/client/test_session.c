/* zc_session against a fake daemon thread that speaks ipc.proto: hello, attach with fds,
 * slot zeroing, back-pressure, step, error paths (version, layout hash, SlotFree error). */
#define _GNU_SOURCE
#include "zc_int.h"

#include "zs/layout.h"
#include "zs/mem.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct fake {
    char dir[64];
    char path[96];
    int lfd;
    pthread_t th;
    /* behaviour */
    uint32_t stage;
    uint32_t n_slots;
    int bad_hash;
    int refuse_version;
    int fail_bucket;           /* SlotFree for this bucket carries ZS_ERR_PEER_LOST; -1 none */
    uint64_t peer_deadline_ms; /* told in HelloReply */
    int memory;                /* AttachReply.memory (ipc.proto MemoryKind; 0: host) */
    int32_t device;            /* AttachReply.device */
    /* StepReply.copy_stores of step k + 1 (k < 4; NULL: none) */
    Zerod__Ipc__V1__CopyStores *copy_stores[4];
    /* state and observations (read by the test after zc_session_close + fake_stop) */
    zs_layout_t *layout;
    zs_region_t params, slots, grads;
    double grad_sum;
    int gaps_dirty; /* a submitted slot had a non-zero gap */
    int n_bucket_ready;
    uint64_t steps;
    int params_ready;
    int detached;
} fake_t;

/* ---- fake daemon ------------------------------------------------------------------- */

static int read_full(int fd, void *buf, size_t n)
{
    size_t off = 0;

    while (off < n) {
        ssize_t rc = read(fd, (uint8_t *)buf + off, n - off);
        if (rc <= 0) {
            return -1;
        }
        off += (size_t)rc;
    }
    return 0;
}

static Zerod__Ipc__V1__Frame *fake_read(int fd)
{
    Zerod__Ipc__V1__Frame *f;
    uint8_t hdr[4];
    uint32_t n;
    uint8_t *buf;

    if (read_full(fd, hdr, 4) != 0) {
        return NULL;
    }
    n = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    buf = malloc(n);
    if (buf == NULL || read_full(fd, buf, n) != 0) {
        free(buf);
        return NULL;
    }
    f = zerod__ipc__v1__frame__unpack(NULL, n, buf);
    free(buf);
    return f;
}

static void fake_send(int fd, Zerod__Ipc__V1__Frame *f, const int *fds, size_t n_fds)
{
    union {
        char buf[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } cbuf;
    size_t n = zerod__ipc__v1__frame__get_packed_size(f);
    uint8_t *buf = malloc(n + 4);
    struct msghdr msg;
    struct iovec iov;

    for (int i = 0; i < 4; i++) {
        buf[i] = (uint8_t)(n >> (8 * i));
    }
    zerod__ipc__v1__frame__pack(f, buf + 4);
    memset(&msg, 0, sizeof(msg));
    memset(&cbuf, 0, sizeof(cbuf));
    iov.iov_base = buf;
    iov.iov_len = n + 4;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n_fds > 0) {
        struct cmsghdr *c;
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));
    }
    (void)!sendmsg(fd, &msg, MSG_NOSIGNAL);
    free(buf);
}

static void fake_attach(fake_t *fk, int fd, const Zerod__Ipc__V1__Frame *req)
{
    const Zerod__Ipc__V1__Attach *at = req->attach;
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__AttachReply ar = ZEROD__IPC__V1__ATTACH_REPLY__INIT;
    Zerod__Ipc__V1__Result res = ZEROD__IPC__V1__RESULT__INIT;
    uint32_t group_n[16];
    uint64_t numel[64];
    size_t k = 0, dsize = at->dtype == ZEROD__IPC__V1__DTYPE__DTYPE_F32 ? 4 : 2;
    zs_layout_spec_t spec;
    int fds[3];

    for (size_t g = 0; g < at->n_groups; g++) {
        group_n[g] = (uint32_t)at->groups[g]->n_numel;
        for (size_t i = 0; i < at->groups[g]->n_numel; i++) {
            numel[k++] = at->groups[g]->numel[i];
        }
    }
    memset(&spec, 0, sizeof(spec));
    spec.world = at->world;
    spec.bucket_size = 512;
    spec.elem_align = 16;
    spec.n_groups = (uint32_t)at->n_groups;
    spec.group_n_params = group_n;
    spec.numel = numel;
    zs_layout_create(&spec, &fk->layout, NULL, 0);
    zs_region_create("fake-params", fk->layout->total_numel * dsize, &fk->params);
    zs_region_create("fake-slots", fk->n_slots * fk->layout->max_bucket_numel * dsize, &fk->slots);
    memset(fk->slots.addr, 0xff, fk->slots.size); /* the client must zero the gaps */
    fds[0] = fk->params.fd;
    fds[1] = fk->slots.fd;
    if (fk->stage == 1) {
        zs_region_create("fake-grads", fk->layout->total_numel * dsize, &fk->grads);
        fds[2] = fk->grads.fd;
    }
    ar.result = &res;
    ar.layout_hash = fk->layout->hash + (fk->bad_hash ? 1 : 0);
    ar.loss_scale = 1.0;
    ar.n_slots = fk->n_slots;
    ar.slot_bytes = fk->layout->max_bucket_numel * dsize;
    ar.params_bytes = fk->params.size;
    ar.grads_bytes = fk->grads.size;
    ar.stage = fk->stage;
    ar.gradient_accumulation_steps = 2;
    ar.bucket_size = 512;
    ar.elem_align = 16;
    ar.memory = (Zerod__Ipc__V1__MemoryKind)fk->memory;
    ar.device = fk->device;
    f.seq = req->seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH_REPLY;
    f.attach_reply = &ar;
    fake_send(fd, &f, fds, fk->stage == 1 ? 3 : 2);
}

static void fake_bucket_ready(fake_t *fk, int fd, const Zerod__Ipc__V1__Frame *req)
{
    const Zerod__Ipc__V1__BucketReady *br = req->bucket_ready;
    const zs_layout_bucket_t *b = &fk->layout->buckets[br->bucket];
    const float *data =
        (const float *)((uint8_t *)fk->slots.addr + br->slot * fk->layout->max_bucket_numel * 4);
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__SlotFree sf = ZEROD__IPC__V1__SLOT_FREE__INIT;
    Zerod__Ipc__V1__Result res = ZEROD__IPC__V1__RESULT__INIT;

    for (uint64_t i = 0; i < b->padded; i++) {
        zs_layout_loc_t loc;
        zs_layout_locate(fk->layout, b->offset + i, &loc);
        if (loc.param < 0 && data[i] != 0.0f) {
            fk->gaps_dirty = 1;
        }
        fk->grad_sum += data[i];
    }
    fk->n_bucket_ready++;
    if ((int)br->bucket == fk->fail_bucket) {
        res.status = ZEROD__COMMON__V1__STATUS__ZS_ERR_PEER_LOST;
        res.message = "rank 1 lost during reduce-scatter";
    }
    sf.result = &res;
    sf.slot = br->slot;
    sf.bucket = br->bucket;
    f.seq = req->seq;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_SLOT_FREE;
    f.slot_free = &sf;
    fake_send(fd, &f, NULL, 0);
}

static void fake_reply(fake_t *fk, int fd, const Zerod__Ipc__V1__Frame *req)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Result res = ZEROD__IPC__V1__RESULT__INIT;
    Zerod__Ipc__V1__HelloReply hr = ZEROD__IPC__V1__HELLO_REPLY__INIT;
    Zerod__Ipc__V1__ParamsReadyReply pr = ZEROD__IPC__V1__PARAMS_READY_REPLY__INIT;
    Zerod__Ipc__V1__StepReply sr = ZEROD__IPC__V1__STEP_REPLY__INIT;
    Zerod__Ipc__V1__DetachReply dr = ZEROD__IPC__V1__DETACH_REPLY__INIT;
    Zerod__Ipc__V1__StatusReply st = ZEROD__IPC__V1__STATUS_REPLY__INIT;

    f.seq = req->seq;
    switch (req->body_case) {
    case ZEROD__IPC__V1__FRAME__BODY_HELLO:
        if (fk->refuse_version) {
            res.status = ZEROD__COMMON__V1__STATUS__ZS_ERR_VERSION;
            res.message = "client protocol 1, daemon protocol 2";
        }
        hr.result = &res;
        hr.protocol = fk->refuse_version ? 2 : 1;
        hr.version = "0.1.0-fake";
        hr.pid = getpid();
        hr.device = "fake0";
        hr.peer_deadline_ms = fk->peer_deadline_ms;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY;
        f.hello_reply = &hr;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY:
        fk->params_ready = 1;
        pr.result = &res;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_PARAMS_READY_REPLY;
        f.params_ready_reply = &pr;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STEP:
        sr.result = &res;
        sr.copy_stores = fk->steps < 4 ? fk->copy_stores[fk->steps] : NULL;
        sr.step = ++fk->steps;
        sr.grad_norm = fk->grad_sum;
        sr.loss_scale = 65536.0;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STEP_REPLY;
        f.step_reply = &sr;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_DETACH:
        fk->detached = 1;
        dr.result = &res;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_DETACH_REPLY;
        f.detach_reply = &dr;
        break;
    case ZEROD__IPC__V1__FRAME__BODY_STATUS:
        st.result = &res;
        st.version = "0.1.0-fake";
        st.device = "fake0";
        st.job_id = "job-x";
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY;
        f.status_reply = &st;
        break;
    default:
        return;
    }
    fake_send(fd, &f, NULL, 0);
}

static void *fake_main(void *arg)
{
    fake_t *fk = arg;
    Zerod__Ipc__V1__Frame *req;
    int fd = accept4(fk->lfd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0) {
        return NULL;
    }
    while ((req = fake_read(fd)) != NULL) {
        if (req->body_case == ZEROD__IPC__V1__FRAME__BODY_ATTACH) {
            fake_attach(fk, fd, req);
        } else if (req->body_case == ZEROD__IPC__V1__FRAME__BODY_BUCKET_READY) {
            fake_bucket_ready(fk, fd, req);
        } else {
            fake_reply(fk, fd, req);
        }
        zerod__ipc__v1__frame__free_unpacked(req, NULL);
    }
    close(fd);
    return NULL;
}

static void fake_start(fake_t *fk)
{
    struct sockaddr_un addr;

    snprintf(fk->dir, sizeof(fk->dir), "/tmp/zc-test-XXXXXX");
    cr_assert_not_null(mkdtemp(fk->dir));
    snprintf(fk->path, sizeof(fk->path), "%s/zd.sock", fk->dir);
    fk->params = (zs_region_t)ZS_REGION_INIT;
    fk->slots = (zs_region_t)ZS_REGION_INIT;
    fk->grads = (zs_region_t)ZS_REGION_INIT;
    if (fk->stage == 0) {
        fk->stage = 2;
    }
    if (fk->n_slots == 0) {
        fk->n_slots = 2;
    }
    fk->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fk->lfd >= 0);
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", fk->path);
    cr_assert_eq(bind(fk->lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    cr_assert_eq(listen(fk->lfd, 4), 0);
    cr_assert_eq(pthread_create(&fk->th, NULL, fake_main, fk), 0);
}

/* After the client closed: join the daemon thread, keep the observations. */
static void fake_stop(fake_t *fk)
{
    pthread_join(fk->th, NULL);
    close(fk->lfd);
    unlink(fk->path);
    rmdir(fk->dir);
    zs_region_cleanup(&fk->params);
    zs_region_cleanup(&fk->slots);
    zs_region_cleanup(&fk->grads);
    zs_layout_destroy(fk->layout);
}

/* ---- client side ------------------------------------------------------------------- */

static const uint64_t mlp_numel[4] = {4, 128, 32, 512}; /* b2, W2, b1, W1 */

static zc_session_t *open_session(const fake_t *fk, int control)
{
    zc_open_params_t op;
    zc_session_t *s = NULL;

    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_TIMEOUT_MS | ZC_OPEN_FIELD_CONTROL;
    op.socket_path = fk->path;
    op.timeout_ms = 5000;
    op.control = control;
    cr_assert_eq(zc_session_open(&op, &s), ZC_OK, "%s", zc_last_error());
    return s;
}

static int attach(zc_session_t *s, zc_attach_info_t *info)
{
    zc_group_t g = {.n_params = 4, .numel = mlp_numel, .options_json = NULL};
    zc_attach_params_t ap;

    memset(&ap, 0, sizeof(ap));
    ap.field_mask = ZC_ATTACH_FIELD_JOB_ID | ZC_ATTACH_FIELD_GROUPS | ZC_ATTACH_FIELD_CONFIG_JSON;
    ap.job_id = "job-x";
    ap.n_groups = 1;
    ap.groups = &g;
    ap.config_json = "{\"zero_optimization\":{\"reduce_bucket_size\":512}}";
    return zc_session_attach(s, &ap, info);
}

/* Fill every parameter range of the slot with 1.0f. */
static void fill_slot(zc_session_t *s, const zc_slot_t *slot)
{
    zc_bucket_info_t bi;

    cr_assert_eq(zc_session_bucket_info(s, slot->bucket, &bi), ZC_OK);
    for (uint32_t i = 0; i < bi.n_params; i++) {
        zc_bucket_piece_t pc;
        uint32_t id;
        cr_assert_eq(zc_session_bucket_piece(s, slot->bucket, i, &pc), ZC_OK);
        cr_assert_eq(zc_session_bucket_param(s, slot->bucket, i, &id), ZC_OK);
        cr_assert_eq(id, pc.id);
        cr_assert_leq(pc.param_offset + pc.numel, mlp_numel[pc.id]);
        for (uint64_t k = 0; k < pc.numel; k++) {
            ((float *)slot->data)[pc.slot_offset + k] = 1.0f;
        }
    }
}

Test(zc_session, attaches_fills_slots_and_steps)
{
    fake_t fk = {.fail_bucket = -1};
    zc_attach_info_t info;
    zc_step_result_t res;
    zc_bucket_info_t bi;
    zc_session_t *s;
    uint32_t bucket;
    uint64_t off;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_str_eq(zc_session_daemon_info(s)->device, "fake0");
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(info.n_params, 4);
    cr_assert_eq(info.n_buckets, 2);
    cr_assert_eq(info.n_slots, 2);
    cr_assert_eq(info.stage, 2);
    cr_assert_eq(info.gradient_accumulation_steps, 2);
    cr_assert_eq(info.total_numel, 176 + 512);
    cr_assert_eq(zc_session_param_numel(s, 3), 512);
    /* b2 at 0, W2 at 16 (aligned), b1 at 144, W1 at 176: buckets of 512 cut W1 after 336 of
     * its 512 elements */
    cr_assert_eq(zc_session_param_bucket(s, 1, &bucket, &off), ZC_OK);
    cr_assert_eq(bucket, 0);
    cr_assert_eq(off, 16);
    cr_assert_eq(zc_session_param_bucket(s, 3, &bucket, &off), ZC_OK);
    cr_assert_eq(bucket, 0);
    cr_assert_eq(off, 176);
    {
        zc_bucket_piece_t pc;
        cr_assert_eq(zc_session_bucket_piece(s, 1, 0, &pc), ZC_OK);
        cr_assert_eq(pc.id, 3);
        cr_assert_eq(pc.param_offset, 336);
        cr_assert_eq(pc.slot_offset, 0);
        cr_assert_eq(pc.numel, 176);
        cr_assert_eq(zc_session_bucket_piece(s, 1, 1, &pc), ZC_ERR_INVALID);
    }
    cr_assert_eq((uint8_t *)zc_session_param_ptr(s, 2) - (uint8_t *)zc_session_param_ptr(s, 0),
                 144 * 4);
    cr_assert_null(zc_session_param_ptr(s, 4));
    cr_assert_eq(zc_session_bucket_info(s, 0, &bi), ZC_OK);
    cr_assert_eq(bi.numel, 512);
    cr_assert_null(zc_session_grads_ptr(s));

    /* a fresh job refuses to step before params_ready */
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_ERR_STATE);
    cr_assert_eq(zc_session_params_ready(s), ZC_OK, "%s", zc_last_error());

    for (uint32_t micro = 0; micro < 2; micro++) {
        for (uint32_t b = 0; b < 2; b++) {
            zc_slot_t slot;
            const uint32_t *raw;
            cr_assert_eq(zc_session_slot_acquire(s, b, -1, &slot), ZC_OK, "%s", zc_last_error());
            raw = slot.data;
            if (b == 0 && micro == 0) {
                /* gap after b2 zeroed, parameter ranges left alone */
                cr_assert_eq(raw[4], 0);
                cr_assert_eq(raw[15], 0);
                cr_assert_eq(raw[0], 0xffffffffu);
                cr_assert_eq(raw[16], 0xffffffffu);
            }
            fill_slot(s, &slot);
            cr_assert_eq(zc_session_slot_submit(s, &slot, micro), ZC_OK, "%s", zc_last_error());
        }
    }
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(res.step, 1);
    cr_assert_float_eq(res.grad_norm, 2.0 * (4 + 128 + 32 + 512), 1e-9);
    cr_assert_float_eq(res.loss_scale, 65536.0, 0);
    cr_assert_eq(zc_session_detach(s, 1), ZC_OK, "%s", zc_last_error());
    cr_assert_null(zc_session_param_ptr(s, 0));
    zc_session_close(s);
    fake_stop(&fk);
    cr_assert_eq(fk.n_bucket_ready, 4);
    cr_assert_eq(fk.gaps_dirty, 0);
    cr_assert(fk.params_ready);
    cr_assert(fk.detached);
}

Test(zc_session, waits_for_a_free_slot)
{
    fake_t fk = {.fail_bucket = -1, .n_slots = 1};
    zc_attach_info_t info;
    zc_step_result_t res;
    zc_slot_t a, b;
    zc_session_t *s;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_params_ready(s), ZC_OK);
    cr_assert_eq(zc_session_slot_acquire(s, 0, -1, &a), ZC_OK);
    /* the only slot is acquired and not submitted: waiting would never end */
    cr_assert_eq(zc_session_slot_acquire(s, 1, 100, &b), ZC_ERR_STATE);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_ERR_STATE);
    fill_slot(s, &a);
    cr_assert_eq(zc_session_slot_submit(s, &a, 0), ZC_OK);
    cr_assert_eq(zc_session_slot_submit(s, &a, 0), ZC_ERR_STATE);
    cr_assert_eq(zc_session_slot_acquire(s, 1, -1, &b), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(b.index, 0);
    fill_slot(s, &b);
    cr_assert_eq(zc_session_slot_submit(s, &b, 2), ZC_ERR_INVALID); /* micro_step >= 2 */
    {
        /* an event handle is a device session's: refused on this host one, naming it */
        unsigned char ev[ZC_EVENT_HANDLE_BYTES] = {0};
        cr_assert_eq(zc_session_slot_submit_event(s, &b, 1, ev, sizeof(ev)), ZC_ERR_INVALID);
        cr_assert(strstr(zc_last_error(), "host session") != NULL, "%s", zc_last_error());
    }
    cr_assert_eq(zc_session_slot_submit(s, &b, 1), ZC_OK);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    cr_assert_float_eq(res.grad_norm, 676.0, 1e-9);
    zc_session_close(s);
    fake_stop(&fk);
    cr_assert_eq(fk.gaps_dirty, 0);
}

Test(zc_session, reports_a_slot_free_error_at_step)
{
    fake_t fk = {.fail_bucket = 1};
    zc_attach_info_t info;
    zc_step_result_t res;
    zc_session_t *s;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_params_ready(s), ZC_OK);
    for (uint32_t b = 0; b < 2; b++) {
        zc_slot_t slot;
        cr_assert_eq(zc_session_slot_acquire(s, b, -1, &slot), ZC_OK);
        fill_slot(s, &slot);
        cr_assert_eq(zc_session_slot_submit(s, &slot, 0), ZC_OK);
    }
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_ERR_PEER_LOST);
    cr_assert(strstr(zc_last_error(), "rank 1 lost") != NULL, "%s", zc_last_error());
    cr_assert(strstr(zc_last_error(), "bucket 1") != NULL, "%s", zc_last_error());
    zc_session_close(s);
    fake_stop(&fk);
}

Test(zc_session, refuses_a_layout_hash_mismatch)
{
    fake_t fk = {.fail_bucket = -1, .bad_hash = 1};
    zc_attach_info_t info;
    zc_session_t *s;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(attach(s, &info), ZC_ERR_LAYOUT_MISMATCH);
    cr_assert(strstr(zc_last_error(), "libzc computed 0x") != NULL, "%s", zc_last_error());
    cr_assert(strstr(zc_last_error(), "daemon has 0x") != NULL, "%s", zc_last_error());
    cr_assert_null(zc_session_param_ptr(s, 0));
    zc_session_close(s);
    fake_stop(&fk);
}

Test(zc_session, refuses_a_protocol_version_mismatch)
{
    fake_t fk = {.fail_bucket = -1, .refuse_version = 1};
    zc_open_params_t op;
    zc_session_t *s = NULL;

    fake_start(&fk);
    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH;
    op.socket_path = fk.path;
    cr_assert_eq(zc_session_open(&op, &s), ZC_ERR_VERSION);
    cr_assert_null(s);
    cr_assert(strstr(zc_last_error(), "daemon protocol 2") != NULL, "%s", zc_last_error());
    fake_stop(&fk);
}

Test(zc_session, stage1_exposes_the_grads_region)
{
    fake_t fk = {.fail_bucket = -1, .stage = 1};
    zc_attach_info_t info;
    zc_step_result_t res;
    zc_session_t *s;
    zc_slot_t slot;
    float *grads;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(info.stage, 1);
    grads = zc_session_grads_ptr(s);
    cr_assert_not_null(grads, "%s", zc_last_error());
    grads[info.total_numel - 1] = 3.0f;
    cr_assert_float_eq(((float *)fk.grads.addr)[info.total_numel - 1], 3.0f, 0);
    cr_assert_eq(zc_session_params_ready(s), ZC_OK);
    cr_assert_eq(zc_session_slot_acquire(s, 0, -1, &slot), ZC_ERR_STATE);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    zc_session_close(s);
    fake_stop(&fk);
}

Test(zc_session, control_role_requests_status)
{
    Zerod__Ipc__V1__Frame req = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__StatusRequest sr = ZEROD__IPC__V1__STATUS_REQUEST__INIT;
    fake_t fk = {.fail_bucket = -1};
    zc_frame_t *reply = NULL;
    zc_attach_info_t info;
    zc_session_t *s;

    fake_start(&fk);
    s = open_session(&fk, 1);
    cr_assert_eq(attach(s, &info), ZC_ERR_STATE);
    req.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS;
    req.status = &sr;
    cr_assert_eq(zc_session_request(s, &req, ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY, -1, &reply),
                 ZC_OK, "%s", zc_last_error());
    cr_assert_str_eq(reply->status_reply->job_id, "job-x");
    cr_assert_eq(zc_result_status(reply->status_reply->result, "status"), ZC_OK);
    zerod__ipc__v1__frame__free_unpacked(reply, NULL);
    zc_session_close(s);
    fake_stop(&fk);
}

Test(zc_session, reports_an_unreachable_daemon)
{
    zc_open_params_t op;
    zc_session_t *s = NULL;

    memset(&op, 0, sizeof(op));
    op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH;
    op.socket_path = "/tmp/zc-test-does-not-exist.sock";
    cr_assert_eq(zc_session_open(&op, &s), ZC_ERR_UNREACHABLE);
    cr_assert(strstr(zc_last_error(), "zc-test-does-not-exist") != NULL, "%s", zc_last_error());
    cr_assert_eq(zc_session_open(NULL, NULL), ZC_ERR_INVALID);
}

/* The default call deadline outwaits the daemon's own peer deadline (HelloReply), so that a
 * lost peer arrives as ERR_PEER_LOST; a timeout the caller chose is kept. */
Test(zc_session, default_deadline_outwaits_the_daemon)
{
    static const struct {
        uint64_t peer_deadline_ms;
        int set_ms; /* 0: default */
        int want_ms;
    } cases[] = {
        {65000, 0, 140000}, /* defaults: (60 s + 5 s) x 2 + 10 s */
        {1000, 0, 60000},   /* short daemon deadlines keep the 60 s floor */
        {65000, 5000, 5000},
        {0, 0, 60000}, /* an older daemon that does not say */
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_t fk = {.fail_bucket = -1, .peer_deadline_ms = cases[i].peer_deadline_ms};
        zc_open_params_t op;
        zc_session_t *s = NULL;

        fake_start(&fk);
        memset(&op, 0, sizeof(op));
        op.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_CONTROL;
        op.socket_path = fk.path;
        op.control = 1;
        if (cases[i].set_ms != 0) {
            op.field_mask |= ZC_OPEN_FIELD_TIMEOUT_MS;
            op.timeout_ms = cases[i].set_ms;
        }
        cr_assert_eq(zc_session_open(&op, &s), ZC_OK, "%s", zc_last_error());
        cr_assert_eq(zc_session_daemon_info(s)->peer_deadline_ms, cases[i].peer_deadline_ms);
        cr_assert_eq(zc_session_timeout_ms(s), cases[i].want_ms, "case %zu: %d ms", i,
                     zc_session_timeout_ms(s));
        zc_session_close(s);
        fake_stop(&fk);
    }
}

/* One micro-step of the two buckets through zc_session_slot_fill (ones everywhere). */
static void fill_and_submit(zc_session_t *s, uint32_t micro)
{
    static const float ones[512] = {[0 ... 511] = 1.0f};

    for (uint32_t b = 0; b < 2; b++) {
        zc_bucket_info_t bi;
        zc_slot_t slot;

        cr_assert_eq(zc_session_slot_acquire(s, b, -1, &slot), ZC_OK, "%s", zc_last_error());
        cr_assert_eq(zc_session_bucket_info(s, b, &bi), ZC_OK);
        for (uint32_t i = 0; i < bi.n_params; i++) {
            zc_bucket_piece_t pc;
            cr_assert_eq(zc_session_bucket_piece(s, b, i, &pc), ZC_OK);
            cr_assert_eq(zc_session_slot_fill(s, &slot, pc.slot_offset, ones, pc.numel), ZC_OK,
                         "%s", zc_last_error());
        }
        cr_assert_eq(zc_session_slot_submit(s, &slot, micro), ZC_OK, "%s", zc_last_error());
    }
}

static void expect_stores(zc_session_t *s, uint64_t numel, int nt, unsigned pf, int planned)
{
    int got_nt = -1, got_planned = -1;
    unsigned got_pf = 99;

    cr_assert_eq(zc_session_fill_stores(s, numel, &got_nt, &got_pf, &got_planned), ZC_OK);
    cr_assert(got_nt == nt && got_pf == pf && got_planned == planned,
              "%llu elements: nt %d prefetch %u planned %d, want %d %u %d",
              (unsigned long long)numel, got_nt, got_pf, got_planned, nt, pf, planned);
}

/* Slots filled through zc_session_slot_fill reach the daemon; a fill outside the bucket or
 * into a slot not acquired is refused and names the range; the copies follow the plan the
 * daemon sends with its step replies, and only one this process can use. */
Test(zc_session, fills_slots_with_the_daemons_copy_plan)
{
    Zerod__Ipc__V1__CopyStores plan = ZEROD__IPC__V1__COPY_STORES__INIT;
    Zerod__Ipc__V1__CopyStores odd = ZEROD__IPC__V1__COPY_STORES__INIT;
    Zerod__Ipc__V1__CopyStores other = ZEROD__IPC__V1__COPY_STORES__INIT;
    fake_t fk = {.fail_bucket = -1, .copy_stores = {NULL, &plan, &odd, &other}};
    const float one = 1.0f;
    zc_attach_info_t info;
    zc_step_result_t res;
    zc_slot_t slot, stale;
    zc_session_t *s;

    plan.variant = (char *)zk_variant_name(zk_default_variant());
    plan.nt_from = 4 << 20; /* footprint bytes: copies of 512 Ki fp32 elements and more */
    plan.nt_to = UINT64_MAX;
    plan.prefetch_nt = 512;
    plan.pf_from = UINT64_MAX;
    plan.pf_to_nt = 16 << 20; /* the prefetch stops at 16 MiB of footprint: 2 Mi elements */
    odd = plan;
    odd.prefetch_nt = 7; /* no plan chooses it */
    other = plan;
    other.variant = zk_default_variant() == ZK_VARIANT_SCALAR ? "avx2" : "scalar";
    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_params_ready(s), ZC_OK);
    expect_stores(s, 1u << 20, 0, 0, 0);

    cr_assert_eq(zc_session_slot_acquire(s, 0, -1, &slot), ZC_OK);
    cr_assert_eq(zc_session_slot_fill(s, &slot, 511, &one, 2), ZC_ERR_INVALID);
    cr_assert(strstr(zc_last_error(), "[511, 511 + 2) of bucket 0 (512 elements)") != NULL, "%s",
              zc_last_error());
    cr_assert_eq(zc_session_slot_fill(s, &slot, 600, &one, 0), ZC_ERR_INVALID);
    cr_assert_eq(zc_session_slot_fill(s, &slot, 0, NULL, 1), ZC_ERR_INVALID);
    stale = slot;
    stale.bucket = 1;
    cr_assert_eq(zc_session_slot_fill(s, &stale, 0, &one, 1), ZC_ERR_STATE);
    stale.index = 7;
    cr_assert_eq(zc_session_slot_fill(s, &stale, 0, &one, 1), ZC_ERR_INVALID);
    fill_slot(s, &slot);
    cr_assert_eq(zc_session_slot_submit(s, &slot, 0), ZC_OK);
    cr_assert_eq(zc_session_slot_fill(s, &slot, 0, &one, 1), ZC_ERR_STATE); /* submitted */
    cr_assert_eq(zc_session_slot_acquire(s, 1, -1, &slot), ZC_OK);
    fill_slot(s, &slot);
    cr_assert_eq(zc_session_slot_submit(s, &slot, 1), ZC_OK);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    expect_stores(s, 1u << 20, 0, 0, 0); /* the first reply carried no plan */

    fill_and_submit(s, 0);
    fill_and_submit(s, 1);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    cr_assert_float_eq(res.grad_norm, 676.0 * 3, 1e-9); /* every fill reached the slots */
    expect_stores(s, 1u << 20, 1, 512, 1);
    expect_stores(s, 1u << 10, 0, 0, 1); /* 8 KiB: in cache, regular stores */
    expect_stores(s, 4u << 20, 1, 0, 1); /* 32 MiB: beyond pf_to_nt, no prefetch */

    fill_and_submit(s, 0);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    expect_stores(s, 1u << 20, 0, 0, 0); /* a distance no plan has: not taken */
    fill_and_submit(s, 1);
    cr_assert_eq(zc_session_step(s, NULL, &res), ZC_OK, "%s", zc_last_error());
    expect_stores(s, 1u << 20, 0, 0, 0); /* another variant's plan: not taken */
    zc_session_close(s);
    fake_stop(&fk);
    cr_assert_eq(fk.gaps_dirty, 0);
}

/* A CPU-backend daemon's regions are host memory: zc_session_memory says so, with no device
 * whatever AttachReply.device holds, and answers ZC_ERR_STATE before the attach and after the
 * detach. */
Test(zc_session, reports_host_memory)
{
    fake_t fk = {.fail_bucket = -1, .device = 3};
    zc_attach_info_t info;
    zc_session_t *s;
    int dev = 7;

    fake_start(&fk);
    s = open_session(&fk, 0);
    cr_assert_eq(zc_session_memory(s, &dev), ZC_ERR_STATE);
    cr_assert_eq(dev, -1);
    cr_assert_eq(attach(s, &info), ZC_OK, "%s", zc_last_error());
    dev = 7;
    cr_assert_eq(zc_session_memory(s, &dev), ZC_MEMORY_HOST, "%s", zc_last_error());
    cr_assert_eq(dev, -1);
    cr_assert_eq(zc_session_memory(s, NULL), ZC_MEMORY_HOST);
    cr_assert_eq(zc_session_fill_stores(s, 1, NULL, NULL, NULL), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_params_ready(s), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(zc_session_detach(s, 1), ZC_OK, "%s", zc_last_error());
    dev = 7;
    cr_assert_eq(zc_session_memory(s, &dev), ZC_ERR_STATE);
    cr_assert_eq(dev, -1);
    cr_assert_eq(zc_session_memory(NULL, &dev), ZC_ERR_INVALID);
    zc_session_close(s);
    fake_stop(&fk);
}

/* A memory kind libzc does not know, or device regions on no device, end the attach with
 * ZC_ERR_PROTOCOL naming the value. */
Test(zc_session, refuses_an_unknown_memory_kind)
{
    static const struct {
        int memory;
        int32_t device;
        const char *says;
    } cases[] = {
        {1, 0, "memory kind 1 is neither MEMORY_HOST (0) nor MEMORY_DEVICE (2)"},
        {7, 0, "memory kind 7"},
        {2, -1, "device regions on CUDA device -1"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fake_t fk = {.fail_bucket = -1, .memory = cases[i].memory, .device = cases[i].device};
        zc_attach_info_t info;
        zc_session_t *s;

        fake_start(&fk);
        s = open_session(&fk, 0);
        cr_assert_eq(attach(s, &info), ZC_ERR_PROTOCOL, "case %zu: %s", i, zc_last_error());
        cr_assert(strstr(zc_last_error(), cases[i].says) != NULL, "case %zu: %s", i,
                  zc_last_error());
        cr_assert_null(zc_session_param_ptr(s, 0));
        cr_assert_eq(zc_session_memory(s, NULL), ZC_ERR_STATE);
        zc_session_close(s);
        fake_stop(&fk);
    }
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

/* Device regions this process cannot import -- no GPU here, a libzc built without CUDA, or on
 * a GPU the fake's memfds, which are no CUDA allocations -- fail the attach with zk's status
 * and message, naming the region and the device, and leave no region mapped and no fd open. */
Test(zc_session, reports_device_regions_it_cannot_import)
{
    fake_t fk = {.fail_bucket = -1, .memory = 2, .device = 0};
    zc_attach_info_t info;
    zc_session_t *s;
    int fds_before = count_fds();
    int status;

    fake_start(&fk);
    s = open_session(&fk, 0);
    status = attach(s, &info);
    cr_assert(status == ZC_ERR_NO_DEVICE || status == ZC_ERR_UNSUPPORTED || status == ZC_ERR_CUDA,
              "%s: %s", zc_status_name(status), zc_last_error());
    cr_assert(strstr(zc_last_error(), "attach: the params region: cannot import") != NULL, "%s",
              zc_last_error());
    cr_assert(strstr(zc_last_error(), "on cuda:0") != NULL, "%s", zc_last_error());
    cr_assert(strstr(zc_last_error(), "zk_cuda_region_") != NULL, "zk's message: %s",
              zc_last_error());
    cr_assert_null(zc_session_param_ptr(s, 0));
    cr_assert_eq(zc_session_memory(s, NULL), ZC_ERR_STATE);
    zc_session_close(s);
    fake_stop(&fk);
    cr_assert_eq(count_fds(), fds_before);
}
