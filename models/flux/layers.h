// FLUX's blocks and the sublayers they share (private to models/flux). Each sublayer is a
// forward / backward pair on tensors its block carved; backward ops accumulate (kernels.h).
// Shapes: B samples, L text tokens, N image tokens, S = 1 + L + N rows per sample in the
// hidden state (flux.h), Tj = L + N tokens of the joint sequence, D = hidden_size, H heads of
// hd, M = the MLP width. Under context parallel L, N, Tj and S count this rank's share; under
// tensor parallel (Megatron-LM without sequence parallel: the hidden state is whole on every
// rank) H and M count this rank's heads and MLP columns, and A = H hd is its attention width.
#pragma once

#include "models/flux/flux.h"
#include "models/linear.h"

typedef struct {
    int B, L, N, S, Tj, D, H, hd, M, A;
    int l0, n0;           // the first text and image token of the share (L, N from there)
    int L_all, N_all;     // the whole sample's text and image tokens (the batch's rows)
    int shares;           // ranks the joint sequence is split over (context parallel)
} FluxDims;

// EmbedND's rotations and this rank's share of each sample's joint sequence: tokens
// [first, first + count) (all Tj of them unless context parallel splits the sequence, which
// FLUX, whose attention is not causal, cuts into contiguous shares: no load to balance). Row t
// of cos/sin (Tj, hd/2) is token t's; pos (count) the share's tokens, first .. first+count-1
// (the kernel's position of row r is pos[r % count]); backend memory.
typedef struct {
    const float *cos, *sin;
    const int *pos;
    int first, count, shares;
} FluxRope;

// The step's shapes on this rank's share and heads; checks that StepCtx.T is the share's.
FluxDims flux_dims(const FluxArgs *a, const FluxRope *share, const StepCtx *s);

// A torch nn.Linear: the weight's GEMMs through models/linear (precision by name), plus a bias.
// Its activations are fp32 whatever StepCtx.act_dtype (bf16 activations are not done yet; the
// backend's bf16 GEMMs still round them under bf16 compute).
typedef struct {
    Linear linear;  // over the weight (out, in)
    Param *bias;    // (out), or NULL
} FluxLinear;

static inline int flux_linear_out(const FluxLinear *l) { return (int)l->linear.weight->shape[0]; }

// y (rows, out) = x (rows, in) W^T + bias + beta y.
void flux_linear_forward(const FluxLinear *l, const StepCtx *s, float *y, const float *x,
                         int rows, float beta);
// dx (rows, in) = dy W + beta dx (dx NULL: an input that takes no gradient); dW += dy^T x,
// dbias += the column sums of dy.
void flux_linear_backward(const FluxLinear *l, const StepCtx *s, float *dx, const float *dy,
                          const float *x, int rows, float beta);
// A row-parallel Linear (the attention's and MLP's output projections, whose weight tensor
// parallel cuts along its input dim): y (rows, out) = the sum over the tp ranks of x (rows,
// in: this rank's columns) W^T (its slice), then the bias once. Its backward is the plain one:
// dy is whole on every rank, dx this rank's columns.
void flux_linear_forward_reduced(const FluxLinear *l, const StepCtx *s, float *y, const float *x,
                                 int rows);
// x (n) = its sum over the tp ranks (nothing on one): the input gradient of a column-parallel
// Linear, each rank's the share of its output columns.
void flux_tp_sum(const StepCtx *s, float *x, size_t n);
// Makes room for the Linears' scratch on up to rows rows (linear_reserve), after the carving.
void flux_linears_reserve(const StepCtx *s, const FluxLinear *const *l, int n, int rows);

// ---- rows of the hidden state ------------------------------------------------------------

// dst (B*count, D) = rows [first, first + count) of each sample of src (B, total, D); and back.
void flux_rows_gather(const StepCtx *s, float *dst, const float *src, int B, int total,
                      int first, int count, int D);
void flux_rows_scatter(const StepCtx *s, float *dst, const float *src, int B, int total,
                       int first, int count, int D);

// ---- the conditioning vector -------------------------------------------------------------

// vec (B, D): the hidden state's row 0 of each sample; svec = silu(vec), which every
// modulation of the block projects (torchtitan's Modulation, LastLayer's adaLN_modulation).
typedef struct {
    float *vec, *svec;
} FluxCond;

void flux_cond_carve(const StepCtx *s, FluxCond *c, FluxDims d);
// From the hidden state x; and y's row 0 = x's (the vec row passes through the block).
void flux_cond_forward(const StepCtx *s, FluxCond *c, const float *x, float *y, FluxDims d);
// dx's row 0 (dx zeroed by the caller) = dy's row 0 (none when dy is NULL) + silu'(vec) dsvec.
// scratch: (B, D).
void flux_cond_backward(const StepCtx *s, const FluxCond *c, float *dx, const float *dy,
                        const float *dsvec, float *scratch, FluxDims d);

// ---- adaLN: LayerNorm (no affine, eps 1e-6) then modulation by the sample's shift and scale --

typedef struct {
    float *mean, *rstd;  // (rows)
    float *normed;       // (rows, D): the LayerNorm's output, modulate's input
} FluxNorm;

void flux_norm_carve(const StepCtx *s, FluxNorm *n, int rows, int D);
// out (B*T, D) = LayerNorm(x) (1 + scale[b]) + shift[b]; shift, scale rows mod_ld apart.
void flux_adaln_forward(const StepCtx *s, FluxNorm *n, float *out, const float *x,
                        const float *shift, const float *scale, int mod_ld, int B, int T, int D);
// dx += the input gradient of dout; dshift, dscale += theirs. scratch: (B*T, D).
void flux_adaln_backward(const StepCtx *s, const FluxNorm *n, float *dx, float *dshift,
                         float *dscale, const float *dout, const float *x, const float *scale,
                         int mod_ld, int B, int T, int D, float *scratch);

// ---- attention over the joint sequence ---------------------------------------------------

// q, k, v (rows, A) from the first 3A columns of qkv (rows, ld), q and k through QK-norm
// (torchtitan's QKNorm: RMSNorm over each head, eps 1e-5). q0, k0 (rows, A) and the heads'
// 1/rms (rows*H) are kept for backward.
typedef struct {
    float *q0, *k0, *q_rstd, *k_rstd;
} FluxQk;

void flux_qk_carve(const StepCtx *s, FluxQk *qk, int rows, FluxDims d);
void flux_qk_forward(const StepCtx *s, FluxQk *qk, float *q, float *k, float *v, const float *qkv,
                     int ld, int rows, const Param *q_norm, const Param *k_norm, FluxDims d);
// dqkv's first 3A columns (rows, ld) = the gradient of qkv from dq, dk (of the normed heads)
// and dv. scratch: 2 rows A.
void flux_qk_backward(const StepCtx *s, const FluxQk *qk, float *dqkv, int ld, const float *dq,
                      const float *dk, const float *dv, int rows, Param *q_norm, Param *k_norm,
                      FluxDims d, float *scratch);

// The joint attention's tensors, (B*Tj, A) each as (B, Tj, H, hd); lse (B, H, Tj).
typedef struct {
    float *q, *k, *v, *out, *lse;
} FluxAttn;

void flux_attn_carve(const StepCtx *s, FluxAttn *a, FluxDims d);
size_t flux_attn_workspace(const StepCtx *s, FluxDims d);
// RoPE on q and k (in place), then non-causal attention of every token over every token.
void flux_attn_forward(const StepCtx *s, FluxAttn *a, const FluxRope *rope, FluxDims d,
                       void *workspace);
// dq, dk (of q and k before RoPE), dv (B*Tj, A) written from dout. scratch: 2 B*Tj*A.
void flux_attn_backward(const StepCtx *s, const FluxAttn *a, const FluxRope *rope, float *dq,
                        float *dk, float *dv, const float *dout, FluxDims d, void *workspace,
                        float *scratch);

// ---- blocks ------------------------------------------------------------------------------

// An MLPEmbedder: out_layer(silu(in_layer(x))).
typedef struct {
    FluxLinear in_layer, out_layer;
} FluxMlpEmbedder;

typedef struct {
    const FluxArgs *args;
    const FluxRope *share;
    FluxLinear img_in, txt_in;
    FluxMlpEmbedder time_in, vector_in, guidance_in;  // guidance_in: with guidance_embed only
} FluxEmbed;

// One stream (img or txt) of a double block: mod's output (B, 6D) is shift, scale, gate of the
// attention then of the MLP.
typedef struct {
    FluxLinear mod, qkv, proj, mlp_in, mlp_out;
    Param *q_norm, *k_norm;  // (hd)
} FluxStream;

typedef struct {
    const FluxArgs *args;
    const FluxRope *rope;
    FluxStream img, txt;
} FluxDouble;

// mod's output (B, 3D): shift, scale, gate; linear1: (3D + M, D) qkv and mlp_in fused;
// linear2: (D, D + M) proj and mlp_out fused.
typedef struct {
    const FluxArgs *args;
    const FluxRope *rope;
    FluxLinear linear1, linear2, mod;
    Param *q_norm, *k_norm;
} FluxSingle;

// final_layer: adaln (B, 2D): shift, scale; linear to the prediction.
typedef struct {
    const FluxArgs *args;
    const FluxRope *share;
    FluxLinear linear, adaln;
} FluxHead;

extern const BlockOps FLUX_EMBED_OPS, FLUX_DOUBLE_OPS, FLUX_SINGLE_OPS, FLUX_HEAD_OPS;
