// Llama 3's entry in the model registry (models/registry.h): its flavors, config updates and
// checkpoint formats over the LlamaArgs member of ModelArgs, the decoder's functions for the
// rest, as torchtitan's models/llama3/__init__.py registers its TrainSpec.
#include "models/decoder/decoder_spec.h"

// flavor, args_from_checkpoint, try_args_from_hf, load_hf, save_hf: registry.h's
// pass-throughs to llama3_flavor, ...
MODEL_SPEC_READERS(llama3, LLAMA3_SPEC)
MODEL_SPEC_HF(llama3, LLAMA3_SPEC)

static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    LlamaArgs *l = (LlamaArgs *)model_args_of(a, &LLAMA3_SPEC);
    if (vocab_size) l->vocab_size = vocab_size;
    l->max_seq_len = max_seq_len;
    if (!config) return;
    l->tie_word_embeddings = config->tie_word_embeddings;
    l->rope_scaling = config->rope_scaling;
}

static void args_from_llama2c(const char *path, ModelArgs *a) {
    llama3_args_from_llama2c(path, model_args_fill(a, &LLAMA3_SPEC));
}

const ModelSpec LLAMA3_SPEC = {
    .name = "llama3",
    .flavor = flavor,
    .flavor_names = llama3_flavor_names,
    .update_from_config = update_from_config,
    DECODER_SPEC_SLOTS,
    .args_from_checkpoint = args_from_checkpoint,
    .try_args_from_hf = try_args_from_hf,
    .hf_model_types = (const char *const[]){"llama", NULL},
    .load_hf = load_hf,
    .save_hf = save_hf,
    .args_from_llama2c = args_from_llama2c,
    .load_llama2c = llama3_load_llama2c,
};
