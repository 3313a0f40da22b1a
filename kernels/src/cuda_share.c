/*
 * Device regions and interprocess events (zk/cuda_share.h). The VMM calls are the driver's,
 * looked up once through the runtime so that nothing links libcuda.
 */
#include "zk/cuda_share.h"
#include "zk_int.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

zs_status_t zk_cuda_round_granularity(size_t size, size_t gran, size_t *out_p)
{
    size_t rem;

    if (size == 0) {
        return zk_error_set(ZS_ERR_INVALID, "device region: size 0");
    }
    if (gran == 0 || (gran & (gran - 1)) != 0) {
        return zk_error_set(ZS_ERR_INVALID, "device region: granularity %zu is not a power of two",
                            gran);
    }
    rem = size & (gran - 1);
    if (rem == 0) {
        *out_p = size;
        return ZS_OK;
    }
    if (size > SIZE_MAX - (gran - rem)) {
        return zk_error_set(ZS_ERR_OVERFLOW,
                            "device region: size %zu rounded up to granularity %zu overflows", size,
                            gran);
    }
    *out_p = size + (gran - rem);
    return ZS_OK;
}

#if defined(ZK_HAVE_CUDA)

#include "zs/thread.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>

_Static_assert(sizeof(cudaIpcEventHandle_t) == ZK_CUDA_EVENT_HANDLE_BYTES, "event handle size");
_Static_assert(sizeof(CUmemGenericAllocationHandle) == sizeof(unsigned long long), "handle");

/* The driver functions this file calls, resolved once. */
static struct {
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                          unsigned long long);
    CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*error_name)(CUresult, const char **);
} zk_drv;
static pthread_once_t zk_drv_once = PTHREAD_ONCE_INIT;
static zs_status_t zk_drv_status = ZS_ERR_CUDA;
static char zk_drv_why[160];

static int zk_drv_get(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, CUDA_VERSION, cudaEnableDefault, &q);

    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *fn == NULL) {
        snprintf(zk_drv_why, sizeof(zk_drv_why), "driver entry point %s not found (%s)", name,
                 e != cudaSuccess ? cudaGetErrorString(e) : "symbol or version missing");
        return -1;
    }
    return 0;
}

static void zk_drv_load(void)
{
    struct {
        const char *name;
        void **fn;
    } want[] = {
        {"cuMemGetAllocationGranularity", (void **)&zk_drv.granularity},
        {"cuMemCreate", (void **)&zk_drv.create},
        {"cuMemRelease", (void **)&zk_drv.release},
        {"cuMemExportToShareableHandle", (void **)&zk_drv.export_fd},
        {"cuMemImportFromShareableHandle", (void **)&zk_drv.import_fd},
        {"cuMemAddressReserve", (void **)&zk_drv.reserve},
        {"cuMemAddressFree", (void **)&zk_drv.address_free},
        {"cuMemMap", (void **)&zk_drv.map},
        {"cuMemUnmap", (void **)&zk_drv.unmap},
        {"cuMemSetAccess", (void **)&zk_drv.set_access},
        {"cuGetErrorName", (void **)&zk_drv.error_name},
    };
    int count = 0;
    sigset_t old;
    cudaError_t e;

    zs_signals_block(&old); /* the driver starts its threads here (zs/thread.h) */
    e = cudaGetDeviceCount(&count);
    zs_signals_restore(&old);
    if (e != cudaSuccess || count == 0) {
        zk_drv_status = ZS_ERR_NO_DEVICE;
        snprintf(zk_drv_why, sizeof(zk_drv_why), "no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
        return;
    }
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        if (zk_drv_get(want[i].name, want[i].fn) != 0) {
            return;
        }
    }
    zk_drv_status = ZS_OK;
}

static zs_status_t zk_drv_ready(const char *fn)
{
    pthread_once(&zk_drv_once, zk_drv_load);
    if (zk_drv_status != ZS_OK) {
        return zk_error_set(zk_drv_status, "%s: %s", fn, zk_drv_why);
    }
    return ZS_OK;
}

static zs_status_t zk_drv_err(const char *fn, const char *call, CUresult r)
{
    const char *name = NULL;

    if (zk_drv.error_name == NULL || zk_drv.error_name(r, &name) != CUDA_SUCCESS) {
        name = "unknown";
    }
    return zk_error_set(r == CUDA_ERROR_OUT_OF_MEMORY ? ZS_ERR_NO_MEMORY : ZS_ERR_CUDA,
                        "%s: %s failed: %s (%d)", fn, call, name, (int)r);
}

static zs_status_t zk_rt_err(const char *fn, const char *call, cudaError_t e)
{
    return zk_error_set(e == cudaErrorMemoryAllocation ? ZS_ERR_NO_MEMORY : ZS_ERR_CUDA,
                        "%s: %s failed: %s (%s)", fn, call, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

/* The primary context of `device` current on this thread (the driver calls need one). */
static zs_status_t zk_use_device(const char *fn, int device)
{
    cudaError_t e;
    sigset_t old;

    if (device < 0) {
        return zk_error_set(ZS_ERR_INVALID, "%s: device %d", fn, device);
    }
    zs_signals_block(&old);
    e = cudaSetDevice(device);
    if (e == cudaSuccess) {
        e = cudaFree(NULL); /* creates the primary context if this is the first call */
    }
    zs_signals_restore(&old);
    if (e != cudaSuccess) {
        return zk_error_set(e == cudaErrorInvalidDevice ? ZS_ERR_NO_DEVICE : ZS_ERR_CUDA,
                            "%s: cuda:%d: %s", fn, device, cudaGetErrorString(e));
    }
    return ZS_OK;
}

static void zk_region_prop(int device, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = device;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

zs_status_t zk_cuda_region_granularity(int device, size_t *gran_p)
{
    CUmemAllocationProp prop;
    CUresult r;
    zs_status_t st = zk_drv_ready("zk_cuda_region_granularity");

    if (st == ZS_OK) {
        st = zk_use_device("zk_cuda_region_granularity", device);
    }
    if (st != ZS_OK) {
        return st;
    }
    zk_region_prop(device, &prop);
    r = zk_drv.granularity(gran_p, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS) {
        return zk_drv_err("zk_cuda_region_granularity", "cuMemGetAllocationGranularity", r);
    }
    return ZS_OK;
}

/* Reserve, map and open read-write access to region->handle (region->mapped bytes). */
static zs_status_t zk_region_map(const char *fn, zk_cuda_region_t *region)
{
    CUdeviceptr ptr = 0;
    CUmemAccessDesc access;
    CUresult r;

    r = zk_drv.reserve(&ptr, region->mapped, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        return zk_drv_err(fn, "cuMemAddressReserve", r);
    }
    r = zk_drv.map(ptr, region->mapped, 0, (CUmemGenericAllocationHandle)region->handle, 0);
    if (r != CUDA_SUCCESS) {
        zk_drv.address_free(ptr, region->mapped);
        return zk_drv_err(fn, "cuMemMap", r);
    }
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = region->device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = zk_drv.set_access(ptr, region->mapped, &access, 1);
    if (r != CUDA_SUCCESS) {
        zk_drv.unmap(ptr, region->mapped);
        zk_drv.address_free(ptr, region->mapped);
        return zk_drv_err(fn, "cuMemSetAccess", r);
    }
    region->ptr = (uintptr_t)ptr;
    return ZS_OK;
}

/* Checks, the device and the rounded size shared by create and import. */
static zs_status_t zk_region_begin(const char *fn, int device, size_t size,
                                   zk_cuda_region_t *region)
{
    size_t gran = 0;
    zs_status_t st;

    if (region == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "%s: region is NULL", fn);
    }
    *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    if (size == 0) {
        return zk_error_set(ZS_ERR_INVALID, "%s: size 0", fn);
    }
    st = zk_cuda_region_granularity(device, &gran);
    if (st == ZS_OK) {
        st = zk_cuda_round_granularity(size, gran, &region->mapped);
    }
    if (st != ZS_OK) {
        return st;
    }
    region->device = device;
    region->size = size;
    return ZS_OK;
}

zs_status_t zk_cuda_region_create(int device, size_t size, zk_cuda_region_t *region)
{
    const char *fn = "zk_cuda_region_create";
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h = 0;
    int fd = -1;
    CUresult r;
    zs_status_t st = zk_region_begin(fn, device, size, region);

    if (st != ZS_OK) {
        return st;
    }
    zk_region_prop(device, &prop);
    r = zk_drv.create(&h, region->mapped, &prop, 0);
    if (r != CUDA_SUCCESS) {
        st = zk_drv_err(fn, "cuMemCreate", r);
        *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
        return st;
    }
    region->handle = (unsigned long long)h;
    r = zk_drv.export_fd(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
        st = zk_drv_err(fn, "cuMemExportToShareableHandle", r);
    } else {
        region->fd = fd;
        st = zk_region_map(fn, region);
    }
    if (st != ZS_OK) {
        zk_cuda_region_cleanup(region);
    }
    return st;
}

zs_status_t zk_cuda_region_import(int device, int fd, size_t size, zk_cuda_region_t *region)
{
    const char *fn = "zk_cuda_region_import";
    CUmemGenericAllocationHandle h = 0;
    CUresult r;
    zs_status_t st;

    if (fd < 0) {
        return zk_error_set(ZS_ERR_INVALID, "%s: fd %d", fn, fd);
    }
    st = zk_region_begin(fn, device, size, region);
    if (st != ZS_OK) {
        return st;
    }
    r = zk_drv.import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
        return zk_drv_err(fn, "cuMemImportFromShareableHandle", r);
    }
    region->handle = (unsigned long long)h;
    st = zk_region_map(fn, region);
    if (st != ZS_OK) {
        zk_cuda_region_cleanup(region);
        return st;
    }
    close(fd);
    return ZS_OK;
}

void zk_cuda_region_cleanup(zk_cuda_region_t *region)
{
    if (region == NULL) {
        return;
    }
    if (region->ptr != 0) {
        zk_drv.unmap((CUdeviceptr)region->ptr, region->mapped);
        zk_drv.address_free((CUdeviceptr)region->ptr, region->mapped);
    }
    if (region->handle != 0) {
        zk_drv.release((CUmemGenericAllocationHandle)region->handle);
    }
    if (region->fd >= 0) {
        close(region->fd);
    }
    *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
}

zs_status_t zk_cuda_copy(void *dst, const void *src, size_t bytes)
{
    cudaError_t e;

    if (bytes == 0) {
        return ZS_OK;
    }
    if (dst == NULL || src == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_copy: NULL buffer");
    }
    e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    return e == cudaSuccess ? ZS_OK : zk_rt_err("zk_cuda_copy", "cudaMemcpy", e);
}

zs_status_t zk_cuda_memset(void *dst, int value, size_t bytes)
{
    cudaError_t e;

    if (bytes == 0) {
        return ZS_OK;
    }
    if (dst == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_memset: NULL buffer");
    }
    e = cudaMemset(dst, value, bytes);
    return e == cudaSuccess ? ZS_OK : zk_rt_err("zk_cuda_memset", "cudaMemset", e);
}

zs_status_t zk_cuda_wait(void)
{
    cudaError_t e = cudaStreamSynchronize(NULL);

    return e == cudaSuccess ? ZS_OK : zk_rt_err("zk_cuda_wait", "cudaStreamSynchronize", e);
}

zs_status_t zk_cuda_event_create(int device, zk_cuda_event_t *event)
{
    const char *fn = "zk_cuda_event_create";
    cudaEvent_t ev = NULL;
    cudaIpcEventHandle_t h;
    cudaError_t e;
    zs_status_t st;

    if (event == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "%s: event is NULL", fn);
    }
    memset(event, 0, sizeof(*event));
    st = zk_use_device(fn, device);
    if (st != ZS_OK) {
        return st;
    }
    e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess);
    if (e != cudaSuccess) {
        return zk_rt_err(fn, "cudaEventCreateWithFlags", e);
    }
    e = cudaIpcGetEventHandle(&h, ev);
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return zk_rt_err(fn, "cudaIpcGetEventHandle", e);
    }
    event->event = ev;
    memcpy(event->handle, &h, sizeof(h));
    return ZS_OK;
}

zs_status_t zk_cuda_event_open(int device, const unsigned char handle[ZK_CUDA_EVENT_HANDLE_BYTES],
                               zk_cuda_event_t *event)
{
    const char *fn = "zk_cuda_event_open";
    cudaIpcEventHandle_t h;
    cudaEvent_t ev = NULL;
    cudaError_t e;
    zs_status_t st;

    if (event == NULL || handle == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "%s: NULL argument", fn);
    }
    memset(event, 0, sizeof(*event));
    st = zk_use_device(fn, device);
    if (st != ZS_OK) {
        return st;
    }
    memcpy(&h, handle, sizeof(h));
    e = cudaIpcOpenEventHandle(&ev, h);
    if (e != cudaSuccess) {
        return zk_rt_err(fn, "cudaIpcOpenEventHandle", e);
    }
    event->event = ev;
    memcpy(event->handle, handle, sizeof(h));
    return ZS_OK;
}

zs_status_t zk_cuda_event_record(const zk_cuda_event_t *event, zk_cuda_stream_t stream)
{
    cudaError_t e;

    if (event == NULL || event->event == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_event_record: no event");
    }
    e = cudaEventRecord((cudaEvent_t)event->event, (cudaStream_t)stream);
    return e == cudaSuccess ? ZS_OK : zk_rt_err("zk_cuda_event_record", "cudaEventRecord", e);
}

zs_status_t zk_cuda_stream_wait_event(zk_cuda_stream_t stream, const zk_cuda_event_t *event)
{
    cudaError_t e;

    if (event == NULL || event->event == NULL) {
        return zk_error_set(ZS_ERR_INVALID, "zk_cuda_stream_wait_event: no event");
    }
    e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event->event, 0);
    return e == cudaSuccess ? ZS_OK
                            : zk_rt_err("zk_cuda_stream_wait_event", "cudaStreamWaitEvent", e);
}

void zk_cuda_event_cleanup(zk_cuda_event_t *event)
{
    if (event != NULL && event->event != NULL) {
        cudaEventDestroy((cudaEvent_t)event->event);
        memset(event, 0, sizeof(*event));
    }
}

#else /* !ZK_HAVE_CUDA */

#include <unistd.h>

#define ZK_NO_CUDA(fn)                                                                             \
    zk_error_set(ZS_ERR_UNSUPPORTED, "%s: zerod was built without CUDA (nvcc not found)", fn)

zs_status_t zk_cuda_region_granularity(int device, size_t *gran_p)
{
    (void)device, (void)gran_p;
    return ZK_NO_CUDA("zk_cuda_region_granularity");
}

zs_status_t zk_cuda_region_create(int device, size_t size, zk_cuda_region_t *region)
{
    (void)device, (void)size;
    if (region != NULL) {
        *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    }
    return ZK_NO_CUDA("zk_cuda_region_create");
}

zs_status_t zk_cuda_region_import(int device, int fd, size_t size, zk_cuda_region_t *region)
{
    (void)device, (void)fd, (void)size;
    if (region != NULL) {
        *region = (zk_cuda_region_t)ZK_CUDA_REGION_INIT;
    }
    return ZK_NO_CUDA("zk_cuda_region_import");
}

void zk_cuda_region_cleanup(zk_cuda_region_t *region)
{
    if (region != NULL && region->fd >= 0) {
        close(region->fd);
        region->fd = -1;
    }
}

zs_status_t zk_cuda_copy(void *dst, const void *src, size_t bytes)
{
    (void)dst, (void)src, (void)bytes;
    return ZK_NO_CUDA("zk_cuda_copy");
}

zs_status_t zk_cuda_memset(void *dst, int value, size_t bytes)
{
    (void)dst, (void)value, (void)bytes;
    return ZK_NO_CUDA("zk_cuda_memset");
}

zs_status_t zk_cuda_wait(void)
{
    return ZK_NO_CUDA("zk_cuda_wait");
}

zs_status_t zk_cuda_event_create(int device, zk_cuda_event_t *event)
{
    (void)device, (void)event;
    return ZK_NO_CUDA("zk_cuda_event_create");
}

zs_status_t zk_cuda_event_open(int device, const unsigned char handle[ZK_CUDA_EVENT_HANDLE_BYTES],
                               zk_cuda_event_t *event)
{
    (void)device, (void)handle, (void)event;
    return ZK_NO_CUDA("zk_cuda_event_open");
}

zs_status_t zk_cuda_event_record(const zk_cuda_event_t *event, zk_cuda_stream_t stream)
{
    (void)event, (void)stream;
    return ZK_NO_CUDA("zk_cuda_event_record");
}

zs_status_t zk_cuda_stream_wait_event(zk_cuda_stream_t stream, const zk_cuda_event_t *event)
{
    (void)stream, (void)event;
    return ZK_NO_CUDA("zk_cuda_stream_wait_event");
}

void zk_cuda_event_cleanup(zk_cuda_event_t *event)
{
    (void)event;
}

#endif
