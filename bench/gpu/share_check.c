/*
 * Device regions and interprocess events between two processes on one GPU (zk/cuda_share.h),
 * the way a daemon on the CUDA backend and its trainer will use them.
 *
 *   1. The "daemon" (this process) creates a region and an event, writes a pattern on its
 *      stream, records the event and sends the region's fd and the event's handle over a Unix
 *      socket. The "trainer" (a forked child) imports both, makes its stream wait on the event,
 *      adds 1 to every element, records its own event and sends that back; the daemon's stream
 *      waits on it and the daemon checks every element. No CPU waits on a stream in between.
 *   2. Hand-off latency: rounds of trainer copy of one bucket into the slot -> event -> daemon
 *      accumulate of the slot -> event -> trainer, against the same copy + accumulate on one
 *      stream of one process. Prints the added time per bucket.
 *   3. With --python SCRIPT: the same handshake with a torch process that maps the region
 *      through libzc (zerod._cuda) and sees it as a tensor.
 *
 * Exit: 0 ok, 1 mismatch or error, 3 no CUDA device.
 */
#include "zk/cuda_share.h"
#include "zs/time.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MSG_REGION = 1, MSG_DONE, MSG_PING, MSG_READY, MSG_FREE, MSG_QUIT };

/* One message; the Python side packs it as "<IIQQ64s". */
typedef struct msg {
    uint32_t type, pad;
    uint64_t a, b;
    unsigned char ev[ZK_CUDA_EVENT_HANDLE_BYTES];
} msg_t;

#define N_ELEMS   ((size_t)16 * 1024 * 1024 + 7) /* odd: the granularity rounding is exercised */
#define SLOT_ELEM ((size_t)2 * 1024 * 1024)      /* one 8 MiB fp32 bucket */
#define ROUNDS    2000

static int fail(const char *what)
{
    printf("share_check: FAIL %s: %s\n", what, zk_last_error());
    return 1;
}

static int send_msg(int sock, const msg_t *m, int fd)
{
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

    if (fd >= 0) {
        struct cmsghdr *c;
        memset(ctl, 0, sizeof(ctl));
        mh.msg_control = ctl;
        mh.msg_controllen = sizeof(ctl);
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -1;
}

/* 1: receive by spinning on a non-blocking recvmsg instead of sleeping in poll */
static int g_spin;

/* Receive one message within 60 s; *fd_p gets a passed fd (or -1). */
static int recv_msg(int sock, msg_t *m, int *fd_p)
{
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct pollfd p = {.fd = sock, .events = POLLIN};
    struct cmsghdr *c;

    if (fd_p != NULL) {
        *fd_p = -1;
    }
    if (g_spin) {
        uint64_t end = zs_time_now_ns() + 60000000000ull;
        ssize_t got;
        while ((got = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 && errno == EAGAIN &&
               zs_time_now_ns() < end) {
        }
        if (got == (ssize_t)sizeof(*m)) {
            goto received;
        }
        fprintf(stderr, "share_check: no message from the peer within 60 s (%s)\n",
                strerror(errno));
        return -1;
    }
    if (poll(&p, 1, 60000) != 1 || recvmsg(sock, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(*m)) {
        fprintf(stderr, "share_check: no message from the peer within 60 s (%s)\n",
                strerror(errno));
        return -1;
    }
received:
    c = CMSG_FIRSTHDR(&mh);
    if (c != NULL && c->cmsg_type == SCM_RIGHTS && fd_p != NULL) {
        memcpy(fd_p, CMSG_DATA(c), sizeof(int));
    }
    return 0;
}

/* The trainer side in C: the handshake, then the ping-pong rounds. */
static int trainer(int sock)
{
    zk_cuda_region_t r;
    zk_cuda_event_t ed, et;
    cudaStream_t t;
    float *src, *ones;
    msg_t m;
    int fd;

    if (recv_msg(sock, &m, &fd) != 0 || m.type != MSG_REGION) {
        return 1;
    }
    if (zk_cuda_region_import(0, fd, m.a, &r) != ZS_OK) {
        return fail("trainer: import");
    }
    if (zk_cuda_event_open(0, m.ev, &ed) != ZS_OK || zk_cuda_event_create(0, &et) != ZS_OK) {
        return fail("trainer: events");
    }
    cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking);
    ones = malloc(m.b * sizeof(float)); /* setup: a buffer of ones on the device */
    for (uint64_t i = 0; i < m.b; i++) {
        ones[i] = 1.0f;
    }
    cudaMalloc((void **)&src, m.b * sizeof(float));
    cudaMemcpy(src, ones, m.b * sizeof(float), cudaMemcpyHostToDevice);
    free(ones);
    ones = src;
    cudaMalloc((void **)&src, SLOT_ELEM * sizeof(float));
    cudaMemset(src, 0, SLOT_ELEM * sizeof(float));
    /* the hot path from here: the daemon's pattern, then region += 1 after its event */
    zk_cuda_stream_wait_event(t, &ed);
    if (zk_cuda_accumulate((float *)r.ptr, ones, ZS_DTYPE_F32, 1.0f, m.b, t) != ZS_OK ||
        zk_cuda_event_record(&et, t) != ZS_OK) {
        return fail("trainer: add");
    }
    memset(&m, 0, sizeof(m));
    m.type = MSG_DONE;
    memcpy(m.ev, et.handle, sizeof(m.ev));
    if (send_msg(sock, &m, -1) != 0) {
        return 1;
    }
    /* ping-pong rounds until MSG_QUIT; b: 1 = messages only, 0 = copy and events too */
    while (recv_msg(sock, &m, NULL) == 0 && m.type == MSG_PING) {
        g_spin = (int)m.pad;
        for (uint64_t k = 0; k < m.a; k++) {
            msg_t q = {.type = MSG_READY};
            if (m.b == 0) {
                if (k > 0) {
                    zk_cuda_stream_wait_event(t, &ed); /* the slot is free again */
                }
                cudaMemcpyAsync((void *)r.ptr, src, SLOT_ELEM * sizeof(float),
                                cudaMemcpyDeviceToDevice, t);
                zk_cuda_event_record(&et, t);
            }
            if (send_msg(sock, &q, -1) != 0 || recv_msg(sock, &q, NULL) != 0 ||
                q.type != MSG_FREE) {
                return 1;
            }
        }
    }
    cudaStreamSynchronize(t);
    zk_cuda_event_cleanup(&et);
    zk_cuda_event_cleanup(&ed);
    zk_cuda_region_cleanup(&r);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

/* Every element of the region is pattern(i) + add. */
static int check_region(const zk_cuda_region_t *r, cudaStream_t s, const zk_cuda_event_t *et,
                        float add, const char *who)
{
    size_t bad = 0, first = 0;
    float *h;

    if (zk_cuda_stream_wait_event(s, et) != ZS_OK) {
        return fail("daemon: wait for the trainer's event");
    }
    h = malloc(N_ELEMS * sizeof(float));
    cudaMemcpyAsync(h, (const void *)r->ptr, N_ELEMS * sizeof(float), cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) {
        printf("share_check: FAIL copy back: %s\n", cudaGetErrorString(cudaGetLastError()));
        free(h);
        return 1;
    }
    for (size_t i = 0; i < N_ELEMS; i++) {
        if (h[i] != (float)(i % 1021) + add && bad++ == 0) {
            first = i;
        }
    }
    if (bad != 0) {
        printf("share_check: FAIL %s: %zu of %zu elements wrong, first [%zu] = %g, want %g\n", who,
               bad, N_ELEMS, first, (double)h[first], (double)((float)(first % 1021) + add));
    } else {
        printf("share_check: ok   %s: %zu elements written after the daemon's event, read back "
               "after the trainer's\n",
               who, N_ELEMS);
    }
    free(h);
    return bad != 0;
}

/* The pattern into the region on s, then record ed. */
static void fill_pattern(const zk_cuda_region_t *r, cudaStream_t s, const zk_cuda_event_t *ed,
                         float *pinned)
{
    for (size_t i = 0; i < N_ELEMS; i++) {
        pinned[i] = (float)(i % 1021);
    }
    cudaMemcpyAsync((void *)r->ptr, pinned, N_ELEMS * sizeof(float), cudaMemcpyHostToDevice, s);
    zk_cuda_event_record(ed, s);
}

/* One series of ROUNDS rounds; msgs_only: no GPU call on either side. Returns its wall time,
 * and in *cuda_ns_p the daemon's CPU time inside the event record and wait calls. */
static int pingpong(int sock, const zk_cuda_region_t *r, cudaStream_t s, const zk_cuda_event_t *ed,
                    const zk_cuda_event_t *et, float *acc, bool msgs_only, uint64_t *ns_p,
                    uint64_t *cuda_ns_p)
{
    msg_t m = {.type = MSG_PING, .pad = (uint32_t)g_spin, .a = ROUNDS, .b = msgs_only};
    uint64_t t0 = zs_time_now_ns(), t1;

    *cuda_ns_p = 0;
    if (send_msg(sock, &m, -1) != 0) {
        return 1;
    }
    for (int k = 0; k < ROUNDS; k++) {
        msg_t q = {.type = MSG_FREE};
        if (recv_msg(sock, &m, NULL) != 0 || m.type != MSG_READY) {
            return 1;
        }
        if (!msgs_only) {
            t1 = zs_time_now_ns();
            zk_cuda_stream_wait_event(s, et);
            *cuda_ns_p += zs_time_now_ns() - t1;
            zk_cuda_accumulate(acc, (const float *)r->ptr, ZS_DTYPE_F32, 1.0f, SLOT_ELEM, s);
            t1 = zs_time_now_ns();
            zk_cuda_event_record(ed, s);
            *cuda_ns_p += zs_time_now_ns() - t1;
        }
        if (send_msg(sock, &q, -1) != 0) {
            return 1;
        }
    }
    cudaStreamSynchronize(s);
    *ns_p = zs_time_now_ns() - t0;
    return 0;
}

/* Rounds of the one-slot hand-off against the same copy + accumulate on one stream, and
 * against the messages alone. */
static int latency(int sock, const zk_cuda_region_t *r, cudaStream_t s, const zk_cuda_event_t *ed,
                   const zk_cuda_event_t *et)
{
    float *acc, *src;
    uint64_t t0, t_pp, t_msg, t_one, t_cuda, t_unused;

    cudaMalloc((void **)&acc, SLOT_ELEM * sizeof(float));
    cudaMalloc((void **)&src, SLOT_ELEM * sizeof(float));
    cudaMemset(acc, 0, SLOT_ELEM * sizeof(float));
    cudaMemset(src, 0, SLOT_ELEM * sizeof(float));
    cudaStreamSynchronize(s);
    t0 = zs_time_now_ns();
    for (int k = 0; k < ROUNDS; k++) {
        cudaMemcpyAsync((void *)r->ptr, src, SLOT_ELEM * sizeof(float), cudaMemcpyDeviceToDevice,
                        s);
        zk_cuda_accumulate(acc, (const float *)r->ptr, ZS_DTYPE_F32, 1.0f, SLOT_ELEM, s);
    }
    cudaStreamSynchronize(s);
    t_one = zs_time_now_ns() - t0;
    printf("share_check: hand-off of one %zu MiB bucket through one slot, %d rounds; copy + "
           "accumulate on one stream: %.1f us a round\n",
           SLOT_ELEM * sizeof(float) >> 20, ROUNDS, (double)t_one / ROUNDS / 1e3);
    for (g_spin = 0; g_spin <= 1; g_spin++) {
        const char *how = g_spin ? "spinning receive" : "poll";
        if (pingpong(sock, r, s, ed, et, acc, true, &t_msg, &t_unused) != 0 ||
            pingpong(sock, r, s, ed, et, acc, false, &t_pp, &t_cuda) != 0) {
            return 1;
        }
        printf("share_check:   %-16s %.1f us a round, the messages alone %.1f us, the daemon's "
               "CPU in event record + wait %.1f us\n",
               how, (double)t_pp / ROUNDS / 1e3, (double)t_msg / ROUNDS / 1e3,
               (double)t_cuda / ROUNDS / 1e3);
        printf("SUMMARY handoff_added_us (%s) %.1f (round - copy - accumulate; target < 20)\n", how,
               ((double)t_pp - (double)t_one) / ROUNDS / 1e3);
    }
    g_spin = 0;
    cudaFree(acc);
    cudaFree(src);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

/* Send the region and the daemon's event; take the trainer's event back and open it. */
static int handshake(int sock, const zk_cuda_region_t *r, const zk_cuda_event_t *ed,
                     zk_cuda_event_t *et)
{
    msg_t m = {.type = MSG_REGION, .a = r->size, .b = N_ELEMS};

    memcpy(m.ev, ed->handle, sizeof(m.ev));
    if (send_msg(sock, &m, r->fd) != 0 || recv_msg(sock, &m, NULL) != 0 || m.type != MSG_DONE) {
        printf("share_check: FAIL the trainer did not answer the region\n");
        return 1;
    }
    if (zk_cuda_event_open(0, m.ev, et) != ZS_OK) {
        return fail("daemon: open the trainer's event");
    }
    return 0;
}

/* The torch trainer: python3 SCRIPT FD, with the other end of a fresh socketpair. */
static int python_side(const char *script, const zk_cuda_region_t *r, cudaStream_t s,
                       const zk_cuda_event_t *ed, float *pinned)
{
    int sp[2], status = 0, rc;
    zk_cuda_event_t et;
    pid_t pid;

    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp) != 0) {
        return 1;
    }
    pid = fork();
    if (pid == 0) {
        char fdarg[16];
        close(sp[0]);
        snprintf(fdarg, sizeof(fdarg), "%d", sp[1]);
        execlp("python3", "python3", script, fdarg, (char *)NULL);
        _exit(127);
    }
    close(sp[1]);
    fill_pattern(r, s, ed, pinned);
    rc = handshake(sp[0], r, ed, &et);
    if (rc == 0) {
        rc = check_region(r, s, &et, 2.0f, "torch trainer (zerod._cuda)");
        zk_cuda_event_cleanup(&et);
    }
    close(sp[0]);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("share_check: FAIL the python trainer exited with status %d\n", status);
        rc = 1;
    }
    return rc;
}

static int daemon_side(int sock, const char *script)
{
    zk_cuda_region_t r;
    zk_cuda_event_t ed, et;
    cudaStream_t s;
    size_t gran = 0;
    float *pinned;
    int rc;

    if (zk_cuda_region_create(0, N_ELEMS * sizeof(float), &r) != ZS_OK) {
        return fail("daemon: create region");
    }
    zk_cuda_region_granularity(0, &gran);
    printf("share_check: region of %zu bytes mapped as %zu (granularity %zu), fd %d\n", r.size,
           r.mapped, gran, r.fd);
    if (zk_cuda_event_create(0, &ed) != ZS_OK) {
        return fail("daemon: create event");
    }
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMallocHost((void **)&pinned, N_ELEMS * sizeof(float));
    fill_pattern(&r, s, &ed, pinned);
    rc = handshake(sock, &r, &ed, &et);
    if (rc == 0) {
        rc = check_region(&r, s, &et, 1.0f, "C trainer (zk_cuda_region_import)");
    }
    if (rc == 0) {
        rc = latency(sock, &r, s, &ed, &et);
    }
    {
        msg_t q = {.type = MSG_QUIT};
        send_msg(sock, &q, -1);
    }
    zk_cuda_event_cleanup(&et);
    if (rc == 0 && script != NULL) {
        rc = python_side(script, &r, s, &ed, pinned);
    }
    cudaFreeHost(pinned);
    zk_cuda_event_cleanup(&ed);
    zk_cuda_region_cleanup(&r);
    return rc;
}

int main(int argc, char **argv)
{
    const char *script = argc == 3 && strcmp(argv[1], "--python") == 0 ? argv[2] : NULL;
    int sp[2], status = 0, rc, ndev = 0;
    pid_t pid;

    /* the child is forked before this process touches CUDA (a CUDA context does not survive a
     * fork) */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp) != 0) {
        perror("share_check: socketpair");
        return 1;
    }
    pid = fork();
    if (pid == 0) {
        close(sp[0]);
        _exit(trainer(sp[1]));
    }
    close(sp[1]);
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        msg_t q = {.type = MSG_QUIT};
        send_msg(sp[0], &q, -1);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        printf("share_check: no CUDA device\n");
        return 3;
    }
    rc = daemon_side(sp[0], script);
    close(sp[0]);
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        printf("share_check: FAIL the C trainer exited with status %d\n", status);
        rc = 1;
    }
    printf("share_check: %s\n", rc == 0 ? "PASS" : "FAIL");
    return rc;
}
