// DeepSeek-V3's entry in the model registry (models/registry.h): its flavors and config
// updates over the DeepseekV3Args member of ModelArgs, the decoder's functions for the rest,
// as torchtitan's models/deepseek_v3/__init__.py registers its ModelSpec.
#include "core/errors.h"
#include "models/decoder/decoder_spec.h"

// flavor, args_from_checkpoint, try_args_from_hf, load_hf, save_hf: registry.h's
// pass-throughs to deepseek_v3_flavor, ...
MODEL_SPEC_READERS(deepseek_v3, DEEPSEEK_V3_SPEC)
MODEL_SPEC_HF(deepseek_v3, DEEPSEEK_V3_SPEC)

// DeepSeek-V3 has untied embeddings and YaRN, not Llama 3.1's RoPE scaling: those keys are
// refused rather than ignored.
static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    DecoderArgs *d = &((DeepseekV3Args *)model_args_of(a, &DEEPSEEK_V3_SPEC))->decoder;
    if (vocab_size) d->vocab_size = vocab_size;
    d->max_seq_len = max_seq_len;
    if (!config) return;
    if (config->rope_scaling)
        die_user("model.rope_scaling: Llama 3.1's RoPE scaling is llama3's; deepseek_v3 has "
                 "YaRN's, set by its flavor");
    if (config->tie_word_embeddings)
        die_user("model.tie_word_embeddings: deepseek_v3's output projection is its own");
    moe_args_from_config(&d->moe, config);
    d->mtp_layers = (int)config->mtp_layers;
    d->mtp_loss_weight = config->mtp_loss_weight;
}

const ModelSpec DEEPSEEK_V3_SPEC = {
    .name = "deepseek_v3",
    .flavor = flavor,
    .flavor_names = deepseek_v3_flavor_names,
    .update_from_config = update_from_config,
    DECODER_SPEC_SLOTS,
    .args_from_checkpoint = args_from_checkpoint,
    .try_args_from_hf = try_args_from_hf,
    .hf_model_types = (const char *const[]){"deepseek_v3", NULL},
    .load_hf = load_hf,
    .save_hf = save_hf,
};
