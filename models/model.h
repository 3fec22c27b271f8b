// A model is an ordered list of blocks over one parameter table (DESIGN.md "Blocks").
//
// Every block maps hidden states x (rows, dim) to y (rows, dim), rows = step_rows (B*T on one
// device): the embedding reads token ids instead of x, the head writes the loss instead of y.
// Each block allocates what it keeps for backward (and its scratch) at the top of
// forward/backward from the step's activation arena, and computes only when the arena is
// committed: so the same code that runs a step also sizes the activation arena (and
// `--estimate`), without a hand-written mirror of the step.
// Model code never calls a collective: it calls StepCtx.tp's hooks, which parallel/ implements.
#pragma once

#include <stdbool.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"

// Tensor parallelism as the model sees it (DESIGN.md "Parallelisms", Megatron-LM with sequence
// parallel, Korthikanti et al. 2022): between blocks the residual stream holds this rank's
// contiguous 1/size of the B*T rows; column- and row-parallel weights are their Params' local
// slices (the local shapes tell the widths); these calls, implemented by parallel/tp.c over
// the tp group, move activations between the ranks. StepCtx.tp NULL: one device, no calls.
typedef struct TpHooks TpHooks;
struct TpHooks {
    int size;            // ranks sharing the rows and the weights
    bool loss_parallel;  // the loss reads vocab-sharded logits (else they are gathered first)
    // full (size * n) = every rank's x (n) in rank order: all-gather of rows.
    void (*gather)(const TpHooks *h, const float *x, float *full, size_t n);
    // full (rows, size * cols) = every rank's x (rows, cols) side by side: all-gather of
    // columns; scratch holds size * rows * cols floats.
    void (*gather_columns)(const TpHooks *h, const float *x, float *full, float *scratch,
                           int rows, int cols);
    // y (n) = the sum over ranks of block `rank` of partial (size * n): reduce-scatter of rows.
    void (*reduce_scatter)(const TpHooks *h, const float *partial, float *y, size_t n);
    // buf (n) = the elementwise max / sum over ranks (all-reduce).
    void (*all_reduce_max)(const TpHooks *h, float *buf, size_t n);
    void (*all_reduce_sum)(const TpHooks *h, float *buf, size_t n);
};

typedef struct {
    const KernelOps *k;
    const TpHooks *tp;   // NULL: one device; the generic loop sets it from Model.tp
    Arena *act;          // activations: reset before each microbatch
    int B, T;            // microbatch rows and sequence length
    const int *tokens;   // (B, T) inputs
    const int *targets;  // (B, T) next tokens
    const int *pos;      // (T) RoPE position of each sequence index
    float loss_scale;    // d(objective)/d(mean loss of this microbatch): 1 / accumulation steps
    double loss;         // out: mean cross-entropy of the microbatch (every tp rank: the whole)
    float *logits;       // out: (B*T, vocab), valid after forward until backward overwrites it;
                         // (B*T, vocab / tp) this rank's vocab slice under loss parallel
} StepCtx;

static inline bool step_sizing(const StepCtx *s) { return s->act->base == NULL; }
// Rows of the residual stream this rank holds between blocks (sequence parallel).
static inline int step_rows(const StepCtx *s) { return s->B * s->T / (s->tp ? s->tp->size : 1); }

typedef struct Block Block;
typedef struct {
    const char *kind;
    // y = f(x). Keeps what backward needs in s->act, pointed to from the block's own state
    // (for a checkpointed block the generic loop releases it, and re-runs forward before
    // backward).
    void (*forward)(Block *b, StepCtx *s, const float *x, float *y);
    // dx += df/dx^T dy, and every parameter gradient += its part. Needs the saved state.
    void (*backward)(Block *b, StepCtx *s, const float *x, const float *dy, float *dx);
} BlockOps;

struct Block {
    const BlockOps *ops;
    void *self;          // the block's own parameters and config (owned by the model)
    bool checkpointed;   // activation_checkpoint.mode == full: backward re-runs forward
    int n_params;        // its parameters: the next n_params of the table, in block order
};

typedef struct Model Model;
struct Model {
    ParamTable params;
    Block *blocks;
    int n_blocks;
    int dim;             // width of the hidden states between blocks
    float **hidden;      // (n_blocks + 1) pointers into the activation arena, set each step
    double flops_per_token;  // training FLOPs (forward + backward) per token, for MFU (of the
                             // whole model, whatever tensor parallelism shards it)
    const TpHooks *tp;   // set by the model's parallelize plan; NULL: one device
    void *self;          // the architecture's own state (e.g. rope tables)
    // Moves the architecture's constant tables (torchtitan's non-persistent buffers, e.g. the
    // RoPE tables), built in host memory, into backend k's memory: model_place_buffers.
    void (*place_buffers)(Model *m, const KernelOps *k);
};

// Activation bytes one microbatch of (B, T) needs, counted by running the step's allocations
// on a sizing arena (no compute).
size_t model_activation_bytes(Model *m, const KernelOps *k, int B, int T);
// Sizes the parameter and gradient arenas (sizing arenas, nothing allocated) and sets the
// activation arena's size: what model_allocate will commit.
void model_size(Model *m, size_t activation_bytes, Arena *params, Arena *grads, Arena *acts);
// Sizes, allocates (from memory; NULL: host) and carves the parameter and gradient arenas and
// an activation arena of activation_bytes (model_activation_bytes of the largest batch);
// parameters are zero until initialised or loaded.
void model_allocate(Model *m, size_t activation_bytes, Arena *params, Arena *grads, Arena *acts,
                    const ArenaMemory *memory);
// Once per model, before its first step: its constant tables into backend k's memory.
void model_place_buffers(Model *m, const KernelOps *k);

// One microbatch: forward through every block, then backward in reverse, accumulating into
// the parameter gradients. Returns s->loss. With a sizing arena it only counts bytes.
double model_forward_backward(Model *m, StepCtx *s);
// Forward only (evaluation, the parity dump): leaves logits in s->logits.
double model_forward(Model *m, StepCtx *s);
