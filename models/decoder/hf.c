// What the decoder's Hugging Face checkpoints share (hf.h): the weights' names, the per-head
// RoPE row permutation, and config.json's common keys.
#include <stdlib.h>

#include "core/errors.h"
#include "core/files.h"
#include "models/decoder/hf.h"

#define CONFIG_NAME "config.json"
#define WEIGHTS_NAME "model.safetensors"

// ---- names ---------------------------------------------------------------------------------

// How a tensor's rows are laid out: as they are, or per head in RoPE's pairs (titan) or halves
// (HF): wq's n_heads heads, wk's n_kv_heads, a QK-norm weight's one head.
typedef enum { ROWS_AS_THEY_ARE, ROWS_QUERY_HEADS, ROWS_KV_HEADS, ROWS_ONE_HEAD } RopeRows;

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
    {"attention.q_norm.weight", "self_attn.q_norm.weight", ROWS_ONE_HEAD},
    {"attention.k_norm.weight", "self_attn.k_norm.weight", ROWS_ONE_HEAD},
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

// p's rows from titan's layout to HF's (or back): a vector is one column.
static void param_permute(float *dst, const float *src, const Param *p, const DecoderArgs *a,
                          RopeRows rows, bool to_hf) {
    int heads = rows == ROWS_QUERY_HEADS ? a->n_heads : rows == ROWS_KV_HEADS ? a->n_kv_heads : 1;
    rope_rows_permute(dst, src, heads, decoder_head_dim(a), p->ndim == 2 ? p->shape[1] : 1, to_hf);
}

// A scratch buffer for the largest permuted tensor (wq).
static float *rope_scratch(const DecoderArgs *a) {
    return xmalloc(sizeof(float) * (size_t)a->n_heads * decoder_head_dim(a) * a->dim);
}

static void check_full(const Param *p) {
    CHECK(p->ndim <= 2 && p->numel == param_global_numel(p));  // a host table of whole tensors
}

// ---- config.json ---------------------------------------------------------------------------

bool hf_config_load(const char *dir, json_t **root, char *path, size_t pathlen, char *err,
                    size_t errlen) {
    char why[4 * JSON_ERROR_TEXT_LENGTH];
    snprintf(path, pathlen, "%s/%s", dir, CONFIG_NAME);
    json_error_t e;
    *root = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!*root && e.line < 0)  // not read at all: jansson's text says why (e.g. no such file)
        return error_set(err, errlen, "Hugging Face config: %s",
                         error_escape(why, sizeof why, e.text));
    if (!*root)
        return error_set(err, errlen, "Hugging Face config %s: invalid JSON at line %d, column "
                         "%d: %s", path, e.line, e.column, error_escape(why, sizeof why, e.text));
    return true;
}

// key as an integer in [lo, hi]; absent (or null): def, or an error when def < lo (required).
static bool config_int(const HfConfig *r, const char *key, int64_t lo, int64_t hi, int64_t def,
                       int *out) {
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

bool hf_config_real(const HfConfig *r, const json_t *obj, const char *key, double def,
                    double *out) {
    const json_t *v = json_object_get(obj, key);
    *out = !v || json_is_null(v) ? def : json_is_number(v) ? json_number_value(v) : -1;
    if (*out > 0) return true;
    if (!v || json_is_null(v)) return error_set(r->err, r->errlen, "%s has no %s", r->path, key);
    return error_set(r->err, r->errlen, "%s: %s must be a positive number", r->path, key);
}

// key as a boolean; absent (or null): def.
static bool config_bool(const HfConfig *r, const char *key, bool def, bool *out) {
    const json_t *v = json_object_get(r->root, key);
    *out = !v || json_is_null(v) ? def : json_is_true(v);
    if (!v || json_is_null(v) || json_is_boolean(v)) return true;
    return error_set(r->err, r->errlen, "%s: %s must be true or false", r->path, key);
}

bool hf_config_expect(const HfConfig *r, const char *key, const char *want) {
    const json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v) || (json_is_string(v) && !strcmp(json_string_value(v), want)))
        return true;
    char text[256];
    return error_set(r->err, r->errlen, "%s: %s is %s; titan's %s has %s", r->path, key,
                     json_is_string(v) ? error_quote(text, sizeof text, json_string_value(v))
                                       : "not a string", r->model, want);
}

bool hf_config_refuse(const HfConfig *r, const char *key, const char *why) {
    bool on;
    if (!config_bool(r, key, false, &on)) return false;
    return !on || error_set(r->err, r->errlen, "%s: %s is true; %s", r->path, key, why);
}

static bool shape_read(const HfConfig *r, DecoderArgs *a, bool head_dim_free) {
    int head_dim;
    if (!config_int(r, "hidden_size", 1, INT32_MAX, 0, &a->dim) ||
        !config_int(r, "intermediate_size", 1, INT32_MAX, 0, &a->hidden_dim) ||
        !config_int(r, "num_hidden_layers", 1, INT32_MAX, 0, &a->n_layers) ||
        !config_int(r, "num_attention_heads", 1, INT32_MAX, 0, &a->n_heads) ||
        !config_int(r, "num_key_value_heads", 1, INT32_MAX, a->n_heads, &a->n_kv_heads) ||
        !config_int(r, "vocab_size", 1, INT32_MAX, 0, &a->vocab_size) ||
        !config_int(r, "head_dim", 1, INT32_MAX, a->dim / a->n_heads, &head_dim))
        return false;
    bool heads_of_dim = a->dim % a->n_heads == 0 && head_dim == a->dim / a->n_heads;
    if (a->n_heads % a->n_kv_heads || head_dim % 2 || (!head_dim_free && !heads_of_dim))
        return error_set(r->err, r->errlen, "%s: hidden_size %d, num_attention_heads %d, "
                         "num_key_value_heads %d and head_dim %d do not make even heads%s",
                         r->path, a->dim, a->n_heads, a->n_kv_heads, head_dim,
                         head_dim_free ? "" : " of hidden_size / num_attention_heads");
    a->head_dim = heads_of_dim ? 0 : head_dim;
    return true;
}

bool decoder_hf_config_read(const HfConfig *r, DecoderArgs *a, const char *model_type,
                            bool head_dim_free, int max_pos) {
    bool attention_bias, mlp_bias;
    if (!json_is_object(r->root))
        return error_set(r->err, r->errlen, "%s is not a JSON object", r->path);
    if (!hf_config_expect(r, "model_type", model_type) ||
        !hf_config_expect(r, "hidden_act", "silu") ||
        !config_bool(r, "attention_bias", false, &attention_bias) ||
        !config_bool(r, "mlp_bias", false, &mlp_bias))
        return false;
    if (attention_bias || mlp_bias)
        return error_set(r->err, r->errlen, "%s: attention_bias / mlp_bias are true; titan's "
                         "%s has no biases", r->path, r->model);
    // transformers' config defaults for what the file leaves out
    return shape_read(r, a, head_dim_free) &&
           hf_config_real(r, r->root, "rms_norm_eps", 1e-6, &a->norm_eps) &&
           hf_config_real(r, r->root, "rope_theta", 10000, &a->rope_theta) &&
           config_bool(r, "tie_word_embeddings", false, &a->tie_word_embeddings) &&
           config_int(r, "max_position_embeddings", 1, INT32_MAX, max_pos, &a->max_seq_len);
}

json_t *decoder_hf_config_json(const DecoderArgs *a, const char *architecture,
                               const char *model_type, SafetensorsDtype dtype) {
    json_t *c = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:s, s:b, s:b, s:s}",
        "architectures", architecture, "model_type", model_type, "hidden_size", a->dim,
        "intermediate_size", decoder_hidden_dim(a), "num_hidden_layers", a->n_layers,
        "num_attention_heads", a->n_heads, "num_key_value_heads", a->n_kv_heads, "head_dim",
        decoder_head_dim(a), "vocab_size", a->vocab_size, "rms_norm_eps", a->norm_eps,
        "rope_theta", a->rope_theta, "tie_word_embeddings", a->tie_word_embeddings,
        "max_position_embeddings", a->max_seq_len, "hidden_act", "silu", "attention_bias", 0,
        "mlp_bias", 0, "torch_dtype", dtype == SAFETENSORS_BF16 ? "bfloat16" : "float32");
    CHECK(c != NULL);
    return c;
}

void hf_config_write(const char *dir, json_t *c) {
    char path[4096], tmp[4096 + 8];
    snprintf(path, sizeof path, "%s/%s", dir, CONFIG_NAME);
    ckpt_tmp_prepare(path, tmp, sizeof tmp);
    if (json_dump_file(c, tmp, JSON_INDENT(2)) != 0) die_user("cannot write %s", tmp);
    ckpt_publish(tmp, path);
    json_decref(c);
}

// ---- weights -------------------------------------------------------------------------------

// Every tensor of the file is one of the model's: a file with more is another architecture.
// HF's tied lm_head copy and old exports' rotary inv_freq buffers are left unread.
static bool extras_check(const Safetensors *st, const DecoderArgs *a, const char *model,
                         const ParamTable *params, char *err, size_t errlen) {
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
                             "%s (%d layers%s)", st->files[st->tensors[i].file].path,
                             error_quote(q, sizeof q, name), model, a->n_layers,
                             a->tie_word_embeddings ? ", tied embeddings" : "");
    }
    return true;
}

bool decoder_try_load_hf(const char *path, const DecoderArgs *a, const char *model,
                         ParamTable *params, char *err, size_t errlen) {
    Safetensors st;
    if (!safetensors_try_open(path, &st, err, errlen)) return false;
    bool ok = extras_check(&st, a, model, params, err, errlen);
    float *scratch = rope_scratch(a);
    for (int i = 0; ok && i < params->count; i++) {
        Param *p = &params->items[i];
        check_full(p);
        char name[PARAM_NAME_MAX + 16];
        RopeRows rows = hf_name(p->name, name, sizeof name);
        float *to = rows == ROWS_AS_THEY_ARE ? p->data : scratch;
        ok = safetensors_try_read(&st, name, p->ndim, p->shape, to, err, errlen);
        if (ok && rows != ROWS_AS_THEY_ARE) param_permute(p->data, scratch, p, a, rows, false);
    }
    free(scratch);
    safetensors_close(&st);
    return ok;
}

void decoder_save_hf_weights(const char *dir, const DecoderArgs *a, const ParamTable *params,
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
        if (rows[i] != ROWS_AS_THEY_ARE) param_permute(scratch, p->data, p, a, rows[i], true);
        safetensors_write_put(&w, rows[i] == ROWS_AS_THEY_ARE ? p->data : scratch);
    }
    safetensors_write_end(&w);
    free(scratch);
    free(rows);
    free(names);
    free(list);
}
