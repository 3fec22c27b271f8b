// Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek-V3; torchtitan's deepseek_v3
// Attention), forward and its backward written out. Per token:
//
//   q = xn Wq^T, or q_norm(xn Wq_a^T) Wq_b^T               (nh heads of qk = nope + rope)
//   [c, k_pe] = xn Wkv_a^T                                 (the latent C wide, one rope part)
//   [k_nope, v] = kv_norm(c) Wkv_b^T                       (nh heads of nope + v_head_dim)
//   k = [k_nope, rope(k_pe)] (k_pe the same in every head), q's rope part rotated likewise
//   out = softmax(scale q k^T) v, scale = mscale^2 / sqrt(qk) (mscale 1 without YaRN)
//
// The attention kernels take q, k and v of one head width, so v is zero-padded to qk (its
// output's pad columns are then zero and get no gradient) and the YaRN correction mscale^2 is
// applied to q, the kernels' 1/sqrt(qk) doing the rest: one seam for every backend and for
// context parallel's ring, for 1.5x v's bytes. RoPE reads contiguous heads, so the rope parts
// are copied out and back (strided copies). fp32 throughout but the projections' inputs, which
// are the activations' dtype as every Linear's.
#include <math.h>

#include "models/decoder/blocks.h"

typedef struct {
    int R, C, nope, rope, vd, qk;  // q_lora_rank, kv_lora_rank, head widths
} MlaWidths;

static MlaWidths mla_widths(const DecoderArgs *a) {
    const MlaArgs *m = &a->mla;
    return (MlaWidths){m->q_lora_rank, m->kv_lora_rank, m->qk_nope_head_dim,
                       m->qk_rope_head_dim, m->v_head_dim,
                       m->qk_nope_head_dim + m->qk_rope_head_dim};
}

double mla_scale_correction(const DecoderArgs *a) {
    if (a->yarn.factor <= 1) return 1.0;
    double m = 0.1 * a->mla.mscale * log(a->yarn.factor) + 1.0;
    return m * m;
}

void mla_dims(const DecoderArgs *a, LayerDims *d) {
    MlaWidths w = mla_widths(a);
    d->nh = d->nv / w.vd;
    d->nkvh = d->nh;
    d->nq = d->nkv = d->nh * w.qk;
}

void mla_carve(const DecoderArgs *a, const StepCtx *s, MlaSaved *sv, LayerDims d) {
    MlaWidths w = mla_widths(a);
    Arena *A = s->act;
    size_t BT = (size_t)d.BT;
    *sv = (MlaSaved){0};
    if (w.R) {
        sv->qa = arena_floats(A, BT * w.R);
        sv->qa_rstd = arena_floats(A, BT);
        sv->qa_n = act_carve(s, BT * w.R);
    }
    sv->c = arena_floats(A, BT * w.C);
    sv->c_rstd = arena_floats(A, BT);
    sv->c_n = act_carve(s, BT * w.C);
    sv->q = arena_floats(A, BT * d.nq);
    sv->k = arena_floats(A, BT * d.nq);
    sv->v = arena_floats(A, BT * d.nq);
    sv->out = arena_floats(A, BT * d.nq);
    sv->lse = arena_floats(A, BT * d.nh);
}

// Forward's scratch: Wkv_a's output (BT, C + rope), Wkv_b's (BT, nh (nope + vd)), and the rope
// parts of q (BT, nh rope), which k's (BT, rope) fits in.
size_t mla_forward_scratch(const DecoderArgs *a, LayerDims d) {
    MlaWidths w = mla_widths(a);
    return (size_t)d.BT * ((size_t)w.C + w.rope + (size_t)d.nh * (w.nope + w.vd) +
                           (size_t)d.nh * w.rope);
}

// Strided copies of `rows` rows of n floats between rows dst_ld and src_ld floats apart.
static void copy_cols(const StepCtx *s, float *dst, int dst_ld, const float *src, int src_ld,
                      int n, size_t rows) {
    s->k->copy_rows(dst, (size_t)dst_ld * sizeof(float), src, (size_t)src_ld * sizeof(float),
                    (size_t)n * sizeof(float), rows);
}

// RoPE over the rope parts (the last `rope` of each qk-wide head) of x (BT, heads * qk), in
// place through pe (BT, heads * rope): forward, or (backward) their gradient's R^T.
static void rope_parts(const StepCtx *s, MlaWidths w, float *x, int heads, int BT,
                       const float *cos, const float *sin, float *pe, bool backward) {
    size_t n = (size_t)BT * heads;
    const int *pos = token_batch(s)->pos;
    copy_cols(s, pe, w.rope, x + w.nope, w.qk, w.rope, n);
    if (backward)
        s->k->rope_backward(pe, pe, cos, sin, pos, BT, s->T, heads, w.rope);
    else
        s->k->rope_forward(pe, pe, cos, sin, pos, BT, s->T, heads, w.rope);
    copy_cols(s, x + w.nope, w.qk, pe, w.rope, w.rope, n);
}

void mla_forward(const DecoderArgs *a, const MlaWeights *wt, const float *rope_cos,
                 const float *rope_sin, StepCtx *s, MlaSaved *sv, LayerDims d, LinearAct xn,
                 float *out, void *scratch, void *workspace) {
    const KernelOps *K = s->k;
    MlaWidths w = mla_widths(a);
    int BT = d.BT, nh = d.nh, kv_ld = w.nope + w.vd;
    size_t rows = (size_t)BT * nh;
    float *kva = scratch, *kv = kva + (size_t)BT * (w.C + w.rope), *pe = kv + rows * kv_ld;
    // q, its rope parts rotated and the whole scaled
    if (w.R) {
        linear_forward(&wt->linear.wq_a, s, sv->qa, xn, BT, 0);
        K->rmsnorm_forward(sv->qa_n, s->act_dtype, sv->qa_rstd, sv->qa, wt->q_norm->data, BT, w.R,
                           a->mla.norm_eps);
        linear_forward(&wt->linear.wq_b, s, sv->q, act(s, sv->qa_n), BT, 0);
    } else {
        linear_forward(&wt->linear.wq, s, sv->q, xn, BT, 0);
    }
    rope_parts(s, w, sv->q, nh, BT, rope_cos, rope_sin, pe, false);
    float q_scale = (float)mla_scale_correction(a);
    if (q_scale != 1.0f) K->scale(sv->q, (size_t)BT * d.nq, q_scale);
    // the latent and k's rope part, shared by the heads
    linear_forward(&wt->linear.wkv_a, s, kva, xn, BT, 0);
    copy_cols(s, sv->c, w.C, kva, w.C + w.rope, w.C, BT);
    K->rmsnorm_forward(sv->c_n, s->act_dtype, sv->c_rstd, sv->c, wt->kv_norm->data, BT, w.C,
                       a->mla.norm_eps);
    copy_cols(s, pe, w.rope, kva + w.C, w.C + w.rope, w.rope, BT);
    K->rope_forward(pe, pe, rope_cos, rope_sin, token_batch(s)->pos, BT, s->T, 1, w.rope);
    // k = [k_nope, k_pe] and v padded, per head
    linear_forward(&wt->linear.wkv_b, s, kv, act(s, sv->c_n), BT, 0);
    copy_cols(s, sv->k, w.qk, kv, kv_ld, w.nope, rows);
    for (int h = 0; h < nh; h++)
        copy_cols(s, sv->k + (size_t)h * w.qk + w.nope, d.nq, pe, w.rope, w.rope, BT);
    K->zero(sv->v, (size_t)BT * d.nq * sizeof(float));
    copy_cols(s, sv->v, w.qk, kv + w.nope, kv_ld, w.vd, rows);
    decoder_attention_forward(s, d, sv->out, sv->lse, sv->q, sv->k, sv->v, workspace);
    copy_cols(s, out, w.vd, sv->out, w.qk, w.vd, rows);
}

int mla_linears(MlaWeights *w, Linear **out) {
    int n = 0;
    Linear *all[] = {&w->linear.wq, &w->linear.wq_a, &w->linear.wq_b, &w->linear.wkv_a,
                     &w->linear.wkv_b};
    for (int j = 0; j < 5; j++)
        if (all[j]->weight) out[n++] = all[j];
    return n;
}

// Backward's scratch, carved on top of the arena.
typedef struct {
    float *dout, *dq, *dk, *dv;  // (BT, nh qk) x4: the padded output's gradient, q, k, v's
    float *dkv;                  // (BT, nh (nope + vd)): Wkv_b's output's
    float *dkva;                 // (BT, C + rope): Wkv_a's output's
    float *pe, *pe2;             // (BT, nh rope), (BT, rope): rope parts, one head's
    float *dc_n, *dc;            // (BT, C) x2: kv_norm's output's and input's
    float *dqa_n, *dqa;          // with R: (BT, R) x2: q_norm's output's and input's
    void *cast_q, *cast_kv, *cast_kva, *cast_qa;  // their casts to the activations' dtype
} MlaGrads;

static MlaGrads mla_grads_carve(const StepCtx *s, MlaWidths w, LayerDims d) {
    Arena *A = s->act;
    size_t BT = (size_t)d.BT, nq = BT * d.nq, nkv = BT * d.nh * (w.nope + w.vd);
    size_t nkva = BT * (w.C + w.rope), npe = BT * d.nh * w.rope;
    bool cast = s->act_dtype != DTYPE_FP32;
    MlaGrads g = {.dout = arena_floats(A, nq), .dq = arena_floats(A, nq),
                  .dk = arena_floats(A, nq), .dv = arena_floats(A, nq),
                  .dkv = arena_floats(A, nkv), .dkva = arena_floats(A, nkva),
                  .pe = arena_floats(A, npe), .pe2 = arena_floats(A, BT * w.rope),
                  .dc_n = arena_floats(A, BT * w.C), .dc = arena_floats(A, BT * w.C)};
    if (w.R) {
        g.dqa_n = arena_floats(A, BT * w.R);
        g.dqa = arena_floats(A, BT * w.R);
    }
    if (cast) {
        g.cast_q = act_carve(s, nq);
        g.cast_kv = act_carve(s, nkv);
        g.cast_kva = act_carve(s, nkva);
        g.cast_qa = w.R ? act_carve(s, BT * w.R) : NULL;
    }
    return g;
}

// dkva's rope columns = RoPE's backward of the sum over heads of dk's rope parts (k_pe is
// every head's).
static void k_pe_backward(const StepCtx *s, MlaWidths w, LayerDims d, const MlaGrads *g,
                          const float *cos, const float *sin) {
    int BT = d.BT;
    size_t n = (size_t)BT * w.rope;
    float *sum = g->pe, *part = g->pe2;
    copy_cols(s, sum, w.rope, g->dk + w.nope, d.nq, w.rope, BT);
    for (int h = 1; h < d.nh; h++) {
        copy_cols(s, part, w.rope, g->dk + (size_t)h * w.qk + w.nope, d.nq, w.rope, BT);
        s->k->add(sum, part, n);
    }
    s->k->rope_backward(sum, sum, cos, sin, token_batch(s)->pos, BT, s->T, 1, w.rope);
    copy_cols(s, g->dkva + w.C, w.C + w.rope, sum, w.rope, w.rope, BT);
}

void mla_backward(const DecoderArgs *a, const MlaWeights *wt, const float *rope_cos,
                  const float *rope_sin, StepCtx *s, const MlaSaved *sv, LayerDims d,
                  LinearAct xn, const float *dout, float *dxn, void *workspace) {
    const KernelOps *K = s->k;
    MlaWidths w = mla_widths(a);
    size_t mark = arena_mark(s->act);
    MlaGrads g = mla_grads_carve(s, w, d);
    const Linear *linears[] = {&wt->linear.wq, &wt->linear.wkv_a, &wt->linear.wkv_b,
                               &wt->linear.wq_a, &wt->linear.wq_b};  // wq, or wq_a and wq_b
    linear_reserve(s, linears + (wt->wq ? 0 : 1), wt->wq ? 3 : 4, d.BT, s->act_dtype);
    if (step_sizing(s)) {
        arena_release(s->act, mark);
        return;
    }
    int BT = d.BT, kv_ld = w.nope + w.vd;
    size_t rows = (size_t)BT * d.nh, nq = (size_t)BT * d.nq;
    // attention, from the padded output's gradient
    K->zero(g.dout, nq * sizeof(float));
    copy_cols(s, g.dout, w.qk, dout, w.vd, w.vd, rows);
    decoder_attention_backward(s, d, g.dq, g.dk, g.dv, g.dout, sv->q, sv->k, sv->v, sv->out,
                               sv->lse, workspace);
    // the latent's path: Wkv_b's output gradient, kv_norm, Wkv_a's
    copy_cols(s, g.dkv, kv_ld, g.dk, w.qk, w.nope, rows);
    copy_cols(s, g.dkv + w.nope, kv_ld, g.dv, w.qk, w.vd, rows);
    LinearAct dkv = act_cast(s, g.dkv, rows * kv_ld, g.cast_kv);
    linear_backward_input(&wt->linear.wkv_b, s, g.dc_n, dkv, BT, 0);
    linear_backward_weight(&wt->linear.wkv_b, s, dkv, act(s, sv->c_n), BT);
    K->zero(g.dc, (size_t)BT * w.C * sizeof(float));
    K->rmsnorm_backward(g.dc, wt->kv_norm->grad, g.dc_n, sv->c, wt->kv_norm->data, sv->c_rstd, BT,
                        w.C);
    copy_cols(s, g.dkva, w.C + w.rope, g.dc, w.C, w.C, BT);
    k_pe_backward(s, w, d, &g, rope_cos, rope_sin);
    LinearAct dkva = act_cast(s, g.dkva, (size_t)BT * (w.C + w.rope), g.cast_kva);
    linear_backward_input(&wt->linear.wkv_a, s, dxn, dkva, BT, 0);
    linear_backward_weight(&wt->linear.wkv_a, s, dkva, xn, BT);
    // q's path: the scale, RoPE, then Wq or Wq_b, q_norm and Wq_a
    float q_scale = (float)mla_scale_correction(a);
    if (q_scale != 1.0f) K->scale(g.dq, nq, q_scale);
    rope_parts(s, w, g.dq, d.nh, BT, rope_cos, rope_sin, g.pe, true);
    LinearAct dq = act_cast(s, g.dq, nq, g.cast_q);
    if (w.R) {
        linear_backward_input(&wt->linear.wq_b, s, g.dqa_n, dq, BT, 0);
        linear_backward_weight(&wt->linear.wq_b, s, dq, act(s, sv->qa_n), BT);
        K->zero(g.dqa, (size_t)BT * w.R * sizeof(float));
        K->rmsnorm_backward(g.dqa, wt->q_norm->grad, g.dqa_n, sv->qa, wt->q_norm->data,
                            sv->qa_rstd, BT, w.R);
        LinearAct dqa = act_cast(s, g.dqa, (size_t)BT * w.R, g.cast_qa);
        linear_backward_input(&wt->linear.wq_a, s, dxn, dqa, BT, 1);
        linear_backward_weight(&wt->linear.wq_a, s, dqa, xn, BT);
    } else {
        linear_backward_input(&wt->linear.wq, s, dxn, dq, BT, 1);
        linear_backward_weight(&wt->linear.wq, s, dq, xn, BT);
    }
    arena_release(s->act, mark);
}
