// Hugging Face's LlamaForCausalLM checkpoints: config.json <-> LlamaArgs, and the weights under
// HF's names (transformers' modeling_llama.py; torchtitan's Llama3StateDictAdapter does the
// same mapping). HF applies RoPE to the two halves of each head (rotate_half) where titan, as
// Meta and torchtitan, rotates interleaved pairs, so the rows of wq and wk are permuted per
// head on the way out (convert_llama_weights_to_hf.py's permute) and back on the way in: the
// same attention scores either way.
#include <jansson.h>
#include <stdlib.h>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/files.h"
#include "models/llama3/llama3.h"

#define CONFIG_NAME "config.json"
#define WEIGHTS_NAME "model.safetensors"

// ---- names ---------------------------------------------------------------------------------

typedef enum { ROWS_AS_THEY_ARE, ROWS_QUERY_HEADS, ROWS_KV_HEADS } RopeRows;

typedef struct {
    const char *titan, *hf;
    RopeRows rows;
} NamePair;

static const NamePair MODEL_NAMES[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight", ROWS_AS_THEY_ARE},
    {"norm.weight", "model.norm.weight", ROWS_AS_THEY_ARE},
    {"output.weight", "lm_head.weight", ROWS_AS_THEY_ARE},
};
// After "layers.N." in titan and "model.layers.N." in HF.
static const NamePair LAYER_NAMES[] = {
    {"attention_norm.weight", "input_layernorm.weight", ROWS_AS_THEY_ARE},
    {"attention.wq.weight", "self_attn.q_proj.weight", ROWS_QUERY_HEADS},
    {"attention.wk.weight", "self_attn.k_proj.weight", ROWS_KV_HEADS},
    {"attention.wv.weight", "self_attn.v_proj.weight", ROWS_AS_THEY_ARE},
    {"attention.wo.weight", "self_attn.o_proj.weight", ROWS_AS_THEY_ARE},
    {"ffn_norm.weight", "post_attention_layernorm.weight", ROWS_AS_THEY_ARE},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight", ROWS_AS_THEY_ARE},
    {"feed_forward.w2.weight", "mlp.down_proj.weight", ROWS_AS_THEY_ARE},
    {"feed_forward.w3.weight", "mlp.up_proj.weight", ROWS_AS_THEY_ARE},
};
#define COUNT(a) (int)(sizeof a / sizeof a[0])

// out = HF's name for titan's parameter `name`; returns how its rows are laid out.
static RopeRows hf_name(const char *name, char *out, size_t n) {
    int layer, at = 0;
    if (sscanf(name, "layers.%d.%n", &layer, &at) == 1 && at > 0) {
        for (int i = 0; i < COUNT(LAYER_NAMES); i++)
            if (!strcmp(name + at, LAYER_NAMES[i].titan)) {
                snprintf(out, n, "model.layers.%d.%s", layer, LAYER_NAMES[i].hf);
                return LAYER_NAMES[i].rows;
            }
    } else {
        for (int i = 0; i < COUNT(MODEL_NAMES); i++)
            if (!strcmp(name, MODEL_NAMES[i].titan)) {
                snprintf(out, n, "%s", MODEL_NAMES[i].hf);
                return MODEL_NAMES[i].rows;
            }
    }
    die_internal(__FILE__, __LINE__, "parameter %s has no Hugging Face name", name);
}

// Within each head, titan's row 2i + j (pair i, component j) is HF's row j * head_dim/2 + i
// (half j, index i): src (heads * head_dim, cols) -> dst, to HF or (to_hf false) back.
static void rope_rows_permute(float *dst, const float *src, int heads, int head_dim,
                              int64_t cols, bool to_hf) {
    int half = head_dim / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++) {
                size_t pairs = (size_t)h * head_dim + 2 * i + j;
                size_t halves = (size_t)h * head_dim + (size_t)j * half + i;
                memcpy(dst + (to_hf ? halves : pairs) * cols, src + (to_hf ? pairs : halves) * cols,
                       sizeof(float) * cols);
            }
}

static int rows_heads(const LlamaArgs *a, RopeRows rows) {
    return rows == ROWS_QUERY_HEADS ? a->n_heads : a->n_kv_heads;
}

// A scratch buffer for the largest permuted tensor (wq).
static float *rope_scratch(const LlamaArgs *a) {
    return xmalloc(sizeof(float) * (size_t)a->n_heads * decoder_head_dim(a) * a->dim);
}

static void check_full(const Param *p) {
    CHECK(p->ndim <= 2 && p->numel == param_global_numel(p));  // a host table of whole tensors
}

// ---- config.json ---------------------------------------------------------------------------

static void config_write(const char *dir, const LlamaArgs *a, SafetensorsDtype dtype) {
    json_t *c = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:s, s:b, s:b, s:s}",
        "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", a->dim,
        "intermediate_size", decoder_hidden_dim(a), "num_hidden_layers", a->n_layers,
        "num_attention_heads", a->n_heads, "num_key_value_heads", a->n_kv_heads, "head_dim",
        decoder_head_dim(a), "vocab_size", a->vocab_size, "rms_norm_eps", a->norm_eps,
        "rope_theta", a->rope_theta, "tie_word_embeddings", a->tie_word_embeddings,
        "max_position_embeddings", a->max_seq_len, "hidden_act", "silu", "attention_bias", 0,
        "mlp_bias", 0, "torch_dtype", dtype == SAFETENSORS_BF16 ? "bfloat16" : "float32");
    CHECK(c != NULL);
    json_t *scaling = a->rope_scaling
        ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                    a->rope_scaling_factor, "low_freq_factor", a->rope_low_freq_factor,
                    "high_freq_factor", a->rope_high_freq_factor,
                    "original_max_position_embeddings", a->rope_original_max_pos)
        : json_null();
    CHECK(scaling != NULL && json_object_set_new(c, "rope_scaling", scaling) == 0);
    char path[4096], tmp[4096 + 8];
    snprintf(path, sizeof path, "%s/%s", dir, CONFIG_NAME);
    ckpt_tmp_prepare(path, tmp, sizeof tmp);
    if (json_dump_file(c, tmp, JSON_INDENT(2)) != 0) die_user("cannot write %s", tmp);
    ckpt_publish(tmp, path);
    json_decref(c);
}

typedef struct {
    const char *path;
    const json_t *root;
    char *err;
    size_t errlen;
} ConfigReader;

// key as an integer in [lo, hi]; absent (or null): def, or an error when def < lo (required).
static bool config_int(const ConfigReader *r, const char *key, int64_t lo, int64_t hi,
                       int64_t def, int *out) {
    const json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) {
        *out = (int)def;
        return def >= lo || error_set(r->err, r->errlen, "%s has no %s", r->path, key);
    }
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        *out = (int)json_integer_value(v);
        return true;
    }
    return error_set(r->err, r->errlen, "%s: %s must be an integer in [%lld, %lld]", r->path, key,
                     (long long)lo, (long long)hi);
}

// key as a positive number; absent (or null): def, or an error when def <= 0 (required).
static bool config_real(const ConfigReader *r, const json_t *obj, const char *key, double def,
                        double *out) {
    const json_t *v = json_object_get(obj, key);
    *out = !v || json_is_null(v) ? def : json_is_number(v) ? json_number_value(v) : -1;
    if (*out > 0) return true;
    if (!v || json_is_null(v)) return error_set(r->err, r->errlen, "%s has no %s", r->path, key);
    return error_set(r->err, r->errlen, "%s: %s must be a positive number", r->path, key);
}

// key as a boolean; absent (or null): def.
static bool config_bool(const ConfigReader *r, const char *key, bool def, bool *out) {
    const json_t *v = json_object_get(r->root, key);
    *out = !v || json_is_null(v) ? def : json_is_true(v);
    if (!v || json_is_null(v) || json_is_boolean(v)) return true;
    return error_set(r->err, r->errlen, "%s: %s must be true or false", r->path, key);
}

// A string key that, when given, must be what titan implements.
static bool config_expect(const ConfigReader *r, const char *key, const char *want) {
    const json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), want)))
        return true;
    char text[256];
    return error_set(r->err, r->errlen, "%s: %s is %s; titan's Llama has %s", r->path, key,
                     json_is_string(v) ? error_quote(text, sizeof text, json_string_value(v))
                                       : "not a string", want);
}

// HF's rope_scaling: null, or Llama 3.1's {"rope_type": "llama3", factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings} ("type" in older configs).
static bool rope_scaling_read(const ConfigReader *r, LlamaArgs *a) {
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
    if (!config_real(r, s, "factor", 0, &a->rope_scaling_factor) ||
        !config_real(r, s, "low_freq_factor", 0, &a->rope_low_freq_factor) ||
        !config_real(r, s, "high_freq_factor", 0, &a->rope_high_freq_factor) ||
        !config_real(r, s, "original_max_position_embeddings", 0, &orig))
        return false;
    if (orig != (int)orig || a->rope_high_freq_factor <= a->rope_low_freq_factor)
        return error_set(r->err, r->errlen, "%s: rope_scaling needs an integer "
                         "original_max_position_embeddings and high_freq_factor > "
                         "low_freq_factor", r->path);
    a->rope_original_max_pos = (int)orig;
    return true;
}

static bool shape_read(const ConfigReader *r, LlamaArgs *a) {
    int head_dim;
    if (!config_int(r, "hidden_size", 1, INT32_MAX, 0, &a->dim) ||
        !config_int(r, "intermediate_size", 1, INT32_MAX, 0, &a->hidden_dim) ||
        !config_int(r, "num_hidden_layers", 1, INT32_MAX, 0, &a->n_layers) ||
        !config_int(r, "num_attention_heads", 1, INT32_MAX, 0, &a->n_heads) ||
        !config_int(r, "num_key_value_heads", 1, INT32_MAX, a->n_heads, &a->n_kv_heads) ||
        !config_int(r, "vocab_size", 1, INT32_MAX, 0, &a->vocab_size) ||
        !config_int(r, "head_dim", 1, INT32_MAX, a->dim / a->n_heads, &head_dim))
        return false;
    if (a->dim % a->n_heads || a->n_heads % a->n_kv_heads || head_dim != a->dim / a->n_heads ||
        head_dim % 2)
        return error_set(r->err, r->errlen, "%s: hidden_size %d, num_attention_heads %d, "
                         "num_key_value_heads %d and head_dim %d do not make even heads of "
                         "hidden_size / num_attention_heads", r->path, a->dim, a->n_heads,
                         a->n_kv_heads, head_dim);
    return true;
}

static bool config_read(const ConfigReader *r, LlamaArgs *a) {
    bool attention_bias, mlp_bias;
    if (!json_is_object(r->root))
        return error_set(r->err, r->errlen, "%s is not a JSON object", r->path);
    if (!config_expect(r, "model_type", "llama") || !config_expect(r, "hidden_act", "silu") ||
        !config_bool(r, "attention_bias", false, &attention_bias) ||
        !config_bool(r, "mlp_bias", false, &mlp_bias))
        return false;
    if (attention_bias || mlp_bias)
        return error_set(r->err, r->errlen, "%s: attention_bias / mlp_bias are true; titan's "
                         "Llama has no biases", r->path);
    // transformers' LlamaConfig defaults for what the file leaves out
    return shape_read(r, a) && config_real(r, r->root, "rms_norm_eps", 1e-6, &a->norm_eps) &&
           config_real(r, r->root, "rope_theta", 10000, &a->rope_theta) &&
           config_bool(r, "tie_word_embeddings", false, &a->tie_word_embeddings) &&
           config_int(r, "max_position_embeddings", 1, INT32_MAX, 2048, &a->max_seq_len) &&
           rope_scaling_read(r, a);
}

bool llama3_try_args_from_hf(const char *dir, LlamaArgs *a, char *err, size_t errlen) {
    char path[4096], why[4 * JSON_ERROR_TEXT_LENGTH];
    snprintf(path, sizeof path, "%s/%s", dir, CONFIG_NAME);
    json_error_t e;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!root && e.line < 0)  // not read at all: jansson's text says why (e.g. no such file)
        return error_set(err, errlen, "Hugging Face config: %s",
                         error_escape(why, sizeof why, e.text));
    if (!root)
        return error_set(err, errlen, "Hugging Face config %s: invalid JSON at line %d, column "
                         "%d: %s", path, e.line, e.column, error_escape(why, sizeof why, e.text));
    // torchtitan's defaults for what HF does not say (init, FFN rounding: hidden_dim is given)
    CHECK(llama3_flavor("debugmodel", a));
    ConfigReader r = {path, root, err, errlen};
    bool ok = config_read(&r, a);
    json_decref(root);
    return ok;
}

// ---- weights -------------------------------------------------------------------------------

// Every tensor of the file is one of the model's: a file with more is another architecture.
// HF's tied lm_head copy and old exports' rotary inv_freq buffers are left unread.
static bool extras_check(const Safetensors *st, const LlamaArgs *a, const ParamTable *params,
                         char *err, size_t errlen) {
    for (int i = 0; i < st->n_tensors; i++) {
        const char *name = st->tensors[i].name;
        size_t len = strlen(name);
        bool known = (a->tie_word_embeddings && !strcmp(name, "lm_head.weight")) ||
                     (len > 19 && !strcmp(name + len - 19, "rotary_emb.inv_freq"));
        for (int p = 0; p < params->count && !known; p++) {
            char hf[PARAM_NAME_MAX + 16];
            hf_name(params->items[p].name, hf, sizeof hf);
            known = !strcmp(hf, name);
        }
        char q[256];
        if (!known)
            return error_set(err, errlen, "safetensors %s: tensor %s is not a weight of this "
                             "Llama (%d layers%s)", st->files[st->tensors[i].file].path,
                             error_quote(q, sizeof q, name), a->n_layers,
                             a->tie_word_embeddings ? ", tied embeddings" : "");
    }
    return true;
}

bool llama3_try_load_hf(const char *path, const LlamaArgs *a, ParamTable *params, char *err,
                        size_t errlen) {
    Safetensors st;
    if (!safetensors_try_open(path, &st, err, errlen)) return false;
    bool ok = extras_check(&st, a, params, err, errlen);
    float *scratch = rope_scratch(a);
    for (int i = 0; ok && i < params->count; i++) {
        Param *p = &params->items[i];
        check_full(p);
        char name[PARAM_NAME_MAX + 16];
        RopeRows rows = hf_name(p->name, name, sizeof name);
        float *to = rows == ROWS_AS_THEY_ARE ? p->data : scratch;
        ok = safetensors_try_read(&st, name, p->ndim, p->shape, to, err, errlen);
        if (ok && rows != ROWS_AS_THEY_ARE)
            rope_rows_permute(p->data, scratch, rows_heads(a, rows), decoder_head_dim(a),
                              p->shape[1], false);
    }
    free(scratch);
    safetensors_close(&st);
    return ok;
}

void llama3_load_hf(const char *path, const LlamaArgs *a, ParamTable *params) {
    char err[1024];
    if (!llama3_try_load_hf(path, a, params, err, sizeof err)) die_user("%s", err);
}

void llama3_save_hf(const char *dir, const LlamaArgs *a, const ParamTable *params,
                    SafetensorsDtype dtype) {
    make_dirs(dir);
    CkptTensor *list = xcalloc((size_t)params->count, sizeof *list);
    char(*names)[PARAM_NAME_MAX + 16] = xcalloc((size_t)params->count, sizeof *names);
    RopeRows *rows = xcalloc((size_t)params->count, sizeof *rows);
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        check_full(p);
        rows[i] = hf_name(p->name, names[i], sizeof names[i]);
        list[i] = (CkptTensor){.path = names[i], .ndim = p->ndim, .shape = p->shape, .data = p->data};
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, WEIGHTS_NAME);
    SafetensorsWriter w;
    safetensors_write_begin(&w, path, list, params->count, dtype);
    float *scratch = rope_scratch(a);
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        if (rows[i] != ROWS_AS_THEY_ARE)
            rope_rows_permute(scratch, p->data, rows_heads(a, rows[i]), decoder_head_dim(a),
                              p->shape[1], true);
        safetensors_write_put(&w, rows[i] == ROWS_AS_THEY_ARE ? p->data : scratch);
    }
    safetensors_write_end(&w);
    config_write(dir, a, dtype);
    free(scratch);
    free(rows);
    free(names);
    free(list);
}
