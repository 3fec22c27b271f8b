// The decoder-only transformer that Llama 3 and Qwen3 share (torchtitan's models/common
// Decoder): token embeddings, n_layers blocks of grouped-query attention and a SwiGLU FFN, each
// behind an RMSNorm with a residual, and a final norm before the output projection. What one
// architecture has and the other has not is an argument: the head width (Qwen3's head_dim is
// not dim / n_heads), QK-norm (Qwen3's RMSNorm over each head of q and k before RoPE), the FFN
// width (Llama 3 derives it, Qwen3 gives it), Llama 3.1's RoPE scaling, tied embeddings. Each
// architecture keeps its flavors, defaults and checkpoint formats in its own folder.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"
#include "models/moe/moe.h"

// Whose init_weights the weights follow: the architecture's, never a config key (norms are ones,
// expert biases zeros under both).
typedef enum {
    // torchtitan's llama3 (models/llama3/__init__.py: _LINEAR_INIT, _EMBEDDING_INIT,
    // _depth_init, _output_linear_init; Transformer.init_weights before 0.3.0): tok_embeddings
    // N(0, 1); wq, wk, wv, w1 N(0, 0.02) truncated at +-2; wo, w2, w3 (the experts' gate, w2,
    // w3) the same with std 0.02 / sqrt(2 (layer + 1)) under depth_init, else
    // 0.02 / sqrt(2 n_layers); output N(0, 1 / sqrt(dim)) truncated at 3 std. A tied output is
    // the std-1 embedding.
    DECODER_INIT_LLAMA3,
    // torchtitan 0.3.0's qwen3 (models/qwen3/__init__.py: _LINEAR_INIT, _EMBEDDING_INIT,
    // _residual_output_init, _moe_experts_init): every weight N(0, 0.02), untruncated, the
    // embedding and the output head too (a tied one is lm_head's, so 0.02 as well); with MoE
    // layers wo and the experts' w2 N(0, 0.02 / sqrt(2 n_layers)) (Megatron's scaled init),
    // the router and the experts' w1, w3 0.02.
    DECODER_INIT_QWEN3,
} DecoderInit;

// DeepSeek V2/V3's multi-head latent attention (models/decoder/mla.c) in place of grouped-query
// attention when kv_lora_rank > 0: q from the normed input directly (q_lora_rank 0) or through
// a low-rank projection with its own RMSNorm; keys and values from a kv_lora_rank-wide latent
// (RMS-normed) up-projected per head, each head qk_nope_head_dim wide without RoPE plus
// qk_rope_head_dim with it, the RoPE part of k one for all heads; values v_head_dim wide.
typedef struct {
    int q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    // YaRN's attention-scale coefficient: with yarn_factor > 1 the softmax scale
    // 1 / sqrt(qk head width) is multiplied by (0.1 mscale ln(yarn_factor) + 1)^2.
    double mscale;
    // The latents' RMSNorms' eps (q_norm, kv_norm): torchtitan's flavors give them every norm's,
    // Hugging Face's DeepSeek-V3 (as DeepSeek's own code) 1e-6 whatever rms_norm_eps says.
    double norm_eps;
} MlaArgs;

// YaRN RoPE scaling (Peng et al. 2023, "NTK-by-parts", DeepSeek's variant: torchtitan's
// _yarn_inv_freq with truncated cutoffs): frequencies of fewer than beta_slow rotations over
// original_seq_len are divided by factor, those of more than beta_fast kept, a linear ramp
// between. factor <= 1: off.
typedef struct {
    double factor, beta_fast, beta_slow;
    int original_seq_len;
} YarnArgs;

typedef struct {
    int dim, n_layers, n_heads, n_kv_heads, vocab_size;
    int head_dim;                // width of one attention head; 0: dim / n_heads (MLA: unused,
                                 // its q and k heads are qk_nope + qk_rope wide)
    int multiple_of;             // FFN width is rounded up to a multiple of this
    double ffn_dim_multiplier;   // 0: none
    int hidden_dim;              // FFN width when given explicitly (Qwen3, a loaded model); 0: derived
    bool qk_norm;                // RMSNorm (head_dim weights) over each head of q and k before RoPE
    double norm_eps, rope_theta;
    // Llama 3.1 RoPE frequency scaling (the "rope_scaling" of Meta's params.json).
    bool rope_scaling;
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    YarnArgs yarn;               // YaRN RoPE scaling (DeepSeek V3's)
    MlaArgs mla;                 // kv_lora_rank > 0: multi-head latent attention
    int max_seq_len;             // RoPE table length
    DecoderInit init;            // whose initialisation (llama3's when zero)
    bool depth_init;             // llama3's init: output projections' std shrinks with depth
    bool tie_word_embeddings;    // output.weight is tok_embeddings.weight
    int loss_chunk_rows;         // rows of logits the head holds at once; 0: as its budget allows
    // moe.router.n_experts > 0: every block's FFN is this mixture of experts (models/moe), on
    // the block's own rows (under tp its sequence-parallel rows, the layer replicated), in
    // place of the dense SwiGLU; 0: dense. The first n_dense_layers blocks keep the dense FFN
    // of hidden_dim (DeepSeek V3's first_k_dense_replace).
    MoeArgs moe;
    int n_dense_layers;
    // DeepSeek-V3's multi-token prediction: mtp_layers modules in the head, module k (from 1)
    // a transformer block as the last layer over eh_proj of [enorm(embedding of token t + k),
    // hnorm(module k - 1's output, the last layer's for k = 1)], its output mtp_norm-ed and
    // through the shared output projection predicting token t + k + 1. Their mean loss weighs
    // mtp_loss_weight in the objective.
    int mtp_layers;
    double mtp_loss_weight;
    // LoRA's adapters, which the build adds after each Linear weight lora targets
    // (models/lora.h); NULL: none. Set by the run, as the vocabulary is.
    const LoraSection *lora;
} DecoderArgs;

#define DECODER_MAX_MTP 8  // model.mtp_layers' bound

// How a decoder is written as a Hugging Face folder: its tensors' dtype, and whether the MTP
// modules go too, as DeepSeek's release has them (layers n_layers + k, which transformers
// skips; `titan convert --to hf --mtp`), or are dropped.
typedef struct {
    SafetensorsDtype dtype;
    bool mtp;
} HfExport;

// The dense FFN's width (0 when every layer is MoE, whose experts have their own: moe.hidden).
int decoder_hidden_dim(const DecoderArgs *args);
// The model has MoE layers (all but its first n_dense_layers).
static inline bool decoder_has_moe(const DecoderArgs *args) {
    return args->moe.router.n_experts > 0;
}
static inline bool decoder_layer_is_moe(const DecoderArgs *args, int layer) {
    return decoder_has_moe(args) && layer >= args->n_dense_layers;
}
static inline bool decoder_has_mla(const DecoderArgs *args) { return args->mla.kv_lora_rank > 0; }
// The width of one head of q and k (MLA's qk_nope + qk_rope).
static inline int decoder_head_dim(const DecoderArgs *args) {
    if (decoder_has_mla(args)) return args->mla.qk_nope_head_dim + args->mla.qk_rope_head_dim;
    return args->head_dim ? args->head_dim : args->dim / args->n_heads;
}
// The width RoPE rotates in each head (MLA's qk_rope_head_dim): its tables' is half of it.
static inline int decoder_rope_dim(const DecoderArgs *args) {
    return decoder_has_mla(args) ? args->mla.qk_rope_head_dim : decoder_head_dim(args);
}

// Builds the parameter table (torchtitan's names, shapes, init) and the block list embed,
// layers.0 .. layers.{n-1}, head for sequences of up to args->max_seq_len tokens.
// activation_checkpoint: checkpoint every transformer block.
void decoder_build(Model *m, const DecoderArgs *args, bool activation_checkpoint);
// Frees what decoder_build allocated (not the arenas).
void decoder_free(Model *m);

// ---- flavors and checkpoint attributes (args.c) -------------------------------------------

// "debugmodel, small, ...": the n flavor names at names, names + stride bytes, ... (the name
// column of an architecture's flavor table: &FLAVORS[0].name, sizeof FLAVORS[0]), joined into
// out (len bytes) on the first call and returned as they are after; for messages and help.
const char *decoder_flavor_names(char *out, size_t len, const char *const *names, size_t stride,
                                 int n);

// The architecture as checkpoint attributes ("model.dim", ...), so that any reader (the PyTorch
// reference, a converter) rebuilds the model from the file alone; returns the count. head_dim
// and qk_norm are written only when they are not Llama 3's (dim / n_heads, none), so Llama 3's
// checkpoints keep their attributes; MoE layers replace hidden_dim with their moe_* shape.
#define DECODER_MAX_ATTRS 40
int decoder_describe(const DecoderArgs *args, CkptAttr out[DECODER_MAX_ATTRS]);
// The inverse over args holding the architecture's defaults (max_seq_len is left to the
// caller); die_user naming the file on args decoder_args_check refuses.
void decoder_args_from_checkpoint(const char *path, DecoderArgs *args);
// Whether args make a model (heads that divide, an even RoPE width, MLA's and YaRN's widths
// and factors, MoE routing groups that divide the experts and a top_k their limit can give);
// else false with one line in err. For args from user input (checkpoints, Hugging Face
// configs); the flavor tables are valid by construction.
bool decoder_args_check(const DecoderArgs *args, char *err, size_t len);

// ---- tensor parallelism (parallelize.c) ----------------------------------------------------

typedef struct Tp Tp;  // parallel/tp.h
// Why the model cannot run on tp ranks with microbatches of B x T (one line, for die_user), or
// NULL when it can: heads, kv heads, FFN width and vocabulary split over tp, and so do the
// B*T rows (sequence parallel). Called before anything is allocated.
const char *decoder_tp_check(const DecoderArgs *args, int tp, int B, int T, char *err,
                             size_t len);
// torchtitan's TP plan (llama3/infra/parallelize.py, qwen3's the same) on m, built and not yet
// allocated: wq/wk/wv and w1/w3 column-parallel (Shard(0) of the (out, in) weight), wo and w2
// row-parallel (Shard(1)), tok_embeddings and output vocab-parallel (Shard(0)), norms
// (q_norm, k_norm: whole heads stay on one rank) replicated; the blocks then call tp's hooks.
void decoder_parallelize_tp(Model *m, const Tp *tp);
// Bytes one rank hands to the tp group per microbatch of B x T (comm.h's accounting: each
// operation's local input): every sequence-parallel seam (all-gather of rows before a colwise
// projection, reduce-scatter after a rowwise one; embedding, 4 per layer over forward and
// backward, 2 more for each of the recomputed_layers whose forward checkpointing re-runs, head)
// moves (BT + BT/tp) * dim floats, and the loss 3 * BT floats (loss parallel) or the gathered
// logits; MTP modules add their inputs' lookups to the embedding's, their layers' seams and
// losses to the head's; of blocks [first_block, last_block) only (a pipeline stage's; 0 and
// n_layers + 2: the whole model).
uint64_t decoder_tp_bytes_per_microbatch(const DecoderArgs *args, int tp, int B, int T,
                                         int recomputed_layers, bool loss_parallel,
                                         int first_block, int last_block);

// ---- incremental decoding (decode.c) ------------------------------------------------------

// The keys (after RoPE) and values of every position decoded so far, per layer, so that each
// new token costs one row of every matmul instead of a forward over the whole sequence; plus
// that one token's activations. Carved from its own arena, sized by the same code.
typedef struct {
    int max_ctx;            // positions the cache holds (<= the model's max_seq_len)
    int kv_width;           // n_kv_heads * head_dim (MLA: its latent's, kv_lora_rank + rope)
    float *k, *v;           // (n_layers, max_ctx, kv_width) each. MLA caches each position's
                            // latent [kv_norm(c), rope(k_pe)] in k alone, read as keys and
                            // values (DeepSeek's inference, its wkv_b absorbed into q and out);
                            // v is NULL
    float *lat_q, *lat_out; // MLA: (n_heads, kv_width) x2: q in the latent's space, and the
                            // attention's output there
    float *low;             // MLA: (2 * max(q_lora_rank, kv_width, n_heads * rope)) scratch
    float *x, *xn, *rstd;   // (dim) residual stream, (dim) normed, (1) its 1/rms
    float *q, *attn;        // (n_heads * head_dim) x2
    float *qk, *head_rstd;  // (n_heads * head_dim), (n_heads): q or k before QK-norm, its 1/rms
    float *gate, *up, *act; // (hidden) x3: the dense FFN's (MoE layers carve their own on
                            // top of the arena for the step, counted in its size)
    float *logits;          // (vocab)
    int *ids;               // (2) the step's token and position, where the kernels read them
    Arena arena;
    ArenaMemory memory;     // the backend's, which the arena lives in
} DecoderKVCache;

// A cache for up to max_ctx positions of the model m (built by decoder_build), dense or MoE,
// in the memory of the kernels backend k (device memory on cuda).
void decoder_kv_cache_init(DecoderKVCache *c, const Model *m, int max_ctx, const KernelOps *k);
void decoder_kv_cache_free(DecoderKVCache *c);
// Runs token at position pos, positions [0, pos) being in the cache already, and returns the
// next-token logits (vocab, in k's memory), valid until the next call: the forward's row pos,
// by the math.
const float *decoder_decode_step(const Model *m, DecoderKVCache *c, const KernelOps *k,
                                 int token, int pos);
