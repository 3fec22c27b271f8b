// A model is an ordered list of blocks over one parameter table (DESIGN.md "Blocks").
//
// Every block maps hidden states x (B*T, dim) to y (B*T, dim): the embedding reads token ids
// instead of x, the head writes the loss instead of y. Each block allocates what it keeps for
// backward (and its scratch) at the top of forward/backward from the step's activation arena,
// and computes only when the arena is committed: so the same code that runs a step also sizes
// the activation arena (and `--estimate`), without a hand-written mirror of the step.
// Model code never calls a collective; parallel/ will wrap these calls.
#pragma once

#include <stdbool.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"

typedef struct {
    const KernelOps *k;
    Arena *act;          // activations: reset before each microbatch
    int B, T;            // microbatch rows and sequence length
    const int *tokens;   // (B, T) inputs
    const int *targets;  // (B, T) next tokens
    const int *pos;      // (T) RoPE position of each sequence index
    float loss_scale;    // d(objective)/d(mean loss of this microbatch): 1 / accumulation steps
    double loss;         // out: mean cross-entropy of the microbatch
    float *logits;       // out: (B*T, vocab), valid after forward until backward overwrites it
} StepCtx;

static inline bool step_sizing(const StepCtx *s) { return s->act->base == NULL; }

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
};

typedef struct {
    ParamTable params;
    Block *blocks;
    int n_blocks;
    int dim;             // width of the hidden states between blocks
    float **hidden;      // (n_blocks + 1) pointers into the activation arena, set each step
    double flops_per_token;  // training FLOPs (forward + backward) per token, for MFU
    void *self;          // the architecture's own state (e.g. rope tables)
} Model;

// Activation bytes one microbatch of (B, T) needs, counted by running the step's allocations
// on a sizing arena (no compute).
size_t model_activation_bytes(Model *m, const KernelOps *k, int B, int T);
// Sizes, allocates and carves the parameter and gradient arenas and an activation arena of
// activation_bytes (model_activation_bytes of the largest batch); parameters are zero until
// initialised or loaded.
void model_allocate(Model *m, size_t activation_bytes, Arena *params, Arena *grads, Arena *acts);

// One microbatch: forward through every block, then backward in reverse, accumulating into
// the parameter gradients. Returns s->loss. With a sizing arena it only counts bytes.
double model_forward_backward(Model *m, StepCtx *s);
// Forward only (evaluation, the parity dump): leaves logits in s->logits.
double model_forward(Model *m, StepCtx *s);
