// RMSNorm and LayerNorm, one block per row for the row-wise passes. RMSNorm reads a row as
// float4 groups when dim is a multiple of 4 and every base pointer is 16-byte aligned (then every
// row is), else one float at a time. Its weight gradient is a sum over rows, kept deterministic
// without atomics: blocks own (row chunk, column tile) pairs and write per-chunk partials to
// cuda_scratch(), then one thread per column adds its chunks in chunk order into dweight.
#include <stdint.h>

#include "kernels/cuda/device.cuh"

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// out = x r w, r = 1 / sqrt(mean(x^2) + eps), in the cpu twin's operation order.
// vec: x and weight read as float4 (an fp32 out written so too).
static __global__ void rmsnorm_forward_rows(void *out, Dtype out_type, float *rstd,
                                            const float *x, const float *weight, int dim,
                                            float eps, bool vec) {
    __shared__ float shared[32];
    size_t row = blockIdx.x;
    const float *xr = x + row * dim;
    int d4 = vec ? dim / 4 : 0;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d4; j += blockDim.x) {
        float4 v = ((const float4 *)xr)[j];
        ss += dot4(v, v);
    }
    for (int j = 4 * d4 + threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
    float r = 1.0f / sqrtf(block_sum(ss, shared) / dim + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    size_t first = row * dim;
    for (int j = threadIdx.x; j < d4; j += blockDim.x) {
        float4 v = ((const float4 *)xr)[j], w = ((const float4 *)weight)[j];
        float4 o = make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
        if (out_type == DTYPE_FP32) {
            ((float4 *)((float *)out + first))[j] = o;
        } else {
            size_t at = first + 4 * (size_t)j;
            ((uint2 *)out)[at / 4] = make_uint2(bf16_pair(o.x, o.y), bf16_pair(o.z, o.w));
        }
    }
    for (int j = 4 * d4 + threadIdx.x; j < dim; j += blockDim.x)
        store_as(out, out_type, first + j, xr[j] * r * weight[j]);
}

// y = x r w with dr/dx_j = -r^3 x_j / dim, so dx_j += r (dy_j w_j - x_j r^2 mean(dy w x)).
static __global__ void rmsnorm_backward_rows(float *dx, const float *dout, const float *x,
                                             const float *weight, const float *rstd, int dim,
                                             bool vec) {
    __shared__ float shared[32];
    size_t row = blockIdx.x;
    const float *xr = x + row * dim, *gr = dout + row * dim;
    float *dxr = dx + row * dim;
    int d4 = vec ? dim / 4 : 0;
    float dot = 0.0f;
    for (int j = threadIdx.x; j < d4; j += blockDim.x) {
        float4 g = ((const float4 *)gr)[j], w = ((const float4 *)weight)[j];
        float4 v = ((const float4 *)xr)[j];
        dot += g.x * w.x * v.x + g.y * w.y * v.y + g.z * w.z * v.z + g.w * w.w * v.w;
    }
    for (int j = 4 * d4 + threadIdx.x; j < dim; j += blockDim.x) dot += gr[j] * weight[j] * xr[j];
    float r = rstd[row];
    float c = r * r * block_sum(dot, shared) / dim;
    for (int j = threadIdx.x; j < d4; j += blockDim.x) {
        float4 g = ((const float4 *)gr)[j], w = ((const float4 *)weight)[j];
        float4 v = ((const float4 *)xr)[j], d = ((float4 *)dxr)[j];
        d.x += r * (g.x * w.x - v.x * c);
        d.y += r * (g.y * w.y - v.y * c);
        d.z += r * (g.z * w.z - v.z * c);
        d.w += r * (g.w * w.w - v.w * c);
        ((float4 *)dxr)[j] = d;
    }
    for (int j = 4 * d4 + threadIdx.x; j < dim; j += blockDim.x)
        dxr[j] += r * (gr[j] * weight[j] - xr[j] * c);
}

// partials[chunk][j] = sum over the chunk's rows i of dout[i][j] x[i][j] rstd[i]; block
// (tile, chunk), one column per thread, rows in order (a warp reads 32 adjacent floats a row).
static __global__ void rmsnorm_dweight_partials(float *partials, const float *dout,
                                                const float *x, const float *rstd, int n,
                                                int dim, int chunk_rows) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    int i0 = blockIdx.y * chunk_rows, i1 = min(i0 + chunk_rows, n);
    float acc = 0.0f;
    for (int i = i0; i < i1; i++) {
        size_t k = (size_t)i * dim + j;
        acc += dout[k] * x[k] * rstd[i];
    }
    partials[(size_t)blockIdx.y * dim + j] = acc;
}

static __global__ void rmsnorm_dweight_finish(float *dweight, const float *partials, int dim,
                                              int n_chunks) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < dim; j += gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int c = 0; c < n_chunks; c++) s += partials[(size_t)c * dim + j];
        dweight[j] += s;
    }
}

void cuda_rmsnorm_forward(void *out, Dtype out_type, float *rstd, const float *x,
                          const float *weight, int n, int dim, float eps) {
    CHECK(out_type == DTYPE_FP32 || out_type == DTYPE_BF16);
    if (n == 0) return;  // an empty grid is a launch error
    // A bf16 row of dim % 4 == 0 elements is 8-byte aligned when the tensor is.
    bool vec = dim % 4 == 0 && aligned16(x) && aligned16(weight) &&
               (out_type == DTYPE_FP32 ? aligned16(out) : (uintptr_t)out % 8 == 0);
    rmsnorm_forward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(out, out_type, rstd, x, weight,
                                                                dim, eps, vec);
    CUDA_LAUNCH_CHECK();
}

// Row chunks: as many as fill the device next to the column tiles (cuda_grid's cap of 8 blocks
// an SM), never more than the rows; so the partials stay near 8 * SMs * CUDA_THREADS floats.
static void rmsnorm_backward_weight(float *dweight, const float *dout, const float *x,
                                    const float *rstd, int n, int dim) {
    int tiles = (dim + CUDA_THREADS - 1) / CUDA_THREADS;
    int want = cuda_sm_count() * 8 / tiles;
    want = want < 1 ? 1 : want < n ? want : n;
    int chunk_rows = (n + want - 1) / want, n_chunks = (n + chunk_rows - 1) / chunk_rows;
    CHECK((size_t)n_chunks * dim * sizeof(float) <= CUDA_SCRATCH);
    float *partials = (float *)cuda_scratch();
    rmsnorm_dweight_partials<<<dim3(tiles, n_chunks), CUDA_THREADS, 0, cuda_stream()>>>(
        partials, dout, x, rstd, n, dim, chunk_rows);
    CUDA_LAUNCH_CHECK();
    rmsnorm_dweight_finish<<<cuda_grid(dim), CUDA_THREADS, 0, cuda_stream()>>>(dweight, partials,
                                                                               dim, n_chunks);
    CUDA_LAUNCH_CHECK();
}

void cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                           const float *weight, const float *rstd, int n, int dim) {
    if (n == 0 || dim == 0) return;  // nothing to do, and no column tiles to size chunks by
    bool vec = dim % 4 == 0 && aligned16(dx) && aligned16(dout) && aligned16(x) &&
               aligned16(weight);
    rmsnorm_backward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(dx, dout, x, weight, rstd, dim,
                                                                 vec);
    CUDA_LAUNCH_CHECK();
    if (dweight) rmsnorm_backward_weight(dweight, dout, x, rstd, n, dim);
}

// LayerNorm without affine: the cpu twin's two passes (the mean, then the variance about it).
static __global__ void layernorm_forward_rows(float *out, float *mean, float *rstd,
                                              const float *x, int dim, float eps) {
    __shared__ float shared[32];
    size_t row = blockIdx.x;
    const float *xr = x + row * dim;
    float *o = out + row * dim;
    float sum = 0.0f, ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) sum += xr[j];
    float mu = block_sum(sum, shared) / dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += (xr[j] - mu) * (xr[j] - mu);
    float r = 1.0f / sqrtf(block_sum(ss, shared) / dim + eps);
    if (threadIdx.x == 0) mean[row] = mu, rstd[row] = r;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = (xr[j] - mu) * r;
}

// y = (x - mu) r, so dx += r (dout - mean(dout) - y mean(dout y)).
static __global__ void layernorm_backward_rows(float *dx, const float *dout, const float *x,
                                               const float *mean, const float *rstd, int dim) {
    __shared__ float shared[32];
    size_t row = blockIdx.x;
    const float *xr = x + row * dim, *gr = dout + row * dim;
    float *dxr = dx + row * dim;
    float mu = mean[row], r = rstd[row], g_sum = 0.0f, gy_sum = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        g_sum += gr[j];
        gy_sum += gr[j] * (xr[j] - mu) * r;
    }
    float g_mean = block_sum(g_sum, shared) / dim, gy_mean = block_sum(gy_sum, shared) / dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        dxr[j] += r * (gr[j] - g_mean - (xr[j] - mu) * r * gy_mean);
}

void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *x, int n, int dim,
                            float eps) {
    if (n == 0) return;  // an empty grid is a launch error
    layernorm_forward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(out, mean, rstd, x, dim, eps);
    CUDA_LAUNCH_CHECK();
}

void cuda_layernorm_backward(float *dx, const float *dout, const float *x, const float *mean,
                             const float *rstd, int n, int dim) {
    if (n == 0) return;
    layernorm_backward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(dx, dout, x, mean, rstd, dim);
    CUDA_LAUNCH_CHECK();
}
