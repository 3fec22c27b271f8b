// Private to the cpu backend: the functions behind kernels_cpu (semantics in kernels/kernels.h)
// and the few inline helpers the op files share.
#pragma once

#include <stdint.h>
#include <string.h>

#include "core/errors.h"
#include "kernels/kernels.h"

extern const KernelOps kernels_cpu;

void cpu_matmul(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                bool trans_b, float beta);

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int n,
                         int dim, float eps);
void cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                          const float *weight, const float *rstd, int n, int dim);

void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin,
                      const int *pos, int n_rows, int T, int n_heads, int head_dim);
void cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin,
                       const int *pos, int n_rows, int T, int n_heads, int head_dim);

size_t cpu_attention_workspace_bytes(const AttnShape *s);
void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, const AttnShape *s, void *workspace);
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const AttnShape *s, void *workspace);
void cpu_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B,
                         int T, int n_heads, int head_dim);
void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache,
                          int n_ctx, int n_heads, int n_kv_heads, int head_dim);

void cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                         const float *up, size_t n);

void cpu_moe_aux_stats(float *frac, float *prob, const float *scores, const int *experts,
                       const MoeRouter *r, int n, int first, int T);
void cpu_moe_aux_backward(float *dlogits, const float *frac, const float *scores,
                          const MoeRouter *r, int n, int first, int T, float dloss);

void cpu_embedding_forward(float *out, const int *tokens, const float *table, int n, int dim,
                           int vocab_start, int rows);
void cpu_embedding_backward(float *dtable, const float *dout, const int *tokens, int n, int dim,
                            int vocab_start, int rows);

void cpu_cross_entropy_forward(float *losses, const float *logits, const int *targets, int n,
                               int vocab);
void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, int n,
                                int vocab, float dloss);
void cpu_cross_entropy_slice_forward(float *lse, float *target_logit, const float *logits,
                                     const int *targets, int n, int vocab, int vocab_start);
void cpu_cross_entropy_slice_backward(float *dlogits, const float *logits, const float *lse,
                                      const int *targets, int n, int vocab, int vocab_start,
                                      float dloss);

void cpu_cross_entropy_merge_exp(float *sums, const float *lse, const float *max, int n);
void cpu_cross_entropy_merge_finish(float *losses, float *lse, const float *max,
                                    const float *sums, const float *target_logit, int n);

void cpu_moe_router_forward(float *weight, int *experts, float *scores, const float *logits,
                            const float *bias, const MoeRouter *r, int n);
void cpu_moe_router_backward(float *dlogits, const float *dweight, const float *scores,
                             const int *experts, const MoeRouter *r, int n);
void cpu_moe_sort(int *counts, int *offsets, int *row_of_slot, const int *experts, int n_slots,
                  int n_experts, int capacity);
void cpu_moe_permute(float *out, const float *x, const float *weight, const int *row_of_slot,
                     int n, int k, int dim);
void cpu_moe_unpermute(float *y, const float *rows, const float *weight, const int *row_of_slot,
                       int n, int k, int dim);
void cpu_moe_weight_grad(float *dweight, const float *dy, const float *rows,
                         const int *row_of_slot, int n, int k, int dim);
void cpu_grouped_matmul(float *c, const float *a, const float *b, const int *offsets, int groups,
                        int n, int k, bool trans_a, bool trans_b, float beta);

void cpu_add(float *y, const float *x, size_t n);
// max of x[0..n), n >= 1: the shift that makes softmax and log-sum-exp overflow-free.
float cpu_max_floats(const float *x, int n);
void cpu_scale(float *x, size_t n, float s);
double cpu_sum_squares(const float *x, size_t n);
double cpu_sum(const float *x, size_t n);
void cpu_to_bf16(uint16_t *dst, const float *src, size_t n);
void cpu_from_bf16(float *dst, const uint16_t *src, size_t n);

// Memory: host memory, copies are memcpy (memory.c).
void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
void cpu_copy(void *dst, const void *src, size_t bytes);
void cpu_copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                   size_t row_bytes, size_t rows);
void cpu_zero(void *dst, size_t bytes);
size_t cpu_memory_free(void);

void cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int step);

// exp(x), accurate to a few float ulps, written so that `omp simd` loops calling it vectorise:
// glibc's expf is a scalar call, which makes softmax, cross-entropy and SiLU several times
// slower than the GEMMs around them. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then
// the Cephes expf polynomial. 2^n comes from the low mantissa bits of x log2(e) + 1.5 * 2^23
// (which hold round(x log2(e)) as an integer), in unsigned arithmetic so that any x is
// defined behaviour; out-of-range x is then fixed up with bit masks, not branches: GCC sinks
// the arithmetic under a branch and, with trapping math (the default), will not if-convert
// it back. Above x = 88.0 it returns +inf (true overflow is at 88.72); the kernels only take
// exp of x <= 0. Inline because it must inline to vectorise.
static inline float cpu_expf(float x) {
    const float round_magic = 12582912.0f;
    float t = x * 1.44269504f + round_magic;
    float n = t - round_magic;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    float y = p * two_n;
    uint32_t y_bits;
    memcpy(&y_bits, &y, sizeof y_bits);
    uint32_t underflow = -(uint32_t)(x < -87.3f), overflow = -(uint32_t)(x > 88.0f);
    y_bits = (y_bits & ~(underflow | overflow)) | (overflow & 0x7f800000u); // 0 or +inf
    memcpy(&y, &y_bits, sizeof y);
    return y;
}
