// Llama 3 (dense): torchtitan's TransformerModelArgs, flavors, and the model builder.
#pragma once

#include <stdbool.h>

#include "checkpoint/checkpoint.h"
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
