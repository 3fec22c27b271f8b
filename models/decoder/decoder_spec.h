// The model registry's functions (models/registry.h) that every architecture built on the
// decoder shares: they read the DecoderArgs at the start of its member of ModelArgs (Llama 3's
// args are DecoderArgs; Qwen3's begin with them), so each architecture's spec lists these
// beside its own flavors, config updates and checkpoint formats.
#pragma once

#include "models/registry.h"

// The DecoderArgs of args filled by a decoder architecture's reader (checked).
const DecoderArgs *decoder_args_of(const ModelArgs *a);

ModelShape decoder_spec_shape(const ModelArgs *a);
void decoder_spec_build(Model *m, const ModelArgs *a, bool activation_checkpoint);
const char *decoder_spec_tp_check(const ModelArgs *a, int tp, int B, int T, char *err,
                                  size_t len);
uint64_t decoder_spec_tp_bytes_per_microbatch(const ModelArgs *a, int tp, int B, int T,
                                              int recomputed_layers, bool loss_parallel,
                                              int first_block, int last_block);
int decoder_spec_describe(const ModelArgs *a, CkptAttr *out);
void *decoder_spec_kv_cache_new(const Model *m, int max_ctx, const KernelOps *k);
const float *decoder_spec_decode_step(const Model *m, void *cache, const KernelOps *k, int token,
                                      int pos);
void decoder_spec_kv_cache_free(void *cache);
void decoder_spec_save_peft(const char *dir, const ModelArgs *a, const ParamTable *params,
                            const LoraSection *lora);

// Those functions' slots, for a decoder architecture's ModelSpec initializer (beside its own:
// name, flavors, update_from_config, checkpoint formats).
#define DECODER_SPEC_SLOTS                                                                     \
    .shape = decoder_spec_shape, .build = decoder_spec_build, .lora = true,                    \
    .save_peft = decoder_spec_save_peft,                                                       \
    .free = decoder_free,                                                                      \
    .tp_check = decoder_spec_tp_check, .parallelize_tp = decoder_parallelize_tp,               \
    .tp_bytes_per_microbatch = decoder_spec_tp_bytes_per_microbatch,                           \
    .describe = decoder_spec_describe, .kv_cache_new = decoder_spec_kv_cache_new,              \
    .decode_step = decoder_spec_decode_step, .kv_cache_free = decoder_spec_kv_cache_free
