/*
 * A store plan kept in a file for a later process of the same machine and boot (kernels.h,
 * zk_store_plan_save/load): a daemon restarted after a crash takes its predecessor's plan
 * instead of measuring for seconds on a core its job's recovery needs. The file is a line
 * naming what the plan depends on (the build, the variant, the CPU's model and caches, the
 * boot) and the plan's bytes; any difference in that line, or in the size, measures again.
 */
#define _GNU_SOURCE
#include "zk_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ZK_PLAN_FILE_MAGIC "zerod store plan 1"

/* The first line of /proc's file `path` with `key` (up to its ':'), its value; "" if none. */
static void zk_proc_value(const char *path, const char *key, char *out, size_t len)
{
    char line[512];
    FILE *f = fopen(path, "r");

    out[0] = '\0';
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *colon = strchr(line, ':');

        if (key == NULL || (colon != NULL && strncmp(line, key, strlen(key)) == 0)) {
            const char *v = key == NULL ? line : colon + 1;

            v += strspn(v, " \t");
            snprintf(out, len, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
    }
    fclose(f);
}

/* What a plan depends on, as one line. */
static void zk_plan_identity(const char *tag, char *out, size_t len)
{
    char model[256], boot[64];

    zk_proc_value("/proc/cpuinfo", "model name", model, sizeof(model));
    zk_proc_value("/proc/sys/kernel/random/boot_id", NULL, boot, sizeof(boot));
    snprintf(out, len,
             "%s; build %s; variant %s; plan %zu bytes; cpu %s; l1d %zu llc %zu; cpus %ld; "
             "boot %s\n",
             ZK_PLAN_FILE_MAGIC, tag != NULL ? tag : "", zk_variant_name(zk_default_variant()),
             sizeof(zk_store_plan_t), model, zk_l1d_bytes(), zk_llc_bytes(),
             sysconf(_SC_NPROCESSORS_ONLN), boot);
}

int zk_store_plan_save(const zk_store_plan_t *plan, const char *path, const char *tag)
{
    char id[1024], tmp[4096];
    FILE *f;
    int ok;

    if (plan == NULL || path == NULL ||
        snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp)) {
        errno = EINVAL;
        return -1;
    }
    zk_plan_identity(tag, id, sizeof(id));
    f = fopen(tmp, "w");
    if (f == NULL) {
        return -1;
    }
    ok = fputs(id, f) >= 0 && fwrite(plan, sizeof(*plan), 1, f) == 1;
    ok = fflush(f) == 0 && ok;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        int e = errno != 0 ? errno : EIO;

        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

int zk_store_plan_load(const char *path, const char *tag, char *why, size_t whylen)
{
    char id[1024], line[1024];
    zk_store_plan_t *plan;
    FILE *f;
    int taken;

    f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;

        if (e == ENOENT) {
            why[0] = '\0'; /* nothing kept: nothing to say */
            return 0;
        }
        snprintf(why, whylen, "%s: %s", path, strerror(e));
        return -1;
    }
    zk_plan_identity(tag, id, sizeof(id));
    if (fgets(line, sizeof(line), f) == NULL || strcmp(line, id) != 0) {
        fclose(f);
        snprintf(why, whylen, "%s was saved for another build, machine or boot", path);
        return 0;
    }
    plan = malloc(sizeof(*plan));
    if (plan == NULL || fread(plan, sizeof(*plan), 1, f) != 1 || fgetc(f) != EOF) {
        fclose(f);
        free(plan);
        snprintf(why, whylen, "%s does not hold one plan after its first line", path);
        return 0;
    }
    fclose(f);
    taken = zk_store_plan_install(plan);
    free(plan);
    if (!taken) {
        snprintf(why, whylen, "a plan was measured, or is being measured, already");
    }
    return taken;
}
