// The three block kinds of a decoder (private to models/decoder).
#pragma once

#include "models/decoder/decoder.h"
#include "models/linear.h"

// What the weight part of a transformer block's backward reads besides the forward's saved
// state: the gradients of the projections' outputs, from the input part. Pointers into the
// microbatch's activation arena, kept until the weight part when the backward is split.
typedef struct {
    // Each in StepCtx.act_dtype, as the weight part's GEMMs read it.
    LinearAct dy_all;          // (BT, dim): the block output's gradient, all rows
    LinearAct dgate, dup;      // (BT, hidden) x2: of hn W1^T and hn W3^T
    LinearAct dh_all;          // (BT, dim): h's gradient, all rows
    LinearAct attn;            // (BT, n_heads*hd): the attention output, wo's input
    LinearAct dq0, dk0, dv;    // (BT, n_heads*hd), (BT, n_kv*hd) x2: of the q, k, v projections
} LayerGrads;

// A transformer block's slot: pointers into the microbatch's activation arena, what forward
// keeps. BT = B*T rows, `rows` of them this rank's (step_rows); head counts and hidden are the
// local ones (the widths of this rank's weight slices; all of them on one device).
typedef struct {
    void *xn;               // (BT, dim) of StepCtx.act_dtype: attention_norm output, all rows
    float *rstd1;           // (rows): its 1/rms
    float *q, *k, *v;       // (BT, n_heads*hd), (BT, n_kv*hd) x2: after RoPE for q and k
    float *q0, *k0;         // with QK-norm: (BT, n_heads*hd), (BT, n_kv*hd) before it
    float *q_rstd, *k_rstd; // with QK-norm: (BT*n_heads), (BT*n_kv) 1/rms of each head
    float *attn, *lse;      // (BT, n_heads*hd), (B, n_heads, T)
    float *h;               // (rows, dim): x + attention output (the FFN's residual input)
    void *hn;               // (BT, dim) of StepCtx.act_dtype: ffn_norm output, all rows (with
                            // MoE: (rows, dim) fp32, this rank's rows only)
    float *rstd2;           // (rows): its 1/rms
    float *gate, *up;       // (BT, hidden) x2: hn W1^T, hn W3^T (dense)
    void *act;              // (BT, hidden) of StepCtx.act_dtype: silu(gate) * up (dense)
    MoeSaved moe;           // with MoE: the layer's
    LayerGrads g;           // set by backward's input part
} LayerSaved;

typedef struct {
    const DecoderArgs *args;
    int layer_id;
    Param *attention_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;  // w*: NULL with MoE
    MoeLayer *moe;           // the FFN when the model has MoE layers, else NULL
    Param *q_norm, *k_norm;  // (head_dim) each with QK-norm, else NULL
    // The projections' GEMMs (models/linear.h), over the weights of the same names (w*: unset
    // with MoE, whose layer has its own).
    struct { Linear wq, wk, wv, wo, w1, w2, w3; } linear;
    const float *rope_cos, *rope_sin;  // (max_seq_len, head_dim/2)
} DecoderLayer;

typedef struct {
    const DecoderArgs *args;
    Param *tok_embeddings;
} DecoderEmbed;

// One chunk of the head's logits (blocks.c): this rank's vocab columns (rows, vocab slice),
// and all columns (rows, vocab) with the gather's scratch when tp gathers them (full is logits
// on one device and under loss parallel; scratch NULL).
typedef struct {
    float *logits, *full, *scratch;
} HeadChunk;

typedef struct {
    const DecoderArgs *args;
    Param *norm, *output;   // output is tok_embeddings when the embeddings are tied
    Linear linear;          // over output: the logits' GEMMs
} DecoderHead;

// The head's slot.
typedef struct {
    void *xn;               // (BT, dim) of StepCtx.act_dtype: the normed input, all rows
    float *rstd;            // (rows): its 1/rms
    HeadChunk kept;         // all BT rows' logits, kept for backward when they fit one chunk
    float *lse;             // (BT) under loss parallel: log-sum-exp over the whole vocabulary
    float *losses;          // (BT)
} HeadSaved;

extern const BlockOps DECODER_EMBED_OPS, DECODER_LAYER_OPS, DECODER_HEAD_OPS;
