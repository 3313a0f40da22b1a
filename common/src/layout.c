#include "zs/layout.h"

#include "zs/error.h"
#include "zs/mem.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* Default cap on the padded flat size: keeps every byte count (x 16 bytes per element of
 * model state) inside 64 bits. */
#define ZS_LAYOUT_DEFAULT_MAX_NUMEL (1ull << 58)
#define ZS_LAYOUT_MAX_ALIGN         (1u << 20)
#define ZS_LAYOUT_HASH_TAG          "zerod.layout.v1"

static void zs_layout_hash_u64(XXH3_state_t *st, uint64_t v)
{
    unsigned char le[8];

    for (int i = 0; i < 8; i++) {
        le[i] = (unsigned char)(v >> (8 * i));
    }
    XXH3_64bits_update(st, le, sizeof(le));
}

static uint32_t zs_layout_align(const zs_layout_spec_t *spec)
{
    return (spec->elem_align == 0) ? ZS_ELEM_ALIGN : spec->elem_align;
}

uint64_t zs_layout_spec_hash(const zs_layout_spec_t *spec)
{
    XXH3_state_t st;
    uint64_t n_params = 0;

    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, ZS_LAYOUT_HASH_TAG, sizeof(ZS_LAYOUT_HASH_TAG));
    zs_layout_hash_u64(&st, spec->world);
    zs_layout_hash_u64(&st, spec->bucket_size);
    zs_layout_hash_u64(&st, zs_layout_align(spec));
    zs_layout_hash_u64(&st, spec->round_robin ? 1 : 0);
    zs_layout_hash_u64(&st, spec->n_groups);
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        zs_layout_hash_u64(&st, spec->group_n_params[g]);
        n_params += spec->group_n_params[g];
    }
    for (uint64_t i = 0; i < n_params; i++) {
        zs_layout_hash_u64(&st, spec->numel[i]);
    }
    return XXH3_64bits_digest(&st);
}

static zs_status_t zs_layout_check_spec(const zs_layout_spec_t *spec, uint64_t *n_params_p,
                                        char *err, size_t errlen)
{
    uint32_t align = zs_layout_align(spec);
    uint64_t n_params = 0;

    if (spec->world == 0 || spec->world > ZS_LAYOUT_MAX_WORLD) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "layout: world %u is out of range 1..%u",
                       spec->world, ZS_LAYOUT_MAX_WORLD);
    }
    if (spec->bucket_size == 0) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "layout: reduce_bucket_size must be at least 1 element");
    }
    if ((align & (align - 1)) != 0 || align > ZS_LAYOUT_MAX_ALIGN) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "layout: elem_align %u is not a power of two <= %u", align,
                       ZS_LAYOUT_MAX_ALIGN);
    }
    if (spec->n_groups > ZS_LAYOUT_MAX_GROUPS) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "layout: %u param groups exceed the limit of %u", spec->n_groups,
                       ZS_LAYOUT_MAX_GROUPS);
    }
    if (spec->n_groups > 0 && spec->group_n_params == NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "layout: group_n_params is NULL");
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        n_params += spec->group_n_params[g];
    }
    if (n_params > ZS_LAYOUT_MAX_PARAMS) {
        return zs_errf(err, errlen, ZS_ERR_INVALID,
                       "layout: %llu parameters exceed the limit of %u",
                       (unsigned long long)n_params, ZS_LAYOUT_MAX_PARAMS);
    }
    if (n_params > 0 && spec->numel == NULL) {
        return zs_errf(err, errlen, ZS_ERR_INVALID, "layout: numel is NULL");
    }
    *n_params_p = n_params;
    return ZS_OK;
}

/* Fill order[0..n) with the registration indices of one group in layout order. */
static void zs_layout_group_order(uint32_t first_id, uint32_t n, uint32_t world, bool rr,
                                  uint32_t *order)
{
    uint32_t k = 0;

    if (!rr || world == 1) {
        for (uint32_t i = 0; i < n; i++) {
            order[i] = first_id + i;
        }
        return;
    }
    for (uint32_t list = 0; list < world && list < n; list++) {
        for (uint32_t i = list; i < n; i += world) {
            order[k++] = first_id + i;
        }
    }
}

static zs_status_t zs_layout_alloc(zs_layout_t *layout, uint64_t n_params)
{
    size_t np = (size_t)(n_params > 0 ? n_params : 1);

    layout->groups = calloc(layout->n_groups > 0 ? layout->n_groups : 1, sizeof(*layout->groups));
    layout->params = calloc(np, sizeof(*layout->params));
    layout->param_pos = calloc(np, sizeof(*layout->param_pos));
    layout->bucket_cap = np + layout->n_groups;
    layout->buckets = calloc(layout->bucket_cap, sizeof(*layout->buckets));
    if (layout->groups == NULL || layout->params == NULL || layout->param_pos == NULL ||
        layout->buckets == NULL) {
        return ZS_ERR_NO_MEMORY;
    }
    return ZS_OK;
}

/* Close the open bucket: pad it, place it in the flat vector and the shard. */
static zs_status_t zs_layout_close_bucket(zs_layout_t *layout, zs_layout_bucket_t *b,
                                          uint64_t max_numel, char *err, size_t errlen)
{
    uint64_t unit = (uint64_t)layout->world * layout->elem_align;
    zs_status_t status;

    b->offset = layout->total_numel;
    b->shard_offset = layout->shard_numel;
    status = zs_align_up_u64(b->numel, unit, &b->padded);
    if (status == ZS_OK) {
        status = zs_add_u64(layout->total_numel, b->padded, &layout->total_numel);
    }
    if (status != ZS_OK) {
        return zs_errf(err, errlen, status, "layout: flat size overflows 64 bits at bucket %u",
                       layout->n_buckets);
    }
    if (layout->total_numel > max_numel) {
        return zs_errf(err, errlen, ZS_ERR_LIMIT,
                       "layout: padded size %llu elements exceeds the limit of %llu elements",
                       (unsigned long long)layout->total_numel, (unsigned long long)max_numel);
    }
    b->slice = b->padded / layout->world;
    layout->shard_numel += b->slice;
    if (b->padded > layout->max_bucket_numel) {
        layout->max_bucket_numel = b->padded;
    }
    layout->n_buckets++;
    return ZS_OK;
}

/* Room for one more bucket (the array grows by doubling; zs_layout_cut_group bounds the count
 * before it cuts). */
static zs_status_t zs_layout_bucket_room(zs_layout_t *layout, char *err, size_t errlen)
{
    zs_layout_bucket_t *nb;
    size_t cap;

    if (layout->n_buckets < layout->bucket_cap) {
        return ZS_OK;
    }
    cap = layout->bucket_cap * 2;
    nb = realloc(layout->buckets, cap * sizeof(*nb));
    if (nb == NULL) {
        return zs_errf(err, errlen, ZS_ERR_NO_MEMORY, "layout: out of memory for %zu buckets", cap);
    }
    memset(nb + layout->bucket_cap, 0, (cap - layout->bucket_cap) * sizeof(*nb));
    layout->buckets = nb;
    layout->bucket_cap = cap;
    return ZS_OK;
}

/* Place a group's parameters one after another in its span (each at the next multiple of
 * elem_align); offsets relative to the span; *span_p = the span's length. */
static zs_status_t zs_layout_place_group(zs_layout_t *layout, const zs_layout_spec_t *spec,
                                         uint32_t g, const uint32_t *order, uint32_t first_pos,
                                         uint64_t max_numel, uint64_t *span_p, char *err,
                                         size_t errlen)
{
    uint64_t pos = 0;

    for (uint32_t k = 0; k < spec->group_n_params[g]; k++) {
        zs_layout_param_t *p = &layout->params[first_pos + k];
        uint64_t numel = spec->numel[order[k]], start;

        if (numel > max_numel) {
            return zs_errf(err, errlen, ZS_ERR_LIMIT,
                           "layout: parameter %u has %llu elements, over the limit of %llu",
                           order[k], (unsigned long long)numel, (unsigned long long)max_numel);
        }
        if (zs_align_up_u64(pos, layout->elem_align, &start) != ZS_OK ||
            zs_add_u64(start, numel, &pos) != ZS_OK ||
            zs_add_u64(layout->param_numel, numel, &layout->param_numel) != ZS_OK) {
            return zs_errf(err, errlen, ZS_ERR_OVERFLOW,
                           "layout: sizes overflow 64-bit arithmetic at parameter %u", order[k]);
        }
        if (pos > max_numel) {
            return zs_errf(err, errlen, ZS_ERR_LIMIT,
                           "layout: padded size of group %u exceeds the limit of %llu elements", g,
                           (unsigned long long)max_numel);
        }
        *p = (zs_layout_param_t){.id = order[k], .group = g, .numel = numel, .offset = start};
    }
    *span_p = pos;
    return ZS_OK;
}

/* Cut a placed group's span into buckets of `cap` elements (the last one shorter, padded),
 * each holding the parameters, or parts of them, that overlap it (an empty parameter: the
 * bucket its offset falls in); then make the parameters' offsets flat (the span is
 * contiguous: only the last bucket has padding). */
static zs_status_t zs_layout_cut_group(zs_layout_t *layout, uint32_t g, uint32_t first_pos,
                                       uint64_t span, uint64_t cap, uint64_t max_numel, char *err,
                                       size_t errlen)
{
    zs_layout_group_t *grp = &layout->groups[g];
    uint64_t nb = span == 0 ? 1 : (span + cap - 1) / cap;
    uint32_t end_pos = first_pos + grp->n_params, lo = first_pos, hi = first_pos;
    zs_status_t status;

    if (nb > ZS_LAYOUT_MAX_BUCKETS - layout->n_buckets) {
        return zs_errf(err, errlen, ZS_ERR_LIMIT,
                       "layout: reduce_bucket_size %llu cuts the parameters into more than %u "
                       "buckets",
                       (unsigned long long)layout->bucket_size, ZS_LAYOUT_MAX_BUCKETS);
    }
    for (uint32_t i = first_pos; i < end_pos; i++) {
        zs_layout_param_t *p = &layout->params[i];
        uint64_t first = p->offset / cap;
        uint64_t last = p->numel > 0 ? (p->offset + p->numel - 1) / cap : first;

        p->bucket = layout->n_buckets + (uint32_t)(first < nb ? first : nb - 1);
        p->last_bucket = layout->n_buckets + (uint32_t)(last < nb ? last : nb - 1);
    }
    for (uint64_t j = 0; j < nb; j++) {
        uint32_t bid = layout->n_buckets;
        zs_layout_bucket_t *b;

        status = zs_layout_bucket_room(layout, err, errlen);
        if (status != ZS_OK) {
            return status;
        }
        while (lo < end_pos && layout->params[lo].last_bucket < bid) {
            lo++;
        }
        hi = hi > lo ? hi : lo;
        while (hi < end_pos && layout->params[hi].bucket <= bid) {
            hi++;
        }
        b = &layout->buckets[bid];
        *b = (zs_layout_bucket_t){.group = g,
                                  .first_param = lo,
                                  .n_params = hi - lo,
                                  .numel = (j + 1 == nb ? span : (j + 1) * cap) - j * cap};
        status = zs_layout_close_bucket(layout, b, max_numel, err, errlen);
        if (status != ZS_OK) {
            return status;
        }
    }
    for (uint32_t i = first_pos; i < end_pos; i++) {
        layout->params[i].offset += grp->flat_offset;
    }
    return ZS_OK;
}

static zs_status_t zs_layout_build(zs_layout_t *layout, const zs_layout_spec_t *spec,
                                   uint32_t *order, char *err, size_t errlen)
{
    uint64_t max_numel = spec->max_numel ? spec->max_numel : ZS_LAYOUT_DEFAULT_MAX_NUMEL;
    uint64_t unit = (uint64_t)layout->world * layout->elem_align;
    /* every bucket but a group's last holds exactly `cap` elements, a multiple of the unit,
     * so cutting a parameter between two buckets leaves no gap inside it */
    uint64_t cap = spec->bucket_size / unit * unit;
    uint32_t first_id = 0;
    uint32_t pos_out = 0;
    zs_status_t status;

    cap = cap > 0 ? cap : unit;
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        zs_layout_group_t *grp = &layout->groups[g];
        uint32_t n = spec->group_n_params[g];
        uint64_t span = 0;

        grp->first_param = pos_out;
        grp->n_params = n;
        grp->first_bucket = layout->n_buckets;
        grp->flat_offset = layout->total_numel;
        grp->shard_offset = layout->shard_numel;
        zs_layout_group_order(first_id, n, spec->world, spec->round_robin, order);
        status =
            zs_layout_place_group(layout, spec, g, order, pos_out, max_numel, &span, err, errlen);
        if (status == ZS_OK && n > 0) {
            status = zs_layout_cut_group(layout, g, pos_out, span, cap, max_numel, err, errlen);
        }
        if (status != ZS_OK) {
            return status;
        }
        pos_out += n;
        grp->n_buckets = layout->n_buckets - grp->first_bucket;
        grp->flat_numel = layout->total_numel - grp->flat_offset;
        grp->shard_numel = layout->shard_numel - grp->shard_offset;
        first_id += n;
    }

    for (uint32_t i = 0; i < layout->n_params; i++) {
        layout->param_pos[layout->params[i].id] = i;
    }
    return ZS_OK;
}

zs_status_t zs_layout_create(const zs_layout_spec_t *spec, zs_layout_t **layout_p, char *err,
                             size_t errlen)
{
    zs_layout_t *layout;
    uint32_t *order = NULL;
    uint64_t n_params = 0;
    uint32_t max_group = 1;
    zs_status_t status;

    status = zs_layout_check_spec(spec, &n_params, err, errlen);
    if (status != ZS_OK) {
        goto err;
    }
    layout = calloc(1, sizeof(*layout));
    if (layout == NULL) {
        status = ZS_ERR_NO_MEMORY;
        goto err;
    }
    layout->world = spec->world;
    layout->elem_align = zs_layout_align(spec);
    layout->bucket_size = spec->bucket_size;
    layout->round_robin = spec->round_robin;
    layout->n_groups = spec->n_groups;
    layout->n_params = (uint32_t)n_params;
    status = zs_layout_alloc(layout, n_params);
    if (status != ZS_OK) {
        zs_errf(err, errlen, status, "layout: out of memory for %llu parameters",
                (unsigned long long)n_params);
        goto err_destroy;
    }
    for (uint32_t g = 0; g < spec->n_groups; g++) {
        if (spec->group_n_params[g] > max_group) {
            max_group = spec->group_n_params[g];
        }
    }
    order = calloc(max_group, sizeof(*order));
    if (order == NULL) {
        status = ZS_ERR_NO_MEMORY;
        goto err_destroy;
    }
    status = zs_layout_build(layout, spec, order, err, errlen);
    if (status != ZS_OK) {
        goto err_free_order;
    }
    layout->hash = zs_layout_spec_hash(spec);
    free(order);
    *layout_p = layout;
    return ZS_OK;

err_free_order:
    free(order);
err_destroy:
    zs_layout_destroy(layout);
err:
    return status;
}

void zs_layout_destroy(zs_layout_t *layout)
{
    if (layout == NULL) {
        return;
    }
    free(layout->groups);
    free(layout->params);
    free(layout->param_pos);
    free(layout->buckets);
    free(layout);
}

void zs_layout_rank_segments(const zs_layout_t *layout, uint32_t rank,
                             zs_layout_segment_t *segments)
{
    for (uint32_t b = 0; b < layout->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &layout->buckets[b];
        segments[b].bucket = b;
        segments[b].group = bk->group;
        segments[b].flat_offset = bk->offset + (uint64_t)rank * bk->slice;
        segments[b].shard_offset = bk->shard_offset;
        segments[b].numel = bk->slice;
    }
}

zs_status_t zs_layout_locate(const zs_layout_t *layout, uint64_t flat_index, zs_layout_loc_t *loc_p)
{
    uint32_t lo = 0, hi, b;
    const zs_layout_bucket_t *bk;
    uint64_t rel;

    if (flat_index >= layout->total_numel) {
        return ZS_ERR_INVALID;
    }
    /* last bucket whose offset <= flat_index (empty buckets share the next one's offset) */
    hi = layout->n_buckets;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (layout->buckets[mid].offset <= flat_index) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    b = lo;
    bk = &layout->buckets[b];
    rel = flat_index - bk->offset;
    loc_p->bucket = b;
    loc_p->rank = (uint32_t)(rel / bk->slice);
    loc_p->shard_offset = bk->shard_offset + rel % bk->slice;
    loc_p->param = -1;
    loc_p->param_offset = 0;

    /* last param of the bucket whose offset <= flat_index */
    if (bk->n_params > 0) {
        uint32_t plo = bk->first_param, phi = bk->first_param + bk->n_params;
        while (phi - plo > 1) {
            uint32_t mid = plo + (phi - plo) / 2;
            if (layout->params[mid].offset <= flat_index) {
                plo = mid;
            } else {
                phi = mid;
            }
        }
        const zs_layout_param_t *p = &layout->params[plo];
        if (p->offset <= flat_index && flat_index - p->offset < p->numel) {
            loc_p->param = plo;
            loc_p->param_offset = flat_index - p->offset;
        }
    }
    return ZS_OK;
}

void zs_layout_bucket_piece(const zs_layout_t *layout, uint32_t b, uint32_t i,
                            zs_layout_piece_t *piece_p)
{
    const zs_layout_bucket_t *bk = &layout->buckets[b];
    const zs_layout_param_t *p = &layout->params[bk->first_param + i];
    uint64_t lo = p->offset > bk->offset ? p->offset : bk->offset;
    uint64_t end = p->offset + p->numel, bend = bk->offset + bk->numel;
    uint64_t hi = end < bend ? end : bend;

    piece_p->param = bk->first_param + i;
    piece_p->param_offset = p->numel > 0 ? lo - p->offset : 0;
    piece_p->bucket_offset = lo - bk->offset;
    piece_p->numel = hi > lo ? hi - lo : 0;
}
