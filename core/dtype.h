// The element types titan's tensors hold: the kernel interface's typed operands (kernels/ops.def)
// and the arenas' carves (core/arena.h) name the same ones.
//   fp32: master weights, optimizer state, gradients and reductions; every op's default.
//   bf16: torchtitan's mixed_precision_param: bfloat16 (core/bf16.h's rounding).
//   e4m3 / e5m2: float8 training's operands (core/float8.h's formats), one byte each.
//   int32: token ids, positions, document and expert indices.
//   bytes: raw scratch whose layout its owner defines (workspaces, packed buffers).
#pragma once

#include <stddef.h>

typedef enum {
    DTYPE_FP32,
    DTYPE_BF16,
    DTYPE_E4M3,
    DTYPE_E5M2,
    DTYPE_INT32,
    DTYPE_BYTES,
    DTYPE_COUNT
} Dtype;

static inline size_t dtype_size(Dtype t) {
    switch (t) {
    case DTYPE_FP32:
    case DTYPE_INT32: return 4;
    case DTYPE_BF16: return 2;
    default: return 1;
    }
}

// "fp32", "bf16", "e4m3", "e5m2", "int32", "bytes": the names --estimate and the logs print.
static inline const char *dtype_name(Dtype t) {
    static const char *const names[DTYPE_COUNT] = {"fp32", "bf16", "e4m3", "e5m2", "int32",
                                                   "bytes"};
    return t < DTYPE_COUNT ? names[t] : "?";
}

// torchtitan's MixedPrecisionPolicy, decided once by the trainer from
// training.mixed_precision_param and training.mixed_precision_reduce, and read by the kernels
// (KernelInit), the model (Model.precision) and FSDP (FsdpConfig.precision). param: the dtype
// the compute reads its weights and activations in (bf16: GEMMs on bf16-rounded inputs with
// fp32 accumulation, bf16 activations, FSDP's all-gather in bf16); reduce: the one FSDP
// reduce-scatters gradients in. Master weights, optimizer state and every other reduction stay
// fp32. Zeroed: all fp32.
typedef struct {
    Dtype param;   // DTYPE_FP32 or DTYPE_BF16
    Dtype reduce;  // DTYPE_FP32 or DTYPE_BF16
} MixedPrecisionPolicy;
