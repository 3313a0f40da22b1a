/* Device regions of a daemon on the CUDA backend, mapped in the trainer (zc.h), and a device
 * session's writes into its regions (session_int.h). */
#include "session_int.h"

#include "zk/cuda_share.h"
#include "zk/kernels.h"

#include <stdlib.h>

struct zc_device_map {
    zk_cuda_region_t region;
};

int zc_device_map_import(int device, int fd, uint64_t size, zc_device_map_t **map_p)
{
    zc_device_map_t *map;
    zs_status_t st;

    zc_error_clear();
    if (map_p == NULL) {
        return zc_fail(ZC_ERR_INVALID, "zc_device_map_import: map_p is NULL");
    }
    *map_p = NULL;
    if (fd < 0 || size == 0 || size > SIZE_MAX) {
        return zc_fail(ZC_ERR_INVALID, "zc_device_map_import: fd %d, size %llu", fd,
                       (unsigned long long)size);
    }
    map = calloc(1, sizeof(*map));
    if (map == NULL) {
        return zc_fail(ZC_ERR_NO_MEMORY, "zc_device_map_import: out of memory");
    }
    st = zk_cuda_region_import(device, fd, (size_t)size, &map->region);
    if (st != ZS_OK) {
        free(map);
        return zc_fail((int)st, "%s", zk_last_error());
    }
    *map_p = map;
    return ZC_OK;
}

void *zc_device_map_ptr(const zc_device_map_t *map)
{
    return map == NULL ? NULL : (void *)map->region.ptr;
}

uint64_t zc_device_map_size(const zc_device_map_t *map)
{
    return map == NULL ? 0 : (uint64_t)map->region.size;
}

void zc_device_map_close(zc_device_map_t *map)
{
    if (map != NULL) {
        zk_cuda_region_cleanup(&map->region);
        free(map);
    }
}

/* ---- a device session's writes (session_int.h) --------------------------------------- */

int zc_dev_copy(const zc_session_t *s, void *dst, const void *src, size_t bytes, const char *what)
{
    zs_status_t st = zk_cuda_copy(dst, src, bytes);

    if (st != ZS_OK) {
        return zc_fail((int)st, "%s: device session (cuda:%d): %s", what, s->device,
                       zk_last_error());
    }
    return ZC_OK;
}

int zc_dev_zero(const zc_session_t *s, void *dst, size_t bytes, const char *what)
{
    zs_status_t st = zk_cuda_memset(dst, 0, bytes);

    if (st != ZS_OK) {
        return zc_fail((int)st, "%s: device session (cuda:%d): %s", what, s->device,
                       zk_last_error());
    }
    return ZC_OK;
}

/* zk_cuda_copy and zk_cuda_memset enqueue on the legacy default stream and need not be complete
 * on return; every libzc call that writes a region waits here before it returns. */
int zc_dev_fence(const zc_session_t *s, const char *what)
{
    zs_status_t st = zk_cuda_wait();

    if (st != ZS_OK) {
        return zc_fail((int)st, "%s: device session (cuda:%d): %s", what, s->device,
                       zk_last_error());
    }
    return ZC_OK;
}
