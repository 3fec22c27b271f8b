// What the decoder's Hugging Face checkpoints share (hf.h): the weights' names, the per-head
// RoPE row permutation, and config.json's common keys.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/files.h"
#include "models/decoder/hf.h"
#include "models/lora.h"
#include "models/moe/moe.h"

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
// Multi-head latent attention's (DeepseekV3Attention): RoPE rotates interleaved pairs there too
// (rope_interleave), so no row is permuted.
static const NamePair MLA_NAMES[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight", ROWS_AS_THEY_ARE},
    {"attention.wq_a.weight", "self_attn.q_a_proj.weight", ROWS_AS_THEY_ARE},
    {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight", ROWS_AS_THEY_ARE},
    {"attention.wq_b.weight", "self_attn.q_b_proj.weight", ROWS_AS_THEY_ARE},
    {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight", ROWS_AS_THEY_ARE},
    {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight", ROWS_AS_THEY_ARE},
    {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight", ROWS_AS_THEY_ARE},
};
#define COUNT(a) (int)(sizeof a / sizeof a[0])

static const NamePair *name_find(const NamePair *names, int n, const char *titan) {
    for (int i = 0; i < n; i++)
        if (!strcmp(titan, names[i].titan)) return &names[i];
    return NULL;
}

// One tensor of the HF file: a titan parameter, or one expert's slice of a stacked one.
typedef struct {
    char name[PARAM_NAME_MAX + 48];
    int param;           // its parameter's index in the table
    size_t offset;       // where it starts in the parameter's data (floats)
    int ndim;
    int64_t shape[2];
    RopeRows rows;
} HfTensor;

// DeepSeek-V3's multi-token prediction module k (from 1) in DeepSeek's release: layer
// n_layers + k - 1, its own weights beside the block's (which are named as a layer's), and
// copies of the shared embedding and output (MTP_SHARED).
static const NamePair MTP_NAMES[] = {
    {"enorm.weight", "enorm.weight", ROWS_AS_THEY_ARE},
    {"hnorm.weight", "hnorm.weight", ROWS_AS_THEY_ARE},
    {"eh_proj.weight", "eh_proj.weight", ROWS_AS_THEY_ARE},
    {"mtp_norm.weight", "shared_head.norm.weight", ROWS_AS_THEY_ARE},
};
static const NamePair MTP_SHARED[] = {
    {"tok_embeddings.weight", "embed_tokens.weight", ROWS_AS_THEY_ARE},
    {"output.weight", "shared_head.head.weight", ROWS_AS_THEY_ARE},
};

// out = HF's name for titan's parameter `name`, expert j's for a stacked MoE one (the MoE
// layer's names are models/moe's); *rows how its rows are laid out. Returns how many HF tensors
// the parameter is: 1, n_experts for stacked experts, 0 for one HF does not have (a Qwen3-MoE
// router's expert bias; DeepSeek-V3's multi-token prediction modules unless mtp: transformers'
// model has none).
static int hf_name(const char *name, const DecoderArgs *a, bool mtp, int j, char *out,
                   size_t n, RopeRows *rows) {
    int layer, at = 0;
    *rows = ROWS_AS_THEY_ARE;
    if (sscanf(name, "mtp_layers.%d.%n", &layer, &at) == 1 && at > 0) {
        if (!mtp) return 0;
        layer += a->n_layers;
        const NamePair *pair = name_find(MTP_NAMES, COUNT(MTP_NAMES), name + at);
        if (pair) {
            snprintf(out, n, "model.layers.%d.%s", layer, pair->hf);
            return 1;
        }
    } else if (!(sscanf(name, "layers.%d.%n", &layer, &at) == 1 && at > 0)) {
        const NamePair *pair = name_find(MODEL_NAMES, COUNT(MODEL_NAMES), name);
        if (pair) {
            snprintf(out, n, "%s", pair->hf);
            return 1;
        }
        die_internal(__FILE__, __LINE__, "parameter %s has no Hugging Face name", name);
    }
    const NamePair *pair = decoder_has_mla(a) ? name_find(MLA_NAMES, COUNT(MLA_NAMES), name + at)
                                              : NULL;
    if (!pair) pair = name_find(LAYER_NAMES, COUNT(LAYER_NAMES), name + at);
    if (pair) {
        snprintf(out, n, "model.layers.%d.%s", layer, pair->hf);
        *rows = pair->rows;
        return 1;
    }
    char moe[PARAM_NAME_MAX + 32];
    int E = decoder_has_moe(a) ? a->moe.router.n_experts : 1;
    int count = moe_hf_name(name + at, E, j, decoder_has_mla(a), moe, sizeof moe);
    if (count > 0) snprintf(out, n, "model.layers.%d.%s", layer, moe);
    if (count >= 0) return count;
    die_internal(__FILE__, __LINE__, "parameter %s has no Hugging Face name", name);
}

// The HF tensors of params in the table's order (none of a copy: its original is the tensor),
// experts in order, the MTP modules' with mtp (and with shared, their copies of the embedding
// and the output, which an export writes and an import leaves): *out (to free); returns how
// many.
static int hf_tensors(const ParamTable *params, const DecoderArgs *a, bool mtp, bool shared,
                      HfTensor **out) {
    int n = 0, total = 0, copies = mtp && shared ? a->mtp_layers * COUNT(MTP_SHARED) : 0;
    RopeRows rows;
    char name[sizeof (*out)->name];
    for (int i = 0; i < params->count; i++)
        if (!params->items[i].copy)
            total += hf_name(params->items[i].name, a, mtp, 0, name, sizeof name, &rows);
    *out = xcalloc((size_t)(total + copies), sizeof **out);
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        if (p->copy) continue;  // its original's tensor
        CHECK(p->ndim <= 3 && p->numel == param_global_numel(p));  // a host table of whole tensors
        int stacked = p->ndim == 3;  // (E, rows, cols): one (rows, cols) HF tensor per expert
        int count = hf_name(p->name, a, mtp, 0, name, sizeof name, &rows);
        for (int j = 0; j < count; j++) {
            HfTensor *t = &(*out)[n++];
            *t = (HfTensor){.param = i, .ndim = p->ndim - stacked, .rows = rows,
                            .offset = (size_t)j * (p->numel / count)};
            hf_name(p->name, a, mtp, j, t->name, sizeof t->name, &rows);
            t->shape[0] = p->shape[stacked];
            t->shape[1] = t->ndim > 1 ? p->shape[stacked + 1] : 0;
        }
    }
    for (int k = 0; k < copies; k++) {
        const NamePair *c = &MTP_SHARED[k % COUNT(MTP_SHARED)];
        const Param *p = params_find(params, c->titan);
        HfTensor *t = &(*out)[n++];
        *t = (HfTensor){.param = (int)(p - params->items), .ndim = 2,
                        .shape = {p->shape[0], p->shape[1]}};
        snprintf(t->name, sizeof t->name, "model.layers.%d.%s",
                 a->n_layers + k / COUNT(MTP_SHARED), c->hf);
    }
    return n;
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

// ---- config.json ---------------------------------------------------------------------------

// A config.json is a few KB; the cap only keeps a hostile file from being read whole.
#define HF_CONFIG_MAX_BYTES (16u << 20)

bool hf_config_load(const char *dir, json_t **root, char *path, size_t pathlen, char *err,
                    size_t errlen) {
    char why[4 * JSON_ERROR_TEXT_LENGTH], *text;
    size_t len;
    snprintf(path, pathlen, "%s/%s", dir, CONFIG_NAME);
    *root = NULL;
    FileReadResult r = file_read_all(path, HF_CONFIG_MAX_BYTES, &text, &len);
    if (r == FILE_OPEN_FAILED)
        return error_set(err, errlen, "Hugging Face config: unable to open %s: %s", path,
                         strerror(errno));
    if (r != FILE_READ_OK)
        return error_set(err, errlen, "Hugging Face config %s %s", path,
                         file_read_why(r, HF_CONFIG_MAX_BYTES, "a config.json", why, sizeof why));
    json_error_t e;
    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e);
    free(text);
    if (!*root)
        return error_set(err, errlen, "Hugging Face config %s: invalid JSON at line %d, column "
                         "%d: %s", path, e.line, e.column, error_escape(why, sizeof why, e.text));
    return true;
}

bool hf_config_int(const HfConfig *r, const char *key, int64_t lo, int64_t hi, int64_t def,
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

bool hf_config_bool(const HfConfig *r, const char *key, bool def, bool *out) {
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
    if (!hf_config_bool(r, key, false, &on)) return false;
    return !on || error_set(r->err, r->errlen, "%s: %s is true; %s", r->path, key, why);
}

static bool shape_read(const HfConfig *r, DecoderArgs *a, bool head_dim_free) {
    int head_dim;
    if (!hf_config_int(r, "hidden_size", 1, HF_MAX_WIDTH, 0, &a->dim) ||
        !hf_config_int(r, "intermediate_size", 1, HF_MAX_FFN, 0, &a->hidden_dim) ||
        !hf_config_int(r, "num_hidden_layers", 1, HF_MAX_LAYERS, 0, &a->n_layers) ||
        !hf_config_int(r, "num_attention_heads", 1, HF_MAX_HEADS, 0, &a->n_heads) ||
        !hf_config_int(r, "num_key_value_heads", 1, HF_MAX_HEADS, a->n_heads, &a->n_kv_heads) ||
        !hf_config_int(r, "vocab_size", 1, HF_MAX_VOCAB, 0, &a->vocab_size) ||
        !hf_config_int(r, "head_dim", 1, HF_MAX_HEAD_DIM, a->dim / a->n_heads, &head_dim))
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
        !hf_config_bool(r, "attention_bias", false, &attention_bias) ||
        !hf_config_bool(r, "mlp_bias", false, &mlp_bias))
        return false;
    if (attention_bias || mlp_bias)
        return error_set(r->err, r->errlen, "%s: attention_bias / mlp_bias are true; titan's "
                         "%s has no biases", r->path, r->model);
    // transformers' config defaults for what the file leaves out
    if (!shape_read(r, a, head_dim_free) ||
        !hf_config_real(r, r->root, "rms_norm_eps", 1e-6, &a->norm_eps) ||
        !hf_config_real(r, r->root, "rope_theta", 10000, &a->rope_theta) ||
        !hf_config_bool(r, "tie_word_embeddings", false, &a->tie_word_embeddings) ||
        !hf_config_int(r, "max_position_embeddings", 1, HF_MAX_POSITIONS, max_pos,
                       &a->max_seq_len))
        return false;
    if ((int64_t)a->max_seq_len * decoder_head_dim(a) > HF_MAX_ROPE_TABLE)
        return error_set(r->err, r->errlen, "%s: max_position_embeddings %d x head_dim %d is "
                         "more than 2^28 (RoPE's tables)", r->path, a->max_seq_len,
                         decoder_head_dim(a));
    return true;
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

// c (taken) as dir/name, through a temporary file.
static void json_write(const char *dir, const char *name, json_t *c) {
    char path[4096], tmp[4096 + 8];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ckpt_tmp_prepare(path, tmp, sizeof tmp);
    if (json_dump_file(c, tmp, JSON_INDENT(2)) != 0) die_user("cannot write %s", tmp);
    ckpt_publish(tmp, path);
    json_decref(c);
}

void hf_config_write(const char *dir, json_t *c) { json_write(dir, CONFIG_NAME, c); }

// ---- weights -------------------------------------------------------------------------------

static int name_order(const void *a, const void *b) {
    return strcmp(((const HfTensor *)a)->name, ((const HfTensor *)b)->name);
}

// Every tensor of the file is one of the model's: a file with more is another architecture.
// HF's tied lm_head copy, old exports' rotary inv_freq buffers and DeepSeek's MTP layers are
// left unread.
static bool extras_check(const Safetensors *st, const DecoderArgs *a, const char *model,
                         const HfTensor *tensors, int n, char *err, size_t errlen) {
    HfTensor *sorted = xmalloc(sizeof *sorted * (size_t)n), key;
    memcpy(sorted, tensors, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, name_order);
    bool ok = true;
    for (int i = 0; i < st->n_tensors && ok; i++) {
        const char *name = st->tensors[i].name;
        size_t len = strlen(name);
        snprintf(key.name, sizeof key.name, "%s", name);
        int layer;
        bool known = (a->tie_word_embeddings && !strcmp(name, "lm_head.weight")) ||
                     (len > 19 && !strcmp(name + len - 19, "rotary_emb.inv_freq")) ||
                     // DeepSeek's MTP layers after the last, which transformers ignores too
                     (decoder_has_mla(a) && sscanf(name, "model.layers.%d.", &layer) == 1 &&
                      layer >= a->n_layers) ||
                     (len < sizeof key.name && bsearch(&key, sorted, (size_t)n, sizeof key,
                                                       name_order));
        char q[256];
        if (!known)
            ok = error_set(err, errlen, "safetensors %s: tensor %s is not a weight of this "
                           "%s (%d layers%s)", st->files[st->tensors[i].file].path,
                           error_quote(q, sizeof q, name), model, a->n_layers,
                           a->tie_word_embeddings ? ", tied embeddings" : "");
    }
    free(sorted);
    return ok;
}

// Whether HF's file has p at all (the MoE layers' expert biases it has not).
static bool hf_has(const Param *p, const DecoderArgs *a, bool mtp) {
    char name[PARAM_NAME_MAX + 48];
    RopeRows rows;
    return hf_name(p->name, a, mtp, 0, name, sizeof name, &rows) > 0;
}

// A parameter HF has no tensor for (an expert bias) starts at zero, as a new model's: the
// routing bias is titan's training state, not part of the model HF runs.
static void zero_missing(ParamTable *params, const DecoderArgs *a) {
    for (int i = 0; i < params->count; i++) {
        Param *p = &params->items[i];
        if (hf_has(p, a, a->mtp_layers > 0)) continue;
        CHECK(p->buffer);
        memset(p->data, 0, sizeof(float) * p->numel);
    }
}

bool decoder_try_load_hf(const char *path, const DecoderArgs *a, const char *model,
                         ParamTable *params, char *err, size_t errlen) {
    Safetensors st;
    if (!safetensors_try_open(path, &st, err, errlen)) return false;
    HfTensor *tensors;
    int n = hf_tensors(params, a, a->mtp_layers > 0, false, &tensors);
    bool ok = extras_check(&st, a, model, tensors, n, err, errlen);
    float *scratch = rope_scratch(a);
    for (int i = 0; ok && i < n; i++) {
        const HfTensor *t = &tensors[i];
        Param *p = &params->items[t->param];
        float *to = t->rows == ROWS_AS_THEY_ARE ? p->data + t->offset : scratch;
        ok = safetensors_try_read(&st, t->name, t->ndim, t->shape, to, err, errlen);
        if (ok && t->rows != ROWS_AS_THEY_ARE) param_permute(p->data, scratch, p, a, t->rows, false);
    }
    if (ok) zero_missing(params, a);
    free(scratch);
    free(tensors);
    safetensors_close(&st);
    return ok;
}

// What HF's model cannot hold, said: Qwen3-MoE's expert biases when they are not all zero
// (HF's model then routes without what titan's steered by; torchtitan's adapter drops them the
// same way), DeepSeek-V3's multi-token prediction modules (transformers' drops them too).
static void warn_dropped(const ParamTable *params, const DecoderArgs *a, bool mtp) {
    double most = 0;
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        if (hf_has(p, a, mtp) || !p->buffer) continue;
        for (size_t e = 0; e < p->numel; e++) most = fmax(most, fabs(p->data[e]));
    }
    if (most > 0)
        log_warn("Hugging Face export: the MoE expert biases (max |bias| %.3g) are dropped; "
                 "HF's router chooses by the scores alone", most);
    if (a->mtp_layers && !mtp)
        log_warn("Hugging Face export: the %d multi-token prediction modules are dropped, as "
                 "transformers' DeepseekV3ForCausalLM has none (titan convert --to hf --mtp "
                 "keeps them as DeepSeek's release does)", a->mtp_layers);
}

void decoder_save_hf_weights(const char *dir, const DecoderArgs *a, const ParamTable *params,
                             HfExport how) {
    make_dirs(dir);
    HfTensor *tensors;
    int n = hf_tensors(params, a, how.mtp, true, &tensors);
    warn_dropped(params, a, how.mtp);
    CkptTensor *list = xcalloc((size_t)n, sizeof *list);
    for (int i = 0; i < n; i++)
        list[i] = (CkptTensor){.path = tensors[i].name, .ndim = tensors[i].ndim,
                               .shape = tensors[i].shape};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, WEIGHTS_NAME);
    SafetensorsWriter w;
    safetensors_write_begin(&w, path, list, n, how.dtype);
    float *scratch = rope_scratch(a);
    for (int i = 0; i < n; i++) {
        const HfTensor *t = &tensors[i];
        const Param *p = &params->items[t->param];
        if (t->rows != ROWS_AS_THEY_ARE) param_permute(scratch, p->data, p, a, t->rows, true);
        safetensors_write_put(&w, t->rows == ROWS_AS_THEY_ARE ? p->data + t->offset : scratch);
    }
    safetensors_write_end(&w);
    free(scratch);
    free(tensors);
    free(list);
}

// ---- PEFT adapters ---------------------------------------------------------------------------

void decoder_save_peft(const char *dir, const DecoderArgs *a, const ParamTable *params,
                       const LoraSection *lora) {
    make_dirs(dir);
    int n = 0;
    CkptTensor *list = xcalloc((size_t)params->count, sizeof *list);
    char (*names)[PARAM_NAME_MAX + 64] = xcalloc((size_t)params->count, sizeof *names);
    const Param **tensors = xcalloc((size_t)params->count, sizeof *tensors);
    RopeRows *rows = xcalloc((size_t)params->count, sizeof *rows);
    json_t *targets = json_array();  // the adapted modules' whole names: PEFT adapts no other
    int mtp = 0;
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        char module[PARAM_NAME_MAX + 16], hf[PARAM_NAME_MAX + 64], which;
        if (!lora_adapter_of(p->name, module, sizeof module, &which)) continue;
        if (!strcmp(module, "output.weight") && a->tie_word_embeddings)
            die_user("convert --to peft: the adapted output projection is the embedding's "
                     "transpose (tied), which PEFT's lm_head adapter cannot be");
        if (!hf_name(module, a, false, 0, hf, sizeof hf, &rows[n])) {  // transformers has none
            mtp++;
            continue;
        }
        hf[strlen(hf) - strlen(".weight")] = '\0';
        snprintf(names[n], sizeof names[n], "base_model.model.%s.lora_%c.weight", hf,
                 which == 'a' ? 'A' : 'B');
        if (which == 'a') rows[n] = ROWS_AS_THEY_ARE;  // A reads the input: only B's rows rotate
        else json_array_append_new(targets, json_string(hf));
        tensors[n] = p;
        list[n] = (CkptTensor){.path = names[n], .ndim = 2, .shape = p->shape};
        n++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    SafetensorsWriter w;
    safetensors_write_begin(&w, path, list, n, SAFETENSORS_F32);
    float *scratch = xmalloc(sizeof(float) * (size_t)a->n_heads * decoder_head_dim(a) * lora->rank);
    for (int i = 0; i < n; i++) {
        if (rows[i] != ROWS_AS_THEY_ARE)
            param_permute(scratch, tensors[i]->data, tensors[i], a, rows[i], true);
        safetensors_write_put(&w, rows[i] == ROWS_AS_THEY_ARE ? tensors[i]->data : scratch);
    }
    safetensors_write_end(&w);
    free(scratch), free(rows), free(tensors), free(names), free(list);
    json_t *c = json_pack("{s:s, s:s, s:I, s:f, s:f, s:s, s:o, s:b, s:b, s:n}", "peft_type",
                          "LORA", "task_type", "CAUSAL_LM", "r", (json_int_t)lora->rank,
                          "lora_alpha", lora->alpha, "lora_dropout", 0.0, "bias", "none",
                          "target_modules", targets, "fan_in_fan_out", false, "use_rslora",
                          false, "base_model_name_or_path");
    CHECK(c != NULL);
    json_write(dir, "adapter_config.json", c);
    if (mtp)
        log_info("convert: %d adapter matrices of the multi-token prediction modules left out: "
                 "transformers' model has no such modules", mtp);
}
