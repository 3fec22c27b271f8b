// Each direction of a Linear (forward, input gradient, weight gradient) dispatches on the
// layer's precision, and the backend's on the activations' dtype; linear_reserve carves each
// call's scratch by the same code, skipping only the math. A float8 GEMM casts its operands
// into scratch carved from s->act at the call and given back after it (Micikevicius et al.
// 2022, "FP8 Formats for Deep Learning"; torchao.float8's Float8Linear with dynamic scaling:
// nothing is kept between calls, so a weight is cast again in backward, as torchao recasts
// it). A tensorwise weight that FSDP gathered in float8 (Param.float8_data) is not cast at
// all: its forward GEMM reads the gathered codes and scale, its input gradient their
// transpose (float8_transpose).
#include "models/linear.h"

#include <string.h>

#include "core/errors.h"

// torchtitan's filter_fqns entry that turns torchao's size thresholds on.
#define AUTO_FILTER_SMALL_KN "auto_filter_small_kn"

static LinearPrecision recipe_precision(const char *recipe) {
    if (!recipe || !strcmp(recipe, "tensorwise")) return LINEAR_FLOAT8_TENSORWISE;  // torchao's default
    if (!strcmp(recipe, "rowwise")) return LINEAR_FLOAT8_ROWWISE;
    CHECK(!strcmp(recipe, "rowwise_with_gw_hp"));
    return LINEAR_FLOAT8_ROWWISE_WITH_GW_HP;
}

// torchao's _auto_filter_for_tensorwise / _auto_filter_for_rowwise: GEMMs too small for float8
// to pay for its casts on an H100, with N = out and K = in (the weight's shape). torchao has
// no thresholds for rowwise_with_gw_hp (core/config_check.c refuses that pair).
static bool too_small_for_float8(LinearPrecision p, int64_t N, int64_t K) {
    if (p == LINEAR_FLOAT8_TENSORWISE) return K <= 4096 && N <= 1024;
    CHECK(p == LINEAR_FLOAT8_ROWWISE);
    return N <= 2048 || K <= 1024 || (N <= 4096 && K <= 2048);
}

bool linear_moe_fqns_match(const char *module, const Float8Section *float8) {
    const char *dot = strrchr(module, '.');
    size_t n = dot ? (size_t)(dot - module) : strlen(module);
    for (int i = 0; i < float8->moe_fqns_prototype.count; i++) {
        const char *entry = float8->moe_fqns_prototype.items[i];
        size_t len = strlen(entry);
        for (size_t at = 0; at + len <= n; at++)
            if (!strncmp(module + at, entry, len)) return true;
    }
    return false;
}

LinearPrecision linear_precision_for(const char *module, const Param *weight,
                                     const Float8Section *float8) {
    if (!float8) return LINEAR_BACKEND;
    int64_t N = weight->global_shape[weight->ndim - 2], K = weight->global_shape[weight->ndim - 1];
    if (N % 16 != 0 || K % 16 != 0) return LINEAR_BACKEND;  // the float8 GEMMs' alignment
    if (weight->ndim == 3)  // torchao's MoE training: rowwise, whatever recipe the Linears take
        return linear_moe_fqns_match(module, float8) ? LINEAR_FLOAT8_ROWWISE : LINEAR_BACKEND;
    LinearPrecision p = recipe_precision(float8->recipe_name);
    bool auto_filter = false;
    for (int i = 0; i < float8->filter_fqns.count; i++) {
        const char *entry = float8->filter_fqns.items[i];
        if (!strcmp(entry, AUTO_FILTER_SMALL_KN)) auto_filter = true;
        else if (strstr(module, entry)) return LINEAR_BACKEND;  // torchtitan's `fqn in module`
    }
    return auto_filter && too_small_for_float8(p, N, K) ? LINEAR_BACKEND : p;
}

const char *linear_precision_name(LinearPrecision p) {
    static const char *const NAMES[] = {"backend", "tensorwise", "rowwise", "rowwise_with_gw_hp"};
    return NAMES[p];
}

Linear linear_of(const Param *weight) { return (Linear){.weight = weight}; }

static int out_dim(const Linear *l) { return (int)l->weight->shape[l->weight->ndim - 2]; }
static int in_dim(const Linear *l) { return (int)l->weight->shape[l->weight->ndim - 1]; }
// The experts a stacked weight holds (this rank's, under expert parallel).
static int experts(const Linear *l) {
    CHECK(l->weight->ndim == 3);
    return (int)l->weight->shape[0];
}

// ---- float8 GEMMs --------------------------------------------------------------------------

typedef enum { GEMM_OUTPUT, GEMM_GRAD_INPUT, GEMM_GRAD_WEIGHT } LinearGemm;

// One operand of a float8 GEMM: the high-precision tensor x (rows, cols) and its cast
// (kernels.h's Float8Cast; the bytes are (rows, cols), or (cols, rows) when transposed).
// one_scale: the GEMM reads a scale per row of the bytes, but torchao scales this tensor as a
// whole (rowwise_with_gw_hp's tensorwise weight beside a rowwise grad_output): its one amax
// is repeated for every row, which casts it exactly as a tensorwise cast would.
// blocks > 1 (transposed rowwise casts of stacked experts' operands): x's rows split into
// blocks, each cast on its own, its bytes (cols, its rows) where its rows start times cols and
// its cols scales after the previous block's: the experts' weights, rows / blocks each, or the
// experts' token groups at offsets (grouped_matmul_float8's weight-gradient form).
typedef struct {
    const float *x;
    int rows, cols;
    Float8Cast cast;
    bool one_scale;
    int blocks;
    const int *offsets;  // blocks + 1 (host), or NULL for equal blocks
} Float8Operand;

// c (m, n) = a (m, k) b (n, k)^T, both operands K-contiguous (matmul_float8's form); on
// stacked experts (groups > 0) grouped_matmul_float8's, weight_grad its form.
typedef struct {
    Float8Operand a, b;
    int m, n, k;
    int groups;
    bool weight_grad;
} Float8Gemm;

typedef struct {
    uint8_t *bytes;
    float *amax, *scale_inv;
} Float8Buffers;

static bool gemm_is_float8(const Linear *l, LinearGemm g) {
    return l->precision != LINEAR_BACKEND &&
           !(g == GEMM_GRAD_WEIGHT && l->precision == LINEAR_FLOAT8_ROWWISE_WITH_GW_HP);
}

// torchao's Float8LinearConfig.from_recipe_name, GEMM by GEMM: output = input weight^T;
// grad_input = grad_output weight, the weight transposed (cast along its other axis);
// grad_weight = grad_output^T input, both transposed (reduced over the rows). The rowwise
// recipes cast everything e4m3fn with per-row power-of-two scales; tensorwise casts
// grad_output e5m2 (gradients need range more than precision) with one plain scale per tensor.
// Stacked experts (torchao's _Float8GroupedMM) take the same axes per expert: the weight as
// (E out, in) rows, transposed expert by expert, and the weight gradient's operands transposed
// token group by token group (offsets: NULL when only sizing).
static Float8Gemm float8_gemm(const Linear *l, LinearGemm g, const float *x, const float *dy,
                              int rows, const int *offsets) {
    bool rowwise = l->precision != LINEAR_FLOAT8_TENSORWISE;
    Float8Kind weights = FLOAT8_E4M3FN, grads = rowwise ? FLOAT8_E4M3FN : FLOAT8_E5M2;
    int out = out_dim(l), in = in_dim(l);
    int groups = l->weight->ndim == 3 ? experts(l) : 0, blocks = groups ? groups : 1;
    const float *w = l->weight->data;
#define CAST(kind, transpose) ((Float8Cast){kind, rowwise, transpose, rowwise})
    switch (g) {
    case GEMM_OUTPUT:
        return (Float8Gemm){{x, rows, in, CAST(weights, false), false, 1, NULL},
                            {w, blocks * out, in, CAST(weights, false), false, 1, NULL},
                            rows, out, in, groups, false};
    case GEMM_GRAD_INPUT:
        return (Float8Gemm){{dy, rows, out, CAST(grads, false), false, 1, NULL},
                            {w, blocks * out, in, CAST(weights, true),
                             l->precision == LINEAR_FLOAT8_ROWWISE_WITH_GW_HP, blocks, NULL},
                            rows, in, out, groups, false};
    case GEMM_GRAD_WEIGHT:
        break;
    }
    return (Float8Gemm){{dy, rows, out, CAST(grads, true), false, blocks, offsets},
                        {x, rows, in, CAST(weights, true), false, blocks, offsets},
                        out, in, rows, groups, true};
#undef CAST
}

static int operand_scales(const Float8Operand *o) {
    return !o->cast.rowwise ? 1 : o->cast.transpose ? o->blocks * o->cols : o->rows;
}

static Float8Buffers operand_carve(Arena *act, const Float8Operand *o) {
    size_t n = (size_t)operand_scales(o);
    Dtype bytes = o->cast.kind == FLOAT8_E4M3FN ? DTYPE_E4M3 : DTYPE_E5M2;
    Float8Buffers b = {arena_tensor(act, (size_t)o->rows * o->cols, bytes), NULL, NULL};
    b.amax = arena_floats(act, n);
    b.scale_inv = arena_floats(act, n);
    return b;
}

// The operands' casts and the GEMM's workspace.
static void *gemm_carve(const StepCtx *s, const Float8Gemm *g, Float8Buffers *a,
                        Float8Buffers *b) {
    *a = operand_carve(s->act, &g->a);
    *b = operand_carve(s->act, &g->b);
    size_t bytes = !g->groups      ? s->k->matmul_float8_workspace_bytes(g->m, g->n, g->k)
                   : g->weight_grad ? s->k->grouped_matmul_float8_workspace_bytes(
                                         g->k, g->groups, g->n, g->m, true)
                                    : s->k->grouped_matmul_float8_workspace_bytes(
                                         g->m, g->groups, g->n, g->k, false);
    return arena_alloc(s->act, bytes);
}

// amax[1 .. n) = amax[0], by doubling copies: the amax is in the backend's memory.
static void amax_repeat(const StepCtx *s, float *amax, int n) {
    for (int have = 1; have < n; have *= 2) {
        int more = n - have < have ? n - have : have;
        s->k->copy(amax + have, amax, (size_t)more * sizeof(float));
    }
}

static void operand_cast(const StepCtx *s, const Float8Operand *o, Float8Buffers b) {
    Float8Cast amax_cast = o->cast;
    amax_cast.rowwise = o->cast.rowwise && !o->one_scale;
    s->k->float8_amax(b.amax, o->x, o->rows, o->cols, &amax_cast);
    if (o->one_scale) amax_repeat(s, b.amax, operand_scales(o));
    s->k->float8_quantize(b.bytes, b.scale_inv, b.amax, o->x, o->rows, o->cols, &o->cast);
}

// Each block of a blocked operand as an operand of its own.
static void operand_cast_blocks(const StepCtx *s, const Float8Operand *o, Float8Buffers b) {
    if (o->blocks == 1) {
        operand_cast(s, o, b);
        return;
    }
    CHECK(o->cast.rowwise && o->cast.transpose && !o->one_scale);
    for (int i = 0; i < o->blocks; i++) {
        int r0 = o->offsets ? o->offsets[i] : i * (o->rows / o->blocks);
        int r1 = o->offsets ? o->offsets[i + 1] : (i + 1) * (o->rows / o->blocks);
        Float8Operand block = *o;
        block.x = o->x + (size_t)r0 * o->cols;
        block.rows = r1 - r0;
        size_t scales = (size_t)i * o->cols;
        operand_cast(s, &block, (Float8Buffers){b.bytes + (size_t)r0 * o->cols, b.amax + scales,
                                                b.scale_inv + scales});
    }
}

// An fp32 view of the activation x (n elements), for float8's casts: itself, or bf16 widened
// into scratch carved from s->act. run false: carve only (linear_reserve).
static const float *widened(const StepCtx *s, LinearAct x, size_t n, bool run) {
    if (x.dtype == DTYPE_FP32) return x.data;
    float *w = arena_floats(s->act, n);
    if (run) s->k->from_bf16(w, x.data, n);
    return w;
}

// The weight operand b of the output or input-gradient GEMM when FSDP gathered the weight in
// float8 (Param.float8_data: tensorwise e4m3fn, scaled by the whole weight's amax as
// operand_cast would): its codes and scale as they are, or transposed into b's bytes for the
// input gradient, which reduces over the weight's other axis.
static void weight_gathered(const Linear *l, const StepCtx *s, const Float8Operand *o,
                            Float8Buffers *b) {
    CHECK(l->precision == LINEAR_FLOAT8_TENSORWISE && o->cast.kind == FLOAT8_E4M3FN);
    if (o->cast.transpose)
        s->k->float8_transpose(b->bytes, l->weight->float8_data, o->rows, o->cols);
    else
        b->bytes = l->weight->float8_data;
    b->scale_inv = l->weight->float8_scale_inv;
}

// One of the GEMMs in float8: carves the operands' casts and the workspace, and with run casts
// and multiplies; the scratch is given back either way.
static void float8_run(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                       LinearAct x, LinearAct dy, int rows, const int *offsets, float beta,
                       bool run) {
    size_t mark = arena_mark(s->act);
    const float *xf = which == GEMM_GRAD_INPUT ? NULL
                                               : widened(s, x, (size_t)rows * in_dim(l), run);
    const float *dyf = which == GEMM_OUTPUT ? NULL
                                            : widened(s, dy, (size_t)rows * out_dim(l), run);
    Float8Gemm g = float8_gemm(l, which, xf, dyf, rows, offsets);
    Float8Buffers a, b;
    void *workspace = gemm_carve(s, &g, &a, &b);
    if (run) {
        operand_cast_blocks(s, &g.a, a);
        if (!g.groups && which != GEMM_GRAD_WEIGHT && l->weight->float8_data)
            weight_gathered(l, s, &g.b, &b);
        else
            operand_cast_blocks(s, &g.b, b);
        if (g.groups)  // the weight gradient's c_g is (out, in): the op's (k, n)
            s->k->grouped_matmul_float8(c, a.bytes, a.scale_inv, b.bytes, b.scale_inv, offsets,
                                        g.groups, g.n, g.weight_grad ? g.m : g.k, g.weight_grad,
                                        beta, workspace);
        else
            s->k->matmul_float8(c, a.bytes, a.scale_inv, g.a.cast.kind, b.bytes, b.scale_inv,
                                g.b.cast.kind, g.m, g.n, g.k, g.a.cast.rowwise, beta, workspace);
    }
    arena_release(s->act, mark);
}

// ---- the backend's GEMMs -------------------------------------------------------------------

// The weight in the activations' dtype: the fp32 tensor itself, or its bf16 cast carved from
// s->act (made at each call: the weight FSDP gathered, or the optimizer changed, since). An
// NF4 weight (QLoRA's base) is dequantized into s->act first, at each call, as bitsandbytes'
// Linear4bit does: only its blob is kept.
static const void *weight_as(const Linear *l, const StepCtx *s, Dtype t, bool run) {
    size_t n = (size_t)out_dim(l) * in_dim(l);
    const float *w = l->weight->data;
    if (l->weight->nf4) {  // the whole weight's blob; this rank's part of it (tensor parallel)
        const Param *p = l->weight;
        float *dequantized = arena_floats(s->act, n);
        ParamBox box = param_box(p, false);
        if (run)
            s->k->nf4_dequantize(dequantized, p->nf4_data, param_global_numel(p),
                                 (size_t)p->global_shape[1], (size_t)box_start(&box, 0),
                                 (size_t)box_start(&box, 1), (size_t)out_dim(l), (size_t)in_dim(l));
        w = dequantized;
    }
    if (t == DTYPE_FP32) return w;
    uint16_t *w16 = arena_tensor(s->act, n, DTYPE_BF16);
    if (run) s->k->to_bf16(w16, w, n);
    return w16;
}

static void backend_run(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                        LinearAct x, LinearAct dy, int rows, float beta, bool run) {
    int out = out_dim(l), in = in_dim(l);
    size_t mark = arena_mark(s->act);
    Dtype t = which == GEMM_OUTPUT ? x.dtype : dy.dtype;
    const void *w = which == GEMM_GRAD_WEIGHT ? NULL : weight_as(l, s, t, run);
    if (run) switch (which) {
        case GEMM_OUTPUT: s->k->matmul(c, x.data, w, t, rows, out, in, false, true, beta); break;
        case GEMM_GRAD_INPUT:
            s->k->matmul(c, dy.data, w, t, rows, in, out, false, false, beta);
            break;
        case GEMM_GRAD_WEIGHT:
            CHECK(x.dtype == t);
            s->k->matmul(c, dy.data, x.data, t, out, in, rows, true, false, 1);
            break;
        }
    arena_release(s->act, mark);
}

// A stacked weight's GEMM over its experts' groups, always fp32 (no scratch).
static void grouped_run(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                        const float *x, const float *dy, const int *offsets, float beta) {
    int out = out_dim(l), in = in_dim(l), E = experts(l);
    const float *w = l->weight->data;
    switch (which) {
    case GEMM_OUTPUT:
        s->k->grouped_matmul(c, x, w, offsets, E, out, in, false, true, beta);
        break;
    case GEMM_GRAD_INPUT:
        s->k->grouped_matmul(c, dy, w, offsets, E, in, out, false, false, beta);
        break;
    case GEMM_GRAD_WEIGHT:
        s->k->grouped_matmul(c, dy, x, offsets, E, in, out, true, false, 1);
        break;
    }
}

// ---- dispatch ------------------------------------------------------------------------------

// c = the GEMM `which` of a plain weight; run false: carve its scratch only (a stacked one's
// too: float8_gemm sizes its casts without the groups).
static void gemm(const Linear *l, const StepCtx *s, LinearGemm which, float *c, LinearAct x,
                 LinearAct dy, int rows, float beta, bool run) {
    if (gemm_is_float8(l, which))
        float8_run(l, s, which, c, x, dy, rows, NULL, beta, run);
    else
        backend_run(l, s, which, c, x, dy, rows, beta, run);
}

// ---- LoRA's adapters -----------------------------------------------------------------------
// Hu et al. 2021: the adapted layer adds s (x A^T) B^T, a (rows, rank) product in between.
// Each direction recomputes what it needs of it (rows x rank x in multiply-adds, small beside
// the weight's), so nothing is kept from forward to backward.

static int lora_rank(const Linear *l) { return (int)l->lora_a->shape[0]; }

// Whether this pass drops (a training pass of a Linear with dropout), or, carving only, might.
static bool lora_drops(const Linear *l, const StepCtx *s, bool run) {
    return l->lora_dropout > 0 && (s->dropout_seed || !run);
}

static uint64_t lora_seed(const Linear *l, const StepCtx *s) {
    return s->dropout_seed * 0x9E3779B97F4A7C15ull + l->lora_id;
}

// x (rows, in) as the adapters read it: itself, or its dropout in scratch.
static LinearAct lora_input(const Linear *l, const StepCtx *s, LinearAct x, int rows, bool run) {
    if (!lora_drops(l, s, run)) return x;
    size_t n = (size_t)rows * in_dim(l);
    void *dropped = arena_tensor(s->act, n, x.dtype);
    if (run) s->k->dropout(dropped, x.data, x.dtype, n, l->lora_dropout, lora_seed(l, s));
    return linear_act(dropped, x.dtype);
}

// f (n, fp32) in the dtype of the activations it joins: itself, or its bf16 cast in scratch.
static LinearAct as_act(const StepCtx *s, float *f, size_t n, Dtype dtype, bool run) {
    if (dtype == DTYPE_FP32) return linear_fp32(f);
    uint16_t *h = arena_tensor(s->act, n, DTYPE_BF16);
    if (run) s->k->to_bf16(h, f, n);
    return linear_act(h, dtype);
}

// h (rows, rank) = s x A^T, carved from s->act (x: the adapters' input, lora_input's).
static LinearAct lora_down(const Linear *l, const StepCtx *s, LinearAct x, int rows, bool run) {
    Linear a = linear_of(l->lora_a);
    size_t n = (size_t)rows * lora_rank(l);
    float *h = arena_floats(s->act, n);
    gemm(&a, s, GEMM_OUTPUT, h, x, linear_fp32(NULL), rows, 0, run);
    if (run) s->k->scale(h, n, l->lora_scale);
    return as_act(s, h, n, x.dtype, run);
}

// g (rows, rank) = s dy B, carved from s->act: the gradient of x A^T.
static LinearAct lora_up_grad(const Linear *l, const StepCtx *s, LinearAct dy, int rows,
                              bool run) {
    Linear b = linear_of(l->lora_b);
    size_t n = (size_t)rows * lora_rank(l);
    float *g = arena_floats(s->act, n);
    gemm(&b, s, GEMM_GRAD_INPUT, g, linear_fp32(NULL), dy, rows, 0, run);
    if (run) s->k->scale(g, n, l->lora_scale);
    return as_act(s, g, n, dy.dtype, run);
}

// The adapters' share of the GEMM `which` (after the weight's, into the same c for the output
// and input gradient; into their own gradients for the weights'); run false: carve only.
static void lora_gemm(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                      LinearAct x, LinearAct dy, int rows, bool run) {
    if (!l->lora_a) return;
    Linear a = linear_of(l->lora_a), b = linear_of(l->lora_b);
    size_t mark = arena_mark(s->act);
    switch (which) {
    case GEMM_OUTPUT:  // y += h B^T
        gemm(&b, s, GEMM_OUTPUT, c, lora_down(l, s, lora_input(l, s, x, rows, run), rows, run),
             dy, rows, 1, run);
        break;
    case GEMM_GRAD_INPUT: {  // dx += g A, through the dropout's mask and scale
        LinearAct g = lora_up_grad(l, s, dy, rows, run);
        if (!lora_drops(l, s, run)) {
            gemm(&a, s, GEMM_GRAD_INPUT, c, x, g, rows, 1, run);
            break;
        }
        size_t n = (size_t)rows * in_dim(l);
        float *t = arena_floats(s->act, n);
        gemm(&a, s, GEMM_GRAD_INPUT, t, x, g, rows, 0, run);
        if (run) {
            s->k->dropout(t, t, DTYPE_FP32, n, l->lora_dropout, lora_seed(l, s));
            s->k->add(c, t, n);
        }
        break;
    }
    case GEMM_GRAD_WEIGHT: {  // dA += g^T x', dB += dy^T h, x' the adapters' input
        LinearAct dropped = lora_input(l, s, x, rows, run);
        LinearAct g = lora_up_grad(l, s, dy, rows, run);
        gemm(&a, s, GEMM_GRAD_WEIGHT, l->lora_a->grad, dropped, g, rows, 1, run);
        gemm(&b, s, GEMM_GRAD_WEIGHT, l->lora_b->grad, lora_down(l, s, dropped, rows, run), dy,
             rows, 1, run);
        break;
    }
    }
    arena_release(s->act, mark);
}

// The GEMM `which` of a Linear: its weight's (none for a frozen weight's gradient), then its
// adapters'.
static void linear_gemm(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                        LinearAct x, LinearAct dy, int rows, float beta, bool run) {
    if (!(which == GEMM_GRAD_WEIGHT && l->weight->frozen))
        gemm(l, s, which, c, x, dy, rows, beta, run);
    lora_gemm(l, s, which, c, x, dy, rows, run);
}

void linear_reserve(const StepCtx *s, const Linear *const *linears, int n, int rows,
                    Dtype dtype) {
    for (int i = 0; i < n; i++) {
        bool grouped = linears[i]->weight->ndim == 3;  // on fp32 activations
        LinearAct act = linear_act(NULL, grouped ? DTYPE_FP32 : dtype);
        for (LinearGemm g = GEMM_OUTPUT; g <= GEMM_GRAD_WEIGHT; g++)
            if (!grouped || gemm_is_float8(linears[i], g))  // grouped_matmul carves nothing
                linear_gemm(linears[i], s, g, NULL, act, act, rows, 0, false);
    }
}

void linear_forward(const Linear *l, const StepCtx *s, float *y, LinearAct x, int rows,
                    float beta) {
    linear_gemm(l, s, GEMM_OUTPUT, y, x, linear_fp32(NULL), rows, beta, true);
}

void linear_backward_input(const Linear *l, const StepCtx *s, float *dx, LinearAct dy, int rows,
                           float beta) {
    linear_gemm(l, s, GEMM_GRAD_INPUT, dx, linear_fp32(NULL), dy, rows, beta, true);
}

void linear_backward_weight(const Linear *l, const StepCtx *s, LinearAct dy, LinearAct x,
                            int rows) {
    linear_gemm(l, s, GEMM_GRAD_WEIGHT, l->weight->grad, x, dy, rows, 1, true);
}

// c = the GEMM `which` of a stacked weight over the experts' groups of rows.
static void grouped_gemm(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                         const float *x, const float *dy, const int *offsets, float beta) {
    if (gemm_is_float8(l, which))
        float8_run(l, s, which, c, linear_fp32(x), linear_fp32(dy), offsets[experts(l)], offsets,
                   beta, true);
    else
        grouped_run(l, s, which, c, x, dy, offsets, beta);
}

void linear_grouped_forward(const Linear *l, const StepCtx *s, float *y, const float *x,
                            const int *offsets, float beta) {
    grouped_gemm(l, s, GEMM_OUTPUT, y, x, NULL, offsets, beta);
}

void linear_grouped_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                                   const int *offsets, float beta) {
    grouped_gemm(l, s, GEMM_GRAD_INPUT, dx, NULL, dy, offsets, beta);
}

void linear_grouped_backward_weight(const Linear *l, const StepCtx *s, const float *dy,
                                    const float *x, const int *offsets) {
    if (l->weight->frozen) return;
    grouped_gemm(l, s, GEMM_GRAD_WEIGHT, l->weight->grad, x, dy, offsets, 1);
}
