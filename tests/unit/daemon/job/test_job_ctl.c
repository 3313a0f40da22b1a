/* A job's life beyond its trainer (daemon/src/job/job_ctl.c, docs/design-notes.md "A job's life"),
 * driven through job/job.h and job/job_ctl.h as the engine drives them, at world 1 on the CPU: what
 * an attach of each resume policy does with the job kept after its trainer went, the busy answer
 * naming the job held, and `zeroctl job end` (JobEnd) with and without a final checkpoint. */
#include "job/job.h"
#include "job/job_ctl.h"
#include "zd_test.h"
#include "zs/mem.h"
#include "zs/time.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONN_A 1
#define CONN_B 2
#define CONFIG "{\"zero_optimization\": {\"reduce_bucket_size\": 16}, \"gradient_clipping\": 0}"

static atomic_bool cancel;
static zs_ratelimit_t warn_rl;
static zk_exec_t exec;
static zd_job_ended_t ended;
static zd_job_env_t env;
static zd_job_t *job;
static char err[ZS_MSG_MAX];
static const uint32_t group_n_params[] = {2};
static const uint64_t numel[] = {10, 20};
static const uint64_t other_numel[] = {10, 21};
static zd_job_spec_t spec;
static zd_attach_out_t out;
static bool disconnect_expected;

static void busy(void *arg, const char *what)
{
    (void)arg;
    (void)what;
}

static void wake(void *arg)
{
    (void)arg;
}

static void setup(void)
{
    atomic_store(&cancel, false);
    warn_rl = (zs_ratelimit_t)ZS_RATELIMIT_INIT(10ull * ZS_NSEC_PER_SEC, 100);
    exec = (zk_exec_t){.variant = ZK_VARIANT_DEFAULT};
    memset(&ended, 0, sizeof(ended));
    env = (zd_job_env_t){.exec = &exec,
                         .token_file = "",
                         .cancel = &cancel,
                         .wake = wake,
                         .busy = busy,
                         .warn_rl = &warn_rl,
                         .job_linger_ns = 60ull * ZS_NSEC_PER_SEC,
                         .n_slots = 2,
                         .ended = &ended};
    spec = (zd_job_spec_t){.job_id = "job-1",
                           .world = 1,
                           .dtype = ZS_DTYPE_F32,
                           .n_groups = 1,
                           .group_n_params = group_n_params,
                           .numel = numel,
                           .config_json = CONFIG,
                           .trainer_pid = 4242};
    job = NULL;
    disconnect_expected = false;
}

static void teardown(void)
{
    zs_log_set_level(ZS_LOG_WARN);
    zd_job_drop(&job, "test over");
}

TestSuite(zd_job_ctl, .init = setup, .fini = teardown);

static void close_fds(void)
{
    for (int i = 0; i < out.n_fds; i++) {
        close(out.fds[i]);
    }
    out.n_fds = 0;
}

static zs_status_t try_attach(uint64_t conn)
{
    zs_status_t st = zd_job_attach(&job, &env, conn, &spec, &out, err, sizeof(err));

    if (st == ZS_OK) {
        close_fds();
    }
    return st;
}

static void attach(uint64_t conn)
{
    zs_status_t st = try_attach(conn);

    cr_assert_eq(st, ZS_OK, "attach: %s (%s)", zs_status_name(st), err);
}

static void expect(zs_status_t st, zs_status_t want, const char *needle)
{
    cr_assert_eq(st, want, "%s, expected %s (%s)", zs_status_name(st), zs_status_name(want), err);
    cr_assert(needle == NULL || strstr(err, needle) != NULL, "'%s' not in: %s", needle, err);
}

/* The first trainer attaches, writes its values, and goes: killed (a disconnect) or detached
 * keeping the job. */
static void first_trainer_goes(bool detach)
{
    zd_ckpt_out_t ck;

    attach(CONN_A);
    expect(zd_job_params_ready(job, &env, CONN_A, false, &ck, err, sizeof(err)), ZS_OK, NULL);
    if (detach) {
        expect(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    } else {
        if (!disconnect_expected) {
            zdt_expect_warn("trainer of job 'job-1' disconnected at step 0");
            disconnect_expected = true;
        }
        zd_job_disconnect(job, &env, CONN_A);
    }
}

/* ---- attach: re-attach, replace, refuse ----------------------------------------------------- */

ZDT_TEST(zd_job_ctl, auto_replaces_an_orphan_unless_the_launcher_says_restart)
{
    zd_job_t *old;

    spec.resume = ZD_RESUME_AUTO;
    first_trainer_goes(false);
    old = job;
    attach(CONN_B);
    cr_assert(!out.resumed, "a plain re-run continued the orphan");
    cr_assert(strstr(out.replaced, "job 'job-1' at step 0") != NULL, "%s", out.replaced);
    cr_assert(strstr(out.replaced, "resume 'auto'") != NULL, "%s", out.replaced);
    (void)old;

    zd_job_drop(&job, "next case");
    first_trainer_goes(false);
    spec.restart = true;
    attach(CONN_B);
    cr_assert(out.resumed, "a restart did not continue the orphan");
    cr_assert_str_eq(out.replaced, "");
}

ZDT_TEST(zd_job_ctl, auto_replaces_an_orphan_that_no_longer_fits_even_on_a_restart)
{
    spec.resume = ZD_RESUME_AUTO;
    spec.restart = true;
    first_trainer_goes(false);
    spec.numel = other_numel;
    attach(CONN_B);
    cr_assert(!out.resumed);
    cr_assert(strstr(out.replaced, "does not fit") != NULL, "%s", out.replaced);
    cr_assert(strstr(out.replaced, "layout hash") != NULL, "%s", out.replaced);
}

ZDT_TEST(zd_job_ctl, auto_resumes_a_job_its_trainer_kept_on_purpose)
{
    spec.resume = ZD_RESUME_AUTO;
    first_trainer_goes(true);
    attach(CONN_B);
    cr_assert(out.resumed, "close(end_job=False) then initialize() did not resume");
}

ZDT_TEST(zd_job_ctl, never_replaces_even_a_kept_job_on_a_restart)
{
    spec.resume = ZD_RESUME_NEVER;
    spec.restart = true;
    first_trainer_goes(true);
    attach(CONN_B);
    cr_assert(!out.resumed);
    cr_assert(strstr(out.replaced, "resume 'never'") != NULL, "%s", out.replaced);
}

ZDT_TEST(zd_job_ctl, must_fails_with_nothing_to_resume_and_never_replaces)
{
    spec.resume = ZD_RESUME_MUST;
    expect(try_attach(CONN_A), ZS_ERR_NOT_FOUND, "resume 'must'");
    cr_assert_null(job);
    spec.resume = ZD_RESUME_AUTO;
    first_trainer_goes(false);
    spec.resume = ZD_RESUME_MUST;
    spec.numel = other_numel;
    expect(try_attach(CONN_B), ZS_ERR_LAYOUT_MISMATCH, "layout hash");
    cr_assert_not_null(job, "a refused must-resume dropped the job");
    spec.numel = numel;
    attach(CONN_B);
    cr_assert(out.resumed);
}

ZDT_TEST(zd_job_ctl, busy_names_the_job_its_age_its_trainer_and_the_end_command)
{
    spec.resume = ZD_RESUME_NEVER;
    attach(CONN_A);
    spec.job_id = "job-2";
    expect(try_attach(CONN_B), ZS_ERR_BUSY, "holds job 'job-1' (rank 0 of 1, step 0, started ");
    cr_assert(strstr(err, "attached by a live trainer (pid 4242)") != NULL, "%s", err);
    cr_assert(strstr(err, "zeroctl job end job-1") != NULL, "%s", err);
    spec.job_id = "job-1"; /* the same job, a live trainer: never replaced, whatever resume says */
    expect(try_attach(CONN_B), ZS_ERR_BUSY, "attached by a live trainer");
    zdt_expect_warn("trainer of job 'job-1' disconnected");
    zd_job_disconnect(job, &env, CONN_A);
    spec.job_id = "job-2"; /* another job is never replaced */
    expect(try_attach(CONN_B), ZS_ERR_BUSY, "orphaned: its trainer went without a detach");
    cr_assert(strstr(err, "s more for a re-attach (job_linger)") != NULL, "%s", err);
    cr_assert(strstr(err, "zeroctl job end job-1") != NULL, "%s", err);
}

ZDT_TEST(zd_job_ctl, state_names)
{
    zd_job_status_t s;

    attach(CONN_A);
    zd_job_status(job, &s);
    cr_assert_str_eq(zd_job_state_name(&s), "attached");
    cr_assert_eq(s.trainer_pid, 4242);
    cr_assert_gt(s.created_ns, 0);
    expect(zd_job_detach(&job, &env, CONN_A, false, err, sizeof(err)), ZS_OK, NULL);
    zd_job_status(job, &s);
    cr_assert_str_eq(zd_job_state_name(&s), "kept");
    cr_assert_gt(s.linger_until_ns, s.released_ns);
    attach(CONN_B);
    zdt_expect_warn("disconnected");
    zd_job_disconnect(job, &env, CONN_B);
    zd_job_status(job, &s);
    cr_assert_str_eq(zd_job_state_name(&s), "orphaned");
}

/* ---- job end ----------------------------------------------------------------------------------
 */

ZDT_TEST(zd_job_ctl, end_names_what_the_daemon_holds_when_it_is_not_the_job)
{
    zd_job_end_req_t req = {.job_id = "job-1"};
    zd_job_end_out_t eo;

    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_ERR_NOT_FOUND, "no job");
    attach(CONN_A);
    req.job_id = "job-9";
    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_ERR_NOT_FOUND,
           "holds job 'job-1', not 'job-9'");
    cr_assert_not_null(job);
}

ZDT_TEST(zd_job_ctl, end_drops_the_job_and_its_trainer_is_told)
{
    zd_job_end_req_t req = {.all = true};
    zd_job_end_out_t eo;

    attach(CONN_A);
    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_OK, NULL);
    cr_assert_null(job);
    cr_assert_str_eq(eo.job_id, "job-1");
    cr_assert(!eo.peers_told, "world 1 has no peers");
    cr_assert_eq(ended.conn, CONN_A);
    cr_assert(strstr(ended.msg, "ended by an operator (zeroctl job end)") != NULL, "%s", ended.msg);
}

ZDT_TEST(zd_job_ctl, end_with_a_checkpoint_saves_first_and_keeps_the_job_when_it_fails)
{
    char dir[] = "/tmp/zd-test-job-ctl-XXXXXX", ckpt[PATH_MAX], path[PATH_MAX + 64];
    zs_cred_t me;
    zd_job_end_req_t req = {.job_id = "job-1", .ckpt_dir = ckpt, .cred = &me};
    zd_job_end_out_t eo;
    zd_ckpt_out_t ck;
    struct stat sb;

    zs_cred_of_self(&me);
    cr_assert_not_null(mkdtemp(dir));
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", dir);
    cr_assert_eq(mkdir(ckpt, 0750), 0);
    req.ckpt_dir_fd = open(ckpt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(req.ckpt_dir_fd, 0);
    attach(CONN_A);
    zdt_expect_warn("its final checkpoint failed");
    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_ERR_STATE, "no parameters");
    cr_assert_not_null(job, "a failed final checkpoint ended the job");
    expect(zd_job_params_ready(job, &env, CONN_A, false, &ck, err, sizeof(err)), ZS_OK, NULL);
    req.ckpt_dir = "relative/dir";
    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_ERR_INVALID, "absolute");
    req.ckpt_dir = ckpt;
    expect(zd_job_end(&job, &env, &req, &eo, err, sizeof(err)), ZS_OK, NULL);
    cr_assert_null(job);
    snprintf(path, sizeof(path), "%s/global_step0", ckpt);
    cr_assert_str_eq(eo.ckpt_path, path);
    cr_assert_eq(stat(path, &sb), 0, "no checkpoint at %s", path);
    cr_assert(strstr(ended.msg, "final checkpoint") != NULL, "%s", ended.msg);
    close(req.ckpt_dir_fd);
    snprintf(path, sizeof(path), "rm -rf '%s'", dir);
    cr_assert_eq(system(path), 0);
}
