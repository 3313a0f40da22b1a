/*
 * zk_pool_t: a fixed set of pthreads that split one call into contiguous chunks. The calling
 * thread runs chunk 0 and then waits only for its own workers. No allocation per call.
 */
#include "zk_int.h"
#include "zs/thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ZK_POOL_MAX_THREADS 1024

struct zk_pool {
    unsigned threads;         /* workers + the calling thread */
    pthread_t *workers;       /* threads - 1 */
    unsigned started;         /* workers actually started */
    pthread_mutex_t run_lock; /* one call at a time */
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    uint64_t generation; /* bumped for every call */
    unsigned pending;    /* workers still running the current call */
    int stop;
    /* the current call */
    zk_pool_fn_t fn;
    void *arg;
    size_t n;
    size_t chunk;
};

typedef struct zk_pool_worker_arg {
    zk_pool_t *pool;
    unsigned index;
} zk_pool_worker_arg_t;

static void zk_pool_run_chunk(zk_pool_fn_t fn, void *arg, unsigned w, size_t n, size_t chunk)
{
    size_t begin = (size_t)w * chunk;
    size_t end;

    if (begin >= n) {
        return;
    }
    end = (n - begin > chunk) ? begin + chunk : n;
    fn(arg, w, begin, end);
}

static void *zk_pool_main(void *p)
{
    zk_pool_t *pool = (zk_pool_t *)p;
    unsigned index;
    uint64_t seen;

    pthread_mutex_lock(&pool->lock);
    index = ++pool->started; /* 1 .. threads-1 */
    seen = pool->generation;
    pthread_cond_broadcast(&pool->done_cv);
    for (;;) {
        zk_pool_fn_t fn;
        void *arg;
        size_t n, chunk;

        while (pool->generation == seen && !pool->stop) {
            pthread_cond_wait(&pool->work_cv, &pool->lock);
        }
        if (pool->stop) {
            break;
        }
        seen = pool->generation;
        fn = pool->fn;
        arg = pool->arg;
        n = pool->n;
        chunk = pool->chunk;
        pthread_mutex_unlock(&pool->lock);

        zk_pool_run_chunk(fn, arg, index, n, chunk);

        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0) {
            pthread_cond_signal(&pool->done_cv);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

static void zk_pool_stop(zk_pool_t *pool, unsigned joinable)
{
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < joinable; i++) {
        pthread_join(pool->workers[i], NULL);
    }
}

zs_status_t zk_pool_create(unsigned threads, zk_pool_t **pool_p)
{
    zk_pool_t *pool;
    unsigned created = 0;
    zs_status_t status;
    int ret = 0;

    if (pool_p == NULL || threads == 0 || threads > ZK_POOL_MAX_THREADS) {
        return zk_error_set(ZS_ERR_INVALID, "zk_pool_create: threads must be 1..%u, got %u",
                            ZK_POOL_MAX_THREADS, threads);
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        status = zk_error_set(ZS_ERR_NO_MEMORY, "zk_pool_create: out of memory");
        goto err;
    }
    pool->threads = threads;
    if (threads > 1) {
        pool->workers = calloc(threads - 1, sizeof(pthread_t));
        if (pool->workers == NULL) {
            status = zk_error_set(ZS_ERR_NO_MEMORY, "zk_pool_create: out of memory");
            goto err_free_pool;
        }
    }
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);

    /* workers never take signals: the daemon handles them on its main thread */
    for (created = 0; created + 1 < threads; created++) {
        ret = zs_thread_start(&pool->workers[created], false, zk_pool_main, pool);
        if (ret != 0) {
            break;
        }
    }
    if (ret != 0) {
        status =
            zk_error_set(ZS_ERR_NO_MEMORY, "zk_pool_create: pthread_create: %s", strerror(ret));
        goto err_stop_workers;
    }

    /* wait until every worker has recorded the starting generation */
    pthread_mutex_lock(&pool->lock);
    while (pool->started != created) {
        pthread_cond_wait(&pool->done_cv, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    *pool_p = pool;
    return ZS_OK;

err_stop_workers:
    zk_pool_stop(pool, created);
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->workers);
err_free_pool:
    free(pool);
err:
    return status;
}

void zk_pool_destroy(zk_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    zk_pool_stop(pool, pool->threads - 1);
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->workers);
    free(pool);
}

unsigned zk_pool_threads(const zk_pool_t *pool)
{
    return pool != NULL ? pool->threads : 1;
}

zs_status_t zk_pool_run(zk_pool_t *pool, size_t n, size_t grain, zk_pool_fn_t fn, void *arg)
{
    size_t chunk;

    if (fn == NULL || grain == 0) {
        return zk_error_set(ZS_ERR_INVALID, "zk_pool_run: fn is NULL or grain is 0");
    }
    if (n == 0) {
        return ZS_OK;
    }
    if (pool == NULL || pool->threads == 1 || n <= grain) {
        fn(arg, 0, 0, n);
        return ZS_OK;
    }

    /* ceil(n / threads) rounded up to the grain: contiguous, aligned chunks */
    chunk = n / pool->threads + (n % pool->threads != 0);
    chunk = (chunk + grain - 1) / grain * grain;

    pthread_mutex_lock(&pool->run_lock);
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    pool->chunk = chunk;
    pool->pending = pool->threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->lock);

    zk_pool_run_chunk(fn, arg, 0, n, chunk);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending != 0) {
        pthread_cond_wait(&pool->done_cv, &pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&pool->run_lock);
    return ZS_OK;
}
