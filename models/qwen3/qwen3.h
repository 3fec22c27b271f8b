// Qwen3 (dense): torchtitan's qwen3 flavors on models/decoder's transformer with QK-norm (an
// RMSNorm over each head of q and k before RoPE), heads of head_dim 128 whatever dim / n_heads,
// grouped-query attention, an explicit FFN width, RoPE theta 1e6 and RMSNorm eps 1e-6; and
// transformers' Qwen3ForCausalLM checkpoints.
#pragma once

#include <stdbool.h>

#include "checkpoint/safetensors.h"
#include "models/decoder/decoder.h"

// The decoder's args first (models/decoder/decoder_spec.h reads them there); the MoE flavors'
// FFN kind and expert shapes join them beside it.
typedef struct {
    DecoderArgs decoder;
} Qwen3Args;

// Fills args with the named flavor ("debugmodel", "0.6B", ..., "32B"); false if unknown.
bool qwen3_flavor(const char *name, Qwen3Args *args);
const char *qwen3_flavor_names(void);  // "debugmodel, small, ..." for error messages
// The architecture recorded in a checkpoint (max_seq_len is left to the caller); die_user
// naming the file when it records no QK-norm.
void qwen3_args_from_checkpoint(const char *path, Qwen3Args *args);

// ---- Hugging Face checkpoints (hf.c) ------------------------------------------------------

// transformers' Qwen3ForCausalLM: config.json (model_type qwen3) and safetensors weights under
// HF's names (model.layers.N.self_attn.q_norm.weight, ...), q_proj and k_proj rows and the
// q_norm and k_norm weights permuted per head for HF's rotate_half RoPE. As llama3's (hf.c):
// false and one line in err on anything titan's Qwen3 cannot be (another model_type,
// biases, sliding-window attention, rope_scaling).
bool qwen3_try_args_from_hf(const char *dir, Qwen3Args *args, char *err, size_t errlen);
void qwen3_load_hf(const char *path, const Qwen3Args *args, ParamTable *params);
void qwen3_save_hf(const char *dir, const Qwen3Args *args, const ParamTable *params,
                   HfExport how);
