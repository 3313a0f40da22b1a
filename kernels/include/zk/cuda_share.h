/*
 * Device memory and events shared between the processes of one GPU: how a daemon on the CUDA
 * backend hands its params region and grad slots to its trainers (docs/design-notes.md,
 * "Device regions").
 *
 * A region is a CUDA virtual-memory allocation (cuMemCreate) exported as a POSIX file
 * descriptor. The fd travels over the Unix socket with SCM_RIGHTS exactly like a memfd; the
 * other process imports it, reserves an address range, maps it and sets read-write access.
 * Nothing is named in /dev/shm and no cudaIpcGetMemHandle is used, so a region lives exactly as
 * long as some process holds its fd or a mapping.
 *
 * An event is an interprocess CUDA event (timing off): one process records it on its stream
 * and sends a message; the other makes its stream wait on it. Neither CPU waits.
 *
 * The driver's functions are looked up through the runtime (cudaGetDriverEntryPointByVersion),
 * so nothing links libcuda and a machine without a GPU still loads every binary. Without CUDA
 * in the build every call returns ZS_ERR_UNSUPPORTED; without a device, ZS_ERR_NO_DEVICE. The
 * message of a failed call is in zk_last_error(). Never prints.
 */
#ifndef ZK_CUDA_SHARE_H
#define ZK_CUDA_SHARE_H

#include "zk/kernels_cuda.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zk_cuda_region {
    int fd;                    /* creator: the exported handle (cleanup closes it); else -1 */
    int device;                /* CUDA ordinal, -1 when none */
    unsigned long long handle; /* CUmemGenericAllocationHandle; 0 when none */
    uintptr_t ptr;             /* device address of this process's mapping; 0 when none */
    size_t size;               /* bytes asked for */
    size_t mapped;             /* size rounded up to the allocation granularity */
} zk_cuda_region_t;

#define ZK_CUDA_REGION_INIT                                                                        \
    {                                                                                              \
        .fd = -1, .device = -1, .handle = 0, .ptr = 0, .size = 0, .mapped = 0                      \
    }

/* size rounded up to a multiple of gran, which must be a power of two (the driver's
 * granularities are). ZS_ERR_INVALID for size 0 or a bad gran, ZS_ERR_OVERFLOW past SIZE_MAX.
 * Pure arithmetic: works in every build. */
zs_status_t zk_cuda_round_granularity(size_t size, size_t gran, size_t *out_p);

/* The allocation granularity of an exportable region on `device` (what create and import
 * round to; both sides of one GPU get the same value). */
zs_status_t zk_cuda_region_granularity(int device, size_t *gran_p);

/* Allocate size bytes (rounded up) of device memory on `device`, map it read-write in this
 * process, and export it: region->fd is the handle to send. The memory is not cleared. */
zs_status_t zk_cuda_region_create(int device, size_t size, zk_cuda_region_t *region);

/* Map a region received as an fd, of `size` bytes as its creator asked for. Closes fd on
 * success (the mapping keeps the memory); on failure the fd is still the caller's. */
zs_status_t zk_cuda_region_import(int device, int fd, size_t size, zk_cuda_region_t *region);

/* Unmap, release and close; safe on a cleared or never-created region. */
void zk_cuda_region_cleanup(zk_cuda_region_t *region);

/* A copy of `bytes` between any two of host and device memory (cudaMemcpyDefault: the driver
 * tells them apart), and a fill of device memory, on the legacy default stream: the runtime
 * does not promise either complete on return (a memset, a device-to-device copy, the DMA of a
 * host-to-device copy after its staging), so a caller that hands the memory on calls
 * zk_cuda_wait first. For set-up and the trainer's copies; the daemon's step enqueues on its
 * own stream. */
zs_status_t zk_cuda_copy(void *dst, const void *src, size_t bytes);
zs_status_t zk_cuda_memset(void *dst, int value, size_t bytes);
/* Wait until the work this thread's device has on the legacy default stream is done. */
zs_status_t zk_cuda_wait(void);

#define ZK_CUDA_EVENT_HANDLE_BYTES 64

typedef struct zk_cuda_event {
    void *event;                                      /* cudaEvent_t; NULL when none */
    unsigned char handle[ZK_CUDA_EVENT_HANDLE_BYTES]; /* cudaIpcEventHandle_t, to send */
} zk_cuda_event_t;

/* A new interprocess event on `device` (timing disabled, as interprocess events must be). */
zs_status_t zk_cuda_event_create(int device, zk_cuda_event_t *event);
/* Open an event another process created, from the handle it sent. */
zs_status_t zk_cuda_event_open(int device, const unsigned char handle[ZK_CUDA_EVENT_HANDLE_BYTES],
                               zk_cuda_event_t *event);
zs_status_t zk_cuda_event_record(const zk_cuda_event_t *event, zk_cuda_stream_t stream);
/* The stream's later work waits for the event's latest record (made before this call). */
zs_status_t zk_cuda_stream_wait_event(zk_cuda_stream_t stream, const zk_cuda_event_t *event);
void zk_cuda_event_cleanup(zk_cuda_event_t *event);

#ifdef __cplusplus
}
#endif
#endif
