// The cpu backend's bf16 compute (KernelInit.precision bf16, kernels/cpu/gemm_bf16.c): matmul and
// grouped_matmul must equal an exact emulation of cuda's contract, the inputs rounded to bf16
// (nearest even, core/bf16.h) and the products summed in double, within fp32 summation-order
// error (FWD_TOL, normalised); and must differ from the unrounded product by bf16's rounding,
// which proves the inputs really were rounded. bf16 operands (the stored activations of bf16
// mixed precision) must give the very bits of their fp32 values rounded at the call, and the
// typed outputs of rmsnorm and SwiGLU the bits of their fp32 outputs rounded; a Linear on bf16
// activations the bits of one on fp32 activations holding the same values, in every precision;
// attention within bf16's error of the double attention of its rounded inputs, under every
// mask. Its own binary: the bf16 path, once started, stays on for the process.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "kernels/kernels.h"
#include "models/linear.h"

#include "tests/unit/kernel_check.h"

static const KernelOps *ops;

// Far above the fp32 summation error FWD_TOL allows, far below bf16's: the unrounded product
// differs from the bf16 one by about 2^-9 of its scale.
#define BF16_ROUNDING_MIN 1e-4
// Attention rounds P and dS to bf16 too, between its GEMMs: measured up to 0.9e-3 (out) and
// 4.2e-3 (dq, whose dS = P (dP - D) cancels) of the scale.
#define BF16_ATTENTION_TOL 1e-2

static double bf16_rounded(float x) { return bf16_to_float(bf16_from_float(x)); }

// Element (i, j) of op(x), x dense row-major with cols columns as stored.
static double element(const float *x, int cols, bool trans, int i, int j, bool round) {
    float v = trans ? x[(size_t)j * cols + i] : x[(size_t)i * cols + j];
    return round ? bf16_rounded(v) : v;
}

// c (m, n) = op(a) op(b) + beta c0 in double, from the rounded or the exact inputs.
static double *matmul_reference(const float *a, const float *b, const float *c0, int m, int n,
                                int k, bool ta, bool tb, float beta, bool round) {
    double *c = doubles_zero((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = beta == 0.0f ? 0.0 : beta * (double)c0[(size_t)i * n + j];
            for (int p = 0; p < k; p++)
                s += element(a, ta ? m : k, ta, i, p, round) *
                     element(b, tb ? k : n, tb, p, j, round);
            c[(size_t)i * n + j] = s;
        }
    return c;
}

// max |got - want| / max |want|, as assert_close measures it.
static double normalised_error(const float *got, const double *want, size_t n) {
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs(got[i] - want[i]));
        scale = fmax(scale, fabs(want[i]));
    }
    return err / scale;
}

static uint16_t *bf16_copy(const float *x, size_t n) {
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf16_from_float(x[i]);
    return y;
}

static void matmul_check(int m, int n, int k, bool ta, bool tb, float beta) {
    float *a = floats_random((size_t)m * k, 1.0), *b = floats_random((size_t)k * n, 1.0);
    float *c0 = floats_random((size_t)m * n, 1.0), *c = floats_copy(c0, (size_t)m * n);
    if (beta == 0.0f)
        for (size_t i = 0; i < (size_t)m * n; i++) c[i] = NAN;  // beta 0: c is not read
    ops->matmul(c, a, b, DTYPE_FP32, m, n, k, ta, tb, beta);
    double *want = matmul_reference(a, b, c0, m, n, k, ta, tb, beta, true);
    double *exact = matmul_reference(a, b, c0, m, n, k, ta, tb, beta, false);
    char what[96];
    snprintf(what, sizeof what, "bf16 matmul %dx%dx%d ta=%d tb=%d beta=%g", m, n, k, ta, tb, beta);
    assert_close(what, c, want, (size_t)m * n, FWD_TOL);
    assert_true(normalised_error(c, exact, (size_t)m * n) > BF16_ROUNDING_MIN);
    // The same operands stored in bf16.
    uint16_t *a16 = bf16_copy(a, (size_t)m * k), *b16 = bf16_copy(b, (size_t)k * n);
    float *c16 = floats_copy(c0, (size_t)m * n);
    ops->matmul(c16, a16, b16, DTYPE_BF16, m, n, k, ta, tb, beta);
    assert_memory_equal(c16, c, (size_t)m * n * sizeof *c);
    free(a), free(b), free(c0), free(c), free(want), free(exact), free(a16), free(b16), free(c16);
}

// Every transpose and beta, a shape below one kernel block and one above, each twice (the
// second call reuses the primitive the first made).
static void test_bf16_matmul(void **state) {
    (void)state;
    rng_seed(41);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++)
                for (int again = 0; again < 2; again++) {
                    matmul_check(5, 7, 3, ta, tb, (float)beta);
                    matmul_check(67, 129, 257, ta, tb, (float)beta);
                }
}

// Groups of 0, 1, a few and many rows (the last more than a thread's share, which runs outside
// the OpenMP region), for the forward (a b_g^T), input gradient (a b_g) and weight gradient
// (a_g^T b_g) forms, with beta 0 and 1.
#define GROUPS 5
static const int offsets[GROUPS + 1] = {0, 0, 1, 4, 40, 140};

static void grouped_check(int n, int k, bool ta, bool tb, float beta) {
    int rows = offsets[GROUPS];
    size_t as = (size_t)rows * k, bs = ta ? (size_t)rows * n : (size_t)GROUPS * n * k;
    size_t cs = ta ? (size_t)GROUPS * k * n : (size_t)rows * n;
    float *a = floats_random(as, 1.0), *b = floats_random(bs, 1.0), *c0 = floats_random(cs, 1.0);
    float *c = floats_copy(c0, cs);
    ops->grouped_matmul(c, a, b, offsets, GROUPS, n, k, ta, tb, beta);
    double *want = doubles_zero(cs), *exact = doubles_zero(cs);
    for (int round = 0; round < 2; round++)
        for (int g = 0; g < GROUPS; g++) {
            size_t r0 = (size_t)offsets[g];
            int m = offsets[g + 1] - offsets[g];
            double *ref, *into = round ? want : exact;
            size_t at, len;
            if (ta) {  // c_g (k, n) = a[R_g]^T b[R_g]
                at = (size_t)g * k * n, len = (size_t)k * n;
                ref = matmul_reference(a + r0 * k, b + r0 * n, c0 + at, k, n, m, true, false, beta,
                                       round);
            } else {  // c[R_g] = a[R_g] op(b_g)
                at = r0 * n, len = (size_t)m * n;
                ref = matmul_reference(a + r0 * k, b + (size_t)g * n * k, c0 + at, m, n, k, false,
                                       tb, beta, round);
            }
            memcpy(into + at, ref, len * sizeof *ref);
            free(ref);
        }
    char what[96];
    snprintf(what, sizeof what, "bf16 grouped_matmul n %d k %d ta %d tb %d beta %g", n, k, ta, tb,
             beta);
    assert_close(what, c, want, cs, FWD_TOL);
    assert_true(normalised_error(c, exact, cs) > BF16_ROUNDING_MIN);
    free(a), free(b), free(c0), free(c), free(want), free(exact);
}

static void test_bf16_grouped_matmul(void **state) {
    (void)state;
    rng_seed(43);
    for (int beta = 0; beta < 2; beta++) {
        grouped_check(24, 40, false, true, (float)beta);
        grouped_check(24, 40, false, false, (float)beta);
        grouped_check(24, 40, true, false, (float)beta);
    }
}

// The describe line names the bf16 GEMMs once the path is on: oneDNN's implementation, or the
// emulation (as where DNNL_MAX_CPU_ISA=AVX2 hides oneDNN's bf16 kernels).
static void test_bf16_describe(void **state) {
    (void)state;
    char line[512];
    ops->describe(line, sizeof line);
    assert_true(strstr(line, "bf16 matmul (") || strstr(line, "bf16-rounded inputs through sgemm"));
}

// out16 (n) must hold exactly the fp32 out (n) rounded.
static void assert_rounded(const char *what, const uint16_t *out16, const float *out, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (out16[i] != bf16_from_float(out[i]))
            fail_msg("%s: element %zu is 0x%04x, the fp32 output %.9g rounds to 0x%04x", what, i,
                     out16[i], out[i], bf16_from_float(out[i]));
}

// rmsnorm_forward and swiglu_forward with bf16 outputs (the inputs include a NaN and values
// that round up past a binade); rstd as fp32's.
static void test_bf16_outputs(void **state) {
    (void)state;
    rng_seed(47);
    int n = 9, dim = 36;
    size_t nd = (size_t)n * dim;
    float *x = floats_random(nd, 3.0), *w = floats_random(dim, 1.0), *up = floats_random(nd, 1.0);
    x[5] = NAN, up[7] = 1.0f + 0x1.ffp-8f;  // silu(x) * up rounds up at the bf16 cut
    float *out = floats_random(nd, 1.0), *rstd = floats_random(n, 1.0);
    float *rstd16 = floats_random(n, 1.0);
    uint16_t *out16 = malloc(nd * sizeof *out16);
    ops->rmsnorm_forward(out, DTYPE_FP32, rstd, x, w, n, dim, 1e-5f);
    ops->rmsnorm_forward(out16, DTYPE_BF16, rstd16, x, w, n, dim, 1e-5f);
    assert_rounded("rmsnorm_forward bf16", out16, out, nd);
    assert_memory_equal(rstd16, rstd, n * sizeof *rstd);
    ops->swiglu_forward(out, DTYPE_FP32, x, up, nd);
    ops->swiglu_forward(out16, DTYPE_BF16, x, up, nd);
    assert_rounded("swiglu_forward bf16", out16, out, nd);
    free(x), free(w), free(up), free(out), free(rstd), free(rstd16), free(out16);
}

// A Linear's three GEMMs on bf16 activations, and on fp32 ones holding the same (bf16) values:
// the same bits, for the backend's precision (the weight cast at the call) and for float8
// (the activations widened before the casts).
#define LROWS 24
#define LIN 48
#define LOUT 32

typedef struct {
    float y[LROWS * LOUT], dx[LROWS * LIN], dw[LOUT * LIN];
} LinearOut;

static void linear_run(LinearPrecision precision, Dtype dtype, const float *x, const float *dy,
                       const float *w, LinearOut *o) {
    Param p = {.ndim = 2, .global_shape = {LOUT, LIN}, .shape = {LOUT, LIN}};
    float wcopy[LOUT * LIN];
    memcpy(wcopy, w, sizeof wcopy);
    memset(o, 0, sizeof *o);
    p.data = wcopy, p.grad = o->dw;
    Linear l = {.weight = &p, .precision = precision};
    Arena act;
    arena_init_sizing(&act, "act");
    StepCtx s = {.k = ops, .act = &act, .B = 1, .T = LROWS, .act_dtype = dtype};
    linear_reserve(&s, (const Linear *[]){&l}, 1, LROWS, dtype);
    arena_commit(&act, NULL);
    uint16_t x16[LROWS * LIN], dy16[LROWS * LOUT];
    ops->to_bf16(x16, x, LROWS * LIN);
    ops->to_bf16(dy16, dy, LROWS * LOUT);
    LinearAct xa = dtype == DTYPE_BF16 ? linear_act(x16, dtype) : linear_fp32(x);
    LinearAct dya = dtype == DTYPE_BF16 ? linear_act(dy16, dtype) : linear_fp32(dy);
    linear_forward(&l, &s, o->y, xa, LROWS, 0);
    linear_backward_input(&l, &s, o->dx, dya, LROWS, 0);
    linear_backward_weight(&l, &s, dya, xa, LROWS);
    arena_free(&act);
}

static void test_bf16_linear(void **state) {
    (void)state;
    rng_seed(53);
    float *x = floats_random(LROWS * LIN, 2.0), *dy = floats_random(LROWS * LOUT, 1.0);
    float *w = floats_random(LOUT * LIN, 0.5);
    for (int i = 0; i < LROWS * LIN; i++) x[i] = (float)bf16_rounded(x[i]);
    for (int i = 0; i < LROWS * LOUT; i++) dy[i] = (float)bf16_rounded(dy[i]);
    LinearPrecision all[] = {LINEAR_BACKEND, LINEAR_FLOAT8_TENSORWISE, LINEAR_FLOAT8_ROWWISE,
                             LINEAR_FLOAT8_ROWWISE_WITH_GW_HP};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        LinearOut fp32, bf16;
        linear_run(all[i], DTYPE_FP32, x, dy, w, &fp32);
        linear_run(all[i], DTYPE_BF16, x, dy, w, &bf16);
        assert_memory_equal(&bf16, &fp32, sizeof fp32);
    }
    free(x), free(dy), free(w);
}

// ---- attention --------------------------------------------------------------------------------

// Attention's forward and backward in double from bf16-rounded q, k, v and dO (or the exact
// ones): out (B, Tq, H, hd), dq like it, dk and dv (B, Tk, KV, hd).
typedef struct {
    double *out, *dq, *dk, *dv;
} AttnRef;

static bool attn_sees(const AttnShape *s, int b, int i, int j) {
    if (s->mask == ATTN_NONE) return true;
    if (s->kv_start + j > s->q_start + i) return false;
    return s->mask != ATTN_DOCUMENT ||
           s->q_doc[(size_t)b * s->Tq + i] == s->kv_doc[(size_t)b * s->Tk + j];
}

static AttnRef attn_reference(const AttnShape *s, const float *q, const float *k, const float *v,
                              const float *dout, bool round) {
    int H = s->n_heads, KV = s->n_kv_heads, hd = s->head_dim, Tq = s->Tq, Tk = s->Tk;
    size_t nq = (size_t)s->B * Tq * H * hd, nk = (size_t)s->B * Tk * KV * hd;
    AttnRef r = {doubles_zero(nq), doubles_zero(nq), doubles_zero(nk), doubles_zero(nk)};
    double scale = 1.0 / sqrt((double)hd), *p = doubles_zero((size_t)Tk);
#define RD(x) (round ? bf16_rounded(x) : (double)(x))
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                size_t qi = (((size_t)b * Tq + i) * H + h) * hd;
                double mx = -INFINITY, sum = 0.0, d = 0.0;
                for (int j = 0; j < Tk; j++) {
                    size_t kj = (((size_t)b * Tk + j) * KV + h / (H / KV)) * hd;
                    double sc = 0.0;
                    for (int c = 0; c < hd; c++) sc += RD(q[qi + c]) * RD(k[kj + c]);
                    p[j] = attn_sees(s, b, i, j) ? sc * scale : -INFINITY;
                    mx = fmax(mx, p[j]);
                }
                if (mx == -INFINITY) continue;  // sees no key: out 0, no gradient
                for (int j = 0; j < Tk; j++) sum += p[j] = exp(p[j] - mx);
                for (int j = 0; j < Tk; j++) {
                    size_t kj = (((size_t)b * Tk + j) * KV + h / (H / KV)) * hd;
                    p[j] /= sum;
                    for (int c = 0; c < hd; c++) r.out[qi + c] += p[j] * RD(v[kj + c]);
                }
                for (int c = 0; c < hd; c++) d += RD(dout[qi + c]) * r.out[qi + c];
                for (int j = 0; j < Tk; j++) {
                    size_t kj = (((size_t)b * Tk + j) * KV + h / (H / KV)) * hd;
                    double dp = 0.0;
                    for (int c = 0; c < hd; c++) dp += RD(dout[qi + c]) * RD(v[kj + c]);
                    double ds = p[j] * (dp - d);
                    for (int c = 0; c < hd; c++) {
                        r.dq[qi + c] += scale * ds * RD(k[kj + c]);
                        r.dk[kj + c] += scale * ds * RD(q[qi + c]);
                        r.dv[kj + c] += p[j] * RD(dout[qi + c]);
                    }
                }
            }
#undef RD
    free(p);
    return r;
}

static void attn_ref_free(AttnRef *r) { free(r->out), free(r->dq), free(r->dk), free(r->dv); }

// Document ids from the global positions where documents start.
static int *attn_docs(int B, int T, int start, const int *cuts, int n_cuts) {
    int *doc = malloc((size_t)B * T * sizeof *doc);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int d = 0;
            while (d < n_cuts && cuts[d] <= start + t) d++;
            doc[(size_t)b * T + t] = d;
        }
    return doc;
}

// Under bf16 compute, attention's tiles take bf16 q, k, v, dO, P and dS and sum in fp32: within
// bf16's error of the double attention of the rounded inputs, and not the exact inputs' (which
// proves the rounding happened).
static void attn_bf16_check(AttnShape s) {
    size_t nq = (size_t)s.B * s.Tq * s.n_heads * s.head_dim;
    size_t nk = (size_t)s.B * s.Tk * s.n_kv_heads * s.head_dim;
    size_t nl = (size_t)s.B * s.n_heads * s.Tq;
    float *q = floats_random(nq, 2.0), *k = floats_random(nk, 2.0), *v = floats_random(nk, 1.0);
    float *dout = floats_random(nq, 1.0), *out = floats_random(nq, 1.0);
    float *lse = floats_random(nl, 1.0);
    float *dq = calloc(nq, sizeof *dq), *dk = calloc(nk, sizeof *dk), *dv = calloc(nk, sizeof *dv);
    void *workspace = malloc(ops->attention_workspace_bytes(&s));
    ops->attention_forward(out, lse, q, k, v, &s, workspace);
    ops->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, &s, workspace);
    AttnRef want = attn_reference(&s, q, k, v, dout, true);
    AttnRef exact = attn_reference(&s, q, k, v, dout, false);
    const float *got[] = {out, dq, dk, dv};
    const double *wants[] = {want.out, want.dq, want.dk, want.dv};
    const double *exacts[] = {exact.out, exact.dq, exact.dk, exact.dv};
    size_t n[] = {nq, nq, nk, nk};
    const char *names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++) {
        char what[96];
        snprintf(what, sizeof what, "bf16 attention %s (hd %d, mask %d)", names[i], s.head_dim,
                 (int)s.mask);
        assert_close(what, got[i], wants[i], n[i], BF16_ATTENTION_TOL);
        assert_true(normalised_error(got[i], exacts[i], n[i]) > BF16_ROUNDING_MIN);
    }
    attn_ref_free(&want), attn_ref_free(&exact);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(workspace);
}

// Causal with a partial last tile, an odd head_dim (a zero-padded bf16 pair) and GQA; a query
// chunk against keys elsewhere, by document, where a tile's first key (21, odd) moves back to
// pair with 20; no mask, head_dim 40 (2-vector and 1-vector column strips); a causal query
// chunk against a longer key chunk, head_dim 32 (gradients added in place, slabs cut by
// position).
static void test_bf16_attention(void **state) {
    (void)state;
    rng_seed(47);
    attn_bf16_check((AttnShape){2, 70, 70, 4, 2, 15, 0, 0, ATTN_CAUSAL, NULL, NULL, DTYPE_BF16});
    int cuts[] = {51, 90};
    int *q_doc = attn_docs(1, 40, 80, cuts, 2), *kv_doc = attn_docs(1, 60, 30, cuts, 2);
    attn_bf16_check(
        (AttnShape){1, 40, 60, 2, 1, 16, 80, 30, ATTN_DOCUMENT, q_doc, kv_doc, DTYPE_BF16});
    free(q_doc), free(kv_doc);
    attn_bf16_check((AttnShape){1, 9, 33, 2, 2, 40, 0, 0, ATTN_NONE, NULL, NULL, DTYPE_BF16});
    attn_bf16_check((AttnShape){1, 70, 90, 2, 2, 32, 40, 0, ATTN_CAUSAL, NULL, NULL, DTYPE_BF16});
    // head_dim 16 with an odd count of keys and of a tile's rows: the last pair of rows and
    // the last 16 halves of k's words each half zeros
    attn_bf16_check((AttnShape){1, 67, 37, 2, 1, 16, 30, 0, ATTN_CAUSAL, NULL, NULL, DTYPE_BF16});
}

static int setup_bf16(void **state) {
    (void)state;
    ops = kernels_backend("cpu");
    KernelInit init = {.precision.param = DTYPE_BF16};
    char why[256];
    if (!ops || !ops->init(&init, why, sizeof why)) return -1;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_matmul),
        cmocka_unit_test(test_bf16_grouped_matmul),
        cmocka_unit_test(test_bf16_describe),
        cmocka_unit_test(test_bf16_outputs),
        cmocka_unit_test(test_bf16_linear),
        cmocka_unit_test(test_bf16_attention),
    };
    return cmocka_run_group_tests(tests, setup_bf16, NULL);
}
