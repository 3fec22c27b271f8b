// DeepSeek V3's sequence-wise balance loss (kernels.h moe_aux_stats / moe_aux_backward): a
// thread per row. The stats add rows into their sequence's sums with atomics (cuda is not
// deterministic; kernels.h).
#include "kernels/cuda/device.cuh"

__device__ __forceinline__ float row_sum(const float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

static __global__ void aux_stats_rows(float *frac, float *prob, const float *scores,
                                      const int *experts, int E, int k, int n, int first, int T) {
    float per_slot = (float)E / ((float)k * T);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        const float *s = scores + (size_t)t * E;
        size_t b = (size_t)((first + t) / T);
        float norm = 1.0f / (row_sum(s, E) * T);
        for (int e = 0; e < E; e++) atomicAdd(&prob[b * E + e], s[e] * norm);
        for (int j = 0; j < k; j++) atomicAdd(&frac[b * E + experts[(size_t)t * k + j]], per_slot);
    }
}

// As the cpu twin: ds_j = (g f_j - dot) / S, then the score function's backward.
static __global__ void aux_backward_rows(float *dlogits, const float *frac, const float *scores,
                                         int E, bool softmax, int n, int first, int T,
                                         float dloss) {
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < n; t += gridDim.x * blockDim.x) {
        const float *s = scores + (size_t)t * E, *f = frac + (size_t)((first + t) / T) * E;
        float *dl = dlogits + (size_t)t * E, S = row_sum(s, E), g = dloss / T, dot = 0;
        for (int e = 0; e < E; e++) dot += f[e] * s[e];
        dot *= g / S;
        float ds_dot_s = 0;
        for (int e = 0; e < E; e++) ds_dot_s += (g * f[e] - dot) / S * s[e];
        for (int e = 0; e < E; e++) {
            float ds = (g * f[e] - dot) / S;
            dl[e] += softmax ? s[e] * (ds - ds_dot_s) : ds * s[e] * (1.0f - s[e]);
        }
    }
}

void cuda_moe_aux_stats(float *frac, float *prob, const float *scores, const int *experts,
                        const MoeRouter *r, int n, int first, int T) {
    aux_stats_rows<<<cuda_grid((size_t)n), CUDA_THREADS, 0, cuda_stream()>>>(
        frac, prob, scores, experts, r->n_experts, r->top_k, n, first, T);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_aux_backward(float *dlogits, const float *frac, const float *scores,
                           const MoeRouter *r, int n, int first, int T, float dloss) {
    aux_backward_rows<<<cuda_grid((size_t)n), CUDA_THREADS, 0, cuda_stream()>>>(
        dlogits, frac, scores, r->n_experts, r->score_func == MOE_SCORE_SOFTMAX, n, first, T,
        dloss);
    CUDA_LAUNCH_CHECK();
}
