// Incremental decoding with a KV cache: the training forward's math (blocks.c) on one token
// at a time. Position p's keys and values depend only on tokens 0..p (causal attention), so
// they are computed once, kept, and each new query attends to all of them. A MoE layer's FFN
// is the layer's own forward (models/moe) on the one row, as training's on its rows.
#include <math.h>

#include "core/errors.h"
#include "models/decoder/blocks.h"

static const DecoderArgs *model_args(const Model *m) {
    CHECK(m->blocks[0].ops == &DECODER_EMBED_OPS);  // a model decoder_build made
    const DecoderEmbed *e = m->blocks[0].self;
    return e->args;
}

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : b > c ? b : c; }

// Each half of MLA's scratch: q_norm's input or output, the latent row before its norm, the
// rope parts of q.
static size_t mla_low_floats(const DecoderArgs *a, int kv_width) {
    return max3((size_t)a->mla.q_lora_rank, (size_t)kv_width,
                (size_t)a->n_heads * a->mla.qk_rope_head_dim);
}

// The same carving runs on a sizing arena and then on the committed one (core/arena.h).
static void kv_cache_carve(DecoderKVCache *c, const DecoderArgs *a) {
    Arena *A = &c->arena;
    size_t cache = (size_t)a->n_layers * c->max_ctx * c->kv_width;
    size_t q_width = (size_t)a->n_heads * decoder_head_dim(a), hidden = decoder_hidden_dim(a);
    c->k = arena_floats(A, cache);
    c->v = decoder_has_mla(a) ? NULL : arena_floats(A, cache);
    if (decoder_has_mla(a)) {
        size_t heads = (size_t)a->n_heads * c->kv_width;
        c->lat_q = arena_floats(A, heads);
        c->lat_out = arena_floats(A, heads);
        c->low = arena_floats(A, 2 * mla_low_floats(a, c->kv_width));
    }
    c->x = arena_floats(A, a->dim);
    c->xn = arena_floats(A, a->dim);
    c->rstd = arena_floats(A, 1);
    c->q = arena_floats(A, q_width);
    c->attn = arena_floats(A, q_width);  // MLA's v heads are no wider than q's
    c->qk = arena_floats(A, q_width);
    c->head_rstd = arena_floats(A, a->n_heads);
    c->gate = arena_floats(A, hidden);
    c->up = arena_floats(A, hidden);
    c->act = arena_floats(A, hidden);
    c->logits = arena_floats(A, a->vocab_size);
    c->ids = arena_alloc(A, 2 * sizeof(int));
}

// x += MoE(ffn_norm(x)) on the token's row: moe_forward carves what it keeps and its scratch
// from the cache's arena, given back after it; on a sizing arena the same call only counts
// them. No expert load is counted (StepCtx.expert_load NULL): decoding trains nothing. A
// capacity factor drops no slot here (the token's k slots go to k experts, each keeping at
// least one), where a forward over whole sequences may drop some.
static void decode_moe_ffn(const DecoderLayer *L, DecoderKVCache *c, const KernelOps *K) {
    StepCtx s = {.k = K, .act = &c->arena, .B = 1, .T = 1};
    size_t mark = arena_mark(&c->arena);
    MoeSaved sv;
    if (!step_sizing(&s))
        K->rmsnorm_forward(c->xn, DTYPE_FP32, c->rstd, c->x, L->ffn_norm->data, 1, L->args->dim,
                           L->args->norm_eps);
    moe_forward(L->moe, &s, &sv, c->xn, c->x, 1);
    arena_release(&c->arena, mark);
}

void decoder_kv_cache_init(DecoderKVCache *c, const Model *m, int max_ctx, const KernelOps *k) {
    const DecoderArgs *a = model_args(m);
    CHECK(max_ctx >= 1 && max_ctx <= a->max_seq_len);  // RoPE tables end at max_seq_len
    int kv_width = decoder_has_mla(a) ? a->mla.kv_lora_rank + a->mla.qk_rope_head_dim
                                      : a->n_kv_heads * decoder_head_dim(a);
    *c = (DecoderKVCache){.max_ctx = max_ctx, .kv_width = kv_width,
                          .memory = {k->alloc, k->free}};
    arena_init_sizing(&c->arena, "kv cache");
    kv_cache_carve(c, a);
    // every MoE layer has the same shape: the last layer is one when any is
    const DecoderLayer *last = m->blocks[m->n_blocks - 2].self;
    if (last->moe) decode_moe_ffn(last, c, NULL);  // sizing: no kernel runs
    arena_commit(&c->arena, &c->memory);
    kv_cache_carve(c, a);
}

void decoder_kv_cache_free(DecoderKVCache *c) { arena_free(&c->arena); }

// out (heads * head_dim) = xn W^T, each head through QK-norm when norm is set.
static void project_heads(const DecoderLayer *L, const Param *w, const Param *norm,
                          DecoderKVCache *c, const KernelOps *K, float *out, int heads) {
    const DecoderArgs *a = L->args;
    int hd = decoder_head_dim(a);
    K->matmul(norm ? c->qk : out, c->xn, w->data, DTYPE_FP32, 1, heads * hd, a->dim, false, true,
              0);
    if (norm)
        K->rmsnorm_forward(out, DTYPE_FP32, c->head_rstd, c->qk, norm->data, heads, hd,
                           a->norm_eps);
}

// x += Attention(attention_norm(x)), this position's k and v appended to the layer's cache.
static void decode_attention(const DecoderLayer *L, DecoderKVCache *c, const KernelOps *K,
                             int pos) {
    const DecoderArgs *a = L->args;
    int D = a->dim, hd = decoder_head_dim(a), nq = a->n_heads * hd, nkv = c->kv_width;
    size_t layer = (size_t)L->layer_id * c->max_ctx * nkv;
    float *k_cache = c->k + layer, *v_cache = c->v + layer;
    float *k = k_cache + (size_t)pos * nkv, *v = v_cache + (size_t)pos * nkv;
    K->rmsnorm_forward(c->xn, DTYPE_FP32, c->rstd, c->x, L->attention_norm->data, 1, D,
                       a->norm_eps);
    project_heads(L, L->wq, L->q_norm, c, K, c->q, a->n_heads);
    project_heads(L, L->wk, L->k_norm, c, K, k, a->n_kv_heads);
    K->matmul(v, c->xn, L->wv->data, DTYPE_FP32, 1, nkv, D, false, true, 0);
    const int *at = c->ids + 1;  // pos, where the kernels read it
    K->rope_forward(c->q, c->q, L->rope_cos, L->rope_sin, at, 1, 1, a->n_heads, hd);
    K->rope_forward(k, k, L->rope_cos, L->rope_sin, at, 1, 1, a->n_kv_heads, hd);
    K->attention_decode(c->attn, c->q, k_cache, v_cache, pos + 1, a->n_heads, a->n_kv_heads, hd);
    K->matmul(c->x, c->attn, L->wo->data, DTYPE_FP32, 1, D, nq, false, true, 1);
}

// MLA on the cache's latents: position pos's [kv_norm(c), rope(k_pe)] joins the layer's cache;
// each head's q_nope goes through its k part of wkv_b into the latent's space beside its
// rotated q_pe, so that one head of kv_width attends to the latents as keys and values (MQA
// with one kv head); the output's first kv_lora_rank columns (the rest, from k_pe, unused)
// go through each head's v part of wkv_b. The scale: the kernel's 1/sqrt(kv_width) undone
// on q, MLA's own (1/sqrt(qk), YaRN's correction) applied.
static void decode_mla(const DecoderLayer *L, DecoderKVCache *c, const KernelOps *K, int pos) {
    const DecoderArgs *a = L->args;
    const MlaArgs *m = &a->mla;
    const MlaWeights *w = &L->mla;
    int D = a->dim, nh = a->n_heads, W = c->kv_width, C = m->kv_lora_rank;
    int nope = m->qk_nope_head_dim, rope = m->qk_rope_head_dim, vd = m->v_head_dim;
    int qk = nope + rope, R = m->q_lora_rank;
    size_t fl = sizeof(float);
    float *cache = c->k + (size_t)L->layer_id * c->max_ctx * W, *row = cache + (size_t)pos * W;
    float *low = c->low, *normed = low + mla_low_floats(a, W);  // the scratch's two halves
    const int *at = c->ids + 1;
    K->rmsnorm_forward(c->xn, DTYPE_FP32, c->rstd, c->x, L->attention_norm->data, 1, D,
                       a->norm_eps);
    // the latent row
    K->matmul(low, c->xn, w->wkv_a->data, DTYPE_FP32, 1, W, D, false, true, 0);
    K->rmsnorm_forward(row, DTYPE_FP32, c->rstd, low, w->kv_norm->data, 1, C, m->norm_eps);
    K->rope_forward(row + C, low + C, L->rope_cos, L->rope_sin, at, 1, 1, 1, rope);
    // q, and its rope parts rotated into lat_q
    float *q = c->q;
    if (R) {
        K->matmul(low, c->xn, w->wq_a->data, DTYPE_FP32, 1, R, D, false, true, 0);
        K->rmsnorm_forward(normed, DTYPE_FP32, c->rstd, low, w->q_norm->data, 1, R, m->norm_eps);
        K->matmul(q, normed, w->wq_b->data, DTYPE_FP32, 1, nh * qk, R, false, true, 0);
    } else {
        K->matmul(q, c->xn, w->wq->data, DTYPE_FP32, 1, nh * qk, D, false, true, 0);
    }
    K->copy_rows(low, rope * fl, q + nope, qk * fl, rope * fl, nh);
    K->rope_forward(low, low, L->rope_cos, L->rope_sin, at, 1, 1, nh, rope);
    K->copy_rows(c->lat_q + C, W * fl, low, rope * fl, rope * fl, nh);
    const float *wkv_b = w->wkv_b->data;  // (nh (nope + vd), C)
    for (int h = 0; h < nh; h++)
        K->matmul(c->lat_q + (size_t)h * W, q + (size_t)h * qk, wkv_b + (size_t)h * (nope + vd) * C,
                  DTYPE_FP32, 1, C, nope, false, false, 0);
    K->scale(c->lat_q, (size_t)nh * W, (float)(mla_scale_correction(a) * sqrt((double)W / qk)));
    K->attention_decode(c->lat_out, c->lat_q, cache, cache, pos + 1, nh, 1, W);
    for (int h = 0; h < nh; h++)
        K->matmul(c->attn + (size_t)h * vd, c->lat_out + (size_t)h * W,
                  wkv_b + ((size_t)h * (nope + vd) + nope) * C, DTYPE_FP32, 1, vd, C, false, true,
                  0);
    K->matmul(c->x, c->attn, L->wo->data, DTYPE_FP32, 1, D, nh * vd, false, true, 1);
}

// x += W2 (silu(W1 hn) * W3 hn), hn = ffn_norm(x).
static void decode_ffn(const DecoderLayer *L, DecoderKVCache *c, const KernelOps *K) {
    const DecoderArgs *a = L->args;
    int D = a->dim, H = decoder_hidden_dim(a);
    K->rmsnorm_forward(c->xn, DTYPE_FP32, c->rstd, c->x, L->ffn_norm->data, 1, D, a->norm_eps);
    K->matmul(c->gate, c->xn, L->w1->data, DTYPE_FP32, 1, H, D, false, true, 0);
    K->matmul(c->up, c->xn, L->w3->data, DTYPE_FP32, 1, H, D, false, true, 0);
    K->swiglu_forward(c->act, DTYPE_FP32, c->gate, c->up, (size_t)H);
    K->matmul(c->x, c->act, L->w2->data, DTYPE_FP32, 1, D, H, false, true, 1);
}

const float *decoder_decode_step(const Model *m, DecoderKVCache *c, const KernelOps *k,
                                 int token, int pos) {
    const DecoderArgs *a = model_args(m);
    CHECK(pos >= 0 && pos < c->max_ctx && token >= 0 && token < a->vocab_size);
    const DecoderEmbed *e = m->blocks[0].self;
    k->upload(c->ids, (int[2]){token, pos}, 2 * sizeof(int));
    k->embedding_forward(c->x, c->ids, e->tok_embeddings->data, 1, a->dim, 0, a->vocab_size);
    for (int i = 1; i + 1 < m->n_blocks; i++) {
        const DecoderLayer *L = m->blocks[i].self;
        if (L->mla.on)
            decode_mla(L, c, k, pos);
        else
            decode_attention(L, c, k, pos);
        if (L->moe)
            decode_moe_ffn(L, c, k);
        else
            decode_ffn(L, c, k);
    }
    const DecoderHead *h = m->blocks[m->n_blocks - 1].self;
    k->rmsnorm_forward(c->xn, DTYPE_FP32, c->rstd, c->x, h->norm->data, 1, a->dim, a->norm_eps);
    k->matmul(c->logits, c->xn, h->output->data, DTYPE_FP32, 1, a->vocab_size, a->dim, false,
              true, 0);
    return c->logits;
}
