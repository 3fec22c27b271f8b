// Attention of one new token over a KV cache with the online softmax (Milakov & Gimelshein
// 2018, as FlashAttention's inner loop): keys go in chunks whose scores live on the stack, and
// the running max and sum rescale the output accumulated so far, so nothing grows with the
// context but the cache itself.
#include <math.h>

#include "kernels/cpu/cpu.h"

#define DECODE_CHUNK 128
// Below this many multiply-adds a parallel region costs more than it saves: a small model's
// decode step is dominated by fork/join otherwise.
#define DECODE_PARALLEL_MIN_WORK (1 << 16)

// s[j] = scale q . k_j for the n keys of a chunk (row stride ld); returns their max.
static float decode_scores(float *s, const float *q, const float *k, int ld, int n,
                           int head_dim, float scale) {
    for (int j = 0; j < n; j++) {
        const float *kj = k + (size_t)j * ld;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < head_dim; c++) dot += q[c] * kj[c];
        s[j] = dot * scale;
    }
    return cpu_max_floats(s, n);
}

// o (head_dim) = softmax(scale q K^T) V over n_ctx cache rows of one kv head.
static void decode_head(float *o, const float *q, const float *k, const float *v, int ld,
                        int n_ctx, int head_dim) {
    float s[DECODE_CHUNK], scale = 1.0f / sqrtf((float)head_dim), mx = -INFINITY, sum = 0.0f;
    for (int c = 0; c < head_dim; c++) o[c] = 0.0f;
    for (int j0 = 0; j0 < n_ctx; j0 += DECODE_CHUNK) {
        int n = n_ctx - j0 < DECODE_CHUNK ? n_ctx - j0 : DECODE_CHUNK;
        float chunk_max = decode_scores(s, q, k + (size_t)j0 * ld, ld, n, head_dim, scale);
        float new_max = chunk_max > mx ? chunk_max : mx;
        float rescale = expf(mx - new_max);  // 0 on the first chunk (mx = -inf)
        sum *= rescale;
        for (int c = 0; c < head_dim; c++) o[c] *= rescale;
        for (int j = 0; j < n; j++) {
            float p = cpu_expf(s[j] - new_max);
            const float *vj = v + (size_t)(j0 + j) * ld;
            sum += p;
#pragma omp simd
            for (int c = 0; c < head_dim; c++) o[c] += p * vj[c];
        }
        mx = new_max;
    }
    for (int c = 0; c < head_dim; c++) o[c] /= sum;
}

void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          int n_ctx, int n_heads, int n_kv_heads, int head_dim) {
    int group = n_heads / n_kv_heads, ld = n_kv_heads * head_dim;
    bool parallel = (size_t)2 * n_heads * n_ctx * head_dim >= DECODE_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int h = 0; h < n_heads; h++) {
        size_t kv0 = (size_t)(h / group) * head_dim;
        decode_head(out + (size_t)h * head_dim, q + (size_t)h * head_dim, k_cache + kv0,
                    v_cache + kv0, ld, n_ctx, head_dim);
    }
}
