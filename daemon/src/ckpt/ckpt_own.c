/*
 * The daemons' own checkpoints (docs/checkpoints.md "Checkpoints the daemons take themselves"):
 * checkpoint_dir/<job id>. When to save and whether to resume are the job's to decide (job/);
 * here are the directory and which checkpoint a resume loads, agreed by every rank. A `latest`
 * that cannot be used never means a fresh start: the newest checkpoint that verifies is loaded
 * instead, with a warning, or the resume fails naming the file. The directory is the daemon's
 * own: it is used with the daemon's rights.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

zs_status_t zd_ckpt_own_dir(const char *ckpt_dir, const char *job_id, bool make, char *path,
                            size_t len, char *err, size_t errlen)
{
    if (!zs_ckpt_pathf(path, len, "%s/%s", ckpt_dir, job_id) || strlen(path) > ZD_CKPT_DIR_MAX ||
        zs_ckpt_tag_check(job_id, err, errlen) != ZS_OK) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "job id '%s' cannot name a directory under checkpoint_dir %s", job_id,
                       ckpt_dir);
    }
    if (make && (mkdir(ckpt_dir, 0750) != 0 && errno != EEXIST)) {
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint_dir %s: %s", ckpt_dir, strerror(errno));
    }
    if (make && (mkdir(path, 0750) != 0 && errno != EEXIST)) {
        return zs_errf(err, errlen, ZS_ERR_IO, "checkpoint dir %s: %s", path, strerror(errno));
    }
    return ZS_OK;
}

/* ---- one rank's choice ------------------------------------------------------------------- */

/* The checkpoint d/tag, when its manifest verifies and it is this job's: its step. */
static zs_status_t zd_ckpt_own_manifest(const zd_ckpt_shard_t *sh, const zs_dir_t *d,
                                        const char *tag, bool full, const zs_cancel_t *cancel,
                                        uint64_t *step_p, char *err, size_t errlen)
{
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t ckpt = ZS_DIR_INIT;
    zs_status_t st = zs_dir_sub(d, tag, ZS_MAY_READ | ZS_MAY_EXEC, &ckpt, err, errlen);

    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(&ckpt, &m, err, errlen);
    }
    if (st == ZS_OK && strcmp(m->job_id, sh->job_id) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_IO, "%s is job '%s''s, not '%s''s", ckpt.shown, m->job_id,
                     sh->job_id);
    }
    if (st == ZS_OK && full) { /* as `zeroctl checkpoint verify`: every file it lists */
        st = zs_ckpt_verify(&ckpt, m, cancel, err, errlen);
    }
    if (st == ZS_OK) {
        *step_p = m->step;
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    return st;
}

/* The checkpoint d/latest names (res->tag, res->step), or why it cannot be used (reason, which
 * names the file; *missing_p: there is no latest). Its files are verified by the load. */
static zs_status_t zd_ckpt_own_latest(const zd_ckpt_shard_t *sh, const zs_dir_t *d,
                                      zd_ckpt_resume_t *res, bool *missing_p, char *reason,
                                      size_t rlen)
{
    char why[ZS_MSG_MAX] = "";
    struct stat sb;
    zs_status_t st = zs_ckpt_resolve(d, NULL, res->tag, sizeof(res->tag), why, sizeof(why));

    *missing_p = st == ZS_ERR_NOT_FOUND;
    if (*missing_p) {
        res->tag[0] = '\0';
        return zs_errf(reason, rlen, st, "%s/%s does not exist", d->shown, ZS_CKPT_LATEST);
    }
    if (st != ZS_OK) {
        res->tag[0] = '\0';
        return zs_errf(reason, rlen, st, "%s/%s: %s", d->shown, ZS_CKPT_LATEST, why);
    }
    if (fstatat(d->fd, res->tag, &sb, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        return zs_errf(reason, rlen, ZS_ERR_NOT_FOUND, "%s/%s names '%s', which is not there",
                       d->shown, ZS_CKPT_LATEST, res->tag);
    }
    st = zd_ckpt_own_manifest(sh, d, res->tag, false, NULL, &res->step, why, sizeof(why));
    if (st != ZS_OK) {
        return zs_errf(reason, rlen, st, "%s/%s names '%s': %s", d->shown, ZS_CKPT_LATEST, res->tag,
                       why);
    }
    return ZS_OK;
}

/* The name of a directory in d that is not a hidden one (a checkpoint that did not verify), or
 * false when there is none. */
static bool zd_ckpt_own_other(const zs_dir_t *d, char *name, size_t len)
{
    int fd = fcntl(d->fd, F_DUPFD_CLOEXEC, 0);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    struct stat sb;
    bool found = false;

    if (dp == NULL) {
        if (fd >= 0) {
            close(fd);
        }
        return false;
    }
    rewinddir(dp); /* a duplicate shares the offset of every other reading of d */
    while (!found && (e = readdir(dp)) != NULL) {
        found = e->d_name[0] != '.' && fstatat(d->fd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISDIR(sb.st_mode);
        if (found) {
            zs_ckpt_pathf(name, len, "%s", e->d_name);
        }
    }
    closedir(dp);
    return found;
}

static int zd_ckpt_entry_newer(const void *a, const void *b)
{
    const zd_ckpt_entry_t *x = a, *y = b;

    if (x->step != y->step) {
        return x->step > y->step ? -1 : 1;
    }
    return strcmp(x->tag, y->tag); /* every rank lists the same directory in its own order */
}

/* The newest checkpoint of this job in d, other than `skip`, that verifies in full (res), with
 * a warning that gives `reason`; none: a fresh start when there is no latest and no checkpoint
 * at all (missing), else an error that gives reason and what was tried. */
static zs_status_t zd_ckpt_own_fallback(const zd_ckpt_shard_t *sh, const zs_dir_t *d,
                                        const char *skip, const char *reason, bool missing,
                                        const zs_cancel_t *cancel, zd_ckpt_resume_t *res, char *err,
                                        size_t errlen)
{
    char newest[ZS_MSG_MAX] = "", why[ZS_MSG_MAX] = "", other[256];
    size_t n = 0, tried = 0;
    zd_ckpt_entry_t *ents = zd_ckpt_list_job(d, sh->job_id, &n);
    zs_status_t st = ZS_ERR_NOT_FOUND;

    if (ents != NULL) {
        qsort(ents, n, sizeof(*ents), zd_ckpt_entry_newer);
    }
    for (size_t i = 0; i < n && st != ZS_OK; i++) {
        if (skip != NULL && strcmp(ents[i].tag, skip) == 0) {
            continue;
        }
        st = zd_ckpt_own_manifest(sh, d, ents[i].tag, true, cancel, &res->step, why, sizeof(why));
        if (st == ZS_ERR_ABORTED || st == ZS_ERR_TIMEOUT) { /* the daemon is stopping */
            free(ents);
            return zs_errf(err, errlen, st, "%s", why);
        }
        if (st == ZS_OK) {
            zs_ckpt_pathf(res->tag, sizeof(res->tag), "%s", ents[i].tag);
        } else if (tried++ == 0) {
            zs_ckpt_pathf(newest, sizeof(newest), "%s", why);
        }
    }
    free(ents);
    if (st == ZS_OK) {
        res->found = true;
        zs_ckpt_pathf(res->warning, sizeof(res->warning),
                      "%s; resuming from %s/%s (step %" PRIu64
                      "), the newest checkpoint that verifies",
                      reason, d->shown, res->tag, res->step);
        return ZS_OK;
    }
    res->tag[0] = '\0';
    if (tried > 0) {
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "%s, and no other checkpoint there verifies (%zu tried; the newest: %s)",
                       reason, tried, newest);
    }
    if (!missing) {
        return zs_errf(err, errlen, ZS_ERR_IO, "%s, and %s holds no other checkpoint of job '%s'",
                       reason, d->shown, sh->job_id);
    }
    if (zd_ckpt_own_other(d, other, sizeof(other))) {
        return zs_errf(err, errlen, ZS_ERR_IO,
                       "%s, and %s/%s is not a checkpoint of job '%s' that verifies: the job is "
                       "not started over (move %s away to start it afresh)",
                       reason, d->shown, other, sh->job_id, d->shown);
    }
    return ZS_OK; /* no latest, no checkpoint: a fresh start */
}

/* ---- every rank's -------------------------------------------------------------------------- */

/* Every rank resumes from rank 0's choice, or none does. */
static zs_status_t zd_ckpt_own_same(const zd_ckpt_shard_t *sh, const zd_ckpt_resume_t *res,
                                    char *err, size_t errlen)
{
    const char *fresh = "nothing (a fresh start)";
    char tag0[ZS_CKPT_TAG_MAX] = "", why[ZS_MSG_MAX] = "";
    double found0 = 0;
    zs_status_t st = zd_ckpt_share_text(sh, 0, res->found ? 1 : 0, res->tag, ZS_CKPT_TAG_MAX - 1,
                                        &found0, tag0, sizeof(tag0), why, sizeof(why));

    if (st != ZS_OK) {
        st = zs_errf(err, errlen, st, "resuming from checkpoint_dir: %s", why);
    } else if ((found0 != 0) != res->found || (res->found && strcmp(tag0, res->tag) != 0)) {
        st = zs_errf(err, errlen, ZS_ERR_STATE,
                     "rank %u would resume job '%s' from %s, rank 0 from %s: every rank's "
                     "checkpoint_dir must hold the same checkpoints",
                     sh->rank, sh->job_id, res->found ? res->tag : fresh,
                     found0 != 0 ? tag0 : fresh);
    }
    return zd_ckpt_agree(sh, st, "resuming from checkpoint_dir", err, errlen);
}

zs_status_t zd_ckpt_own_resume(const zd_ckpt_shard_t *sh, const char *path, const char *bad,
                               const char *why, const zs_cancel_t *cancel, zd_ckpt_resume_t *res,
                               char *err, size_t errlen)
{
    char reason[ZS_MSG_MAX];
    bool missing = false;
    zs_dir_t d = ZS_DIR_INIT;
    zs_status_t st = zs_dir_open(&d, path, err, errlen);

    memset(res, 0, sizeof(*res));
    if (st == ZS_OK && bad != NULL) { /* its load failed: latest cannot be used */
        zs_ckpt_pathf(reason, sizeof(reason), "%s", why);
        st = zd_ckpt_own_fallback(sh, &d, bad, reason, false, cancel, res, err, errlen);
    } else if (st == ZS_OK) {
        st = zd_ckpt_own_latest(sh, &d, res, &missing, reason, sizeof(reason));
        res->found = st == ZS_OK;
        if (st != ZS_OK) {
            st = zd_ckpt_own_fallback(sh, &d, res->tag[0] != '\0' ? res->tag : NULL, reason,
                                      missing, cancel, res, err, errlen);
        }
    } else if (st == ZS_ERR_NOT_FOUND) {
        st = ZS_OK; /* no directory, no checkpoint: a fresh start */
    }
    zs_dir_close(&d);
    st = zd_ckpt_agree(sh, st, "resuming from checkpoint_dir", err, errlen);
    return st == ZS_OK ? zd_ckpt_own_same(sh, res, err, errlen) : st;
}
