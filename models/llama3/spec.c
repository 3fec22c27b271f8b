// Llama 3's entry in the model registry (models/registry.h): its flavors, config updates and
// checkpoint formats over the LlamaArgs member of ModelArgs, the decoder's functions for the
// rest, as torchtitan's models/llama3/__init__.py registers its TrainSpec.
#include "core/errors.h"
#include "models/decoder/decoder_spec.h"

// For a reader that fills the args: from here on they are llama3's.
static LlamaArgs *llama_fill(ModelArgs *a) {
    a->spec = &LLAMA3_SPEC;
    return &a->as.llama3;
}

// For everything else: args some llama3 reader filled.
static const LlamaArgs *llama_of(const ModelArgs *a) {
    CHECK(a->spec == &LLAMA3_SPEC);
    return &a->as.llama3;
}

static LlamaArgs *llama_mut(ModelArgs *a) { return (LlamaArgs *)llama_of(a); }

static bool flavor(const char *name, ModelArgs *a) { return llama3_flavor(name, llama_fill(a)); }

static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    LlamaArgs *l = llama_mut(a);
    if (vocab_size) l->vocab_size = vocab_size;
    l->max_seq_len = max_seq_len;
    if (!config) return;
    l->tie_word_embeddings = config->tie_word_embeddings;
    l->rope_scaling = config->rope_scaling;
}

static void args_from_checkpoint(const char *path, ModelArgs *a) {
    llama3_args_from_checkpoint(path, llama_fill(a));
}

static bool try_args_from_hf(const char *dir, ModelArgs *a, char *err, size_t len) {
    return llama3_try_args_from_hf(dir, llama_fill(a), err, len);
}

static void load_hf(const char *path, const ModelArgs *a, ParamTable *params) {
    llama3_load_hf(path, llama_of(a), params);
}

static void save_hf(const char *dir, const ModelArgs *a, const ParamTable *params,
                    SafetensorsDtype dtype) {
    llama3_save_hf(dir, llama_of(a), params, dtype);
}

static void args_from_llama2c(const char *path, ModelArgs *a) {
    llama3_args_from_llama2c(path, llama_fill(a));
}

const ModelSpec LLAMA3_SPEC = {
    .name = "llama3",
    .flavor = flavor,
    .flavor_names = llama3_flavor_names,
    .shape = decoder_spec_shape,
    .update_from_config = update_from_config,
    .build = decoder_spec_build,
    .free = decoder_free,
    .tp_check = decoder_spec_tp_check,
    .parallelize_tp = decoder_parallelize_tp,
    .tp_bytes_per_microbatch = decoder_spec_tp_bytes_per_microbatch,
    .describe = decoder_spec_describe,
    .args_from_checkpoint = args_from_checkpoint,
    .try_args_from_hf = try_args_from_hf,
    .hf_model_types = (const char *const[]){"llama", NULL},
    .load_hf = load_hf,
    .save_hf = save_hf,
    .args_from_llama2c = args_from_llama2c,
    .load_llama2c = llama3_load_llama2c,
    .kv_cache_new = decoder_spec_kv_cache_new,
    .decode_step = decoder_spec_decode_step,
    .kv_cache_free = decoder_spec_kv_cache_free,
};
