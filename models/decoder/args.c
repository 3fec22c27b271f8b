// What every decoder's args derive (the FFN width), list (flavor names) and record in a
// checkpoint.
#include <stdio.h>
#include <string.h>

#include "core/errors.h"
#include "models/decoder/decoder.h"

// torchtitan's FeedForward sizing: 2/3 of 4*dim (SwiGLU keeps the FLOPs of a 4*dim GELU MLP),
// times the optional multiplier, rounded up to multiple_of. MoE layers have no dense FFN: 0.
int decoder_hidden_dim(const DecoderArgs *a) {
    if (decoder_has_moe(a) && a->n_dense_layers == 0) return 0;
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
    if (decoder_hidden_dim(a)) INT_ATTR("hidden_dim", decoder_hidden_dim(a));  // dense layers
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
        if (a->n_dense_layers) INT_ATTR("n_dense_layers", a->n_dense_layers);
        if (m->router.n_groups > 1) {
            INT_ATTR("moe_n_groups", m->router.n_groups);
            INT_ATTR("moe_limited_groups", m->router.limited_groups);
        }
    }
    if (decoder_has_mla(a)) {
        const MlaArgs *m = &a->mla;
        INT_ATTR("mla_q_lora_rank", m->q_lora_rank);
        INT_ATTR("mla_kv_lora_rank", m->kv_lora_rank);
        INT_ATTR("mla_qk_nope_head_dim", m->qk_nope_head_dim);
        INT_ATTR("mla_qk_rope_head_dim", m->qk_rope_head_dim);
        INT_ATTR("mla_v_head_dim", m->v_head_dim);
        REAL_ATTR("mla_mscale", m->mscale);
        REAL_ATTR("mla_norm_eps", m->norm_eps);
    }
    if (a->mtp_layers) INT_ATTR("mtp_layers", a->mtp_layers);
    if (a->yarn.factor > 1) {
        REAL_ATTR("yarn_factor", a->yarn.factor);
        REAL_ATTR("yarn_beta_fast", a->yarn.beta_fast);
        REAL_ATTR("yarn_beta_slow", a->yarn.beta_slow);
        INT_ATTR("yarn_original_seq_len", a->yarn.original_seq_len);
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
    if (ckpt_has_attr(path, "model.n_dense_layers"))
        a->n_dense_layers = (int)ckpt_read_int_in(path, "model.n_dense_layers", 0, INT32_MAX);
    if (ckpt_has_attr(path, "model.moe_n_groups")) {
        m->router.n_groups = shape_attr(path, "model.moe_n_groups");
        m->router.limited_groups = shape_attr(path, "model.moe_limited_groups");
    }
}

static void mla_args_from_checkpoint(const char *path, DecoderArgs *a) {
    MlaArgs *m = &a->mla;
    m->q_lora_rank = (int)ckpt_read_int_in(path, "model.mla_q_lora_rank", 0, INT32_MAX);
    m->kv_lora_rank = shape_attr(path, "model.mla_kv_lora_rank");
    m->qk_nope_head_dim = (int)ckpt_read_int_in(path, "model.mla_qk_nope_head_dim", 0, INT32_MAX);
    m->qk_rope_head_dim = shape_attr(path, "model.mla_qk_rope_head_dim");
    m->v_head_dim = shape_attr(path, "model.mla_v_head_dim");
    m->mscale = ckpt_read_double(path, "model.mla_mscale");
    m->norm_eps = ckpt_has_attr(path, "model.mla_norm_eps")  // else every norm's (the flavors')
                      ? ckpt_read_double(path, "model.mla_norm_eps")
                      : a->norm_eps;
}

static void yarn_args_from_checkpoint(const char *path, DecoderArgs *a) {
    YarnArgs *y = &a->yarn;
    y->factor = ckpt_read_double(path, "model.yarn_factor");
    y->beta_fast = ckpt_read_double(path, "model.yarn_beta_fast");
    y->beta_slow = ckpt_read_double(path, "model.yarn_beta_slow");
    y->original_seq_len = shape_attr(path, "model.yarn_original_seq_len");
}

// An int of at most 2^31 - 1 that is a positive multiple of `of`.
static bool multiple(int64_t n, int64_t of) { return n > 0 && of > 0 && n % of == 0; }

bool decoder_args_check(const DecoderArgs *a, char *err, size_t len) {
    if (a->n_heads < 1 || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads != 0)
        return error_set(err, len, "n_heads %d is not a multiple of n_kv_heads %d", a->n_heads,
                         a->n_kv_heads);
    if (!decoder_has_mla(a) && !a->head_dim && !multiple(a->dim, a->n_heads))
        return error_set(err, len, "dim %d is not a multiple of n_heads %d", a->dim, a->n_heads);
    if (decoder_has_mla(a)) {
        const MlaArgs *m = &a->mla;
        if (m->qk_nope_head_dim < 0 || m->v_head_dim < 1 || m->q_lora_rank < 0)
            return error_set(err, len, "MLA's qk_nope_head_dim %d, v_head_dim %d and q_lora_rank "
                             "%d must be >= 0, >= 1 and >= 0", m->qk_nope_head_dim,
                             m->v_head_dim, m->q_lora_rank);
        if (m->v_head_dim > decoder_head_dim(a))  // the values are padded to q and k's width
            return error_set(err, len, "MLA's v_head_dim %d is wider than its q and k heads "
                             "(qk_nope_head_dim + qk_rope_head_dim = %d)", m->v_head_dim,
                             decoder_head_dim(a));
    }
    int rope = decoder_rope_dim(a);
    if (!multiple(rope, 2))
        return error_set(err, len, "the RoPE width %d (%s) is not a positive even number: "
                         "RoPE rotates pairs", rope,
                         decoder_has_mla(a) ? "qk_rope_head_dim" : "head_dim");
    if (a->yarn.factor > 1 && (a->yarn.beta_fast <= 0 || a->yarn.beta_slow <= 0 ||
                               a->yarn.original_seq_len < 1))
        return error_set(err, len, "YaRN's beta_fast %g, beta_slow %g and original_seq_len %d "
                         "must be positive", a->yarn.beta_fast, a->yarn.beta_slow,
                         a->yarn.original_seq_len);
    if (!decoder_has_moe(a)) return true;
    const MoeRouter *r = &a->moe.router;
    if (a->n_dense_layers < 0 || a->n_dense_layers >= a->n_layers)
        return error_set(err, len, "n_dense_layers %d leaves no MoE layer of %d", a->n_dense_layers,
                         a->n_layers);
    if (r->top_k < 1 || r->top_k > r->n_experts)
        return error_set(err, len, "top_k %d of %d experts", r->top_k, r->n_experts);
    if (r->n_groups <= 1) return true;
    if (r->n_experts % r->n_groups != 0 || r->n_experts / r->n_groups < 2)
        return error_set(err, len, "n_group %d does not divide the %d experts into groups of "
                         "2 or more (a group's score is its top two)", r->n_groups, r->n_experts);
    if (r->limited_groups < 1 || r->limited_groups > r->n_groups)
        return error_set(err, len, "topk_group %d is not between 1 and n_group %d",
                         r->limited_groups, r->n_groups);
    if (r->top_k > r->limited_groups * (r->n_experts / r->n_groups))
        return error_set(err, len, "top_k %d is more than the %d experts of topk_group %d groups",
                         r->top_k, r->limited_groups * (r->n_experts / r->n_groups),
                         r->limited_groups);
    return true;
}

void decoder_args_from_checkpoint(const char *path, DecoderArgs *a) {
    a->dim = shape_attr(path, "model.dim");
    a->n_layers = shape_attr(path, "model.n_layers");
    a->n_heads = shape_attr(path, "model.n_heads");
    a->n_kv_heads = shape_attr(path, "model.n_kv_heads");
    a->vocab_size = shape_attr(path, "model.vocab_size");
    bool moe = ckpt_has_attr(path, "model.moe_experts");
    if (moe) moe_args_from_checkpoint(path, a);
    if (!moe || a->n_dense_layers) a->hidden_dim = shape_attr(path, "model.hidden_dim");
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
    if (ckpt_has_attr(path, "model.mla_kv_lora_rank")) mla_args_from_checkpoint(path, a);
    if (ckpt_has_attr(path, "model.yarn_factor")) yarn_args_from_checkpoint(path, a);
    if (ckpt_has_attr(path, "model.mtp_layers"))
        a->mtp_layers = (int)ckpt_read_int_in(path, "model.mtp_layers", 0, DECODER_MAX_MTP);
    char err[256];
    if (!decoder_args_check(a, err, sizeof err)) die_user("checkpoint %s: model.*: %s", path, err);
}
