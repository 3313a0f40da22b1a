#include "zs/error.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

Test(zs_errf, formats_into_the_buffer_and_returns_the_status)
{
    char err[64] = "old";

    cr_assert_eq(zs_errf(err, sizeof(err), ZS_ERR_INVALID, "world %u of %d", 5u, 4),
                 ZS_ERR_INVALID);
    cr_assert_str_eq(err, "world 5 of 4");
    cr_assert_eq(zs_errf(err, sizeof(err), ZS_OK, "%s", "fine"), ZS_OK);
    cr_assert_str_eq(err, "fine");
}

Test(zs_errf, truncates_and_terminates_a_long_message)
{
    char err[8];

    memset(err, 'x', sizeof(err));
    cr_assert_eq(zs_errf(err, sizeof(err), ZS_ERR_LIMIT, "%s", "0123456789abcdef"), ZS_ERR_LIMIT);
    cr_assert_str_eq(err, "0123456");
}

Test(zs_errf, writes_nothing_without_a_buffer)
{
    char err[4] = "abc";

    cr_assert_eq(zs_errf(NULL, 64, ZS_ERR_IO, "%s", "dropped"), ZS_ERR_IO);
    cr_assert_eq(zs_errf(err, 0, ZS_ERR_IO, "%s", "dropped"), ZS_ERR_IO);
    cr_assert_str_eq(err, "abc");
}

Test(zs_lasterr, starts_empty_and_keeps_the_last_message)
{
    static zs_lasterr_t le;

    cr_assert_str_eq(zs_lasterr_get(&le), "");
    cr_assert_eq(zs_lasterr_set(&le, ZS_ERR_BUSY, "first %d", 1), ZS_ERR_BUSY);
    cr_assert_eq(zs_lasterr_set(&le, ZS_ERR_TIMEOUT, "second %d", 2), ZS_ERR_TIMEOUT);
    cr_assert_str_eq(zs_lasterr_get(&le), "second 2");
    zs_lasterr_clear(&le);
    cr_assert_str_eq(zs_lasterr_get(&le), "");
}

Test(zs_lasterr, prefix_names_the_call_before_the_kept_message)
{
    static zs_lasterr_t le;

    cr_assert_eq(zs_lasterr_set(&le, ZS_ERR_CLOSED, "daemon closed the connection"), ZS_ERR_CLOSED);
    cr_assert_eq(zs_lasterr_prefix(&le, ZS_ERR_CLOSED, "step"), ZS_ERR_CLOSED);
    cr_assert_str_eq(zs_lasterr_get(&le), "step: daemon closed the connection");
}

Test(zs_lasterr, prefix_without_a_message_says_the_status)
{
    static zs_lasterr_t le;

    cr_assert_eq(zs_lasterr_prefix(&le, ZS_ERR_PEER_LOST, "detach"), ZS_ERR_PEER_LOST);
    cr_assert_str_eq(zs_lasterr_get(&le), "detach: peer lost");
}

Test(zs_lasterr, prefix_of_a_full_message_stays_terminated)
{
    static zs_lasterr_t le;
    char longmsg[ZS_ERRMSG_LEN + 16];

    memset(longmsg, 'm', sizeof(longmsg) - 1);
    longmsg[sizeof(longmsg) - 1] = '\0';
    zs_lasterr_set(&le, ZS_ERR_IO, "%s", longmsg);
    cr_assert_eq(strlen(zs_lasterr_get(&le)), ZS_ERRMSG_LEN - 1);
    zs_lasterr_prefix(&le, ZS_ERR_IO, "attach");
    cr_assert_eq(strlen(zs_lasterr_get(&le)), ZS_ERRMSG_LEN - 1);
    cr_assert_eq(strncmp(zs_lasterr_get(&le), "attach: mmm", 11), 0);
}

static _Thread_local zs_lasterr_t test_lasterr;

static void *test_lasterr_other_thread(void *arg)
{
    (void)arg;
    /* a fresh thread starts with its own, empty message */
    if (zs_lasterr_get(&test_lasterr)[0] != '\0') {
        return (void *)1;
    }
    zs_lasterr_set(&test_lasterr, ZS_ERR_IO, "from the other thread");
    return NULL;
}

Test(zs_lasterr, thread_local_record_is_one_per_thread)
{
    pthread_t t;
    void *ret = (void *)2;

    zs_lasterr_set(&test_lasterr, ZS_ERR_INVALID, "from the test thread");
    cr_assert_eq(pthread_create(&t, NULL, test_lasterr_other_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, &ret), 0);
    cr_assert_null(ret, "the other thread saw this thread's message");
    cr_assert_str_eq(zs_lasterr_get(&test_lasterr), "from the test thread");
}
