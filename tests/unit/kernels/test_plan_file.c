/*
 * A store plan kept in a file for a daemon restarted on the same machine and boot
 * (kernels/src/plan_file.c): taken back as it was saved, and only when the file's first line
 * names this build, machine and boot and one whole plan follows; a missing file says nothing.
 * Each test runs in a process of its own (Criterion), so each starts with no plan.
 */
#include "zk_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void zt_plan(zk_store_plan_t *p)
{
    memset(p, 0, sizeof(*p));
    p->variant = (int)zk_default_variant();
    for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
        p->nt[f] = f % 2;
        p->nt_from[f] = p->nt_to[f] = p->pf_from[f] = (size_t)(f + 1) << 22;
        p->prefetch[f][0] = 512;
        p->gbps[f][0] = 20.0 + f;
    }
    p->nt_min_bytes = (size_t)64 << 20;
    snprintf(p->how, sizeof(p->how), "a plan of the test");
}

static void zt_path(char *path, size_t len)
{
    snprintf(path, len, "%s/zk-plan-%ld.stores", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
}

Test(zk_plan_file, saved_plan_is_taken_back_as_it_was)
{
    zk_store_plan_t p;
    char path[256], why[512];

    zt_plan(&p);
    zt_path(path, sizeof(path));
    cr_assert_eq(zk_store_plan_save(&p, path, "zerod test"), 0);
    cr_assert_null(zk_store_plan_measured());
    cr_assert_eq(zk_store_plan_load(path, "zerod test", why, sizeof(why)), 1, "%s", why);
    cr_assert_not_null(zk_store_plan_measured());
    cr_assert_eq(memcmp(zk_store_plan_measured(), &p, sizeof(p)), 0);
    /* a plan is there now: a second load takes nothing, and says why */
    cr_assert_eq(zk_store_plan_load(path, "zerod test", why, sizeof(why)), 0);
    cr_assert(strstr(why, "already") != NULL, "%s", why);
    unlink(path);
}

Test(zk_plan_file, another_build_or_a_broken_file_is_measured_again)
{
    zk_store_plan_t p;
    char path[256], why[512];
    FILE *f;

    zt_plan(&p);
    zt_path(path, sizeof(path));
    cr_assert_eq(zk_store_plan_save(&p, path, "zerod 1"), 0);
    cr_assert_eq(zk_store_plan_load(path, "zerod 2", why, sizeof(why)), 0);
    cr_assert(strstr(why, "another build, machine or boot") != NULL, "%s", why);
    cr_assert(strstr(why, path) != NULL, "the reason names the file: %s", why);
    /* the right first line, then a plan cut short */
    cr_assert_eq(truncate(path, 0), 0);
    cr_assert_eq(zk_store_plan_save(&p, path, "zerod 2"), 0);
    f = fopen(path, "r+");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    cr_assert_eq(ftruncate(fileno(f), ftell(f) - 8), 0);
    fclose(f);
    cr_assert_eq(zk_store_plan_load(path, "zerod 2", why, sizeof(why)), 0);
    cr_assert(strstr(why, "does not hold one plan") != NULL, "%s", why);
    cr_assert_null(zk_store_plan_measured(), "nothing was taken");
    unlink(path);
}

Test(zk_plan_file, no_file_says_nothing)
{
    char why[512] = "x";

    cr_assert_eq(zk_store_plan_load("/nonexistent/zk.stores", "zerod test", why, sizeof(why)), 0);
    cr_assert_eq(why[0], '\0', "%s", why);
    cr_assert_eq(zk_store_plan_save(NULL, "/nonexistent/zk.stores", "t"), -1);
}
