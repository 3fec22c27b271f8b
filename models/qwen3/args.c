#include <string.h>

#include "core/errors.h"
#include "models/qwen3/qwen3.h"

// torchtitan's qwen3 settings every flavor shares (models/qwen3/__init__.py), its init
// torchtitan 0.3.0's: N(0, 0.02) throughout, MoE flavors' residual outputs scaled by depth
// (DECODER_INIT_QWEN3, models/decoder/decoder.h).
static const DecoderArgs DEFAULTS = {
    .qk_norm = true, .norm_eps = 1e-6, .rope_theta = 1e6, .max_seq_len = 40960,
    .init = DECODER_INIT_QWEN3,
};

typedef struct {
    const char *name;
    int dim, n_layers, n_heads, n_kv_heads, head_dim, hidden_dim, vocab_size;
    bool tie_word_embeddings;
    // MoE flavors: every FFN is `experts` routed experts of width moe_hidden, top_k per token
    // (0: dense); their RoPE theta when not the default's.
    int moe_hidden, experts, top_k;
    double rope_theta;
} Flavor;

// torchtitan's qwen3_configs; "small" and "small_moe" are titan's test shapes: heads wider
// than dim / n_heads as every Qwen3's, untied as the larger ones; "debugmodel_moe_dense" is
// titan's too: debugmodel_moe with its top 8 experts' width as one dense FFN (8 x 768), the
// same active parameters per token (scripts/bench_moe.sh compares their throughput).
static const Flavor FLAVORS[] = {
    {"debugmodel", 256, 8, 16, 8, 128, 3072, 2048, true, 0, 0, 0, 0},
    {"small", 64, 2, 4, 2, 32, 192, 2048, false, 0, 0, 0, 0},
    {"0.6B", 1024, 28, 16, 8, 128, 3072, 151936, true, 0, 0, 0, 0},
    {"1.7B", 2048, 28, 16, 8, 128, 6144, 151936, true, 0, 0, 0, 0},
    {"4B", 2560, 36, 32, 8, 128, 9728, 151936, true, 0, 0, 0, 0},
    {"8B", 4096, 36, 32, 8, 128, 12288, 151936, false, 0, 0, 0, 0},
    {"14B", 5120, 40, 40, 8, 128, 17408, 151936, false, 0, 0, 0, 0},
    {"32B", 5120, 64, 64, 8, 128, 25600, 151936, false, 0, 0, 0, 0},
    {"small_moe", 64, 2, 4, 2, 32, 0, 2048, false, 64, 8, 2, 0},
    {"debugmodel_moe", 256, 8, 16, 8, 128, 0, 2048, false, 768, 64, 8, 0},
    {"debugmodel_moe_dense", 256, 8, 16, 8, 128, 6144, 2048, false, 0, 0, 0, 0},
    {"30B-A3B", 2048, 48, 32, 4, 128, 0, 151936, false, 768, 128, 8, 0},
    {"235B-A22B", 4096, 94, 64, 4, 128, 0, 151936, false, 1536, 128, 8, 5e6},
};

// torchtitan's qwen3 MoE layer: softmax scores, the chosen ones normalised (route_norm), no
// shared experts, aux-loss-free balancing at its default 1e-3 (model.moe_* keys override).
static MoeArgs moe_args(const Flavor *f) {
    return (MoeArgs){.dim = f->dim, .hidden = f->moe_hidden, .load_balance_coeff = 1e-3,
                     .router = {.n_experts = f->experts, .top_k = f->top_k,
                                .score_func = MOE_SCORE_SOFTMAX, .route_norm = true,
                                .route_scale = 1.0f}};
}
#define N_FLAVORS (int)(sizeof FLAVORS / sizeof FLAVORS[0])

bool qwen3_flavor(const char *name, Qwen3Args *args) {
    for (int i = 0; i < N_FLAVORS; i++) {
        const Flavor *f = &FLAVORS[i];
        if (strcmp(f->name, name) != 0) continue;
        DecoderArgs *a = &args->decoder;
        *args = (Qwen3Args){.decoder = DEFAULTS};
        a->dim = f->dim;
        a->n_layers = f->n_layers;
        a->n_heads = f->n_heads;
        a->n_kv_heads = f->n_kv_heads;
        a->head_dim = f->head_dim;
        a->hidden_dim = f->hidden_dim;
        a->vocab_size = f->vocab_size;
        a->tie_word_embeddings = f->tie_word_embeddings;
        if (f->experts) a->moe = moe_args(f);
        if (f->rope_theta) a->rope_theta = f->rope_theta;
        if (!strncmp(name, "debugmodel", 10)) a->max_seq_len = 4096;
        return true;
    }
    return false;
}

const char *qwen3_flavor_names(void) {
    static char names[256];
    return decoder_flavor_names(names, sizeof names, &FLAVORS[0].name, sizeof FLAVORS[0],
                                N_FLAVORS);
}

void qwen3_args_from_checkpoint(const char *path, Qwen3Args *args) {
    *args = (Qwen3Args){.decoder = DEFAULTS};
    decoder_args_from_checkpoint(path, &args->decoder);
    if (!args->decoder.qk_norm)
        die_user("checkpoint %s: model.qk_norm is not set; a qwen3 checkpoint records it", path);
}
