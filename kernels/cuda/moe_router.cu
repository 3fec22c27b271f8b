// The token-choice top-k router, one warp per token (a token's experts are a few dozen to a
// few hundred): scores by warp reductions, then top-k by repeated warp argmax over the
// selection scores in shared memory, ties to the lower index as on cpu.
#include "kernels/cuda/device.cuh"

#define ROUTER_THREADS 32

// The index of the largest v[i] not yet taken, ties to the lower index, on every lane; -inf
// counts as a value (a masked group's expert is chosen when too few remain, as on cpu).
__device__ static int router_warp_argmax(const float *v, const int *taken, int n) {
    int lane = threadIdx.x, best_i = -1;
    float best = 0.0f;
    for (int i = lane; i < n; i += 32)
        if (!taken[i] && (best_i < 0 || v[i] > best)) best = v[i], best_i = i;
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, best, o);
        int other_i = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (other_i >= 0 &&
            (best_i < 0 || other > best || (other == best && other_i < best_i)))
            best = other, best_i = other_i;
    }
    return best_i;
}

// Picks k of n entries of v into taken (set to 1), one warp argmax each.
__device__ static void router_take(const float *v, int *taken, int n, int k, int *picked) {
    for (int j = 0; j < k; j++) {
        int i = router_warp_argmax(v, taken, n);
        if (threadIdx.x == 0) taken[i] = 1;
        if (picked && threadIdx.x == 0) picked[j] = i;
        __syncwarp();
    }
}

// Group-limited routing: a group's score is the sum of its top-2 selection scores; experts of
// all but the limited_groups best groups get -inf.
__device__ static void router_limit_groups(float *sel, float *group_score, int *kept,
                                           MoeRouter r) {
    int G = r.n_groups, per = r.n_experts / G;
    for (int g = threadIdx.x; g < G; g += 32) {
        float first = -INFINITY, second = -INFINITY;
        for (int i = 0; i < per; i++) {
            float s = sel[g * per + i];
            if (s > first) second = first, first = s;
            else if (s > second) second = s;
        }
        group_score[g] = first + second;
        kept[g] = 0;
    }
    __syncwarp();
    router_take(group_score, kept, G, r.limited_groups, NULL);
    for (int e = threadIdx.x; e < r.n_experts; e += 32)
        if (!kept[e / per]) sel[e] = -INFINITY;
    __syncwarp();
}

// Shared memory: sel (E), taken (E), group scores (G), kept groups (G).
static __global__ void router_forward_tokens(float *weight, int *experts, float *scores,
                                             const float *logits, const float *bias,
                                             MoeRouter r) {
    extern __shared__ float shared[];
    int E = r.n_experts, k = r.top_k, lane = threadIdx.x, G = r.n_groups > 1 ? r.n_groups : 0;
    float *sel = shared, *group_score = shared + 2 * E;
    int *taken = (int *)(shared + E), *kept = (int *)(shared + 2 * E + G);
    const float *l = logits + (size_t)blockIdx.x * E;
    float *s = scores + (size_t)blockIdx.x * E;
    float mx = -INFINITY, sum = 0.0f;
    if (r.score_func == MOE_SCORE_SOFTMAX) {
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
        mx = warp_max(mx);
        for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
        sum = warp_sum(sum);
    }
    for (int e = lane; e < E; e += 32) {
        float v = r.score_func == MOE_SCORE_SIGMOID ? 1.0f / (1.0f + expf(-l[e]))
                                                    : expf(l[e] - mx) / sum;
        s[e] = v;
        sel[e] = v + (bias ? bias[e] : 0.0f);
        taken[e] = 0;
    }
    __syncwarp();
    if (G) router_limit_groups(sel, group_score, kept, r);
    int *chosen = experts + (size_t)blockIdx.x * k;
    router_take(sel, taken, E, k, chosen);
    if (lane != 0) return;
    float *w = weight + (size_t)blockIdx.x * k, total = 0.0f;
    for (int j = 0; j < k; j++) total += s[chosen[j]];
    for (int j = 0; j < k; j++) {  // in torch's order: divide by the sum, then scale
        float v = s[chosen[j]];
        if (r.route_norm) v /= total + 1e-20f;
        w[j] = v * r.route_scale;
    }
}

// Shared memory: dscores (E). Lane 0 fills the chosen experts' (k of them), as on cpu:
// weight_j = c s_j / D, D = sum_i s_i + 1e-20 under route_norm, else c s_j.
static __global__ void router_backward_tokens(float *dlogits, const float *dweight,
                                              const float *scores, const int *experts,
                                              MoeRouter r) {
    extern __shared__ float ds[];
    int E = r.n_experts, k = r.top_k, lane = threadIdx.x;
    const float *s = scores + (size_t)blockIdx.x * E, *dw = dweight + (size_t)blockIdx.x * k;
    const int *chosen = experts + (size_t)blockIdx.x * k;
    float *dl = dlogits + (size_t)blockIdx.x * E;
    for (int e = lane; e < E; e += 32) ds[e] = 0.0f;
    __syncwarp();
    if (lane == 0) {
        float sum = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) sum += s[chosen[j]];
        float D = sum + 1e-20f;
        for (int j = 0; j < k; j++) dot += dw[j] * s[chosen[j]];
        for (int j = 0; j < k; j++)
            ds[chosen[j]] = r.route_norm ? r.route_scale * (dw[j] - dot / D) / D
                                         : r.route_scale * dw[j];
    }
    __syncwarp();
    if (r.score_func == MOE_SCORE_SIGMOID) {
        for (int e = lane; e < E; e += 32) dl[e] += ds[e] * s[e] * (1.0f - s[e]);
        return;
    }
    float dot = 0.0f;  // softmax: dlogit_e = s_e (ds_e - sum_f ds_f s_f)
    for (int e = lane; e < E; e += 32) dot += ds[e] * s[e];
    dot = warp_sum(dot);
    for (int e = lane; e < E; e += 32) dl[e] += s[e] * (ds[e] - dot);
}

void cuda_moe_router_forward(float *weight, int *experts, float *scores, const float *logits,
                             const float *bias, const MoeRouter *r, int n) {
    CHECK(r->top_k >= 1 && r->top_k <= r->n_experts);
    CHECK(r->n_groups <= 1 || (r->n_experts % r->n_groups == 0 && r->limited_groups >= 1 &&
                               r->limited_groups <= r->n_groups));
    if (n == 0) return;  // an empty grid is a launch error
    int G = r->n_groups > 1 ? r->n_groups : 0;
    size_t shared = (size_t)(2 * r->n_experts + 2 * G) * sizeof(float);
    router_forward_tokens<<<n, ROUTER_THREADS, shared, cuda_stream()>>>(weight, experts, scores,
                                                                        logits, bias, *r);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_router_backward(float *dlogits, const float *dweight, const float *scores,
                              const int *experts, const MoeRouter *r, int n) {
    if (n == 0) return;
    size_t shared = (size_t)r->n_experts * sizeof(float);
    router_backward_tokens<<<n, ROUTER_THREADS, shared, cuda_stream()>>>(dlogits, dweight,
                                                                         scores, experts, *r);
    CUDA_LAUNCH_CHECK();
}
