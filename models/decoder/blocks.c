// Decoder blocks: each forward is the math of torchtitan's llama3/model.py (qwen3's adds
// QK-norm), each backward its derivative written out (no autograd, as llm.c). BT = B*T rows;
// weights are (out, in).
//
// Under tensor parallelism (StepCtx.tp, Megatron-LM with sequence parallel) each rank holds
// `rows` = BT / tp of the residual stream and a slice of every sharded weight: the normed rows
// are gathered before each column-parallel projection (wq/wk/wv, w1/w3, output) and the
// row-parallel ones (wo, w2) and the vocab-parallel embedding give partial sums over all rows
// that a reduce-scatter sums back into each rank's rows; backward runs the duals.
#include "core/errors.h"
#include "models/decoder/blocks.h"

// ---- sequence-parallel seams, each the identity on one device ------------------------------

// xn (BT, D) = rmsnorm of x (rows, D) in the activations' dtype, gathered from every rank: the
// input of a column-parallel projection. normed: (rows, D) scratch for this rank's rows under TP.
static void norm_gathered(const StepCtx *s, void *xn, float *rstd, void *normed, const float *x,
                          const float *w, int rows, int D, float eps) {
    void *out = s->tp ? normed : xn;
    s->k->rmsnorm_forward(out, s->act_dtype, rstd, x, w, rows, D, eps);
    if (s->tp) s->tp->gather(s->tp, out, xn, (size_t)rows * D, s->act_dtype);
}

// dx (rows, D) += the rmsnorm backward of dxn (BT, D); under TP dxn is this rank's partial sum
// over its weight slices, reduce-scattered into dxn_rows (rows, D) first: norm_gathered's dual.
static void norm_backward_reduced(const StepCtx *s, float *dx, float *dw, const float *dxn,
                                  float *dxn_rows, const float *x, const float *w,
                                  const float *rstd, int rows, int D) {
    if (s->tp) {
        s->tp->reduce_scatter(s->tp, dxn, dxn_rows, (size_t)rows * D);
        dxn = dxn_rows;
    }
    s->k->rmsnorm_backward(dx, dw, dxn, x, w, rstd, rows, D);
}

// y (rows, D) = x + a W^T for a row-parallel W (D, k) and a (BT, k): under TP a W^T is this
// rank's partial sum over all rows, reduce-scattered into its rows. partial: (BT, D) scratch.
static void residual_row_parallel(const StepCtx *s, float *y, const float *x, LinearAct a,
                                  const Linear *w, int BT, int rows, int D, float *partial) {
    size_t n = (size_t)rows * D;
    if (!s->tp) {
        copy(s, y, x, n);
        linear_forward(w, s, y, a, BT, 1);
        return;
    }
    linear_forward(w, s, partial, a, BT, 0);
    s->tp->reduce_scatter(s->tp, partial, y, n);
    s->k->add(y, x, n);
}

// The gradient of all BT rows of what a reduce-scatter wrote (its dual: an all-gather into
// full (BT, D) fp32); dy (rows, D) itself on one device.
static const float *grad_gathered(const StepCtx *s, const float *dy, float *full, int rows, int D) {
    if (!s->tp) return dy;
    s->tp->gather(s->tp, dy, full, (size_t)rows * D, DTYPE_FP32);
    return full;
}

// The same in the activations' dtype, for the two GEMMs of a row-parallel weight that read it:
// bf16 rows are cast before the gather (half its bytes) into rows_room (rows, D), then gathered
// into cast_room (BT, D) of the activations' dtype; fp32 ones gather into full (BT, D) as above.
static LinearAct grad_gathered_act(const StepCtx *s, const float *dy, float *full,
                                   void *rows_room, void *cast_room, int rows, int D) {
    if (s->act_dtype == DTYPE_FP32) return linear_fp32(grad_gathered(s, dy, full, rows, D));
    size_t n = (size_t)rows * D;
    if (!s->tp) return act_cast(s, dy, n, cast_room);
    s->k->to_bf16(rows_room, dy, n);
    s->tp->gather(s->tp, rows_room, cast_room, n, s->act_dtype);
    return act(s, cast_room);
}

// First global row of a vocab-sharded table's slice (0 when it is whole).
static int vocab_start(const Param *table) {
    ParamBox b = param_box(table, false);
    return (int)box_start(&b, 0);
}

// ---- tok_embeddings ------------------------------------------------------------------------

void zero_tail_rows(const StepCtx *s, float *x, size_t width, int first, int n, int k) {
    int T = s->T;
    for (int seq = first / T; seq * T < first + n; seq++) {
        int lo = seq * T + T - k, hi = seq * T + T;
        lo = lo > first ? lo : first;
        hi = hi < first + n ? hi : first + n;
        if (lo < hi) zero(s, x + (size_t)(lo - first) * width, (size_t)(hi - lo) * width);
    }
}

// p + n, or NULL for a sizing pass's NULL tensor.
static void *at(void *p, size_t bytes) { return p ? (char *)p + bytes : NULL; }

// ids (B, T) = src shifted k positions left within each sequence, 0 past its end.
static void shift_ids(const StepCtx *s, int *ids, const int *src, int k) {
    size_t T = (size_t)s->T;
    s->k->copy_rows(ids, T * sizeof(int), src + k, T * sizeof(int), (T - k) * sizeof(int), s->B);
    for (int b = 0; b < s->B; b++) s->k->zero(ids + b * T + T - k, (size_t)k * sizeof(int));
}

// rows (step_rows, D) of the embeddings of ids (B*T) in table (vocab, D): vocab parallel, each
// rank looks up the tokens its slice of the table holds and gives zeros for the others, the
// reduce-scatter summing the slices' rows. Scratch from the arena, given back.
static void embed_rows(const Param *table, StepCtx *s, float *rows, const int *ids) {
    int BT = s->B * s->T, D = (int)table->shape[1];
    size_t mark = arena_mark(s->act);
    float *partial = s->tp ? arena_floats(s->act, (size_t)BT * D) : rows;
    if (!step_sizing(s)) {
        s->k->embedding_forward(partial, ids, table->data, BT, D, vocab_start(table),
                                (int)table->shape[0]);
        if (s->tp) s->tp->reduce_scatter(s->tp, partial, rows, (size_t)step_rows(s) * D);
    }
    arena_release(s->act, mark);
}

// The table's gradient += that of rows' embeddings, drows (step_rows, D). full: (BT, D) under
// TP. A frozen table (LoRA's base) takes none: nothing to do, on every rank alike.
static void embed_rows_backward(const Param *table, StepCtx *s, const float *drows,
                                const int *ids, float *full) {
    if (table->frozen) return;
    int BT = s->B * s->T, D = (int)table->shape[1];
    const float *all = grad_gathered(s, drows, full, step_rows(s), D);
    s->k->embedding_backward(table->grad, all, ids, BT, D, vocab_start(table),
                             (int)table->shape[0]);
}

static void embed_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    (void)saved, (void)x;
    const DecoderEmbed *e = b->self;
    embed_rows(e->tok_embeddings, s, y, token_batch(s)->tokens);
}

// All of it is the table's gradient: the input part has nothing to do (there is no input
// gradient), the weight part reads dy, still valid then.
static void embed_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                           const float *dy, float *dx) {
    (void)saved, (void)x, (void)dx;
    if (phase == BLOCK_BACKWARD_INPUT) return;
    const DecoderEmbed *e = b->self;
    int BT = s->B * s->T, D = e->args->dim;
    float *full = s->tp ? arena_floats(s->act, (size_t)BT * D) : NULL;
    if (!step_sizing(s))
        embed_rows_backward(e->tok_embeddings, s, dy, token_batch(s)->tokens, full);
}

// ---- transformer block: h = x + Attention(attention_norm(x)); y = h + FFN(ffn_norm(h)) ------

// The local widths are those of this rank's weight slices: the model needs no tp degree.
static LayerDims layer_dims(const DecoderLayer *L, const StepCtx *s) {
    LayerDims d = {.BT = s->B * s->T, .rows = step_rows(s), .D = L->args->dim,
                   .hd = decoder_head_dim(L->args), .nv = (int)L->wo->shape[1],
                   .H = L->w1 ? (int)L->w1->shape[0] : 0};
    if (L->mla.on) {
        mla_dims(L->args, &d);
        return d;
    }
    d.nq = (int)L->wq->shape[0], d.nkv = (int)L->wk->shape[0];
    d.nh = d.nq / d.hd, d.nkvh = d.nkv / d.hd;
    return d;
}

int decoder_layer_linears(DecoderLayer *L, Linear *out[DECODER_LAYER_LINEARS]) {
    int n = L->mla.on ? mla_linears(&L->mla, out) : 0;
    Linear *own[] = {&L->linear.wq, &L->linear.wk, &L->linear.wv, &L->linear.wo,
                     &L->linear.w1, &L->linear.w2, &L->linear.w3};
    for (int j = 0; j < 7; j++)
        if (own[j]->weight) out[n++] = own[j];
    return n;
}

// Room for the scratch of the layer's linears (linear_reserve), after a phase's other buffers:
// the MoE layer reserves its own, and MLA in backward.
static void layer_linears_reserve(DecoderLayer *L, const StepCtx *s, LayerDims d) {
    Linear *all[DECODER_LAYER_LINEARS];
    int n = decoder_layer_linears(L, all);
    linear_reserve(s, (const Linear *const *)all, n, d.BT, s->act_dtype);
}

// Causal attention over this rank's tokens of each sequence, within documents when the batch
// has them. Without attention hooks the whole sequences are local and the batch's ids are the
// queries' and the keys'; the hooks take the whole sequences' ids as the keys' and cut each
// chunk's from them themselves.
static AttnShape attention_shape(const StepCtx *s, LayerDims d) {
    const int *doc = token_batch(s)->doc;
    return (AttnShape){.B = s->B, .Tq = s->T, .Tk = s->T, .n_heads = d.nh, .n_kv_heads = d.nkvh,
                       .head_dim = d.hd, .mask = doc ? ATTN_DOCUMENT : ATTN_CAUSAL,
                       .q_doc = s->attn ? NULL : doc, .kv_doc = doc, .compute = s->act_dtype};
}

// ---- the attention seam: the kernel on whole sequences, or the hooks (context parallel) ----

size_t decoder_attention_workspace(const StepCtx *s, LayerDims d) {
    AttnShape shape = attention_shape(s, d);
    if (s->attn) return s->attn->workspace_bytes(s->attn, s, &shape);
    return s->k->attention_workspace_bytes(&shape);
}

void decoder_attention_forward(const StepCtx *s, LayerDims d, float *out, float *lse,
                               const float *q, const float *k, const float *v, void *workspace) {
    AttnShape shape = attention_shape(s, d);
    if (s->attn)
        s->attn->forward(s->attn, s, out, lse, q, k, v, &shape, workspace);
    else
        s->k->attention_forward(out, lse, q, k, v, &shape, workspace);
}

void decoder_attention_backward(const StepCtx *s, LayerDims d, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse,
                                void *workspace) {
    AttnShape shape = attention_shape(s, d);
    if (s->attn) {
        s->attn->backward(s->attn, s, dq, dk, dv, dout, q, k, v, out, lse, &shape, workspace);
        return;
    }
    zero(s, dq, (size_t)d.BT * d.nq);  // the kernel accumulates
    zero(s, dk, (size_t)d.BT * d.nkv);
    zero(s, dv, (size_t)d.BT * d.nkv);
    s->k->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &shape, workspace);
}

// Qwen3's QK-norm: q and k, seen as (rows * heads, head_dim), each head RMS-normalised with
// its own (head_dim) weight before RoPE.
static void qk_norm_forward(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d) {
    float eps = L->args->norm_eps;
    s->k->rmsnorm_forward(sv->q, DTYPE_FP32, sv->q_rstd, sv->q0, L->q_norm->data, d.BT * d.nh,
                          d.hd, eps);
    s->k->rmsnorm_forward(sv->k, DTYPE_FP32, sv->k_rstd, sv->k0, L->k_norm->data,
                          d.BT * d.nkvh, d.hd, eps);
}

// dqk (BT, nq + nkv: dq then dk) = QK-norm's backward of the normed heads' gradients dqk_normed
// (laid out alike), the norms' weight gradients accumulated.
static void qk_norm_backward(DecoderLayer *L, StepCtx *s, const LayerSaved *sv, LayerDims d,
                             float *dqk, const float *dqk_normed) {
    size_t nq = (size_t)d.BT * d.nq, nkv = (size_t)d.BT * d.nkv;
    zero(s, dqk, nq + nkv);  // the kernel accumulates
    s->k->rmsnorm_backward(dqk, L->q_norm->grad, dqk_normed, sv->q0, L->q_norm->data, sv->q_rstd,
                           d.BT * d.nh, d.hd);
    s->k->rmsnorm_backward(dqk + nq, L->k_norm->grad, dqk_normed + nq, sv->k0, L->k_norm->data,
                           sv->k_rstd, d.BT * d.nkvh, d.hd);
}

// Grouped-query attention's output sv->attn of xn: q, k, v projections, QK-norm when the layer
// has it, RoPE.
static void gqa_forward(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d, LinearAct xn,
                        void *workspace) {
    const KernelOps *K = s->k;
    linear_forward(&L->linear.wq, s, L->q_norm ? sv->q0 : sv->q, xn, d.BT, 0);
    linear_forward(&L->linear.wk, s, L->k_norm ? sv->k0 : sv->k, xn, d.BT, 0);
    linear_forward(&L->linear.wv, s, sv->v, xn, d.BT, 0);
    if (L->q_norm) qk_norm_forward(L, s, sv, d);
    const int *pos = token_batch(s)->pos;
    K->rope_forward(sv->q, sv->q, L->rope_cos, L->rope_sin, pos, d.BT, s->T, d.nh, d.hd);
    K->rope_forward(sv->k, sv->k, L->rope_cos, L->rope_sin, pos, d.BT, s->T, d.nkvh, d.hd);
    decoder_attention_forward(s, d, sv->attn, sv->lse, sv->q, sv->k, sv->v, workspace);
}

// The forward math, on buffers layer_forward carved; comm: (rows + BT) * D of scratch under TP;
// attn_cast: (BT, nv) of the activations' dtype when it is not fp32; mla_scratch: MLA's.
static void layer_forward_compute(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d,
                                  const float *x, float *y, void *workspace, float *comm,
                                  void *attn_cast, void *mla_scratch) {
    const DecoderArgs *a = L->args;
    const KernelOps *K = s->k;
    float *normed = comm, *partial = comm ? comm + (size_t)d.rows * d.D : NULL;
    norm_gathered(s, sv->xn, sv->rstd1, normed, x, L->attention_norm->data, d.rows, d.D,
                  a->norm_eps);
    LinearAct xn = act(s, sv->xn);
    if (L->mla.on)
        mla_forward(a, &L->mla, L->rope_cos, L->rope_sin, s, &sv->mla, d, xn, sv->attn,
                    mla_scratch, workspace);
    else
        gqa_forward(L, s, sv, d, xn, workspace);
    LinearAct attn = act_cast(s, sv->attn, (size_t)d.BT * d.nv, attn_cast);
    residual_row_parallel(s, sv->h, x, attn, &L->linear.wo, d.BT, d.rows, d.D, partial);

    if (L->moe) return;  // moe_ffn_forward's
    norm_gathered(s, sv->hn, sv->rstd2, normed, sv->h, L->ffn_norm->data, d.rows, d.D,
                  a->norm_eps);
    linear_forward(&L->linear.w1, s, sv->gate, act(s, sv->hn), d.BT, 0);
    linear_forward(&L->linear.w3, s, sv->up, act(s, sv->hn), d.BT, 0);
    K->swiglu_forward(sv->act, s->act_dtype, sv->gate, sv->up, (size_t)d.BT * d.H);
    residual_row_parallel(s, y, sv->h, act(s, sv->act), &L->linear.w2, d.BT, d.rows, d.D,
                          partial);
}

// y = h + MoE(ffn_norm(h)) on this rank's rows (the router and the experts are replicated over
// tp, their grads summed over it as the norms'; under expert parallel the experts are sharded
// over ep instead): the layer carves what it keeps and its scratch itself.
static void moe_ffn_forward(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d, float *y) {
    if (!step_sizing(s)) {
        s->k->rmsnorm_forward(sv->hn, DTYPE_FP32, sv->rstd2, sv->h, L->ffn_norm->data, d.rows,
                              d.D, L->args->norm_eps);
        copy(s, y, sv->h, (size_t)d.rows * d.D);
    }
    moe_forward(L->moe, s, &sv->moe, sv->hn, y, d.rows);
}

// dh (rows, D) = dy + ffn_norm's backward of the MoE's input gradient (on this rank's rows, no
// reduce-scatter); every MoE gradient is taken here. dhn: (rows, D) scratch.
static void moe_ffn_backward(DecoderLayer *L, StepCtx *s, const LayerSaved *sv, LayerDims d,
                             const float *dy, float *dhn, float *dh) {
    size_t n = (size_t)d.rows * d.D;
    if (!step_sizing(s)) zero(s, dhn, n);
    moe_backward(L->moe, s, &sv->moe, sv->hn, dy, dhn, d.rows);
    if (step_sizing(s)) return;
    copy(s, dh, dy, n);
    s->k->rmsnorm_backward(dh, L->ffn_norm->grad, dhn, sv->h, L->ffn_norm->data, sv->rstd2,
                           d.rows, d.D);
}

// The tensors forward computes cheaply from others it keeps: the normed inputs (from the
// block's input x and h, with their 1/rms) and SwiGLU's output (from gate and up).
typedef struct {
    bool xn, hn, act;
} LayerCheap;

// Those that selective per-op checkpointing (Block.recompute_cheap) recomputes in backward
// instead of keeping. Not the normed inputs under TP, whose recompute would repeat their
// all-gather, nor a MoE layer's (fp32, read by its router and experts, which keep their own).
static LayerCheap layer_recomputed(const Block *b, const DecoderLayer *L, const StepCtx *s) {
    bool on = b->recompute_cheap, dense = !L->moe;
    return (LayerCheap){on && !s->tp, on && dense && !s->tp, on && dense};
}

// Carves the cheap tensors `which` names (the MoE layer's normed input is fp32 rows).
static void layer_carve_cheap(const DecoderLayer *L, const StepCtx *s, LayerSaved *sv,
                              LayerDims d, LayerCheap which) {
    if (which.xn) sv->xn = act_carve(s, (size_t)d.BT * d.D);
    if (which.hn)
        sv->hn = L->moe ? arena_floats(s->act, (size_t)d.rows * d.D)
                        : act_carve(s, (size_t)d.BT * d.D);
    if (which.act) sv->act = act_carve(s, (size_t)d.BT * d.H);
}

// Recomputes the normed inputs `which` names with forward's calls on the same inputs: the
// same bits. SwiGLU's output comes again from its backward (ffn_grads), which reads the same
// gate and up.
static void layer_recompute_cheap(const DecoderLayer *L, const StepCtx *s, LayerSaved *sv,
                                  LayerDims d, const float *x, LayerCheap which) {
    float eps = L->args->norm_eps;
    if (which.xn)
        norm_gathered(s, sv->xn, sv->rstd1, NULL, x, L->attention_norm->data, d.rows, d.D, eps);
    if (which.hn)
        norm_gathered(s, sv->hn, sv->rstd2, NULL, sv->h, L->ffn_norm->data, d.rows, d.D, eps);
}

static void layer_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    DecoderLayer *L = b->self;
    LayerDims d = layer_dims(L, s);
    LayerSaved *sv = saved;
    Arena *A = s->act;
    LayerCheap recomputed = layer_recomputed(b, L, s);
    layer_carve_cheap(L, s, sv, d, (LayerCheap){!recomputed.xn, !recomputed.hn,
                                                !L->moe && !recomputed.act});
    sv->rstd1 = arena_floats(A, d.rows);
    if (L->mla.on) {
        mla_carve(L->args, s, &sv->mla, d);
    } else {
        sv->q = arena_floats(A, (size_t)d.BT * d.nq);
        sv->k = arena_floats(A, (size_t)d.BT * d.nkv);
        sv->v = arena_floats(A, (size_t)d.BT * d.nkv);
        sv->lse = arena_floats(A, (size_t)d.BT * d.nh);
    }
    sv->attn = arena_floats(A, (size_t)d.BT * d.nv);
    sv->h = arena_floats(A, (size_t)d.rows * d.D);
    sv->rstd2 = arena_floats(A, d.rows);
    if (!L->moe) {
        sv->gate = arena_floats(A, (size_t)d.BT * d.H);
        sv->up = arena_floats(A, (size_t)d.BT * d.H);
    }
    if (L->q_norm) {
        sv->q0 = arena_floats(A, (size_t)d.BT * d.nq);
        sv->k0 = arena_floats(A, (size_t)d.BT * d.nkv);
        sv->q_rstd = arena_floats(A, (size_t)d.BT * d.nh);
        sv->k_rstd = arena_floats(A, (size_t)d.BT * d.nkvh);
    }
    size_t saved_end = arena_mark(A);  // the recomputed, workspace and comm buffers are scratch
    layer_carve_cheap(L, s, sv, d, recomputed);
    void *workspace = arena_alloc(A, decoder_attention_workspace(s, d));
    float *comm = s->tp ? arena_floats(A, (size_t)(d.rows + d.BT) * d.D) : NULL;
    void *attn_cast = s->act_dtype != DTYPE_FP32 ? act_carve(s, (size_t)d.BT * d.nv) : NULL;
    float *mla_scratch = L->mla.on ? arena_floats(A, mla_forward_scratch(L->args, d)) : NULL;
    layer_linears_reserve(L, s, d);
    if (!step_sizing(s))
        layer_forward_compute(L, s, sv, d, x, y, workspace, comm, attn_cast, mla_scratch);
    arena_release(A, saved_end);
    if (L->moe) moe_ffn_forward(L, s, sv, d, y);
}

// The backward of a transformer block comes in three pieces per sublayer: the gradients of
// the projections' outputs and of the normed input (input part), the weight gradients from
// them (weight part), and the norm's backward into the residual stream (input part; the
// rmsnorm kernel gives the norm weight's gradient with it, at no cost to defer).

// `room` + n elements of the activations' dtype, or NULL when they are fp32 (no casts).
static void *room_at(const StepCtx *s, void *room, size_t n) {
    return room ? (char *)room + n * dtype_size(s->act_dtype) : NULL;
}

// The casts a backward sublayer keeps for its GEMMs, in elements of the activations' dtype:
// none in fp32. The FFN's: dy's rows, dgate and dup.
static size_t ffn_casts(const StepCtx *s, LayerDims d) {
    return s->act_dtype == DTYPE_FP32 ? 0 : (size_t)d.BT * (d.D + 2 * (size_t)d.H);
}

// y = h + act W2^T, act = silu(hn W1^T) * (hn W3^T), hn = ffn_norm(h). Returns dhn (BT, D) in
// scratch; keeps dy's rows (gathered into `gathered` under TP), dgate and dup in sv->g, in the
// activations' dtype (cast into casts, ffn_casts of them). act_again: act was not kept
// (selective checkpointing) and is made again into sv->act by SwiGLU's backward.
static float *ffn_grads(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d, const float *dy,
                        float *scratch, float *gathered, void *casts, bool act_again) {
    const KernelOps *K = s->k;
    LayerGrads *g = &sv->g;
    size_t nh = (size_t)d.BT * d.H, nd = (size_t)d.BT * d.D;
    float *dact = scratch, *dgate = dact + nh, *dup = dgate + nh, *dhn = dup + nh;
    g->dy_all = grad_gathered_act(s, dy, gathered, gathered, casts, d.rows, d.D);
    linear_backward_input(&L->linear.w2, s, dact, g->dy_all, d.BT, 0);
    bool fp32 = s->act_dtype == DTYPE_FP32;  // else straight into the kept casts
    void *dg = fp32 ? (void *)dgate : room_at(s, casts, nd);
    void *du = fp32 ? (void *)dup : room_at(s, casts, nd + nh);
    K->swiglu_backward(dg, du, act_again ? sv->act : NULL, s->act_dtype, dact, sv->gate, sv->up,
                       nh);
    g->dgate = act(s, dg);
    g->dup = act(s, du);
    linear_backward_input(&L->linear.w1, s, dhn, g->dgate, d.BT, 0);
    linear_backward_input(&L->linear.w3, s, dhn, g->dup, d.BT, 1);
    return dhn;
}

static void ffn_weights(DecoderLayer *L, StepCtx *s, const LayerSaved *sv, LayerDims d) {
    const LayerGrads *g = &sv->g;
    linear_backward_weight(&L->linear.w2, s, g->dy_all, act(s, sv->act), d.BT);
    linear_backward_weight(&L->linear.w1, s, g->dgate, act(s, sv->hn), d.BT);
    linear_backward_weight(&L->linear.w3, s, g->dup, act(s, sv->hn), d.BT);
}

// dh (rows, D) = dy + ffn_norm's backward of dhn; comm (BT, D) under TP.
static void ffn_norm_backward(DecoderLayer *L, StepCtx *s, const LayerSaved *sv, LayerDims d,
                              const float *dy, const float *dhn, float *dh, float *comm) {
    copy(s, dh, dy, (size_t)d.rows * d.D);
    norm_backward_reduced(s, dh, L->ffn_norm->grad, dhn, comm, sv->h, L->ffn_norm->data,
                          sv->rstd2, d.rows, d.D);
}

// The attention sublayer's casts: dh's rows, the attention output, and grouped-query
// attention's dq0, dk0 and dv (MLA casts its own).
static size_t attention_casts(const DecoderLayer *L, const StepCtx *s, LayerDims d) {
    if (s->act_dtype == DTYPE_FP32) return 0;
    size_t projections = L->mla.on ? 0 : (size_t)d.nq + 2 * (size_t)d.nkv;
    return (size_t)d.BT * (d.D + (size_t)d.nv + projections);
}

// Its fp32 scratch: dattn (nv) and dxn (D), and grouped-query attention's q, k, v gradients
// before and after RoPE.
static size_t attention_floats(const DecoderLayer *L, LayerDims d) {
    size_t projections = L->mla.on ? 0 : 2 * (size_t)d.nq + 3 * (size_t)d.nkv;
    return (size_t)d.BT * ((size_t)d.nv + d.D + projections);
}

// dxn (BT, D) += the gradient of grouped-query attention's input from dattn (BT, nq), the
// gradient of its output; keeps the projections' gradients dq0, dk0 and dv in sv->g, in the
// activations' dtype (cast into casts, nq + 2 nkv of them). scratch: (BT, 2 nq + 3 nkv).
static void gqa_grads(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d,
                      const float *dattn, float *dxn, float *scratch, void *workspace,
                      void *casts) {
    const KernelOps *K = s->k;
    LayerGrads *g = &sv->g;
    size_t nq = (size_t)d.BT * d.nq, nkv = (size_t)d.BT * d.nkv;
    float *dq = scratch, *dk = dq + nq, *dv = dk + nkv, *dq0 = dv + nkv, *dk0 = dq0 + nq;
    decoder_attention_backward(s, d, dq, dk, dv, dattn, sv->q, sv->k, sv->v, sv->attn, sv->lse,
                               workspace);
    const int *pos = token_batch(s)->pos;
    K->rope_backward(dq0, dq, L->rope_cos, L->rope_sin, pos, d.BT, s->T, d.nh, d.hd);
    K->rope_backward(dk0, dk, L->rope_cos, L->rope_sin, pos, d.BT, s->T, d.nkvh, d.hd);
    if (L->q_norm) {  // dq and dk are free again: they take the projections' gradients
        qk_norm_backward(L, s, sv, d, dq, dq0);
        dq0 = dq;
        dk0 = dk;
    }
    g->dq0 = act_cast(s, dq0, nq, casts);
    g->dk0 = act_cast(s, dk0, nkv, room_at(s, casts, nq));
    g->dv = act_cast(s, dv, nkv, room_at(s, casts, nq + nkv));
    linear_backward_input(&L->linear.wq, s, dxn, g->dq0, d.BT, 0);
    linear_backward_input(&L->linear.wk, s, dxn, g->dk0, d.BT, 1);
    linear_backward_input(&L->linear.wv, s, dxn, g->dv, d.BT, 1);
}

// h = x + attn Wo^T, attn the attention (grouped-query or MLA) of xn = norm(x). Returns dxn
// (BT, D) in scratch (attention_floats of it); keeps dh's rows and the attention output in
// sv->g, in the activations' dtype (cast into casts, attention_casts of them). MLA takes its
// weights' gradients here; a sizing pass only carves MLA's scratch.
static float *attention_grads(DecoderLayer *L, StepCtx *s, LayerSaved *sv, LayerDims d,
                              const float *dh, float *scratch, void *workspace, float *gathered,
                              void *casts) {
    LayerGrads *g = &sv->g;
    size_t nv = (size_t)d.BT * d.nv, nd = (size_t)d.BT * d.D;
    float *dattn = scratch, *dxn = scratch ? dattn + nv : NULL;  // a sizing pass's are NULL
    if (!step_sizing(s)) {
        g->dh_all = grad_gathered_act(s, dh, gathered, gathered, casts, d.rows, d.D);
        g->attn = act_cast(s, sv->attn, nv, room_at(s, casts, nd));
        linear_backward_input(&L->linear.wo, s, dattn, g->dh_all, d.BT, 0);
    }
    if (L->mla.on)
        mla_backward(L->args, &L->mla, L->rope_cos, L->rope_sin, s, &sv->mla, d,
                     act(s, sv->xn), dattn, dxn, workspace);
    else if (!step_sizing(s))
        gqa_grads(L, s, sv, d, dattn, dxn, dxn + nd, workspace, room_at(s, casts, nd + nv));
    return dxn;
}

static void attention_weights(DecoderLayer *L, StepCtx *s, const LayerSaved *sv, LayerDims d) {
    const LayerGrads *g = &sv->g;
    linear_backward_weight(&L->linear.wo, s, g->dh_all, g->attn, d.BT);
    if (L->mla.on) return;  // taken with the input gradients
    linear_backward_weight(&L->linear.wq, s, g->dq0, act(s, sv->xn), d.BT);
    linear_backward_weight(&L->linear.wk, s, g->dk0, act(s, sv->xn), d.BT);
    linear_backward_weight(&L->linear.wv, s, g->dv, act(s, sv->xn), d.BT);
}

// dx (rows, D) += dh + attention_norm's backward of dxn; comm (BT, D) under TP.
static void attention_norm_backward(DecoderLayer *L, StepCtx *s, const LayerSaved *sv,
                                    LayerDims d, const float *x, const float *dh,
                                    const float *dxn, float *dx, float *comm) {
    s->k->add(dx, dh, (size_t)d.rows * d.D);
    norm_backward_reduced(s, dx, L->attention_norm->grad, dxn, comm, x, L->attention_norm->data,
                          sv->rstd1, d.rows, d.D);
}

// The whole backward shares one scratch between the sublayers, and under TP one comm buffer
// for the gathered gradient rows and the reduced norm inputs, each sublayer's weight part
// running before the buffers are reused. The input part keeps each sublayer's scratch and
// gathered rows apart for the weight part, which runs later.
static void layer_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                           const float *dy, float *dx) {
    DecoderLayer *L = b->self;
    LayerSaved *sv = saved;
    LayerDims d = layer_dims(L, s);
    if (phase == BLOCK_BACKWARD_WEIGHT) {
        layer_linears_reserve(L, s, d);
        if (!step_sizing(s)) {
            if (!L->moe) ffn_weights(L, s, sv, d);
            attention_weights(L, s, sv, d);
        }
        return;
    }
    // What forward did not keep, carved first: the input part keeps it for the weight part.
    LayerCheap recomputed = layer_recomputed(b, L, s);
    layer_carve_cheap(L, s, sv, d, recomputed);
    if (!step_sizing(s)) layer_recompute_cheap(L, s, sv, d, x, recomputed);
    bool split = phase == BLOCK_BACKWARD_INPUT;
    // Each sublayer's scratch: its fp32 gradients, and its casts.
    size_t ffn_floats = (size_t)d.BT * (3 * (size_t)d.H + d.D);
    size_t attn_floats = attention_floats(L, d);
    size_t both = ffn_floats > attn_floats ? ffn_floats : attn_floats;
    size_t ffn_n = ffn_casts(s, d), attn_n = attention_casts(L, s, d);
    size_t both_casts = ffn_n > attn_n ? ffn_n : attn_n;
    size_t all_rows = (size_t)d.BT * d.D;
    float *dh = arena_floats(s->act, (size_t)d.rows * d.D);
    float *ffn = arena_floats(s->act, split ? ffn_floats : both);
    void *ffn_cast = arena_tensor(s->act, split ? ffn_n : both_casts, s->act_dtype);
    float *attn = split ? arena_floats(s->act, attn_floats) : ffn;
    void *attn_cast = split ? arena_tensor(s->act, attn_n, s->act_dtype) : ffn_cast;
    void *workspace = arena_alloc(s->act, decoder_attention_workspace(s, d));
    float *comm = s->tp ? arena_floats(s->act, all_rows) : NULL;
    float *dy_rows = split && s->tp ? arena_floats(s->act, all_rows) : comm;
    float *dh_rows = split && s->tp ? arena_floats(s->act, all_rows) : comm;
    layer_linears_reserve(L, s, d);
    if (L->moe) moe_ffn_backward(L, s, sv, d, dy, ffn, dh);
    if (!L->moe && !step_sizing(s)) {
        const float *dhn = ffn_grads(L, s, sv, d, dy, ffn, dy_rows, ffn_cast, recomputed.act);
        if (!split) ffn_weights(L, s, sv, d);
        ffn_norm_backward(L, s, sv, d, dy, dhn, dh, comm);
    }
    const float *dxn = attention_grads(L, s, sv, d, dh, attn, workspace, dh_rows, attn_cast);
    if (step_sizing(s)) return;
    if (!split) attention_weights(L, s, sv, d);
    attention_norm_backward(L, s, sv, d, x, dh, dxn, dx, comm);
}

// ---- head: logits = output(norm(x)), loss = mean cross-entropy -----------------------------
//
// The logits of the whole batch are BT x vocab floats (4 GiB for 8192 tokens of Llama 3's
// 128256): when they exceed HEAD_LOGITS_BYTES the head works on chunks of rows, computing each
// chunk's logits and loss in forward and again, for its gradient, in backward (a fused linear
// cross-entropy, as Liger-Kernel's, for one more output GEMM), so no loss holds more than one
// chunk of logits. Below the budget the logits are kept from forward to backward (one chunk).
// With multi-token prediction the head runs its MTP modules after the main loss, each with a
// loss of its own through the same output projection (DeepSeek-V3 §2.2): the 1 + mtp_layers
// losses share the budget.

#define HEAD_LOGITS_BYTES ((size_t)512 << 20)

static int head_chunk_rows(const DecoderHead *h, int BT) {
    int rows = h->args->loss_chunk_rows;
    if (rows <= 0) {
        size_t fit = HEAD_LOGITS_BYTES / (1 + (size_t)h->args->mtp_layers) /
                     ((size_t)h->args->vocab_size * sizeof(float));
        rows = fit > (size_t)BT ? BT : fit < 1 ? 1 : (int)fit;
    }
    return rows < BT ? rows : BT;
}

// Under tp without loss parallel every rank's vocab columns are gathered before the loss.
static bool logits_gathered(const StepCtx *s) { return s->tp && !s->tp->loss_parallel; }
// With it, the loss reads this rank's vocab slice (the slot's lse is set): a flag that holds
// while sizing too, when every carved pointer is NULL.
static bool vocab_parallel_loss(const StepCtx *s) { return s->tp && s->tp->loss_parallel; }

// A chunk of `rows` rows. The gather's scratch, needed only while logits are computed, is
// carved separately (head_chunk_scratch), after the mark of what forward keeps.
static HeadChunk head_chunk_carve(const DecoderHead *h, StepCtx *s, int rows) {
    size_t Vl = (size_t)h->output->shape[0], V = (size_t)h->args->vocab_size;
    HeadChunk c = {.logits = arena_floats(s->act, rows * Vl)};
    c.full = logits_gathered(s) ? arena_floats(s->act, rows * V) : c.logits;
    return c;
}

static void head_chunk_scratch(const DecoderHead *h, StepCtx *s, HeadChunk *c, int rows) {
    size_t V = (size_t)h->args->vocab_size;
    c->scratch = logits_gathered(s) ? arena_floats(s->act, (size_t)rows * V) : NULL;
}

// What one loss reads: its rows' norm, their targets (B*T) and loss mask (B*T, NULL: every
// target counts), and which MTP module's it is (0: the main model's; k: rows T - k and later of
// each sequence have no target).
typedef struct {
    const Param *norm;
    const int *targets, *mask;
    int depth;
} LossInput;

// What the microbatch's summed token losses are divided by (StepCtx.loss_tokens).
static double loss_tokens(const StepCtx *s) {
    return s->loss_tokens > 0 ? s->loss_tokens : (double)s->B * s->T;
}

// The chunk's logits of rows [r0, r0 + n).
static void head_chunk_logits(const DecoderHead *h, StepCtx *s, const LossSaved *sv,
                              const HeadChunk *c, int r0, int n) {
    int D = h->args->dim, Vl = (int)h->output->shape[0];
    linear_forward(&h->linear, s, c->logits, linear_act_at(act(s, sv->xn), (size_t)r0 * D), n, 0);
    if (logits_gathered(s)) s->tp->gather_columns(s->tp, c->logits, c->full, c->scratch, n, Vl);
}

// losses of rows [r0, r0 + n) from this rank's vocab slice of the logits, without gathering
// them (Megatron's vocab-parallel cross-entropy): the slices' log-sum-exps are merged as
// M + log sum exp(lse - M) over ranks, M their max, and only the target's owner contributes
// its logit. stats: 3n floats of scratch.
static void loss_parallel_forward(DecoderHead *h, StepCtx *s, LossSaved *sv,
                                  const int *targets, const float *logits, int r0, int n,
                                  float *stats) {
    float *max = stats, *sums = stats + n, *target_logit = sums + n;
    float *lse = sv->lse + r0, *losses = sv->losses + r0;
    s->k->cross_entropy_slice_forward(lse, target_logit, logits, targets + r0, n,
                                      (int)h->output->shape[0], vocab_start(h->output));
    copy(s, max, lse, n);
    s->tp->all_reduce_max(s->tp, max, n);
    s->k->cross_entropy_merge_exp(sums, lse, max, n);
    s->tp->all_reduce_sum(s->tp, sums, 2 * (size_t)n);  // the sums and the target logits
    s->k->cross_entropy_merge_finish(losses, lse, max, sums, target_logit, n);
}

static void head_chunk_loss(DecoderHead *h, StepCtx *s, LossSaved *sv, LossInput in,
                            const HeadChunk *c, int r0, int n, float *stats) {
    if (sv->lse)
        loss_parallel_forward(h, s, sv, in.targets, c->logits, r0, n, stats);
    else
        s->k->cross_entropy_forward(sv->losses + r0, c->full, in.targets + r0, n,
                                    h->args->vocab_size);
    if (in.depth) zero_tail_rows(s, sv->losses + r0, 1, r0, n, in.depth);
    if (in.mask) s->k->zero_masked_rows(sv->losses + r0, in.mask + r0, n, 1);
}

// One loss over x (rows, D): carves what it keeps into sv and returns the sum of its rows'
// losses. output: the main loss's, whose logits are the model's output when kept.
static double loss_forward(DecoderHead *h, StepCtx *s, LossSaved *sv, LossInput in,
                           const float *x, bool output) {
    const DecoderArgs *a = h->args;
    int BT = s->B * s->T, rows = step_rows(s), chunk = head_chunk_rows(h, BT);
    sv->xn = act_carve(s, (size_t)BT * a->dim);
    sv->rstd = arena_floats(s->act, rows);
    sv->losses = arena_floats(s->act, BT);
    sv->lse = vocab_parallel_loss(s) ? arena_floats(s->act, BT) : NULL;
    // One chunk: its logits stay for backward (and for s->output); several: scratch.
    sv->kept = chunk == BT ? head_chunk_carve(h, s, BT) : (HeadChunk){0};
    if (output) s->output = chunk == BT ? (sv->lse ? sv->kept.logits : sv->kept.full) : NULL;
    size_t mark = arena_mark(s->act);  // scratch from here
    void *normed = s->tp ? act_carve(s, (size_t)rows * a->dim) : NULL;
    HeadChunk c = chunk == BT ? sv->kept : head_chunk_carve(h, s, chunk);
    head_chunk_scratch(h, s, &c, chunk);
    float *stats = vocab_parallel_loss(s) ? arena_floats(s->act, 3 * (size_t)chunk) : NULL;
    linear_reserve(s, (const Linear *[]){&h->linear}, 1, chunk, s->act_dtype);
    double sum = 0;
    if (!step_sizing(s)) {
        norm_gathered(s, sv->xn, sv->rstd, normed, x, in.norm->data, rows, a->dim, a->norm_eps);
        for (int r0 = 0; r0 < BT; r0 += chunk) {
            int n = BT - r0 < chunk ? BT - r0 : chunk;
            head_chunk_logits(h, s, sv, &c, r0, n);
            head_chunk_loss(h, s, sv, in, &c, r0, n, stats);
        }
        sum = s->k->sum(sv->losses, BT);
    }
    arena_release(s->act, mark);
    return sum;
}

// Module k's inputs (from 1; at j = k - 1): token t + k and its target at each position t,
// and that token's embedding, looked up in the head's copy of the table (DecoderHead.embed).
static void mtp_inputs(DecoderHead *h, StepCtx *s, HeadSaved *sv, int j) {
    int BT = s->B * s->T;
    size_t rows = (size_t)step_rows(s) * h->args->dim;
    int *tokens = at(sv->tokens, (size_t)j * BT * sizeof(int));
    const TokenBatch *in = token_batch(s);
    if (!step_sizing(s)) {
        shift_ids(s, tokens, in->tokens, j + 1);
        shift_ids(s, at(sv->targets, (size_t)j * BT * sizeof(int)), in->targets, j + 1);
        if (in->loss_mask)
            shift_ids(s, at(sv->loss_mask, (size_t)j * BT * sizeof(int)), in->loss_mask, j + 1);
    }
    embed_rows(h->embed, s, at(sv->embed, j * rows * sizeof(float)), tokens);
}

// MTP module j's loss: its norm, its targets and loss mask shifted j + 1 positions.
static LossInput mtp_loss_input(const DecoderHead *h, const StepCtx *s, const HeadSaved *sv,
                                int j) {
    size_t at_j = (size_t)j * s->B * s->T * sizeof(int);
    return (LossInput){h->mtp[j].mtp_norm, at(sv->targets, at_j),
                       token_batch(s)->loss_mask ? at(sv->loss_mask, at_j) : NULL, j + 1};
}

static void head_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    (void)y;
    DecoderHead *h = b->self;
    HeadSaved *sv = saved;
    const DecoderArgs *a = h->args;
    int BT = s->B * s->T, K = a->mtp_layers;
    size_t rows = (size_t)step_rows(s) * a->dim;
    const int *mask = token_batch(s)->loss_mask;
    LossInput main = {h->norm, token_batch(s)->targets, mask, 0};
    double tokens = loss_tokens(s);
    double loss = loss_forward(h, s, &sv->main, main, x, true) / tokens;
    if (K) {
        sv->tokens = arena_alloc(s->act, (size_t)K * BT * sizeof(int));
        sv->targets = arena_alloc(s->act, (size_t)K * BT * sizeof(int));
        // (carved with or without a mask: the sizing pass has no batch to tell)
        sv->loss_mask = arena_alloc(s->act, (size_t)K * BT * sizeof(int));
        sv->embed = arena_floats(s->act, K * rows);
    }
    const float *prev = x;
    double mtp = 0;
    for (int j = 0; j < K; j++) {
        mtp_inputs(h, s, sv, j);
        mtp_forward(&h->mtp[j], s, &sv->mtp[j], prev, at(sv->embed, j * rows * sizeof(float)),
                    j + 1);
        mtp += loss_forward(h, s, &sv->mtp[j].loss, mtp_loss_input(h, s, sv, j), sv->mtp[j].y,
                            false) / tokens;
        prev = sv->mtp[j].out;
    }
    if (!step_sizing(s)) s->loss = loss + (K ? a->mtp_loss_weight * mtp / K : 0);
}

// dlogits of rows [r0, r0 + n), in place over the chunk's logits (this rank's vocab columns):
// from the merged log-sum-exp under loss parallel, else the full-vocab gradient's columns of
// this rank; zero on rows without a target.
static void head_chunk_dlogits(DecoderHead *h, StepCtx *s, const LossSaved *sv, LossInput in,
                               const HeadChunk *c, int r0, int n, float dloss) {
    int V = h->args->vocab_size, Vl = (int)h->output->shape[0], first = vocab_start(h->output);
    const int *targets = in.targets + r0;
    if (sv->lse) {
        s->k->cross_entropy_slice_backward(c->logits, c->logits, sv->lse + r0, targets, n, Vl,
                                           first, dloss);
    } else {
        s->k->cross_entropy_backward(c->full, c->full, targets, n, V, dloss);
        if (logits_gathered(s))
            s->k->copy_rows(c->logits, Vl * sizeof(float), c->full + first, V * sizeof(float),
                            Vl * sizeof(float), n);
    }
    if (in.depth) zero_tail_rows(s, c->logits, (size_t)Vl, r0, n, in.depth);
    if (in.mask) s->k->zero_masked_rows(c->logits, in.mask + r0, n, (size_t)Vl);
}

// dx (rows, D) += the gradient of x of one loss, each of its rows' losses weighing dloss.
// The output weight's gradient is taken here (the input part): deferring it to the weight
// part would keep every chunk's logit gradients, the whole batch's logits the chunks avoid.
static void loss_backward(DecoderHead *h, StepCtx *s, const LossSaved *sv, LossInput in,
                          const float *x, float dloss, float *dx) {
    const DecoderArgs *a = h->args;
    int BT = s->B * s->T, rows = step_rows(s), D = a->dim, chunk = head_chunk_rows(h, BT);
    size_t mark = arena_mark(s->act);
    float *dxn = arena_floats(s->act, (size_t)BT * D);
    float *dxn_rows = s->tp ? arena_floats(s->act, (size_t)rows * D) : NULL;
    HeadChunk c = sv->kept;  // one chunk: the logits forward kept; else recomputed per chunk
    if (chunk < BT) {
        c = head_chunk_carve(h, s, chunk);
        head_chunk_scratch(h, s, &c, chunk);
    }
    size_t Vl = (size_t)h->output->shape[0];
    void *dlogits_cast = s->act_dtype != DTYPE_FP32 ? act_carve(s, (size_t)chunk * Vl) : NULL;
    linear_reserve(s, (const Linear *[]){&h->linear}, 1, chunk, s->act_dtype);
    if (!step_sizing(s)) {
        for (int r0 = 0; r0 < BT; r0 += chunk) {
            int n = BT - r0 < chunk ? BT - r0 : chunk;
            LinearAct xn = linear_act_at(act(s, sv->xn), (size_t)r0 * D);
            if (chunk < BT) head_chunk_logits(h, s, sv, &c, r0, n);
            head_chunk_dlogits(h, s, sv, in, &c, r0, n, dloss);
            LinearAct dlogits = act_cast(s, c.logits, (size_t)n * Vl, dlogits_cast);
            linear_backward_weight(&h->linear, s, dlogits, xn, n);
            linear_backward_input(&h->linear, s, dxn + (size_t)r0 * D, dlogits, n, 0);
        }
        norm_backward_reduced(s, dx, in.norm->grad, dxn, dxn_rows, x, in.norm->data, sv->rstd,
                              rows, D);
    }
    arena_release(s->act, mark);
}

// The MTP modules last to first, each module's gradient of its previous output flowing into
// the module before it (the head's input for the first) and of its input embeddings into the
// head's table, then the main loss.
static void head_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                          const float *dy, float *dx) {
    (void)dy;
    if (phase == BLOCK_BACKWARD_WEIGHT) return;
    DecoderHead *h = b->self;
    HeadSaved *sv = saved;
    const DecoderArgs *a = h->args;
    int BT = s->B * s->T, K = a->mtp_layers;
    size_t rows = (size_t)step_rows(s) * a->dim, bytes = rows * sizeof(float);
    // the module's y gradient, and its out gradient from the next module: two buffers in turn;
    // its embeddings' gradient (all rows under TP: full)
    float *dy_mtp = K ? arena_floats(s->act, rows) : NULL;
    float *douts[2] = {K > 1 ? arena_floats(s->act, rows) : NULL,
                       K > 1 ? arena_floats(s->act, rows) : NULL};
    float *dembed = K ? arena_floats(s->act, rows) : NULL;
    float *full = K && s->tp ? arena_floats(s->act, (size_t)BT * a->dim) : NULL;
    double tokens = loss_tokens(s);
    float dmtp = K ? (float)(s->loss_scale * a->mtp_loss_weight / K / tokens) : 0;
    for (int j = K - 1; j >= 0; j--) {
        const MtpSaved *m = &sv->mtp[j];
        float *dprev = j > 0 ? douts[j % 2] : dx;
        const float *dout = j + 1 < K ? douts[(j + 1) % 2] : NULL;
        const int *tokens = at(sv->tokens, (size_t)j * BT * sizeof(int));
        if (!step_sizing(s)) {
            zero(s, dy_mtp, rows);
            zero(s, dembed, rows);
            if (j > 0) zero(s, dprev, rows);
        }
        loss_backward(h, s, &m->loss, mtp_loss_input(h, s, sv, j), m->y, dmtp, dy_mtp);
        mtp_backward(&h->mtp[j], s, m, at(sv->embed, j * bytes), dy_mtp, dout, dembed, dprev,
                     j + 1);
        if (!step_sizing(s)) embed_rows_backward(h->embed, s, dembed, tokens, full);
    }
    LossInput main = {h->norm, token_batch(s)->targets, token_batch(s)->loss_mask, 0};
    loss_backward(h, s, &sv->main, main, x, s->loss_scale / (float)tokens, dx);
}

const BlockOps DECODER_EMBED_OPS = {"embed", 0, embed_forward, embed_backward};
const BlockOps DECODER_LAYER_OPS = {"transformer", sizeof(LayerSaved), layer_forward,
                                  layer_backward};
const BlockOps DECODER_HEAD_OPS = {"head", sizeof(HeadSaved), head_forward, head_backward};
