#include "zs/thread.h"

void zs_signals_block(sigset_t *old)
{
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, old);
}

void zs_signals_restore(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

int zs_thread_start(pthread_t *thread, bool detached, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    sigset_t old;
    int rc;

    rc = pthread_attr_init(&attr);
    if (rc != 0) {
        return rc;
    }
    if (detached) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    }
    /* the new thread inherits the creator's mask: block, create, restore */
    zs_signals_block(&old);
    rc = pthread_create(thread, &attr, fn, arg);
    zs_signals_restore(&old);
    pthread_attr_destroy(&attr);
    return rc;
}
