/*
 * Gradients into slots with the daemon's copy plan. The trainer's copy of each gradient into
 * a slot streams a model's worth of memory every step; beyond the caches, non-temporal stores
 * do it with half the traffic on some CPUs and not on others (docs/design-notes.md). The
 * daemon measured that for its all-gather's copies (zk's "copy" family) and sends its choice
 * with each step reply; a trainer whose kernel variant differs, or that has no reply yet,
 * copies with regular stores.
 */
#include "zc_int.h"

#include <string.h>

/* prefetch distances the daemon may name: zk_prefetch_choice()'s, nothing else */
static int zc_copy_pf_known(uint32_t pf)
{
    for (int i = 0; i < ZK_PREFETCH_CHOICES; i++) {
        if (pf == zk_prefetch_choice(i)) {
            return 1;
        }
    }
    return 0;
}

static size_t zc_copy_bytes(uint64_t b)
{
    return b >= (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)b;
}

void zc_copy_plan_take(zc_copy_plan_t *cp, const Zerod__Ipc__V1__CopyStores *cs)
{
    zk_store_plan_t *p = &cp->plan;

    if (cs == NULL) {
        return;
    }
    memset(cp, 0, sizeof(*cp));
    for (int f = 0; f < ZK_STORE_FAMILIES; f++) {
        p->nt_from[f] = p->nt_to[f] = p->pf_from[f] = SIZE_MAX;
        p->pf_to[f][0] = p->pf_to[f][1] = SIZE_MAX;
    }
    if (cs->variant == NULL || strcmp(cs->variant, zk_variant_name(zk_default_variant())) != 0 ||
        !zc_copy_pf_known(cs->prefetch_regular) || !zc_copy_pf_known(cs->prefetch_nt)) {
        return; /* another variant's figures, or distances no plan chooses: regular stores */
    }
    p->variant = (int)zk_default_variant();
    p->nt_from[ZK_STORE_COPY] = zc_copy_bytes(cs->nt_from);
    p->nt_to[ZK_STORE_COPY] = zc_copy_bytes(cs->nt_to);
    p->pf_from[ZK_STORE_COPY] = zc_copy_bytes(cs->pf_from);
    p->prefetch[ZK_STORE_COPY][0] = cs->prefetch_regular;
    p->prefetch[ZK_STORE_COPY][1] = cs->prefetch_nt;
    p->pf_to[ZK_STORE_COPY][0] =
        cs->pf_to_regular == 0 ? SIZE_MAX : zc_copy_bytes(cs->pf_to_regular);
    p->pf_to[ZK_STORE_COPY][1] = cs->pf_to_nt == 0 ? SIZE_MAX : zc_copy_bytes(cs->pf_to_nt);
    p->nt[ZK_STORE_COPY] =
        p->nt_to[ZK_STORE_COPY] == SIZE_MAX && p->nt_from[ZK_STORE_COPY] != SIZE_MAX;
    cp->valid = 1;
}

zk_exec_t zc_copy_exec(const zc_copy_plan_t *cp, uint64_t bytes)
{
    zk_exec_t ex = {.variant = ZK_VARIANT_DEFAULT, .pool = NULL};
    size_t footprint = bytes > (uint64_t)SIZE_MAX / 2 ? SIZE_MAX : (size_t)bytes * 2;
    unsigned pf = 0;
    int nt = 0;

    zk_store_plan_choice(cp->valid ? &cp->plan : NULL, ZK_STORE_COPY, footprint, &nt, &pf);
    ex.stores = nt ? ZK_STORES_NT : ZK_STORES_REGULAR;
    ex.prefetch = pf > 0 ? (int)pf : -1;
    return ex;
}
