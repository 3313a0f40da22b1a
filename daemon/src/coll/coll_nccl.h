/* NCCL collectives (device memory). Only built when CMake finds CUDA and NCCL. */
#ifndef ZD_COLL_NCCL_H
#define ZD_COLL_NCCL_H

#include "coll/coll.h"
#include "zs/time.h"

#include <stdbool.h>

#define ZD_NCCL_ID_BYTES 128

/* Rank 0 makes the id; the mesh's Welcome carries it to every rank. */
zs_status_t zd_coll_nccl_unique_id(uint8_t id[ZD_NCCL_ID_BYTES], char *err, size_t errlen);
zs_status_t zd_coll_nccl_create(uint32_t rank, uint32_t world, const uint8_t id[ZD_NCCL_ID_BYTES],
                                int device, uint64_t timeout_ns, zd_coll_t **coll_p, char *err,
                                size_t errlen);

#endif
