/*
 * Where a job's memory lives and what runs on it (docs/design-notes.md, "Backends"). The CPU
 * backend keeps the shard in host memory and the shared regions in memfds, and runs the zk CPU
 * kernels; the CUDA backend keeps the shard in device memory and the shared regions in CUDA
 * virtual-memory allocations exported as fds (zk/cuda_share.h), and runs the zk CUDA kernels on
 * its stream. The step (job/step.c) and the job (job/job.c) call these and nothing else on job
 * memory.
 */
#ifndef ZD_BACKEND_H
#define ZD_BACKEND_H

#include "zk/kernels.h"
#include "zs/mem.h"
#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct zd_backend zd_backend_t;

/* device < 0: the CPU backend; else the CUDA backend on GPU `device` (ZS_ERR_UNSUPPORTED when
 * zerod was built without CUDA, ZS_ERR_NO_DEVICE when the GPU is not there). */
zs_status_t zd_backend_create(int device, const zk_exec_t *exec, zd_backend_t **be_p, char *err,
                              size_t errlen);
void zd_backend_destroy(zd_backend_t *be);

/* -1 on the CPU, else the CUDA ordinal; the memory kind of its regions and shard. */
int zd_backend_device(const zd_backend_t *be);
zs_mem_type_t zd_backend_mem(const zd_backend_t *be);
const char *zd_backend_name(const zd_backend_t *be); /* "cpu" or "cuda:N" */
/* The GPU's free and total memory as its driver reported them at most a second ago; 0 and 0 on
 * the CPU (or when the driver cannot say). */
void zd_backend_mem_info(zd_backend_t *be, uint64_t *free_p, uint64_t *total_p);
/* The message of the last call that failed. */
const char *zd_backend_error(const zd_backend_t *be);

/* Shard arrays: zero-filled, aligned for the kernels. */
zs_status_t zd_backend_alloc(zd_backend_t *be, size_t bytes, float **ptr_p);
void zd_backend_free(zd_backend_t *be, float *ptr);

/* A host region's pages faulted in, in one call per thread (zs_prefault), for a region whose
 * every page a step writes anyway (the all-gather's params, the trainer's buckets): not one
 * fault at a time in the step, a recovery's included. Nothing for device memory. */
void zd_backend_prefault(const zd_backend_t *be, const zs_region_t *region);

/* A region shared with the trainers (zero-filled): region->fd is what attach sends and
 * region->addr where this process reaches it (a device address on the CUDA backend). */
zs_status_t zd_backend_region(zd_backend_t *be, const char *name, size_t size, zs_region_t *region);
void zd_backend_region_cleanup(zd_backend_t *be, zs_region_t *region);

/* The kernels on job memory, with zk's arguments; the message of a failure in
 * zd_backend_error().
 * On the CUDA backend each call has finished when it returns (the NCCL collectives between them
 * run on their own stream and wait for themselves). */
zs_status_t zd_backend_sumsq(zd_backend_t *be, const float *x, size_t n, double *sumsq_p,
                             int *nonfinite_p);
zs_status_t zd_backend_adam(zd_backend_t *be, const zk_adam_params_t *p, float *master, float *m,
                            float *v, float *acc, void *dst, zs_dtype_t dst_dtype, size_t n);
zs_status_t zd_backend_cast(zd_backend_t *be, void *dst, zs_dtype_t dst_dtype, const void *src,
                            zs_dtype_t src_dtype, size_t n);
zs_status_t zd_backend_zero(zd_backend_t *be, void *ptr, size_t bytes);
/* The CUDA backend waits (polling, at most timeout_ns) until the trainer's interprocess event
 * for slot `slot` (its handle, ZD_EVENT_HANDLE_BYTES) has completed its latest record. The
 * event is opened once per slot and handle and kept. ZS_ERR_TIMEOUT past the deadline. */
#define ZD_EVENT_HANDLE_BYTES 64
zs_status_t zd_backend_wait_event(zd_backend_t *be, uint32_t slot, const uint8_t *handle,
                                  uint64_t timeout_ns);
/* bytes between job memory and the host (either way; checkpoints, exports), done on return. */
zs_status_t zd_backend_copy(zd_backend_t *be, void *dst, const void *src, size_t bytes);

#endif
