// The block interface (docs/design.md "Blocks"): what models/ implements and parallel/ runs in
// pieces (FSDP units, pipeline stages), so that neither includes the other. It sits in
// protocols/ (torchtitan's name for its interfaces), a layer above kernels/, whose KernelOps
// a step carries, and below models/ and parallel/: core/ includes only core/.
//
// Every block maps hidden states x (rows, dim) to y (rows, dim), rows = step_rows (B*T on one
// device): the embedding reads token ids instead of x, the head writes the loss instead of y.
// What a block keeps from its forward for its backward lives in a caller-owned slot (the
// block's saved_bytes of host memory, pointing into the microbatch's activation arena), not in
// the block: a pipeline stage has several microbatches in flight, each with its own slots.
// Each block allocates what it keeps (and its scratch) at the top of forward/backward from
// the microbatch's activation arena, and computes only when the arena is committed: so the
// same code that runs a step also sizes the activation arena (and `--estimate`), without a
// hand-written mirror of the step.
// Model code never calls a collective: it calls StepCtx.tp's, StepCtx.attn's and StepCtx.ep's
// hooks, which parallel/ implements.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "kernels/kernels.h"

// Tensor parallelism as the model sees it (docs/design.md "Parallelisms", Megatron-LM with sequence
// parallel, Korthikanti et al. 2022): between blocks the residual stream holds this rank's
// contiguous 1/size of the B*T rows; column- and row-parallel weights are their Params' local
// slices (the local shapes tell the widths); these calls, implemented by parallel/tp.c over
// the tp group, move activations between the ranks. StepCtx.tp NULL: one device, no calls.
typedef struct TpHooks TpHooks;
struct TpHooks {
    int size;            // ranks sharing the rows and the weights
    int rank;            // this rank's index: it holds rows [rank, rank + 1) * rows of B*T
                         // (all of them under StepCtx.tp_whole_rows)
    bool loss_parallel;  // the loss reads vocab-sharded logits (else they are gathered first)
    // full (size * n) = every rank's x (n) in rank order: all-gather of rows, of type t
    // (DTYPE_FP32, or DTYPE_BF16: normed rows and gradients under bf16 mixed precision).
    void (*gather)(const TpHooks *h, const void *x, void *full, size_t n, Dtype t);
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

typedef struct StepCtx StepCtx;

// Attention as the model sees it (docs/design.md "Parallelisms"): the model computes this rank's
// queries, keys and values and calls attention through these hooks when the sequence is split
// over ranks (context parallel, parallel/cp); StepCtx.attn NULL: the whole sequence is local
// and the model calls the kernel itself. `local` is the shape of this rank's share (its Tq =
// Tk = StepCtx.T tokens, the mask the step asks for; under ATTN_DOCUMENT its q_doc is NULL
// and its kv_doc the document ids (B, whole sequence length) of the whole sequences, in
// sequence order: those of every key the queries may see); q, k, v, out, lse are laid out as
// kernels.h's attention_forward says, on those tokens.
typedef struct AttnHooks AttnHooks;
struct AttnHooks {
    // Bytes of scratch forward and backward need (the caller carves them from its arena).
    size_t (*workspace_bytes)(const AttnHooks *h, const StepCtx *s, const AttnShape *local);
    // out, lse = attention of the local queries over every key of the whole sequence they see.
    void (*forward)(const AttnHooks *h, const StepCtx *s, float *out, float *lse, const float *q,
                    const float *k, const float *v, const AttnShape *local, void *workspace);
    // dq, dk, dv (written, not accumulated): the local tokens' gradients, over every rank's
    // queries that see them; out and lse are forward's.
    void (*backward)(const AttnHooks *h, const StepCtx *s, float *dq, float *dk, float *dv,
                     const float *dout, const float *q, const float *k, const float *v,
                     const float *out, const float *lse, const AttnShape *local,
                     void *workspace);
};

// Expert parallelism as the model sees it (parallel/ep, torchtitan's all-to-all token
// dispatcher): a MoE layer's E experts are split over the `size` ranks of the ep group, E /
// size consecutive experts to a rank (its slice of the expert weights). The layer sorts its
// tokens' slots by expert as it does on one device; these calls then move the rows to the
// ranks that hold their experts and back. Counts are host memory. StepCtx.ep NULL: every
// expert is local.
typedef struct ExpertHooks ExpertHooks;
struct ExpertHooks {
    int size;  // ranks the experts are split over
    // recv_counts (size, E / size) = the rows each rank has for each of this rank's experts,
    // from send_counts (E), the rows this rank has for each expert: the counts exchange before
    // the rows move.
    void (*exchange_counts)(const ExpertHooks *h, const int *send_counts, int *recv_counts,
                            int n_experts);
    // All-to-all-v of rows dim floats wide: the first send_rows[0] rows of src go to rank 0,
    // the next send_rows[1] to rank 1, ...; dst receives recv_rows[r] rows from each rank r,
    // in rank order. send_rows, recv_rows: (size). The dispatch sends by the exchanged counts;
    // the combine, and the dispatch's backward, send the other way with the two swapped.
    void (*all_to_all)(const ExpertHooks *h, float *dst, const int *recv_rows, const float *src,
                       const int *send_rows, int dim);
    // The most rows one rank receives when every rank routes rows tokens to k of n_experts
    // experts (capacity_factor as MoeArgs'): the size of the layer's received-row buffers.
    int64_t (*recv_rows_bound)(const ExpertHooks *h, int64_t rows, int k, int n_experts,
                               double capacity_factor);
};

struct StepCtx {
    const KernelOps *k;
    const TpHooks *tp;   // NULL: one device; the generic loop sets it from Model.tp
    // The tp plan keeps the hidden states whole on every tp rank (no sequence parallel: FLUX's
    // Megatron plan); false: each holds its B*T / size rows (the decoder's). From Model.
    bool tp_whole_rows;
    const AttnHooks *attn;  // NULL: whole sequences; the generic loop sets it from Model.attn
    const ExpertHooks *ep;  // NULL: all experts local; the generic loop sets it from Model.ep
    Arena *act;          // this microbatch's activations (a stack: see core/arena.h)
    // The dtype of the activations Linears read (the normed inputs, SwiGLU's output, the
    // gradients of the GEMMs' outputs): DTYPE_BF16 under bf16 mixed precision, where the GEMMs
    // would round them anyway, else DTYPE_FP32. The residual stream, the GEMMs' outputs,
    // attention and every reduction stay fp32 (Megatron-LM's fp32 residual connection).
    Dtype act_dtype;
    int B, T;            // microbatch rows and sequence length
    // The microbatch's inputs, of the architecture's own type and read only by its blocks:
    // the decoder's (llama3, qwen3) is data/token_batch.h's TokenBatch.
    const void *input;
    float loss_scale;    // d(objective)/d(mean loss of this microbatch): 1 / microbatches
    // The count this microbatch's summed token losses are divided by; 0: its B*T positions.
    // Under a loss mask (SFT) the step's targets over its microbatches and data-parallel ranks,
    // divided by their number, so that their average is the mean over the step's targets
    // (torchtitan's global_valid_tokens).
    double loss_tokens;
    // A training pass's seed for LoRA's dropout (nonzero, this microbatch's own); 0: no dropout
    // (evaluation).
    uint64_t dropout_seed;
    double loss;         // out: the model's objective, its mean over the microbatch (the
                         // decoder's: cross-entropy, plus its MTP modules' weighted loss;
                         // every tp rank has the whole)
    // out: the model's output, valid after forward until backward overwrites it; the
    // decoder's: logits (B*T, vocab), or (B*T, vocab / tp) this rank's vocab slice under loss
    // parallel
    float *output;
    // (MoE layers, experts) host: each MoE layer adds the slots its router sent to each expert
    // (models/moe), the step's expert load; NULL: not counted (evaluation).
    float *expert_load;
    double aux_loss;     // out: the MoE layers' balance losses, added to the objective (as
                         // loss is, with loss_scale), reported apart from the cross-entropy
    // The parameters' grads hold earlier microbatches' sum (gradient accumulation that no
    // per-microbatch reduction takes: no FSDP). Each block's backward then computes this
    // microbatch's gradients apart and adds the sum back, as torch's AccumulateGrad does, so
    // that microbatches add up as ((g0 + g1) + g2) + ..., the order of FSDP's reduce-scatter
    // over as many ranks (parallel/comm.h), rather than inside a GEMM's K blocks (beta = 1).
    bool grads_hold_sum;
    bool recompute;      // set by the code running blocks: this forward is a checkpointed
                         // block's recompute (what it counts, it counted already)
};

static inline bool step_sizing(const StepCtx *s) { return s->act->base == NULL; }
// Rows of the residual stream this rank holds between blocks (sequence parallel splits them).
static inline int step_rows(const StepCtx *s) {
    return s->B * s->T / (s->tp && !s->tp_whole_rows ? s->tp->size : 1);
}
// The index in B*T of this rank's first row (0 with whole rows).
static inline int step_first_row(const StepCtx *s) {
    return s->tp && !s->tp_whole_rows ? s->tp->rank * step_rows(s) : 0;
}

// What a call of a block does, as the code around it needs to know (FSDP gathers before each,
// prefetches in the direction the next one goes, and reduce-scatters after the gradients).
// BACKWARD is INPUT then WEIGHT at once; zero-bubble schedules run them apart: INPUT gives the
// input gradient (what the previous pipeline stage waits for) and keeps in the slot what
// WEIGHT then needs to accumulate the parameter gradients.
typedef enum {
    BLOCK_FORWARD,
    BLOCK_RECOMPUTE,        // activation checkpointing: forward again, just before backward
    BLOCK_BACKWARD,
    BLOCK_BACKWARD_INPUT,
    BLOCK_BACKWARD_WEIGHT,
} BlockPhase;

typedef struct Block Block;
typedef struct {
    const char *kind;
    size_t saved_bytes;  // the slot: what forward keeps for backward (pointers into the arena)
    // y = f(x); fills the slot.
    void (*forward)(Block *b, StepCtx *s, void *saved, const float *x, float *y);
    // phase BACKWARD: dx += df/dx^T dy, and every parameter gradient += its part. INPUT: dx
    // only (a block may take some parameter gradients here when deferring them would cost
    // more than it hides; it says which); WEIGHT: the rest, with the same x and dy (still
    // valid, as is all that INPUT carved) and dx NULL. Needs the slot forward filled.
    void (*backward)(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                     const float *dy, float *dx);
} BlockOps;

struct Block {
    const BlockOps *ops;
    void *self;          // the block's own parameters and config (owned by the model)
    bool checkpointed;   // full activation checkpointing: backward re-runs forward
    int n_params;        // its parameters: the next n_params of the table, in block order
    // Selective per-op checkpointing (torchtitan's `selective_ac_option: op`): forward keeps
    // the outputs of the GEMMs and attention, and backward recomputes the cheap ones it reads
    // (the norms' and the activation function's) from them. A block kind without any ignores it.
    bool recompute_cheap;
};

// Called around every block call by the code that runs blocks (not while sizing): how FSDP
// gathers parameters and reduce-scatters gradients without wrapping the blocks.
typedef struct BlockHooks BlockHooks;
struct BlockHooks {
    void (*before)(const BlockHooks *h, int block, BlockPhase phase);
    void (*after)(const BlockHooks *h, int block, BlockPhase phase);
};
