// Qwen3's entry in the model registry (models/registry.h): its flavors, config updates and
// checkpoint formats over the Qwen3Args member of ModelArgs, the decoder's functions for the
// rest, as torchtitan's models/qwen3/__init__.py registers its ModelSpec.
#include "core/errors.h"
#include "models/decoder/decoder_spec.h"

// flavor, args_from_checkpoint, try_args_from_hf, load_hf, save_hf: registry.h's
// pass-throughs to qwen3_flavor, ...
MODEL_SPEC_READERS(qwen3, QWEN3_SPEC)
MODEL_SPEC_HF(qwen3, QWEN3_SPEC)

// The flavor decides tied embeddings (0.6B to 4B tie), model.tie_word_embeddings ties any
// other; Llama 3.1's RoPE scaling is not Qwen3's.
static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    DecoderArgs *d = &((Qwen3Args *)model_args_of(a, &QWEN3_SPEC))->decoder;
    if (vocab_size) d->vocab_size = vocab_size;
    d->max_seq_len = max_seq_len;
    if (!config) return;
    if (config->rope_scaling)
        die_user("model.rope_scaling: Llama 3.1's RoPE scaling is llama3's; qwen3 has none");
    d->tie_word_embeddings = d->tie_word_embeddings || config->tie_word_embeddings;
    if (decoder_has_moe(d)) moe_args_from_config(&d->moe, config);
}

const ModelSpec QWEN3_SPEC = {
    .name = "qwen3",
    .flavor = flavor,
    .flavor_names = qwen3_flavor_names,
    .update_from_config = update_from_config,
    DECODER_SPEC_SLOTS,
    .args_from_checkpoint = args_from_checkpoint,
    .try_args_from_hf = try_args_from_hf,
    .hf_model_types = (const char *const[]){"qwen3", "qwen3_moe", NULL},
    .load_hf = load_hf,
    .save_hf = save_hf,
};
