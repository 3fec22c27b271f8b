// Hugging Face checkpoints of the decoder's architectures (transformers' LlamaForCausalLM,
// Qwen3ForCausalLM, Qwen3MoeForCausalLM): what their config.json and safetensors share. The weights' names are
// transformers' (model.layers.N.self_attn.q_proj.weight, ...; torchtitan's state-dict
// adapters map the same). HF applies RoPE to the two halves of each head (rotate_half) where
// titan, as Meta and torchtitan, rotates interleaved pairs, so the rows of wq and wk, and the
// QK-norm weights with them, are permuted per head on the way out (transformers'
// convert_llama_weights_to_hf.py permute) and back on the way in: the same attention scores
// either way. MoE layers' stacked experts are one HF tensor per expert, their routing biases
// none (models/moe's names: an import starts them at zero, an export drops them, saying so
// when they are not zero). The tables are host ParamTables of whole tensors (no
// tensor-parallel slices).
// Each architecture's hf.c reads and writes the config keys that are its own.
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/safetensors.h"
#include "models/decoder/decoder.h"

// The largest sizes config.json may give, checked as it is read, before anything is sized by
// them: far beyond any released model (Llama 3.1 405B: hidden 16384, FFN 53248, 126 layers,
// 128 heads, 128k vocabulary and positions), and small enough that the products titan forms
// from them stay within their types.
#define HF_MAX_WIDTH 65536        // hidden_size
#define HF_MAX_HEAD_DIM 1024
#define HF_MAX_FFN 1048576        // intermediate_size, moe_intermediate_size
#define HF_MAX_LAYERS 1024
#define HF_MAX_HEADS 1024
#define HF_MAX_EXPERTS 4096
#define HF_MAX_VOCAB 16777216
#define HF_MAX_POSITIONS 1048576  // max_position_embeddings
#define HF_MAX_ROPE_TABLE (1 << 28)  // max_position_embeddings x head_dim: RoPE's tables' floats

// config.json being read: err gets one line naming the file and the key. model: the
// architecture's name in messages ("Llama", "Qwen3").
typedef struct {
    const char *path, *model;
    const json_t *root;
    char *err;
    size_t errlen;
} HfConfig;

// dir/config.json parsed into *root (to json_decref), its path in path; false and the reason.
bool hf_config_load(const char *dir, json_t **root, char *path, size_t pathlen, char *err,
                    size_t errlen);
// key as an integer in [lo, hi]; absent (or null): def, or an error when def < lo (required).
bool hf_config_int(const HfConfig *r, const char *key, int64_t lo, int64_t hi, int64_t def,
                   int *out);
// key as a boolean; absent (or null): def.
bool hf_config_bool(const HfConfig *r, const char *key, bool def, bool *out);
// key of obj as a positive number; absent (or null): def, or an error when def <= 0 (required).
bool hf_config_real(const HfConfig *r, const json_t *obj, const char *key, double def,
                    double *out);
// A string key that, when given, must be what titan implements.
bool hf_config_expect(const HfConfig *r, const char *key, const char *want);
// A boolean key that, when given, must be false (a feature titan's model does not have).
bool hf_config_refuse(const HfConfig *r, const char *key, const char *why);
// What every decoder's config.json says alike: model_type, silu, no biases, the shape (head_dim
// free: any width, else dim / num_attention_heads), rms_norm_eps, rope_theta, tied embeddings,
// max_position_embeddings (default max_pos, transformers' config class's). Missing keys take
// transformers' defaults.
bool decoder_hf_config_read(const HfConfig *r, DecoderArgs *a, const char *model_type,
                            bool head_dim_free, int max_pos);
// The same keys for a, as transformers writes them (architecture: "LlamaForCausalLM", ...),
// for the caller to add its own to and hf_config_write.
json_t *decoder_hf_config_json(const DecoderArgs *a, const char *architecture,
                               const char *model_type, SafetensorsDtype dtype);
// Writes c as dir/config.json (atomically) and frees it.
void hf_config_write(const char *dir, json_t *c);

// Fills params (built from a, allocated) from the safetensors at path (a file, or a folder
// with model.safetensors or a sharded model.safetensors.index.json); every parameter must be
// there with its shape (a's MTP modules as DeepSeek's release has them), and no tensor that is
// not one (but a release's MTP layers, left unread when a has none).
bool decoder_try_load_hf(const char *path, const DecoderArgs *a, const char *model,
                         ParamTable *params, char *err, size_t errlen);
// Writes dir/model.safetensors (in how.dtype, the MTP modules with how.mtp), creating dir.
void decoder_save_hf_weights(const char *dir, const DecoderArgs *a, const ParamTable *params,
                             HfExport how);
// A LoRA run's adapters as PEFT's: dir/adapter_model.safetensors (fp32, each adapter named as
// PEFT names it on the exported model, "base_model.model.model.layers.0.self_attn.q_proj.
// lora_A.weight", B's rows in HF's order where its weight's are permuted) and
// adapter_config.json (r, lora_alpha, the adapted modules' whole HF names, so PEFT adapts
// those only). The MTP modules' adapters are left out, said in a log line: transformers' model
// has no MTP modules. params: whole tensors.
void decoder_save_peft(const char *dir, const DecoderArgs *a, const ParamTable *params,
                       const LoraSection *lora);
