#include <string.h>

#include "core/errors.h"
#include "models/deepseek_v3/deepseek_v3.h"

// What every flavor shares (torchtitan's deepseek_v3/__init__.py): RoPE theta 1e4 with YaRN
// (factor 40 over 4096 positions, beta 32 and 1), RMSNorm's eps 1e-5, llama3's init with depth
// scaling (_LINEAR_INIT, _depth_init, _depth_experts_init: DECODER_INIT_LLAMA3), untied output;
// no MTP modules (model.mtp_layers adds them), their loss weighing MTPLoss's 0.3.
static const DecoderArgs DEFAULTS = {
    .norm_eps = 1e-5, .rope_theta = 1e4, .max_seq_len = 4096 * 4, .init = DECODER_INIT_LLAMA3,
    .depth_init = true, .mtp_loss_weight = 0.3,
    .yarn = {.factor = 40, .beta_fast = 32, .beta_slow = 1, .original_seq_len = 4096},
};

typedef struct {
    const char *name;
    int dim, n_layers, n_heads, vocab_size, hidden_dim, n_dense_layers;
    int q_lora_rank;
    double mscale;
    // the MoE layers: experts of moe_hidden, shared experts (of moe_hidden each), top_k
    int moe_hidden, experts, shared, top_k;
    bool sigmoid, route_norm;
    int n_groups, limited_groups;
    double route_scale;
} Flavor;

// torchtitan's deepseekv3_configs (every one: kv_lora_rank 512, qk_nope_head_dim 128,
// qk_rope_head_dim 64, v_head_dim 128); "kimi_k2" is Moonshot's Kimi-K2 (its config.json:
// 64 heads, 384 experts, RoPE theta 5e4 and YaRN factor 32 with beta_fast 1, set below);
// "small" is titan's test shape with 671B's every feature (a q_lora_rank, sigmoid scores,
// route norm and scale, expert groups, dense first layer) at a tiny width, MLA's widths set
// below.
static const Flavor FLAVORS[] = {
    {"small", 64, 3, 4, 2048, 128, 1, 32, 1.0, 32, 8, 1, 2, true, true, 4, 2, 2.5},
    {"debugmodel", 256, 6, 16, 2048, 1024, 1, 0, 0.70, 256, 8, 2, 3, false, false, 0, 0, 1.0},
    {"16B", 2048, 27, 16, 102400, 10944, 1, 0, 0.70, 1408, 64, 2, 6, false, false, 0, 0, 1.0},
    {"236B", 5120, 60, 128, 102400, 12288, 1, 1536, 1.0, 1536, 160, 2, 6, false, false, 8, 3,
     16.0},
    {"671B", 7168, 61, 128, 129280, 18432, 3, 1536, 1.0, 2048, 256, 1, 8, true, true, 8, 4, 2.5},
    {"kimi_k2", 7168, 61, 64, 163840, 18432, 1, 1536, 1.0, 2048, 384, 1, 8, true, true, 1, 1,
     2.827},
};
#define N_FLAVORS (int)(sizeof FLAVORS / sizeof FLAVORS[0])

// torchtitan's MoE layer as its deepseek_v3 flavors build it: aux-loss-free balancing at its
// default 1e-3 (model.moe_* keys override).
static MoeArgs moe_args(const Flavor *f) {
    return (MoeArgs){
        .dim = f->dim, .hidden = f->moe_hidden, .shared_hidden = f->moe_hidden * f->shared,
        .load_balance_coeff = 1e-3,
        .router = {.n_experts = f->experts, .top_k = f->top_k,
                   .score_func = f->sigmoid ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX,
                   .route_norm = f->route_norm, .route_scale = (float)f->route_scale,
                   .n_groups = f->n_groups, .limited_groups = f->limited_groups}};
}

bool deepseek_v3_flavor(const char *name, DeepseekV3Args *args) {
    for (int i = 0; i < N_FLAVORS; i++) {
        const Flavor *f = &FLAVORS[i];
        if (strcmp(f->name, name) != 0) continue;
        *args = (DeepseekV3Args){.decoder = DEFAULTS};
        DecoderArgs *a = &args->decoder;
        a->dim = f->dim;
        a->n_layers = f->n_layers;
        a->n_heads = a->n_kv_heads = f->n_heads;
        a->vocab_size = f->vocab_size;
        a->hidden_dim = f->hidden_dim;
        a->n_dense_layers = f->n_dense_layers;
        a->mla = (MlaArgs){.q_lora_rank = f->q_lora_rank, .kv_lora_rank = 512,
                           .qk_nope_head_dim = 128, .qk_rope_head_dim = 64, .v_head_dim = 128,
                           .mscale = f->mscale, .norm_eps = a->norm_eps};
        a->moe = moe_args(f);
        if (!strcmp(name, "small"))
            a->mla = (MlaArgs){.q_lora_rank = 32, .kv_lora_rank = 32, .qk_nope_head_dim = 16,
                               .qk_rope_head_dim = 16, .v_head_dim = 24, .mscale = 1.0,
                               .norm_eps = a->norm_eps};
        if (!strcmp(name, "kimi_k2")) {
            a->rope_theta = 5e4;
            a->yarn.factor = 32;
            a->yarn.beta_fast = 1;
        }
        return true;
    }
    return false;
}

const char *deepseek_v3_flavor_names(void) {
    static char names[128];
    return decoder_flavor_names(names, sizeof names, &FLAVORS[0].name, sizeof FLAVORS[0],
                                N_FLAVORS);
}

void deepseek_v3_args_from_checkpoint(const char *path, DeepseekV3Args *args) {
    *args = (DeepseekV3Args){.decoder = DEFAULTS};
    args->decoder.yarn = (YarnArgs){0};  // the file says whether it has YaRN
    decoder_args_from_checkpoint(path, &args->decoder);
    if (!decoder_has_mla(&args->decoder))
        die_user("checkpoint %s: model.mla_kv_lora_rank is not set; a deepseek_v3 checkpoint "
                 "records its multi-head latent attention", path);
}
