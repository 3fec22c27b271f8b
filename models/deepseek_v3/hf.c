// Hugging Face's DeepseekV3ForCausalLM checkpoints (transformers' modeling_deepseek_v3.py;
// torchtitan's DeepSeekV3StateDictAdapter maps the same names): config.json <-> DeepseekV3Args
// through the decoder's shared keys (models/decoder/hf.h) and DeepSeek's own (MLA's widths, the
// MoE layers' routing, YaRN's rope_scaling). Weights under DeepSeek's names, RoPE's interleaved
// pairs as titan's (rope_interleave): no row is permuted. HF's router scores by sigmoid only,
// so a softmax flavor (debugmodel, 16B, 236B) has no HF form; the multi-token prediction
// modules are not exported, as transformers has none.
#include <math.h>
#include <string.h>

#include "core/errors.h"
#include "models/decoder/hf.h"
#include "models/deepseek_v3/deepseek_v3.h"

#define MODEL "DeepSeek-V3"
#define MODEL_TYPE "deepseek_v3"
// DeepseekV3Attention's q_a_layernorm and kv_a_layernorm: its RMSNorm's default, not
// rms_norm_eps (DeepSeek's own code has the same)
#define HF_LATENT_NORM_EPS 1e-6

// rope_scaling: null (no YaRN) or DeepSeek's yarn, whose cos/sin HF leaves unscaled only when
// mscale equals mscale_all_dim (then its softmax scale is torchtitan's mscale correction).
static bool yarn_read(const HfConfig *r, DecoderArgs *a) {
    const json_t *y = json_object_get(r->root, "rope_scaling");
    a->yarn = (YarnArgs){0};
    if (!y || json_is_null(y)) return true;
    const json_t *type = json_object_get(y, "rope_type");
    if (!type) type = json_object_get(y, "type");
    double mscale, mscale_all_dim, original;
    if (!json_is_object(y) || !json_is_string(type) || strcmp(json_string_value(type), "yarn"))
        return error_set(r->err, r->errlen, "%s: rope_scaling is not DeepSeek's yarn; titan's %s "
                         "has YaRN or no scaling", r->path, r->model);
    if (!hf_config_real(r, y, "factor", 0, &a->yarn.factor) ||
        !hf_config_real(r, y, "beta_fast", 32, &a->yarn.beta_fast) ||
        !hf_config_real(r, y, "beta_slow", 1, &a->yarn.beta_slow) ||
        !hf_config_real(r, y, "original_max_position_embeddings", 4096, &original) ||
        !hf_config_real(r, y, "mscale", 1, &mscale) ||
        !hf_config_real(r, y, "mscale_all_dim", mscale, &mscale_all_dim))
        return false;
    if (mscale != mscale_all_dim || original > HF_MAX_POSITIONS || original != floor(original))
        return error_set(r->err, r->errlen, "%s: rope_scaling's mscale %g and mscale_all_dim %g "
                         "differ, or original_max_position_embeddings %g is not a position "
                         "count; titan's %s scales the softmax alone", r->path, mscale,
                         mscale_all_dim, original, r->model);
    a->yarn.original_seq_len = (int)original;
    a->mla.mscale = mscale_all_dim;
    return true;
}

static bool mla_read(const HfConfig *r, DecoderArgs *a) {
    MlaArgs *m = &a->mla;
    bool interleave;
    if (!hf_config_int(r, "q_lora_rank", 0, HF_MAX_FFN, 0, &m->q_lora_rank) ||
        !hf_config_int(r, "kv_lora_rank", 1, HF_MAX_FFN, 512, &m->kv_lora_rank) ||
        !hf_config_int(r, "qk_nope_head_dim", 0, HF_MAX_HEAD_DIM, 128, &m->qk_nope_head_dim) ||
        !hf_config_int(r, "qk_rope_head_dim", 1, HF_MAX_HEAD_DIM, 64, &m->qk_rope_head_dim) ||
        !hf_config_int(r, "v_head_dim", 1, HF_MAX_HEAD_DIM, 128, &m->v_head_dim) ||
        !hf_config_bool(r, "rope_interleave", true, &interleave))
        return false;
    if (!interleave)
        return error_set(r->err, r->errlen, "%s: rope_interleave is false; titan's %s rotates "
                         "interleaved pairs", r->path, r->model);
    a->n_kv_heads = a->n_heads;  // MLA's k and v are per head
    m->norm_eps = HF_LATENT_NORM_EPS;
    return true;
}

static bool moe_read(const HfConfig *r, DecoderArgs *a) {
    MoeArgs *m = &a->moe;
    int shared, groups, limited;
    double scale;
    if (!hf_config_int(r, "n_routed_experts", 1, HF_MAX_EXPERTS, 256, &m->router.n_experts) ||
        !hf_config_int(r, "num_experts_per_tok", 1, m->router.n_experts, 8, &m->router.top_k) ||
        !hf_config_int(r, "moe_intermediate_size", 1, HF_MAX_FFN, 2048, &m->hidden) ||
        !hf_config_int(r, "n_shared_experts", 0, HF_MAX_EXPERTS, 1, &shared) ||
        !hf_config_int(r, "n_group", 1, HF_MAX_EXPERTS, 8, &groups) ||
        !hf_config_int(r, "topk_group", 1, HF_MAX_EXPERTS, 4, &limited) ||
        !hf_config_int(r, "first_k_dense_replace", 0, a->n_layers - 1, 3, &a->n_dense_layers) ||
        !hf_config_bool(r, "norm_topk_prob", true, &m->router.route_norm) ||
        !hf_config_real(r, r->root, "routed_scaling_factor", 2.5, &scale) ||
        !hf_config_expect(r, "scoring_func", "sigmoid") ||
        !hf_config_expect(r, "topk_method", "noaux_tc"))
        return false;
    if ((int64_t)m->hidden * shared > HF_MAX_FFN)
        return error_set(r->err, r->errlen, "%s: n_shared_experts %d x moe_intermediate_size %d "
                         "is more than %d", r->path, shared, m->hidden, HF_MAX_FFN);
    m->dim = a->dim;
    m->shared_hidden = m->hidden * shared;
    m->router.score_func = MOE_SCORE_SIGMOID;
    m->router.route_scale = (float)scale;
    m->router.n_groups = groups > 1 ? groups : 0;
    m->router.limited_groups = groups > 1 ? limited : 0;
    return true;
}

// Whether the weights in dir hold MTP module 1 as DeepSeek's release does (layer n_layers):
// a transformers save keeps num_nextn_predict_layers in config.json but drops the layers.
static bool weights_hold_mtp(const char *dir, const DecoderArgs *a) {
    Safetensors st;
    char err[1024], name[64];
    if (!safetensors_try_open(dir, &st, err, sizeof err)) return false;
    snprintf(name, sizeof name, "model.layers.%d.eh_proj.weight", a->n_layers);
    bool found = safetensors_find(&st, name) != NULL;
    safetensors_close(&st);
    return found;
}

bool deepseek_v3_try_args_from_hf(const char *dir, DeepseekV3Args *args, char *err,
                                  size_t errlen) {
    char path[4096];
    json_t *root;
    if (!hf_config_load(dir, &root, path, sizeof path, err, errlen)) return false;
    // torchtitan's for what HF does not say (init, the MoE layers' balancing)
    CHECK(deepseek_v3_flavor("671B", args));
    DecoderArgs *a = &args->decoder;
    HfConfig r = {path, MODEL, root, err, errlen};
    char why[256];
    // DeepseekV3Config's max_position_embeddings default: 4096; its head_dim is the RoPE width
    bool ok = decoder_hf_config_read(&r, a, MODEL_TYPE, true, 4096) && mla_read(&r, a) &&
              moe_read(&r, a) && yarn_read(&r, a);
    if (ok && !decoder_args_check(a, why, sizeof why))
        ok = error_set(err, errlen, "%s: %s", path, why);
    if (ok && a->tie_word_embeddings)
        ok = error_set(err, errlen, "%s: tie_word_embeddings is true; titan's %s has its own "
                       "output projection", path, MODEL);
    int mtp = 0;  // the MTP modules, where the weights hold them
    ok = ok && hf_config_int(&r, "num_nextn_predict_layers", 0, DECODER_MAX_MTP, 0, &mtp);
    a->mtp_layers = ok && mtp && weights_hold_mtp(dir, a) ? mtp : 0;
    a->head_dim = 0;  // MLA's q and k heads are qk_nope + qk_rope wide
    json_decref(root);
    return ok;
}

void deepseek_v3_load_hf(const char *path, const DeepseekV3Args *args, ParamTable *params) {
    char err[1024];
    if (!decoder_try_load_hf(path, &args->decoder, MODEL, params, err, sizeof err))
        die_user("%s", err);
}

static json_t *yarn_json(const DecoderArgs *a) {
    if (a->yarn.factor <= 1) return json_null();
    json_t *y = json_pack("{s:s, s:f, s:f, s:f, s:i, s:f, s:f}", "type", "yarn", "factor",
                          a->yarn.factor, "beta_fast", a->yarn.beta_fast, "beta_slow",
                          a->yarn.beta_slow, "original_max_position_embeddings",
                          a->yarn.original_seq_len, "mscale", a->mla.mscale, "mscale_all_dim",
                          a->mla.mscale);
    CHECK(y != NULL);
    return y;
}

void deepseek_v3_save_hf(const char *dir, const DeepseekV3Args *args, const ParamTable *params,
                         HfExport how) {
    const DecoderArgs *a = &args->decoder;
    const MoeArgs *m = &a->moe;
    if (m->router.score_func != MOE_SCORE_SIGMOID || m->shared_hidden % m->hidden != 0)
        die_user("%s: DeepseekV3ForCausalLM's router scores by sigmoid, with shared experts "
                 "as wide as a routed one; this model's MoE layers do not (a softmax flavor: "
                 "debugmodel, 16B, 236B)", dir);
    if (a->mla.norm_eps != HF_LATENT_NORM_EPS)
        log_warn("Hugging Face export: DeepseekV3ForCausalLM norms the MLA latents with eps %g, "
                 "this model with %g (torchtitan's flavors: every norm's): its logits differ "
                 "slightly (1e-5 relative at the debug shapes)", HF_LATENT_NORM_EPS,
                 a->mla.norm_eps);
    decoder_save_hf_weights(dir, a, params, how);
    json_t *c = decoder_hf_config_json(a, "DeepseekV3ForCausalLM", MODEL_TYPE, how.dtype);
    // HF recomputes YaRN's factor as max_position_embeddings / original (DeepSeek-V3: 163840)
    int positions = a->yarn.factor > 1 ? (int)lround(a->yarn.factor * a->yarn.original_seq_len)
                                       : a->max_seq_len;
    json_t *q_lora = a->mla.q_lora_rank ? json_integer(a->mla.q_lora_rank) : json_null();
    bool grouped = m->router.n_groups > 1;
    CHECK(json_object_set_new(c, "head_dim", json_integer(a->mla.qk_rope_head_dim)) == 0 &&
          json_object_set_new(c, "max_position_embeddings", json_integer(positions)) == 0 &&
          json_object_set_new(c, "q_lora_rank", q_lora) == 0 &&
          json_object_set_new(c, "kv_lora_rank", json_integer(a->mla.kv_lora_rank)) == 0 &&
          json_object_set_new(c, "qk_nope_head_dim", json_integer(a->mla.qk_nope_head_dim)) == 0 &&
          json_object_set_new(c, "qk_rope_head_dim", json_integer(a->mla.qk_rope_head_dim)) == 0 &&
          json_object_set_new(c, "v_head_dim", json_integer(a->mla.v_head_dim)) == 0 &&
          json_object_set_new(c, "rope_interleave", json_true()) == 0 &&
          json_object_set_new(c, "rope_scaling", yarn_json(a)) == 0 &&
          json_object_set_new(c, "n_routed_experts", json_integer(m->router.n_experts)) == 0 &&
          json_object_set_new(c, "num_experts_per_tok", json_integer(m->router.top_k)) == 0 &&
          json_object_set_new(c, "moe_intermediate_size", json_integer(m->hidden)) == 0 &&
          json_object_set_new(c, "n_shared_experts",
                              json_integer(m->shared_hidden / m->hidden)) == 0 &&
          json_object_set_new(c, "routed_scaling_factor", json_real(m->router.route_scale)) == 0 &&
          json_object_set_new(c, "n_group", json_integer(grouped ? m->router.n_groups : 1)) == 0 &&
          json_object_set_new(c, "topk_group",
                              json_integer(grouped ? m->router.limited_groups : 1)) == 0 &&
          json_object_set_new(c, "norm_topk_prob", json_boolean(m->router.route_norm)) == 0 &&
          json_object_set_new(c, "first_k_dense_replace", json_integer(a->n_dense_layers)) == 0 &&
          json_object_set_new(c, "num_nextn_predict_layers",
                              json_integer(how.mtp ? a->mtp_layers : 0)) == 0);
    hf_config_write(dir, c);
}
