// The three block kinds of a decoder (private to models/decoder).
#pragma once

#include "data/token_batch.h"
#include "models/decoder/decoder.h"
#include "models/linear.h"

// ---- what the blocks and MLA (mla.c) share -------------------------------------------------

// The microbatch's inputs: a language model's tokens. A sizing pass has none (NULL tensors:
// causal attention, nothing read).
static inline const TokenBatch *token_batch(const StepCtx *s) {
    static const TokenBatch none = {0};
    return s->input ? s->input : &none;
}

// Tensors are the backend's memory (device memory on cuda): copies and zeroing of n floats go
// through it.
static inline void copy(const StepCtx *s, float *dst, const float *src, size_t n) {
    s->k->copy(dst, src, n * sizeof(float));
}
static inline void zero(const StepCtx *s, float *x, size_t n) {
    s->k->zero(x, n * sizeof(float));
}

// n activations of the step's dtype (StepCtx.act_dtype), carved from the arena.
static inline void *act_carve(const StepCtx *s, size_t n) {
    return arena_tensor(s->act, n, s->act_dtype);
}

static inline LinearAct act(const StepCtx *s, const void *x) {
    return linear_act(x, s->act_dtype);
}

// x (n floats) in the activations' dtype: itself in fp32, else cast into `room` (n of them):
// what a Linear reads, cast once where two GEMMs read it.
static inline LinearAct act_cast(const StepCtx *s, const float *x, size_t n, void *room) {
    if (s->act_dtype == DTYPE_FP32) return linear_fp32(x);
    s->k->to_bf16(room, x, n);
    return act(s, room);
}

// A transformer block's widths. BT = B*T rows, `rows` of them this rank's (step_rows); head
// counts and widths are the local ones (of this rank's weight slices; all on one device).
typedef struct {
    int BT, rows, D, hd;  // all rows, this rank's rows, model width, q and k head width
    int nh, nkvh;         // query and kv heads of this rank (MLA: as many kv heads, k and v
                          // per head)
    int nq, nkv;          // q width, k and v width (MLA: v padded to the q head width)
    int nv;               // the attention output's width: wo's input (MLA: heads of v_head_dim)
    int H;                // FFN width of this rank (0 in a MoE layer)
} LayerDims;

// The attention seam (blocks.c), on whole sequences by the kernels or through the hooks
// (context parallel): causal attention of this rank's tokens of each sequence of the shape
// d describes, within documents when the batch has them. out (BT, nh*hd), lse (B, nh, T).
size_t decoder_attention_workspace(const StepCtx *s, LayerDims d);
void decoder_attention_forward(const StepCtx *s, LayerDims d, float *out, float *lse,
                               const float *q, const float *k, const float *v, void *workspace);
// dq (BT, nq), dk, dv (BT, nkv) = the gradients of q, k, v from dout (BT, nq) (each written,
// not accumulated).
void decoder_attention_backward(const StepCtx *s, LayerDims d, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse,
                                void *workspace);

// ---- multi-head latent attention (mla.c) ----------------------------------------------------

// MLA's weights (torchtitan's deepseek_v3 Attention), in place of wq, wk, wv: q = xn Wq^T, or
// with a q_lora_rank q = q_norm(xn Wq_a^T) Wq_b^T; [c, k_pe] = xn Wkv_a^T, kv = kv_norm(c)
// Wkv_b^T.
typedef struct {
    bool on;
    Param *wq, *wq_a, *q_norm, *wq_b;  // wq without a q_lora_rank, the other three with one
    Param *wkv_a, *kv_norm, *wkv_b;
    struct { Linear wq, wq_a, wq_b, wkv_a, wkv_b; } linear;
} MlaWeights;

// What MLA's forward keeps (pointers into the microbatch's activation arena). R = q_lora_rank,
// C = kv_lora_rank, nh heads of this rank, qk = qk_nope + qk_rope: q and k's head width.
typedef struct {
    float *qa, *qa_rstd;    // with R: (BT, R) xn Wq_a^T, (BT) its 1/rms
    void *qa_n;             // with R: (BT, R) of StepCtx.act_dtype: q_norm's output
    float *c, *c_rstd;      // (BT, C) the kv latent, (BT) its 1/rms
    void *c_n;              // (BT, C) of StepCtx.act_dtype: kv_norm's output, wkv_b's input
    float *q, *k, *v;       // (BT, nh*qk) x3: attention's inputs, q and k after RoPE (q times
                            // the YaRN scale correction), v zero-padded from v_head_dim to qk
    float *out, *lse;       // (BT, nh*qk) attention's output (padded as v), (B, nh, T)
} MlaSaved;

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
    MlaSaved mla;           // with MLA: its q, k, v and attention (then the q, k, v and lse
                            // below are unused)
    float *q0, *k0;         // with QK-norm: (BT, n_heads*hd), (BT, n_kv*hd) before it
    float *q_rstd, *k_rstd; // with QK-norm: (BT*n_heads), (BT*n_kv) 1/rms of each head
    float *attn;            // (BT, nv): the attention output, wo's input
    float *lse;             // (B, n_heads, T)
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
    // wq, wk, wv: NULL with MLA (mla holds its own); w1, w2, w3: NULL in a MoE layer
    Param *attention_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w1, *w2, *w3;
    MlaWeights mla;          // with multi-head latent attention (mla.on), else all NULL
    MoeLayer *moe;           // the FFN when the model has MoE layers, else NULL
    Param *q_norm, *k_norm;  // (head_dim) each with QK-norm, else NULL
    // The projections' GEMMs (models/linear.h), over the weights of the same names (w*: unset
    // with MoE, whose layer has its own).
    struct { Linear wq, wk, wv, wo, w1, w2, w3; } linear;
    const float *rope_cos, *rope_sin;  // (max_seq_len, head_dim/2)
    char prefix[24];         // its parameters' names': "layers.3." ("mtp_layers.0." in an MTP
                             // module)
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

// A multi-token prediction module (mtp.c): a transformer block as the last layer over
// eh_proj's mix of the next token's embedding and the previous module's output.
typedef struct {
    Param *enorm, *hnorm;   // (dim) each: the RMSNorms of the embedding and the previous output
    Param *eh_proj;         // (dim, 2 dim)
    Param *mtp_norm;        // (dim): the RMSNorm of its output, before the output projection
    Linear eh_linear;       // over eh_proj
    DecoderLayer layer;
    Block block;            // the layer as a block of DECODER_LAYER_OPS
} DecoderMtp;

typedef struct {
    const DecoderArgs *args;
    Param *norm, *output;   // output is tok_embeddings when the embeddings are tied
    Linear linear;          // over output: the logits' GEMMs
    DecoderMtp *mtp;        // (args->mtp_layers) the multi-token prediction modules
    // With them: the head's copy of tok_embeddings (Param.copy), which looks up their input
    // tokens wherever the embedding block runs (another FSDP unit, pipeline stage or rank).
    Param *embed;
} DecoderHead;

// One loss of the head over rows x (rows, dim): normed, their logits (through output) and
// their cross-entropy against targets; the main model's, and each MTP module's.
typedef struct {
    void *xn;               // (BT, dim) of StepCtx.act_dtype: the normed input, all rows
    float *rstd;            // (rows): its 1/rms
    HeadChunk kept;         // all BT rows' logits, kept for backward when they fit one chunk
    float *lse;             // (BT) under loss parallel: log-sum-exp over the whole vocabulary
    float *losses;          // (BT), 0 on rows without a target
} LossSaved;

// What an MTP module's forward keeps (mtp.c), on this rank's rows.
typedef struct {
    float *prev;            // (rows, dim): the previous output, its rows past the end zeroed
    void *cat;              // (rows, 2 dim) of StepCtx.act_dtype: [enorm(embed), hnorm(prev)]
    float *e_rstd, *h_rstd; // (rows) x2: their 1/rms
    float *h0;              // (rows, dim): eh_proj's output, the layer's input
    float *y;               // (rows, dim): the layer's output
    float *out, *out_rstd;  // (rows, dim): mtp_norm(y), the next module's previous output;
                            // (rows) its 1/rms
    LayerSaved layer;
    LossSaved loss;         // its loss (the head's): over y, normed by mtp_norm
} MtpSaved;

// The head's slot.
typedef struct {
    LossSaved main;
    int *tokens, *targets;  // (mtp_layers, BT): module k's token t + k and its target at each
                            // position t (0 past the sequence's end: rows without either)
    int *loss_mask;         // (mtp_layers, BT): the batch's loss mask shifted as the targets
                            // (unused without one)
    float *embed;           // (mtp_layers, rows, dim): those tokens' embeddings, this rank's rows
    MtpSaved mtp[DECODER_MAX_MTP];
} HeadSaved;

extern const BlockOps DECODER_EMBED_OPS, DECODER_LAYER_OPS, DECODER_HEAD_OPS;

// The layer's Linears in the order of its parameters: MLA's or wq, wk, wv; wo; the dense FFN's
// (a MoE layer lists its own: moe_layer_linears). Returns how many.
#define DECODER_LAYER_LINEARS 12
int decoder_layer_linears(DecoderLayer *L, Linear *out[DECODER_LAYER_LINEARS]);

// MLA's parts of a transformer block (mla.c), for blocks.c.
// MLA's softmax scale over 1/sqrt(qk head width): YaRN's (0.1 mscale ln(factor) + 1)^2, 1
// without YaRN.
double mla_scale_correction(const DecoderArgs *a);
// d's head counts and q, k, v widths from d->nv (the attention output's width on this rank).
void mla_dims(const DecoderArgs *a, LayerDims *d);
// Carves what forward keeps into sv.
void mla_carve(const DecoderArgs *a, const StepCtx *s, MlaSaved *sv, LayerDims d);
// The floats of scratch mla_forward needs.
size_t mla_forward_scratch(const DecoderArgs *a, LayerDims d);
// out (BT, nv) = MLA's attention output of xn (BT, D) in the activations' dtype, before wo.
// scratch: mla_forward_scratch floats; workspace: decoder_attention_workspace bytes.
void mla_forward(const DecoderArgs *a, const MlaWeights *w, const float *rope_cos,
                 const float *rope_sin, StepCtx *s, MlaSaved *sv, LayerDims d, LinearAct xn,
                 float *out, void *scratch, void *workspace);
// dxn (BT, D) = the gradient of xn from dout (BT, nv), the attention output's, and every MLA
// weight's gradient += its part (all in this one call, as a MoE layer's). Carves its scratch
// and reserves its Linears' on top of s->act, releasing them before it returns; a sizing pass
// only carves.
void mla_backward(const DecoderArgs *a, const MlaWeights *w, const float *rope_cos,
                  const float *rope_sin, StepCtx *s, const MlaSaved *sv, LayerDims d,
                  LinearAct xn, const float *dout, float *dxn, void *workspace);
// MLA's Linears (wq, or wq_a and wq_b; wkv_a, wkv_b) into out: how many.
int mla_linears(MlaWeights *w, Linear **out);

// Zeroes the rows of x (width floats each; x is global row `first`) among the global rows
// [first, first + n) of B*T whose position in their sequence is T - k or later: they have no
// token k ahead (multi-token prediction module k's rows without an input or a target).
void zero_tail_rows(const StepCtx *s, float *x, size_t width, int first, int n, int k);

// Multi-token prediction module `depth` (from 1; mtp.c) of m: sv->y, sv->out from prev (rows,
// dim: the last layer's output or module depth - 1's out) and embed (rows, dim: the
// embedding of token t + depth).
void mtp_forward(const DecoderMtp *m, StepCtx *s, MtpSaved *sv, const float *prev,
                 const float *embed, int depth);
// Its backward: dy (rows, dim), the gradient of y from the module's loss, gets out's share
// from dout (rows, dim: the next module's, NULL for the last); then dembed (rows, dim) += the
// embedding's gradient, dprev (rows, dim) += prev's, and its weights' gradients += theirs.
void mtp_backward(const DecoderMtp *m, StepCtx *s, const MtpSaved *sv, const float *embed,
                  float *dy, const float *dout, float *dembed, float *dprev, int depth);
