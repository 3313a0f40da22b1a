/*
 * zs_layout: the flat parameter vector, buckets, slices and shards of docs/semantics.md §1.
 *
 * Input: parameters grouped by param group, in registration order (group-major). Output:
 *  - each parameter's offset in the flat vector (aligned to elem_align elements);
 *  - buckets: each group's parameters lie one after another (each at a multiple of
 *    elem_align) in the group's span, which is cut into buckets of bucket_size elements
 *    rounded down to a multiple of world * elem_align (at least one such unit); a parameter
 *    that crosses a cut is split between buckets, so no slot is larger than bucket_size
 *    allows (DeepSpeed's reduce_bucket_size); the last bucket of a group is padded to that
 *    multiple; buckets never mix groups; each bucket is cut into `world` equal slices and
 *    rank r owns slice r of every bucket;
 *  - shards: rank r's shard is the concatenation of its slices, in bucket order; every rank's
 *    shard has the same size, so slice b starts at bucket[b].shard_offset on every rank;
 *  - the inverse map: flat index -> bucket, owning rank, shard offset, parameter;
 *  - a stable 64-bit hash (XXH3) of every input.
 * The layout is a pure function of its inputs; it allocates memory for its parameters and its
 * buckets (elements / bucket_size of them, at most ZS_LAYOUT_MAX_BUCKETS: tens of MiB), never
 * in proportion to the element count.
 */
#ifndef ZS_LAYOUT_H
#define ZS_LAYOUT_H

#include "zs/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZS_ELEM_ALIGN         16u
#define ZS_LAYOUT_MAX_WORLD   65536u
#define ZS_LAYOUT_MAX_PARAMS  (1u << 24)
#define ZS_LAYOUT_MAX_GROUPS  4096u
#define ZS_LAYOUT_MAX_BUCKETS (1u << 20)

typedef struct zs_layout_spec {
    uint32_t world;       /* ranks, >= 1 */
    uint64_t bucket_size; /* elements, >= 1 */
    uint32_t elem_align;  /* elements, power of two; 0 means ZS_ELEM_ALIGN */
    bool round_robin;     /* reorder params of each group: i -> list i % world */
    uint64_t max_numel;   /* limit on the padded flat size; 0 = no limit but 2^62 */
    uint32_t n_groups;
    const uint32_t *group_n_params; /* [n_groups] */
    const uint64_t *numel;          /* [sum of group_n_params], group-major registration order */
} zs_layout_spec_t;

typedef struct zs_layout_param {
    uint32_t id; /* registration index (position in spec->numel) */
    uint32_t group;
    uint32_t bucket;      /* the first bucket holding (part of) it */
    uint32_t last_bucket; /* the last: > bucket when it is split between buckets */
    uint64_t numel;
    uint64_t offset; /* flat offset, a multiple of elem_align */
} zs_layout_param_t;

typedef struct zs_layout_bucket {
    uint32_t group;
    uint32_t first_param;  /* index into layout->params (layout order) of the first parameter */
    uint32_t n_params;     /* ... overlapping the bucket (the first and last may be parts) */
    uint64_t offset;       /* flat offset of the bucket, a multiple of world * elem_align */
    uint64_t numel;        /* elements spanned by its params, alignment gaps included */
    uint64_t padded;       /* numel rounded up to world * elem_align */
    uint64_t slice;        /* padded / world: each rank's slice, a multiple of elem_align */
    uint64_t shard_offset; /* where this bucket's slice sits in every rank's shard */
} zs_layout_bucket_t;

typedef struct zs_layout_group {
    uint32_t first_param, n_params; /* layout order */
    uint32_t first_bucket, n_buckets;
    uint64_t flat_offset, flat_numel; /* padded span of its buckets */
    uint64_t shard_offset, shard_numel;
} zs_layout_group_t;

/* One piece of one rank's shard: the part of bucket `bucket`'s slice `rank`. */
typedef struct zs_layout_segment {
    uint32_t bucket;
    uint32_t group;
    uint64_t flat_offset;  /* = bucket.offset + rank * bucket.slice */
    uint64_t shard_offset; /* = bucket.shard_offset */
    uint64_t numel;        /* = bucket.slice */
} zs_layout_segment_t;

/* Where one element of the flat vector lives. */
typedef struct zs_layout_loc {
    uint32_t bucket;
    uint32_t rank;         /* owner */
    uint64_t shard_offset; /* in the owner's shard */
    int64_t param;         /* index into layout->params, -1 for padding */
    uint64_t param_offset; /* element within that param */
} zs_layout_loc_t;

typedef struct zs_layout {
    uint32_t world;
    uint32_t elem_align;
    uint64_t bucket_size;
    bool round_robin;
    uint32_t n_groups, n_params, n_buckets;
    zs_layout_group_t *groups;   /* [n_groups] */
    zs_layout_param_t *params;   /* [n_params], layout order */
    uint32_t *param_pos;         /* [n_params]: id -> index into params */
    zs_layout_bucket_t *buckets; /* [n_buckets] */
    size_t bucket_cap;           /* allocated entries of buckets */
    uint64_t total_numel;        /* flat vector, padded (sum of bucket.padded) */
    uint64_t param_numel;        /* sum of parameter sizes (no padding) */
    uint64_t shard_numel;        /* per rank (sum of bucket.slice) */
    uint64_t max_bucket_numel;   /* largest bucket.padded: the size of one gradient slot */
    uint64_t hash;
} zs_layout_t;

/* Errors: ZS_ERR_INVALID (bad spec: world 0, bucket 0, non power-of-two alignment, too many
 * params/groups), ZS_ERR_OVERFLOW (64-bit overflow), ZS_ERR_LIMIT (padded size > max_numel).
 * `err` gets a message naming the field and value when non-NULL. */
zs_status_t zs_layout_create(const zs_layout_spec_t *spec, zs_layout_t **layout_p, char *err,
                             size_t errlen);
void zs_layout_destroy(zs_layout_t *layout);

/* The hash of a spec without building the layout (same value as layout->hash). */
uint64_t zs_layout_spec_hash(const zs_layout_spec_t *spec);

/* Rank r's shard as segments in shard order; `segments` has room for n_buckets entries. */
void zs_layout_rank_segments(const zs_layout_t *layout, uint32_t rank,
                             zs_layout_segment_t *segments);

/* Inverse map; ZS_ERR_INVALID when flat_index >= total_numel. */
zs_status_t zs_layout_locate(const zs_layout_t *layout, uint64_t flat_index,
                             zs_layout_loc_t *loc_p);

/* Piece i (< bucket.n_params) of bucket b: which parameter (index into layout->params), and
 * which of its elements sit where in the bucket. */
typedef struct zs_layout_piece {
    uint32_t param;
    uint64_t param_offset;  /* first element of the parameter in this bucket */
    uint64_t bucket_offset; /* where it sits in the bucket (its slot image) */
    uint64_t numel;
} zs_layout_piece_t;
void zs_layout_bucket_piece(const zs_layout_t *layout, uint32_t b, uint32_t i,
                            zs_layout_piece_t *piece_p);

/* The parameter with registration index id. */
static inline const zs_layout_param_t *zs_layout_param_by_id(const zs_layout_t *layout, uint32_t id)
{
    return &layout->params[layout->param_pos[id]];
}

#ifdef __cplusplus
}
#endif
#endif
