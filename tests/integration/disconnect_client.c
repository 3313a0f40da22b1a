/*
 * A client that leaves at one point of the protocol, for disconnect_test.sh: it speaks raw
 * frames (no libzc), so it can stop where libzc never would, then either closes its socket or
 * kills itself with SIGKILL. The Attach it sends is the one zd_mesh_trainer sends (same model
 * and config, tests/integration/reference.c), so it re-attaches the test's lingering job.
 *
 *   zd_disconnect_client POINT HOW
 *   POINT: before-hello | after-hello | mid-frame | attach (sent, reply never read)
 *   HOW:   close | kill
 * Environment: ZEROD_SOCKET, RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ZEROD_JOB (as zerorun
 * sets them). Exit codes: 0 (close), killed by 9 (kill), 2 usage, 3 the daemon could not be
 * reached or did not answer Hello.
 */
#include "raw_frame.h"
#include "reference.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int usage(void)
{
    fprintf(stderr, "usage: zd_disconnect_client before-hello|after-hello|mid-frame|attach "
                    "close|kill\n");
    return 2;
}

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : def;
}

/* Length prefix + packed frame (the caller frees). */
static uint8_t *pack(const Zerod__Ipc__V1__Frame *f, size_t *len_p)
{
    uint8_t *buf = malloc(rf_frame_size(f));

    if (buf == NULL) {
        return NULL;
    }
    *len_p = rf_frame_pack(f, buf);
    return buf;
}

/* Hello and its reply (any reply: a refused uid gets an ErrorReply, which is fine here). */
static int hello(int fd)
{
    Zerod__Ipc__V1__Frame f;
    Zerod__Ipc__V1__Hello h;
    uint8_t reply[4096];
    size_t n;
    uint8_t *buf;
    int rc;

    rf_hello_init(&f, &h, 1, "disconnect-client", ZEROD__IPC__V1__ROLE__ROLE_TRAINER);
    f.seq = 1;
    buf = pack(&f, &n);
    rc = buf != NULL ? rf_send_all(fd, buf, n) : -1;
    free(buf);
    if (rc != 0 || recv(fd, reply, sizeof(reply), 0) <= 0) {
        return -1;
    }
    return 0;
}

/* The Attach zd_mesh_trainer sends for the default model, packed. */
static uint8_t *attach_frame(size_t *len_p)
{
    static th_model_t m;
    static Zerod__Ipc__V1__Group groups[TH_MAX_GROUPS];
    static Zerod__Ipc__V1__Group *pgroups[TH_MAX_GROUPS];
    static char coord[300];
    Zerod__Ipc__V1__Frame f = ZEROD__IPC__V1__FRAME__INIT;
    Zerod__Ipc__V1__Attach at = ZEROD__IPC__V1__ATTACH__INIT;
    uint32_t k = 0;

    m = th_model_by_name("mixed");
    for (uint32_t g = 0; g < m.n_groups; g++) {
        zerod__ipc__v1__group__init(&groups[g]);
        groups[g].n_numel = m.gnp[g];
        groups[g].numel = &m.numel[k];
        groups[g].options_json = (char *)(m.group_json[g] != NULL ? m.group_json[g] : "");
        pgroups[g] = &groups[g];
        k += m.gnp[g];
    }
    if (zc_coordinator_from_env(coord, sizeof(coord)) != ZC_OK) {
        snprintf(coord, sizeof(coord), "127.0.0.1:29501");
    }
    at.job_id = (char *)env_or("ZEROD_JOB", "mesh-test");
    at.rank = (uint32_t)atoi(env_or("RANK", "0"));
    at.world = (uint32_t)atoi(env_or("WORLD_SIZE", "1"));
    at.coordinator = coord;
    at.dtype = ZEROD__IPC__V1__DTYPE__DTYPE_F32;
    at.n_groups = m.n_groups;
    at.groups = pgroups;
    at.config_json = (char *)th_config_json("mixed", 2, false, 1);
    f.seq = 2;
    f.body_case = ZEROD__IPC__V1__FRAME__BODY_ATTACH;
    f.attach = &at;
    return pack(&f, len_p);
}

int main(int argc, char **argv)
{
    const char *point, *how, *path = env_or("ZEROD_SOCKET", "/run/zerod/zerod-cpu0.sock");
    struct timeval tv = {10, 0};
    uint8_t *frame = NULL;
    size_t n = 0;
    int fd;

    if (argc != 3) {
        return usage();
    }
    point = argv[1];
    how = argv[2];
    if (strcmp(how, "close") != 0 && strcmp(how, "kill") != 0) {
        return usage();
    }
    fd = rf_connect(path, 0);
    if (fd < 0) {
        fprintf(stderr, "zd_disconnect_client: cannot connect to %s: %s\n", path, strerror(errno));
        return 3;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (strcmp(point, "before-hello") == 0) {
        /* nothing sent */
    } else if (strcmp(point, "after-hello") == 0) {
        if (hello(fd) != 0) {
            fprintf(stderr, "zd_disconnect_client: no HelloReply\n");
            return 3;
        }
    } else if (strcmp(point, "mid-frame") == 0 || strcmp(point, "attach") == 0) {
        if (hello(fd) != 0) {
            fprintf(stderr, "zd_disconnect_client: no HelloReply\n");
            return 3;
        }
        frame = attach_frame(&n);
        if (frame == NULL) {
            return 3;
        }
        /* mid-frame: the length and half of the Attach; attach: all of it, reply unread */
        if (rf_send_all(fd, frame, point[0] == 'm' ? 4 + (n - 4) / 2 : n) != 0) {
            fprintf(stderr, "zd_disconnect_client: send: %s\n", strerror(errno));
            return 3;
        }
    } else {
        return usage();
    }
    printf("zd_disconnect_client: leaving at %s by %s\n", point, how);
    fflush(stdout);
    if (strcmp(how, "kill") == 0) {
        raise(SIGKILL);
    }
    close(fd);
    free(frame);
    return 0;
}
