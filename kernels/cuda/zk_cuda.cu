/*
 * zk CUDA kernels: grid-stride loops over the per-element math of zk/elem.h, so the Adam,
 * accumulate and reduce formulas and the conversions are the same text as in the CPU kernels,
 * and with the same rounding recipe (compiled with --fmad=false, IEEE division and sqrt, no
 * FTZ; NaN results canonical) they give the CPU's bits. zk_cu_sumsq sums in its own fixed
 * order (deterministic for a given n, not the CPU's order of zk/kernels.h). Launch errors
 * are returned as cudaError_t; nothing here prints.
 */
#include "zk_cu.h"

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kF32 = 0; /* zs_dtype_t values */
constexpr int kF16 = 1;
constexpr int kBF16 = 2;

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 8192;
constexpr unsigned kSumsqBlocks = ZK_CU_SUMSQ_BLOCKS;

template <int DT> __device__ __forceinline__ float ld(const void *p, size_t i)
{
    if (DT == kF16) {
        return zk_f16_to_f32(static_cast<const uint16_t *>(p)[i]);
    }
    if (DT == kBF16) {
        return zk_bf16_to_f32(static_cast<const uint16_t *>(p)[i]);
    }
    return static_cast<const float *>(p)[i];
}

template <int DT> __device__ __forceinline__ void st(void *p, size_t i, float x)
{
    if (DT == kF16) {
        static_cast<uint16_t *>(p)[i] = zk_f32_to_f16(x);
    } else if (DT == kBF16) {
        static_cast<uint16_t *>(p)[i] = zk_f32_to_bf16(x);
    } else {
        static_cast<float *>(p)[i] = x;
    }
}

__device__ __forceinline__ size_t first_index()
{
    return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t grid_stride()
{
    return static_cast<size_t>(gridDim.x) * blockDim.x;
}

unsigned blocks_for(size_t n, unsigned max_blocks)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return b < max_blocks ? static_cast<unsigned>(b) : max_blocks;
}

template <int DT, bool DST>
__global__ void adam_kernel(zk_adam_k_t k, float *p, float *m, float *v, float *a, void *dst,
                            size_t n)
{
    for (size_t i = first_index(); i < n; i += grid_stride()) {
        float mi = m[i];
        float vi = v[i];
        float x = zk_adam_elem(&k, a[i], p[i], &mi, &vi);
        p[i] = x;
        m[i] = mi;
        v[i] = vi;
        if (!k.keep_acc) {
            a[i] = 0.0f;
        }
        if (DST) {
            st<DT>(dst, i, x);
        }
    }
}

__device__ __forceinline__ void block_sum(double *sh)
{
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            sh[threadIdx.x] += sh[threadIdx.x + w];
        }
        __syncthreads();
    }
}

/* fixed grid (kSumsqBlocks at most) and fixed tree order: deterministic for a given n */
__global__ void sumsq_part_kernel(const float *x, size_t n, double *part)
{
    __shared__ double sh[kThreads];
    double s = 0.0;

    for (size_t i = first_index(); i < n; i += grid_stride()) {
        double d = x[i];
        s += d * d;
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    block_sum(sh);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = sh[0];
    }
}

__global__ void sumsq_final_kernel(double *out, unsigned nparts)
{
    __shared__ double sh[kSumsqBlocks];

    sh[threadIdx.x] = threadIdx.x < nparts ? out[1 + threadIdx.x] : 0.0;
    __syncthreads();
    block_sum(sh);
    if (threadIdx.x == 0) {
        /* one NaN whatever the payloads, the CPU's (double)NAN */
        out[0] = isnan(sh[0]) ? __longlong_as_double(0x7ff8000000000000ll) : sh[0];
    }
}

template <int DT> __global__ void accumulate_kernel(float *acc, const void *src, float s, size_t n)
{
    for (size_t i = first_index(); i < n; i += grid_stride()) {
        acc[i] = zk_accumulate_elem(acc[i], ld<DT>(src, i), s);
    }
}

template <int DT> __global__ void reduce_kernel(void *dst, const void *a, const void *b, size_t n)
{
    for (size_t i = first_index(); i < n; i += grid_stride()) {
        st<DT>(dst, i, zk_reduce_elem(ld<DT>(a, i), ld<DT>(b, i)));
    }
}

template <int DDT, int SDT> __global__ void cast_kernel(void *dst, const void *src, size_t n)
{
    for (size_t i = first_index(); i < n; i += grid_stride()) {
        st<DDT>(dst, i, ld<SDT>(src, i));
    }
}

template <int SDT> void launch_cast(int ddt, void *dst, const void *src, size_t n, cudaStream_t s)
{
    unsigned blocks = blocks_for(n, kMaxBlocks);

    switch (ddt) {
    case kF16:
        cast_kernel<kF16, SDT><<<blocks, kThreads, 0, s>>>(dst, src, n);
        break;
    case kBF16:
        cast_kernel<kBF16, SDT><<<blocks, kThreads, 0, s>>>(dst, src, n);
        break;
    default:
        cast_kernel<kF32, SDT><<<blocks, kThreads, 0, s>>>(dst, src, n);
        break;
    }
}

} // namespace

extern "C" int zk_cu_adam(const zk_adam_k_t *k, float *master, float *m, float *v, float *acc,
                          void *dst, int dtype, size_t n, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    unsigned blocks = blocks_for(n, kMaxBlocks);

    if (dst == nullptr) {
        adam_kernel<kF32, false><<<blocks, kThreads, 0, s>>>(*k, master, m, v, acc, dst, n);
    } else if (dtype == kF16) {
        adam_kernel<kF16, true><<<blocks, kThreads, 0, s>>>(*k, master, m, v, acc, dst, n);
    } else if (dtype == kBF16) {
        adam_kernel<kBF16, true><<<blocks, kThreads, 0, s>>>(*k, master, m, v, acc, dst, n);
    } else {
        adam_kernel<kF32, true><<<blocks, kThreads, 0, s>>>(*k, master, m, v, acc, dst, n);
    }
    return static_cast<int>(cudaGetLastError());
}

extern "C" int zk_cu_sumsq(const float *x, size_t n, double *out, void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    unsigned blocks = blocks_for(n, kSumsqBlocks);

    if (blocks > 0) {
        sumsq_part_kernel<<<blocks, kThreads, 0, s>>>(x, n, out + 1);
    }
    sumsq_final_kernel<<<1, kSumsqBlocks, 0, s>>>(out, blocks);
    return static_cast<int>(cudaGetLastError());
}

extern "C" int zk_cu_accumulate(float *acc, const void *src, int dtype, float sc, size_t n,
                                void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    unsigned blocks = blocks_for(n, kMaxBlocks);

    switch (dtype) {
    case kF16:
        accumulate_kernel<kF16><<<blocks, kThreads, 0, s>>>(acc, src, sc, n);
        break;
    case kBF16:
        accumulate_kernel<kBF16><<<blocks, kThreads, 0, s>>>(acc, src, sc, n);
        break;
    default:
        accumulate_kernel<kF32><<<blocks, kThreads, 0, s>>>(acc, src, sc, n);
        break;
    }
    return static_cast<int>(cudaGetLastError());
}

extern "C" int zk_cu_reduce(void *dst, const void *a, const void *b, int dtype, size_t n,
                            void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    unsigned blocks = blocks_for(n, kMaxBlocks);

    switch (dtype) {
    case kF16:
        reduce_kernel<kF16><<<blocks, kThreads, 0, s>>>(dst, a, b, n);
        break;
    case kBF16:
        reduce_kernel<kBF16><<<blocks, kThreads, 0, s>>>(dst, a, b, n);
        break;
    default:
        reduce_kernel<kF32><<<blocks, kThreads, 0, s>>>(dst, a, b, n);
        break;
    }
    return static_cast<int>(cudaGetLastError());
}

extern "C" int zk_cu_cast(void *dst, int dst_dtype, const void *src, int src_dtype, size_t n,
                          void *stream)
{
    cudaStream_t s = static_cast<cudaStream_t>(stream);

    switch (src_dtype) {
    case kF16:
        launch_cast<kF16>(dst_dtype, dst, src, n, s);
        break;
    case kBF16:
        launch_cast<kBF16>(dst_dtype, dst, src, n, s);
        break;
    default:
        launch_cast<kF32>(dst_dtype, dst, src, n, s);
        break;
    }
    return static_cast<int>(cudaGetLastError());
}
