#define _GNU_SOURCE
#include "zs/mem.h"
#include "zs/thread.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

typedef struct zs_zero_part {
    void *ptr;
    size_t size;
} zs_zero_part_t;

static void *zs_zero_part(void *arg)
{
    zs_zero_part_t *z = arg;

    memset(z->ptr, 0, z->size);
    return NULL;
}

/* A fresh allocation's cost is its page faults (about 0.45 ms per MiB on a 2-core VM, where the
 * memset itself takes 0.04), and the faults of one process run side by side on two cores. A
 * daemon allocates its shard when a job attaches -- in a recovery, on the path to the next
 * step, while every other process of the job waits. */
void zs_zero_fill(void *ptr, size_t size)
{
    cpu_set_t cpus;
    pthread_t t;
    size_t half = (size / 2) & ~(size_t)4095;
    zs_zero_part_t z = {(char *)ptr + half, size - half};

    if (size >= ZS_ZERO_PARALLEL_MIN && sched_getaffinity(0, sizeof(cpus), &cpus) == 0 &&
        CPU_COUNT(&cpus) > 1 && zs_thread_start(&t, false, zs_zero_part, &z) == 0) {
        memset(ptr, 0, half);
        pthread_join(t, NULL);
        return;
    }
    memset(ptr, 0, size);
}

zs_status_t zs_aligned_alloc(size_t size, size_t align, void **ptr_p)
{
    void *ptr = NULL;

    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        return ZS_ERR_INVALID;
    }
    if (size == 0) {
        size = align;
    }
    if (posix_memalign(&ptr, align, size) != 0) {
        return ZS_ERR_NO_MEMORY;
    }
    zs_zero_fill(ptr, size);
    *ptr_p = ptr;
    return ZS_OK;
}

void zs_aligned_free(void *ptr)
{
    free(ptr);
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
