/*
 * ThreadSanitizer's suppressions for zerod, built in under ZEROD_SANITIZE=thread only
 * (daemon/CMakeLists.txt). Built in rather than a TSAN_OPTIONS file: every process a test
 * starts has that environment, and one that runs as another user (peercred.sh, the
 * disconnect matrix's refused uid) could not read a file in a private checkout.
 * Third-party code only, each with the reason.
 */
const char *__tsan_default_suppressions(void);

const char *__tsan_default_suppressions(void)
{
    /* libuv closes descriptors with a raw close(2) syscall (uv__close_nocancel) that TSan
     * cannot intercept, while it sees the accept4/socket/eventfd that created them. So TSan
     * keeps a closed descriptor's creation as the last write to its number and reports the
     * next thread that gets the number from the kernel (a memfd the runner thread creates) as
     * racing with the loop thread. Ignore the interceptors libuv itself calls; our code's
     * calls, the callbacks libuv runs included, are still checked. */
    return "called_from_lib:libuv.so.1\n";
}
