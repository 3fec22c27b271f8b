// The one op interface. Model code calls only these; each backend (kernels/cpu, kernels/cuda
// with CUDA=1) fills one KernelOps table, picked at run time by kernels_backend(name). The ops
// themselves are listed and documented once, in kernels/ops.def.
//
// Conventions shared by every op:
// - Row-major fp32 tensors in the backend's memory (host memory on cpu, device memory on
//   cuda), allocated through the memory section below. Shapes are given in the comments as
//   (rows, cols). Index arrays (tokens, targets, positions, document ids, expert ids and
//   counts) live in the same memory, unless an op says otherwise.
// - Ops run in issue order on the backend's one queue (a CUDA stream on cuda) and may return
//   before they finish; download, sum and sum_squares wait for everything queued.
// - Numerics: fp32 storage and reductions on both backends. When KernelInit.precision.param is
//   bf16 (torchtitan's mixed_precision_param: bfloat16) matmul and grouped_matmul round their
//   inputs to bf16 (nearest even) and accumulate in fp32 on both backends (cuBLASLt; oneDNN on
//   cpu); cuda's attention is then cuDNN's bf16 flash attention for plain causal blocks, cpu's
//   stays fp32 (kernels/cpu/attention.c). Otherwise everything computes in fp32.
// - Linear layers keep weights as (out_features, in_features), like torch.nn.Linear, so a
//   forward is y = x W^T.
// - Backward ops ACCUMULATE (+=) into every gradient they produce, inputs' and parameters'
//   alike (as in llm.c): the residual stream and gradient accumulation need no extra adds.
//   Callers zero gradient buffers when a fresh gradient is wanted.
// - Attention tensors use the layout (B, T, n_heads, head_dim); log-sum-exp is (B, n_heads, T).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/float8.h"

#ifdef __cplusplus
extern "C" {
#endif

// What a backend is started with.
typedef struct {
    int local_rank;  // this process's index among the ranks of its node: picks the device
    // The run's mixed precision: param bf16 runs GEMMs and attention in bf16 (fp32
    // accumulation) where supported; the kernels read nothing else of it.
    MixedPrecisionPolicy precision;
} KernelInit;

// Which keys a query sees, by global sequence position (query row i is at q_start + i, key
// row j at kv_start + j): ATTN_CAUSAL, keys at or before the query; ATTN_NONE, every key;
// ATTN_DOCUMENT, causal and of the same document (block-causal attention over packed
// documents, as torchtitan's document masking).
typedef enum { ATTN_CAUSAL, ATTN_NONE, ATTN_DOCUMENT } AttnMask;

// One attention call: B sequences of Tq query rows against Tk key/value rows. A single
// sequence is Tq = Tk = T, q_start = kv_start = 0; context parallel pairs a query chunk with
// another rank's key/value chunk through the offsets.
typedef struct AttnShape {
    int B, Tq, Tk, n_heads, n_kv_heads, head_dim;
    int q_start, kv_start;  // global positions of the first query row and first key row
    AttnMask mask;
    const int *q_doc, *kv_doc;  // ATTN_DOCUMENT only: document ids (B, Tq), (B, Tk)
    Dtype compute;  // DTYPE_BF16 (bf16 compute, StepCtx.act_dtype): the cpu tiles' GEMMs take
                    // bf16 operands, summed in fp32; the zero value is fp32. cuda decides alone.
} AttnShape;

// A token-choice router's settings (torchtitan's TokenChoiceTopKRouter, models/moe): each of n
// tokens picks top_k of n_experts experts.
typedef enum { MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID } MoeScoreFunc;
typedef struct {
    int n_experts, top_k;
    MoeScoreFunc score_func;
    // Group-limited routing (DeepSeek V3): the experts form n_groups groups of equal size and a
    // token chooses only within the limited_groups groups whose top-2 selection scores sum
    // highest. n_groups 0 or 1: off.
    int n_groups, limited_groups;
    bool route_norm;    // the chosen scores are divided by their sum (+ 1e-20)
    float route_scale;  // and then multiplied by this
} MoeRouter;

// How float8_amax and float8_quantize cast one (rows, cols) tensor for a float8 GEMM operand
// (torchao's float8 training, see kernels/ops.def). The bytes are written K-contiguous, as
// matmul_float8 reads its operands: (rows, cols), or its transpose (cols, rows) when transpose
// (the backward GEMMs reduce over the other axis). Tensorwise: one amax and scale; rowwise
// (torchao's axiswise): one per row of the bytes as written, its max over the reduced axis.
typedef struct {
    Float8Kind kind;
    bool rowwise;
    bool transpose;
    bool pow2_scales;  // scales rounded down to powers of two (torchao's rowwise recipe)
} Float8Cast;

typedef struct KernelOps {
    const char *name;
    // True when tensors are host memory (cpu): host code may then read and write them directly.
    bool host_memory;
    // True when every op gives the same bits on every run (cpu: each output element has one
    // owner that sums in a fixed order). cuda is not: its embedding backward adds repeated
    // tokens' rows with atomics, and cuDNN's attention backward adds dQ with atomics, so
    // training.deterministic is refused there (torch.use_deterministic_algorithms raises too).
    bool deterministic;
    // Then a pointer to each op of kernels/ops.def, where they are declared and documented.
#define KERNEL_OP(ret, op, params) ret(*op) params;
#include "kernels/ops.def"
} KernelOps;

// The table for "cpu" (always built) or "cuda" (built with CUDA=1); NULL if not built.
const KernelOps *kernels_backend(const char *name);
// The same ops through wrappers that time each call of a profiled step (kernels/traced.c).
const KernelOps *kernels_traced(const KernelOps *backend);

#ifdef __cplusplus
}
#endif
