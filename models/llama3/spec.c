// Llama 3's entry in the model registry (models/registry.h): its own functions over the
// LlamaArgs member of ModelArgs, as torchtitan's models/llama3/__init__.py registers its
// TrainSpec.
#include <stdlib.h>

#include "core/errors.h"
#include "models/registry.h"

_Static_assert(LLAMA3_N_ATTRS <= MODEL_MAX_ATTRS, "llama3 describes itself in more attributes");

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

static ModelShape shape(const ModelArgs *a) {
    const LlamaArgs *l = llama_of(a);
    return (ModelShape){.n_layers = l->n_layers, .dim = l->dim,
                        .kv_dim = l->n_kv_heads * llama3_head_dim(l), .vocab_size = l->vocab_size,
                        .max_seq_len = l->max_seq_len,
                        .tie_word_embeddings = l->tie_word_embeddings};
}

static void update_from_config(ModelArgs *a, const ModelSection *config, int vocab_size,
                               int max_seq_len) {
    LlamaArgs *l = llama_mut(a);
    if (vocab_size) l->vocab_size = vocab_size;
    l->max_seq_len = max_seq_len;
    if (!config) return;
    l->tie_word_embeddings = config->tie_word_embeddings;
    l->rope_scaling = config->rope_scaling;
}

static void build(Model *m, const ModelArgs *a, bool activation_checkpoint) {
    llama3_build(m, llama_of(a), activation_checkpoint);
}

static const char *tp_check(const ModelArgs *a, int tp, int B, int T, char *err, size_t len) {
    return llama3_tp_check(llama_of(a), tp, B, T, err, len);
}

static uint64_t tp_bytes_per_microbatch(const ModelArgs *a, int tp, int B, int T,
                                        bool activation_checkpoint, bool loss_parallel,
                                        int first_block, int last_block) {
    return llama3_tp_bytes_per_microbatch(llama_of(a), tp, B, T, activation_checkpoint,
                                          loss_parallel, first_block, last_block);
}

static int describe(const ModelArgs *a, CkptAttr *out) {
    return llama3_describe(llama_of(a), out);
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

static void *kv_cache_new(const Model *m, int max_ctx) {
    LlamaKVCache *c = xmalloc(sizeof *c);
    llama3_kv_cache_init(c, m, max_ctx);
    return c;
}

static const float *decode_step(const Model *m, void *cache, const KernelOps *k, int token,
                                int pos) {
    return llama3_decode_step(m, cache, k, token, pos);
}

static void kv_cache_free(void *cache) {
    llama3_kv_cache_free(cache);
    free(cache);
}

const ModelSpec LLAMA3_SPEC = {
    .name = "llama3",
    .flavor = flavor,
    .flavor_names = llama3_flavor_names,
    .shape = shape,
    .update_from_config = update_from_config,
    .build = build,
    .free = llama3_free,
    .tp_check = tp_check,
    .parallelize_tp = llama3_parallelize_tp,
    .tp_bytes_per_microbatch = tp_bytes_per_microbatch,
    .describe = describe,
    .args_from_checkpoint = args_from_checkpoint,
    .try_args_from_hf = try_args_from_hf,
    .load_hf = load_hf,
    .save_hf = save_hf,
    .args_from_llama2c = args_from_llama2c,
    .load_llama2c = llama3_load_llama2c,
    .kv_cache_new = kv_cache_new,
    .decode_step = decode_step,
    .kv_cache_free = kv_cache_free,
};
