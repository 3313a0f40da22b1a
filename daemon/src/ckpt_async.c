/*
 * Asynchronous checkpoint saves (docs/checkpoints.md): the engine thread copies this rank's
 * shard (master, m, v) into a staging buffer and replies; a writer thread writes the copy and
 * reports it next to the file; rank 0's writer waits for every rank's report, then writes the
 * manifest and commits by rename, exactly as a synchronous save does. The writer touches
 * nothing of the job that changes (the layout, names and id are fixed while the job lives), and
 * the job does not go before its writer is done.
 */
#define _GNU_SOURCE
#include "job_int.h"
#include "zs/error.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long rank 0's writer waits for the other ranks' files after its own. */
#define ZD_CKPT_ASYNC_WAIT_NS (300ull * 1000000000ull)

struct zd_ckpt_async {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool go, cancel;     /* under lock */
    const zd_job_t *job; /* layout, id: fixed while the job lives */
    float *stage;        /* master, m, v: 3 x shard_numel (mmap'd) */
    size_t stage_bytes;
    bool keep;   /* checkpoint_staging_keep: the copy's memory goes back to the job, not away */
    void *state; /* rank 0: the trainer's bytes */
    size_t state_len;
    bool has_state;
    zs_ckpt_manifest_t head; /* rank 0: the manifest as of the save */
    char dir[4096], tag[ZS_CKPT_TAG_MAX], tmp[4096];
    uint32_t rank, world, keep_last;
    uint64_t step, t0;
    zs_status_t result; /* the writer's, read after the join */
    char err[ZD_MAX_MSG];
};

static bool zd_ckpt_async_cancelled(zd_ckpt_async_t *a)
{
    bool c;
    pthread_mutex_lock(&a->lock);
    c = a->cancel;
    pthread_mutex_unlock(&a->lock);
    return c;
}

/* A rank that failed says so next to its file, so that rank 0 stops waiting for it. */
static void zd_ckpt_async_report_error(const zd_ckpt_async_t *a, const char *why)
{
    char path[4096], e[ZD_MAX_MSG];
    zs_ckpt_pathf(path, sizeof(path), "%s/.rank_%05u.err", a->tmp, a->rank);
    (void)zd_ckpt_write_report(path, why, e, sizeof(e));
}

/* Rank 0: every rank's report is there (or one failed, or the wait ran out). settle: wait
 * for every rank to be done either way (a failed save's directory goes only then). */
static zs_status_t zd_ckpt_async_gather(zd_ckpt_async_t *a, bool settle, char *err, size_t errlen)
{
    zs_deadline_t deadline = zs_deadline_in_ns(ZD_CKPT_ASYNC_WAIT_NS);
    uint32_t r = 0;

    while (r < a->world) {
        char path[4096];
        struct stat sb;
        zs_ckpt_pathf(path, sizeof(path), "%s/.rank_%05u.err", a->tmp, r);
        if (stat(path, &sb) == 0) {
            if (settle) {
                r++;
                continue;
            }
            return zs_errf(err, errlen, ZS_ERR_ABORTED, "rank %u could not write its shard (%s)", r,
                           path);
        }
        zs_ckpt_pathf(path, sizeof(path), "%s/.rank_%05u.sum", a->tmp, r);
        if (stat(path, &sb) == 0) {
            r++;
            continue;
        }
        if (zd_ckpt_async_cancelled(a) || zs_deadline_expired(deadline)) {
            return zs_errf(err, errlen, ZS_ERR_TIMEOUT,
                           "rank %u's shard did not arrive in %s (job ended or %llu s passed)", r,
                           a->tmp, (unsigned long long)(ZD_CKPT_ASYNC_WAIT_NS / 1000000000ull));
        }
        usleep(5000);
    }
    return ZS_OK;
}

static zs_status_t zd_ckpt_async_commit(zd_ckpt_async_t *a, char *err, size_t errlen)
{
    uint64_t sxxh3 = 0;
    zs_status_t st = ZS_OK;

    if (a->has_state) {
        char path[4096];
        zs_ckpt_pathf(path, sizeof(path), "%s/%s", a->tmp, ZS_CKPT_TRAINER_STATE);
        st = zs_ckpt_write_file(path, a->state, a->state_len, &sxxh3, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_async_gather(a, false, err, errlen);
    }
    if (st == ZS_OK) {
        st = zd_ckpt_manifest_finish(&a->head, a->tmp, a->has_state, a->state_len, sxxh3, err,
                                     errlen);
    }
    zd_step_test_pause(a->job, "ckpt", a->step);
    if (st == ZS_OK) {
        st = zd_ckpt_commit(a->job, a->step, a->dir, a->tag, a->tmp, err, errlen);
    }
    if (st == ZS_OK) {
        zd_ckpt_prune(a->dir, a->job->id, a->tag, a->keep_last);
    } else {
        char why[ZD_MAX_MSG];
        (void)zs_ckpt_remove_tree(a->tmp, why, sizeof(why));
    }
    return st;
}

static void *zd_ckpt_async_main(void *arg)
{
    zd_ckpt_async_t *a = arg;
    char err[ZD_MAX_MSG] = "";
    uint64_t bytes = 0, xxh3 = 0;
    zs_status_t st;

    pthread_mutex_lock(&a->lock);
    while (!a->go && !a->cancel) {
        pthread_cond_wait(&a->cond, &a->lock);
    }
    if (!a->go) { /* cancelled before any rank wrote */
        pthread_mutex_unlock(&a->lock);
        return NULL;
    }
    pthread_mutex_unlock(&a->lock);
    st = zd_ckpt_write_rank(a->job, a->stage, a->step, a->tmp, &bytes, &xxh3, err, sizeof(err));
    if (!a->keep) { /* the copy is on disk: its memory goes back at once */
        munmap(a->stage, a->stage_bytes);
        a->stage = NULL;
    }
    if (st == ZS_OK) {
        st = zd_ckpt_write_sum(a->rank, a->tmp, bytes, xxh3, err, sizeof(err));
    }
    if (st != ZS_OK) {
        zd_ckpt_async_report_error(a, err);
        if (a->rank == 0) { /* the others finish, then what they left goes */
            char why[ZD_MAX_MSG];
            (void)zd_ckpt_async_gather(a, true, why, sizeof(why));
            (void)zs_ckpt_remove_tree(a->tmp, why, sizeof(why));
        }
    } else if (a->rank == 0) {
        st = zd_ckpt_async_commit(a, err, sizeof(err));
    }
    a->result = st;
    zs_ckpt_pathf(a->err, sizeof(a->err), "%s", err);
    if (st != ZS_OK) {
        zs_error(ZS_SUB_ENGINE, "checkpoint %s/%s of step %" PRIu64 " failed: %s", a->dir, a->tag,
                 a->step, err);
    } else {
        zs_info(ZS_SUB_ENGINE,
                "checkpoint %s/%s of step %" PRIu64 " %s (%.3f s, %" PRIu64 " bytes)", a->dir,
                a->tag, a->step, a->rank == 0 ? "committed" : "written",
                (double)(zs_time_now_ns() - a->t0) * 1e-9, bytes);
    }
    return NULL;
}

static void zd_ckpt_async_free(zd_ckpt_async_t *a)
{
    if (a->stage != NULL) {
        munmap(a->stage, a->stage_bytes);
    }
    free(a->state);
    zd_ckpt_manifest_release(&a->head);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
    free(a);
}

/* The staging copy of this rank's shard. */
static zs_status_t zd_ckpt_async_stage(zd_ckpt_async_t *a, zd_job_t *job)
{
    const zs_layout_t *l = job->layout;
    size_t n = (size_t)l->shard_numel;

    a->stage_bytes = (3 * n + 1) * sizeof(float);
    if (job->ckpt_stage != NULL) { /* kept from the last save: mapped and touched already */
        a->stage = job->ckpt_stage;
        job->ckpt_stage = NULL;
    } else {
        void *p =
            mmap(NULL, a->stage_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return ZS_ERR_NO_MEMORY;
        }
        (void)madvise(p, a->stage_bytes, MADV_HUGEPAGE); /* fewer faults while copying */
        a->stage = p;
    }
    return zd_ckpt_stage_copy(job, a->stage);
}

zs_status_t zd_ckpt_stage_copy(zd_job_t *job, float *stage)
{
    const zs_layout_t *l = job->layout;
    size_t n = (size_t)l->shard_numel;
    zs_status_t st = ZS_OK;

    for (uint32_t b = 0; b < l->n_buckets && st == ZS_OK; b++) {
        st = zd_backend_copy(job->be, stage + l->buckets[b].shard_offset, zd_step_master(job, b),
                             l->buckets[b].slice * sizeof(float));
    }
    if (st == ZS_OK) {
        st = zd_backend_copy(job->be, stage + n, job->m, n * sizeof(float));
    }
    if (st == ZS_OK) {
        st = zd_backend_copy(job->be, stage + 2 * n, job->v, n * sizeof(float));
    }
    return st;
}

zs_status_t zd_ckpt_async_start(zd_job_t *job, const zd_ckpt_req_t *req, const char *tag,
                                const char *tmp, char *err, size_t errlen)
{
    zd_ckpt_async_t *a = calloc(1, sizeof(*a));
    zs_status_t st;

    if (a == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    a->job = job;
    a->rank = job->rank;
    a->world = job->world;
    a->step = job->step;
    a->keep_last = req->keep_last;
    a->keep = req->keep_staging;
    a->t0 = zs_time_now_ns();
    zs_ckpt_pathf(a->dir, sizeof(a->dir), "%s", req->dir);
    zs_ckpt_pathf(a->tag, sizeof(a->tag), "%s", tag);
    zs_ckpt_pathf(a->tmp, sizeof(a->tmp), "%s", tmp);
    st = zd_ckpt_async_stage(a, job);
    if (st == ZS_OK && job->rank == 0) {
        st = zd_ckpt_manifest_head(job, tag, &a->head);
        a->has_state = req->trainer_state != NULL;
        if (st == ZS_OK && a->has_state) {
            a->state = malloc(req->trainer_state_len ? req->trainer_state_len : 1);
            st = a->state != NULL ? ZS_OK : ZS_ERR_NO_MEMORY;
            if (st == ZS_OK) {
                memcpy(a->state, req->trainer_state, req->trainer_state_len);
                a->state_len = req->trainer_state_len;
            }
        }
    }
    if (st == ZS_OK && zs_thread_start(&a->thread, false, zd_ckpt_async_main, a) != 0) {
        st = ZS_ERR_NO_MEMORY;
    }
    if (st != ZS_OK) {
        zd_ckpt_async_free(a);
        return zs_errf(err, errlen, st, "a staging copy of %llu elements does not fit in memory",
                       (unsigned long long)(3 * job->layout->shard_numel));
    }
    job->ckpt_async = a;
    return ZS_OK;
}

static void zd_ckpt_async_set(zd_ckpt_async_t *a, bool go)
{
    pthread_mutex_lock(&a->lock);
    if (go) {
        a->go = true;
    } else {
        a->cancel = true;
    }
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

void zd_ckpt_async_release(zd_job_t *job)
{
    if (job->ckpt_async != NULL) {
        zd_ckpt_async_set(job->ckpt_async, true);
    }
}

static zs_status_t zd_ckpt_async_join(zd_job_t *job, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zd_ckpt_async_t *a = job->ckpt_async;
    zs_status_t st;

    pthread_join(a->thread, NULL);
    st = a->result;
    if (st != ZS_OK && err != NULL) {
        zs_ckpt_pathf(err, errlen, "checkpoint %s/%s: %s", a->dir, a->tag, a->err);
    }
    if (out != NULL) {
        zs_ckpt_pathf(out->path, sizeof(out->path), "%s/%s", a->dir, a->tag);
        zs_ckpt_pathf(out->tag, sizeof(out->tag), "%s", a->tag);
        out->step = a->step;
    }
    if (a->keep && a->stage != NULL) { /* for the next save */
        job->ckpt_stage = a->stage;
        a->stage = NULL;
    }
    zd_ckpt_async_free(a);
    job->ckpt_async = NULL;
    return st;
}

void zd_ckpt_async_cancel(zd_job_t *job)
{
    if (job->ckpt_async != NULL) {
        zd_ckpt_async_set(job->ckpt_async, false);
        (void)zd_ckpt_async_join(job, NULL, NULL, 0);
    }
}

void zd_ckpt_async_wait(zd_job_t *job)
{
    if (job->ckpt_async != NULL) {
        (void)zd_ckpt_async_join(job, NULL, NULL, 0);
    }
}

zs_status_t zd_ckpt_wait(zd_job_t *job, zd_ckpt_out_t *out, char *err, size_t errlen)
{
    zs_status_t st = ZS_OK;

    memset(out, 0, sizeof(*out));
    if (job->ckpt_async != NULL) {
        st = zd_ckpt_async_join(job, out, err, errlen);
    }
    /* rank 0's outcome is the commit's: every rank learns it */
    return zd_ckpt_agree(job, st, "checkpoint write", err, errlen);
}

void zd_ckpt_stage_free(zd_job_t *job)
{
    if (job->ckpt_stage != NULL) {
        munmap(job->ckpt_stage, (3 * (size_t)job->layout->shard_numel + 1) * sizeof(float));
        job->ckpt_stage = NULL;
    }
}
