// What every decoder's args derive (the FFN width), list (flavor names) and record in a
// checkpoint.
#include <stdio.h>
#include <string.h>

#include "core/errors.h"
#include "models/decoder/decoder.h"

// torchtitan's FeedForward sizing: 2/3 of 4*dim (SwiGLU keeps the FLOPs of a 4*dim GELU MLP),
// times the optional multiplier, rounded up to multiple_of. MoE layers have no dense FFN: 0.
int decoder_hidden_dim(const DecoderArgs *a) {
    if (decoder_has_moe(a)) return 0;
    if (a->hidden_dim > 0) return a->hidden_dim;
    int hidden = 4 * a->dim;
    hidden = (int)(2 * hidden / 3);
    if (a->ffn_dim_multiplier > 0) hidden = (int)(a->ffn_dim_multiplier * hidden);
    return a->multiple_of * ((hidden + a->multiple_of - 1) / a->multiple_of);
}

const char *decoder_flavor_names(char *out, size_t len, const char *const *names, size_t stride,
                                 int n) {
    if (!out[0])
        for (int i = 0; i < n; i++) {
            const char *name = *(const char *const *)((const char *)names + (size_t)i * stride);
            snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? ", " : "", name);
        }
    return out;
}

// A head width other than Llama 3's dim / n_heads.
static bool head_dim_own(const DecoderArgs *a) {
    return a->head_dim && a->head_dim * a->n_heads != a->dim;
}

int decoder_describe(const DecoderArgs *a, CkptAttr out[DECODER_MAX_ATTRS]) {
    int n = 0;
#define INT_ATTR(key, value) out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_INT, .i = (value)}
#define REAL_ATTR(key, value) out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_DOUBLE, .d = (value)}
    INT_ATTR("dim", a->dim);
    INT_ATTR("n_layers", a->n_layers);
    INT_ATTR("n_heads", a->n_heads);
    INT_ATTR("n_kv_heads", a->n_kv_heads);
    INT_ATTR("vocab_size", a->vocab_size);
    if (!decoder_has_moe(a)) INT_ATTR("hidden_dim", decoder_hidden_dim(a));
    REAL_ATTR("norm_eps", a->norm_eps);
    REAL_ATTR("rope_theta", a->rope_theta);
    INT_ATTR("rope_scaling", a->rope_scaling);
    REAL_ATTR("rope_scaling_factor", a->rope_scaling_factor);
    REAL_ATTR("rope_low_freq_factor", a->rope_low_freq_factor);
    REAL_ATTR("rope_high_freq_factor", a->rope_high_freq_factor);
    INT_ATTR("rope_original_max_pos", a->rope_original_max_pos);
    INT_ATTR("tie_word_embeddings", a->tie_word_embeddings);
    if (head_dim_own(a)) INT_ATTR("head_dim", a->head_dim);
    if (a->qk_norm) INT_ATTR("qk_norm", 1);
    if (decoder_has_moe(a)) {
        const MoeArgs *m = &a->moe;
        INT_ATTR("moe_experts", m->router.n_experts);
        INT_ATTR("moe_top_k", m->router.top_k);
        INT_ATTR("moe_hidden_dim", m->hidden);
        INT_ATTR("moe_shared_hidden_dim", m->shared_hidden);
        INT_ATTR("moe_score_sigmoid", m->router.score_func == MOE_SCORE_SIGMOID);
        INT_ATTR("moe_route_norm", m->router.route_norm);
        REAL_ATTR("moe_route_scale", m->router.route_scale);
        INT_ATTR("moe_expert_bias", m->load_balance_coeff > 0);
    }
#undef INT_ATTR
#undef REAL_ATTR
    return n;
}

// A shape attribute: a checkpoint is user input, so a size outside an int (or below 1) is
// refused naming the attribute rather than truncated.
static int shape_attr(const char *path, const char *attr) {
    return (int)ckpt_read_int_in(path, attr, 1, INT32_MAX);
}

// The MoE layers' architecture (their training settings are the run's config): the expert
// bias is a tensor of the file, so its presence is part of the shape.
static void moe_args_from_checkpoint(const char *path, DecoderArgs *a) {
    MoeArgs *m = &a->moe;
    m->dim = a->dim;
    m->router.n_experts = shape_attr(path, "model.moe_experts");
    m->router.top_k = (int)ckpt_read_int_in(path, "model.moe_top_k", 1, m->router.n_experts);
    m->hidden = shape_attr(path, "model.moe_hidden_dim");
    m->shared_hidden = (int)ckpt_read_int_in(path, "model.moe_shared_hidden_dim", 0, INT32_MAX);
    bool sigmoid = ckpt_read_int_in(path, "model.moe_score_sigmoid", 0, 1) != 0;
    m->router.score_func = sigmoid ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
    m->router.route_norm = ckpt_read_int_in(path, "model.moe_route_norm", 0, 1) != 0;
    m->router.route_scale = (float)ckpt_read_double(path, "model.moe_route_scale");
    bool bias = ckpt_read_int_in(path, "model.moe_expert_bias", 0, 1) != 0;
    m->load_balance_coeff = bias ? 1e-3 : 0;
}

void decoder_args_from_checkpoint(const char *path, DecoderArgs *a) {
    a->dim = shape_attr(path, "model.dim");
    a->n_layers = shape_attr(path, "model.n_layers");
    a->n_heads = shape_attr(path, "model.n_heads");
    a->n_kv_heads = shape_attr(path, "model.n_kv_heads");
    a->vocab_size = shape_attr(path, "model.vocab_size");
    if (ckpt_has_attr(path, "model.moe_experts"))
        moe_args_from_checkpoint(path, a);
    else
        a->hidden_dim = shape_attr(path, "model.hidden_dim");
    a->norm_eps = ckpt_read_double(path, "model.norm_eps");
    a->rope_theta = ckpt_read_double(path, "model.rope_theta");
    a->rope_scaling = ckpt_read_int_in(path, "model.rope_scaling", 0, 1) != 0;
    if (a->rope_scaling) {  // else the factors are unused (Qwen3 records zeros)
        a->rope_scaling_factor = ckpt_read_double(path, "model.rope_scaling_factor");
        a->rope_low_freq_factor = ckpt_read_double(path, "model.rope_low_freq_factor");
        a->rope_high_freq_factor = ckpt_read_double(path, "model.rope_high_freq_factor");
        a->rope_original_max_pos = shape_attr(path, "model.rope_original_max_pos");
    }
    a->tie_word_embeddings = ckpt_read_int_in(path, "model.tie_word_embeddings", 0, 1) != 0;
    a->head_dim = ckpt_has_attr(path, "model.head_dim") ? shape_attr(path, "model.head_dim") : 0;
    a->qk_norm = ckpt_has_attr(path, "model.qk_norm") &&
                 ckpt_read_int_in(path, "model.qk_norm", 0, 1) != 0;
    if ((!a->head_dim && a->dim % a->n_heads != 0) || a->n_heads % a->n_kv_heads != 0 ||
        decoder_head_dim(a) % 2 != 0)
        die_user("checkpoint %s: model.dim %d, n_heads %d, n_kv_heads %d and head_dim %d do not "
                 "make even heads", path, a->dim, a->n_heads, a->n_kv_heads, decoder_head_dim(a));
}
