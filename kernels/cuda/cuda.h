// Private to the cuda backend: the state every op shares (device, stream, library handles)
// and the functions behind kernels_cuda (semantics in kernels/kernels.h). Host-only, so that
// it can be included by C and by the .cu files alike; device helpers are in device.cuh.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdint.h>

#include "core/errors.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const KernelOps kernels_cuda;

// ---- shared state (cuda_backend.cu), valid after kernels_cuda.init ---------------------------
cudaStream_t cuda_stream(void);  // the one compute stream every op is issued on
bool cuda_bf16_compute(void);    // KernelInit.bf16_compute
int cuda_sm_count(void);         // multiprocessors of the device: sizes grid-stride launches
cublasLtHandle_t cuda_cublaslt(void);
// cuBLAS (the grouped GEMM), bound to cuda_stream(), sharing the GEMM workspace below.
cublasHandle_t cuda_cublas(void);
cudnnHandle_t cuda_cudnn(void);  // bound to cuda_stream()
// Scratch owned by the backend, allocated once at init (no allocation inside a step): the
// GEMM workspace cuBLASLt's heuristics may use, CUDA_GEMM_WORKSPACE bytes.
#define CUDA_GEMM_WORKSPACE ((size_t)32 << 20)
void *cuda_gemm_workspace(void);
// And CUDA_SCRATCH bytes for the partial results of reductions (sum, sum_squares, the rmsnorm
// weight gradient, ...): ops run one after another on the stream, so they may all use it.
#define CUDA_SCRATCH ((size_t)64 << 20)
void *cuda_scratch(void);

// ---- ops (one .cu file each concern) ----------------------------------------------------------
void cuda_matmul(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                 bool trans_b, float beta);

void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int n,
                          int dim, float eps);
void cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                           const float *weight, const float *rstd, int n, int dim);

void cuda_rope_forward(float *out, const float *x, const float *cos, const float *sin,
                       const int *pos, int n_rows, int T, int n_heads, int head_dim);
void cuda_rope_backward(float *dx, const float *dout, const float *cos, const float *sin,
                        const int *pos, int n_rows, int T, int n_heads, int head_dim);

size_t cuda_attention_workspace_bytes(const AttnShape *s);
void cuda_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, const AttnShape *s, void *workspace);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             const AttnShape *s, void *workspace);
void cuda_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B,
                          int T, int n_heads, int head_dim);
void cuda_attention_decode(float *out, const float *q, const float *k_cache,
                           const float *v_cache, int n_ctx, int n_heads, int n_kv_heads,
                           int head_dim);

void cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, size_t n);

void cuda_moe_aux_stats(float *frac, float *prob, const float *scores, const int *experts,
                        const MoeRouter *r, int n, int first, int T);
void cuda_moe_aux_backward(float *dlogits, const float *frac, const float *scores,
                           const MoeRouter *r, int n, int first, int T, float dloss);

void cuda_embedding_forward(float *out, const int *tokens, const float *table, int n, int dim,
                            int vocab_start, int rows);
void cuda_embedding_backward(float *dtable, const float *dout, const int *tokens, int n, int dim,
                             int vocab_start, int rows);

void cuda_cross_entropy_forward(float *losses, const float *logits, const int *targets, int n,
                                int vocab);
void cuda_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, int n,
                                 int vocab, float dloss);
void cuda_cross_entropy_slice_forward(float *lse, float *target_logit, const float *logits,
                                      const int *targets, int n, int vocab, int vocab_start);
void cuda_cross_entropy_slice_backward(float *dlogits, const float *logits, const float *lse,
                                       const int *targets, int n, int vocab, int vocab_start,
                                       float dloss);
void cuda_cross_entropy_merge_exp(float *sums, const float *lse, const float *max, int n);
void cuda_cross_entropy_merge_finish(float *losses, float *lse, const float *max,
                                     const float *sums, const float *target_logit, int n);

void cuda_moe_router_forward(float *weight, int *experts, float *scores, const float *logits,
                             const float *bias, const MoeRouter *r, int n);
void cuda_moe_router_backward(float *dlogits, const float *dweight, const float *scores,
                              const int *experts, const MoeRouter *r, int n);
void cuda_moe_sort(int *counts, int *offsets, int *row_of_slot, const int *experts, int n_slots,
                   int n_experts, int capacity);
void cuda_moe_permute(float *out, const float *x, const float *weight, const int *row_of_slot,
                      int n, int k, int dim);
void cuda_moe_unpermute(float *y, const float *rows, const float *weight, const int *row_of_slot,
                        int n, int k, int dim);
void cuda_moe_weight_grad(float *dweight, const float *dy, const float *rows,
                          const int *row_of_slot, int n, int k, int dim);
void cuda_grouped_matmul(float *c, const float *a, const float *b, const int *offsets,
                         int groups, int n, int k, bool trans_a, bool trans_b, float beta);

void cuda_add(float *y, const float *x, size_t n);
void cuda_scale(float *x, size_t n, float s);
double cuda_sum_squares(const float *x, size_t n);
double cuda_sum(const float *x, size_t n);
void cuda_to_bf16(uint16_t *dst, const float *src, size_t n);
void cuda_from_bf16(float *dst, const uint16_t *src, size_t n);

void cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int step);

#ifdef __cplusplus
}
#endif
