/*
 * Threads that never take an asynchronous signal. The daemon handles SIGTERM, SIGINT and SIGHUP
 * on its libuv loop (the main thread); a signal the kernel hands to any other thread instead is
 * handled there only by luck -- under ThreadSanitizer, whose handlers run deferred, it can sit
 * pending behind a poll(2) with no timeout and the stop never comes. Every thread zerod starts
 * (and every one a library starts inside a call: UCX, libmicrohttpd, CUDA, NCCL) begins with all
 * blockable signals blocked, so the main thread is the only one the kernel can choose.
 */
#ifndef ZS_THREAD_H
#define ZS_THREAD_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* pthread_create with every blockable signal blocked in the new thread; detached when asked.
 * Returns 0 or pthread_create's error number. The caller's own mask is unchanged. */
int zs_thread_start(pthread_t *thread, bool detached, void *(*fn)(void *), void *arg);

/* Blocks every blockable signal in the calling thread, saving the old mask in *old: wrap a
 * library call that starts threads (they inherit the mask), then zs_signals_restore(old). */
void zs_signals_block(sigset_t *old);
void zs_signals_restore(const sigset_t *old);

#ifdef __cplusplus
}
#endif

#endif /* ZS_THREAD_H */
