#include "zs/layout.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static zs_layout_t *make_layout(uint32_t world, uint64_t bucket, bool rr, uint32_t n_groups,
                                const uint32_t *gnp, const uint64_t *numel)
{
    zs_layout_spec_t spec = {.world = world,
                             .bucket_size = bucket,
                             .round_robin = rr,
                             .n_groups = n_groups,
                             .group_n_params = gnp,
                             .numel = numel};
    zs_layout_t *layout = NULL;
    char err[256] = "";
    zs_status_t st = zs_layout_create(&spec, &layout, err, sizeof(err));
    cr_assert_eq(st, ZS_OK, "zs_layout_create: %s (%s)", zs_status_name(st), err);
    return layout;
}

/* Every invariant of docs/semantics.md §1 for one layout. */
static void check_layout(const zs_layout_t *l, uint32_t n_groups, const uint32_t *gnp,
                         const uint64_t *numel)
{
    uint32_t n_params = 0;
    uint64_t unit = (uint64_t)l->world * ZS_ELEM_ALIGN;
    uint64_t shard_sum = 0;
    int *owner_count;
    zs_layout_segment_t *segs;

    for (uint32_t g = 0; g < n_groups; g++) {
        n_params += gnp[g];
    }
    cr_assert_eq(l->n_params, n_params);

    /* buckets: padded to world*align, never cross a group, every one but a group's last
     * holds exactly the capacity (bucket_size rounded down to the unit, at least one unit) */
    uint64_t cap = l->bucket_size / unit * unit;
    cap = cap > 0 ? cap : unit;
    for (uint32_t b = 0; b < l->n_buckets; b++) {
        const zs_layout_bucket_t *bk = &l->buckets[b];
        bool last_of_group = b + 1 == l->n_buckets || l->buckets[b + 1].group != bk->group;
        cr_assert_eq(bk->padded % unit, 0, "bucket %u padded %lu not a multiple of %lu", b,
                     bk->padded, unit);
        cr_assert_eq(bk->offset % unit, 0);
        cr_assert_geq(bk->padded, bk->numel);
        cr_assert_lt(bk->padded - bk->numel, unit);
        cr_assert_eq(bk->slice * l->world, bk->padded);
        cr_assert_eq(bk->slice % ZS_ELEM_ALIGN, 0);
        cr_assert_leq(bk->padded, cap < unit ? unit : (cap + unit - 1) / unit * unit);
        if (!last_of_group) {
            cr_assert_eq(bk->numel, cap, "bucket %u holds %lu, not the capacity %lu", b, bk->numel,
                         cap);
        }
        for (uint32_t i = bk->first_param; i < bk->first_param + bk->n_params; i++) {
            cr_assert_eq(l->params[i].group, bk->group, "bucket %u mixes groups", b);
            cr_assert_leq(l->params[i].bucket, b);
            cr_assert_geq(l->params[i].last_bucket, b);
        }
        if (b + 1 < l->n_buckets) {
            cr_assert_eq(l->buckets[b + 1].offset, bk->offset + bk->padded);
            cr_assert_eq(l->buckets[b + 1].shard_offset, bk->shard_offset + bk->slice);
        }
        shard_sum += bk->slice;
    }
    cr_assert_eq(shard_sum, l->shard_numel);
    cr_assert_eq(l->shard_numel * l->world, l->total_numel);

    /* params: aligned, inside their buckets, disjoint, numel as given, id map consistent, and
     * the buckets' pieces of each add up to all of it, in order */
    for (uint32_t i = 0; i < l->n_params; i++) {
        const zs_layout_param_t *p = &l->params[i];
        const zs_layout_bucket_t *first = &l->buckets[p->bucket];
        const zs_layout_bucket_t *last = &l->buckets[p->last_bucket];
        uint64_t covered = 0;
        cr_assert_eq(p->offset % ZS_ELEM_ALIGN, 0);
        cr_assert_eq(p->numel, numel[p->id]);
        cr_assert_geq(p->offset + (p->numel == 0), first->offset);
        cr_assert_leq(p->offset + p->numel, last->offset + last->numel);
        cr_assert_eq(l->param_pos[p->id], i);
        if (i > 0 && l->params[i - 1].group == p->group) {
            cr_assert_geq(p->offset, l->params[i - 1].offset + l->params[i - 1].numel);
        }
        for (uint32_t b = p->bucket; b <= p->last_bucket; b++) {
            const zs_layout_bucket_t *bk = &l->buckets[b];
            zs_layout_piece_t pc;
            uint32_t k = i - bk->first_param;
            cr_assert_lt(k, bk->n_params, "param %u not listed in its bucket %u", i, b);
            zs_layout_bucket_piece(l, b, k, &pc);
            cr_assert_eq(pc.param, i);
            cr_assert_eq(pc.param_offset, covered, "param %u: piece in bucket %u", i, b);
            cr_assert_eq(bk->offset + pc.bucket_offset, p->offset + pc.param_offset);
            cr_assert_leq(pc.bucket_offset + pc.numel, bk->numel);
            covered += pc.numel;
        }
        cr_assert_eq(covered, p->numel, "param %u: pieces cover %lu of %lu", i, covered, p->numel);
    }

    /* Every element of every parameter is in exactly one slice of one rank; padding maps to
     * no parameter; the inverse map agrees with the segments. */
    owner_count = calloc(l->total_numel + 1, sizeof(int));
    segs = calloc(l->n_buckets + 1, sizeof(*segs));
    for (uint32_t r = 0; r < l->world; r++) {
        uint64_t rank_total = 0;
        zs_layout_rank_segments(l, r, segs);
        for (uint32_t s = 0; s < l->n_buckets; s++) {
            cr_assert_eq(segs[s].flat_offset % ZS_ELEM_ALIGN, 0);
            cr_assert_eq(segs[s].shard_offset % ZS_ELEM_ALIGN, 0);
            rank_total += segs[s].numel;
            for (uint64_t k = 0; k < segs[s].numel; k++) {
                uint64_t flat = segs[s].flat_offset + k;
                zs_layout_loc_t loc;
                cr_assert_eq(zs_layout_locate(l, flat, &loc), ZS_OK);
                cr_assert_eq(loc.rank, r);
                cr_assert_eq(loc.bucket, segs[s].bucket);
                cr_assert_eq(loc.shard_offset, segs[s].shard_offset + k);
                owner_count[flat]++;
            }
        }
        cr_assert_eq(rank_total, l->shard_numel, "rank %u shard size differs", r);
    }
    for (uint64_t f = 0; f < l->total_numel; f++) {
        cr_assert_eq(owner_count[f], 1, "flat element %lu owned %d times", f, owner_count[f]);
    }
    for (uint32_t i = 0; i < l->n_params; i++) {
        const zs_layout_param_t *p = &l->params[i];
        for (uint64_t k = 0; k < p->numel; k++) {
            zs_layout_loc_t loc;
            cr_assert_eq(zs_layout_locate(l, p->offset + k, &loc), ZS_OK);
            cr_assert_eq(loc.param, (int64_t)i);
            cr_assert_eq(loc.param_offset, k);
        }
    }
    {
        /* padding: count elements mapping to a parameter == sum of numel */
        uint64_t mapped = 0, want = 0;
        for (uint64_t f = 0; f < l->total_numel; f++) {
            zs_layout_loc_t loc;
            zs_layout_locate(l, f, &loc);
            mapped += loc.param >= 0;
        }
        for (uint32_t i = 0; i < l->n_params; i++) {
            want += l->params[i].numel;
        }
        cr_assert_eq(mapped, want, "padding maps to a parameter");
        cr_assert_eq(want, l->param_numel);
    }
    {
        zs_layout_loc_t loc;
        cr_assert_eq(zs_layout_locate(l, l->total_numel, &loc), ZS_ERR_INVALID);
    }
    free(segs);
    free(owner_count);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

Test(zs_layout, covers_every_element_once_for_small_cases)
{
    static const uint64_t buckets[] = {1, 16, 33, 64, 200};
    unsigned cases = 0;

    for (uint32_t n_params = 0; n_params <= 6; n_params++) {
        for (uint32_t n_groups = 1; n_groups <= 3; n_groups++) {
            for (int variant = 0; variant < 6; variant++) {
                uint64_t numel[6];
                uint32_t gnp[3] = {0, 0, 0};
                for (uint32_t i = 0; i < n_params; i++) {
                    switch (variant) {
                    case 0:
                        numel[i] = 0;
                        break;
                    case 1:
                        numel[i] = 40;
                        break;
                    case 2:
                        numel[i] = (i * 7 + 1) % 41;
                        break;
                    default:
                        numel[i] = rng_next() % 41;
                        break;
                    }
                }
                /* split params over groups, first groups get the remainder */
                for (uint32_t i = 0; i < n_params; i++) {
                    gnp[(uint32_t)((uint64_t)i * n_groups / (n_params ? n_params : 1))]++;
                }
                for (uint32_t world = 1; world <= 8; world++) {
                    for (size_t bi = 0; bi < sizeof(buckets) / sizeof(buckets[0]); bi++) {
                        for (int rr = 0; rr <= 1; rr++) {
                            zs_layout_t *l =
                                make_layout(world, buckets[bi], rr, n_groups, gnp, numel);
                            check_layout(l, n_groups, gnp, numel);
                            zs_layout_destroy(l);
                            cases++;
                        }
                    }
                }
            }
        }
    }
    cr_log_info("checked %u layouts", cases);
    cr_assert_gt(cases, 10000);
}

Test(zs_layout, round_robin_5_tensors_2_ranks)
{
    const uint32_t gnp[] = {5};
    const uint64_t numel[] = {3, 3, 3, 3, 3};
    const uint32_t want[] = {0, 2, 4, 1, 3};
    zs_layout_t *l = make_layout(2, 1000, true, 1, gnp, numel);

    for (uint32_t i = 0; i < 5; i++) {
        cr_assert_eq(l->params[i].id, want[i], "position %u: id %u, want %u", i, l->params[i].id,
                     want[i]);
    }
    zs_layout_destroy(l);
}

Test(zs_layout, round_robin_is_per_group)
{
    const uint32_t gnp[] = {3, 4};
    const uint64_t numel[] = {1, 1, 1, 1, 1, 1, 1};
    const uint32_t want[] = {0, 2, 1, 3, 5, 4, 6};
    zs_layout_t *l = make_layout(2, 1000, true, 2, gnp, numel);

    for (uint32_t i = 0; i < 7; i++) {
        cr_assert_eq(l->params[i].id, want[i]);
    }
    zs_layout_destroy(l);
}

Test(zs_layout, pads_each_group_last_bucket_to_world)
{
    const uint32_t gnp[] = {3};
    const uint64_t numel[] = {10, 20, 5};
    zs_layout_t *l = make_layout(3, 40, false, 1, gnp, numel);

    /* unit 48 > 40: capacity one unit; span 10 | 16..36 | 48..53 = 53 -> buckets [0,48) and
     * [48,53) padded to 48; param 2 (at 48) opens the second bucket */
    cr_assert_eq(l->n_buckets, 2);
    cr_assert_eq(l->buckets[0].numel, 48);
    cr_assert_eq(l->buckets[0].padded, 48);
    cr_assert_eq(l->buckets[0].slice, 16);
    cr_assert_eq(l->buckets[1].offset, 48);
    cr_assert_eq(l->buckets[1].numel, 5);
    cr_assert_eq(l->buckets[1].padded, 48);
    cr_assert_eq(l->shard_numel, 32);
    cr_assert_eq(l->max_bucket_numel, 48);
    cr_assert_eq(l->params[2].offset, 48);
    zs_layout_destroy(l);
}

/* DeepSpeed's reduce_bucket_size bounds the bucket, whatever the parameters: a parameter larger
 * than a bucket is cut into pieces, and so is one that crosses a bucket's end. */
Test(zs_layout, param_larger_than_bucket_is_split)
{
    const uint32_t gnp[] = {3};
    const uint64_t numel[] = {4, 100, 4};
    zs_layout_t *l = make_layout(2, 32, false, 1, gnp, numel);
    zs_layout_piece_t pc;

    /* capacity 32; span 4 | 16..116 | 128..132 = 132 -> 5 buckets: 32, 32, 32, 32, 4 */
    cr_assert_eq(l->n_buckets, 5);
    cr_assert_eq(l->max_bucket_numel, 32);
    cr_assert_eq(l->params[1].bucket, 0);
    cr_assert_eq(l->params[1].last_bucket, 3);
    cr_assert_eq(l->buckets[0].n_params, 2);
    zs_layout_bucket_piece(l, 0, 1, &pc);
    cr_assert_eq(pc.param_offset, 0);
    cr_assert_eq(pc.bucket_offset, 16);
    cr_assert_eq(pc.numel, 16);
    zs_layout_bucket_piece(l, 2, 0, &pc);
    cr_assert_eq(pc.param_offset, 48);
    cr_assert_eq(pc.bucket_offset, 0);
    cr_assert_eq(pc.numel, 32);
    cr_assert_eq(l->buckets[4].n_params, 1);
    cr_assert_eq(l->buckets[4].padded, 32);
    zs_layout_destroy(l);
}

/* A bucket size that would cut the model into more buckets than a layout holds is refused,
 * naming the key, before the buckets are allocated. */
Test(zs_layout, too_many_buckets_is_refused_naming_reduce_bucket_size)
{
    const uint32_t gnp[] = {1};
    const uint64_t numel[] = {1ull << 30};
    zs_layout_spec_t spec = {
        .world = 1, .bucket_size = 16, .n_groups = 1, .group_n_params = gnp, .numel = numel};
    zs_layout_t *l = NULL;
    char err[256];
    zs_status_t st;

    st = zs_layout_create(&spec, &l, err, sizeof(err));
    cr_assert_eq(st, ZS_ERR_LIMIT, "got %s: %s", zs_status_name(st), err);
    cr_assert_null(l);
    cr_assert_not_null(strstr(err, "reduce_bucket_size 16"), "%s", err);
    spec.bucket_size = 1ull << 12; /* 2^18 buckets: fine */
    cr_assert_eq(zs_layout_create(&spec, &l, err, sizeof(err)), ZS_OK, "%s", err);
    cr_assert_eq(l->n_buckets, 1u << 18);
    zs_layout_destroy(l);
}

Test(zs_layout, billion_elements_without_allocating_them)
{
    uint32_t gnp[2] = {600, 400};
    uint64_t *numel = calloc(1000, sizeof(uint64_t));
    zs_layout_t *l;

    for (int i = 0; i < 1000; i++) {
        numel[i] = 1000000 + (uint64_t)(i % 7);
    }
    l = make_layout(8, 500000000ull, false, 2, gnp, numel);
    cr_assert_geq(l->param_numel, 1000000000ull);
    cr_assert_eq(l->total_numel, l->shard_numel * 8);
    cr_assert_geq(l->total_numel, l->param_numel);
    {
        zs_layout_loc_t loc;
        const zs_layout_param_t *p = zs_layout_param_by_id(l, 999);
        cr_assert_eq(zs_layout_locate(l, p->offset + p->numel - 1, &loc), ZS_OK);
        cr_assert_eq(loc.param, (int64_t)l->param_pos[999]);
        cr_assert_eq(loc.param_offset, p->numel - 1);
    }
    zs_layout_destroy(l);
    free(numel);
}

Test(zs_layout, overflow_and_limit_are_errors)
{
    const uint32_t gnp[] = {2};
    uint64_t numel[] = {1ull << 63, 1ull << 63};
    zs_layout_spec_t spec = {.world = 2,
                             .bucket_size = 1ull << 62,
                             .max_numel = UINT64_MAX,
                             .n_groups = 1,
                             .group_n_params = gnp,
                             .numel = numel};
    zs_layout_t *l = NULL;
    char err[256];
    zs_status_t st;

    st = zs_layout_create(&spec, &l, err, sizeof(err));
    cr_assert_eq(st, ZS_ERR_OVERFLOW, "got %s: %s", zs_status_name(st), err);
    cr_assert_null(l);

    numel[0] = 1000;
    numel[1] = 1000;
    spec.max_numel = 1500;
    st = zs_layout_create(&spec, &l, err, sizeof(err));
    cr_assert_eq(st, ZS_ERR_LIMIT, "got %s", zs_status_name(st));
    cr_assert(strstr(err, "1500") != NULL, "message names the limit: %s", err);

    numel[0] = UINT64_MAX;
    spec.max_numel = 0; /* default cap */
    st = zs_layout_create(&spec, &l, err, sizeof(err));
    cr_assert(st == ZS_ERR_LIMIT || st == ZS_ERR_OVERFLOW, "got %s", zs_status_name(st));
}

Test(zs_layout, rejects_bad_spec_naming_the_field)
{
    const uint32_t gnp[] = {1};
    const uint64_t numel[] = {1};
    zs_layout_spec_t spec = {
        .world = 0, .bucket_size = 10, .n_groups = 1, .group_n_params = gnp, .numel = numel};
    zs_layout_t *l = NULL;
    char err[256];

    cr_assert_eq(zs_layout_create(&spec, &l, err, sizeof(err)), ZS_ERR_INVALID);
    cr_assert(strstr(err, "world") != NULL, "%s", err);
    spec.world = 2;
    spec.bucket_size = 0;
    cr_assert_eq(zs_layout_create(&spec, &l, err, sizeof(err)), ZS_ERR_INVALID);
    cr_assert(strstr(err, "bucket") != NULL, "%s", err);
    spec.bucket_size = 10;
    spec.elem_align = 12;
    cr_assert_eq(zs_layout_create(&spec, &l, err, sizeof(err)), ZS_ERR_INVALID);
    cr_assert(strstr(err, "elem_align") != NULL, "%s", err);
}

Test(zs_layout, hash_is_stable_and_changes_with_every_input)
{
    uint32_t gnp[] = {2, 1};
    uint64_t numel[] = {100, 7, 33};
    zs_layout_spec_t base = {.world = 4,
                             .bucket_size = 64,
                             .round_robin = false,
                             .n_groups = 2,
                             .group_n_params = gnp,
                             .numel = numel};
    zs_layout_spec_t s;
    uint64_t h = zs_layout_spec_hash(&base);
    zs_layout_t *l = make_layout(4, 64, false, 2, gnp, numel);

    /* Stable across runs and builds: this value is part of the re-attach protocol. If the
     * hash input ever changes on purpose, bump ZS_LAYOUT_HASH_TAG and this constant. */
    cr_assert_eq(h, 0x9ca145581568fb1aull, "layout hash changed: 0x%016lx", h);
    cr_assert_eq(l->hash, h);
    zs_layout_destroy(l);

    s = base;
    s.world = 3;
    cr_assert_neq(zs_layout_spec_hash(&s), h);
    s = base;
    s.bucket_size = 65;
    cr_assert_neq(zs_layout_spec_hash(&s), h);
    s = base;
    s.round_robin = true;
    cr_assert_neq(zs_layout_spec_hash(&s), h);
    s = base;
    s.elem_align = 32;
    cr_assert_neq(zs_layout_spec_hash(&s), h);
    for (int i = 0; i < 3; i++) {
        numel[i]++;
        cr_assert_neq(zs_layout_spec_hash(&base), h, "numel[%d] not hashed", i);
        numel[i]--;
    }
    cr_assert_eq(zs_layout_spec_hash(&base), h);
    gnp[0] = 1;
    gnp[1] = 2; /* same sizes, different grouping */
    cr_assert_neq(zs_layout_spec_hash(&base), h);
}
