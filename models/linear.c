// Each direction of a Linear (forward, input gradient, weight gradient) dispatches on the
// layer's precision; a plain weight's rows and a stacked one's expert groups (offsets) take the
// same path, so a precision serves both. A float8 GEMM casts its operands into scratch carved
// from s->act at the call and given back after it (Micikevicius et al. 2022, "FP8 Formats for
// Deep Learning"; torchao.float8's Float8Linear with dynamic scaling: nothing is kept between
// calls, so a weight is cast again in backward, as torchao recasts it).
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
// no thresholds for rowwise_with_gw_hp (config.c refuses that pair).
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

Linear linear_of(const Param *weight) { return (Linear){weight, LINEAR_BACKEND}; }

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
    Float8Buffers b = {arena_alloc(act, (size_t)o->rows * o->cols), NULL, NULL};
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

static void float8_run(const Linear *l, const StepCtx *s, LinearGemm which, float *c,
                       const float *x, const float *dy, int rows, const int *offsets,
                       float beta) {
    Float8Gemm g = float8_gemm(l, which, x, dy, rows, offsets);
    size_t mark = arena_mark(s->act);
    Float8Buffers a, b;
    void *workspace = gemm_carve(s, &g, &a, &b);
    operand_cast_blocks(s, &g.a, a);
    operand_cast_blocks(s, &g.b, b);
    if (g.groups)  // the weight gradient's c_g is (out, in): the op's (k, n)
        s->k->grouped_matmul_float8(c, a.bytes, a.scale_inv, b.bytes, b.scale_inv, offsets,
                                    g.groups, g.n, g.weight_grad ? g.m : g.k, g.weight_grad,
                                    beta, workspace);
    else
        s->k->matmul_float8(c, a.bytes, a.scale_inv, g.a.cast.kind, b.bytes, b.scale_inv,
                            g.b.cast.kind, g.m, g.n, g.k, g.a.cast.rowwise, beta, workspace);
    arena_release(s->act, mark);
}

void linear_reserve(const StepCtx *s, const Linear *const *linears, int n, int rows) {
    size_t mark = arena_mark(s->act);  // counted in the arena's peak, then given back
    for (int i = 0; i < n; i++)
        for (LinearGemm g = GEMM_OUTPUT; g <= GEMM_GRAD_WEIGHT; g++) {
            if (!gemm_is_float8(linears[i], g)) continue;  // the backend's GEMMs need none
            Float8Gemm gemm = float8_gemm(linears[i], g, NULL, NULL, rows, NULL);
            Float8Buffers a, b;
            gemm_carve(s, &gemm, &a, &b);
            arena_release(s->act, mark);
        }
}

// ---- dispatch ------------------------------------------------------------------------------

// offsets: NULL for a plain weight, else the expert groups of the rows (rows = offsets[E]).
static void forward(const Linear *l, const StepCtx *s, float *y, const float *x, int rows,
                    const int *offsets, float beta) {
    const float *w = l->weight->data;
    int out = out_dim(l), in = in_dim(l);
    if (gemm_is_float8(l, GEMM_OUTPUT)) {
        float8_run(l, s, GEMM_OUTPUT, y, x, NULL, rows, offsets, beta);
    } else if (offsets) {
        s->k->grouped_matmul(y, x, w, offsets, experts(l), out, in, false, true, beta);
    } else {
        s->k->matmul(y, x, w, rows, out, in, false, true, beta);
    }
}

static void backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                           int rows, const int *offsets, float beta) {
    const float *w = l->weight->data;
    int out = out_dim(l), in = in_dim(l);
    if (gemm_is_float8(l, GEMM_GRAD_INPUT)) {
        float8_run(l, s, GEMM_GRAD_INPUT, dx, NULL, dy, rows, offsets, beta);
    } else if (offsets) {
        s->k->grouped_matmul(dx, dy, w, offsets, experts(l), in, out, false, false, beta);
    } else {
        s->k->matmul(dx, dy, w, rows, in, out, false, false, beta);
    }
}

static void backward_weight(const Linear *l, const StepCtx *s, const float *dy, const float *x,
                            int rows, const int *offsets) {
    float *dw = l->weight->grad;
    int out = out_dim(l), in = in_dim(l);
    if (gemm_is_float8(l, GEMM_GRAD_WEIGHT)) {
        float8_run(l, s, GEMM_GRAD_WEIGHT, dw, x, dy, rows, offsets, 1);
    } else if (offsets) {
        s->k->grouped_matmul(dw, dy, x, offsets, experts(l), in, out, true, false, 1);
    } else {
        s->k->matmul(dw, dy, x, out, in, rows, true, false, 1);
    }
}
void linear_forward(const Linear *l, const StepCtx *s, float *y, const float *x, int rows,
                    float beta) {
    forward(l, s, y, x, rows, NULL, beta);
}

void linear_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                           int rows, float beta) {
    backward_input(l, s, dx, dy, rows, NULL, beta);
}

void linear_backward_weight(const Linear *l, const StepCtx *s, const float *dy, const float *x,
                            int rows) {
    backward_weight(l, s, dy, x, rows, NULL);
}

void linear_grouped_forward(const Linear *l, const StepCtx *s, float *y, const float *x,
                            const int *offsets, float beta) {
    forward(l, s, y, x, offsets[experts(l)], offsets, beta);
}

void linear_grouped_backward_input(const Linear *l, const StepCtx *s, float *dx, const float *dy,
                                   const int *offsets, float beta) {
    backward_input(l, s, dx, dy, offsets[experts(l)], offsets, beta);
}

void linear_grouped_backward_weight(const Linear *l, const StepCtx *s, const float *dy,
                                    const float *x, const int *offsets) {
    backward_weight(l, s, dy, x, offsets[experts(l)], offsets);
}
