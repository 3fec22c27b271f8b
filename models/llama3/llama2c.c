// llama2.c checkpoints (karpathy/llama2.c, run.c's legacy format): a header of 7 int32
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size > 0 means
// the classifier is tied to the embeddings) then fp32 weights, each kind stacked over layers,
// in the order of run.c's memory_map_weights. Its model is Llama 3's math with RoPE theta
// 10000 on interleaved pairs and RMSNorm eps 1e-5, so the weights load as they are.
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "core/errors.h"
#include "models/llama3/llama3.h"

enum { L2C_DIM, L2C_HIDDEN, L2C_LAYERS, L2C_HEADS, L2C_KV_HEADS, L2C_VOCAB, L2C_SEQ_LEN,
       L2C_HEADER_INTS };

// The per-layer tensors between the embedding table and the final norm, in file order.
static const char *const LAYER_TENSORS[] = {
    "layers.%d.attention_norm.weight", "layers.%d.attention.wq.weight",
    "layers.%d.attention.wk.weight",   "layers.%d.attention.wv.weight",
    "layers.%d.attention.wo.weight",   "layers.%d.ffn_norm.weight",
    "layers.%d.feed_forward.w1.weight", "layers.%d.feed_forward.w2.weight",
    "layers.%d.feed_forward.w3.weight",
};
#define N_LAYER_TENSORS (int)(sizeof LAYER_TENSORS / sizeof LAYER_TENSORS[0])

static int64_t file_bytes(FILE *f) {
    struct stat st;
    SYS_CHECK(fstat(fileno(f), &st));
    return st.st_size;
}

// Bounds keep every size product far from overflow; real models are well inside them.
static bool header_sane(const int32_t *h) {
    for (int i = 0; i < L2C_HEADER_INTS; i++)
        if (i != L2C_VOCAB && (h[i] <= 0 || h[i] > (1 << 20))) return false;
    if (h[L2C_VOCAB] == INT32_MIN) return false;  // abs() would overflow
    int vocab = abs(h[L2C_VOCAB]);
    return vocab > 0 && vocab <= (1 << 24) && h[L2C_DIM] % h[L2C_HEADS] == 0 &&
           h[L2C_HEADS] % h[L2C_KV_HEADS] == 0 && (h[L2C_DIM] / h[L2C_HEADS]) % 2 == 0;
}

// Floats after the header: every weight, the two legacy RoPE tables (seq_len, head_dim / 2),
// and the classifier when it is not tied.
static int64_t implied_floats(const int32_t *h) {
    int64_t dim = h[L2C_DIM], hidden = h[L2C_HIDDEN], layers = h[L2C_LAYERS];
    int64_t head_dim = dim / h[L2C_HEADS], kv = (int64_t)h[L2C_KV_HEADS] * head_dim;
    int64_t vocab = abs(h[L2C_VOCAB]);
    int64_t per_layer = 2 * dim + 2 * dim * dim + 2 * dim * kv + 3 * dim * hidden;
    int64_t n = vocab * dim + layers * per_layer + dim + (int64_t)h[L2C_SEQ_LEN] * head_dim;
    return h[L2C_VOCAB] > 0 ? n : n + vocab * dim;
}

// The validated header; false and a reason naming the file on a missing or short file, or one
// that is not this format (the bounds on the size keep its byte count an int64).
static bool header_read(const char *path, int32_t h[L2C_HEADER_INTS], char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(err, errlen, "cannot open llama2.c checkpoint %s: %s", path,
                         strerror(errno));
    bool sane = fread(h, sizeof(int32_t), L2C_HEADER_INTS, f) == L2C_HEADER_INTS &&
                header_sane(h) && implied_floats(h) < INT64_MAX / 8;
    int64_t got = file_bytes(f);
    fclose(f);
    if (!sane)
        return error_set(err, errlen, "%s is not a llama2.c checkpoint (no header of 7 int32 "
                         "giving a model's shape)", path);
    int64_t want = L2C_HEADER_INTS * 4 + 4 * implied_floats(h);
    if (got != want)
        return error_set(err, errlen, "llama2.c checkpoint %s has %lld bytes; its header implies "
                         "%lld (truncated?)", path, (long long)got, (long long)want);
    return true;
}

bool llama3_try_args_from_llama2c(const char *path, LlamaArgs *a, char *err, size_t errlen) {
    int32_t h[L2C_HEADER_INTS];
    if (!header_read(path, h, err, errlen)) return false;
    // torchtitan's defaults for what the header does not say (init, the unused RoPE scaling)
    CHECK(llama3_flavor("debugmodel", a));
    a->dim = h[L2C_DIM];
    a->hidden_dim = h[L2C_HIDDEN];
    a->n_layers = h[L2C_LAYERS];
    a->n_heads = h[L2C_HEADS];
    a->n_kv_heads = h[L2C_KV_HEADS];
    a->vocab_size = abs(h[L2C_VOCAB]);
    a->max_seq_len = h[L2C_SEQ_LEN];
    a->tie_word_embeddings = h[L2C_VOCAB] > 0;
    a->norm_eps = 1e-5;
    a->rope_theta = 10000;
    a->rope_scaling = false;
    return true;
}

void llama3_args_from_llama2c(const char *path, LlamaArgs *a) {
    char err[1024];
    if (!llama3_try_args_from_llama2c(path, a, err, sizeof err)) die_user("%s", err);
}

static bool param_read(FILE *f, const char *path, Model *m, const char *name, char *err,
                       size_t errlen) {
    Param *p = params_find(&m->params, name);
    CHECK(p != NULL && p->data != NULL);
    if (fread(p->data, sizeof(float), p->numel, f) == p->numel) return true;
    return error_set(err, errlen, "llama2.c checkpoint %s ends inside %s", path, name);
}

// The tensors in file order, from f positioned past the header.
static bool params_read(FILE *f, const char *path, Model *m, const int32_t *h, char *err,
                        size_t errlen) {
    int64_t rope_floats = (int64_t)h[L2C_SEQ_LEN] * (h[L2C_DIM] / h[L2C_HEADS]);
    char name[PARAM_NAME_MAX];
    if (!param_read(f, path, m, "tok_embeddings.weight", err, errlen)) return false;
    for (int t = 0; t < N_LAYER_TENSORS; t++)
        for (int i = 0; i < h[L2C_LAYERS]; i++) {
            snprintf(name, sizeof name, LAYER_TENSORS[t], i);
            if (!param_read(f, path, m, name, err, errlen)) return false;
        }
    if (!param_read(f, path, m, "norm.weight", err, errlen)) return false;
    CHECK(fseek(f, (long)(rope_floats * sizeof(float)), SEEK_CUR) == 0);  // titan computes RoPE
    return h[L2C_VOCAB] > 0 || param_read(f, path, m, "output.weight", err, errlen);
}

bool llama3_try_load_llama2c(const char *path, Model *m, char *err, size_t errlen) {
    int32_t h[L2C_HEADER_INTS];
    // the file may have changed since llama3_try_args_from_llama2c
    if (!header_read(path, h, err, errlen)) return false;
    int64_t rope_floats = (int64_t)h[L2C_SEQ_LEN] * (h[L2C_DIM] / h[L2C_HEADS]);
    CHECK((int64_t)m->params.numel + rope_floats == implied_floats(h));  // built from this file
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(err, errlen, "cannot open llama2.c checkpoint %s: %s", path,
                         strerror(errno));
    CHECK(fseek(f, L2C_HEADER_INTS * sizeof(int32_t), SEEK_SET) == 0);
    bool ok = params_read(f, path, m, h, err, errlen);
    fclose(f);
    return ok;
}

void llama3_load_llama2c(const char *path, Model *m) {
    char err[1024];
    if (!llama3_try_load_llama2c(path, m, err, sizeof err)) die_user("%s", err);
}
