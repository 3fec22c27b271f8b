// The sublayers FLUX's blocks share (layers.h): torchtitan's models/flux/model/layers.py, each
// backward its derivative written out.
#include "models/flux/layers.h"

#include "core/errors.h"

#define LAYERNORM_EPS 1e-6f  // FLUX's LayerNorm(elementwise_affine=False, eps=1e-6)
#define QK_NORM_EPS 1e-5f    // torchtitan's QKNorm: nn.RMSNorm with RMSNorm.Config's eps

// The share's text tokens are those of [first, first + count) below L, its image tokens the
// rest: a text run, then an image run, in each sample's rows.
// Tensor parallel splits the heads and the MLP's columns (flux_tp_check divides them).
FluxDims flux_dims(const FluxArgs *a, const FluxRope *share, const StepCtx *s) {
    int L = a->txt_len, first = share->first, count = share->count;
    int tp = s->tp ? s->tp->size : 1, H = a->num_heads / tp, M = flux_mlp_hidden(a) / tp;
    CHECK(s->T == 1 + count && (share->shares > 1) == (s->attn != NULL));
    CHECK(H * tp == a->num_heads && M * tp == flux_mlp_hidden(a));
    int end = first + count, txt_end = end < L ? end : L;
    int l = first < txt_end ? txt_end - first : 0;
    return (FluxDims){.B = s->B, .L = l, .N = count - l, .S = s->T, .Tj = count,
                      .D = a->hidden_size, .H = H, .hd = flux_head_dim(a), .M = M,
                      .A = H * flux_head_dim(a), .l0 = first,
                      .n0 = first + l > L ? first + l - L : 0, .L_all = L,
                      .N_all = flux_img_tokens(a), .shares = share->shares};
}

void flux_linear_forward(const FluxLinear *l, const StepCtx *s, float *y, const float *x,
                         int rows, float beta) {
    linear_forward(&l->linear, s, y, linear_fp32(x), rows, beta);
    if (l->bias) s->k->bias_add(y, l->bias->data, rows, flux_linear_out(l));
}

void flux_linear_forward_reduced(const FluxLinear *l, const StepCtx *s, float *y, const float *x,
                                 int rows) {
    linear_forward(&l->linear, s, y, linear_fp32(x), rows, 0);
    flux_tp_sum(s, y, (size_t)rows * flux_linear_out(l));
    if (l->bias) s->k->bias_add(y, l->bias->data, rows, flux_linear_out(l));
}

void flux_tp_sum(const StepCtx *s, float *x, size_t n) {
    if (s->tp) s->tp->all_reduce_sum(s->tp, x, n);
}

void flux_linear_backward(const FluxLinear *l, const StepCtx *s, float *dx, const float *dy,
                          const float *x, int rows, float beta) {
    if (dx) linear_backward_input(&l->linear, s, dx, linear_fp32(dy), rows, beta);
    linear_backward_weight(&l->linear, s, linear_fp32(dy), linear_fp32(x), rows);
    if (l->bias) s->k->bias_backward(l->bias->grad, dy, rows, flux_linear_out(l));
}

void flux_linears_reserve(const StepCtx *s, const FluxLinear *const *l, int n, int rows) {
    for (int i = 0; i < n; i++)
        linear_reserve(s, (const Linear *[]){&l[i]->linear}, 1, rows, DTYPE_FP32);
}

// ---- rows of the hidden state ------------------------------------------------------------

// Each sample's `count` rows are contiguous: one strided copy moves all samples' blocks.
void flux_rows_gather(const StepCtx *s, float *dst, const float *src, int B, int total,
                      int first, int count, int D) {
    size_t block = (size_t)count * D * sizeof(float), pitch = (size_t)total * D * sizeof(float);
    s->k->copy_rows(dst, block, src + (size_t)first * D, pitch, block, (size_t)B);
}

void flux_rows_scatter(const StepCtx *s, float *dst, const float *src, int B, int total,
                       int first, int count, int D) {
    size_t block = (size_t)count * D * sizeof(float), pitch = (size_t)total * D * sizeof(float);
    s->k->copy_rows(dst + (size_t)first * D, pitch, src, block, block, (size_t)B);
}

// ---- the conditioning vector -------------------------------------------------------------

void flux_cond_carve(const StepCtx *s, FluxCond *c, FluxDims d) {
    c->vec = arena_floats(s->act, (size_t)d.B * d.D);
    c->svec = arena_floats(s->act, (size_t)d.B * d.D);
}

void flux_cond_forward(const StepCtx *s, FluxCond *c, const float *x, float *y, FluxDims d) {
    flux_rows_gather(s, c->vec, x, d.B, d.S, 0, 1, d.D);
    s->k->silu_forward(c->svec, c->vec, (size_t)d.B * d.D);
    if (y) flux_rows_scatter(s, y, c->vec, d.B, d.S, 0, 1, d.D);
}

void flux_cond_backward(const StepCtx *s, const FluxCond *c, float *dx, const float *dy,
                        const float *dsvec, float *scratch, FluxDims d) {
    size_t n = (size_t)d.B * d.D;
    if (dy)
        flux_rows_gather(s, scratch, dy, d.B, d.S, 0, 1, d.D);
    else
        s->k->zero(scratch, n * sizeof(float));
    s->k->silu_backward(scratch, dsvec, c->vec, n);
    flux_rows_scatter(s, dx, scratch, d.B, d.S, 0, 1, d.D);
}

// ---- adaLN ---------------------------------------------------------------------------------

void flux_norm_carve(const StepCtx *s, FluxNorm *n, int rows, int D) {
    n->mean = arena_floats(s->act, (size_t)rows);
    n->rstd = arena_floats(s->act, (size_t)rows);
    n->normed = arena_floats(s->act, (size_t)rows * D);
}

void flux_adaln_forward(const StepCtx *s, FluxNorm *n, float *out, const float *x,
                        const float *shift, const float *scale, int mod_ld, int B, int T, int D) {
    s->k->layernorm_forward(n->normed, n->mean, n->rstd, x, B * T, D, LAYERNORM_EPS);
    s->k->modulate_forward(out, n->normed, shift, scale, mod_ld, B, T, D);
}

void flux_adaln_backward(const StepCtx *s, const FluxNorm *n, float *dx, float *dshift,
                         float *dscale, const float *dout, const float *x, const float *scale,
                         int mod_ld, int B, int T, int D, float *scratch) {
    s->k->zero(scratch, (size_t)B * T * D * sizeof(float));
    s->k->modulate_backward(scratch, dshift, dscale, dout, n->normed, scale, mod_ld, B, T, D);
    s->k->layernorm_backward(dx, scratch, x, n->mean, n->rstd, B * T, D);
}

// ---- QK-norm -------------------------------------------------------------------------------

void flux_qk_carve(const StepCtx *s, FluxQk *qk, int rows, FluxDims d) {
    qk->q0 = arena_floats(s->act, (size_t)rows * d.A);
    qk->k0 = arena_floats(s->act, (size_t)rows * d.A);
    qk->q_rstd = arena_floats(s->act, (size_t)rows * d.H);
    qk->k_rstd = arena_floats(s->act, (size_t)rows * d.H);
}

// Column block `col` (w wide) of m (rows, ld) into dst (rows, w), and back.
static void columns_get(const StepCtx *s, float *dst, const float *m, int ld, int col, int rows,
                        int w) {
    size_t bytes = (size_t)w * sizeof(float);
    s->k->copy_rows(dst, bytes, m + col, (size_t)ld * sizeof(float), bytes, (size_t)rows);
}

static void columns_put(const StepCtx *s, float *m, int ld, int col, const float *src, int rows,
                        int w) {
    size_t bytes = (size_t)w * sizeof(float);
    s->k->copy_rows(m + col, (size_t)ld * sizeof(float), src, bytes, bytes, (size_t)rows);
}

// torchtitan's rearrange "B L (K H D) -> K B L H D": q, k, v are qkv's column blocks 0, A, 2A
// (under tensor parallel the fused weight's blocked Shard gives each rank its heads of each).
void flux_qk_forward(const StepCtx *s, FluxQk *qk, float *q, float *k, float *v, const float *qkv,
                     int ld, int rows, const Param *q_norm, const Param *k_norm, FluxDims d) {
    columns_get(s, qk->q0, qkv, ld, 0, rows, d.A);
    columns_get(s, qk->k0, qkv, ld, d.A, rows, d.A);
    columns_get(s, v, qkv, ld, 2 * d.A, rows, d.A);
    s->k->rmsnorm_forward(q, DTYPE_FP32, qk->q_rstd, qk->q0, q_norm->data, rows * d.H, d.hd,
                          QK_NORM_EPS);
    s->k->rmsnorm_forward(k, DTYPE_FP32, qk->k_rstd, qk->k0, k_norm->data, rows * d.H, d.hd,
                          QK_NORM_EPS);
}

void flux_qk_backward(const StepCtx *s, const FluxQk *qk, float *dqkv, int ld, const float *dq,
                      const float *dk, const float *dv, int rows, Param *q_norm, Param *k_norm,
                      FluxDims d, float *scratch) {
    size_t n = (size_t)rows * d.A;
    float *dq0 = scratch, *dk0 = scratch + n;
    s->k->zero(scratch, 2 * n * sizeof(float));
    s->k->rmsnorm_backward(dq0, q_norm->grad, dq, qk->q0, q_norm->data, qk->q_rstd, rows * d.H,
                           d.hd);
    s->k->rmsnorm_backward(dk0, k_norm->grad, dk, qk->k0, k_norm->data, qk->k_rstd, rows * d.H,
                           d.hd);
    columns_put(s, dqkv, ld, 0, dq0, rows, d.A);
    columns_put(s, dqkv, ld, d.A, dk0, rows, d.A);
    columns_put(s, dqkv, ld, 2 * d.A, dv, rows, d.A);
}

// ---- joint attention -----------------------------------------------------------------------

void flux_attn_carve(const StepCtx *s, FluxAttn *a, FluxDims d) {
    size_t n = (size_t)d.B * d.Tj * d.A;
    a->q = arena_floats(s->act, n);
    a->k = arena_floats(s->act, n);
    a->v = arena_floats(s->act, n);
    a->out = arena_floats(s->act, n);
    a->lse = arena_floats(s->act, (size_t)d.B * d.H * d.Tj);
}

static AttnShape attn_shape(const StepCtx *s, FluxDims d) {
    return (AttnShape){.B = d.B, .Tq = d.Tj, .Tk = d.Tj, .n_heads = d.H, .n_kv_heads = d.H,
                       .head_dim = d.hd, .mask = ATTN_NONE, .compute = s->act_dtype};
}

// Under context parallel the share's queries see every rank's keys through StepCtx.attn.
size_t flux_attn_workspace(const StepCtx *s, FluxDims d) {
    AttnShape shape = attn_shape(s, d);
    if (s->attn) return s->attn->workspace_bytes(s->attn, s, &shape);
    return s->k->attention_workspace_bytes(&shape);
}

void flux_attn_forward(const StepCtx *s, FluxAttn *a, const FluxRope *rope, FluxDims d,
                       void *workspace) {
    int rows = d.B * d.Tj;
    s->k->rope_forward(a->q, a->q, rope->cos, rope->sin, rope->pos, rows, d.Tj, d.H, d.hd);
    s->k->rope_forward(a->k, a->k, rope->cos, rope->sin, rope->pos, rows, d.Tj, d.H, d.hd);
    AttnShape shape = attn_shape(s, d);
    if (s->attn)
        s->attn->forward(s->attn, s, a->out, a->lse, a->q, a->k, a->v, &shape, workspace);
    else
        s->k->attention_forward(a->out, a->lse, a->q, a->k, a->v, &shape, workspace);
}

void flux_attn_backward(const StepCtx *s, const FluxAttn *a, const FluxRope *rope, float *dq,
                        float *dk, float *dv, const float *dout, FluxDims d, void *workspace,
                        float *scratch) {
    int rows = d.B * d.Tj;
    size_t n = (size_t)rows * d.A;
    float *dq_rot = scratch, *dk_rot = scratch + n;
    s->k->zero(scratch, 2 * n * sizeof(float));
    s->k->zero(dv, n * sizeof(float));
    AttnShape shape = attn_shape(s, d);
    if (s->attn)
        s->attn->backward(s->attn, s, dq_rot, dk_rot, dv, dout, a->q, a->k, a->v, a->out, a->lse,
                          &shape, workspace);
    else
        s->k->attention_backward(dq_rot, dk_rot, dv, dout, a->q, a->k, a->v, a->out, a->lse,
                                 &shape, workspace);
    s->k->rope_backward(dq, dq_rot, rope->cos, rope->sin, rope->pos, rows, d.Tj, d.H, d.hd);
    s->k->rope_backward(dk, dk_rot, rope->cos, rope->sin, rope->pos, rows, d.Tj, d.H, d.hd);
}
