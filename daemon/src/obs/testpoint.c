/* ZEROD_TEST_PAUSE (obs/testpoint.h). */
#define _GNU_SOURCE
#include "obs/testpoint.h"

#include "zs/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char zd_test_which[16];
static unsigned zd_test_ms;
static pthread_once_t zd_test_once = PTHREAD_ONCE_INIT;

static void zd_test_parse(void)
{
    const char *env = getenv("ZEROD_TEST_PAUSE");

    if (env != NULL && sscanf(env, "%15[a-z]:%u", zd_test_which, &zd_test_ms) != 2) {
        zs_warn(ZS_SUB_ENGINE, "ZEROD_TEST_PAUSE='%s' is not <phase>:<ms>; ignored", env);
        zd_test_ms = 0;
    }
}

bool zd_test_phase(const char *phase)
{
    pthread_once(&zd_test_once, zd_test_parse); /* the runner and checkpoint writers ask */
    return zd_test_ms != 0 && strcmp(zd_test_which, phase) == 0;
}

void zd_test_pause(const char *phase, const char *job_id, uint64_t step)
{
    if (!zd_test_phase(phase)) {
        return;
    }
    if (job_id == NULL) {
        zs_warn(ZS_SUB_ENGINE, "ZEROD_TEST_PAUSE: %s paused %u ms", phase, zd_test_ms);
    } else {
        zs_warn(ZS_SUB_ENGINE, "ZEROD_TEST_PAUSE: %s of step %llu of job '%s' paused %u ms", phase,
                (unsigned long long)step, job_id, zd_test_ms);
    }
    usleep(zd_test_ms * 1000u);
}
