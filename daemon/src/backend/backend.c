/*
 * The CPU and CUDA backends of a job (backend/backend.h). The CUDA half is built when CMake finds
 * CUDA (ZD_HAVE_NCCL); without it a CUDA backend is refused with a message.
 */
#include "backend/backend.h"

#include "zk/cuda_share.h"
#include "zk/kernels_cuda.h"
#include "zs/error.h"
#include "zs/thread.h"
#include "zs/time.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(ZD_HAVE_NCCL)
#include <cuda_runtime.h>
#endif

#define ZD_BACKEND_REGIONS 3 /* params, slots, grads */

struct zd_backend {
    int device; /* -1: CPU */
    const zk_exec_t *exec;
    char name[16];
    char why[256]; /* the message of the last failed call */
#if defined(ZD_HAVE_NCCL)
    cudaStream_t stream;
    double *sumsq; /* ZK_CUDA_SUMSQ_WORDS doubles of device memory */
    zk_cuda_region_t regions[ZD_BACKEND_REGIONS];
    struct zd_slot_event {
        bool open;
        uint8_t handle[ZD_EVENT_HANDLE_BYTES];
        zk_cuda_event_t ev;
    } * events; /* [n_events]: the trainer's event of each slot, opened once */
    uint32_t n_events;
    uint64_t mem_free, mem_total, mem_at_ns; /* the driver's last answer, and when */
#endif
};

#if defined(ZD_HAVE_NCCL)

/* The end of a call that enqueued on the stream: wait for it, or keep zk's message. */
static zs_status_t zd_cuda_done(zd_backend_t *be, zs_status_t st)
{
    cudaError_t e;

    if (st != ZS_OK) {
        snprintf(be->why, sizeof(be->why), "%s", zk_last_error());
        return st;
    }
    e = cudaStreamSynchronize(be->stream);
    if (e != cudaSuccess) {
        snprintf(be->why, sizeof(be->why), "%s: %s (%s)", be->name, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return ZS_ERR_CUDA;
    }
    return ZS_OK;
}

static zs_status_t zd_cuda_open(zd_backend_t *be, char *err, size_t errlen)
{
    sigset_t old;
    cudaError_t e;
    int count = 0;

    for (int i = 0; i < ZD_BACKEND_REGIONS; i++) { /* zd_cuda_close may follow a failure */
        be->regions[i] = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    }
    zs_signals_block(&old); /* the driver's threads start here (zs/thread.h) */
    e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && be->device >= count) {
        zs_signals_restore(&old);
        return zs_errf(err, errlen, ZS_ERR_NO_DEVICE, "device '%s': this machine has %d GPU(s)",
                       be->name, count);
    }
    if (e == cudaSuccess) {
        e = cudaSetDevice(be->device);
    }
    if (e == cudaSuccess) {
        e = cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking);
    }
    if (e == cudaSuccess) {
        e = cudaMalloc((void **)&be->sumsq, ZK_CUDA_SUMSQ_WORDS * sizeof(double));
    }
    zs_signals_restore(&old);
    if (e != cudaSuccess) {
        return zs_errf(err, errlen,
                       e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? ZS_ERR_NO_DEVICE
                                                                                  : ZS_ERR_CUDA,
                       "device '%s': %s", be->name, cudaGetErrorString(e));
    }
    return ZS_OK;
}

static void zd_cuda_close(zd_backend_t *be)
{
    for (uint32_t i = 0; i < be->n_events; i++) {
        zk_cuda_event_cleanup(&be->events[i].ev);
    }
    free(be->events);
    for (int i = 0; i < ZD_BACKEND_REGIONS; i++) {
        zk_cuda_region_cleanup(&be->regions[i]);
    }
    if (be->sumsq != NULL) {
        cudaFree(be->sumsq);
    }
    if (be->stream != NULL) {
        cudaStreamDestroy(be->stream);
    }
}

#else /* !ZD_HAVE_NCCL */

static zs_status_t zd_cuda_open(zd_backend_t *be, char *err, size_t errlen)
{
    return zs_errf(err, errlen, ZS_ERR_UNSUPPORTED,
                   "device '%s': zerod was built without CUDA (nvcc and NCCL not found)", be->name);
}

static void zd_cuda_close(zd_backend_t *be)
{
    (void)be;
}

#endif

zs_status_t zd_backend_create(int device, const zk_exec_t *exec, zd_backend_t **be_p, char *err,
                              size_t errlen)
{
    zd_backend_t *be = calloc(1, sizeof(*be));
    zs_status_t st;

    *be_p = NULL;
    if (be == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "out of memory");
    }
    be->device = device < 0 ? -1 : device;
    be->exec = exec;
    if (be->device < 0) {
        snprintf(be->name, sizeof(be->name), "cpu");
    } else {
        snprintf(be->name, sizeof(be->name), "cuda:%d", device);
        st = zd_cuda_open(be, err, errlen);
        if (st != ZS_OK) {
            zd_cuda_close(be);
            free(be);
            return st;
        }
    }
    *be_p = be;
    return ZS_OK;
}

void zd_backend_destroy(zd_backend_t *be)
{
    if (be != NULL) {
        if (be->device >= 0) {
            zd_cuda_close(be);
        }
        free(be);
    }
}

int zd_backend_device(const zd_backend_t *be)
{
    return be->device;
}

zs_mem_type_t zd_backend_mem(const zd_backend_t *be)
{
    return be->device >= 0 ? ZS_MEM_DEVICE : ZS_MEM_HOST;
}

const char *zd_backend_name(const zd_backend_t *be)
{
    return be->name;
}

const char *zd_backend_error(const zd_backend_t *be)
{
    return be->why;
}

/* The CPU's result of a zk call: its message kept for zd_backend_error. */
static zs_status_t zd_cpu_done(zd_backend_t *be, zs_status_t st)
{
    if (st != ZS_OK) {
        snprintf(be->why, sizeof(be->why), "%s", zk_last_error());
    }
    return st;
}

zs_status_t zd_backend_alloc(zd_backend_t *be, size_t bytes, float **ptr_p)
{
    zs_status_t st;

    *ptr_p = NULL;
    if (be->device < 0) {
        st = zs_aligned_alloc(bytes, ZS_CACHE_LINE, (void **)ptr_p);
        if (st != ZS_OK) {
            snprintf(be->why, sizeof(be->why), "cannot allocate %zu bytes of host memory", bytes);
        }
        return st;
    }
#if defined(ZD_HAVE_NCCL)
    {
        cudaError_t e = cudaMalloc((void **)ptr_p, bytes > 0 ? bytes : 1);
        if (e == cudaSuccess) {
            e = cudaMemset(*ptr_p, 0, bytes);
        }
        if (e != cudaSuccess) {
            snprintf(be->why, sizeof(be->why), "%s: cannot allocate %zu bytes: %s", be->name, bytes,
                     cudaGetErrorString(e));
            if (*ptr_p != NULL) {
                cudaFree(*ptr_p);
                *ptr_p = NULL;
            }
            return e == cudaErrorMemoryAllocation ? ZS_ERR_NO_MEMORY : ZS_ERR_CUDA;
        }
        return ZS_OK;
    }
#else
    return ZS_ERR_UNSUPPORTED;
#endif
}

void zd_backend_free(zd_backend_t *be, float *ptr)
{
    if (ptr == NULL) {
        return;
    }
    if (be->device < 0) {
        zs_aligned_free(ptr);
        return;
    }
#if defined(ZD_HAVE_NCCL)
    cudaFree(ptr);
#endif
}

void zd_backend_prefault(const zd_backend_t *be, const zs_region_t *region)
{
    if (be->device < 0 && region->mem == ZS_MEM_HOST && region->addr != NULL) {
        zs_prefault(region->addr, region->size);
    }
}

zs_status_t zd_backend_region(zd_backend_t *be, const char *name, size_t size, zs_region_t *region)
{
    zs_status_t st;

    if (be->device < 0) {
        st = zs_region_create(name, size, region);
        if (st != ZS_OK) {
            snprintf(be->why, sizeof(be->why), "cannot create the %s memfd of %zu bytes: %s", name,
                     size, strerror(errno));
        }
        return st;
    }
#if defined(ZD_HAVE_NCCL)
    for (int i = 0; i < ZD_BACKEND_REGIONS; i++) {
        zk_cuda_region_t *r = &be->regions[i];
        if (r->handle != 0) {
            continue;
        }
        st = zk_cuda_region_create(be->device, size > 0 ? size : 1, r);
        if (st == ZS_OK) {
            st = zk_cuda_memset((void *)r->ptr, 0, r->mapped);
        }
        if (st != ZS_OK) {
            snprintf(be->why, sizeof(be->why), "%s region: %s", name, zk_last_error());
            zk_cuda_region_cleanup(r);
            return st;
        }
        /* a view: the fd and the mapping stay the backend's (zd_backend_region_cleanup) */
        *region =
            (zs_region_t){.fd = r->fd, .addr = (void *)r->ptr, .size = size, .mem = ZS_MEM_DEVICE};
        return ZS_OK;
    }
    snprintf(be->why, sizeof(be->why), "%s region: more than %d device regions", name,
             ZD_BACKEND_REGIONS);
    return ZS_ERR_LIMIT;
#else
    (void)name, (void)size, (void)region;
    return ZS_ERR_UNSUPPORTED;
#endif
}

void zd_backend_region_cleanup(zd_backend_t *be, zs_region_t *region)
{
    if (be == NULL || region->mem != ZS_MEM_DEVICE) {
        zs_region_cleanup(region);
        return;
    }
#if defined(ZD_HAVE_NCCL)
    for (int i = 0; i < ZD_BACKEND_REGIONS; i++) {
        if (be->regions[i].handle != 0 && (void *)be->regions[i].ptr == region->addr) {
            zk_cuda_region_cleanup(&be->regions[i]);
        }
    }
#endif
    *region = (zs_region_t)ZS_REGION_INIT;
}

zs_status_t zd_backend_sumsq(zd_backend_t *be, const float *x, size_t n, double *sumsq_p,
                             int *nonfinite_p)
{
    if (be->device < 0) {
        return zd_cpu_done(be, zk_sumsq(be->exec, x, n, sumsq_p, nonfinite_p));
    }
#if defined(ZD_HAVE_NCCL)
    {
        zs_status_t st = zd_cuda_done(be, zk_cuda_sumsq(x, n, be->sumsq, be->stream));
        if (st == ZS_OK) {
            cudaError_t e = cudaMemcpy(sumsq_p, be->sumsq, sizeof(double), cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) {
                snprintf(be->why, sizeof(be->why), "%s: sumsq: %s", be->name,
                         cudaGetErrorString(e));
                return ZS_ERR_CUDA;
            }
            *nonfinite_p = !isfinite(*sumsq_p); /* zk/kernels_cuda.h: inf or NaN exactly then */
        }
        return st;
    }
#else
    return ZS_ERR_UNSUPPORTED;
#endif
}

zs_status_t zd_backend_adam(zd_backend_t *be, const zk_adam_params_t *p, float *master, float *m,
                            float *v, float *acc, void *dst, zs_dtype_t dst_dtype, size_t n)
{
    if (be->device < 0) {
        return zd_cpu_done(be, zk_adam_step(be->exec, p, master, m, v, acc, dst, dst_dtype, n));
    }
#if defined(ZD_HAVE_NCCL)
    return zd_cuda_done(be, zk_cuda_adam_step(p, master, m, v, acc, dst, dst_dtype, n, be->stream));
#else
    return ZS_ERR_UNSUPPORTED;
#endif
}

zs_status_t zd_backend_cast(zd_backend_t *be, void *dst, zs_dtype_t dst_dtype, const void *src,
                            zs_dtype_t src_dtype, size_t n)
{
    if (be->device < 0) {
        return zd_cpu_done(be, zk_cast(be->exec, dst, dst_dtype, src, src_dtype, n));
    }
#if defined(ZD_HAVE_NCCL)
    return zd_cuda_done(be, zk_cuda_cast(dst, dst_dtype, src, src_dtype, n, be->stream));
#else
    return ZS_ERR_UNSUPPORTED;
#endif
}

zs_status_t zd_backend_zero(zd_backend_t *be, void *ptr, size_t bytes)
{
    if (be->device < 0) {
        memset(ptr, 0, bytes);
        return ZS_OK;
    }
#if defined(ZD_HAVE_NCCL)
    if (bytes == 0) {
        return ZS_OK;
    }
    if (cudaMemsetAsync(ptr, 0, bytes, be->stream) != cudaSuccess) {
        snprintf(be->why, sizeof(be->why), "%s: cudaMemsetAsync of %zu bytes failed", be->name,
                 bytes);
        return ZS_ERR_CUDA;
    }
    return zd_cuda_done(be, ZS_OK);
#else
    return ZS_ERR_UNSUPPORTED;
#endif
}

zs_status_t zd_backend_copy(zd_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (be->device < 0) {
        memcpy(dst, src, bytes);
        return ZS_OK;
    }
#if defined(ZD_HAVE_NCCL)
    if (bytes == 0) {
        return ZS_OK;
    }
    /* the default stream, then a wait for it: a host-to-device copy from pageable memory can
     * return before its DMA is done, and the kernels run on the backend's own stream */
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(NULL);
    }
    if (e != cudaSuccess) {
        snprintf(be->why, sizeof(be->why), "%s: copy of %zu bytes: %s", be->name, bytes,
                 cudaGetErrorString(e));
        return ZS_ERR_CUDA;
    }
    return ZS_OK;
#else
    (void)dst, (void)src;
    return ZS_ERR_UNSUPPORTED;
#endif
}

#if defined(ZD_HAVE_NCCL)
/* Slot `slot`'s opened event for `handle` (a new handle replaces the old event). */
static zs_status_t zd_cuda_slot_event(zd_backend_t *be, uint32_t slot, const uint8_t *handle,
                                      zk_cuda_event_t **ev_p)
{
    struct zd_slot_event *e;

    if (slot >= be->n_events) {
        struct zd_slot_event *grown = realloc(be->events, (slot + 1) * sizeof(*grown));
        if (grown == NULL) {
            snprintf(be->why, sizeof(be->why), "out of memory");
            return ZS_ERR_NO_MEMORY;
        }
        memset(grown + be->n_events, 0, (slot + 1 - be->n_events) * sizeof(*grown));
        be->events = grown;
        be->n_events = slot + 1;
    }
    e = &be->events[slot];
    if (e->open && memcmp(e->handle, handle, ZD_EVENT_HANDLE_BYTES) != 0) {
        zk_cuda_event_cleanup(&e->ev);
        e->open = false;
    }
    if (!e->open) {
        zs_status_t st = zk_cuda_event_open(be->device, handle, &e->ev);
        if (st != ZS_OK) {
            snprintf(be->why, sizeof(be->why), "the trainer's event: %s", zk_last_error());
            return st;
        }
        memcpy(e->handle, handle, ZD_EVENT_HANDLE_BYTES);
        e->open = true;
    }
    *ev_p = &e->ev;
    return ZS_OK;
}
#endif

zs_status_t zd_backend_wait_event(zd_backend_t *be, uint32_t slot, const uint8_t *handle,
                                  uint64_t timeout_ns)
{
#if defined(ZD_HAVE_NCCL)
    uint64_t deadline = zs_time_now_ns() + timeout_ns;
    zk_cuda_event_t *ev = NULL;
    zs_status_t st;

    if (be->device < 0) {
        snprintf(be->why, sizeof(be->why), "no CUDA events on the CPU backend");
        return ZS_ERR_INVALID;
    }
    st = zd_cuda_slot_event(be, slot, handle, &ev);
    if (st != ZS_OK) {
        return st;
    }
    for (;;) { /* the runner polls: a trainer's stuck stream cannot hold it past the deadline */
        cudaError_t e = cudaEventQuery((cudaEvent_t)ev->event);
        if (e == cudaSuccess) {
            return ZS_OK;
        }
        if (e != cudaErrorNotReady) {
            snprintf(be->why, sizeof(be->why), "the trainer's event: %s", cudaGetErrorString(e));
            return ZS_ERR_CUDA;
        }
        if (zs_time_now_ns() > deadline) {
            snprintf(be->why, sizeof(be->why),
                     "the trainer's copy into the slot did not complete within %.1f s "
                     "(collective_timeout)",
                     (double)timeout_ns * 1e-9);
            return ZS_ERR_TIMEOUT;
        }
        sched_yield();
    }
#else
    (void)slot, (void)handle, (void)timeout_ns;
    snprintf(be->why, sizeof(be->why), "zerod was built without CUDA");
    return ZS_ERR_UNSUPPORTED;
#endif
}

void zd_backend_mem_info(zd_backend_t *be, uint64_t *free_p, uint64_t *total_p)
{
    *free_p = *total_p = 0;
    if (be == NULL || be->device < 0) {
        return;
    }
#if defined(ZD_HAVE_NCCL)
    /* asked for at every published status, which is twice per request: the driver is asked
     * at most once a second */
    uint64_t now = zs_time_now_ns();
    if (be->mem_at_ns == 0 || now - be->mem_at_ns >= 1000000000ull) {
        size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
            be->mem_free = f;
            be->mem_total = t;
        }
        be->mem_at_ns = now;
    }
    *free_p = be->mem_free;
    *total_p = be->mem_total;
#endif
}
