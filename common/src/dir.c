/*
 * Files and directories used on someone else's behalf, relative to directory descriptors
 * (zs/dir.h: the rules; docs/checkpoints.md: the trust model).
 */
#define _GNU_SOURCE
#include "zs/dir.h"
#include "zs/error.h"
#include "zs/time.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/xattr.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* ---- credentials ------------------------------------------------------------------------ */

zs_status_t zs_cred_of_peer(int sock, zs_cred_t *cred, char *err, size_t errlen)
{
    struct ucred uc;
    socklen_t len = sizeof(uc);
    gid_t groups[ZS_CRED_MAX_GROUPS];
    socklen_t glen = sizeof(groups);

    memset(cred, 0, sizeof(*cred));
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION, "SO_PEERCRED: %s", strerror(errno));
    }
    cred->uid = (uint32_t)uc.uid;
    cred->gid = (uint32_t)uc.gid;
    /* more groups than kept (ERANGE, nothing filled in) or no SO_PEERGROUPS: only the primary
     * group counts (fewer rights, never more) */
    if (getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0) {
        size_t n = glen / sizeof(gid_t);
        cred->n_groups = (uint32_t)(n > ZS_CRED_MAX_GROUPS ? ZS_CRED_MAX_GROUPS : n);
        for (uint32_t i = 0; i < cred->n_groups; i++) {
            cred->groups[i] = (uint32_t)groups[i];
        }
    }
    return ZS_OK;
}

void zs_cred_of_self(zs_cred_t *cred)
{
    gid_t groups[ZS_CRED_MAX_GROUPS];
    int n = getgroups(ZS_CRED_MAX_GROUPS, groups);

    memset(cred, 0, sizeof(*cred));
    cred->uid = (uint32_t)geteuid();
    cred->gid = (uint32_t)getegid();
    for (int i = 0; i < n; i++) {
        cred->groups[cred->n_groups++] = (uint32_t)groups[i];
    }
}

static bool zs_cred_in_group(const zs_cred_t *cred, uint32_t gid)
{
    if (cred->gid == gid) {
        return true;
    }
    for (uint32_t i = 0; i < cred->n_groups; i++) {
        if (cred->groups[i] == gid) {
            return true;
        }
    }
    return false;
}

bool zs_cred_may(const zs_cred_t *cred, const struct stat *sb, int want)
{
    unsigned bits;

    if (cred->uid == 0) {
        return true;
    }
    if ((uint32_t)sb->st_uid == cred->uid) {
        bits = (sb->st_mode >> 6) & 7u;
    } else if (zs_cred_in_group(cred, (uint32_t)sb->st_gid)) {
        bits = (sb->st_mode >> 3) & 7u;
    } else {
        bits = sb->st_mode & 7u;
    }
    return (bits & (unsigned)want) == (unsigned)want;
}

zs_status_t zs_cancel_check(const zs_cancel_t *c, const char *what, char *err, size_t errlen)
{
    if (c == NULL) {
        return ZS_OK;
    }
    if (c->flag != NULL && atomic_load(c->flag)) {
        return zs_errf(err, errlen, ZS_ERR_ABORTED, "%s: stopped, the daemon is shutting down",
                       what);
    }
    if (c->deadline_ns != 0 && zs_time_now_ns() >= c->deadline_ns) {
        return zs_errf(err, errlen, ZS_ERR_TIMEOUT, "%s: the request's deadline passed", what);
    }
    return ZS_OK;
}

/* ---- checks ----------------------------------------------------------------------------- */

static const char *zs_dir_want_text(int want)
{
    switch (want) {
    case ZS_MAY_READ:
        return "read";
    case ZS_MAY_WRITE:
        return "write";
    case ZS_MAY_EXEC:
        return "search";
    case ZS_MAY_READ | ZS_MAY_EXEC:
        return "read and search";
    case ZS_MAY_WRITE | ZS_MAY_EXEC:
        return "write into";
    default:
        return "read, search and write into";
    }
}

static zs_status_t zs_dir_errno(int e, char *err, size_t errlen, const char *what,
                                const char *shown, const char *name)
{
    zs_status_t st = e == ENOENT                     ? ZS_ERR_NOT_FOUND
                     : e == EEXIST || e == ENOTEMPTY ? ZS_ERR_EXISTS
                     : e == EACCES || e == EPERM     ? ZS_ERR_PERMISSION
                                                     : ZS_ERR_IO;
    const char *why =
        e == ELOOP ? "it is a symbolic link, which zerod never follows there" : strerror(e);

    return zs_errf(err, errlen, st, "%s %s%s%s: %s", what, shown, name[0] != '\0' ? "/" : "", name,
                   why);
}

/* cred may use the object of fd (whose stat is sb) with `want`: mode bits, and no ACL unless
 * cred owns it. */
static zs_status_t zs_dir_check(int fd, const struct stat *sb, const zs_cred_t *cred, int want,
                                const char *shown, char *err, size_t errlen)
{
    if (cred == NULL || cred->uid == 0) {
        return ZS_OK;
    }
    if (!zs_cred_may(cred, sb, want)) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                       "%s: uid %u may not %s it (owner uid %u, group %u, mode %04o); zerod "
                       "acts there only with the rights of the user who asks",
                       shown, cred->uid, zs_dir_want_text(want), (unsigned)sb->st_uid,
                       (unsigned)sb->st_gid, (unsigned)(sb->st_mode & 07777));
    }
    if ((uint32_t)sb->st_uid != cred->uid &&
        (fgetxattr(fd, "system.posix_acl_access", NULL, 0) >= 0)) {
        return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                       "%s carries a POSIX ACL: zerod uses such a directory or file only for "
                       "its owner (uid %u), not uid %u",
                       shown, (unsigned)sb->st_uid, cred->uid);
    }
    return ZS_OK;
}

/* d is still a directory cred may `want` on (every operation checks it again). */
static zs_status_t zs_dir_require(const zs_dir_t *d, int want, char *err, size_t errlen)
{
    struct stat sb;

    if (d->fd < 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "%s: not open", d->shown);
    }
    if (fstat(d->fd, &sb) != 0) {
        return zs_dir_errno(errno, err, errlen, "cannot stat", d->shown, "");
    }
    return zs_dir_check(d->fd, &sb, d->cred, want, d->shown, err, errlen);
}

/* A plain entry name: not empty, not "." or "..", no '/'. */
static zs_status_t zs_dir_name_check(const zs_dir_t *d, const char *name, char *err, size_t errlen)
{
    if (name == NULL || name[0] == '\0' || strchr(name, '/') != NULL || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0 || strlen(name) > 255) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "%s: '%.200s' is not a plain file name",
                       d->shown, name != NULL ? name : "");
    }
    return ZS_OK;
}

static void zs_dir_shown_join(char *out, const char *shown, const char *name)
{
    int n = snprintf(out, ZS_DIR_SHOWN_MAX, "%s/%s", shown, name);

    if (n < 0 || (size_t)n >= ZS_DIR_SHOWN_MAX) {
        out[ZS_DIR_SHOWN_MAX - 1] = '\0';
    }
}

/* Hand what was just created (fd) to cred: see zs/dir.h. */
static zs_status_t zs_dir_hand(int fd, const zs_cred_t *cred, bool is_dir, const char *shown,
                               char *err, size_t errlen)
{
    mode_t own = is_dir ? 0750 : 0640, shared = is_dir ? 0770 : 0660;
    gid_t egid = getegid();

    if (cred == NULL || (uint32_t)geteuid() == cred->uid) {
        return fchmod(fd, own) == 0 ? ZS_OK
                                    : zs_dir_errno(errno, err, errlen, "chmod of", shown, "");
    }
    if (fchown(fd, (uid_t)cred->uid, (gid_t)cred->gid) == 0) {
        return fchmod(fd, own) == 0 ? ZS_OK
                                    : zs_dir_errno(errno, err, errlen, "chmod of", shown, "");
    }
    /* not root: a group the client is in, group-writable */
    if (fchown(fd, (uid_t)-1, (gid_t)cred->gid) == 0 ||
        (zs_cred_in_group(cred, (uint32_t)egid) && fchown(fd, (uid_t)-1, egid) == 0)) {
        return fchmod(fd, shared) == 0 ? ZS_OK
                                       : zs_dir_errno(errno, err, errlen, "chmod of", shown, "");
    }
    return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                   "%s: this daemon (uid %u) cannot hand what it creates to uid %u: neither "
                   "its uid nor a group both share; run the daemon as root, as that user, or "
                   "with a group that user is in",
                   shown, (unsigned)geteuid(), cred->uid);
}

/* ---- opening ---------------------------------------------------------------------------- */

zs_status_t zs_dir_adopt(zs_dir_t *d, int fd, const char *shown, const zs_cred_t *cred, int want,
                         char *err, size_t errlen)
{
    struct stat sb;
    zs_status_t st;

    d->fd = fd;
    d->cred = cred;
    snprintf(d->shown, sizeof(d->shown), "%s", shown != NULL ? shown : "?");
    if (fd < 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "%s: no directory descriptor came with it",
                       d->shown);
    }
    if (fstat(fd, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = zs_errf(err, errlen, ZS_ERR_INVALID, "%s is not a directory", d->shown);
    } else {
        st = zs_dir_check(fd, &sb, cred, want, d->shown, err, errlen);
    }
    if (st != ZS_OK) {
        zs_dir_close(d);
    }
    return st;
}

zs_status_t zs_dir_open(zs_dir_t *d, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    *d = (zs_dir_t)ZS_DIR_INIT;
    snprintf(d->shown, sizeof(d->shown), "%s", path);
    if (fd < 0) {
        return zs_dir_errno(errno, err, errlen, "cannot open directory", path, "");
    }
    d->fd = fd;
    return ZS_OK;
}

void zs_dir_close(zs_dir_t *d)
{
    if (d != NULL && d->fd >= 0) {
        close(d->fd);
        d->fd = -1;
    }
}

zs_status_t zs_dir_dup(const zs_dir_t *d, zs_dir_t *out, char *err, size_t errlen)
{
    int fd = fcntl(d->fd, F_DUPFD_CLOEXEC, 0);

    if (fd < 0) {
        return zs_dir_errno(errno, err, errlen, "cannot duplicate the descriptor of", d->shown, "");
    }
    *out = *d;
    out->fd = fd;
    return ZS_OK;
}

zs_status_t zs_dir_sub(const zs_dir_t *d, const char *name, int want, zs_dir_t *sub, char *err,
                       size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX];
    zs_status_t st = zs_dir_name_check(d, name, err, errlen);
    int fd;

    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_EXEC, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    fd = openat(d->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return zs_dir_errno(errno == ENOTDIR ? ENOTDIR : errno, err, errlen, "cannot open",
                            d->shown, name);
    }
    zs_dir_shown_join(shown, d->shown, name);
    return zs_dir_adopt(sub, fd, shown, d->cred, want, err, errlen);
}

zs_status_t zs_dir_mkdir(const zs_dir_t *d, const char *name, zs_dir_t *sub, char *err,
                         size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX];
    struct stat sb;
    zs_status_t st = zs_dir_name_check(d, name, err, errlen);
    int fd;

    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    if (mkdirat(d->fd, name, 0700) != 0) {
        return zs_dir_errno(errno, err, errlen, "cannot create", d->shown, name);
    }
    zs_dir_shown_join(shown, d->shown, name);
    fd = openat(d->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return zs_dir_errno(errno, err, errlen, "cannot open", d->shown, name);
    }
    /* what we open must be what we made (this process's), not one swapped in meanwhile */
    if (fstat(fd, &sb) != 0 || sb.st_uid != geteuid()) {
        close(fd);
        return zs_errf(err, errlen, ZS_ERR_IO, "%s changed while it was being created", shown);
    }
    st = zs_dir_hand(fd, d->cred, true, shown, err, errlen);
    if (st != ZS_OK) {
        close(fd);
        (void)unlinkat(d->fd, name, AT_REMOVEDIR);
        return st;
    }
    *sub = (zs_dir_t){.fd = fd, .cred = d->cred};
    memcpy(sub->shown, shown, sizeof(shown));
    return ZS_OK;
}

zs_status_t zs_dir_create(const zs_dir_t *d, const char *name, int *fd_p, char *err, size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX];
    zs_status_t st = zs_dir_name_check(d, name, err, errlen);
    int fd;

    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        return zs_dir_errno(errno, err, errlen, "cannot create", d->shown, name);
    }
    zs_dir_shown_join(shown, d->shown, name);
    st = zs_dir_hand(fd, d->cred, false, shown, err, errlen);
    if (st != ZS_OK) {
        close(fd);
        (void)unlinkat(d->fd, name, 0);
        return st;
    }
    *fd_p = fd;
    return ZS_OK;
}

zs_status_t zs_dir_write_file(const zs_dir_t *d, const char *name, const void *data, size_t len,
                              uint64_t *xxh3_p, char *err, size_t errlen)
{
    const char *p = data;
    size_t left = len;
    int fd = -1;
    zs_status_t st = zs_dir_create(d, name, &fd, err, errlen);

    while (st == ZS_OK && left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            st = zs_dir_errno(n < 0 ? errno : EIO, err, errlen, "writing", d->shown, name);
            break;
        }
        p += n;
        left -= (size_t)n;
    }
    if (st == ZS_OK && fsync(fd) != 0) {
        st = zs_dir_errno(errno, err, errlen, "fsync of", d->shown, name);
    }
    if (fd >= 0 && close(fd) != 0 && st == ZS_OK) {
        st = zs_dir_errno(errno, err, errlen, "closing", d->shown, name);
    }
    if (xxh3_p != NULL) {
        *xxh3_p = XXH3_64bits(data, len);
    }
    return st;
}

zs_status_t zs_dir_open_file(const zs_dir_t *d, const char *name, uint64_t max, bool exact,
                             int *fd_p, uint64_t *size_p, char *err, size_t errlen)
{
    char shown[ZS_DIR_SHOWN_MAX];
    struct stat sb;
    zs_status_t st = zs_dir_name_check(d, name, err, errlen);
    int fd;

    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_EXEC, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    /* O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below) */
    fd = openat(d->fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        return zs_dir_errno(errno, err, errlen, "cannot open", d->shown, name);
    }
    zs_dir_shown_join(shown, d->shown, name);
    if (fstat(fd, &sb) != 0) {
        st = zs_dir_errno(errno, err, errlen, "cannot stat", d->shown, name);
    } else if (!S_ISREG(sb.st_mode)) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "%s is not a regular file (%s): refused", shown,
                     S_ISDIR(sb.st_mode)                          ? "a directory"
                     : S_ISFIFO(sb.st_mode)                       ? "a FIFO"
                     : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                     : S_ISSOCK(sb.st_mode)                       ? "a socket"
                                                                  : "not a file");
    } else if (exact && (uint64_t)sb.st_size != max) {
        st = zs_errf(err, errlen, ZS_ERR_IO,
                     "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (truncated or replaced)",
                     shown, (uint64_t)sb.st_size, max);
    } else if (!exact && (uint64_t)sb.st_size > max) {
        st = zs_errf(err, errlen, ZS_ERR_IO,
                     "%s: %" PRIu64 " bytes, more than the %" PRIu64 " it may hold", shown,
                     (uint64_t)sb.st_size, max);
    } else {
        st = zs_dir_check(fd, &sb, d->cred, ZS_MAY_READ, shown, err, errlen);
    }
    if (st == ZS_OK && fcntl(fd, F_SETFL, 0) != 0) {
        st = zs_dir_errno(errno, err, errlen, "cannot use", d->shown, name);
    }
    if (st != ZS_OK) {
        close(fd);
        return st;
    }
    *fd_p = fd;
    *size_p = (uint64_t)sb.st_size;
    return ZS_OK;
}

zs_status_t zs_dir_read_file(const zs_dir_t *d, const char *name, size_t max, char **buf_p,
                             size_t *len_p, char *err, size_t errlen)
{
    uint64_t size = 0, got = 0;
    int fd = -1;
    char *buf;
    zs_status_t st = zs_dir_open_file(d, name, max, false, &fd, &size, err, errlen);

    if (st != ZS_OK) {
        return st;
    }
    buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        close(fd);
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory reading %s/%s", d->shown,
                       name);
    }
    while (got < size) {
        ssize_t n = pread(fd, buf + got, (size_t)(size - got), (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            st = zs_dir_errno(n < 0 ? errno : EIO, err, errlen, "reading", d->shown, name);
            break;
        }
        got += (uint64_t)n;
    }
    close(fd);
    if (st != ZS_OK) {
        free(buf);
        return st;
    }
    buf[size] = '\0';
    *buf_p = buf;
    *len_p = (size_t)size;
    return ZS_OK;
}

bool zs_dir_has(const zs_dir_t *d, const char *name, struct stat *sb_p)
{
    struct stat sb;

    if (fstatat(d->fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        return false;
    }
    if (sb_p != NULL) {
        *sb_p = sb;
    }
    return true;
}

/* ---- changing entries ------------------------------------------------------------------- */

zs_status_t zs_dir_may_replace(const zs_dir_t *d, const char *name, char *err, size_t errlen)
{
    struct stat sb;
    const zs_cred_t *c = d->cred;

    if (c == NULL || c->uid == 0 || !zs_dir_has(d, name, &sb)) {
        return ZS_OK;
    }
    if ((uint32_t)sb.st_uid == c->uid ||
        (sb.st_uid == geteuid() && zs_cred_in_group(c, (uint32_t)sb.st_gid) &&
         (sb.st_mode & 020) != 0)) {
        return ZS_OK;
    }
    return zs_errf(err, errlen, ZS_ERR_PERMISSION,
                   "%s/%s belongs to uid %u: zerod replaces or removes only what belongs to the "
                   "user who asks (uid %u)",
                   d->shown, name, (unsigned)sb.st_uid, c->uid);
}

zs_status_t zs_dir_rename(const zs_dir_t *d, const char *from, const char *to, unsigned flags,
                          char *err, size_t errlen)
{
    zs_status_t st = zs_dir_name_check(d, from, err, errlen);

    if (st == ZS_OK) {
        st = zs_dir_name_check(d, to, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_may_replace(d, from, err, errlen);
    }
    if (st == ZS_OK && !(flags & RENAME_NOREPLACE)) {
        st = zs_dir_may_replace(d, to, err, errlen);
    }
    if (st != ZS_OK) {
        return st;
    }
    if (renameat2(d->fd, from, d->fd, to, flags) != 0) {
        int e = errno;
        return zs_errf(err, errlen,
                       e == EEXIST || e == ENOTEMPTY ? ZS_ERR_EXISTS
                       : e == EINVAL                 ? ZS_ERR_UNSUPPORTED
                                                     : ZS_ERR_IO,
                       "renaming %s/%s to %s: %s", d->shown, from, to, strerror(e));
    }
    return ZS_OK;
}

zs_status_t zs_dir_unlink(const zs_dir_t *d, const char *name, char *err, size_t errlen)
{
    zs_status_t st = zs_dir_name_check(d, name, err, errlen);

    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_may_replace(d, name, err, errlen);
    }
    if (st == ZS_OK && unlinkat(d->fd, name, 0) != 0 && errno != ENOENT) {
        st = zs_dir_errno(errno, err, errlen, "cannot remove", d->shown, name);
    }
    return st;
}

zs_status_t zs_dir_fsync(const zs_dir_t *d, char *err, size_t errlen)
{
    if (fsync(d->fd) != 0) {
        return zs_dir_errno(errno, err, errlen, "fsync of directory", d->shown, "");
    }
    return ZS_OK;
}

/* Every entry of sub: a regular file ok() accepts (check), or remove them all (!check). */
static zs_status_t zs_dir_flat_pass(const zs_dir_t *sub, bool (*ok)(const char *), bool check,
                                    char *err, size_t errlen)
{
    int fd = fcntl(sub->fd, F_DUPFD_CLOEXEC, 0);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    zs_status_t st = ZS_OK;

    if (dp == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return zs_dir_errno(errno, err, errlen, "cannot list", sub->shown, "");
    }
    rewinddir(dp);
    while (st == ZS_OK && (e = readdir(dp)) != NULL) {
        struct stat sb;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        if (check) {
            if (fstatat(sub->fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(sb.st_mode) || !ok(e->d_name)) {
                st = zs_errf(err, errlen, ZS_ERR_EXISTS,
                             "%s/%s is not a file zerod writes there: %s was not removed",
                             sub->shown, e->d_name, sub->shown);
            }
        } else if (unlinkat(sub->fd, e->d_name, 0) != 0 && errno != ENOENT) {
            st = zs_dir_errno(errno, err, errlen, "cannot remove", sub->shown, e->d_name);
        }
    }
    closedir(dp);
    return st;
}

zs_status_t zs_dir_remove_flat(const zs_dir_t *d, const char *name, bool (*ok)(const char *entry),
                               char *err, size_t errlen)
{
    zs_dir_t sub = ZS_DIR_INIT;
    zs_status_t st;

    if (!zs_dir_has(d, name, NULL)) {
        return ZS_OK;
    }
    st = zs_dir_may_replace(d, name, err, errlen);
    if (st == ZS_OK) {
        st = zs_dir_require(d, ZS_MAY_WRITE | ZS_MAY_EXEC, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_sub(d, name, ZS_MAY_READ | ZS_MAY_WRITE | ZS_MAY_EXEC, &sub, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_flat_pass(&sub, ok, true, err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_dir_flat_pass(&sub, ok, false, err, errlen);
    }
    zs_dir_close(&sub);
    if (st == ZS_OK && unlinkat(d->fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        st = zs_dir_errno(errno, err, errlen, "cannot remove", d->shown, name);
    }
    return st;
}
