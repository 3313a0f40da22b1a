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

/* Element i: Adam on the master, its moments and the accumulator, the result cast into dst. */
template <int DT, bool DST>
__device__ __forceinline__ void adam_one(const zk_adam_k_t &k, float *p, float *m, float *v,
                                         float *a, void *dst, size_t i)
{
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

template <int DT, bool DST>
__global__ void adam_kernel(zk_adam_k_t k, float *p, float *m, float *v, float *a, void *dst,
                            size_t n)
{
    for (size_t i = first_index(); i < n; i += grid_stride()) {
        adam_one<DT, DST>(k, p, m, v, a, dst, i);
    }
}

/* Four results into dst at element 4*j: one 16-byte (fp32) or 8-byte (fp16/bf16) store. */
template <int DT> __device__ __forceinline__ void st4(void *dst, size_t j, const float (&x)[4])
{
    if (DT == kF32) {
        __stcs(static_cast<float4 *>(dst) + j, make_float4(x[0], x[1], x[2], x[3]));
    } else {
        uint16_t h[4];
        for (int e = 0; e < 4; e++) {
            h[e] = DT == kF16 ? zk_f32_to_f16(x[e]) : zk_f32_to_bf16(x[e]);
        }
        __stcs(static_cast<uint2 *>(dst) + j,
               make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16),
                          h[2] | (static_cast<uint32_t>(h[3]) << 16)));
    }
}

/* The same per-element math four elements at a time, with 16-byte streaming loads and stores
 * (every byte is touched once: evict-first), when every array is aligned for them; the last
 * n % 4 elements one each, by the first threads. */
template <int DT, bool DST>
__global__ void adam_vec_kernel(zk_adam_k_t k, float4 *p, float4 *m, float4 *v, float4 *a,
                                void *dst, size_t n)
{
    size_t n4 = n / 4;

    for (size_t j = first_index(); j < n4; j += grid_stride()) {
        float4 pj = __ldcs(p + j), mj = __ldcs(m + j), vj = __ldcs(v + j), aj = __ldcs(a + j);
        float x[4];
        x[0] = zk_adam_elem(&k, aj.x, pj.x, &mj.x, &vj.x);
        x[1] = zk_adam_elem(&k, aj.y, pj.y, &mj.y, &vj.y);
        x[2] = zk_adam_elem(&k, aj.z, pj.z, &mj.z, &vj.z);
        x[3] = zk_adam_elem(&k, aj.w, pj.w, &mj.w, &vj.w);
        __stcs(p + j, make_float4(x[0], x[1], x[2], x[3]));
        __stcs(m + j, mj);
        __stcs(v + j, vj);
        if (!k.keep_acc) {
            __stcs(a + j, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
        if (DST) {
            st4<DT>(dst, j, x);
        }
    }
    size_t i = 4 * n4 + first_index();
    if (i < n) {
        adam_one<DT, DST>(k, reinterpret_cast<float *>(p), reinterpret_cast<float *>(m),
                          reinterpret_cast<float *>(v), reinterpret_cast<float *>(a), dst, i);
    }
}

bool aligned(const void *ptr, uintptr_t bytes)
{
    return (reinterpret_cast<uintptr_t>(ptr) & (bytes - 1)) == 0;
}

template <int DT, bool DST>
void launch_adam(const zk_adam_k_t &k, float *p, float *m, float *v, float *a, void *dst, size_t n,
                 cudaStream_t s)
{
    bool vec = aligned(p, 16) && aligned(m, 16) && aligned(v, 16) && aligned(a, 16) &&
               (!DST || aligned(dst, DT == kF32 ? 16 : 8));

    if (vec) {
        unsigned blocks = blocks_for((n + 3) / 4, kMaxBlocks);
        adam_vec_kernel<DT, DST><<<blocks, kThreads, 0, s>>>(
            k, reinterpret_cast<float4 *>(p), reinterpret_cast<float4 *>(m),
            reinterpret_cast<float4 *>(v), reinterpret_cast<float4 *>(a), dst, n);
    } else {
        adam_kernel<DT, DST><<<blocks_for(n, kMaxBlocks), kThreads, 0, s>>>(k, p, m, v, a, dst, n);
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

    if (dst == nullptr) {
        launch_adam<kF32, false>(*k, master, m, v, acc, dst, n, s);
    } else if (dtype == kF16) {
        launch_adam<kF16, true>(*k, master, m, v, acc, dst, n, s);
    } else if (dtype == kBF16) {
        launch_adam<kBF16, true>(*k, master, m, v, acc, dst, n, s);
    } else {
        launch_adam<kF32, true>(*k, master, m, v, acc, dst, n, s);
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
