/*
 * zs_dir: files and directories used on someone else's behalf, race-free (docs/checkpoints.md
 * "Who may name which paths").
 *
 * A daemon that runs as root (or as its own user) and writes where a client names would act
 * with its own rights, not the client's: a path the client swaps for a symbolic link between a
 * check and a use, or a directory the client may read but not write, would let the client touch
 * files it could not touch itself. So a client opens the directory itself, with its own rights,
 * and hands the descriptor over; from there every operation is relative to a descriptor
 * (openat, mkdirat, renameat2, unlinkat), never follows a symbolic link (O_NOFOLLOW), and
 * checks the object it got (fstat on the descriptor: type, owner, mode) against the client's
 * credentials (SO_PEERCRED and SO_PEERGROUPS), as the kernel would on a path lookup made by
 * the client:
 *  - a directory is used only with the search, read and write bits the client's uid, gid or
 *    groups are given by its owner, group and mode (root may do anything);
 *  - a directory that carries a POSIX ACL is used only for its owner (the mode bits do not say
 *    everything there);
 *  - an entry of a directory is replaced or removed only when the client owns it (stricter
 *    than the kernel, which allows it in any directory the client may write, unless sticky);
 *  - a file is read only when it is a regular file (not a FIFO, a device, a directory or a
 *    link) that the client may read, and never past the size the caller expects;
 *  - what is created for the client is handed to it: its uid and gid with mode 0640 (files)
 *    or 0750 (directories) where this process may chown (root); otherwise this process's uid
 *    with a group the client is in, group-writable (0660, 0770), so that the client may read,
 *    replace and remove it; a process that can do neither refuses to create anything;
 *  - an entry this process owns counts as the client's when the client may write it through
 *    its group bits (it was handed over that way).
 * With cred == NULL a zs_dir_t acts with this process's own rights (the daemon's own
 * checkpoint_dir, zeroctl on the user's files): no emulated checks, the kernel's only, and
 * still no symbolic link followed below the first directory.
 */
#ifndef ZS_DIR_H
#define ZS_DIR_H

#include "zs/status.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_CRED_MAX_GROUPS 64u
#define ZS_DIR_SHOWN_MAX   4096u

/* Whose rights a zs_dir_t uses. */
typedef struct zs_cred {
    uint32_t uid, gid;
    uint32_t n_groups; /* supplementary groups; at most ZS_CRED_MAX_GROUPS are kept */
    uint32_t groups[ZS_CRED_MAX_GROUPS];
} zs_cred_t;

/* The credentials of the peer of a connected unix socket (SO_PEERCRED, SO_PEERGROUPS). */
zs_status_t zs_cred_of_peer(int sock, zs_cred_t *cred, char *err, size_t errlen);
/* This process's credentials (effective uid and gid, supplementary groups). */
void zs_cred_of_self(zs_cred_t *cred);

#define ZS_MAY_READ  4
#define ZS_MAY_WRITE 2
#define ZS_MAY_EXEC  1 /* search, for a directory */
/* Would the kernel grant cred the `want` bits on sb by its owner, group and mode? */
bool zs_cred_may(const zs_cred_t *cred, const struct stat *sb, int want);

/* Stops long reads (hashing, verifying) early: a flag set when the process shuts down, and a
 * deadline (CLOCK_MONOTONIC ns; 0: none). Either field may be unset. */
typedef struct zs_cancel {
    const atomic_bool *flag;
    uint64_t deadline_ns;
} zs_cancel_t;
/* ZS_OK, or ZS_ERR_ABORTED / ZS_ERR_TIMEOUT with a message naming `what`. */
zs_status_t zs_cancel_check(const zs_cancel_t *c, const char *what, char *err, size_t errlen);

typedef struct zs_dir {
    int fd;                       /* an open directory; -1: none */
    const zs_cred_t *cred;        /* whose rights; NULL: this process's own */
    char shown[ZS_DIR_SHOWN_MAX]; /* the path for messages: never looked up */
} zs_dir_t;

#define ZS_DIR_INIT                                                                                \
    {                                                                                              \
        -1, NULL, ""                                                                               \
    }

/* Take fd (a directory the client opened and passed; closed by zs_dir_close, also on error)
 * for `cred`, who must be granted `want` on it. */
zs_status_t zs_dir_adopt(zs_dir_t *d, int fd, const char *shown, const zs_cred_t *cred, int want,
                         char *err, size_t errlen);
/* Open path with this process's own rights (cred NULL). */
zs_status_t zs_dir_open(zs_dir_t *d, const char *path, char *err, size_t errlen);
void zs_dir_close(zs_dir_t *d);
/* A second descriptor of the same directory, same cred. */
zs_status_t zs_dir_dup(const zs_dir_t *d, zs_dir_t *out, char *err, size_t errlen);

/* The subdirectory `name` of d (no link followed), which cred may `want` on. ZS_ERR_NOT_FOUND
 * when there is none. */
zs_status_t zs_dir_sub(const zs_dir_t *d, const char *name, int want, zs_dir_t *sub, char *err,
                       size_t errlen);
/* Create the subdirectory `name` (it must not exist) for cred and open it. */
zs_status_t zs_dir_mkdir(const zs_dir_t *d, const char *name, zs_dir_t *sub, char *err,
                         size_t errlen);
/* Create the file `name` (it must not exist) for cred, open for writing: *fd_p. */
zs_status_t zs_dir_create(const zs_dir_t *d, const char *name, int *fd_p, char *err, size_t errlen);
/* Create `name` holding `len` bytes, fsync'd (XXH3-64 out when xxh3_p). */
zs_status_t zs_dir_write_file(const zs_dir_t *d, const char *name, const void *data, size_t len,
                              uint64_t *xxh3_p, char *err, size_t errlen);
/* Open the regular file `name` for reading: *fd_p, its size *size_p. max: the largest size
 * accepted; exact: the size must be max. ZS_ERR_NOT_FOUND when there is none; ZS_ERR_IO
 * naming the file for a link, a FIFO, a device, a directory or a wrong size. */
zs_status_t zs_dir_open_file(const zs_dir_t *d, const char *name, uint64_t max, bool exact,
                             int *fd_p, uint64_t *size_p, char *err, size_t errlen);
/* The whole regular file `name`, at most max bytes, NUL-terminated (free() it). */
zs_status_t zs_dir_read_file(const zs_dir_t *d, const char *name, size_t max, char **buf_p,
                             size_t *len_p, char *err, size_t errlen);
/* Does the entry `name` exist (no link followed)? *sb_p filled when it does (may be NULL). */
bool zs_dir_has(const zs_dir_t *d, const char *name, struct stat *sb_p);
/* May cred replace or remove the entry `name`? It must be cred's own (with cred NULL: any). */
zs_status_t zs_dir_may_replace(const zs_dir_t *d, const char *name, char *err, size_t errlen);
/* renameat2 within d (flags: 0, RENAME_NOREPLACE, RENAME_EXCHANGE); the entry at `to`, when
 * flags allow replacing it, must be cred's own. */
zs_status_t zs_dir_rename(const zs_dir_t *d, const char *from, const char *to, unsigned flags,
                          char *err, size_t errlen);
/* Remove the file `name` (cred's own). Absent is fine. */
zs_status_t zs_dir_unlink(const zs_dir_t *d, const char *name, char *err, size_t errlen);
/* fsync the directory (after a create or a rename in it). */
zs_status_t zs_dir_fsync(const zs_dir_t *d, char *err, size_t errlen);

/* Remove the subdirectory `name`, cred's own, when every entry in it is a regular file whose
 * name `ok(name)` accepts (nothing else is ever removed). Absent is fine. */
zs_status_t zs_dir_remove_flat(const zs_dir_t *d, const char *name, bool (*ok)(const char *entry),
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
