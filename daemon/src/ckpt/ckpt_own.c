/*
 * The daemons' own checkpoints (docs/checkpoints.md "Checkpoints the daemons take themselves"):
 * checkpoint_dir/<job id>. When to save and whether to resume are the job's to decide (job/);
 * here are the directory and the agreement that every rank found this job's checkpoint. The
 * directory is the daemon's own: it is used with the daemon's rights.
 */
#define _GNU_SOURCE
#include "ckpt/ckpt_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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

zs_status_t zd_ckpt_own_latest(const zd_ckpt_shard_t *sh, const char *path, bool *found_p,
                               char *err, size_t errlen)
{
    char tag[ZS_CKPT_TAG_MAX];
    zs_ckpt_manifest_t *m = NULL;
    zs_dir_t d = ZS_DIR_INIT, ckpt = ZS_DIR_INIT;
    zs_status_t st = zs_dir_open(&d, path, err, errlen);

    *found_p = false;
    if (st == ZS_OK) {
        st = zs_ckpt_open(&d, NULL, &ckpt, tag, sizeof(tag), err, errlen);
    }
    if (st == ZS_OK) {
        st = zs_ckpt_manifest_read(&ckpt, &m, err, errlen);
    }
    if (st == ZS_OK && strcmp(m->job_id, sh->job_id) != 0) {
        st = zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "%s is job '%s''s, not '%s''s", ckpt.shown,
                     m->job_id, sh->job_id);
    }
    zs_ckpt_manifest_free(m);
    zs_dir_close(&ckpt);
    zs_dir_close(&d);
    /* every rank must find one, or none loads */
    st = zd_ckpt_agree(sh, st, "resuming from checkpoint_dir", err, errlen);
    *found_p = st == ZS_OK;
    return st == ZS_ERR_PEER_LOST ? st : ZS_OK;
}
