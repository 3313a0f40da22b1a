/* The control queries of zerod/zc.h (zc_session_daemon_status, zc_session_shard_info and their
 * index accessors) against a fake daemon thread that speaks through libzc's own zc_conn: the
 * fields, the field_mask contract, a daemon error, and how long the kept reply lives. */
#define _GNU_SOURCE
#include "zc_int.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct fake {
    char dir[64];
    char path[96];
    int lfd;
    pthread_t th;
    int no_job;   /* ShardInfo answers ZS_ERR_NOT_FOUND, Status has_job false */
    int n_status; /* Status requests answered: the step the next one reports */
} fake_t;

/* ---- fake daemon ------------------------------------------------------------------- */

static void fake_status(fake_t *fk, Zerod__Ipc__V1__StatusReply *st,
                        Zerod__Ipc__V1__MemoryTerm *terms, Zerod__Ipc__V1__MemoryTerm **pterms)
{
    static const char *const names[2] = {"params", "master"};

    st->version = "0.1.0-fake";
    st->pid = 4242;
    st->device = "fake0";
    st->socket = fk->path;
    st->uptime_s = 12.5;
    st->heap_in_use = 123456789012;
    st->activity = "step 7";
    st->activity_s = 0.25;
    st->has_job = !fk->no_job;
    st->job_id = "job-x";
    st->rank = 1;
    st->world = 2;
    st->stage = 2;
    st->dtype = ZEROD__IPC__V1__DTYPE__DTYPE_BF16;
    st->step = (uint64_t)++fk->n_status;
    st->skipped_steps = 1;
    st->loss_scale = 1024.0;
    st->grad_norm = -1.0;
    st->trainer_attached = 1;
    st->param_numel = 676;
    st->layout_hash = UINT64_C(0x7150b4d071be7f1e);
    st->collectives = "local (world 1)";
    st->steps_per_s = 2.5;
    st->train_batch_size = 64;
    st->busbw_reduce_scatter = 1.5e9;
    st->busbw_all_gather = 2.5e9;
    st->wait_reduce_scatter_s = 0.125;
    st->wait_all_gather_s = 0.25;
    st->params_shared = true;
    for (int i = 0; i < 2; i++) {
        zerod__ipc__v1__memory_term__init(&terms[i]);
        terms[i].name = (char *)names[i];
        terms[i].bytes = 1000u * (unsigned)(i + 1);
        terms[i].formula_bytes = 900u * (unsigned)(i + 1);
        terms[i].formula = i == 0 ? "2Ψ" : "4Ψ/N";
        pterms[i] = &terms[i];
    }
    st->n_memory = 2;
    st->memory = pterms;
}

static void fake_shard(Zerod__Ipc__V1__ShardInfoReply *si, Zerod__Ipc__V1__GroupShard *groups,
                       Zerod__Ipc__V1__GroupShard **pgroups)
{
    si->job_id = "job-x";
    si->rank = 1;
    si->world = 2;
    si->total_numel = 1024;
    si->param_numel = 676;
    si->shard_numel = 512;
    si->n_buckets = 2;
    si->max_bucket_numel = 512;
    si->bucket_size = 256;
    si->layout_hash = UINT64_C(0x7150b4d071be7f1e);
    si->master_sumsq = 12.5;
    for (uint32_t g = 0; g < 2; g++) {
        zerod__ipc__v1__group_shard__init(&groups[g]);
        groups[g].group = g;
        groups[g].n_params = 2 + g;
        groups[g].n_buckets = 1;
        groups[g].flat_offset = 512u * g;
        groups[g].flat_numel = 512;
        groups[g].shard_offset = 256u * g;
        groups[g].shard_numel = 256;
        groups[g].lr = 0.01 * (g + 1);
        groups[g].weight_decay = 0.1 * g;
        pgroups[g] = &groups[g];
    }
    si->n_groups = 2;
    si->groups = pgroups;
}

static void fake_answer(fake_t *fk, zc_conn_t *c, const zc_frame_t *req)
{
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Result res = ZEROD__IPC__V1__RESULT__INIT;
    Zerod__Ipc__V1__HelloReply hr = ZEROD__IPC__V1__HELLO_REPLY__INIT;
    Zerod__Ipc__V1__StatusReply st = ZEROD__IPC__V1__STATUS_REPLY__INIT;
    Zerod__Ipc__V1__ShardInfoReply si = ZEROD__IPC__V1__SHARD_INFO_REPLY__INIT;
    Zerod__Ipc__V1__MemoryTerm terms[2], *pterms[2];
    Zerod__Ipc__V1__GroupShard groups[2], *pgroups[2];

    f.seq = req->seq;
    if (req->body_case == ZEROD__IPC__V1__FRAME__BODY_HELLO) {
        hr.result = &res;
        hr.protocol = ZC_PROTOCOL_VERSION;
        hr.version = "0.1.0-fake";
        hr.device = "fake0";
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO_REPLY;
        f.hello_reply = &hr;
    } else if (req->body_case == ZEROD__IPC__V1__FRAME__BODY_STATUS) {
        fake_status(fk, &st, terms, pterms);
        st.result = &res;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_STATUS_REPLY;
        f.status_reply = &st;
    } else if (req->body_case == ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO) {
        if (fk->no_job) {
            res.status = ZEROD__COMMON__V1__STATUS__ZS_ERR_NOT_FOUND;
            res.message = "no job on this daemon";
        } else {
            fake_shard(&si, groups, pgroups);
        }
        si.result = &res;
        f.body_case = ZEROD__IPC__V1__FRAME__BODY_SHARD_INFO_REPLY;
        f.shard_info_reply = &si;
    } else {
        return;
    }
    /* no cr_assert off the test's thread: a frame not sent fails the client's call */
    (void)zc_conn_send(c, &f, -1, zs_deadline_in_ms(5000));
}

static void *fake_main(void *arg)
{
    fake_t *fk = arg;
    zc_frame_t *req = NULL;
    zc_conn_t c;
    int fd = accept4(fk->lfd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0 || zc_conn_init(&c, fd) != ZC_OK) {
        return NULL;
    }
    while (zc_conn_recv(&c, zs_deadline_in_ms(5000), &req) == ZC_OK) {
        fake_answer(fk, &c, req);
        zerod__ipc__v1__frame__free_unpacked(req, NULL);
    }
    zc_conn_cleanup(&c);
    return NULL;
}

/* Listen, serve one connection in a thread, and open a control session on it. */
static zc_session_t *fake_open(fake_t *fk)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    zc_open_params_t op = {.field_mask = ZC_OPEN_FIELD_SOCKET_PATH | ZC_OPEN_FIELD_CONTROL |
                                         ZC_OPEN_FIELD_TIMEOUT_MS};
    zc_session_t *s = NULL;

    snprintf(fk->dir, sizeof(fk->dir), "/tmp/zc-control-XXXXXX");
    cr_assert_not_null(mkdtemp(fk->dir));
    snprintf(fk->path, sizeof(fk->path), "%s/zd.sock", fk->dir);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", fk->path);
    fk->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fk->lfd >= 0);
    cr_assert_eq(bind(fk->lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    cr_assert_eq(listen(fk->lfd, 1), 0);
    cr_assert_eq(pthread_create(&fk->th, NULL, fake_main, fk), 0);
    op.socket_path = fk->path;
    op.control = 1;
    op.timeout_ms = 5000;
    cr_assert_eq(zc_session_open(&op, &s), ZC_OK, "%s", zc_last_error());
    return s;
}

static void fake_close(fake_t *fk, zc_session_t *s)
{
    zc_session_close(s);
    pthread_join(fk->th, NULL);
    close(fk->lfd);
    unlink(fk->path);
    rmdir(fk->dir);
}

#define STATUS_ALL                                                                                 \
    (ZC_DAEMON_STATUS_FIELD_DAEMON | ZC_DAEMON_STATUS_FIELD_ACTIVITY |                             \
     ZC_DAEMON_STATUS_FIELD_JOB | ZC_DAEMON_STATUS_FIELD_MEMORY | ZC_DAEMON_STATUS_FIELD_RATE |    \
     ZC_DAEMON_STATUS_FIELD_WAIT)

/* ---- tests ------------------------------------------------------------------------- */

Test(zc_session_daemon_status, fills_every_part_asked_for)
{
    zc_daemon_status_t st = {.field_mask = STATUS_ALL};
    zc_memory_term_t t = {.field_mask =
                              ZC_MEMORY_TERM_FIELD_MEASURED | ZC_MEMORY_TERM_FIELD_FORMULA};
    fake_t fk = {.no_job = 0};
    zc_session_t *s = fake_open(&fk);

    cr_assert_eq(zc_session_daemon_status(s, -1, &st), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(st.field_mask, STATUS_ALL);
    cr_assert_str_eq(st.version, "0.1.0-fake");
    cr_assert_eq(st.pid, 4242);
    cr_assert_str_eq(st.device, "fake0");
    cr_assert_str_eq(st.socket, fk.path);
    cr_assert_eq(st.uptime_s, 12.5);
    cr_assert_eq(st.heap_in_use, 123456789012);
    cr_assert_str_eq(st.activity, "step 7");
    cr_assert_eq(st.activity_s, 0.25);
    cr_assert_eq(st.has_job, 1);
    cr_assert_str_eq(st.job_id, "job-x");
    cr_assert(st.rank == 1 && st.world == 2 && st.stage == 2);
    cr_assert_eq(st.dtype, ZC_DTYPE_BF16);
    cr_assert_str_eq(zc_dtype_name(st.dtype), "bf16");
    cr_assert_eq(st.trainer_attached, 1);
    cr_assert(st.step == 1 && st.skipped_steps == 1);
    cr_assert(st.loss_scale == 1024.0 && st.grad_norm == -1.0);
    cr_assert_eq(st.param_numel, 676);
    cr_assert_eq(st.layout_hash, UINT64_C(0x7150b4d071be7f1e));
    cr_assert_str_eq(st.collectives, "local (world 1)");
    cr_assert_eq(st.n_memory, 2);
    cr_assert(st.steps_per_s == 2.5 && st.train_batch_size == 64);
    cr_assert(st.busbw_reduce_scatter == 1.5e9 && st.busbw_all_gather == 2.5e9);
    cr_assert(st.wait_reduce_scatter_s == 0.125 && st.wait_all_gather_s == 0.25);
    cr_assert_eq(st.params_shared, 1);

    cr_assert_eq(zc_session_memory_term(s, 1, &t), ZC_OK, "%s", zc_last_error());
    cr_assert_str_eq(t.name, "master");
    cr_assert(t.bytes == 2000 && t.formula_bytes == 1800);
    cr_assert_str_eq(t.formula, "4Ψ/N");
    cr_assert_eq(zc_session_memory_term(s, 2, &t), ZC_ERR_INVALID);
    fake_close(&fk, s);
}

Test(zc_session_daemon_status, fills_only_the_parts_asked_for)
{
    const uint64_t unknown = UINT64_C(1) << 40; /* a part of a later libzc */
    zc_daemon_status_t st;
    zc_memory_term_t t;
    fake_t fk = {.no_job = 0};
    zc_session_t *s = fake_open(&fk);

    memset(&st, 0xab, sizeof(st));
    st.field_mask = ZC_DAEMON_STATUS_FIELD_ACTIVITY | unknown;
    cr_assert_eq(zc_session_daemon_status(s, -1, &st), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(st.field_mask, ZC_DAEMON_STATUS_FIELD_ACTIVITY, "the unknown part is cleared");
    cr_assert_str_eq(st.activity, "step 7");
    cr_assert_eq(st.pid, (int32_t)0xabababab, "DAEMON was not asked for");
    cr_assert_eq(st.step, UINT64_C(0xabababababababab), "JOB was not asked for");
    cr_assert_eq(st.n_memory, 0xababababu, "MEMORY was not asked for");
    cr_assert_eq(st.train_batch_size, 0xababababu, "RATE was not asked for");

    memset(&t, 0xab, sizeof(t));
    t.field_mask = ZC_MEMORY_TERM_FIELD_FORMULA;
    cr_assert_eq(zc_session_memory_term(s, 0, &t), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(t.field_mask, ZC_MEMORY_TERM_FIELD_FORMULA);
    cr_assert_str_eq(t.formula, "2Ψ");
    cr_assert_eq(t.bytes, UINT64_C(0xabababababababab), "MEASURED was not asked for");
    fake_close(&fk, s);
}

Test(zc_session_daemon_status, terms_read_the_latest_status)
{
    zc_daemon_status_t st = {.field_mask = STATUS_ALL};
    zc_memory_term_t t = {.field_mask = ZC_MEMORY_TERM_FIELD_MEASURED};
    fake_t fk = {.no_job = 0};
    zc_session_t *s = fake_open(&fk);

    cr_assert_eq(zc_session_memory_term(s, 0, &t), ZC_ERR_STATE, "no status queried yet");
    cr_assert_eq(zc_session_daemon_status(s, -1, &st), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(st.step, 1);
    cr_assert_eq(zc_session_daemon_status(s, -1, &st), ZC_OK, "%s", zc_last_error());
    cr_assert_eq(st.step, 2);
    cr_assert_str_eq(st.job_id, "job-x", "the strings of the latest reply");
    cr_assert_eq(zc_session_memory_term(s, 0, &t), ZC_OK, "%s", zc_last_error());
    cr_assert_str_eq(t.name, "params");
    fake_close(&fk, s);
}

Test(zc_session_shard_info, fills_the_shard_and_its_groups)
{
    zc_shard_info_t info = {.field_mask = ZC_SHARD_INFO_FIELD_LAYOUT | ZC_SHARD_INFO_FIELD_MASTER |
                                          ZC_SHARD_INFO_FIELD_GROUPS};
    zc_group_shard_t g = {.field_mask = ZC_GROUP_SHARD_FIELD_RANGES | ZC_GROUP_SHARD_FIELD_OPTIONS};
    fake_t fk = {.no_job = 0};
    zc_session_t *s = fake_open(&fk);

    cr_assert_eq(zc_session_group_shard(s, 0, &g), ZC_ERR_STATE, "no shard queried yet");
    cr_assert_eq(zc_session_shard_info(s, -1, &info), ZC_OK, "%s", zc_last_error());
    cr_assert_str_eq(info.job_id, "job-x");
    cr_assert(info.rank == 1 && info.world == 2);
    cr_assert(info.total_numel == 1024 && info.param_numel == 676 && info.shard_numel == 512);
    cr_assert(info.n_buckets == 2 && info.max_bucket_numel == 512 && info.bucket_size == 256);
    cr_assert_eq(info.layout_hash, UINT64_C(0x7150b4d071be7f1e));
    cr_assert_eq(info.master_sumsq, 12.5);
    cr_assert_eq(info.n_groups, 2);

    cr_assert_eq(zc_session_group_shard(s, 1, &g), ZC_OK, "%s", zc_last_error());
    cr_assert(g.group == 1 && g.n_params == 3 && g.n_buckets == 1);
    cr_assert(g.flat_offset == 512 && g.flat_numel == 512);
    cr_assert(g.shard_offset == 256 && g.shard_numel == 256);
    cr_assert(g.lr == 0.02 && g.weight_decay == 0.1);
    cr_assert_eq(zc_session_group_shard(s, 2, &g), ZC_ERR_INVALID);
    fake_close(&fk, s);
}

Test(zc_session_shard_info, returns_the_daemon_error_and_leaves_info_alone)
{
    zc_shard_info_t info = {.field_mask = ZC_SHARD_INFO_FIELD_LAYOUT, .rank = 77};
    fake_t fk = {.no_job = 1};
    zc_session_t *s = fake_open(&fk);

    cr_assert_eq(zc_session_shard_info(s, -1, &info), ZC_ERR_NOT_FOUND);
    cr_assert_str_eq(zc_last_error(), "shard: ERR_NOT_FOUND: no job on this daemon");
    cr_assert_eq(info.field_mask, ZC_SHARD_INFO_FIELD_LAYOUT);
    cr_assert_eq(info.rank, 77);
    fake_close(&fk, s);
}

Test(zc_dtype_name, names_each_dtype_and_a_stranger)
{
    cr_assert_str_eq(zc_dtype_name(ZC_DTYPE_F32), "fp32");
    cr_assert_str_eq(zc_dtype_name(ZC_DTYPE_F16), "fp16");
    cr_assert_str_eq(zc_dtype_name(ZC_DTYPE_BF16), "bf16");
    cr_assert_str_eq(zc_dtype_name((zc_dtype_t)7), "unknown");
}
