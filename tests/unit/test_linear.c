// models/linear: which layers float8 picks (torchtitan's module filter and torchao's auto
// filter, and its MoE filter for stacked experts), and a float8 Linear's three GEMMs against a
// naive reference of torchao's Float8Linear for each recipe (and of its _Float8GroupedMM for
// stacked experts): every operand cast along the axis its recipe says with the
// host's casts (core/float8.h, checked against ml_dtypes by test_casts), decoded, divided by its
// scale (torchao's emulation: _data / _scale) and multiplied in double.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"
#include "models/linear.h"

// ---- linear_precision_for ------------------------------------------------------------------

static Param weight_of(const char *name, int64_t out, int64_t in) {
    Param p = {.ndim = 2, .global_shape = {out, in}, .shape = {out, in}};
    snprintf(p.name, sizeof p.name, "%s", name);
    return p;
}

static LinearPrecision pick(const char *module, int64_t out, int64_t in, const char *recipe,
                            int n_filters, char **filters) {
    Param w = weight_of("w", out, in);
    Float8Section f = {.recipe_name = (char *)recipe, .filter_fqns = {n_filters, filters}};
    return linear_precision_for(module, &w, &f);
}

static void test_precision_filters(void **state) {
    (void)state;
    char *output[] = {"output"}, *attention_wq[] = {"attention.wq"}, *empty[] = {""};
    char *auto_only[] = {"auto_filter_small_kn"};
    // No converter, or a stacked experts' weight: the backend's.
    Param w = weight_of("layers.0.attention.wq.weight", 256, 256);
    assert_int_equal(linear_precision_for("layers.0.attention.wq", &w, NULL), LINEAR_BACKEND);
    Param experts = {.ndim = 3, .global_shape = {8, 256, 256}};
    Float8Section none = {0};
    assert_int_equal(linear_precision_for("layers.0.moe.experts", &experts, &none), LINEAR_BACKEND);
    // The recipe; null is tensorwise.
    assert_int_equal(pick("output", 256, 64, NULL, 0, NULL), LINEAR_FLOAT8_TENSORWISE);
    assert_int_equal(pick("output", 256, 64, "rowwise", 0, NULL), LINEAR_FLOAT8_ROWWISE);
    assert_int_equal(pick("output", 256, 64, "rowwise_with_gw_hp", 0, NULL),
                     LINEAR_FLOAT8_ROWWISE_WITH_GW_HP);
    // Both dims multiples of 16, else skipped whatever the filter.
    assert_int_equal(pick("output", 250, 64, NULL, 0, NULL), LINEAR_BACKEND);
    assert_int_equal(pick("output", 256, 72, NULL, 0, NULL), LINEAR_BACKEND);
    // An entry filters every module it is a substring of ("" all of them), nothing else.
    assert_int_equal(pick("output", 256, 64, NULL, 1, output), LINEAR_BACKEND);
    assert_int_equal(pick("layers.3.attention.wq", 256, 64, NULL, 1, attention_wq),
                     LINEAR_BACKEND);
    assert_int_equal(pick("layers.3.attention.wk", 256, 64, NULL, 1, attention_wq),
                     LINEAR_FLOAT8_TENSORWISE);
    assert_int_equal(pick("layers.3.attention.wk", 256, 64, NULL, 1, empty), LINEAR_BACKEND);
    // torchao's _auto_filter_for_tensorwise: skipped when K <= 4096 and N <= 1024 (N, K = the
    // weight's out, in); the flag itself filters no module.
    assert_int_equal(pick("auto_filter_small_kn", 1024, 4096, "tensorwise", 1, auto_only),
                     LINEAR_BACKEND);
    assert_int_equal(pick("x", 1040, 4096, "tensorwise", 1, auto_only), LINEAR_FLOAT8_TENSORWISE);
    assert_int_equal(pick("x", 1024, 4112, "tensorwise", 1, auto_only), LINEAR_FLOAT8_TENSORWISE);
    // _auto_filter_for_rowwise: skipped when N <= 2048, or K <= 1024, or both N <= 4096 and
    // K <= 2048.
    assert_int_equal(pick("x", 2048, 8192, "rowwise", 1, auto_only), LINEAR_BACKEND);
    assert_int_equal(pick("x", 8192, 1024, "rowwise", 1, auto_only), LINEAR_BACKEND);
    assert_int_equal(pick("x", 4096, 2048, "rowwise", 1, auto_only), LINEAR_BACKEND);
    assert_int_equal(pick("x", 4096, 2064, "rowwise", 1, auto_only), LINEAR_FLOAT8_ROWWISE);
    assert_int_equal(pick("x", 4112, 1040, "rowwise", 1, auto_only), LINEAR_FLOAT8_ROWWISE);
}

// float8.moe_fqns_prototype: a stacked weight is rowwise (torchao's MoE recipe, whatever the
// Linears' recipe) when an entry is a substring of its module, the name up to its last '.'
// (torchao filters the GroupedExperts module); both dims multiples of 16; filter_fqns is the
// Linears' filter, not the experts'.
static void test_precision_experts(void **state) {
    (void)state;
    char *experts[] = {"experts"}, *w1[] = {"w1_EFD"}, *layer1[] = {"layers.1.moe"};
    const char *w1_name = "layers.0.moe.routed_experts.inner_experts.w1_EFD";
    Param w = {.ndim = 3, .global_shape = {8, 64, 32}};
    Float8Section f = {.recipe_name = "tensorwise", .filter_fqns = {1, experts},
                       .moe_fqns_prototype = {1, experts}};
    assert_int_equal(linear_precision_for(w1_name, &w, &f), LINEAR_FLOAT8_ROWWISE);
    assert_true(linear_moe_fqns_match(w1_name, &f));
    f.moe_fqns_prototype = (StringList){1, w1};  // the parameter's own name is not the module's
    assert_int_equal(linear_precision_for(w1_name, &w, &f), LINEAR_BACKEND);
    f.moe_fqns_prototype = (StringList){1, layer1};
    assert_int_equal(linear_precision_for(w1_name, &w, &f), LINEAR_BACKEND);
    assert_int_equal(linear_precision_for("layers.1.moe.routed_experts.inner_experts.w1_EFD", &w,
                                          &f),
                     LINEAR_FLOAT8_ROWWISE);
    Param narrow = {.ndim = 3, .global_shape = {8, 64, 24}};
    assert_int_equal(linear_precision_for("layers.1.moe.x.w1", &narrow, &f), LINEAR_BACKEND);
    // A plain weight is not an expert's, whatever its name.
    Param dense = weight_of("layers.1.moe.shared_experts.w1.weight", 64, 32);
    f.filter_fqns = (StringList){0, NULL};
    assert_int_equal(linear_precision_for("layers.1.moe.shared_experts.w1", &dense, &f),
                     LINEAR_FLOAT8_TENSORWISE);
}

// ---- the float8 GEMMs against the reference ---------------------------------------------

#define ROWS 48
#define IN 32
#define OUT 64

// How the reference scales an (r, c) operand: one amax, one per row (over its columns) or one
// per column (over its rows).
typedef enum { TENSOR, PER_ROW, PER_COL, EXACT } Scaling;

typedef struct {
    Scaling scaling;
    Float8Kind kind;
} RefCast;

// What torchao casts for each GEMM (Float8LinearConfig.from_recipe_name, and the axes of
// matmul_with_hp_or_float8_args): input x, weight w, grad_output g.
typedef struct {
    RefCast x_fwd, w_fwd, g_gi, w_gi, g_gw, x_gw;
    bool pow2;
} Recipe;

static Recipe recipe_of(LinearPrecision p) {
    RefCast e4_t = {TENSOR, FLOAT8_E4M3FN}, e5_t = {TENSOR, FLOAT8_E5M2};
    RefCast e4_r = {PER_ROW, FLOAT8_E4M3FN}, e4_c = {PER_COL, FLOAT8_E4M3FN};
    RefCast exact = {EXACT, FLOAT8_E4M3FN};
    switch (p) {
    case LINEAR_FLOAT8_TENSORWISE: return (Recipe){e4_t, e4_t, e5_t, e4_t, e5_t, e4_t, false};
    case LINEAR_FLOAT8_ROWWISE: return (Recipe){e4_r, e4_r, e4_r, e4_c, e4_c, e4_c, true};
    case LINEAR_FLOAT8_ROWWISE_WITH_GW_HP:
        return (Recipe){e4_r, e4_r, e4_r, e4_t, exact, exact, true};
    case LINEAR_BACKEND: break;
    }
    fail();
    return (Recipe){0};
}

// out = decode(cast(x * scale)) / scale, the scales from the amaxes the cast says.
static void ref_quantize(double *out, const float *x, int r, int c, RefCast how, bool pow2) {
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            float v = x[i * c + j];
            if (how.scaling == EXACT) {
                out[i * c + j] = v;
                continue;
            }
            float amax = 0;
            for (int a = 0; a < r; a++)
                for (int b = 0; b < c; b++) {
                    bool same = how.scaling == TENSOR || (how.scaling == PER_ROW && a == i) ||
                                (how.scaling == PER_COL && b == j);
                    if (same && fabsf(x[a * c + b]) > amax) amax = fabsf(x[a * c + b]);
                }
            float scale = float8_scale_from_amax(amax, how.kind);
            if (pow2) scale = float8_round_scale_pow2(scale);
            out[i * c + j] = (double)float8_to_float(float8_from_float(v * scale, how.kind, true),
                                                     how.kind) / scale;
        }
}

// Values whose magnitudes differ by rows and by columns (two decades each way), so that a
// scale taken along the wrong axis casts them visibly differently.
static void fill(float *x, int r, int c, uint64_t seed) {
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(seed >> 11) / (double)(1ull << 53) * 2 - 1;
            x[i * c + j] = (float)(u * pow(10, 2.0 * i / r) * pow(10, -2.0 * j / c));
        }
}

// c (m, n) = a (m, k) b^T where b is (n, k) or, transposed_b, (k, n); a likewise.
static void ref_gemm(double *c, const double *a, bool ta, const double *b, bool tb, int m, int n,
                     int k, double *magnitude) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0, mag = 0;
            for (int q = 0; q < k; q++) {
                double t = (ta ? a[q * m + i] : a[i * k + q]) * (tb ? b[q * n + j] : b[j * k + q]);
                sum += t, mag += fabs(t);
            }
            c[i * n + j] = sum, magnitude[i * n + j] = mag;
        }
}

// fp32 accumulation of k <= 64 products against double: a few ulps of the magnitude.
static void expect_close(const float *got, const double *want, const double *mag, int n) {
    for (int i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-6 * mag[i] + 1e-30))
            fail_msg("element %d: %.9g, reference %.9g (magnitude %.3g)", i, got[i], want[i],
                     mag[i]);
}

static void check_recipe(LinearPrecision precision) {
    static float x[ROWS * IN], w[OUT * IN], dy[ROWS * OUT], grad[OUT * IN], y[ROWS * OUT],
        dx[ROWS * IN];
    static double xq[ROWS * IN], wq[OUT * IN], gq[ROWS * OUT], want[ROWS * OUT],
        mag[ROWS * OUT], grad0[OUT * IN];
    fill(x, ROWS, IN, 1), fill(w, OUT, IN, 2), fill(dy, ROWS, OUT, 3), fill(grad, OUT, IN, 4);
    for (int i = 0; i < OUT * IN; i++) grad0[i] = grad[i];
    Param p = weight_of("layers.0.attention.wq.weight", OUT, IN);
    p.data = w, p.grad = grad;
    Linear l = {.weight = &p, .precision = precision};
    const Linear *all[] = {&l};
    Arena act;
    arena_init_sizing(&act, "act");
    StepCtx s = {.k = kernels_backend("cpu"), .act = &act, .B = 1, .T = ROWS};
    linear_reserve(&s, all, 1, ROWS, DTYPE_FP32);
    arena_commit(&act, NULL);
    Recipe r = recipe_of(precision);

    linear_forward(&l, &s, y, linear_fp32(x), ROWS, 0);
    ref_quantize(xq, x, ROWS, IN, r.x_fwd, r.pow2);
    ref_quantize(wq, w, OUT, IN, r.w_fwd, r.pow2);
    ref_gemm(want, xq, false, wq, false, ROWS, OUT, IN, mag);
    expect_close(y, want, mag, ROWS * OUT);

    linear_backward_input(&l, &s, dx, linear_fp32(dy), ROWS, 0);
    ref_quantize(gq, dy, ROWS, OUT, r.g_gi, r.pow2);
    ref_quantize(wq, w, OUT, IN, r.w_gi, r.pow2);
    ref_gemm(want, gq, false, wq, true, ROWS, IN, OUT, mag);  // dy (rows, out) W (out, in)
    expect_close(dx, want, mag, ROWS * IN);

    linear_backward_weight(&l, &s, linear_fp32(dy), linear_fp32(x),
                           ROWS);  // accumulates onto grad0
    ref_quantize(gq, dy, ROWS, OUT, r.g_gw, r.pow2);
    ref_quantize(xq, x, ROWS, IN, r.x_gw, r.pow2);
    ref_gemm(want, gq, true, xq, true, OUT, IN, ROWS, mag);  // dy^T (out, rows) x (rows, in)
    for (int i = 0; i < OUT * IN; i++) want[i] += grad0[i], mag[i] += fabs(grad0[i]);
    expect_close(grad, want, mag, OUT * IN);
    assert_int_equal(arena_mark(&act), 0);  // every cast given back
    arena_free(&act);
}

// Stacked experts (E, OUT, IN) on token groups with an empty one: torchao's _Float8GroupedMM,
// each group's GEMMs those of a rowwise Linear on its expert and its rows, every cast taken
// within the group or the expert (the weight gradient's per group along the tokens).
#define E 3
static void test_grouped_rowwise(void **state) {
    (void)state;
    static const int offsets[E + 1] = {0, 20, 20, ROWS};
    static float x[ROWS * IN], w[E * OUT * IN], dy[ROWS * OUT], grad[E * OUT * IN],
        y[ROWS * OUT], dx[ROWS * IN];
    static double xq[ROWS * IN], wq[OUT * IN], gq[ROWS * OUT], want[E * OUT * IN],
        mag[E * OUT * IN];
    fill(x, ROWS, IN, 5), fill(w, E * OUT, IN, 6), fill(dy, ROWS, OUT, 7);
    fill(grad, E * OUT, IN, 8);
    float grad0[E * OUT * IN];
    memcpy(grad0, grad, sizeof grad);
    Param p = {.ndim = 3, .global_shape = {E, OUT, IN}, .shape = {E, OUT, IN}, .expert = true};
    p.data = w, p.grad = grad;
    Linear l = {.weight = &p, .precision = LINEAR_FLOAT8_ROWWISE};
    const Linear *all[] = {&l};
    Arena act;
    arena_init_sizing(&act, "act");
    StepCtx s = {.k = kernels_backend("cpu"), .act = &act, .B = 1, .T = ROWS};
    linear_reserve(&s, all, 1, ROWS, DTYPE_FP32);
    arena_commit(&act, NULL);
    RefCast row = {PER_ROW, FLOAT8_E4M3FN}, col = {PER_COL, FLOAT8_E4M3FN};

    linear_grouped_forward(&l, &s, y, x, offsets, 0);
    linear_grouped_backward_input(&l, &s, dx, dy, offsets, 0);
    linear_grouped_backward_weight(&l, &s, dy, x, offsets);
    for (int e = 0; e < E; e++) {
        int r0 = offsets[e], m = offsets[e + 1] - r0;
        const float *we = w + (size_t)e * OUT * IN;
        ref_quantize(xq, x + r0 * IN, m, IN, row, true);
        ref_quantize(wq, we, OUT, IN, row, true);
        ref_gemm(want, xq, false, wq, false, m, OUT, IN, mag);
        expect_close(y + r0 * OUT, want, mag, m * OUT);

        ref_quantize(gq, dy + r0 * OUT, m, OUT, row, true);
        ref_quantize(wq, we, OUT, IN, col, true);
        ref_gemm(want, gq, false, wq, true, m, IN, OUT, mag);
        expect_close(dx + r0 * IN, want, mag, m * IN);

        ref_quantize(gq, dy + r0 * OUT, m, OUT, col, true);
        ref_quantize(xq, x + r0 * IN, m, IN, col, true);
        ref_gemm(want, gq, true, xq, true, OUT, IN, m, mag);  // an empty group adds nothing
        for (int i = 0; i < OUT * IN; i++)
            want[i] += grad0[e * OUT * IN + i], mag[i] += fabs(grad0[e * OUT * IN + i]);
        expect_close(grad + (size_t)e * OUT * IN, want, mag, OUT * IN);
    }
    assert_int_equal(arena_mark(&act), 0);
    arena_free(&act);
}
#undef E

static void test_tensorwise(void **state) {
    (void)state;
    check_recipe(LINEAR_FLOAT8_TENSORWISE);
}

static void test_rowwise(void **state) {
    (void)state;
    check_recipe(LINEAR_FLOAT8_ROWWISE);
}

static void test_rowwise_with_gw_hp(void **state) {
    (void)state;
    check_recipe(LINEAR_FLOAT8_ROWWISE_WITH_GW_HP);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precision_filters),
        cmocka_unit_test(test_tensorwise),
        cmocka_unit_test(test_rowwise),
        cmocka_unit_test(test_rowwise_with_gw_hp),
        cmocka_unit_test(test_precision_experts),
        cmocka_unit_test(test_grouped_rowwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
