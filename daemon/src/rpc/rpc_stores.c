/*
 * The kernels' plan for same-type copies, handed to the trainer in StepReply (ipc.proto
 * CopyStores): the trainer copies each gradient into a slot, and the daemon has already
 * measured how copies stream best on this machine, so the trainer measures nothing. Part of
 * rpc.
 */
#include "rpc/rpc_int.h"
#include "zk/kernels.h"

#include <stdint.h>

static uint64_t zd_rpc_bytes(size_t b)
{
    return b == SIZE_MAX ? UINT64_MAX : (uint64_t)b;
}

Zerod__Ipc__V1__CopyStores *zd_rpc_copy_stores(Zerod__Ipc__V1__CopyStores *cs)
{
    const zk_store_plan_t *plan = zk_store_plan_measured();

    if (plan == NULL) {
        return NULL;
    }
    cs->variant = (char *)zk_variant_name((zk_variant_t)plan->variant);
    cs->nt_from = zd_rpc_bytes(plan->nt_from[ZK_STORE_COPY]);
    cs->nt_to = zd_rpc_bytes(plan->nt_to[ZK_STORE_COPY]);
    cs->prefetch_regular = plan->prefetch[ZK_STORE_COPY][0];
    cs->prefetch_nt = plan->prefetch[ZK_STORE_COPY][1];
    cs->pf_from = zd_rpc_bytes(plan->pf_from[ZK_STORE_COPY]);
    cs->pf_to_regular =
        plan->pf_to[ZK_STORE_COPY][0] == SIZE_MAX ? 0 : plan->pf_to[ZK_STORE_COPY][0];
    cs->pf_to_nt = plan->pf_to[ZK_STORE_COPY][1] == SIZE_MAX ? 0 : plan->pf_to[ZK_STORE_COPY][1];
    return cs;
}
