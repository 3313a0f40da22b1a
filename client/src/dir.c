/*
 * Paths the daemon acts on for this process (checkpoint.c, control.c's export, control_job.c's
 * job end): made absolute against this process's working directory, and directories opened
 * here, with this process's rights, to be passed along with the request.
 */
#define _GNU_SOURCE
#include "zc_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int zc_abs_path(const char *what, const char *path, char *buf, size_t len)
{
    char cwd[PATH_MAX];
    int n;

    if (path == NULL || path[0] == '\0') {
        return zc_fail(ZC_ERR_INVALID, "%s: the path is empty", what);
    }
    if (path[0] == '/') {
        n = snprintf(buf, len, "%s", path);
    } else if (getcwd(cwd, sizeof(cwd)) == NULL) {
        return zc_fail(ZC_ERR_IO, "%s: cannot make '%s' absolute: getcwd failed", what, path);
    } else {
        n = snprintf(buf, len, "%s/%s", cwd, path);
    }
    if (n < 0 || (size_t)n >= len) {
        return zc_fail(ZC_ERR_INVALID, "%s: path '%.200s...' is longer than %zu bytes", what, path,
                       len - 1);
    }
    while (n > 1 && buf[n - 1] == '/') {
        buf[--n] = '\0';
    }
    return ZC_OK;
}

/* mkdir -p of an absolute path (mode 0777 less the umask, as DeepSpeed's os.makedirs). */
static int zc_mkdir_p(const char *what, const char *abs)
{
    char buf[4096];
    size_t n = strlen(abs);

    if (n >= sizeof(buf)) {
        return zc_fail(ZC_ERR_INVALID, "%s: path too long", what);
    }
    memcpy(buf, abs, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') {
            continue;
        }
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
            return zc_fail(errno == EACCES ? ZC_ERR_PERMISSION : ZC_ERR_IO,
                           "%s: cannot create directory %s: %s", what, buf, strerror(errno));
        }
        buf[i] = abs[i];
    }
    return ZC_OK;
}

int zc_dir_open(const char *what, const char *path, bool create, char *abs, size_t len, int *fd_p)
{
    int status = zc_abs_path(what, path, abs, len);
    int fd;

    if (status == ZC_OK && create) {
        status = zc_mkdir_p(what, abs);
    }
    if (status != ZC_OK) {
        return status;
    }
    fd = open(abs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return zc_fail(errno == ENOENT   ? ZC_ERR_NOT_FOUND
                       : errno == EACCES ? ZC_ERR_PERMISSION
                                         : ZC_ERR_IO,
                       "%s: cannot open directory %s: %s", what, abs, strerror(errno));
    }
    *fd_p = fd;
    return ZC_OK;
}
