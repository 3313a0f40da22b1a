#define _GNU_SOURCE
#include "zs/mem.h"

#include <errno.h>
#include <fcntl.h>
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
    memset(ptr, 0, size);
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
