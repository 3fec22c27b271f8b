// The cpu backend's float8 ops against naive references: float8_amax, float8_quantize and
// float8_transpose bit for bit against a per-element loop (amax in double, the scale as
// torchao's amax_to_scale computes it, its power-of-two rounding through libm's log2 as torch's
// exp2(floor(log2(s)))),
// and matmul_float8 against a double-precision GEMM of the same quantised operands, for the
// three GEMMs of a linear layer in torchao's tensorwise and rowwise recipes; grouped_matmul_float8
// likewise in both its forms (a group without rows among them), on operands cast per group by
// a reference rowwise cast.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#include "tests/unit/kernel_check.h"

static const KernelOps *ops;

// ---- quantize ------------------------------------------------------------------------------

// The scale of an amax, independently of float8.h's helpers: max / max(amax, 1e-12) in double
// rounded to float (torchao's amax_to_scale), then exp2(floor(log2(scale))) with a log2 correct
// to double precision rounded to float, as torch's fp32 log2 is.
static float ref_scale(double amax, Float8Kind kind, bool pow2) {
    double max = kind == FLOAT8_E4M3FN ? 448.0 : 57344.0;
    float scale = (float)(max / (amax < 1e-12 ? 1e-12 : amax));
    return pow2 ? exp2f(floorf((float)log2((double)scale))) : scale;
}

// Casts x (rows, cols) as cast says, with amax computed (given == NULL) or given, and checks
// the amax, the scales and every byte against the per-element reference.
static void quantize_check(const float *x, int rows, int cols, Float8Cast cast,
                           const float *given) {
    int count = !cast.rowwise ? 1 : cast.transpose ? cols : rows;
    float *amax = malloc((size_t)count * sizeof *amax), *scale_inv = malloc(count * sizeof(float));
    uint8_t *out = malloc((size_t)rows * cols);
    assert_true(amax && scale_inv && out);
    double *want_amax = doubles_zero((size_t)count);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            int i = !cast.rowwise ? 0 : cast.transpose ? c : r;
            double v = fabs((double)x[(size_t)r * cols + c]);
            if (v > want_amax[i]) want_amax[i] = v;
        }
    ops->float8_amax(amax, x, rows, cols, &cast);
    for (int i = 0; i < count; i++) assert_true(amax[i] == (float)want_amax[i]);
    if (given) memcpy(amax, given, (size_t)count * sizeof *amax);
    ops->float8_quantize(out, scale_inv, amax, x, rows, cols, &cast);
    for (int i = 0; i < count; i++) {
        float want = 1.0f / ref_scale(amax[i], cast.kind, cast.pow2_scales);
        if (memcmp(&scale_inv[i], &want, sizeof want) != 0)
            fail_msg("scale_inv[%d] = %a, want %a", i, scale_inv[i], want);
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            int i = !cast.rowwise ? 0 : cast.transpose ? c : r;
            float scaled = x[(size_t)r * cols + c] * ref_scale(amax[i], cast.kind,
                                                                cast.pow2_scales);
            uint8_t want = float8_from_float(scaled, cast.kind, true);
            size_t at = cast.transpose ? (size_t)c * rows + r : (size_t)r * cols + c;
            if (out[at] != want)
                fail_msg("x[%d][%d] = %a cast to 0x%02x, want 0x%02x", r, c,
                         x[(size_t)r * cols + c], out[at], want);
        }
    free(amax), free(scale_inv), free(out), free(want_amax);
}

// Values spread over many binades, so that rows' amaxes and scales differ by orders of
// magnitude and the casts meet subnormals as well as the top of the range.
static float *floats_wide(size_t n) {
    float *x = floats_random(n, 1.0);
    for (size_t i = 0; i < n; i++) x[i] *= (float)pow(2.0, 12.0 * rng_uniform());
    return x;
}

// Two shapes: one within a block of the cpu's transposed cast's columns, one of three blocks,
// the last partial.
static void test_quantize_forms(void **state) {
    (void)state;
    rng_seed(81);
    const int shapes[2][2] = {{23, 41}, {37, 150}};
    for (int s = 0; s < 2; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        float *x = floats_wide((size_t)rows * cols);
        for (int kind = FLOAT8_E4M3FN; kind <= FLOAT8_E5M2; kind++)
            for (int rowwise = 0; rowwise < 2; rowwise++)
                for (int transpose = 0; transpose < 2; transpose++)
                    for (int pow2 = 0; pow2 < 2; pow2++)
                        quantize_check(x, rows, cols,
                                       (Float8Cast){kind, rowwise, transpose, pow2}, NULL);
        free(x);
    }
}

// FSDP's all-reduced amax: larger than the shard's own, it scales the bytes down; smaller (a
// stale or wrong amax), values beyond it saturate to +-max.
static void test_quantize_caller_amax_and_saturation(void **state) {
    (void)state;
    rng_seed(82);
    int rows = 9, cols = 14;
    float *x = floats_random((size_t)rows * cols, 3.0);
    float larger = 1000.0f, smaller = 0.5f;
    for (int kind = FLOAT8_E4M3FN; kind <= FLOAT8_E5M2; kind++) {
        quantize_check(x, rows, cols, (Float8Cast){kind, false, false, false}, &larger);
        quantize_check(x, rows, cols, (Float8Cast){kind, false, true, false}, &smaller);
    }
    // The saturating cast itself: every value above amax lands on the largest code.
    uint8_t out[9 * 14];
    float scale_inv;
    ops->float8_quantize(out, &scale_inv, &smaller, x, rows, cols,
                         &(Float8Cast){FLOAT8_E4M3FN, false, false, false});
    int saturated = 0;
    for (int i = 0; i < rows * cols; i++)
        if (fabsf(x[i]) > 0.5f * 449.0f / 448.0f) {
            assert_int_equal(out[i] & 0x7f, 0x7e);
            saturated++;
        }
    assert_true(saturated > rows * cols / 2);
    free(x);
}

// An all-zero tensor (or row) gets amax 0, the scale max / 1e-12 and zero bytes.
static void test_quantize_zeros(void **state) {
    (void)state;
    int rows = 5, cols = 7;
    float x[5 * 7] = {0};
    x[3 * 7 + 2] = -2.5f;  // one row, and one column, not zero
    for (int rowwise = 0; rowwise < 2; rowwise++)
        for (int transpose = 0; transpose < 2; transpose++)
            quantize_check(x, rows, cols, (Float8Cast){FLOAT8_E4M3FN, rowwise, transpose, true},
                           NULL);
    memset(x, 0, sizeof x);
    float amax, scale_inv;
    uint8_t out[5 * 7];
    Float8Cast cast = {FLOAT8_E5M2, false, false, false};
    ops->float8_amax(&amax, x, rows, cols, &cast);
    ops->float8_quantize(out, &scale_inv, &amax, x, rows, cols, &cast);
    assert_true(amax == 0.0f);
    assert_true(scale_inv == 1.0f / (float)(57344.0 / 1e-12));
    for (int i = 0; i < rows * cols; i++) assert_int_equal(out[i], 0);
}

// float8_transpose moves every code (all 256, NaNs included) to its transposed place: a cast
// then transposed equals the transposed cast, bit for bit.
static void test_transpose(void **state) {
    (void)state;
    int rows = 37, cols = 80;  // odd rows, several of the cuda tiles' 32
    uint8_t *in = malloc((size_t)rows * cols), *out = malloc((size_t)rows * cols);
    assert_true(in && out);
    for (int i = 0; i < rows * cols; i++) in[i] = (uint8_t)(i * 7 + i / 256);
    ops->float8_transpose(out, in, rows, cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            assert_int_equal(out[(size_t)c * rows + r], in[(size_t)r * cols + c]);
    float *x = malloc((size_t)rows * cols * sizeof *x);
    uint8_t *cast_t = malloc((size_t)rows * cols);
    assert_true(x && cast_t);
    for (int i = 0; i < rows * cols; i++) x[i] = sinf((float)i) * (float)(i % 13);
    Float8Cast plain = {FLOAT8_E4M3FN, false, false, false}, transposed = plain;
    transposed.transpose = true;
    float amax, inv_plain, inv_t;
    ops->float8_amax(&amax, x, rows, cols, &plain);
    ops->float8_quantize(in, &inv_plain, &amax, x, rows, cols, &plain);
    ops->float8_quantize(cast_t, &inv_t, &amax, x, rows, cols, &transposed);
    ops->float8_transpose(out, in, rows, cols);
    assert_memory_equal(out, cast_t, (size_t)rows * cols);
    assert_true(inv_plain == inv_t);
    free(in), free(out), free(x), free(cast_t);
}

// A NaN anywhere makes the amax NaN (torch.amax propagates it), whatever comes after it.
static void test_amax_nan(void **state) {
    (void)state;
    float x[6] = {1.0f, NAN, 3.0f, -INFINITY, 2.0f, 0.5f}, amax[2];
    ops->float8_amax(amax, x, 2, 3, &(Float8Cast){FLOAT8_E4M3FN, true, false, false});
    assert_true(isnan(amax[0]));
    assert_true(isinf(amax[1]));
}

// torch's exp2(floor(log2(s))) for scales just below a power of two: the fp32 log2 rounds up
// to the integer there, so the "rounded down" scale is the power of two above (torch 1.13 on
// the cpu gives these values).
static void test_round_scale_pow2_edges(void **state) {
    (void)state;
    assert_true(float8_round_scale_pow2(nextafterf(512.0f, 0.0f)) == 512.0f);
    assert_true(float8_round_scale_pow2(512.0f * (1.0f - 6.0f / 16777216.0f)) == 256.0f);
    assert_true(float8_round_scale_pow2(nextafterf(1.0f, 0.0f)) == 0.5f);
    assert_true(float8_round_scale_pow2(nextafterf(0.25f, 0.0f)) == 0.25f);
    assert_true(float8_round_scale_pow2(448.0f / 3.0f) == 128.0f);
    assert_true(float8_round_scale_pow2(0.0f) == 0.0f);
    // Every scale within 128 ulps of a power of two, against the libm reference above.
    for (int e = -126; e < 127; e++)
        for (int k = -128; k <= 128; k++) {
            uint32_t bits = (uint32_t)((e + 127) << 23) + (uint32_t)k;  // k ulps away
            float s;
            memcpy(&s, &bits, sizeof s);
            float want = exp2f(floorf((float)log2((double)s)));
            if (float8_round_scale_pow2(s) != want)
                fail_msg("pow2(%a) = %a, want %a", s, float8_round_scale_pow2(s), want);
        }
}

// ---- matmul_float8 -------------------------------------------------------------------------

typedef struct {
    uint8_t *bytes;    // (rows, cols) K-contiguous
    float *scale_inv;  // (rows) or (1)
    Float8Kind kind;
    int rows, cols;
} Quantized;

// x (rows, cols) cast for a GEMM operand (transposed: the operand is x^T).
static Quantized quantize(const float *x, int rows, int cols, Float8Kind kind, bool rowwise,
                          bool transpose) {
    Float8Cast cast = {kind, rowwise, transpose, rowwise};  // pow2: torchao's rowwise recipe
    int out_rows = transpose ? cols : rows;
    Quantized q = {malloc((size_t)rows * cols), malloc((size_t)out_rows * sizeof(float)), kind,
                   out_rows, transpose ? rows : cols};
    float *amax = malloc((size_t)out_rows * sizeof *amax);
    assert_true(q.bytes && q.scale_inv && amax);
    ops->float8_amax(amax, x, rows, cols, &cast);
    ops->float8_quantize(q.bytes, q.scale_inv, amax, x, rows, cols, &cast);
    free(amax);
    return q;
}

// The unquantised product of a linear layer's GEMM, and the magnitude of its terms.
typedef struct {
    double *c;      // (m, n)
    double scale;   // max over (i, j) of sum_t |a_it b_tj|: what the casts' errors are relative to
} Exact;

// c (m, n) = (a scaled)(b scaled)^T + beta c through the op, checked against the double GEMM of
// the same decoded bytes and scales, and loosely against the unquantised product (each operand
// rounded to 3 or 2 mantissa bits, small ones flushed: it catches a scale used the wrong way
// round), its error relative to the terms' magnitude, which cancellation cannot shrink.
static void gemm_check(const char *what, const Quantized *a, const Quantized *b, bool rowwise,
                       float beta, const Exact *exact) {
    int m = a->rows, n = b->rows, k = a->cols;
    assert_int_equal(b->cols, k);
    float *c = floats_random((size_t)m * n, 1.0), *c0 = floats_copy(c, (size_t)m * n);
    double *want = doubles_zero((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int t = 0; t < k; t++)
                s += (double)float8_to_float(a->bytes[(size_t)i * k + t], a->kind) *
                     float8_to_float(b->bytes[(size_t)j * k + t], b->kind);
            double scale = (double)a->scale_inv[rowwise ? i : 0] * b->scale_inv[rowwise ? j : 0];
            want[(size_t)i * n + j] = s * scale + beta * c0[(size_t)i * n + j];
        }
    void *workspace = malloc(ops->matmul_float8_workspace_bytes(m, n, k));
    assert_non_null(workspace);
    ops->matmul_float8(c, a->bytes, a->scale_inv, a->kind, b->bytes, b->scale_inv, b->kind, m, n,
                       k, rowwise, beta, workspace);
    char label[96];
    snprintf(label, sizeof label, "%s (%s, beta %g)", what, rowwise ? "rowwise" : "tensorwise",
             beta);
    assert_close(label, c, want, (size_t)m * n, 2e-6);
    double err = 0;
    for (size_t i = 0; beta == 0.0f && i < (size_t)m * n; i++)
        err = fmax(err, fabs(c[i] - exact->c[i]));
    if (!(err <= 0.15 * exact->scale))
        fail_msg("%s: error %.3g against the unquantised product, terms up to %.3g", label, err,
                 exact->scale);
    free(c), free(c0), free(want), free(workspace);
}

static Exact gemm_exact(const float *a, const float *b, int m, int n, int k, bool trans_a,
                        bool trans_b) {
    Exact e = {doubles_zero((size_t)m * n), 0};
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double magnitude = 0;
            for (int t = 0; t < k; t++) {
                double term = (double)(trans_a ? a[(size_t)t * m + i] : a[(size_t)i * k + t]) *
                              (trans_b ? b[(size_t)j * k + t] : b[(size_t)t * n + j]);
                e.c[(size_t)i * n + j] += term;
                magnitude += fabs(term);
            }
            e.scale = fmax(e.scale, magnitude);
        }
    return e;
}

static void quantized_free(Quantized *q) { free(q->bytes), free(q->scale_inv); }

// A linear layer y = x w^T, x (M, K), w (N, K), dy (M, N), in a recipe: the forward, the input
// gradient and the weight gradient (accumulated, beta 1, as microbatches do).
static void linear_check(bool rowwise, int M, int K, int N) {
    rng_seed(83 + (uint64_t)rowwise);
    float *x = floats_wide((size_t)M * K), *w = floats_random((size_t)N * K, 0.05);
    float *dy = floats_random((size_t)M * N, 1e-3);
    Float8Kind grad_kind = rowwise ? FLOAT8_E4M3FN : FLOAT8_E5M2;
    Quantized x_fwd = quantize(x, M, K, FLOAT8_E4M3FN, rowwise, false);
    Quantized w_fwd = quantize(w, N, K, FLOAT8_E4M3FN, rowwise, false);
    Quantized dy_gi = quantize(dy, M, N, grad_kind, rowwise, false);
    Quantized w_gi = quantize(w, N, K, FLOAT8_E4M3FN, rowwise, true);
    Quantized dy_gw = quantize(dy, M, N, grad_kind, rowwise, true);
    Quantized x_gw = quantize(x, M, K, FLOAT8_E4M3FN, rowwise, true);
    Exact y = gemm_exact(x, w, M, N, K, false, true), dx = gemm_exact(dy, w, M, K, N, false, false);
    Exact dw = gemm_exact(dy, x, N, K, M, true, false);
    for (int beta = 0; beta < 2; beta++) {
        gemm_check("output = input weight^T", &x_fwd, &w_fwd, rowwise, (float)beta, &y);
        gemm_check("grad_input = grad_output weight", &dy_gi, &w_gi, rowwise, (float)beta, &dx);
        gemm_check("grad_weight = grad_output^T input", &dy_gw, &x_gw, rowwise, (float)beta,
                   &dw);
    }
    Quantized *all[] = {&x_fwd, &w_fwd, &dy_gi, &w_gi, &dy_gw, &x_gw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) quantized_free(all[i]);
    free(x), free(w), free(dy), free(y.c), free(dx.c), free(dw.c);
}

static void test_linear_tensorwise(void **state) {
    (void)state;
    linear_check(false, 37, 53, 29);
}

static void test_linear_rowwise(void **state) {
    (void)state;
    linear_check(true, 37, 53, 29);
    linear_check(true, 1, 17, 3);
}

// ---- grouped_matmul_float8 ------------------------------------------------------------------

// x (rows, cols) cast e4m3fn with a power-of-two scale per row (transpose false: the bytes are
// x's rows) or per column (true: the bytes are (cols, rows)), by the host's cast per element
// and the reference's scale: torchao's rowwise cast, independently of the op's kernels.
static void ref_cast(uint8_t *bytes, float *scale_inv, const float *x, int rows, int cols,
                     bool transpose) {
    int out_rows = transpose ? cols : rows, out_cols = transpose ? rows : cols;
    for (int o = 0; o < out_rows; o++) {
        double amax = 0;
        for (int i = 0; i < out_cols; i++)
            amax = fmax(amax, fabs(x[transpose ? (size_t)i * cols + o : (size_t)o * cols + i]));
        float scale = ref_scale(amax, FLOAT8_E4M3FN, true);
        scale_inv[o] = 1.0f / scale;
        for (int i = 0; i < out_cols; i++)
            bytes[(size_t)o * out_cols + i] = float8_from_float(
                x[transpose ? (size_t)i * cols + o : (size_t)o * cols + i] * scale,
                FLOAT8_E4M3FN, true);
    }
}

// sum_t a[i][t] b[j][t] of the decoded rows (each (len) bytes), times their scales, in double.
static double ref_dot(const uint8_t *a, float a_scale_inv, const uint8_t *b, float b_scale_inv,
                      int len) {
    double s = 0;
    for (int t = 0; t < len; t++)
        s += (double)float8_to_float(a[t], FLOAT8_E4M3FN) * float8_to_float(b[t], FLOAT8_E4M3FN);
    return s * a_scale_inv * b_scale_inv;
}

#define GROUPS 4
static const int group_offsets[GROUPS + 1] = {0, 7, 7, 26, 29};  // group 1 has no rows

// The forward form: c[R_g] = a[R_g] b_g^T, a (rows, k) cast per row, b (GROUPS, n, k) per row.
static void grouped_rows_check(int n, int k, float beta) {
    int rows = group_offsets[GROUPS];
    float *x = floats_wide((size_t)rows * k), *w = floats_random((size_t)GROUPS * n * k, 0.05);
    uint8_t *a = malloc((size_t)rows * k), *b = malloc((size_t)GROUPS * n * k);
    float *a_si = malloc((size_t)rows * sizeof(float)), *b_si = malloc(GROUPS * n * sizeof(float));
    assert_true(a && b && a_si && b_si);
    ref_cast(a, a_si, x, rows, k, false);
    ref_cast(b, b_si, w, GROUPS * n, k, false);
    float *c = floats_random((size_t)rows * n, 1.0), *c0 = floats_copy(c, (size_t)rows * n);
    double *want = doubles_zero((size_t)rows * n);
    for (int g = 0; g < GROUPS; g++)
        for (int i = group_offsets[g]; i < group_offsets[g + 1]; i++)
            for (int j = 0; j < n; j++) {
                size_t bj = (size_t)g * n + j;
                want[(size_t)i * n + j] = ref_dot(a + (size_t)i * k, a_si[i], b + bj * k,
                                                  b_si[bj], k) + beta * c0[(size_t)i * n + j];
            }
    void *workspace = malloc(ops->grouped_matmul_float8_workspace_bytes(rows, GROUPS, n, k, false));
    assert_non_null(workspace);
    ops->grouped_matmul_float8(c, a, a_si, b, b_si, group_offsets, GROUPS, n, k, false, beta,
                               workspace);
    assert_close("grouped_matmul_float8 forward", c, want, (size_t)rows * n, 2e-6);
    free(x), free(w), free(a), free(b), free(a_si), free(b_si), free(c), free(c0), free(want);
    free(workspace);
}

// The weight-gradient form: c_g (k, n) = dy[R_g]^T x[R_g], both cast per column within the
// group (torchao's per-group column scales), an empty group giving beta c_g.
static void grouped_tokens_check(int n, int k, float beta) {
    int rows = group_offsets[GROUPS];
    float *dy = floats_wide((size_t)rows * k), *x = floats_wide((size_t)rows * n);
    uint8_t *a = malloc((size_t)rows * k), *b = malloc((size_t)rows * n);
    float *a_si = malloc(GROUPS * k * sizeof(float)), *b_si = malloc(GROUPS * n * sizeof(float));
    assert_true(a && b && a_si && b_si);
    for (int g = 0; g < GROUPS; g++) {
        int r0 = group_offsets[g], m = group_offsets[g + 1] - r0;
        ref_cast(a + (size_t)r0 * k, a_si + g * k, dy + (size_t)r0 * k, m, k, true);
        ref_cast(b + (size_t)r0 * n, b_si + g * n, x + (size_t)r0 * n, m, n, true);
    }
    size_t count = (size_t)GROUPS * k * n;
    float *c = floats_random(count, 1.0), *c0 = floats_copy(c, count);
    double *want = doubles_zero(count);
    for (int g = 0; g < GROUPS; g++) {
        int r0 = group_offsets[g], m = group_offsets[g + 1] - r0;
        for (int i = 0; i < k; i++)
            for (int j = 0; j < n; j++) {
                size_t at = ((size_t)g * k + i) * n + j;
                want[at] = ref_dot(a + (size_t)r0 * k + (size_t)i * m, a_si[g * k + i],
                                   b + (size_t)r0 * n + (size_t)j * m, b_si[g * n + j], m) +
                           beta * c0[at];
            }
    }
    void *workspace = malloc(ops->grouped_matmul_float8_workspace_bytes(rows, GROUPS, n, k, true));
    assert_non_null(workspace);
    ops->grouped_matmul_float8(c, a, a_si, b, b_si, group_offsets, GROUPS, n, k, true, beta,
                               workspace);
    assert_close("grouped_matmul_float8 weight gradient", c, want, count, 2e-6);
    for (size_t i = (size_t)1 * k * n; i < (size_t)2 * k * n; i++)  // the empty group: beta c
        assert_true(c[i] == beta * c0[i]);
    free(dy), free(x), free(a), free(b), free(a_si), free(b_si), free(c), free(c0), free(want);
    free(workspace);
}

static void test_grouped(void **state) {
    (void)state;
    rng_seed(97);
    for (int beta = 0; beta < 2; beta++) {
        grouped_rows_check(24, 40, (float)beta);
        grouped_tokens_check(24, 40, (float)beta);
    }
    grouped_rows_check(3, 17, 0);
    grouped_tokens_check(3, 17, 1);
}

static int setup_backend(void **state) {
    (void)state;
    ops = kernels_backend("cpu");
    char why[256];
    return ops && ops->init(&(KernelInit){0}, why, sizeof why) ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_forms),
        cmocka_unit_test(test_quantize_caller_amax_and_saturation),
        cmocka_unit_test(test_quantize_zeros),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_amax_nan),
        cmocka_unit_test(test_round_scale_pow2_edges),
        cmocka_unit_test(test_linear_tensorwise),
        cmocka_unit_test(test_linear_rowwise),
        cmocka_unit_test(test_grouped),
    };
    return cmocka_run_group_tests(tests, setup_backend, NULL);
}
