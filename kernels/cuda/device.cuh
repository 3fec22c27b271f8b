// Device-side helpers the cuda op files share: launch shapes and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda.h"

#define CUDA_THREADS 256  // threads per block of the elementwise kernels

// Blocks for a grid-stride loop over n elements: enough to fill the device, never more than
// the elements need.
static inline unsigned cuda_grid(size_t n) {
    size_t want = (n + CUDA_THREADS - 1) / CUDA_THREADS, cap = (size_t)cuda_sm_count() * 8;
    return (unsigned)(want < 1 ? 1 : want < cap ? want : cap);
}

// core/bf16.h's rounding bit for bit: nearest even on the 16 dropped bits, and a NaN becomes the
// quiet NaN of its sign (cvt.rn.bf16.f32 keeps payload bits instead).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
    uint32_t bits = __float_as_uint(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return ((bits >> 16) & 0x8000u) | 0x7fc0u;
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// Two bf16 in one little-endian word: a at the lower address.
__device__ __forceinline__ uint32_t bf16_pair(float a, float b) {
    return bf16_bits(a) | bf16_bits(b) << 16;
}

// Element i of out, an fp32 or bf16 tensor (a typed op's output), set to v.
__device__ __forceinline__ void store_as(void *out, Dtype type, size_t i, float v) {
    if (type == DTYPE_BF16)
        ((uint16_t *)out)[i] = (uint16_t)bf16_bits(v);
    else
        ((float *)out)[i] = v;
}

// Every launch is checked where it is made (the launch itself reports no error).
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// The sum (or max) over the block's threads, returned to every thread. shared: 32 floats.
// Every thread of the block must call it (it synchronises), and blockDim.x must be a multiple
// of 32 and at most 1024: the shuffles name all 32 lanes, and shared holds one slot a warp.
__device__ __forceinline__ float block_sum(float x, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    x = warp_sum(x);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < n_warps ? shared[lane] : 0.0f;
    return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x, float *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < n_warps ? shared[lane] : -INFINITY;
    return warp_max(x);
}
