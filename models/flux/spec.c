// FLUX's entry in the model registry (models/registry.h), as torchtitan's models/flux/__init__.py
// registers its TrainSpec: flavors, build, checkpoint attributes, its own training data
// (models/flux/data.c). What FLUX has no form of in titan is NULL: Hugging Face files (refused
// by name where a user asks), llama2.c files and KV-cache decoding (its `titan generate` is
// the image sampler, infer/flux_sample.c, which infer/generate.c dispatches to).
#include <string.h>

#include "core/errors.h"
#include "models/registry.h"

extern const ModelData FLUX_DATA;  // models/flux/data.c

// flavor, args_from_checkpoint: registry.h's pass-throughs to flux_flavor, ...
MODEL_SPEC_READERS(flux, FLUX_SPEC)

static const FluxArgs *flux_of(const ModelArgs *a) { return model_args_of(a, &FLUX_SPEC); }

static ModelShape shape(const ModelArgs *a) {
    const FluxArgs *f = flux_of(a);
    return (ModelShape){.n_layers = f->depth + f->depth_single_blocks, .dim = f->hidden_size,
                        .kv_dim = f->hidden_size, .head_dim = flux_head_dim(f),
                        .max_seq_len = flux_seq_len(f)};
}

// FLUX reads no vocabulary and its sequence is its data's (ModelData.open sets it); of the
// model.* keys, the decoders' would do nothing here and are refused by name.
static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    (void)flux_of(a), (void)vocab_size, (void)max_seq_len;
    if (!config) return;
    const char *key = config->tie_word_embeddings ? "model.tie_word_embeddings"
                      : config->rope_scaling      ? "model.rope_scaling"
                                                  : NULL;
    if (key) die_user("%s does nothing for model flux (a decoder's setting)", key);
}

static void build(Model *m, const ModelArgs *a, bool activation_checkpoint) {
    const FluxArgs *f = flux_of(a);
    char err[256];
    if (flux_args_check(f, err, sizeof err)) die_user("model flux: %s", err);
    flux_build(m, f, activation_checkpoint);
}

// Tensor parallel cuts heads and MLP columns, never the rows (no sequence parallel): any B, T.
static const char *tp_check(const ModelArgs *a, int tp, int B, int T, char *err, size_t len) {
    (void)B, (void)T;
    return flux_tp_check(flux_of(a), tp, err, len);
}

// No loss parallel: the loss is computed whole on every rank.
static uint64_t tp_bytes_per_microbatch(const ModelArgs *a, int tp, int B, int T,
                                        int recomputed_layers, bool loss_parallel,
                                        int first_block, int last_block) {
    (void)tp, (void)loss_parallel;
    return flux_tp_bytes_per_microbatch(flux_of(a), B, T, recomputed_layers, first_block,
                                        last_block);
}

static int describe(const ModelArgs *a, CkptAttr *out) { return flux_describe(flux_of(a), out); }

const ModelSpec FLUX_SPEC = {
    .name = "flux",
    .flavor = flavor,
    .flavor_names = flux_flavor_names,
    .shape = shape,
    .update_from_config = update_from_config,
    .build = build,
    .free = flux_free,
    .tp_check = tp_check,
    .parallelize_tp = flux_parallelize_tp,
    .tp_bytes_per_microbatch = tp_bytes_per_microbatch,
    .parallelize_cp = flux_parallelize_cp,
    .describe = describe,
    .args_from_checkpoint = args_from_checkpoint,
    .data = &FLUX_DATA,
};
