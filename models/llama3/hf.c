// Hugging Face's LlamaForCausalLM checkpoints (transformers' modeling_llama.py; torchtitan's
// Llama3StateDictAdapter maps the same names): config.json <-> LlamaArgs, Llama 3.1's
// rope_scaling being Llama's own key; the weights and the rest of the config are the
// decoder's (models/decoder/hf.h).
#include "core/errors.h"
#include "models/decoder/hf.h"
#include "models/llama3/llama3.h"

#define MODEL "Llama"

// HF's rope_scaling: null, or Llama 3.1's {"rope_type": "llama3", factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings} ("type" in older configs).
static bool rope_scaling_read(const HfConfig *r, LlamaArgs *a) {
    const json_t *s = json_object_get(r->root, "rope_scaling");
    a->rope_scaling = s && !json_is_null(s);
    if (!a->rope_scaling) return true;
    const char *type = json_string_value(json_object_get(s, "rope_type"));
    if (!type) type = json_string_value(json_object_get(s, "type"));
    char text[256];
    if (!json_is_object(s) || !type || strcmp(type, "llama3") != 0)
        return error_set(r->err, r->errlen, "%s: rope_scaling of type %s; titan implements "
                         "rope_type llama3 (Llama 3.1)", r->path,
                         type ? error_quote(text, sizeof text, type) : "(none)");
    double orig;
    if (!hf_config_real(r, s, "factor", 0, &a->rope_scaling_factor) ||
        !hf_config_real(r, s, "low_freq_factor", 0, &a->rope_low_freq_factor) ||
        !hf_config_real(r, s, "high_freq_factor", 0, &a->rope_high_freq_factor) ||
        !hf_config_real(r, s, "original_max_position_embeddings", 0, &orig))
        return false;
    if (orig != (int)orig || a->rope_high_freq_factor <= a->rope_low_freq_factor)
        return error_set(r->err, r->errlen, "%s: rope_scaling needs an integer "
                         "original_max_position_embeddings and high_freq_factor > "
                         "low_freq_factor", r->path);
    a->rope_original_max_pos = (int)orig;
    return true;
}

bool llama3_try_args_from_hf(const char *dir, LlamaArgs *a, char *err, size_t errlen) {
    char path[4096];
    json_t *root;
    if (!hf_config_load(dir, &root, path, sizeof path, err, errlen)) return false;
    // torchtitan's defaults for what HF does not say (init, FFN rounding: hidden_dim is given)
    CHECK(llama3_flavor("debugmodel", a));
    HfConfig r = {path, MODEL, root, err, errlen};
    // LlamaConfig's max_position_embeddings default: 2048
    bool ok = decoder_hf_config_read(&r, a, "llama", false, 2048) && rope_scaling_read(&r, a);
    json_decref(root);
    return ok;
}

bool llama3_try_load_hf(const char *path, const LlamaArgs *a, ParamTable *params, char *err,
                        size_t errlen) {
    return decoder_try_load_hf(path, a, MODEL, params, err, errlen);
}

void llama3_load_hf(const char *path, const LlamaArgs *a, ParamTable *params) {
    char err[1024];
    if (!llama3_try_load_hf(path, a, params, err, sizeof err)) die_user("%s", err);
}

void llama3_save_hf(const char *dir, const LlamaArgs *a, const ParamTable *params,
                    HfExport how) {
    decoder_save_hf_weights(dir, a, params, how);
    json_t *c = decoder_hf_config_json(a, "LlamaForCausalLM", "llama", how.dtype);
    json_t *scaling = a->rope_scaling
        ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                    a->rope_scaling_factor, "low_freq_factor", a->rope_low_freq_factor,
                    "high_freq_factor", a->rope_high_freq_factor,
                    "original_max_position_embeddings", a->rope_original_max_pos)
        : json_null();
    CHECK(scaling != NULL && json_object_set_new(c, "rope_scaling", scaling) == 0);
    hf_config_write(dir, c);
}
