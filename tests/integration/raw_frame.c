/* Raw frames for the test clients: see raw_frame.h. */
#include "raw_frame.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

void rf_put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

uint32_t rf_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void rf_hello_init(Zerod__Ipc__V1__Frame *f, Zerod__Ipc__V1__Hello *h, uint32_t protocol,
                   const char *version, Zerod__Ipc__V1__Role role)
{
    zerod__ipc__v1__frame__init(f);
    zerod__ipc__v1__hello__init(h);
    h->protocol = protocol;
    if (version != NULL) {
        h->version = (char *)version;
    }
    h->role = role;
    f->body_case = ZEROD__IPC__V1__FRAME__BODY_HELLO;
    f->hello = h;
}

size_t rf_frame_size(const Zerod__Ipc__V1__Frame *f)
{
    return zerod__ipc__v1__frame__get_packed_size(f) + 4;
}

size_t rf_frame_pack(const Zerod__Ipc__V1__Frame *f, uint8_t *out)
{
    size_t n = zerod__ipc__v1__frame__get_packed_size(f);

    rf_put_le32(out, (uint32_t)n);
    zerod__ipc__v1__frame__pack(f, out + 4);
    return n + 4;
}

int rf_send_all(int fd, const void *data, size_t n)
{
    const uint8_t *p = data;

    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            if (w == 0) {
                errno = 0;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int rf_connect(const char *path, int flags)
{
    struct sockaddr_un sa;
    int fd;

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
    if (fd < 0) {
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}
