// sum and sum_squares in double precision. Each block accumulates its grid-stride share in
// double and writes one partial to cuda_scratch(); one block then adds the partials in a fixed
// tree and the host downloads that total. The grid, the thread-to-element map and both trees
// depend only on n (and the device's SM count), so the result is the same on every call.
#include <stdint.h>

#include "kernels/cuda/device.cuh"

__device__ __forceinline__ double warp_sum_double(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// block_sum of device.cuh in double, for one call per kernel (so shared is not yet in use).
__device__ __forceinline__ double block_sum_double(double x, double *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    x = warp_sum_double(x);
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < n_warps ? shared[lane] : 0.0;
    return warp_sum_double(x);
}

__device__ __forceinline__ double reduce_term(float v, bool squares) {
    return squares ? (double)v * v : (double)v;
}

// partials[blockIdx.x] = the block's sum over x[i] (or x[i]^2): float4 groups [0, n4), then
// the elements from 4 * n4 on.
static __global__ void reduce_block_partials(double *partials, const float *x, size_t n,
                                             size_t n4, bool squares) {
    __shared__ double shared[32];
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    double s = 0.0;
    for (size_t i = first; i < n4; i += stride) {
        float4 v = ((const float4 *)x)[i];
        s += reduce_term(v.x, squares) + reduce_term(v.y, squares) + reduce_term(v.z, squares) +
             reduce_term(v.w, squares);
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride) s += reduce_term(x[i], squares);
    s = block_sum_double(s, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// One block: partials[n_partials] = sum of partials[0, n_partials).
static __global__ void reduce_total(double *partials, int n_partials) {
    __shared__ double shared[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n_partials; i += blockDim.x) s += partials[i];
    s = block_sum_double(s, shared);
    if (threadIdx.x == 0) partials[n_partials] = s;
}

static double reduce_floats(const float *x, size_t n, bool squares) {
    size_t n4 = ((uintptr_t)x & 15) == 0 ? n / 4 : 0;
    unsigned grid = cuda_grid(n4 ? n4 + n % 4 : n);
    CHECK((grid + 1) * sizeof(double) <= CUDA_SCRATCH);
    double *partials = (double *)cuda_scratch(), total;
    reduce_block_partials<<<grid, CUDA_THREADS, 0, cuda_stream()>>>(partials, x, n, n4, squares);
    CUDA_LAUNCH_CHECK();
    reduce_total<<<1, CUDA_THREADS, 0, cuda_stream()>>>(partials, (int)grid);
    CUDA_LAUNCH_CHECK();
    // On the stream, after the queued work that produces x; the wait makes total readable.
    CUDA_CHECK(cudaMemcpyAsync(&total, partials + grid, sizeof total, cudaMemcpyDeviceToHost,
                               cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
    return total;
}

double cuda_sum_squares(const float *x, size_t n) { return reduce_floats(x, n, true); }

double cuda_sum(const float *x, size_t n) { return reduce_floats(x, n, false); }
