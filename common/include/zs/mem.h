/*
 * Host memory and fd helpers: aligned allocation, sealed memfd regions shared with
 * trainers over SCM_RIGHTS (nothing is ever named in /dev/shm), O_CLOEXEC everywhere.
 */
#ifndef ZS_MEM_H
#define ZS_MEM_H

#include "zs/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_CACHE_LINE 64
#define ZS_PAGE_ALIGN 4096

/* ZS_ASAN: built with AddressSanitizer (GCC or clang); zs_aligned_alloc then poisons the header
 * before each allocation, so a write just before it is reported. */
#if defined(__SANITIZE_ADDRESS__)
#define ZS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZS_ASAN 1
#endif
#endif

/* Where a buffer lives: every buffer zerod passes around knows its memory type. */
typedef enum zs_mem_type {
    ZS_MEM_HOST = 0,
    ZS_MEM_HOST_PINNED = 1,
    ZS_MEM_DEVICE = 2,
} zs_mem_type_t;

const char *zs_mem_type_name(zs_mem_type_t type);

/* memset(ptr, 0, size), on two threads from ZS_ZERO_PARALLEL_MIN bytes when the calling thread
 * may run on two CPUs (a fresh allocation's page faults are most of its cost). */
#define ZS_ZERO_PARALLEL_MIN ((size_t)32 << 20)
void zs_zero_fill(void *ptr, size_t size);

/* Faults in the whole pages of [ptr, ptr + size) of a mapping (fresh anonymous memory, a memfd
 * region), writing nothing: one kernel call per thread, on two threads as zs_zero_fill, where a
 * memset would take a fault per page. Where the kernel cannot, the pages fault at first touch. */
void zs_prefault(void *ptr, size_t size);

/* Aligned host allocation, zero-filled; align is a power of two >= sizeof(void *). From
 * ZS_ZERO_PARALLEL_MIN bytes (align <= ZS_PAGE_ALIGN) it is a mapping of its own, faulted in by
 * zs_prefault (one page more, for its header); smaller ones come from posix_memalign and
 * zs_zero_fill. Free it with zs_aligned_free only. */
zs_status_t zs_aligned_alloc(size_t size, size_t align, void **ptr_p);
void zs_aligned_free(void *ptr);

/* A shared memory region backed by a memfd, mapped read-write in this process. */
typedef struct zs_region {
    int fd;            /* -1 when not created */
    void *addr;        /* mapping, NULL when size is 0 */
    size_t size;       /* bytes */
    zs_mem_type_t mem; /* ZS_MEM_HOST for memfd regions */
} zs_region_t;

#define ZS_REGION_INIT                                                                             \
    {                                                                                              \
        .fd = -1, .addr = NULL, .size = 0, .mem = ZS_MEM_HOST                                      \
    }

/* memfd_create(MFD_CLOEXEC|MFD_ALLOW_SEALING) + ftruncate + seal size + mmap (zero-filled). */
zs_status_t zs_region_create(const char *name, size_t size, zs_region_t *region);
/* Map a region received as an fd; checks that the fd is at least `size` bytes. Takes
 * ownership of fd on success only. */
zs_status_t zs_region_map_fd(int fd, size_t size, zs_region_t *region);
/* Unmap and close; safe on a cleared or never-created region. */
void zs_region_cleanup(zs_region_t *region);

/* Overflow-checked arithmetic: return ZS_ERR_OVERFLOW instead of wrapping. */
static inline zs_status_t zs_mul_u64(uint64_t a, uint64_t b, uint64_t *r_p)
{
    return __builtin_mul_overflow(a, b, r_p) ? ZS_ERR_OVERFLOW : ZS_OK;
}
static inline zs_status_t zs_add_u64(uint64_t a, uint64_t b, uint64_t *r_p)
{
    return __builtin_add_overflow(a, b, r_p) ? ZS_ERR_OVERFLOW : ZS_OK;
}
/* Round up to a multiple of `align` (any non-zero value). */
static inline zs_status_t zs_align_up_u64(uint64_t v, uint64_t align, uint64_t *r_p)
{
    uint64_t rem = v % align;
    if (rem == 0) {
        *r_p = v;
        return ZS_OK;
    }
    return zs_add_u64(v, align - rem, r_p);
}

#ifdef __cplusplus
}
#endif
#endif
