/* libzc's error buffer (client/src/error.c): zc_fail, zc_fail_prefix, zc_last_error. */
#include "zc_int.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

Test(zc_error, fail_keeps_the_message_and_returns_the_status)
{
    zc_error_clear();
    cr_assert_str_eq(zc_last_error(), "");
    cr_assert_eq(zc_fail(ZC_ERR_CONFIG, "stage %d is not supported", 3), ZC_ERR_CONFIG);
    cr_assert_str_eq(zc_last_error(), "stage 3 is not supported");
    zc_error_clear();
    cr_assert_str_eq(zc_last_error(), "");
}

Test(zc_error, fail_passes_a_status_it_does_not_know_through)
{
    /* a newer daemon may send a status this libzc has no name for */
    cr_assert_eq(zc_fail(-1000, "from the future"), -1000);
    cr_assert_str_eq(zc_status_name(-1000), "UNKNOWN");
}

Test(zc_error, prefix_names_the_call)
{
    zc_error_clear();
    cr_assert_eq(zc_fail_prefix(ZC_ERR_TIMEOUT, "step"), ZC_ERR_TIMEOUT);
    cr_assert_str_eq(zc_last_error(), "step: timed out");
    zc_fail(ZC_ERR_CLOSED, "daemon closed the connection");
    zc_fail_prefix(ZC_ERR_CLOSED, "detach");
    cr_assert_str_eq(zc_last_error(), "detach: daemon closed the connection");
}

Test(zc_error, result_status_names_the_status_and_the_daemon_message)
{
    Zerod__Ipc__V1__Result r = ZEROD__IPC__V1__RESULT__INIT;

    cr_assert_eq(zc_result_status(NULL, "attach"), ZC_OK);
    r.status = ZC_ERR_BUSY;
    r.message = "job j1 is attached by another session";
    cr_assert_eq(zc_result_status(&r, "attach"), ZC_ERR_BUSY);
    cr_assert_str_eq(zc_last_error(), "attach: ERR_BUSY: job j1 is attached by another session");
    r.message = "";
    zc_result_status(&r, "attach");
    cr_assert_str_eq(zc_last_error(), "attach: ERR_BUSY: busy");
}

static void *zc_error_other_thread(void *arg)
{
    (void)arg;
    if (zc_last_error()[0] != '\0') {
        return (void *)1;
    }
    zc_fail(ZC_ERR_IO, "from the other thread");
    return NULL;
}

Test(zc_error, last_error_is_per_thread)
{
    pthread_t t;
    void *ret = (void *)2;

    zc_fail(ZC_ERR_INVALID, "from the test thread");
    cr_assert_eq(pthread_create(&t, NULL, zc_error_other_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_null(ret, "the other thread saw this thread's message");
    cr_assert_str_eq(zc_last_error(), "from the test thread");
}
