// Two partial attentions of the same queries over disjoint keys merged by their log-sum-exp,
// in place (context parallel's ring): one warp per (b, t, head) row, whose lanes all read the
// row's two lse values before lane 0 overwrites one.
#include <math.h>

#include "kernels/cuda/device.cuh"

static __global__ void attn_merge_rows(float *out, float *lse, const float *out2,
                                       const float *lse2, int B, int T, int H, int D) {
    int lane = threadIdx.x & 31;
    size_t rows = (size_t)B * T * H, warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += warps) {
        size_t bt = row / H, h = row % H, b = bt / T, t = bt % T, l = (b * H + h) * T + t;
        float a = lse[l], c = lse2[l], m = fmaxf(a, c), wa = 0.0f, wc = 0.0f, merged = -INFINITY;
        if (m != -INFINITY) {  // else neither side saw a key: out 0, lse -inf
            float ea = expf(a - m), ec = expf(c - m), sum = ea + ec;
            wa = ea / sum, wc = ec / sum, merged = m + logf(sum);
        }
        float *o = out + row * D;
        const float *o2 = out2 + row * D;
        for (int d = lane; d < D; d += 32) o[d] = wa * o[d] + wc * o2[d];
        __syncwarp();
        if (lane == 0) lse[l] = merged;
    }
}

void cuda_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B,
                          int T, int n_heads, int head_dim) {
    size_t rows = (size_t)B * T * n_heads;
    attn_merge_rows<<<cuda_grid(rows * 32), CUDA_THREADS, 0, cuda_stream()>>>(
        out, lse, out2, lse2, B, T, n_heads, head_dim);
    CUDA_LAUNCH_CHECK();
}
