// Hugging Face's Qwen3ForCausalLM and Qwen3MoeForCausalLM checkpoints (transformers'
// modeling_qwen3.py and modeling_qwen3_moe.py; torchtitan's Qwen3StateDictAdapter maps the same
// names): config.json <-> Qwen3Args through the decoder's shared keys (models/decoder/hf.h),
// with Qwen3's own: head_dim of its own width, the sliding-window attention and rope_scaling
// titan's Qwen3 does not have, and model_type qwen3_moe's experts (every layer's FFN the MoE
// layer: a softmax router whose top k scores are renormalised when norm_topk_prob).
#include <string.h>

#include "core/errors.h"
#include "models/decoder/hf.h"
#include "models/qwen3/qwen3.h"

#define MODEL "Qwen3"

#define MOE_TYPE "qwen3_moe"

// Qwen3MoeConfig's keys over debugmodel_moe's router (softmax, unscaled, no shared experts),
// missing ones at transformers' defaults; layers without experts (decoder_sparse_step,
// mlp_only_layers) are refused.
static bool moe_config_read(const HfConfig *r, DecoderArgs *a) {
    MoeArgs *m = &a->moe;
    int sparse_step;
    const json_t *dense = json_object_get(r->root, "mlp_only_layers");
    if (!hf_config_int(r, "num_experts", 1, HF_MAX_EXPERTS, 128, &m->router.n_experts) ||
        !hf_config_int(r, "num_experts_per_tok", 1, m->router.n_experts, 8, &m->router.top_k) ||
        !hf_config_int(r, "moe_intermediate_size", 1, HF_MAX_FFN, 768, &m->hidden) ||
        !hf_config_bool(r, "norm_topk_prob", false, &m->router.route_norm) ||
        !hf_config_int(r, "decoder_sparse_step", 1, INT32_MAX, 1, &sparse_step))
        return false;
    if (dense && !json_is_null(dense) && !json_is_array(dense))
        return error_set(r->err, r->errlen, "%s: mlp_only_layers must be a list", r->path);
    if (sparse_step != 1 || json_array_size(dense) > 0)
        return error_set(r->err, r->errlen, "%s: decoder_sparse_step %d, mlp_only_layers of %zu "
                         "layers: titan's Qwen3-MoE has experts in every layer", r->path,
                         sparse_step, json_array_size(dense));
    m->dim = a->dim;
    return true;
}

static bool config_read(const HfConfig *r, DecoderArgs *a, bool moe) {
    const json_t *scaling = json_object_get(r->root, "rope_scaling");
    // Qwen3Config's and Qwen3MoeConfig's max_position_embeddings default: 32768
    if (!decoder_hf_config_read(r, a, moe ? MOE_TYPE : "qwen3", true, 32768) ||
        (moe && !moe_config_read(r, a)) ||
        !hf_config_refuse(r, "use_sliding_window", "titan's Qwen3 attends to every position"))
        return false;
    if (scaling && !json_is_null(scaling))
        return error_set(r->err, r->errlen, "%s: rope_scaling is set; titan's Qwen3 has plain "
                         "RoPE", r->path);
    return true;
}

bool qwen3_try_args_from_hf(const char *dir, Qwen3Args *args, char *err, size_t errlen) {
    char path[4096];
    json_t *root;
    if (!hf_config_load(dir, &root, path, sizeof path, err, errlen)) return false;
    const char *type = json_string_value(json_object_get(root, "model_type"));
    bool moe = type && !strcmp(type, MOE_TYPE);
    // torchtitan's for what HF does not say (init, the MoE layers' balancing)
    CHECK(qwen3_flavor(moe ? "debugmodel_moe" : "debugmodel", args));
    HfConfig r = {path, moe ? MODEL "-MoE" : MODEL, root, err, errlen};
    bool ok = config_read(&r, &args->decoder, moe);
    json_decref(root);
    return ok;
}

void qwen3_load_hf(const char *path, const Qwen3Args *args, ParamTable *params) {
    char err[1024];
    const char *model = decoder_has_moe(&args->decoder) ? MODEL "-MoE" : MODEL;
    if (!decoder_try_load_hf(path, &args->decoder, model, params, err, sizeof err))
        die_user("%s", err);
}

// Qwen3MoeForCausalLM's routing is what qwen3's flavors have; a checkpoint whose MoE layers
// route otherwise (model.moe_* attributes) has no Hugging Face equivalent.
static void moe_check_exportable(const char *dir, const MoeArgs *m) {
    if (m->router.score_func != MOE_SCORE_SOFTMAX || m->router.route_scale != 1.0f ||
        m->shared_hidden > 0 || m->router.n_groups > 1)
        die_user("%s: Qwen3MoeForCausalLM routes by softmax scores, unscaled, without shared "
                 "experts or expert groups; this model's MoE layers do not", dir);
}

// intermediate_size, unused with experts in every layer, is the active experts' width, as
// Qwen's own configs have it (8 x 768 = 6144 for 30B-A3B).
static void moe_config_write(json_t *c, const MoeArgs *m) {
    json_t *dense = json_array();
    CHECK(dense != NULL &&
          json_object_set_new(c, "num_experts", json_integer(m->router.n_experts)) == 0 &&
          json_object_set_new(c, "num_experts_per_tok", json_integer(m->router.top_k)) == 0 &&
          json_object_set_new(c, "moe_intermediate_size", json_integer(m->hidden)) == 0 &&
          json_object_set_new(c, "intermediate_size",
                              json_integer((json_int_t)m->router.top_k * m->hidden)) == 0 &&
          json_object_set_new(c, "norm_topk_prob", json_boolean(m->router.route_norm)) == 0 &&
          json_object_set_new(c, "decoder_sparse_step", json_integer(1)) == 0 &&
          json_object_set_new(c, "mlp_only_layers", dense) == 0 &&
          json_object_set_new(c, "output_router_logits", json_false()) == 0);
}

void qwen3_save_hf(const char *dir, const Qwen3Args *args, const ParamTable *params,
                   HfExport how) {
    const DecoderArgs *a = &args->decoder;
    bool moe = decoder_has_moe(a);
    if (moe) moe_check_exportable(dir, &a->moe);
    decoder_save_hf_weights(dir, a, params, how);
    json_t *c = decoder_hf_config_json(a, moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM",
                                       moe ? MOE_TYPE : "qwen3", how.dtype);
    CHECK(json_object_set_new(c, "rope_scaling", json_null()) == 0 &&
          json_object_set_new(c, "use_sliding_window", json_false()) == 0);
    if (moe) moe_config_write(c, &a->moe);
    hf_config_write(dir, c);
}
