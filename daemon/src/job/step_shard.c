/*
 * A job's shard in memory as the step and the replica see it (job/job_int.h): where this rank's
 * slice of each bucket lies in a full-layout region, the fp32 master's slices, and dropping a
 * partial accumulation. Below step.c and replica.c, which both use it.
 */
#define _GNU_SOURCE
#include "job/job_int.h"

#include <string.h>

/* This rank's slice of bucket b inside a full-layout region of the job's dtype. */
void *zd_step_slice_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b)
{
    const zs_layout_bucket_t *bk = &job->layout->buckets[b];
    uint64_t elem = bk->offset + (uint64_t)job->rank * bk->slice;

    return (char *)region->addr + elem * zs_dtype_size(job->dtype);
}

/* This rank's whole bucket b inside a full-layout region. */
void *zd_step_bucket_ptr(const zd_job_t *job, const zs_region_t *region, uint32_t b)
{
    return (char *)region->addr + job->layout->buckets[b].offset * zs_dtype_size(job->dtype);
}

/* Bucket b's slice of the fp32 master: in the params region itself when shared. */
float *zd_step_master(const zd_job_t *job, uint32_t b)
{
    if (job->master_shared) {
        return (float *)zd_step_slice_ptr(job, &job->params, b);
    }
    return job->master + job->layout->buckets[b].shard_offset;
}

void zd_step_master_sumsq(const zd_job_t *job, double *sumsq_p, int *nonfinite_p)
{
    const zs_layout_t *l = job->layout;

    *sumsq_p = 0.0;
    *nonfinite_p = 0;
    if (!job->master_shared) {
        (void)zd_backend_sumsq(job->be, job->master, l->shard_numel, sumsq_p, nonfinite_p);
        return;
    }
    if (!job->params_loaded) {
        return; /* the region may hold a first trainer's partial writes: no master yet */
    }
    for (uint32_t b = 0; b < l->n_buckets; b++) {
        double s = 0.0;
        int nf = 0;
        (void)zd_backend_sumsq(job->be, zd_step_master(job, b), l->buckets[b].slice, &s, &nf);
        *sumsq_p += s;
        *nonfinite_p |= nf;
    }
}

void zd_step_drop_partial(zd_job_t *job)
{
    /* a failure here (a device error) surfaces again at the next kernel on the device */
    (void)zd_backend_zero(job->be, job->acc, (size_t)job->mem_bytes[ZD_MEM_ACC]);
    memset(job->acc_clean, 1, job->layout->n_buckets);
    memset(job->slice_norm, 0, job->layout->n_buckets * sizeof(*job->slice_norm));
    job->acc_stale = false;
    if (job->grads.addr != NULL) {
        (void)zd_backend_zero(job->be, job->grads.addr, job->grads.size);
    }
}
