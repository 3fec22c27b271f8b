// DeepSeek-V3 (and V2, Kimi K2: the same architecture): torchtitan's deepseek_v3 flavors on
// models/decoder's transformer with multi-head latent attention (models/decoder/mla.c), YaRN
// RoPE scaling, and mixture-of-experts layers (models/moe) after the first n_dense_layers
// dense ones: shared experts, softmax or sigmoid scores with group-limited routing and a route
// scale, auxiliary-loss-free balancing.
#pragma once

#include <stdbool.h>

#include "checkpoint/safetensors.h"
#include "models/decoder/decoder.h"

// The decoder's args first (models/decoder/decoder_spec.h reads them there).
typedef struct {
    DecoderArgs decoder;
} DeepseekV3Args;

// Fills args with the named flavor ("debugmodel", "16B", "236B", "671B", "kimi_k2"); false if
// unknown.
bool deepseek_v3_flavor(const char *name, DeepseekV3Args *args);
const char *deepseek_v3_flavor_names(void);  // for error messages
// The architecture recorded in a checkpoint (max_seq_len is left to the caller); die_user
// naming the file when it records no MLA.
void deepseek_v3_args_from_checkpoint(const char *path, DeepseekV3Args *args);

// ---- Hugging Face checkpoints (hf.c) ------------------------------------------------------

// transformers' DeepseekV3ForCausalLM: config.json (model_type deepseek_v3) and safetensors
// weights under DeepSeek's names (model.layers.N.self_attn.kv_a_proj_with_mqa.weight, ...,
// mlp.gate.e_score_correction_bias, mlp.shared_experts.*), none permuted. As llama3's (hf.c):
// false and one line in err on anything titan's DeepSeek-V3 cannot be (another model_type,
// biases, softmax scoring, rope_interleave false, a YaRN whose mscale and mscale_all_dim
// differ). Its MTP layers (model.layers.{n_layers}...), which transformers ignores, are left
// unread; an export has none.
bool deepseek_v3_try_args_from_hf(const char *dir, DeepseekV3Args *args, char *err,
                                  size_t errlen);
void deepseek_v3_load_hf(const char *path, const DeepseekV3Args *args, ParamTable *params);
void deepseek_v3_save_hf(const char *dir, const DeepseekV3Args *args, const ParamTable *params,
                         HfExport how);
