/*
 * A job's life beyond its trainer (docs/design-notes.md "A job's life"): what an attach does
 * with the job kept after its trainer went (re-attach it, replace it, or refuse, naming the job,
 * its age and the command that ends it), `zeroctl job end` (an optional final checkpoint, the
 * peers told over the mesh), and a peer's END. The runner thread alone runs these.
 */
#define _GNU_SOURCE
#include "job/job_ctl.h"
#include "job/job_int.h"
#include "mesh/mesh.h"
#include "zs/error.h"
#include "zs/time.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static double zd_secs_since(uint64_t then_ns, uint64_t now_ns)
{
    return then_ns != 0 && now_ns > then_ns ? (double)(now_ns - then_ns) * 1e-9 : 0.0;
}

/* The trainer of an ended job is told why at its next call (the runner answers it). */
static void zd_job_ended_record(const zd_job_env_t *env, uint64_t conn, const char *msg)
{
    if (env->ended == NULL || conn == 0) {
        return;
    }
    env->ended->conn = conn;
    snprintf(env->ended->msg, sizeof(env->ended->msg), "%s", msg);
}

/* ---- attach: re-attach, replace, or refuse ------------------------------------------------ */

/* Another job holds the daemon, or a live trainer holds this one: busy, naming the job, its
 * age, who holds it and the command that ends it. */
static zs_status_t zd_job_busy(const zd_job_t *job, char *err, size_t errlen)
{
    uint64_t now = zs_time_now_ns();
    double age = zd_secs_since(job->created_ns, now);
    double left = job->linger_until_ns > now ? (double)(job->linger_until_ns - now) * 1e-9 : 0;
    char who[128];

    if (job->attached_conn != 0) {
        if (job->trainer_pid > 0) {
            snprintf(who, sizeof(who), "attached by a live trainer (pid %d)", job->trainer_pid);
        } else {
            snprintf(who, sizeof(who), "attached by a live trainer");
        }
        return zs_errf(err, errlen, ZS_ERR_BUSY,
                       "busy: this daemon holds job '%s' (rank %u of %u, step %llu, started "
                       "%.0f s ago), %s; to end it: zeroctl job end %s",
                       job->id, job->rank, job->world, (unsigned long long)job->step, age, who,
                       job->id);
    }
    return zs_errf(err, errlen, ZS_ERR_BUSY,
                   "busy: this daemon holds job '%s' (rank %u of %u, step %llu, started %.0f s "
                   "ago), %s %.0f s ago and kept %.0f s more for a re-attach (job_linger); to "
                   "end it: zeroctl job end %s",
                   job->id, job->rank, job->world, (unsigned long long)job->step, age,
                   job->kept && !job->mesh_lost ? "its trainer detached keeping it"
                                                : "orphaned: its trainer went without a detach",
                   zd_secs_since(job->released_ns, now), left, job->id);
}

/* Does the attach replace the kept job of its id? why says why when it does. */
static bool zd_job_replaces(const zd_job_t *job, uint64_t conn, const zd_job_spec_t *spec,
                            char *why, size_t len)
{
    char err[ZS_MSG_MAX];

    switch (spec->resume) {
    case ZD_RESUME_NEVER:
        snprintf(why, len, "the new trainer asks for a fresh job (resume 'never')");
        return true;
    case ZD_RESUME_AUTO:
        if (!spec->restart && !(job->kept && !job->mesh_lost)) {
            snprintf(why, len,
                     "resume 'auto': the new trainer's launcher does not say it is a restart "
                     "(TORCHELASTIC_RESTART_COUNT unset or 0) and the old trainer went without "
                     "a detach");
            return true;
        }
        if (zd_job_check_reattach(job, conn, spec, err, sizeof(err)) != ZS_OK) {
            snprintf(why, len, "resume 'auto', but the new trainer does not fit it: %.400s", err);
            return true;
        }
        return false;
    default: /* IF_KEPT, MUST: a re-attach; zd_job_check_reattach says whether it fits */
        return false;
    }
}

zs_status_t zd_job_attach_decide(zd_job_t **job_p, const zd_job_env_t *env, uint64_t conn,
                                 const zd_job_spec_t *spec, char *replaced, size_t replaced_len,
                                 char *err, size_t errlen)
{
    zd_job_t *job = *job_p;
    char why[ZS_MSG_MAX], drop[ZS_MSG_MAX + 64];
    bool live;

    (void)env;
    replaced[0] = '\0';
    if (job == NULL) {
        if (spec->resume == ZD_RESUME_MUST) {
            return zs_errf(err, errlen, ZS_ERR_NOT_FOUND,
                           "attach of job '%s' with resume 'must': this daemon keeps no job to "
                           "resume (never attached here, ended, or its job_linger passed)",
                           spec->job_id != NULL ? spec->job_id : "");
        }
        return ZS_OK;
    }
    /* a trainer whose mesh was lost re-attaches on its own connection */
    live = job->attached_conn != 0 && !(job->mesh_lost && job->attached_conn == conn);
    if (live || spec->job_id == NULL || strcmp(job->id, spec->job_id) != 0) {
        return zd_job_busy(job, err, errlen);
    }
    if (!zd_job_replaces(job, conn, spec, why, sizeof(why))) {
        return ZS_OK;
    }
    snprintf(replaced, replaced_len, "job '%s' at step %llu, kept %.0f s: %s", job->id,
             (unsigned long long)job->step, zd_secs_since(job->released_ns, zs_time_now_ns()), why);
    snprintf(drop, sizeof(drop), "replaced by a new job of the same id: %s", why);
    zd_job_drop(job_p, drop);
    return ZS_OK;
}

/* ---- a peer ended the job ------------------------------------------------------------------ */

bool zd_job_ended_by_peer(zd_job_t **job_p, const zd_job_env_t *env)
{
    zd_job_t *job = *job_p;
    char why[sizeof(job->end_why) + 64];

    if (job == NULL) {
        return false;
    }
    if (job->mesh != NULL && zd_mesh_ended(job->mesh, job->end_why, sizeof(job->end_why))) {
        job->end_pending = true;
    }
    if (!job->end_pending) {
        return false;
    }
    zd_job_ended_record(env, job->attached_conn, job->end_why);
    snprintf(why, sizeof(why), "ended on a peer: %s", job->end_why);
    zd_job_drop(job_p, why);
    return true;
}

/* ---- zeroctl job end ------------------------------------------------------------------------ */

/* The final checkpoint: every daemon of the job saves it together (each got a JobEnd). A world
 * > 1 job whose trainers went has no mesh: it forms again for the save. */
static zs_status_t zd_job_end_ckpt(zd_job_t *job, const zd_job_env_t *env,
                                   const zd_job_end_req_t *req, zd_job_end_out_t *out, char *err,
                                   size_t errlen)
{
    zd_ckpt_req_t creq = {.dir = req->ckpt_dir, .dir_fd = req->ckpt_dir_fd, .cred = req->cred};
    zd_ckpt_out_t co;
    zs_status_t st;

    if (!job->params_loaded) {
        return zs_errf(err, errlen, ZS_ERR_STATE,
                       "job end: job '%s' has no parameters yet (its trainer never sent "
                       "ParamsReady): nothing to checkpoint; end it without --checkpoint",
                       job->id);
    }
    if (job->world > 1 && job->attached_conn != 0) {
        return zs_errf(err, errlen, ZS_ERR_BUSY,
                       "job end: job '%s' has live trainers: a final checkpoint of a world %u "
                       "job is taken once they are gone (or by them: save_checkpoint); end it "
                       "without --checkpoint, or stop its trainers first",
                       job->id, job->world);
    }
    st = zd_job_form_mesh(job, env, err, errlen); /* up already: nothing to do */
    if (st == ZS_OK) {
        memset(&co, 0, sizeof(co));
        zd_step_drop_partial(job);
        st = zd_job_ckpt_save_to(job, &creq, &co, err, errlen);
    }
    if (st == ZS_OK) {
        snprintf(out->ckpt_path, sizeof(out->ckpt_path), "%s", co.path);
    }
    return st;
}

zs_status_t zd_job_end(zd_job_t **job_p, const zd_job_env_t *env, const zd_job_end_req_t *req,
                       zd_job_end_out_t *out, char *err, size_t errlen)
{
    zd_job_t *job = *job_p;
    const char *want = req->job_id != NULL ? req->job_id : "";
    char msg[ZS_MSG_MAX];
    zs_status_t st;

    memset(out, 0, sizeof(*out));
    if (job == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND, "job end: this daemon holds no job%s%s%s",
                       req->all ? "" : " ('", req->all ? "" : want, req->all ? "" : "')");
    }
    if (!req->all && strcmp(job->id, want) != 0) {
        return zs_errf(err, errlen, ZS_ERR_NOT_FOUND,
                       "job end: this daemon holds job '%s', not '%s'", job->id, want);
    }
    snprintf(out->job_id, sizeof(out->job_id), "%s", job->id);
    out->rank = job->rank;
    out->world = job->world;
    if (req->ckpt_dir != NULL && req->ckpt_dir[0] != '\0') {
        st = zd_job_end_ckpt(job, env, req, out, err, errlen);
        if (st != ZS_OK) {
            zs_warn(ZS_SUB_ENGINE, "job '%s' not ended: its final checkpoint failed: %s", job->id,
                    err);
            return st;
        }
    }
    out->step = job->step;
    snprintf(msg, sizeof(msg),
             "job '%s' was ended by an operator (zeroctl job end) at step %llu%s%.300s", job->id,
             (unsigned long long)job->step, out->ckpt_path[0] ? "; final checkpoint " : "",
             out->ckpt_path);
    /* with a checkpoint every daemon got its own JobEnd; an END now would cut a slower peer's
     * save short */
    out->peers_told =
        out->ckpt_path[0] == '\0' && job->mesh != NULL && !zd_mesh_aborted(job->mesh, NULL, 0);
    if (out->peers_told) {
        zd_mesh_end(job->mesh, msg);
    }
    zd_job_ended_record(env, job->attached_conn, msg);
    zd_job_drop(job_p, "ended by zeroctl job end");
    return ZS_OK;
}
