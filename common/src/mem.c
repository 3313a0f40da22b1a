#define _GNU_SOURCE
#include "zs/mem.h"
#include "zs/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef ZS_ASAN
#include <sanitizer/asan_interface.h>
/* The header before an allocation is ours, inside what posix_memalign or mmap gave: poisoned,
 * a write before the caller's first byte is still reported, as without the header. */
#define ZS_POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define ZS_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ZS_POISON(p, n)   ((void)(p), (void)(n))
#define ZS_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

const char *zs_mem_type_name(zs_mem_type_t type)
{
    switch (type) {
    case ZS_MEM_HOST:
        return "host";
    case ZS_MEM_HOST_PINNED:
        return "host-pinned";
    case ZS_MEM_DEVICE:
        return "device";
    }
    return "?";
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

typedef struct zs_zero_part {
    void *ptr;
    size_t size;
    bool fresh; /* a fresh mapping, zero already: only its pages to fault in */
} zs_zero_part_t;

/* A fresh mapping's pages are faulted in by the kernel in one call (MADV_POPULATE_WRITE: about
 * 0.3 ms per MiB on a 2-core VM, against 0.5 for a memset's one fault per page) and nothing is
 * written: a region may hold data already. Where the kernel cannot (before Linux 5.14, or no
 * memory for the pages now) they are faulted in at their first touch, as without it. Memory
 * that may hold old data is zeroed by memset. */
static void zs_zero_range(void *ptr, size_t size, bool fresh)
{
    if (fresh) {
        (void)madvise(ptr, size, MADV_POPULATE_WRITE);
    } else {
        memset(ptr, 0, size);
    }
}

static void *zs_zero_part(void *arg)
{
    zs_zero_part_t *z = arg;

    zs_zero_range(z->ptr, z->size, z->fresh);
    return NULL;
}

/* A fresh allocation's cost is its page faults, and the faults of one process run side by side
 * on two cores. A daemon allocates its shard when a job attaches -- in a recovery, on the path
 * to the next step, while every other process of the job waits. */
static void zs_fill(void *ptr, size_t size, bool fresh)
{
    cpu_set_t cpus;
    pthread_t t;
    size_t half = (size / 2) & ~(size_t)4095;
    zs_zero_part_t z = {(char *)ptr + half, size - half, fresh};

    if (size >= ZS_ZERO_PARALLEL_MIN && sched_getaffinity(0, sizeof(cpus), &cpus) == 0 &&
        CPU_COUNT(&cpus) > 1 && zs_thread_start(&t, false, zs_zero_part, &z) == 0) {
        zs_zero_range(ptr, half, fresh);
        pthread_join(t, NULL);
        return;
    }
    zs_zero_range(ptr, size, fresh);
}

void zs_zero_fill(void *ptr, size_t size)
{
    zs_fill(ptr, size, false);
}

void zs_prefault(void *ptr, size_t size)
{
    const uintptr_t page = ZS_PAGE_ALIGN;
    uintptr_t a = ((uintptr_t)ptr + page - 1) & ~(page - 1);
    uintptr_t e = ((uintptr_t)ptr + size) & ~(page - 1);

    if (e > a) {
        zs_fill((void *)a, e - a, true);
    }
}

/* Before every pointer zs_aligned_alloc returns: what zs_aligned_free gives back. A large
 * allocation is a mapping of its own (map_len > 0), its header at the end of its first page;
 * a small one comes from posix_memalign. */
typedef struct zs_alloc_head {
    void *base;
    size_t map_len;
} zs_alloc_head_t;

#define ZS_HEAD_ROOM 16 /* sizeof(zs_alloc_head_t), keeping the caller's alignment (>= 16) */
_Static_assert(sizeof(zs_alloc_head_t) <= ZS_HEAD_ROOM, "the header fits its room");

static zs_status_t zs_map_alloc(size_t size, void **ptr_p)
{
    size_t len = (size + 2 * (size_t)ZS_PAGE_ALIGN - 1) & ~((size_t)ZS_PAGE_ALIGN - 1);
    char *base;

    if (len < size) {
        return ZS_ERR_NO_MEMORY;
    }
    base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        return ZS_ERR_NO_MEMORY;
    }
    *(zs_alloc_head_t *)(base + ZS_PAGE_ALIGN - ZS_HEAD_ROOM) = (zs_alloc_head_t){base, len};
    ZS_POISON(base, ZS_PAGE_ALIGN);
    zs_prefault(base + ZS_PAGE_ALIGN, len - ZS_PAGE_ALIGN);
    *ptr_p = base + ZS_PAGE_ALIGN;
    return ZS_OK;
}

zs_status_t zs_aligned_alloc(size_t size, size_t align, void **ptr_p)
{
    void *base = NULL;
    size_t room;

    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        return ZS_ERR_INVALID;
    }
    if (size == 0) {
        size = align;
    }
    if (size >= ZS_ZERO_PARALLEL_MIN && align <= ZS_PAGE_ALIGN) {
        return zs_map_alloc(size, ptr_p);
    }
    room = align > ZS_HEAD_ROOM ? align : ZS_HEAD_ROOM; /* the header's room keeps the alignment */
    if (size > SIZE_MAX - room || posix_memalign(&base, room, size + room) != 0) {
        return ZS_ERR_NO_MEMORY;
    }
    *ptr_p = (char *)base + room;
    *(zs_alloc_head_t *)((char *)*ptr_p - ZS_HEAD_ROOM) = (zs_alloc_head_t){base, 0};
    ZS_POISON(base, room);
    zs_zero_fill(*ptr_p, size);
    return ZS_OK;
}

void zs_aligned_free(void *ptr)
{
    zs_alloc_head_t h;

    if (ptr == NULL) {
        return;
    }
    ZS_UNPOISON((char *)ptr - ZS_HEAD_ROOM, ZS_HEAD_ROOM);
    h = *(const zs_alloc_head_t *)((const char *)ptr - ZS_HEAD_ROOM);
    if (h.map_len > 0) {
        ZS_UNPOISON(h.base, ZS_PAGE_ALIGN); /* mapped again later, by anyone */
        munmap(h.base, h.map_len);
    } else {
        ZS_UNPOISON(h.base, (size_t)((char *)ptr - (char *)h.base));
        free(h.base);
    }
}

zs_status_t zs_region_create(const char *name, size_t size, zs_region_t *region)
{
    zs_status_t status;
    void *addr = NULL;
    int fd;

    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        status = (errno == ENOMEM || errno == EMFILE) ? ZS_ERR_NO_MEMORY : ZS_ERR_IO;
        goto err;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        status = (errno == EFBIG || errno == ENOSPC) ? ZS_ERR_NO_MEMORY : ZS_ERR_IO;
        goto err_close;
    }
    /* The size is fixed for the region's life: a peer can never shrink it under us. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        status = ZS_ERR_IO;
        goto err_close;
    }
    if (size > 0) {
        addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) {
            status = ZS_ERR_NO_MEMORY;
            goto err_close;
        }
    }
    region->fd = fd;
    region->addr = addr;
    region->size = size;
    region->mem = ZS_MEM_HOST;
    return ZS_OK;

err_close:
    close(fd);
err:
    return status;
}

zs_status_t zs_region_map_fd(int fd, size_t size, zs_region_t *region)
{
    struct stat st;
    void *addr = NULL;

    if (fd < 0 || fstat(fd, &st) != 0) {
        return ZS_ERR_INVALID;
    }
    if ((uint64_t)st.st_size < (uint64_t)size) {
        return ZS_ERR_INVALID;
    }
    if (size > 0) {
        addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (addr == MAP_FAILED) {
            return ZS_ERR_NO_MEMORY;
        }
    }
    region->fd = fd;
    region->addr = addr;
    region->size = size;
    region->mem = ZS_MEM_HOST;
    return ZS_OK;
}

void zs_region_cleanup(zs_region_t *region)
{
    if (region == NULL) {
        return;
    }
    if (region->addr != NULL && region->size > 0) {
        munmap(region->addr, region->size);
    }
    if (region->fd >= 0) {
        close(region->fd);
    }
    region->fd = -1;
    region->addr = NULL;
    region->size = 0;
}
