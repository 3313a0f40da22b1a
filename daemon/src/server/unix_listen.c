#include "server/unix_listen.h"

#include "zs/log.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

zs_status_t zd_unix_clear_stale(const struct sockaddr_un *sa, const char *key)
{
    const char *path = sa->sun_path;
    struct stat st;
    int probe, rc, e;

    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) {
            return ZS_OK;
        }
        zs_error(ZS_SUB_IPC, "config key '%s': cannot check '%s': %m", key, path);
        return ZS_ERR_IO;
    }
    if (!S_ISSOCK(st.st_mode)) {
        zs_error(ZS_SUB_IPC,
                 "config key '%s': '%s' exists and is not a socket; refusing to replace it "
                 "(remove it or choose another path)",
                 key, path);
        return ZS_ERR_EXISTS;
    }
    probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
        zs_error(ZS_SUB_IPC, "socket: %m");
        return ZS_ERR_IO;
    }
    rc = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
    e = errno;
    close(probe);
    if (rc == 0) {
        zs_error(ZS_SUB_IPC,
                 "config key '%s': another zerod (or something else) is listening on %s", key,
                 path);
        return ZS_ERR_EXISTS;
    }
    if (e != ECONNREFUSED) {
        errno = e;
        zs_error(ZS_SUB_IPC, "cannot tell whether the socket %s is stale: %m; leaving it", path);
        return ZS_ERR_IO;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        zs_error(ZS_SUB_IPC, "cannot remove the stale socket %s: %m", path);
        return ZS_ERR_IO;
    }
    zs_info(ZS_SUB_IPC, "replaced a stale socket at %s (nothing listened on it)", path);
    return ZS_OK;
}

int zd_unix_bind(const struct sockaddr_un *sa, int backlog)
{
    mode_t old_mask;
    int fd, rc;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        zs_error(ZS_SUB_IPC, "socket: %m");
        return -1;
    }
    old_mask = umask(0117);
    rc = bind(fd, (const struct sockaddr *)sa, sizeof(*sa));
    umask(old_mask);
    if (rc != 0) {
        zs_error(ZS_SUB_IPC, "cannot bind %s: %m", sa->sun_path);
        close(fd);
        return -1;
    }
    if (listen(fd, backlog) != 0) {
        zs_error(ZS_SUB_IPC, "cannot listen on %s: %m", sa->sun_path);
        unlink(sa->sun_path); /* bound a moment ago: ours */
        close(fd);
        return -1;
    }
    return fd;
}

zs_status_t zd_unix_identify(const char *path, zd_unix_id_t *id)
{
    struct stat st;

    if (lstat(path, &st) != 0) {
        zs_error(ZS_SUB_IPC, "the socket %s vanished after bind: %m", path);
        return ZS_ERR_IO;
    }
    id->dev = st.st_dev;
    id->ino = st.st_ino;
    return ZS_OK;
}

void zd_unix_unlink_if_ours(const char *path, const zd_unix_id_t *id)
{
    struct stat st;

    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == id->dev &&
        st.st_ino == id->ino) {
        unlink(path);
    }
}
