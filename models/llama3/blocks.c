// Llama 3 blocks: each forward is the math of torchtitan's llama3/model.py, each backward its
// derivative written out (no autograd, as llm.c). BT = B*T rows; weights are (out, in).
#include "models/llama3/blocks.h"

#include <string.h>

static void copy(float *dst, const float *src, size_t n) { memcpy(dst, src, n * sizeof(float)); }
static void zero(float *x, size_t n) { memset(x, 0, n * sizeof(float)); }

// ---- tok_embeddings ------------------------------------------------------------------------

static void embed_forward(Block *b, StepCtx *s, const float *x, float *y) {
    (void)x;
    LlamaEmbed *e = b->self;
    if (step_sizing(s)) return;
    s->k->embedding_forward(y, s->tokens, e->tok_embeddings->data, s->B * s->T, e->args->dim);
}

static void embed_backward(Block *b, StepCtx *s, const float *x, const float *dy, float *dx) {
    (void)x, (void)dx;
    LlamaEmbed *e = b->self;
    if (step_sizing(s)) return;
    s->k->embedding_backward(e->tok_embeddings->grad, dy, s->tokens, s->B * s->T, e->args->dim);
}

// ---- transformer block: h = x + Attention(attention_norm(x)); y = h + FFN(ffn_norm(h)) ------

typedef struct {
    int BT, D, hd, nq, nkv, H;  // rows, model width, head dim, q width, kv width, FFN width
} LayerDims;

static LayerDims layer_dims(const LlamaLayer *L, const StepCtx *s) {
    const LlamaArgs *a = L->args;
    int hd = llama3_head_dim(a);
    return (LayerDims){s->B * s->T, a->dim, hd, a->n_heads * hd, a->n_kv_heads * hd,
                       llama3_hidden_dim(a)};
}

// The forward math, on buffers layer_forward carved.
static void layer_forward_compute(LlamaLayer *L, StepCtx *s, LayerDims d, const float *x,
                                  float *y, void *workspace) {
    const LlamaArgs *a = L->args;
    const KernelOps *K = s->k;
    LayerSaved *sv = &L->saved;
    K->rmsnorm_forward(sv->xn, sv->rstd1, x, L->attention_norm->data, d.BT, d.D, a->norm_eps);
    K->matmul(sv->q, sv->xn, L->wq->data, d.BT, d.nq, d.D, false, true, 0);
    K->matmul(sv->k, sv->xn, L->wk->data, d.BT, d.nkv, d.D, false, true, 0);
    K->matmul(sv->v, sv->xn, L->wv->data, d.BT, d.nkv, d.D, false, true, 0);
    K->rope_forward(sv->q, sv->q, L->rope_cos, L->rope_sin, s->pos, d.BT, s->T, a->n_heads, d.hd);
    K->rope_forward(sv->k, sv->k, L->rope_cos, L->rope_sin, s->pos, d.BT, s->T, a->n_kv_heads,
                    d.hd);
    K->attention_forward(sv->attn, sv->lse, sv->q, sv->k, sv->v, s->B, s->T, a->n_heads,
                         a->n_kv_heads, d.hd, workspace);
    copy(sv->h, x, (size_t)d.BT * d.D);
    K->matmul(sv->h, sv->attn, L->wo->data, d.BT, d.D, d.nq, false, true, 1);

    K->rmsnorm_forward(sv->hn, sv->rstd2, sv->h, L->ffn_norm->data, d.BT, d.D, a->norm_eps);
    K->matmul(sv->gate, sv->hn, L->w1->data, d.BT, d.H, d.D, false, true, 0);
    K->matmul(sv->up, sv->hn, L->w3->data, d.BT, d.H, d.D, false, true, 0);
    K->swiglu_forward(sv->act, sv->gate, sv->up, (size_t)d.BT * d.H);
    copy(y, sv->h, (size_t)d.BT * d.D);
    K->matmul(y, sv->act, L->w2->data, d.BT, d.D, d.H, false, true, 1);
}

static void layer_forward(Block *b, StepCtx *s, const float *x, float *y) {
    LlamaLayer *L = b->self;
    LayerDims d = layer_dims(L, s);
    LayerSaved *sv = &L->saved;
    Arena *A = s->act;
    sv->xn = arena_floats(A, (size_t)d.BT * d.D);
    sv->rstd1 = arena_floats(A, d.BT);
    sv->q = arena_floats(A, (size_t)d.BT * d.nq);
    sv->k = arena_floats(A, (size_t)d.BT * d.nkv);
    sv->v = arena_floats(A, (size_t)d.BT * d.nkv);
    sv->attn = arena_floats(A, (size_t)d.BT * d.nq);
    sv->lse = arena_floats(A, (size_t)d.BT * L->args->n_heads);
    sv->h = arena_floats(A, (size_t)d.BT * d.D);
    sv->hn = arena_floats(A, (size_t)d.BT * d.D);
    sv->rstd2 = arena_floats(A, d.BT);
    sv->gate = arena_floats(A, (size_t)d.BT * d.H);
    sv->up = arena_floats(A, (size_t)d.BT * d.H);
    sv->act = arena_floats(A, (size_t)d.BT * d.H);
    size_t saved_end = arena_mark(A);  // the attention workspace is scratch: given back below
    void *workspace = arena_alloc(A, s->k->attention_workspace_bytes(s->T, d.hd));
    if (!step_sizing(s)) layer_forward_compute(L, s, d, x, y, workspace);
    arena_release(A, saved_end);
}

// y = h + act W2^T, act = silu(hn W1^T) * (hn W3^T), hn = ffn_norm(h): dh = dy + d(ffn_norm)
static void ffn_backward(LlamaLayer *L, StepCtx *s, LayerDims d, const float *dy, float *dh,
                         float *scratch) {
    const KernelOps *K = s->k;
    LayerSaved *sv = &L->saved;
    float *dact = scratch, *dgate = dact + (size_t)d.BT * d.H, *dup = dgate + (size_t)d.BT * d.H;
    float *dhn = dup + (size_t)d.BT * d.H;
    K->matmul(dact, dy, L->w2->data, d.BT, d.H, d.D, false, false, 0);
    K->matmul(L->w2->grad, dy, sv->act, d.D, d.H, d.BT, true, false, 1);
    zero(dgate, (size_t)2 * d.BT * d.H);
    K->swiglu_backward(dgate, dup, dact, sv->gate, sv->up, (size_t)d.BT * d.H);
    K->matmul(dhn, dgate, L->w1->data, d.BT, d.D, d.H, false, false, 0);
    K->matmul(dhn, dup, L->w3->data, d.BT, d.D, d.H, false, false, 1);
    K->matmul(L->w1->grad, dgate, sv->hn, d.H, d.D, d.BT, true, false, 1);
    K->matmul(L->w3->grad, dup, sv->hn, d.H, d.D, d.BT, true, false, 1);
    copy(dh, dy, (size_t)d.BT * d.D);
    K->rmsnorm_backward(dh, L->ffn_norm->grad, dhn, sv->h, L->ffn_norm->data, sv->rstd2, d.BT,
                        d.D);
}

// h = x + attn Wo^T, attn = softmax(rope(q) rope(k)^T) v, q/k/v = xn Wq/Wk/Wv^T, xn = norm(x)
static void attention_backward(LlamaLayer *L, StepCtx *s, LayerDims d, const float *x,
                               const float *dh, float *dx, float *scratch, void *workspace) {
    const KernelOps *K = s->k;
    const LlamaArgs *a = L->args;
    LayerSaved *sv = &L->saved;
    size_t nq = (size_t)d.BT * d.nq, nkv = (size_t)d.BT * d.nkv;
    float *dattn = scratch, *dq = dattn + nq, *dk = dq + nq, *dv = dk + nkv;
    float *dq0 = dv + nkv, *dk0 = dq0 + nq, *dxn = dk0 + nkv;
    K->matmul(dattn, dh, L->wo->data, d.BT, d.nq, d.D, false, false, 0);
    K->matmul(L->wo->grad, dh, sv->attn, d.D, d.nq, d.BT, true, false, 1);
    zero(dq, nq + 2 * nkv);
    K->attention_backward(dq, dk, dv, dattn, sv->q, sv->k, sv->v, sv->attn, sv->lse, s->B, s->T,
                          a->n_heads, a->n_kv_heads, d.hd, workspace);
    zero(dq0, nq + nkv);
    K->rope_backward(dq0, dq, L->rope_cos, L->rope_sin, s->pos, d.BT, s->T, a->n_heads, d.hd);
    K->rope_backward(dk0, dk, L->rope_cos, L->rope_sin, s->pos, d.BT, s->T, a->n_kv_heads, d.hd);
    K->matmul(dxn, dq0, L->wq->data, d.BT, d.D, d.nq, false, false, 0);
    K->matmul(dxn, dk0, L->wk->data, d.BT, d.D, d.nkv, false, false, 1);
    K->matmul(dxn, dv, L->wv->data, d.BT, d.D, d.nkv, false, false, 1);
    K->matmul(L->wq->grad, dq0, sv->xn, d.nq, d.D, d.BT, true, false, 1);
    K->matmul(L->wk->grad, dk0, sv->xn, d.nkv, d.D, d.BT, true, false, 1);
    K->matmul(L->wv->grad, dv, sv->xn, d.nkv, d.D, d.BT, true, false, 1);
    K->add(dx, dh, (size_t)d.BT * d.D);
    K->rmsnorm_backward(dx, L->attention_norm->grad, dxn, x, L->attention_norm->data, sv->rstd1,
                        d.BT, d.D);
}

static void layer_backward(Block *b, StepCtx *s, const float *x, const float *dy, float *dx) {
    LlamaLayer *L = b->self;
    LayerDims d = layer_dims(L, s);
    size_t ffn_scratch = (size_t)d.BT * (3 * (size_t)d.H + d.D);
    size_t attn_scratch = (size_t)d.BT * (3 * (size_t)d.nq + 3 * (size_t)d.nkv + d.D);
    float *dh = arena_floats(s->act, (size_t)d.BT * d.D);
    float *scratch = arena_floats(s->act, ffn_scratch > attn_scratch ? ffn_scratch : attn_scratch);
    void *workspace = arena_alloc(s->act, s->k->attention_workspace_bytes(s->T, d.hd));
    if (step_sizing(s)) return;
    ffn_backward(L, s, d, dy, dh, scratch);
    attention_backward(L, s, d, x, dh, dx, scratch, workspace);
}

// ---- head: logits = output(norm(x)), loss = mean cross-entropy -----------------------------

static void head_forward(Block *b, StepCtx *s, const float *x, float *y) {
    (void)y;
    LlamaHead *h = b->self;
    const LlamaArgs *a = h->args;
    int BT = s->B * s->T;
    h->xn = arena_floats(s->act, (size_t)BT * a->dim);
    h->rstd = arena_floats(s->act, BT);
    h->losses = arena_floats(s->act, BT);
    s->logits = arena_floats(s->act, (size_t)BT * a->vocab_size);
    if (step_sizing(s)) return;
    s->k->rmsnorm_forward(h->xn, h->rstd, x, h->norm->data, BT, a->dim, a->norm_eps);
    s->k->matmul(s->logits, h->xn, h->output->data, BT, a->vocab_size, a->dim, false, true, 0);
    s->k->cross_entropy_forward(h->losses, s->logits, s->targets, BT, a->vocab_size);
    double sum = 0;
    for (int i = 0; i < BT; i++) sum += h->losses[i];
    s->loss = sum / BT;
}

static void head_backward(Block *b, StepCtx *s, const float *x, const float *dy, float *dx) {
    (void)dy;
    LlamaHead *h = b->self;
    const LlamaArgs *a = h->args;
    int BT = s->B * s->T, V = a->vocab_size;
    float *dxn = arena_floats(s->act, (size_t)BT * a->dim);
    if (step_sizing(s)) return;
    float *dlogits = s->logits;  // overwritten in place: the fp32 logits are not needed again
    s->k->cross_entropy_backward(dlogits, s->logits, s->targets, BT, V, s->loss_scale / BT);
    s->k->matmul(h->output->grad, dlogits, h->xn, V, a->dim, BT, true, false, 1);
    s->k->matmul(dxn, dlogits, h->output->data, BT, a->dim, V, false, false, 0);
    s->k->rmsnorm_backward(dx, h->norm->grad, dxn, x, h->norm->data, h->rstd, BT, a->dim);
}

const BlockOps LLAMA_EMBED_OPS = {"embed", embed_forward, embed_backward};
const BlockOps LLAMA_LAYER_OPS = {"transformer", layer_forward, layer_backward};
const BlockOps LLAMA_HEAD_OPS = {"head", head_forward, head_backward};
