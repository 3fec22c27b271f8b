// Hugging Face's Qwen3ForCausalLM checkpoints (transformers' modeling_qwen3.py; torchtitan's
// Qwen3StateDictAdapter maps the same names): config.json <-> Qwen3Args through the decoder's
// shared keys (models/decoder/hf.h), with Qwen3's own: head_dim of its own width, and the
// sliding-window attention and rope_scaling titan's Qwen3 does not have.
#include "core/errors.h"
#include "models/decoder/hf.h"
#include "models/qwen3/qwen3.h"

#define MODEL "Qwen3"

static bool config_read(const HfConfig *r, DecoderArgs *a) {
    const json_t *scaling = json_object_get(r->root, "rope_scaling");
    // Qwen3Config's max_position_embeddings default: 32768
    if (!decoder_hf_config_read(r, a, "qwen3", true, 32768) ||
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
    CHECK(qwen3_flavor("debugmodel", args));  // torchtitan's for what HF does not say (init)
    HfConfig r = {path, MODEL, root, err, errlen};
    bool ok = config_read(&r, &args->decoder);
    json_decref(root);
    return ok;
}

void qwen3_load_hf(const char *path, const Qwen3Args *args, ParamTable *params) {
    char err[1024];
    if (!decoder_try_load_hf(path, &args->decoder, MODEL, params, err, sizeof err))
        die_user("%s", err);
}

void qwen3_save_hf(const char *dir, const Qwen3Args *args, const ParamTable *params,
                   SafetensorsDtype dtype) {
    const DecoderArgs *a = &args->decoder;
    decoder_save_hf_weights(dir, a, params, dtype);
    json_t *c = decoder_hf_config_json(a, "Qwen3ForCausalLM", "qwen3", dtype);
    CHECK(json_object_set_new(c, "rope_scaling", json_null()) == 0 &&
          json_object_set_new(c, "use_sliding_window", json_false()) == 0);
    hf_config_write(dir, c);
}
