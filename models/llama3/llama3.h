// Llama 3 (dense): torchtitan's TransformerModelArgs and flavors, and Llama's checkpoint formats
// (Hugging Face, llama2.c); the model itself is models/decoder's.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "models/decoder/decoder.h"

// Llama 3's args are a decoder's (models/decoder) without QK-norm and with heads of
// dim / n_heads (head_dim 0); their defaults and flavors are torchtitan's llama3's.
typedef DecoderArgs LlamaArgs;

// Fills args with the named flavor ("debugmodel", "small", "medium", "1B", "8B", "70B", "405B");
// false if unknown.
bool llama3_flavor(const char *name, LlamaArgs *args);
const char *llama3_flavor_names(void);  // "debugmodel, small, ..." for error messages
// The architecture recorded in a checkpoint (max_seq_len is left to the caller).
void llama3_args_from_checkpoint(const char *path, LlamaArgs *args);

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
                    HfExport how);
