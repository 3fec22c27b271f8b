// FLUX's double-stream and single-stream blocks (torchtitan's DoubleStreamBlock and
// SingleStreamBlock), forward as the math and backward written out. Both read the vec row of
// each sample and pass it on (flux.h); their weight gradients are all taken in the input part
// of a split backward (BLOCK_BACKWARD_INPUT; the weight part has nothing left to do), where
// the scratch that holds the GEMMs' output gradients is still live.
#include "core/errors.h"
#include "models/flux/layers.h"

static void copy(const StepCtx *s, float *dst, const float *src, size_t n) {
    s->k->copy(dst, src, n * sizeof(float));
}
static void zero(const StepCtx *s, float *x, size_t n) { s->k->zero(x, n * sizeof(float)); }

// ---- double-stream block -------------------------------------------------------------------
//
// Each stream (txt, img) of each sample:
//   mod = mod_lin(silu(vec)) = shift1, scale1, gate1, shift2, scale2, gate2  (B, 6D)
//   q, k, v = QK-norm(split(qkv(adaLN(x; shift1, scale1))))
// the two streams' q, k, v joined per sample as [txt; img], RoPE, attention, split again; then
//   h = x + gate1 proj(attn)
//   out = h + gate2 mlp_out(gelu(mlp_in(adaLN(h; shift2, scale2))))
// Under tensor parallel qkv and mlp_in are column-parallel (this rank's heads, its MLP
// columns), proj and mlp_out row-parallel (their outputs summed over the ranks), the rest
// replicated and computed on every rank.

typedef struct {
    float *x;          // (rows, D): the stream's input rows
    float *mod;        // (B, 6D)
    FluxNorm n1;
    float *m1;         // (rows, D): qkv's input
    FluxQk qk;
    float *attn;       // (rows, A): the stream's attention output, proj's input
    float *p;          // (rows, D): proj's output
    float *h;          // (rows, D)
    FluxNorm n2;
    float *m2;         // (rows, D): mlp_in's input
    float *u, *g;      // (rows, M): mlp_in's output, gelu(u) (this rank's columns)
    float *o;          // (rows, D): mlp_out's output
} StreamSaved;

typedef struct {
    FluxCond cond;
    StreamSaved txt, img;
    FluxAttn attn;
} DoubleSaved;

// A stream's rows: where they sit in each sample of the hidden state (first) and of the joint
// sequence (first - 1), and how many (none on a context-parallel rank whose share holds none
// of the stream's tokens: the stream is skipped there, its weights take no gradient).
typedef struct {
    FluxStream *w;
    StreamSaved *sv;
    int first, count, rows;
} StreamRef;

static StreamRef stream_ref(FluxDouble *blk, DoubleSaved *sv, FluxDims d, bool img) {
    if (img) return (StreamRef){&blk->img, &sv->img, 1 + d.L, d.N, d.B * d.N};
    return (StreamRef){&blk->txt, &sv->txt, 1, d.L, d.B * d.L};
}

static void stream_carve(const StepCtx *s, StreamSaved *sv, int rows, FluxDims d) {
    Arena *A = s->act;
    size_t n = (size_t)rows * d.D, nm = (size_t)rows * d.M;
    sv->x = arena_floats(A, n);
    sv->mod = arena_floats(A, (size_t)d.B * 6 * d.D);
    flux_norm_carve(s, &sv->n1, rows, d.D);
    sv->m1 = arena_floats(A, n);
    flux_qk_carve(s, &sv->qk, rows, d);
    sv->attn = arena_floats(A, (size_t)rows * d.A);
    sv->p = arena_floats(A, n);
    sv->h = arena_floats(A, n);
    flux_norm_carve(s, &sv->n2, rows, d.D);
    sv->m2 = arena_floats(A, n);
    sv->u = arena_floats(A, nm);
    sv->g = arena_floats(A, nm);
    sv->o = arena_floats(A, n);
}

static void stream_reserve(const StepCtx *s, const FluxStream *w, int rows, int B) {
    const FluxLinear *tokens[] = {&w->qkv, &w->proj, &w->mlp_in, &w->mlp_out};
    flux_linears_reserve(s, tokens, 4, rows);
    flux_linears_reserve(s, (const FluxLinear *[]){&w->mod}, 1, B);
}

// Up to the joint attention: the stream's q, k, v into the joint tensors. scratch: (rows, 3A)
// for qkv's output, then 3 (rows, A) for q, k, v.
static void stream_qkv(const StepCtx *s, StreamRef r, const FluxCond *c, const float *x,
                       FluxAttn *attn, FluxDims d, float *scratch) {
    StreamSaved *sv = r.sv;
    int D = d.D, ld = 6 * D;
    size_t n = (size_t)r.rows * d.A;
    float *qkv = scratch, *q = qkv + 3 * n, *k = q + n, *v = k + n;
    flux_rows_gather(s, sv->x, x, d.B, d.S, r.first, r.count, D);
    flux_linear_forward(&r.w->mod, s, sv->mod, c->svec, d.B, 0);
    flux_adaln_forward(s, &sv->n1, sv->m1, sv->x, sv->mod, sv->mod + D, ld, d.B, r.count, D);
    flux_linear_forward(&r.w->qkv, s, qkv, sv->m1, r.rows, 0);
    flux_qk_forward(s, &sv->qk, q, k, v, qkv, 3 * d.A, r.rows, r.w->q_norm, r.w->k_norm, d);
    flux_rows_scatter(s, attn->q, q, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_rows_scatter(s, attn->k, k, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_rows_scatter(s, attn->v, v, d.B, d.Tj, r.first - 1, r.count, d.A);
}

// After the joint attention: the stream's rows of y. scratch: (rows, D).
static void stream_out(const StepCtx *s, StreamRef r, const FluxAttn *attn, float *y, FluxDims d,
                       float *scratch) {
    StreamSaved *sv = r.sv;
    int D = d.D, ld = 6 * D;
    size_t n = (size_t)r.rows * D;
    flux_rows_gather(s, sv->attn, attn->out, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_linear_forward_reduced(&r.w->proj, s, sv->p, sv->attn, r.rows);
    copy(s, sv->h, sv->x, n);
    s->k->gated_add_forward(sv->h, sv->p, sv->mod + 2 * D, ld, d.B, r.count, D);
    flux_adaln_forward(s, &sv->n2, sv->m2, sv->h, sv->mod + 3 * D, sv->mod + 4 * D, ld, d.B,
                       r.count, D);
    flux_linear_forward(&r.w->mlp_in, s, sv->u, sv->m2, r.rows, 0);
    s->k->gelu_tanh_forward(sv->g, sv->u, (size_t)r.rows * d.M);
    flux_linear_forward_reduced(&r.w->mlp_out, s, sv->o, sv->g, r.rows);
    copy(s, scratch, sv->h, n);
    s->k->gated_add_forward(scratch, sv->o, sv->mod + 5 * D, ld, d.B, r.count, D);
    flux_rows_scatter(s, y, scratch, d.B, d.S, r.first, r.count, D);
}

static void double_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    FluxDouble *blk = b->self;
    DoubleSaved *sv = saved;
    FluxDims d = flux_dims(blk->args, blk->rope, s);
    StreamRef streams[2] = {stream_ref(blk, sv, d, false), stream_ref(blk, sv, d, true)};
    flux_cond_carve(s, &sv->cond, d);
    for (int i = 0; i < 2; i++) stream_carve(s, streams[i].sv, streams[i].rows, d);
    flux_attn_carve(s, &sv->attn, d);
    size_t mark = arena_mark(s->act);  // scratch from here
    int rows = d.L > d.N ? d.B * d.L : d.B * d.N;
    float *scratch = arena_floats(s->act, (size_t)rows * 6 * d.D);
    void *workspace = arena_alloc(s->act, flux_attn_workspace(s, d));
    for (int i = 0; i < 2; i++) stream_reserve(s, streams[i].w, streams[i].rows, d.B);
    if (!step_sizing(s)) {
        flux_cond_forward(s, &sv->cond, x, y, d);
        for (int i = 0; i < 2; i++)
            if (streams[i].count) stream_qkv(s, streams[i], &sv->cond, x, &sv->attn, d, scratch);
        flux_attn_forward(s, &sv->attn, blk->rope, d, workspace);
        for (int i = 0; i < 2; i++)
            if (streams[i].count) stream_out(s, streams[i], &sv->attn, y, d, scratch);
    }
    arena_release(s->act, mark);
}

// (rows, D + max(M, D) + M): stream_out_backward's scratch.
static size_t out_scratch_floats(int rows, FluxDims d) {
    return (size_t)rows * (d.D + (d.M > d.D ? d.M : d.D) + d.M);
}

// A stream's gradients down to its attention output: dmod's gate1, shift2, scale2, gate2
// parts, dxs (rows, D) = the residual's share of the input gradient (dh), and the stream's
// rows of dattn (B*Tj, A). scratch: out_scratch_floats.
static void stream_out_backward(const StepCtx *s, StreamRef r, const float *dy, float *dmod,
                                float *dxs, float *dattn, FluxDims d, float *scratch) {
    StreamSaved *sv = r.sv;
    int D = d.D, ld = 6 * D;
    size_t n = (size_t)r.rows * D, nm = (size_t)r.rows * d.M;
    // dg also holds adaLN's scratch (rows, D) and proj's input gradient (rows, A)
    float *dm2 = scratch, *dp = dm2, *dg = dm2 + n;
    float *du = dg + (size_t)r.rows * (d.M > D ? d.M : D);
    float *dh = dxs;  // out = h + ...: dh starts as dy, then h = x + ...: dx starts as dh
    flux_rows_gather(s, dh, dy, d.B, d.S, r.first, r.count, D);
    zero(s, dm2, n);  // do, in dm2's room until mlp_out's backward has read it
    s->k->gated_add_backward(dm2, dmod + 5 * D, dh, sv->o, sv->mod + 5 * D, ld, d.B, r.count, D);
    flux_linear_backward(&r.w->mlp_out, s, dg, dm2, sv->g, r.rows, 0);
    zero(s, du, nm);
    s->k->gelu_tanh_backward(du, dg, sv->u, nm);
    flux_linear_backward(&r.w->mlp_in, s, dm2, du, sv->m2, r.rows, 0);
    flux_tp_sum(s, dm2, n);
    flux_adaln_backward(s, &sv->n2, dh, dmod + 3 * D, dmod + 4 * D, dm2, sv->h, sv->mod + 4 * D,
                        ld, d.B, r.count, D, dg);
    zero(s, dp, n);
    s->k->gated_add_backward(dp, dmod + 2 * D, dh, sv->p, sv->mod + 2 * D, ld, d.B, r.count, D);
    flux_linear_backward(&r.w->proj, s, dg, dp, sv->attn, r.rows, 0);
    flux_rows_scatter(s, dattn, dg, d.B, d.Tj, r.first - 1, r.count, d.A);
}

// (rows, D + max(8A, D)): stream_qkv_backward's scratch.
static size_t qkv_scratch_floats(int rows, FluxDims d) {
    return (size_t)rows * (d.D + (8 * d.A > d.D ? 8 * d.A : d.D));
}

// From the joint q, k, v gradients: the rest of the stream's input gradient into dxs, then its
// rows of dx, and dmod's shift1 and scale1 parts; the modulation's backward into dsvec.
// scratch: qkv_scratch_floats.
static void stream_qkv_backward(const StepCtx *s, StreamRef r, const FluxCond *c, const float *dq,
                                const float *dk, const float *dv, float *dmod, float *dxs,
                                float *dx, float *dsvec, FluxDims d, float *scratch) {
    StreamSaved *sv = r.sv;
    int D = d.D, ld = 6 * D;
    size_t n = (size_t)r.rows * d.A;
    // dqs .. norm_scratch (8 (rows, A)), dead once dm1 is computed, hold adaLN's scratch
    float *dm1 = scratch, *dqs = dm1 + (size_t)r.rows * D, *dks = dqs + n, *dvs = dks + n;
    float *dqkv = dvs + n, *norm_scratch = dqkv + 3 * n;
    flux_rows_gather(s, dqs, dq, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_rows_gather(s, dks, dk, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_rows_gather(s, dvs, dv, d.B, d.Tj, r.first - 1, r.count, d.A);
    flux_qk_backward(s, &sv->qk, dqkv, 3 * d.A, dqs, dks, dvs, r.rows, r.w->q_norm, r.w->k_norm,
                     d, norm_scratch);
    flux_linear_backward(&r.w->qkv, s, dm1, dqkv, sv->m1, r.rows, 0);
    flux_tp_sum(s, dm1, (size_t)r.rows * D);
    flux_adaln_backward(s, &sv->n1, dxs, dmod, dmod + D, dm1, sv->x, sv->mod + D, ld, d.B,
                        r.count, D, dqs);
    flux_rows_scatter(s, dx, dxs, d.B, d.S, r.first, r.count, D);
    flux_linear_backward(&r.w->mod, s, dsvec, dmod, c->svec, d.B, 1);
}

static void double_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                            const float *dy, float *dx) {
    (void)x;
    if (phase == BLOCK_BACKWARD_WEIGHT) return;  // taken with the input gradient
    FluxDouble *blk = b->self;
    DoubleSaved *sv = saved;
    FluxDims d = flux_dims(blk->args, blk->rope, s);
    StreamRef streams[2] = {stream_ref(blk, sv, d, false), stream_ref(blk, sv, d, true)};
    size_t joint = (size_t)d.B * d.Tj * d.A, bd = (size_t)d.B * d.D;
    int rows = d.L > d.N ? d.B * d.L : d.B * d.N;
    float *dmod[2], *dxs[2];
    for (int i = 0; i < 2; i++) {
        dmod[i] = arena_floats(s->act, bd * 6);
        dxs[i] = arena_floats(s->act, (size_t)streams[i].rows * d.D);
    }
    float *dsvec = arena_floats(s->act, bd);
    float *dattn = arena_floats(s->act, joint), *dq = arena_floats(s->act, joint);
    float *dk = arena_floats(s->act, joint), *dv = arena_floats(s->act, joint);
    size_t out_scratch = out_scratch_floats(rows, d), qkv_scratch = qkv_scratch_floats(rows, d);
    size_t stream_scratch = out_scratch > qkv_scratch ? out_scratch : qkv_scratch;
    float *scratch = arena_floats(s->act, stream_scratch > 2 * joint ? stream_scratch : 2 * joint);
    void *workspace = arena_alloc(s->act, flux_attn_workspace(s, d));
    for (int i = 0; i < 2; i++) stream_reserve(s, streams[i].w, streams[i].rows, d.B);
    if (step_sizing(s)) return;
    zero(s, dsvec, bd);
    for (int i = 0; i < 2; i++) {
        zero(s, dmod[i], bd * 6);
        if (streams[i].count)
            stream_out_backward(s, streams[i], dy, dmod[i], dxs[i], dattn, d, scratch);
    }
    flux_attn_backward(s, &sv->attn, blk->rope, dq, dk, dv, dattn, d, workspace, scratch);
    for (int i = 0; i < 2; i++)
        if (streams[i].count)
            stream_qkv_backward(s, streams[i], &sv->cond, dq, dk, dv, dmod[i], dxs[i], dx,
                                dsvec, d, scratch);
    flux_cond_backward(s, &sv->cond, dx, dy, dsvec, scratch, d);
}

// ---- single-stream block -------------------------------------------------------------------
//
// On the joint sequence xj (B*Tj, D) of each sample:
//   mod = mod_lin(silu(vec)) = shift, scale, gate  (B, 3D)
//   [qkv | u] = linear1(adaLN(xj; shift, scale))
//   q, k, v = QK-norm(split(qkv)), RoPE, attention -> a
//   out = xj + gate linear2([a | gelu(u)])
// Under tensor parallel linear1 is column-parallel (its blocked Shard gives this rank its heads
// of q, k, v and its MLP columns: qkv (rows, 3A), u (rows, M)) and linear2 row-parallel over
// [a | gelu(u)]'s matching columns (rows, A + M).

typedef struct {
    FluxCond cond;
    float *xj;         // (B*Tj, D)
    float *mod;        // (B, 3D)
    FluxNorm n;
    float *m;          // (B*Tj, D): linear1's input
    FluxQk qk;
    FluxAttn attn;
    float *u;          // (B*Tj, M): the MLP's half of linear1's output
    float *cat;        // (B*Tj, A + M): [a | gelu(u)], linear2's input
    float *o;          // (B*Tj, D): linear2's output
} SingleSaved;

static void single_reserve(const StepCtx *s, const FluxSingle *blk, FluxDims d) {
    flux_linears_reserve(s, (const FluxLinear *[]){&blk->linear1, &blk->linear2}, 2, d.B * d.Tj);
    flux_linears_reserve(s, (const FluxLinear *[]){&blk->mod}, 1, d.B);
}

// The forward math; scratch: (rows, 3D + 2M) for linear1's output (rows, 3A + M), then gelu(u),
// then the block's output rows.
static void single_compute(const StepCtx *s, FluxSingle *blk, SingleSaved *sv, const float *x,
                           float *y, FluxDims d, float *scratch, void *workspace) {
    int rows = d.B * d.Tj, D = d.D, M = d.M, A = d.A, l1 = 3 * A + M;
    float *h1 = scratch, *g = h1 + (size_t)rows * l1;
    size_t fw = sizeof(float);
    flux_cond_forward(s, &sv->cond, x, y, d);
    flux_rows_gather(s, sv->xj, x, d.B, d.S, 1, d.Tj, D);
    flux_linear_forward(&blk->mod, s, sv->mod, sv->cond.svec, d.B, 0);
    flux_adaln_forward(s, &sv->n, sv->m, sv->xj, sv->mod, sv->mod + D, 3 * D, d.B, d.Tj, D);
    flux_linear_forward(&blk->linear1, s, h1, sv->m, rows, 0);
    flux_qk_forward(s, &sv->qk, sv->attn.q, sv->attn.k, sv->attn.v, h1, l1, rows, blk->q_norm,
                    blk->k_norm, d);
    s->k->copy_rows(sv->u, M * fw, h1 + 3 * A, l1 * fw, M * fw, (size_t)rows);
    flux_attn_forward(s, &sv->attn, blk->rope, d, workspace);
    s->k->gelu_tanh_forward(g, sv->u, (size_t)rows * M);
    s->k->copy_rows(sv->cat, (A + M) * fw, sv->attn.out, A * fw, A * fw, (size_t)rows);
    s->k->copy_rows(sv->cat + A, (A + M) * fw, g, M * fw, M * fw, (size_t)rows);
    flux_linear_forward_reduced(&blk->linear2, s, sv->o, sv->cat, rows);
    copy(s, h1, sv->xj, (size_t)rows * D);
    s->k->gated_add_forward(h1, sv->o, sv->mod + 2 * D, 3 * D, d.B, d.Tj, D);
    flux_rows_scatter(s, y, h1, d.B, d.S, 1, d.Tj, D);
}

static void single_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    FluxSingle *blk = b->self;
    SingleSaved *sv = saved;
    FluxDims d = flux_dims(blk->args, blk->rope, s);
    Arena *A = s->act;
    size_t rows = (size_t)d.B * d.Tj;
    flux_cond_carve(s, &sv->cond, d);
    sv->xj = arena_floats(A, rows * d.D);
    sv->mod = arena_floats(A, (size_t)d.B * 3 * d.D);
    flux_norm_carve(s, &sv->n, (int)rows, d.D);
    sv->m = arena_floats(A, rows * d.D);
    flux_qk_carve(s, &sv->qk, (int)rows, d);
    flux_attn_carve(s, &sv->attn, d);
    sv->u = arena_floats(A, rows * d.M);
    sv->cat = arena_floats(A, rows * (d.A + d.M));
    sv->o = arena_floats(A, rows * d.D);
    size_t mark = arena_mark(A);  // scratch from here
    float *scratch = arena_floats(A, rows * (3 * (size_t)d.D + 2 * (size_t)d.M));
    void *workspace = arena_alloc(A, flux_attn_workspace(s, d));
    single_reserve(s, blk, d);
    if (!step_sizing(s)) single_compute(s, blk, sv, x, y, d, scratch, workspace);
    arena_release(A, mark);
}

static void single_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                            const float *dy, float *dx) {
    (void)x;
    if (phase == BLOCK_BACKWARD_WEIGHT) return;  // taken with the input gradient
    FluxSingle *blk = b->self;
    SingleSaved *sv = saved;
    FluxDims d = flux_dims(blk->args, blk->rope, s);
    Arena *A = s->act;
    int rows = d.B * d.Tj, D = d.D, M = d.M, W = d.A, l1 = 3 * W + M;
    size_t n = (size_t)rows * D, na = (size_t)rows * W, nm = (size_t)rows * M;
    size_t bd = (size_t)d.B * D, fw = sizeof(float);
    float *dxj = arena_floats(A, n), *dmod = arena_floats(A, 3 * bd), *dsvec = arena_floats(A, bd);
    float *dcat = arena_floats(A, (size_t)rows * (W + M));
    float *dl1 = arena_floats(A, (size_t)rows * l1);
    float *dattn = arena_floats(A, na), *dq = arena_floats(A, na), *dk = arena_floats(A, na);
    float *dv = arena_floats(A, na), *dm = arena_floats(A, n), *du = arena_floats(A, nm);
    float *scratch = arena_floats(A, 2 * n + nm);
    void *workspace = arena_alloc(A, flux_attn_workspace(s, d));
    single_reserve(s, blk, d);
    if (step_sizing(s)) return;
    float *dout = dm, *dg = scratch + 2 * n;  // dm's room is free until linear1's backward
    flux_rows_gather(s, dxj, dy, d.B, d.S, 1, d.Tj, D);
    zero(s, dmod, 3 * bd);
    zero(s, dout, n);
    s->k->gated_add_backward(dout, dmod + 2 * D, dxj, sv->o, sv->mod + 2 * D, 3 * D, d.B, d.Tj, D);
    flux_linear_backward(&blk->linear2, s, dcat, dout, sv->cat, rows, 0);
    s->k->copy_rows(dattn, W * fw, dcat, (W + M) * fw, W * fw, (size_t)rows);
    s->k->copy_rows(dg, M * fw, dcat + W, (W + M) * fw, M * fw, (size_t)rows);
    zero(s, du, nm);
    s->k->gelu_tanh_backward(du, dg, sv->u, nm);
    s->k->copy_rows(dl1 + 3 * W, l1 * fw, du, M * fw, M * fw, (size_t)rows);
    flux_attn_backward(s, &sv->attn, blk->rope, dq, dk, dv, dattn, d, workspace, scratch);
    flux_qk_backward(s, &sv->qk, dl1, l1, dq, dk, dv, rows, blk->q_norm, blk->k_norm, d, scratch);
    flux_linear_backward(&blk->linear1, s, dm, dl1, sv->m, rows, 0);
    flux_tp_sum(s, dm, n);
    flux_adaln_backward(s, &sv->n, dxj, dmod, dmod + D, dm, sv->xj, sv->mod + D, 3 * D, d.B, d.Tj,
                        D, scratch);
    flux_rows_scatter(s, dx, dxj, d.B, d.S, 1, d.Tj, D);
    zero(s, dsvec, bd);
    flux_linear_backward(&blk->mod, s, dsvec, dmod, sv->cond.svec, d.B, 0);
    flux_cond_backward(s, &sv->cond, dx, dy, dsvec, scratch, d);
}

const BlockOps FLUX_DOUBLE_OPS = {"double_stream", sizeof(DoubleSaved), double_forward,
                                  double_backward};
const BlockOps FLUX_SINGLE_OPS = {"single_stream", sizeof(SingleSaved), single_forward,
                                  single_backward};
