// The rectified-flow model's input and loss pieces (the cpu twin: kernels/cpu/diffusion.c): the
// timestep embedding and the squared error of the predicted velocity.
#include <math.h>

#include "kernels/cuda/device.cuh"

// One thread an element, with the cpu twin's fp32 roundings (kernels/ops.def says which).
static __global__ void timestep_embedding_elements(float *out, const float *t, int B, int dim,
                                                   float neg_log, float time_factor) {
    int h = dim / 2;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < (size_t)B * dim;
         k += (size_t)gridDim.x * blockDim.x) {
        int b = (int)(k / dim), col = (int)(k % dim), i = col < h ? col : col - h;
        if (col >= 2 * h) {  // the odd width's last column
            out[k] = 0.0f;
            continue;
        }
        float f = (float)exp((double)(neg_log * (float)i / (float)h)), a = time_factor * t[b] * f;
        out[k] = col < h ? (float)cos((double)a) : (float)sin((double)a);
    }
}

// A warp per row (rows are a patch's channels, 64 for FLUX: a block per row would idle).
static __global__ void squared_error_rows(float *sq, const float *pred, const float *target,
                                          int n, int dim) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (row >= (size_t)n) return;  // whole warps: the row is the same across a warp's lanes
    const float *p = pred + row * dim, *q = target + row * dim;
    float s = 0.0f;
    for (int j = lane; j < dim; j += 32) s += (p[j] - q[j]) * (p[j] - q[j]);
    s = warp_sum(s);
    if (lane == 0) sq[row] = s;
}

static __global__ void squared_error_backward_elements(float *dpred, const float *pred,
                                                       const float *target, size_t count,
                                                       float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        dpred[i] += scale * 2.0f * (pred[i] - target[i]);
}

void cuda_timestep_embedding(float *out, const float *t, int B, int dim, float max_period,
                             float time_factor) {
    float neg_log = (float)-log((double)max_period);
    timestep_embedding_elements<<<cuda_grid((size_t)B * dim), CUDA_THREADS, 0, cuda_stream()>>>(
        out, t, B, dim, neg_log, time_factor);
    CUDA_LAUNCH_CHECK();
}

void cuda_squared_error_forward(float *sq, const float *pred, const float *target, int n,
                                int dim) {
    if (n == 0) return;  // an empty grid is a launch error
    size_t rows_per_block = CUDA_THREADS / 32, blocks = (n + rows_per_block - 1) / rows_per_block;
    squared_error_rows<<<(unsigned)blocks, CUDA_THREADS, 0, cuda_stream()>>>(sq, pred, target, n,
                                                                             dim);
    CUDA_LAUNCH_CHECK();
}

void cuda_squared_error_backward(float *dpred, const float *pred, const float *target,
                                 size_t count, float scale) {
    squared_error_backward_elements<<<cuda_grid(count), CUDA_THREADS, 0, cuda_stream()>>>(
        dpred, pred, target, count, scale);
    CUDA_LAUNCH_CHECK();
}
