// Linear layers: every GEMM of a weight goes through here, so that the precision of each
// layer is chosen once, by its fully-qualified name, and not inside the blocks (torchtitan
// converts nn.Linear modules by name the same way: torchao's float8 with its module filter).
// Blocks keep their parallel seams (gathers, reduce-scatters, the head's chunks) and their
// GEMMs of two activations; they hand each weight's GEMMs to its Linear. Weights are (out, in)
// row-major, or (E, out, in) stacked for a mixture of experts' grouped GEMMs (Param.expert),
// the same forms the kernels' matmul and grouped_matmul take (kernels/ops.def).
#pragma once

#include "core/config.h"
#include "core/param.h"
#include "protocols/block.h"

typedef enum {
    // The backend's GEMM: fp32 math, or with bf16 activations (StepCtx.act_dtype) bf16
    // operands (the weight cast at the call) and fp32 accumulation.
    LINEAR_BACKEND,
    // torchao's Float8Linear with dynamic scales, by recipe (float8.recipe_name): each GEMM's
    // operands cast to float8 (kernels' float8_quantize) and multiplied by matmul_float8.
    //   tensorwise: input and weight e4m3fn, grad_output e5m2, one scale per tensor;
    //   rowwise: all e4m3fn, a power-of-two scale per row of each operand along the GEMM's
    //            reduced axis (so each tensor is cast along another axis for each GEMM); on
    //            stacked experts torchao's MoE recipe, the same per expert and, for the
    //            weight gradient, per expert's group of tokens;
    //   rowwise_with_gw_hp: rowwise's output; the input gradient with a rowwise grad_output
    //            and one power-of-two scale for the weight; the weight gradient unquantised.
    LINEAR_FLOAT8_TENSORWISE,
    LINEAR_FLOAT8_ROWWISE,
    LINEAR_FLOAT8_ROWWISE_WITH_GW_HP,
} LinearPrecision;

typedef struct {
    const Param *weight;  // (out, in), or (E, out, in) stacked experts: its local compute tensor
    LinearPrecision precision;
    // LoRA's adapters (models/lora.h), at the backend's precision whatever the weight's: the
    // layer computes x W^T + lora_scale (x A^T) B^T. NULL: none (never on stacked experts).
    const Param *lora_a;  // (rank, in)
    const Param *lora_b;  // (out, rank)
    float lora_scale;     // alpha / rank
    // PEFT's lora_dropout on the adapters' input in training passes (StepCtx.dropout_seed),
    // its elements drawn from the seed and lora_id, this Linear's own.
    float lora_dropout;
    uint32_t lora_id;
} Linear;

// The precision of the layer `module` ("layers.0.attention.wq", torchtitan's module fqn) over
// weight (its global shape), with float8 training configured by float8 (NULL: not asked for,
// model.converters has no float8). Both dims must be multiples of 16 (the float8 GEMMs'
// alignment). As torchtitan's float8 converter, plain (out, in) weights (nn.Linear) take the
// recipe unless an entry of float8->filter_fqns is a substring of module, and with the entry
// auto_filter_small_kn torchao's size thresholds for the recipe (_auto_filter_for_recipe). As
// its MoE converter, stacked experts' weights (module "layers.0.moe.routed_experts.
// inner_experts.w1_EFD") are rowwise when linear_moe_fqns_match, whatever the recipe.
LinearPrecision linear_precision_for(const char *module, const Param *weight,
                                     const Float8Section *float8);
// True when an entry of float8->moe_fqns_prototype is a substring of the module holding the
// stacked weight `module` (its name up to the last '.': torchao filters the GroupedExperts
// module, whose parameters it converts).
bool linear_moe_fqns_match(const char *module, const Float8Section *float8);
// "tensorwise", "rowwise", "rowwise_with_gw_hp", or "backend".
const char *linear_precision_name(LinearPrecision p);
// The Linear over weight (its Param, whose compute tensor the parallelisms may later cut and
// FSDP gather: the Linear reads shape and data at each call), at the backend's precision until
// a converter sets another (model_convert_float8).
Linear linear_of(const Param *weight);

// An activation a Linear reads (its input, or the gradient of its output): fp32, or bf16 under
// bf16 mixed precision (StepCtx.act_dtype), stored rounded by the op that wrote it. The GEMMs'
// outputs are fp32 either way.
typedef struct {
    const void *data;  // (rows, cols) of dtype
    Dtype dtype;       // DTYPE_FP32 or DTYPE_BF16
} LinearAct;

static inline LinearAct linear_act(const void *data, Dtype dtype) {
    return (LinearAct){data, dtype};
}
static inline LinearAct linear_fp32(const float *data) { return linear_act(data, DTYPE_FP32); }
// The tensor from its element `first` on (a chunk of rows).
static inline LinearAct linear_act_at(LinearAct x, size_t first) {
    return linear_act((const char *)x.data + first * dtype_size(x.dtype), x.dtype);
}

// Makes room in s->act, at its current depth, for the scratch the calls below carve on top of
// it on up to `rows` rows (a grouped Linear's rows summed over its experts) of any of the n
// linears (a float8 layer's casts of its operands and the GEMM's workspace, bf16 activations'
// copy of the weight, or their widening for a float8 cast). Blocks call it
// after carving the rest of their buffers, in the sizing pass too.
// act: the dtype of the activations the calls will read.
void linear_reserve(const StepCtx *s, const Linear *const *linears, int n, int rows, Dtype act);

// With adapters each direction adds theirs (y += s (x A^T) B^T; dx += s (dy B) A; dA and dB
// accumulated), the low-rank products recomputed rather than kept; a frozen weight
// (Param.frozen) takes no gradient.
// y (rows, out) = x (rows, in) W^T + beta y.
void linear_forward(const Linear *l, const StepCtx *s, float *y, LinearAct x, int rows,
                    float beta);
// dx (rows, in) = dy (rows, out) W + beta dx.
void linear_backward_input(const Linear *l, const StepCtx *s, float *dx, LinearAct dy, int rows,
                           float beta);
// dW (out, in) += dy (rows, out)^T x (rows, in); dy and x of one dtype.
void linear_backward_weight(const Linear *l, const StepCtx *s, LinearAct dy, LinearAct x,
                            int rows);

// The same on stacked experts' weights (E, out, in): offsets (E + 1, host memory, as
// grouped_matmul's) split the rows into the experts' groups, expert e's rows taking W_e (and
// giving dW_e); rows = offsets[E]. On fp32 activations: at the backend's precision
// grouped_matmul, rowwise grouped_matmul_float8.
void linear_grouped_forward(const Linear *l, const StepCtx *s, float *y, const float *x,
                            const int *offsets, float beta);
void linear_grouped_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                                   const int *offsets, float beta);
void linear_grouped_backward_weight(const Linear *l, const StepCtx *s, const float *dy,
                                    const float *x, const int *offsets);
