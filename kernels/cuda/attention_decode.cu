// One decoding step: each query head's single row against rows [0, n_ctx) of the KV cache, in
// fp32. One block per query head; its warps take interleaved 32-key chunks (lane j: key j of the
// chunk) and each keeps the online softmax of FlashAttention (Milakov & Gimelshein 2018; Dao
// 2023) over its chunks: a running max, a running sum and the output rescaled to that max. The
// warps' partial results merge at the end, so the cache is read once and nothing grows with
// n_ctx.
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/device.cuh"

#define DECODE_WARPS 8
#define DECODE_FULL_MASK 0xffffffffu

// q . k over head_dim, q in shared memory and k in the cache; float4 loads when the rows allow
// them, summed in the same order either way.
static __device__ __forceinline__ float decode_dot(const float *qs, const float *k, int D,
                                                   bool vec4) {
    float s = 0.0f;
    if (vec4) {
        for (int d = 0; d < D; d += 4) {
            float4 x = *(const float4 *)(k + d);
            s += qs[d] * x.x;
            s += qs[d + 1] * x.y;
            s += qs[d + 2] * x.z;
            s += qs[d + 3] * x.w;
        }
    } else {
        for (int d = 0; d < D; d++) s += qs[d] * k[d];
    }
    return s;
}

// One warp's update over n <= 32 keys of a chunk (lane j: key j; cache rows ld apart): the
// scores, the new running max m, the running sum l and acc (this lane's columns d = lane + 32c
// of sum_j p_j v_j) rescaled to that max.
template <int NC>
static __device__ __forceinline__ void decode_chunk(float *m, float *l, float acc[NC],
                                                    const float *qs, const float *k,
                                                    const float *v, int ld, int n, int D,
                                                    bool vec4, float scale) {
    int lane = threadIdx.x & 31;
    float s = lane < n ? decode_dot(qs, k + (size_t)lane * ld, D, vec4) * scale : -INFINITY;
    float m_new = fmaxf(*m, warp_max(s));  // finite: the chunk has a key
    float p = lane < n ? expf(s - m_new) : 0.0f, alpha = expf(*m - m_new);  // 0 at first
    *l = *l * alpha + warp_sum(p);
    *m = m_new;
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] *= alpha;
    for (int j = 0; j < n; j++) {
        float pj = __shfl_sync(DECODE_FULL_MASK, p, j);
        const float *vj = v + (size_t)j * ld;
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < D) acc[c] += pj * vj[lane + 32 * c];
    }
}

// The warps' partial outputs os (DECODE_WARPS, D), each relative to its own max ms with sum ls,
// rescaled to the common max and summed; a warp that saw no key (max -inf) weighs 0.
static __device__ void decode_merge(float *out, const float *os, const float *ms,
                                    const float *ls, int D) {
    float mx = -INFINITY, sum = 0.0f;
    for (int w = 0; w < DECODE_WARPS; w++) mx = fmaxf(mx, ms[w]);
    for (int w = 0; w < DECODE_WARPS; w++) sum += ls[w] * expf(ms[w] - mx);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < DECODE_WARPS; w++) o += os[w * D + d] * expf(ms[w] - mx);
        out[d] = o / sum;
    }
}

template <int NC>
static __global__ void __launch_bounds__(DECODE_WARPS * 32)
    decode_heads(float *out, const float *q, const float *k_cache, const float *v_cache,
                 int n_ctx, int group, int ld, int D, bool vec4) {
    extern __shared__ float smem[];
    float *qs = smem, *os = qs + D, *ms = os + DECODE_WARPS * D, *ls = ms + DECODE_WARPS;
    int h = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *k = k_cache + (size_t)(h / group) * D, *v = v_cache + (size_t)(h / group) * D;
    float scale = 1.0f / sqrtf((float)D), m = -INFINITY, l = 0.0f, acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = q[(size_t)h * D + d];
    __syncthreads();
    for (int j0 = warp * 32; j0 < n_ctx; j0 += DECODE_WARPS * 32)
        decode_chunk<NC>(&m, &l, acc, qs, k + (size_t)j0 * ld, v + (size_t)j0 * ld, ld,
                         min(n_ctx - j0, 32), D, vec4, scale);
    if (lane == 0) ms[warp] = m, ls[warp] = l;
#pragma unroll
    for (int c = 0; c < NC; c++)
        if (lane + 32 * c < D) os[warp * D + lane + 32 * c] = acc[c];
    __syncthreads();
    decode_merge(out + (size_t)h * D, os, ms, ls, D);
}

template <int NC>
static void decode_launch(float *out, const float *q, const float *k_cache, const float *v_cache,
                          int n_ctx, int n_heads, int n_kv_heads, int head_dim) {
    int ld = n_kv_heads * head_dim;
    // Every cache row then starts on a 16-byte boundary: ld and the kv head offset are whole
    // multiples of 4 floats.
    bool vec4 = head_dim % 4 == 0 && ((uintptr_t)k_cache & 15) == 0;
    size_t smem = ((size_t)(1 + DECODE_WARPS) * head_dim + 2 * DECODE_WARPS) * sizeof(float);
    decode_heads<NC><<<n_heads, DECODE_WARPS * 32, smem, cuda_stream()>>>(
        out, q, k_cache, v_cache, n_ctx, n_heads / n_kv_heads, ld, head_dim, vec4);
    CUDA_LAUNCH_CHECK();
}

void cuda_attention_decode(float *out, const float *q, const float *k_cache,
                           const float *v_cache, int n_ctx, int n_heads, int n_kv_heads,
                           int head_dim) {
    // up to MLA's latent, one head of kv_lora_rank + qk_rope_head_dim (DeepSeek-V3's 576)
    CHECK(head_dim >= 1 && head_dim <= 576);
    int nc = (head_dim + 31) / 32;  // columns per lane, rounded up to an instantiation
    if (nc == 1)
        decode_launch<1>(out, q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_dim);
    else if (nc == 2)
        decode_launch<2>(out, q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_dim);
    else if (nc <= 4)
        decode_launch<4>(out, q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_dim);
    else if (nc <= 8)
        decode_launch<8>(out, q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_dim);
    else
        decode_launch<18>(out, q, k_cache, v_cache, n_ctx, n_heads, n_kv_heads, head_dim);
}
