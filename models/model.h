// A model is an ordered list of blocks over one parameter table (docs/design.md "Blocks"; the block
// interface is protocols/block.h). This file runs them: one microbatch at a time over all blocks
// (model_forward_backward), or over a range of blocks for a microbatch whose activations live
// in caller-owned slots (a pipeline stage with several microbatches in flight).
#pragma once

#include <stdbool.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"
#include "models/linear.h"
#include "protocols/block.h"

// One microbatch in flight through a model's blocks: each block's saved state and the hidden
// states between blocks, pointing into the microbatch's activation arena (StepCtx.act).
typedef struct {
    void **saved;    // (n_blocks) each block's slot, BlockOps.saved_bytes of host memory
    float **hidden;  // (n_blocks + 1) hidden[i]: the input of block i (hidden[0]: none, the
                     // embedding reads tokens; the head has no output)
    float **grad;    // (n_blocks + 1) grad[i]: the gradient of hidden[i], kept from a block's
                     // input part to its weight part (split backward)
} ModelSlots;

// A Linear of the blocks under its module's fully-qualified name (torchtitan's nn.Linear name:
// the weight's without ".weight", and "output" for the head's even when its weight is the
// embedding's): what model converters walk and the startup log names.
typedef struct {
    Linear *linear;
    char module[PARAM_NAME_MAX];
} ModelLinear;

// A block's training FLOPs per token: its GEMMs' (6 per weight) and its attention's as MFU
// counts them (torchtitan's 12 H Q T, the whole square even under a causal mask), and those its
// kernels do, what a step takes: the GEMMs' with a weight used again counted again (the
// decoder's output projection in each MTP module), half the attention's square under a
// causal mask.
typedef struct {
    double gemm, gemm_done, attention, attention_done;
} BlockFlops;

typedef struct Model Model;
struct Model {
    ParamTable params;
    Block *blocks;
    int n_blocks;
    int dim;             // width of the hidden states between blocks
    ModelSlots slots;    // what model_forward_backward and model_forward run in
    double flops_per_token;  // training FLOPs (forward + backward) per token, for MFU (of the
                             // whole model, whatever tensor parallelism shards it)
    BlockFlops *block_flops;  // (n_blocks) each block's share of flops_per_token, by kind
    ModelLinear *linears;  // (n_linears) every Linear of the blocks, added by the build
    int n_linears;
    const TpHooks *tp;   // set by the model's parallelize plan; NULL: one device
    bool tp_whole_rows;  // set by the plan: StepCtx.tp_whole_rows (no sequence parallel)
    const AttnHooks *attn;  // context parallel's attention (parallel/cp); NULL: whole sequences
    const ExpertHooks *ep;  // expert parallel's dispatch (parallel/ep); NULL: all experts local
    const BlockHooks *hooks;  // called around every block call (FSDP); NULL: none
    // The trainer sums several microbatches in the grads (StepCtx.grads_hold_sum): a block's
    // backward sets the earlier sum aside in the activation arena, which is sized for it.
    bool accumulates_grads;
    // The run's mixed precision (set by the trainer): its param dtype is StepCtx.act_dtype of
    // every step, DTYPE_BF16 under bf16 mixed precision (bf16 activations), else DTYPE_FP32.
    MixedPrecisionPolicy precision;
    // The MoE layers' expert load and routing biases (models/moe/balance.h), which the trainer
    // sums over ranks and updates before each optimizer step; NULL: no MoE layers.
    struct MoeBalance *moe;
    void *self;          // the architecture's own state (e.g. rope tables)
    // Moves the architecture's constant tables (torchtitan's non-persistent buffers, e.g. the
    // RoPE tables), built in host memory, into backend k's memory: model_place_buffers.
    void (*place_buffers)(Model *m, const KernelOps *k);
};

// Activation bytes (by dtype) one microbatch of (B, T) needs, counted by running the step's
// allocations on a sizing arena (no compute).
ArenaBytes model_activation_bytes(Model *m, const KernelOps *k, int B, int T);
// Sizes the parameter and gradient arenas (sizing arenas, nothing allocated) and sets the
// activation arena's size: what model_allocate will commit.
void model_size(Model *m, ArenaBytes activation_bytes, Arena *params, Arena *grads, Arena *acts);
// Sizes, allocates (from memory; NULL: host) and carves the parameter and gradient arenas and
// an activation arena of activation_bytes (model_activation_bytes of the largest batch);
// parameters are zero until initialised or loaded.
void model_allocate(Model *m, ArenaBytes activation_bytes, Arena *params, Arena *grads,
                    Arena *acts, const ArenaMemory *memory);
// Activation checkpointing of the transformer blocks (all but the first and the last) under
// activation_checkpoint.mode, torchtitan's: full re-runs each one's forward in backward;
// selective with an integer n does so for every n-th, counting blocks from 1 (the n-th, the
// 2n-th, ...); selective with `op` has each keep only its GEMMs' and attention's outputs.
void model_set_checkpointing(Model *m, const char *mode, const char *selective_option);
// Once per model, before its first step: its constant tables into backend k's memory.
void model_place_buffers(Model *m, const KernelOps *k);
// Frees one of those tables (e.g. the RoPE tables) wherever it is: in memory's (the backend
// its place_buffers moved it to), or the host's (memory NULL: as the build allocated it).
void model_buffer_free(void *data, const KernelOps *memory);
// Frees what a build allocated in m itself (blocks, per-block FLOPs, slots, Linears, parameter
// table): the end of every architecture's free, after its own state (m->self).
void model_free_parts(Model *m);

// The build's: adds l, a Linear of the blocks, as module (NULL: its weight's name without
// ".weight"). model_free_parts frees the list.
void model_linear_add(Model *m, Linear *l, const char *module);
// torchtitan's float8 converter (model.converters: [float8]), after the build and before
// any parallelism: each Linear's precision by linear_precision_for under float8.
void model_convert_float8(Model *m, const Float8Section *float8);
// Which Linears model_linears_describe lists: those at the backend's precision, the float8
// ones of plain weights (the recipe's), the float8 stacked experts (the grouped GEMMs'), or
// those with LoRA adapters.
typedef enum { LINEARS_BACKEND, LINEARS_FLOAT8, LINEARS_FLOAT8_EXPERTS, LINEARS_LORA } LinearSet;
// The modules of the Linears in set, as "layers.0-5.attention.wq, ..., output" (layer indices
// merged into ranges, "none" for no module) into buf; returns how many Linears that is.
int model_linears_describe(const Model *m, LinearSet set, char *buf, size_t n);

// Slots for one microbatch of m (host memory; free with model_slots_free).
void model_slots_init(ModelSlots *a, const Model *m);
void model_slots_free(ModelSlots *a);

// Forward over blocks [first, last) for the microbatch of s in slots a: x (rows, dim) is the
// input of block first (NULL when first is 0: the first block reads s->input). Returns the
// output of block last - 1, carved from s->act (NULL when last is n_blocks: the head leaves
// s->loss). Checkpointed blocks keep only their input, as the whole model's forward does.
float *model_forward_blocks(Model *m, StepCtx *s, ModelSlots *a, int first, int last,
                            const float *x);
// Backward over blocks [first, last) in reverse, after their forward in the same slots: dy
// (rows, dim) is the gradient of block last - 1's output (NULL when last is n_blocks: the
// head starts from the loss). phase BLOCK_BACKWARD does all of it; BLOCK_BACKWARD_INPUT only
// the input gradients, keeping what BLOCK_BACKWARD_WEIGHT (called later over the same range,
// dy NULL) needs, so nothing from this microbatch's arena may be released in between. Returns
// the gradient of block first's input, carved from s->act (NULL when first is 0, and for the
// weight part).
float *model_backward_blocks(Model *m, StepCtx *s, ModelSlots *a, int first, int last,
                             BlockPhase phase, const float *dy);

// One microbatch: forward through every block, then backward in reverse, accumulating into
// the parameter gradients. Returns s->loss. With a sizing arena it only counts bytes.
double model_forward_backward(Model *m, StepCtx *s);
// Forward only (evaluation, the parity dump): leaves the model's output in s->output.
double model_forward(Model *m, StepCtx *s);
