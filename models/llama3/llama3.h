// Llama 3 (dense): torchtitan's TransformerModelArgs, flavors, and the model builder.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "models/model.h"

typedef struct {
    int dim, n_layers, n_heads, n_kv_heads, vocab_size;
    int multiple_of;             // FFN width is rounded up to a multiple of this
    double ffn_dim_multiplier;   // 0: none
    int hidden_dim;              // FFN width when given explicitly (a loaded model); 0: derived
    double norm_eps, rope_theta;
    // Llama 3.1 RoPE frequency scaling (the "rope_scaling" of Meta's params.json).
    bool rope_scaling;
    double rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    int max_seq_len;             // RoPE table length
    bool depth_init;             // output projections' init std shrinks with layer depth
    bool tie_word_embeddings;    // output.weight is tok_embeddings.weight
    int loss_chunk_rows;         // rows of logits the head holds at once; 0: as its budget allows
} LlamaArgs;

// Fills args with the named flavor ("debugmodel", "small", "8B", "70B", "405B"); false if unknown.
bool llama3_flavor(const char *name, LlamaArgs *args);
const char *llama3_flavor_names(void);  // "debugmodel, small, ..." for error messages
int llama3_hidden_dim(const LlamaArgs *args);
static inline int llama3_head_dim(const LlamaArgs *args) { return args->dim / args->n_heads; }

// Builds the parameter table (names, shapes, init) and the block list for sequences of up to
// args->max_seq_len tokens. activation_checkpoint: checkpoint every transformer block.
void llama3_build(Model *m, const LlamaArgs *args, bool activation_checkpoint);
// The architecture as checkpoint attributes ("model.dim", ...), so that any reader (the PyTorch
// reference, a converter) rebuilds the model from the file alone. Returns the count.
#define LLAMA3_N_ATTRS 14
int llama3_describe(const LlamaArgs *args, CkptAttr out[LLAMA3_N_ATTRS]);
// The inverse: the architecture recorded in a checkpoint (max_seq_len is left to the caller).
void llama3_args_from_checkpoint(const char *path, LlamaArgs *args);
// Frees what llama3_build allocated (not the arenas).
void llama3_free(Model *m);

// ---- tensor parallelism (parallelize.c) ----------------------------------------------------

typedef struct Tp Tp;  // parallel/tp.h
// Why the model cannot run on tp ranks with microbatches of B x T (one line, for die_user), or
// NULL when it can: heads, kv heads, FFN width and vocabulary split over tp, and so do the
// B*T rows (sequence parallel). Called before anything is allocated.
const char *llama3_tp_check(const LlamaArgs *args, int tp, int B, int T, char *err, size_t len);
// torchtitan's llama3 TP plan (infra/parallelize.py) on m, built and not yet allocated:
// wq/wk/wv and w1/w3 column-parallel (Shard(0) of the (out, in) weight), wo and w2
// row-parallel (Shard(1)), tok_embeddings and output vocab-parallel (Shard(0)), norms
// replicated; the blocks then call tp's hooks.
void llama3_parallelize_tp(Model *m, const Tp *tp);
// Bytes one rank hands to the tp group per microbatch of B x T (comm.h's accounting: each
// operation's local input): every sequence-parallel seam (all-gather of rows before a colwise
// projection, reduce-scatter after a rowwise one; embedding, 4 per layer over forward and
// backward, 2 more per layer when checkpointing re-runs forward, head) moves (BT + BT/tp) * dim
// floats, and the loss 3 * BT floats (loss parallel) or the gathered logits; of blocks
// [first_block, last_block) only (a pipeline stage's; 0 and n_layers + 2: the whole model).
uint64_t llama3_tp_bytes_per_microbatch(const LlamaArgs *args, int tp, int B, int T,
                                        bool activation_checkpoint, bool loss_parallel,
                                        int first_block, int last_block);

// ---- incremental decoding (decode.c) ------------------------------------------------------

// The keys (after RoPE) and values of every position decoded so far, per layer, so that each
// new token costs one row of every matmul instead of a forward over the whole sequence; plus
// that one token's activations. Carved from its own arena, sized by the same code.
typedef struct {
    int max_ctx;            // positions the cache holds (<= the model's max_seq_len)
    int kv_width;           // n_kv_heads * head_dim
    float *k, *v;           // (n_layers, max_ctx, kv_width) each
    float *x, *xn, *rstd;   // (dim) residual stream, (dim) normed, (1) its 1/rms
    float *q, *attn;        // (n_heads * head_dim) x2
    float *gate, *up, *act; // (hidden) x3
    float *logits;          // (vocab)
    Arena arena;
} LlamaKVCache;

// A cache for up to max_ctx positions of the model m (built by llama3_build).
void llama3_kv_cache_init(LlamaKVCache *c, const Model *m, int max_ctx);
void llama3_kv_cache_free(LlamaKVCache *c);
// Runs token at position pos, positions [0, pos) being in the cache already, and returns the
// next-token logits (vocab), valid until the next call: the forward's row pos, by the math.
const float *llama3_decode_step(const Model *m, LlamaKVCache *c, const KernelOps *k, int token,
                                int pos);

// ---- llama2.c checkpoints (llama2c.c) -----------------------------------------------------

// The architecture in a llama2.c checkpoint's header (Karpathy's legacy "version 0" .bin:
// 7 int32 then fp32 weights); max_seq_len is its seq_len. die_user naming the file on a
// missing file, a nonsense header, or a size other than the header implies.
void llama3_args_from_llama2c(const char *path, LlamaArgs *args);
// Copies the file's weights into m, built from those args and allocated; die_user as above.
void llama3_load_llama2c(const char *path, Model *m);
// The two without dying: false and the one-line reason in err.
bool llama3_try_args_from_llama2c(const char *path, LlamaArgs *args, char *err, size_t errlen);
bool llama3_try_load_llama2c(const char *path, Model *m, char *err, size_t errlen);

// ---- Hugging Face checkpoints (hf.c) ------------------------------------------------------

// transformers' LlamaForCausalLM: config.json and safetensors weights under HF's names
// (model.layers.N.self_attn.q_proj.weight, ...), q_proj and k_proj rows permuted per head for
// HF's rotate_half RoPE (titan rotates interleaved pairs). The tables are host ParamTables of
// whole tensors (no tensor-parallel slices), so a caller gathers shards first.

// The architecture in dir/config.json (max_seq_len: its max_position_embeddings; what HF does
// not record, e.g. init, torchtitan's defaults). False and one line naming the file and key
// in err on anything titan's Llama cannot be: another model_type or activation, biases,
// uneven heads, a rope_scaling other than Llama 3.1's.
bool llama3_try_args_from_hf(const char *dir, LlamaArgs *args, char *err, size_t errlen);
// Fills params (built from args, allocated) from the safetensors at path (a file, or a folder
// with model.safetensors or a sharded model.safetensors.index.json); every parameter must be
// there with its shape, and no tensor that is not one.
bool llama3_try_load_hf(const char *path, const LlamaArgs *args, ParamTable *params, char *err,
                        size_t errlen);
void llama3_load_hf(const char *path, const LlamaArgs *args, ParamTable *params);
// Writes dir/model.safetensors (in dtype) and dir/config.json, creating dir.
void llama3_save_hf(const char *dir, const LlamaArgs *args, const ParamTable *params,
                    SafetensorsDtype dtype);
