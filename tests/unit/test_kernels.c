// The cpu backend against independent references: every forward against a naive double-
// precision loop, every backward against central finite differences of that loop (loss =
// sum(out * w) for fixed random w) and against a naive analytic backward. Gradient buffers
// start from random values, so each check also asserts that backward ops accumulate.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "kernels/kernels.h"

#include "tests/unit/kernel_check.h"

static const KernelOps *ops;

// ---- registry ------------------------------------------------------------------------------

static void test_backend_registry(void **state) {
    (void)state;
    const KernelOps *cpu = kernels_backend("cpu");
    assert_non_null(cpu);
    assert_string_equal(cpu->name, "cpu");
    assert_non_null(cpu->matmul);
    assert_non_null(cpu->attention_backward);
    assert_non_null(cpu->attention_merge);
    assert_non_null(cpu->adamw_update);
    assert_null(kernels_backend("cuda"));
    assert_null(kernels_backend("tpu"));
}

// ---- matmul --------------------------------------------------------------------------------

static void matmul_check(int m, int n, int k, bool ta, bool tb, float beta) {
    float *a = floats_random((size_t)m * k, 1.0), *b = floats_random((size_t)k * n, 1.0);
    float *c0 = floats_random((size_t)m * n, 1.0), *c = floats_copy(c0, (size_t)m * n);
    if (beta == 0.0f)
        for (int i = 0; i < m * n; i++) c[i] = NAN; // beta == 0 must not read c
    ops->matmul(c, a, b, DTYPE_FP32, m, n, k, ta, tb, beta);
    double *want = doubles_zero((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = beta * (double)c0[i * n + j];
            for (int p = 0; p < k; p++)
                s +=
                    (double)(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
            want[i * n + j] = s;
        }
    char what[64];
    snprintf(what, sizeof what, "matmul %dx%dx%d ta=%d tb=%d beta=%g", m, n, k, ta, tb, beta);
    assert_close(what, c, want, (size_t)m * n, FWD_TOL);
    free(a), free(b), free(c0), free(c), free(want);
}

static void test_matmul_transposes_and_beta(void **state) {
    (void)state;
    rng_seed(1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) {
                matmul_check(5, 7, 3, ta, tb, (float)beta);
                matmul_check(33, 17, 65, ta, tb, (float)beta);
            }
}

// ---- rmsnorm -------------------------------------------------------------------------------

typedef struct RmsCase {
    int n, dim;
    float eps;
    double *x, *w;     // (n, dim), (dim)
    const float *dout; // the loss weights
} RmsCase;

static void rmsnorm_ref(double *out, double *rstd, const RmsCase *c) {
    for (int i = 0; i < c->n; i++) {
        double ss = 0.0;
        for (int j = 0; j < c->dim; j++) ss += c->x[i * c->dim + j] * c->x[i * c->dim + j];
        double r = 1.0 / sqrt(ss / c->dim + c->eps);
        if (rstd) rstd[i] = r;
        for (int j = 0; j < c->dim; j++) out[i * c->dim + j] = c->x[i * c->dim + j] * r * c->w[j];
    }
}

static double rmsnorm_loss(const void *ctx) {
    const RmsCase *c = ctx;
    double *out = doubles_zero((size_t)c->n * c->dim);
    rmsnorm_ref(out, NULL, c);
    double l = dot_weights(out, c->dout, (size_t)c->n * c->dim);
    free(out);
    return l;
}

// Through the full Jacobian dy_i/dx_j = w_i (r delta_ij - r^3 x_i x_j / dim).
static void rmsnorm_ref_backward(double *dx, double *dw, const RmsCase *c) {
    for (int i = 0; i < c->n; i++) {
        const double *x = c->x + i * c->dim;
        const float *g = c->dout + i * c->dim;
        double ss = 0.0;
        for (int j = 0; j < c->dim; j++) ss += x[j] * x[j];
        double r = 1.0 / sqrt(ss / c->dim + c->eps);
        for (int j = 0; j < c->dim; j++) {
            dw[j] += g[j] * x[j] * r;
            for (int o = 0; o < c->dim; o++)
                dx[i * c->dim + j] +=
                    g[o] * c->w[o] * ((o == j) * r - r * r * r * x[o] * x[j] / c->dim);
        }
    }
}

static void test_rmsnorm(void **state) {
    (void)state;
    rng_seed(2);
    int n = 6, dim = 40; // dim not a multiple of the 32-column dweight chunk
    size_t nd = (size_t)n * dim;
    float *x = floats_random(nd, 2.0), *w = floats_random(dim, 1.0), *dout = floats_random(nd, 1.0);
    float *out = floats_random(nd, 1.0), *rstd = floats_random(n, 1.0);
    RmsCase c = {n, dim, 1e-5f, doubles_from(x, nd), doubles_from(w, dim), dout};
    ops->rmsnorm_forward(out, DTYPE_FP32, rstd, x, w, n, dim, c.eps);
    double *want = doubles_zero(nd), *want_rstd = doubles_zero(n);
    rmsnorm_ref(want, want_rstd, &c);
    assert_close("rmsnorm out", out, want, nd, FWD_TOL);
    assert_close("rmsnorm rstd", rstd, want_rstd, n, FWD_TOL);

    float *dx0 = floats_random(nd, 1.0), *dw0 = floats_random(dim, 1.0);
    float *dx = floats_copy(dx0, nd), *dw = floats_copy(dw0, dim);
    ops->rmsnorm_backward(dx, dw, dout, x, w, rstd, n, dim);
    double *ref_dx = doubles_zero(nd), *ref_dw = doubles_zero(dim);
    rmsnorm_ref_backward(ref_dx, ref_dw, &c);
    double *fd_dx = fd_gradient(c.x, nd, rmsnorm_loss, &c);
    double *fd_dw = fd_gradient(c.w, dim, rmsnorm_loss, &c);
    double *want_dx = doubles_sum(dx0, ref_dx, nd), *want_dw = doubles_sum(dw0, ref_dw, dim);
    double *fdw_dx = doubles_sum(dx0, fd_dx, nd), *fdw_dw = doubles_sum(dw0, fd_dw, dim);
    assert_close("rmsnorm dx", dx, want_dx, nd, FWD_TOL);
    assert_close("rmsnorm dweight", dw, want_dw, dim, FWD_TOL);
    assert_close("rmsnorm dx fd", dx, fdw_dx, nd, FD_TOL);
    assert_close("rmsnorm dweight fd", dw, fdw_dw, dim, FD_TOL);
    float *dx_frozen = floats_copy(dx0, nd);  // a frozen weight: dweight NULL, dx the same
    ops->rmsnorm_backward(dx_frozen, NULL, dout, x, w, rstd, n, dim);
    assert_memory_equal(dx_frozen, dx, nd * sizeof(float));
    free(dx_frozen);
    free(x), free(w), free(dout), free(out), free(rstd), free(c.x), free(c.w), free(want);
    free(want_rstd), free(dx0), free(dw0), free(dx), free(dw), free(ref_dx), free(ref_dw);
    free(fd_dx), free(fd_dw), free(want_dx), free(want_dw), free(fdw_dx), free(fdw_dw);
}

// ---- rope ----------------------------------------------------------------------------------

enum { ROPE_B = 2, ROPE_T = 5, ROPE_H = 3, ROPE_HD = 8, ROPE_MAXPOS = 16 };
#define ROPE_N ((size_t)ROPE_B * ROPE_T * ROPE_H * ROPE_HD)

typedef struct RopeCase {
    double *x;
    const float *cos, *sin, *dout;
    const int *pos;
} RopeCase;

// As complex numbers: (x0 + i x1) e^(i theta).
static void rope_ref(double *out, const RopeCase *c) {
    for (int r = 0; r < ROPE_B * ROPE_T; r++)
        for (int h = 0; h < ROPE_H; h++)
            for (int i = 0; i < ROPE_HD / 2; i++) {
                size_t at = ((size_t)r * ROPE_H + h) * ROPE_HD + 2 * i;
                int t = c->pos[r % ROPE_T] * (ROPE_HD / 2) + i;
                double complex_re = c->x[at] * c->cos[t] - c->x[at + 1] * c->sin[t];
                double complex_im = c->x[at] * c->sin[t] + c->x[at + 1] * c->cos[t];
                out[at] = complex_re, out[at + 1] = complex_im;
            }
}

static double rope_loss(const void *ctx) {
    double out[ROPE_N];
    rope_ref(out, ctx);
    return dot_weights(out, ((const RopeCase *)ctx)->dout, ROPE_N);
}

// dx = R^T dout with R = [[c, -s], [s, c]].
static void rope_ref_backward(double *dx, const RopeCase *c) {
    for (int r = 0; r < ROPE_B * ROPE_T; r++)
        for (int h = 0; h < ROPE_H; h++)
            for (int i = 0; i < ROPE_HD / 2; i++) {
                size_t at = ((size_t)r * ROPE_H + h) * ROPE_HD + 2 * i;
                int t = c->pos[r % ROPE_T] * (ROPE_HD / 2) + i;
                double R[2][2] = {{c->cos[t], -c->sin[t]}, {c->sin[t], c->cos[t]}};
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) dx[at + a] += R[b][a] * c->dout[at + b];
            }
}

static void rope_tables(float *cos_t, float *sin_t) {
    for (int p = 0; p < ROPE_MAXPOS; p++)
        for (int i = 0; i < ROPE_HD / 2; i++) {
            double theta = p * pow(10000.0, -2.0 * i / ROPE_HD);
            cos_t[p * ROPE_HD / 2 + i] = (float)cos(theta);
            sin_t[p * ROPE_HD / 2 + i] = (float)sin(theta);
        }
}

static void test_rope(void **state) {
    (void)state;
    rng_seed(3);
    float cos_t[ROPE_MAXPOS * ROPE_HD / 2], sin_t[ROPE_MAXPOS * ROPE_HD / 2];
    rope_tables(cos_t, sin_t);
    const int pos[ROPE_T] = {3, 0, 15, 7, 11};
    float *x = floats_random(ROPE_N, 1.0), *dout = floats_random(ROPE_N, 1.0);
    float *out = floats_random(ROPE_N, 1.0);
    RopeCase c = {doubles_from(x, ROPE_N), cos_t, sin_t, dout, pos};
    double want[ROPE_N];
    rope_ref(want, &c);
    ops->rope_forward(out, x, cos_t, sin_t, pos, ROPE_B * ROPE_T, ROPE_T, ROPE_H, ROPE_HD);
    assert_close("rope out", out, want, ROPE_N, FWD_TOL);
    float *inplace = floats_copy(x, ROPE_N);
    ops->rope_forward(inplace, inplace, cos_t, sin_t, pos, ROPE_B * ROPE_T, ROPE_T, ROPE_H,
                      ROPE_HD);
    assert_memory_equal(inplace, out, ROPE_N * sizeof *out);

    float *dx = floats_random(ROPE_N, 1.0);  // written, whatever it held
    ops->rope_backward(dx, dout, cos_t, sin_t, pos, ROPE_B * ROPE_T, ROPE_T, ROPE_H, ROPE_HD);
    double *ref = doubles_zero(ROPE_N);
    rope_ref_backward(ref, &c);
    double *fd = fd_gradient(c.x, ROPE_N, rope_loss, &c);
    assert_close("rope dx", dx, ref, ROPE_N, FWD_TOL);
    assert_close("rope dx fd", dx, fd, ROPE_N, FD_TOL);
    float *dx_inplace = floats_copy(dout, ROPE_N);
    ops->rope_backward(dx_inplace, dx_inplace, cos_t, sin_t, pos, ROPE_B * ROPE_T, ROPE_T,
                       ROPE_H, ROPE_HD);
    assert_memory_equal(dx_inplace, dx, ROPE_N * sizeof *dx);
    free(x), free(dout), free(out), free(c.x), free(inplace), free(dx), free(ref), free(fd);
    free(dx_inplace);
}

// ---- attention -----------------------------------------------------------------------------

// One attention call: B sequences of Tq queries from global position q_start against Tk keys
// from kv_start. ATTN_DOCUMENT: in sequence b, document d + 1 begins at global position
// bounds[d] + 3b (0: no such document), so the batch rows differ.
typedef struct AttnSpec {
    int B, Tq, Tk, H, KV, hd, q_start, kv_start;
    AttnMask mask;
    int bounds[3];
} AttnSpec;

// A spec's inputs, the references' double copies and its mask spelled out.
typedef struct AttnCase {
    AttnSpec p;
    int *q_doc, *kv_doc; // (B, Tq), (B, Tk) document ids
    bool *sees;          // (B, Tq, Tk): whether query i sees key j
    double *q, *k, *v;   // (B, Tq, H, hd), (B, Tk, KV, hd) x2
    const float *dout;   // (B, Tq, H, hd)
} AttnCase;

static size_t attn_q_size(const AttnCase *c) {
    return (size_t)c->p.B * c->p.Tq * c->p.H * c->p.hd;
}
static size_t attn_kv_size(const AttnCase *c) {
    return (size_t)c->p.B * c->p.Tk * c->p.KV * c->p.hd;
}
static size_t attn_lse_size(const AttnCase *c) { return (size_t)c->p.B * c->p.H * c->p.Tq; }
static size_t attn_q_at(const AttnCase *c, int b, int t, int h) {
    return (((size_t)b * c->p.Tq + t) * c->p.H + h) * c->p.hd;
}
static size_t attn_kv_at(const AttnCase *c, int b, int t, int h) {
    return (((size_t)b * c->p.Tk + t) * c->p.KV + h) * c->p.hd;
}

static int attn_document(const AttnSpec *p, int b, int pos) {
    int d = 0;
    for (int i = 0; i < 3; i++) d += p->bounds[i] > 0 && pos >= p->bounds[i] + 3 * b;
    return d;
}

static AttnCase attn_case_make(AttnSpec p) {
    AttnCase c = {.p = p};
    c.q_doc = malloc((size_t)p.B * p.Tq * sizeof *c.q_doc);
    c.kv_doc = malloc((size_t)p.B * p.Tk * sizeof *c.kv_doc);
    c.sees = malloc((size_t)p.B * p.Tq * p.Tk * sizeof *c.sees);
    assert_true(c.q_doc && c.kv_doc && c.sees);
    for (int b = 0; b < p.B; b++) {
        for (int i = 0; i < p.Tq; i++) c.q_doc[b * p.Tq + i] = attn_document(&p, b, p.q_start + i);
        for (int j = 0; j < p.Tk; j++)
            c.kv_doc[b * p.Tk + j] = attn_document(&p, b, p.kv_start + j);
        for (int i = 0; i < p.Tq; i++)
            for (int j = 0; j < p.Tk; j++) {
                bool past = p.kv_start + j <= p.q_start + i;
                bool same = c.q_doc[b * p.Tq + i] == c.kv_doc[b * p.Tk + j];
                c.sees[((size_t)b * p.Tq + i) * p.Tk + j] =
                    p.mask == ATTN_NONE || (past && (p.mask == ATTN_CAUSAL || same));
            }
    }
    return c;
}

static void attn_case_free(AttnCase *c) {
    free(c->q_doc), free(c->kv_doc), free(c->sees), free(c->q), free(c->k), free(c->v);
}

static AttnShape attn_shape(const AttnCase *c) {
    const AttnSpec *p = &c->p;
    return (AttnShape){p->B,       p->Tq,       p->Tk,     p->H,     p->KV,     p->hd,
                       p->q_start, p->kv_start, p->mask,   c->q_doc, c->kv_doc, DTYPE_FP32};
}

// Softmax probabilities p[0..Tk) of query (b, i, h) over the keys it sees (0 elsewhere);
// returns the lse, -inf (and p = 0) when it sees none.
static double attn_ref_probs(double *p, const AttnCase *c, int b, int i, int h) {
    int kvh = h / (c->p.H / c->p.KV), Tk = c->p.Tk;
    const bool *sees = c->sees + ((size_t)b * c->p.Tq + i) * Tk;
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < Tk; j++) {
        p[j] = 0.0;
        if (!sees[j]) continue;
        double s = 0.0;
        for (int d = 0; d < c->p.hd; d++)
            s += c->q[attn_q_at(c, b, i, h) + d] * c->k[attn_kv_at(c, b, j, kvh) + d];
        p[j] = s / sqrt((double)c->p.hd);
        mx = p[j] > mx ? p[j] : mx;
    }
    if (mx == -INFINITY) return mx;
    for (int j = 0; j < Tk; j++) sum += sees[j] ? exp(p[j] - mx) : 0.0;
    for (int j = 0; j < Tk; j++) p[j] = sees[j] ? exp(p[j] - mx) / sum : 0.0;
    return mx + log(sum);
}

static void attn_ref(double *out, double *lse, const AttnCase *c) {
    const AttnSpec *s = &c->p;
    double *p = doubles_zero(s->Tk);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++)
            for (int i = 0; i < s->Tq; i++) {
                double l = attn_ref_probs(p, c, b, i, h);
                if (lse) lse[((size_t)b * s->H + h) * s->Tq + i] = l;
                for (int d = 0; d < s->hd; d++) {
                    double o = 0.0;
                    for (int j = 0; j < s->Tk; j++)
                        o += p[j] * c->v[attn_kv_at(c, b, j, h / (s->H / s->KV)) + d];
                    out[attn_q_at(c, b, i, h) + d] = o;
                }
            }
    free(p);
}

static double attn_loss(const void *ctx) {
    const AttnCase *c = ctx;
    double *out = doubles_zero(attn_q_size(c));
    attn_ref(out, NULL, c);
    double l = dot_weights(out, c->dout, attn_q_size(c));
    free(out);
    return l;
}

// Softmax Jacobian row by row: ds_j = p_j (dp_j - sum_l p_l dp_l), dp_j = dout_i . v_j.
static void attn_ref_backward(double *dq, double *dk, double *dv, const AttnCase *c) {
    const AttnSpec *s = &c->p;
    double *p = doubles_zero(s->Tk), *dp = doubles_zero(s->Tk), scale = 1.0 / sqrt((double)s->hd);
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->H; h++)
            for (int i = 0; i < s->Tq; i++) {
                int kvh = h / (s->H / s->KV);
                size_t qi = attn_q_at(c, b, i, h);
                attn_ref_probs(p, c, b, i, h);
                double pdp = 0.0;
                for (int j = 0; j < s->Tk; j++) {
                    dp[j] = 0.0;
                    for (int d = 0; d < s->hd; d++)
                        dp[j] += c->dout[qi + d] * c->v[attn_kv_at(c, b, j, kvh) + d];
                    pdp += p[j] * dp[j];
                }
                for (int j = 0; j < s->Tk; j++) {
                    double ds = p[j] * (dp[j] - pdp);
                    size_t kj = attn_kv_at(c, b, j, kvh);
                    for (int d = 0; d < s->hd; d++) {
                        dq[qi + d] += scale * ds * c->k[kj + d];
                        dk[kj + d] += scale * ds * c->q[qi + d];
                        dv[kj + d] += p[j] * c->dout[qi + d];
                    }
                }
            }
    free(p), free(dp);
}

typedef struct AttnRun {
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} AttnRun;

static AttnRun attn_run_make(const AttnCase *c) {
    size_t nq = attn_q_size(c), nkv = attn_kv_size(c);
    return (AttnRun){floats_random(nq, 1.0),  floats_random(nkv, 1.0),
                     floats_random(nkv, 1.0), floats_random(nq, 1.0),
                     floats_random(nq, 1.0),  floats_random(attn_lse_size(c), 1.0),
                     floats_random(nq, 1.0),  floats_random(nkv, 1.0),
                     floats_random(nkv, 1.0)};
}

static void attn_run_free(AttnRun *r) {
    free(r->q), free(r->k), free(r->v), free(r->dout), free(r->out), free(r->lse);
    free(r->dq), free(r->dk), free(r->dv);
}

static void attn_run_ops(AttnRun *r, const AttnCase *c) {
    AttnShape s = attn_shape(c);
    void *workspace = malloc(ops->attention_workspace_bytes(&s));
    ops->attention_forward(r->out, r->lse, r->q, r->k, r->v, &s, workspace);
    ops->attention_backward(r->dq, r->dk, r->dv, r->dout, r->q, r->k, r->v, r->out, r->lse, &s,
                            workspace);
    free(workspace);
}

// lse holds -inf for rows that see no key: those must match exactly, the rest within FWD_TOL.
static void assert_lse_close(const char *what, const float *got, const double *want, size_t n) {
    float *finite_got = floats_copy(got, n);
    double *finite_want = doubles_zero(n);
    for (size_t i = 0; i < n; i++) {
        if (isinf(got[i]) || isinf(want[i])) {
            if (!(got[i] == want[i])) fail_msg("%s[%zu]: %g, want %g", what, i, got[i], want[i]);
            finite_got[i] = 0.0f;
        } else {
            finite_want[i] = want[i];
        }
    }
    assert_close(what, finite_got, finite_want, n, FWD_TOL);
    free(finite_got), free(finite_want);
}

// Compares one gradient, prefilled with prefill, against reference gradients ref and fd
// (fd may be NULL).
static void attn_check_grad(const char *what, const float *got, const float *prefill,
                            const double *ref, const double *fd, size_t n) {
    double *want = doubles_sum(prefill, ref, n);
    assert_close(what, got, want, n, FWD_TOL);
    free(want);
    if (!fd) return;
    want = doubles_sum(prefill, fd, n);
    assert_close(what, got, want, n, FD_TOL);
    free(want);
}

static void attn_check(AttnSpec spec, bool with_fd) {
    AttnCase c = attn_case_make(spec);
    size_t nq = attn_q_size(&c), nkv = attn_kv_size(&c), nl = attn_lse_size(&c);
    AttnRun r = attn_run_make(&c);
    float *dq0 = floats_copy(r.dq, nq), *dk0 = floats_copy(r.dk, nkv),
          *dv0 = floats_copy(r.dv, nkv);
    c.q = doubles_from(r.q, nq), c.k = doubles_from(r.k, nkv), c.v = doubles_from(r.v, nkv);
    c.dout = r.dout;
    attn_run_ops(&r, &c);
    double *out = doubles_zero(nq), *lse = doubles_zero(nl);
    attn_ref(out, lse, &c);
    assert_close("attention out", r.out, out, nq, FWD_TOL);
    assert_lse_close("attention lse", r.lse, lse, nl);
    double *dq = doubles_zero(nq), *dk = doubles_zero(nkv), *dv = doubles_zero(nkv);
    attn_ref_backward(dq, dk, dv, &c);
    double *fq = with_fd ? fd_gradient(c.q, nq, attn_loss, &c) : NULL;
    double *fk = with_fd ? fd_gradient(c.k, nkv, attn_loss, &c) : NULL;
    double *fv = with_fd ? fd_gradient(c.v, nkv, attn_loss, &c) : NULL;
    attn_check_grad("attention dq", r.dq, dq0, dq, fq, nq);
    attn_check_grad("attention dk", r.dk, dk0, dk, fk, nkv);
    attn_check_grad("attention dv", r.dv, dv0, dv, fv, nkv);
    attn_run_free(&r);
    attn_case_free(&c);
    free(dq0), free(dk0), free(dv0), free(out), free(lse);
    free(dq), free(dk), free(dv), free(fq), free(fk), free(fv);
}

// A plain causal call: one (B, T) block against itself.
static AttnSpec attn_causal(int B, int T, int H, int KV, int hd) {
    return (AttnSpec){.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .hd = hd};
}

// T = 70, 67 and 130 leave a partial last query tile (tiles are 64 rows); 64 fills exactly one.
static void test_attention_gqa2(void **state) {
    (void)state;
    rng_seed(4);
    attn_check(attn_causal(2, 70, 4, 2, 8), false);
    attn_check(attn_causal(1, 67, 2, 1, 4), true);
}

// head_dim 16, 32 and 48 read k, v and q as they lie (whole vectors of 16) and, on a cpu with
// AVX-512, transpose k and v into their panels 16 x 16 in registers (130, 75 and 33 keys: a
// part block at the end); 40 and 4 through zero-padded copies (kernels/cpu/small_gemm.c's
// strips of 2 vectors and 1) and the panels' word blocks.
static void test_attention_mha(void **state) {
    (void)state;
    rng_seed(5);
    attn_check(attn_causal(1, 130, 3, 3, 16), false);
    attn_check(attn_causal(1, 75, 2, 2, 32), false);
    attn_check(attn_causal(1, 70, 2, 1, 40), false);
    attn_check(attn_causal(1, 33, 1, 1, 48), true);
    attn_check(attn_causal(2, 9, 2, 2, 4), true);
}

static void test_attention_gqa4(void **state) {
    (void)state;
    rng_seed(6);
    attn_check(attn_causal(2, 64, 4, 1, 8), false);
}

// A query chunk against a key/value chunk elsewhere in the sequence, as context parallel pairs
// them: keys all before the queries; overlapping (the first queries see no key); all after
// (every row sees none: out 0, lse -inf, no gradient); a query chunk spanning several tiles
// against a short one. Tq != Tk throughout.
static void test_attention_offsets(void **state) {
    (void)state;
    rng_seed(14);
    attn_check((AttnSpec){2, 40, 50, 4, 2, 8, 64, 0, ATTN_CAUSAL, {0}}, false);
    attn_check((AttnSpec){1, 12, 9, 2, 1, 4, 20, 5, ATTN_CAUSAL, {0}}, true);
    attn_check((AttnSpec){2, 70, 60, 4, 2, 8, 10, 30, ATTN_CAUSAL, {0}}, false);
    attn_check((AttnSpec){1, 11, 13, 2, 1, 4, 3, 6, ATTN_CAUSAL, {0}}, true);
    attn_check((AttnSpec){2, 20, 30, 2, 2, 8, 0, 40, ATTN_CAUSAL, {0}}, false);
    attn_check((AttnSpec){1, 150, 20, 2, 1, 8, 0, 100, ATTN_CAUSAL, {0}}, false);
}

// No mask: every query sees every key, whatever the offsets.
static void test_attention_unmasked(void **state) {
    (void)state;
    rng_seed(15);
    attn_check((AttnSpec){2, 30, 70, 4, 2, 8, 0, 50, ATTN_NONE, {0}}, false);
    attn_check((AttnSpec){1, 9, 6, 2, 1, 4, 0, 0, ATTN_NONE, {0}}, true);
}

// Block-causal by document: two and three documents in one window (shifted per batch row), as
// one block and as chunk pairs, under GQA; tiles wholly inside one document skip the keys of
// the others.
static void test_attention_documents(void **state) {
    (void)state;
    rng_seed(16);
    attn_check((AttnSpec){2, 130, 130, 4, 2, 8, 0, 0, ATTN_DOCUMENT, {70}}, false);
    attn_check((AttnSpec){2, 130, 130, 4, 1, 8, 0, 0, ATTN_DOCUMENT, {20, 66, 100}}, false);
    attn_check((AttnSpec){1, 14, 14, 2, 1, 4, 0, 0, ATTN_DOCUMENT, {5, 9}}, true);
    attn_check((AttnSpec){2, 40, 60, 4, 2, 8, 80, 30, ATTN_DOCUMENT, {50, 90}}, false);
    attn_check((AttnSpec){1, 10, 12, 2, 1, 4, 12, 4, ATTN_DOCUMENT, {9, 15}}, true);
}

// ---- attention_merge -----------------------------------------------------------------------

// One sequence's keys split at `split` into two chunks, each attended to on its own with its
// offset and merged by log-sum-exp, equal the one call (out and lse); backward per chunk with
// the merged out and lse, dq summed over the chunks and each chunk's dk, dv in its rows, equals
// the one call's gradients.
static void attn_merge_check(AttnSpec spec, int split) {
    assert_int_equal(spec.B, 1);
    AttnCase c = attn_case_make(spec);
    size_t nq = attn_q_size(&c), nkv = attn_kv_size(&c), nl = attn_lse_size(&c);
    size_t kv_split = (size_t)split * spec.KV * spec.hd;
    AttnRun whole = attn_run_make(&c);
    memset(whole.dq, 0, nq * sizeof(float)), memset(whole.dk, 0, nkv * sizeof(float));
    memset(whole.dv, 0, nkv * sizeof(float));
    attn_run_ops(&whole, &c);

    AttnShape full = attn_shape(&c), first = full, second = full;
    first.Tk = split;
    second.Tk = spec.Tk - split, second.kv_start += split, second.kv_doc += split;
    void *workspace = malloc(ops->attention_workspace_bytes(&full));
    float *out = floats_random(nq, 1.0), *lse = floats_random(nl, 1.0);
    float *out2 = floats_random(nq, 1.0), *lse2 = floats_random(nl, 1.0);
    ops->attention_forward(out, lse, whole.q, whole.k, whole.v, &first, workspace);
    ops->attention_forward(out2, lse2, whole.q, whole.k + kv_split, whole.v + kv_split, &second,
                           workspace);
    ops->attention_merge(out, lse, out2, lse2, spec.B, spec.Tq, spec.H, spec.hd);
    double *want_out = doubles_from(whole.out, nq), *want_lse = doubles_from(whole.lse, nl);
    assert_close("attention_merge out", out, want_out, nq, FWD_TOL);
    assert_lse_close("attention_merge lse", lse, want_lse, nl);

    float *dq = calloc(nq, sizeof *dq), *dk = calloc(nkv, sizeof *dk), *dv = calloc(nkv, sizeof *dv);
    assert_true(dq && dk && dv);
    ops->attention_backward(dq, dk, dv, whole.dout, whole.q, whole.k, whole.v, out, lse, &first,
                            workspace);
    ops->attention_backward(dq, dk + kv_split, dv + kv_split, whole.dout, whole.q,
                            whole.k + kv_split, whole.v + kv_split, out, lse, &second, workspace);
    double *want_dq = doubles_from(whole.dq, nq), *want_dk = doubles_from(whole.dk, nkv),
           *want_dv = doubles_from(whole.dv, nkv);
    assert_close("attention chunks dq", dq, want_dq, nq, FWD_TOL);
    assert_close("attention chunks dk", dk, want_dk, nkv, FWD_TOL);
    assert_close("attention chunks dv", dv, want_dv, nkv, FWD_TOL);
    attn_run_free(&whole);
    attn_case_free(&c);
    free(workspace), free(out), free(lse), free(out2), free(lse2), free(want_out), free(want_lse);
    free(dq), free(dk), free(dv), free(want_dq), free(want_dk), free(want_dv);
}

// Halves of a causal sequence (the second's early queries see none of its keys), a query chunk
// of a later position against keys in uneven chunks, documents, and no mask.
static void test_attention_merge(void **state) {
    (void)state;
    rng_seed(17);
    attn_merge_check(attn_causal(1, 100, 4, 2, 8), 50);
    attn_merge_check((AttnSpec){1, 40, 104, 4, 1, 8, 64, 0, ATTN_CAUSAL, {0}}, 30);
    attn_merge_check((AttnSpec){1, 130, 130, 2, 2, 8, 0, 0, ATTN_DOCUMENT, {40, 90}}, 65);
    attn_merge_check((AttnSpec){1, 30, 50, 4, 2, 8, 0, 0, ATTN_NONE, {0}}, 7);
}

// ---- attention_decode ----------------------------------------------------------------------

// The query at position n_ctx - 1 of a T-token sequence against a cache holding that
// sequence's first n_ctx k, v rows and NaN after them (which must not be read): equal to
// attention_forward's row n_ctx - 1 and to the naive loop's.
static void attn_decode_check(int T, int n_ctx, int H, int KV, int hd) {
    AttnCase c = attn_case_make(attn_causal(1, T, H, KV, hd));
    AttnShape s = attn_shape(&c);
    size_t nq = attn_q_size(&c), nkv = attn_kv_size(&c), width = (size_t)H * hd;
    AttnRun r = attn_run_make(&c);
    void *workspace = malloc(ops->attention_workspace_bytes(&s));
    ops->attention_forward(r.out, r.lse, r.q, r.k, r.v, &s, workspace);
    c.q = doubles_from(r.q, nq), c.k = doubles_from(r.k, nkv), c.v = doubles_from(r.v, nkv);
    double *naive = doubles_zero(nq);
    attn_ref(naive, NULL, &c);
    float *k_cache = floats_copy(r.k, nkv), *v_cache = floats_copy(r.v, nkv);
    for (size_t i = (size_t)n_ctx * KV * hd; i < nkv; i++) k_cache[i] = v_cache[i] = NAN;
    size_t row = attn_q_at(&c, 0, n_ctx - 1, 0);
    float *got = floats_random(width, 1.0);
    ops->attention_decode(got, r.q + row, k_cache, v_cache, n_ctx, H, KV, hd);
    double *forward = doubles_from(r.out + row, width);
    char what[96];
    snprintf(what, sizeof what, "attention_decode T=%d n_ctx=%d H=%d KV=%d vs naive", T, n_ctx, H,
             KV);
    assert_close(what, got, naive + row, width, FWD_TOL);
    snprintf(what, sizeof what, "attention_decode T=%d n_ctx=%d H=%d KV=%d vs attention_forward",
             T, n_ctx, H, KV);
    assert_close(what, got, forward, width, FWD_TOL);
    attn_run_free(&r);
    attn_case_free(&c);
    free(workspace), free(naive), free(k_cache), free(v_cache), free(got), free(forward);
}

// The cpu kernel takes keys in chunks of 128: one key, exactly one chunk, and partial last
// chunks (129, 300), under GQA groups of 2 and 4 and plain multi-head attention.
static void test_attention_decode(void **state) {
    (void)state;
    rng_seed(13);
    attn_decode_check(300, 300, 4, 2, 16);
    attn_decode_check(300, 129, 8, 2, 8);
    attn_decode_check(130, 128, 3, 3, 16);
    attn_decode_check(5, 1, 2, 1, 4);
}

// ---- swiglu --------------------------------------------------------------------------------

enum { SWIGLU_N = 1000 };

typedef struct SwigluCase {
    double *gate, *up;
    const float *dout;
} SwigluCase;

static double silu(double g) { return g / (1.0 + exp(-g)); }

static double swiglu_loss(const void *ctx) {
    const SwigluCase *c = ctx;
    double l = 0.0;
    for (int i = 0; i < SWIGLU_N; i++) l += silu(c->gate[i]) * c->up[i] * c->dout[i];
    return l;
}

static void test_swiglu(void **state) {
    (void)state;
    rng_seed(7);
    float *gate = floats_random(SWIGLU_N, 12.0), *up = floats_random(SWIGLU_N, 1.0);
    float *dout = floats_random(SWIGLU_N, 1.0), *out = floats_random(SWIGLU_N, 1.0);
    SwigluCase c = {doubles_from(gate, SWIGLU_N), doubles_from(up, SWIGLU_N), dout};
    ops->swiglu_forward(out, DTYPE_FP32, gate, up, SWIGLU_N);
    double want[SWIGLU_N], dgate_ref[SWIGLU_N], dup_ref[SWIGLU_N];
    for (int i = 0; i < SWIGLU_N; i++) {
        double g = c.gate[i], sg = 1.0 / (1.0 + exp(-g));
        want[i] = silu(g) * c.up[i];
        dgate_ref[i] = dout[i] * c.up[i] * (sg + g * sg * (1.0 - sg));
        dup_ref[i] = dout[i] * silu(g);
    }
    assert_close("swiglu out", out, want, SWIGLU_N, FWD_TOL);
    // Written over whatever the outputs held (random here), not added to it.
    float *dg = floats_random(SWIGLU_N, 1.0), *du = floats_random(SWIGLU_N, 1.0);
    ops->swiglu_backward(dg, du, NULL, DTYPE_FP32, dout, gate, up, SWIGLU_N);
    double *fd_g = fd_gradient(c.gate, SWIGLU_N, swiglu_loss, &c);
    double *fd_u = fd_gradient(c.up, SWIGLU_N, swiglu_loss, &c);
    assert_close("swiglu dgate", dg, dgate_ref, SWIGLU_N, FWD_TOL);
    assert_close("swiglu dup", du, dup_ref, SWIGLU_N, FWD_TOL);
    assert_close("swiglu dgate fd", dg, fd_g, SWIGLU_N, FD_TOL);
    assert_close("swiglu dup fd", du, fd_u, SWIGLU_N, FD_TOL);
    // With out: the same gradients, and out as swiglu_forward's, bit for bit (selective
    // checkpointing's recompute).
    float *dg2 = floats_random(SWIGLU_N, 1.0), *du2 = floats_random(SWIGLU_N, 1.0);
    float *again = floats_random(SWIGLU_N, 1.0);
    ops->swiglu_backward(dg2, du2, again, DTYPE_FP32, dout, gate, up, SWIGLU_N);
    assert_memory_equal(dg2, dg, SWIGLU_N * sizeof(float));
    assert_memory_equal(du2, du, SWIGLU_N * sizeof(float));
    assert_memory_equal(again, out, SWIGLU_N * sizeof(float));
    // bf16 outputs: the fp32 ones rounded to nearest even, out's too.
    uint16_t dg16[SWIGLU_N], du16[SWIGLU_N], out16[SWIGLU_N];
    ops->swiglu_backward(dg16, du16, out16, DTYPE_BF16, dout, gate, up, SWIGLU_N);
    for (int i = 0; i < SWIGLU_N; i++) {
        assert_int_equal(dg16[i], bf16_from_float(dg[i]));
        assert_int_equal(du16[i], bf16_from_float(du[i]));
        assert_int_equal(out16[i], bf16_from_float(out[i]));
    }
    free(dg2), free(du2), free(again);
    free(gate), free(up), free(dout), free(out), free(c.gate), free(c.up);
    free(dg), free(du), free(fd_g), free(fd_u);
}

// ---- embedding -----------------------------------------------------------------------------

enum { EMB_VOCAB = 10, EMB_DIM = 70, EMB_N = 50 }; // dim spans a partial 32-column chunk

typedef struct EmbCase {
    double *table;
    const int *tokens;
    const float *dout;
} EmbCase;

static double embedding_loss(const void *ctx) {
    const EmbCase *c = ctx;
    double l = 0.0;
    for (int i = 0; i < EMB_N; i++)
        for (int j = 0; j < EMB_DIM; j++)
            l += c->table[c->tokens[i] * EMB_DIM + j] * c->dout[i * EMB_DIM + j];
    return l;
}

static void test_embedding(void **state) {
    (void)state;
    rng_seed(8);
    int tokens[EMB_N];
    for (int i = 0; i < EMB_N; i++) tokens[i] = (int)((rng_uniform() + 1.0) * 0.5 * EMB_VOCAB);
    tokens[1] = tokens[0]; // a guaranteed repeat
    float *table = floats_random(EMB_VOCAB * EMB_DIM, 1.0),
          *out = floats_random(EMB_N * EMB_DIM, 1.0);
    float *dout = floats_random(EMB_N * EMB_DIM, 1.0);
    ops->embedding_forward(out, tokens, table, EMB_N, EMB_DIM, 0, EMB_VOCAB);
    for (int i = 0; i < EMB_N; i++)
        assert_memory_equal(out + i * EMB_DIM, table + tokens[i] * EMB_DIM, EMB_DIM * sizeof *out);

    float *dt0 = floats_random(EMB_VOCAB * EMB_DIM, 1.0),
          *dt = floats_copy(dt0, EMB_VOCAB * EMB_DIM);
    ops->embedding_backward(dt, dout, tokens, EMB_N, EMB_DIM, 0, EMB_VOCAB);
    double *ref = doubles_zero(EMB_VOCAB * EMB_DIM);
    for (int i = 0; i < EMB_N; i++)
        for (int j = 0; j < EMB_DIM; j++) ref[tokens[i] * EMB_DIM + j] += dout[i * EMB_DIM + j];
    EmbCase c = {doubles_from(table, EMB_VOCAB * EMB_DIM), tokens, dout};
    double *fd = fd_gradient(c.table, EMB_VOCAB * EMB_DIM, embedding_loss, &c);
    double *want = doubles_sum(dt0, ref, EMB_VOCAB * EMB_DIM),
           *fdw = doubles_sum(dt0, fd, EMB_VOCAB * EMB_DIM);
    assert_close("embedding dtable", dt, want, EMB_VOCAB * EMB_DIM, FWD_TOL);
    assert_close("embedding dtable fd", dt, fdw, EMB_VOCAB * EMB_DIM, FD_TOL);
    free(table), free(out), free(dout), free(dt0), free(dt), free(ref), free(c.table), free(fd);
    free(want), free(fdw);
}

// ---- cross-entropy -------------------------------------------------------------------------

// An odd vocabulary, cut below into odd slice widths, so that every row and slice ends in a
// partial group of the max's 8 lanes (the tail loop), with one or three logits.
enum { CE_N = 7, CE_VOCAB = 51, CE_SLICES = 3 };
static const int ce_starts[CE_SLICES] = {0, 9, 28}, ce_widths[CE_SLICES] = {9, 19, 23};

typedef struct CeCase {
    double *logits;
    const int *targets;
    double dloss;
} CeCase;

static double ce_ref_row(const double *x, int target) {
    double mx = x[0], sum = 0.0;
    for (int j = 1; j < CE_VOCAB; j++) mx = x[j] > mx ? x[j] : mx;
    for (int j = 0; j < CE_VOCAB; j++) sum += exp(x[j] - mx);
    return mx + log(sum) - x[target];
}

static double ce_loss(const void *ctx) {
    const CeCase *c = ctx;
    double l = 0.0;
    for (int i = 0; i < CE_N; i++) l += ce_ref_row(c->logits + i * CE_VOCAB, c->targets[i]);
    return c->dloss * l;
}

// dloss * (softmax - onehot), row by row.
static void ce_ref_backward(double *d, const CeCase *c) {
    for (int i = 0; i < CE_N; i++) {
        const double *x = c->logits + i * CE_VOCAB;
        double lse = ce_ref_row(x, 0) + x[0];
        for (int j = 0; j < CE_VOCAB; j++)
            d[i * CE_VOCAB + j] += c->dloss * (exp(x[j] - lse) - (j == c->targets[i]));
    }
}

// Rows are offset by up to +-200 so that a naive exp would overflow, and each has one logit
// 100 above the rest: the row's last, each slice's last, each slice's first. Unless the max
// counts that logit, exp(x - max) = exp(100) overflows a float.
static float *ce_logits(void) {
    static const int peak[CE_N] = {CE_VOCAB - 1, 8, 27, 0, 9, 28, CE_VOCAB - 1};
    float *x = floats_random(CE_N * CE_VOCAB, 4.0);
    for (int i = 0; i < CE_N; i++) {
        for (int j = 0; j < CE_VOCAB; j++) x[i * CE_VOCAB + j] += 200.0f * (i - 3) / 3.0f;
        x[i * CE_VOCAB + peak[i]] += 100.0f;
    }
    return x;
}

static void test_cross_entropy(void **state) {
    (void)state;
    rng_seed(9);
    int targets[CE_N] = {0, 50, 27, 17, 17, 25, 50};
    float *logits = ce_logits(), losses[CE_N];
    CeCase c = {doubles_from(logits, CE_N * CE_VOCAB), targets, 0.7};
    ops->cross_entropy_forward(losses, logits, targets, CE_N, CE_VOCAB);
    double want[CE_N];
    for (int i = 0; i < CE_N; i++) want[i] = ce_ref_row(c.logits + i * CE_VOCAB, targets[i]);
    assert_close("cross-entropy losses", losses, want, CE_N, 1e-4); // lse ~ 200 costs 1 ulp(200)

    float *d0 = floats_random(CE_N * CE_VOCAB, 1.0), *d = floats_copy(d0, CE_N * CE_VOCAB);
    ops->cross_entropy_backward(d, logits, targets, CE_N, CE_VOCAB, (float)c.dloss);
    double *ref = doubles_zero(CE_N * CE_VOCAB);
    ce_ref_backward(ref, &c);
    double *fd = fd_gradient(c.logits, CE_N * CE_VOCAB, ce_loss, &c);
    double *w = doubles_sum(d0, ref, CE_N * CE_VOCAB), *fw = doubles_sum(d0, fd, CE_N * CE_VOCAB);
    assert_close("cross-entropy dlogits", d, w, CE_N * CE_VOCAB, FWD_TOL);
    assert_close("cross-entropy dlogits fd", d, fw, CE_N * CE_VOCAB, FD_TOL);

    float *alias = floats_copy(logits, CE_N * CE_VOCAB); // aliased: overwritten, not added
    ops->cross_entropy_backward(alias, alias, targets, CE_N, CE_VOCAB, (float)c.dloss);
    assert_close("cross-entropy dlogits aliased", alias, ref, CE_N * CE_VOCAB, FWD_TOL);
    free(logits), free(c.logits), free(d0), free(d), free(ref), free(fd), free(w), free(fw);
    free(alias);
}

// LoRA's dropout: p's share of the elements dropped (within 1% of 10^5), the others scaled by
// 1 / (1 - p); the same seed drops the same elements (in place too), another seed others.
static void test_dropout(void **state) {
    (void)state;
    enum { N = 100000 };
    float *x = floats_random(N, 1.0), *a = malloc(N * sizeof *a), *b = floats_copy(x, N);
    ops->dropout(a, x, DTYPE_FP32, N, 0.25f, 77);
    ops->dropout(b, b, DTYPE_FP32, N, 0.25f, 77);  // in place
    int dropped = 0;
    for (int i = 0; i < N; i++) {
        assert_true(a[i] == b[i]);
        if (a[i] == 0.0f && x[i] != 0.0f) dropped++;
        else assert_float_equal(a[i], x[i] / 0.75f, 1e-6f * fabsf(x[i]) + 1e-7f);
    }
    assert_in_range(dropped, N / 4 - N / 100, N / 4 + N / 100);
    ops->dropout(b, x, DTYPE_FP32, N, 0.25f, 78);
    int differ = 0;
    for (int i = 0; i < N; i++) differ += (a[i] == 0.0f) != (b[i] == 0.0f);
    assert_true(differ > N / 10);
    free(x), free(a), free(b);
}

// The loss mask's rows: those kept are untouched, bit for bit, the others zero.
static void test_zero_masked_rows(void **state) {
    (void)state;
    enum { N = 5, W = 33 };
    int keep[N] = {1, 0, 0, 1, 0};
    float *x = floats_random(N * W, 1.0), *x0 = floats_copy(x, N * W);
    ops->zero_masked_rows(x, keep, N, W);
    for (int i = 0; i < N * W; i++)
        assert_true(keep[i / W] ? x[i] == x0[i] : x[i] == 0.0f);
    free(x), free(x0);
}

// Vocab-parallel cross-entropy: the vocabulary cut into three slices, as three tp ranks hold
// it. Merging the slices' log-sum-exps and target logits must give the full-row loss; each
// slice's backward, with the whole row's lse, its columns of the full gradient (and of the
// finite differences of the full loss).
static void test_cross_entropy_slices(void **state) {
    (void)state;
    rng_seed(10);
    int targets[CE_N] = {0, 50, 3, 17, 9, 25, 8};
    float *logits = ce_logits();
    CeCase c = {doubles_from(logits, CE_N * CE_VOCAB), targets, 0.7};
    float *slice[CE_SLICES], lse[CE_SLICES][CE_N], target_logit[CE_SLICES][CE_N];
    float row_lse[CE_N], losses[CE_N];
    for (int r = 0; r < CE_SLICES; r++) {
        slice[r] = malloc(sizeof(float) * CE_N * ce_widths[r]);
        for (int i = 0; i < CE_N; i++)
            memcpy(slice[r] + i * ce_widths[r], logits + i * CE_VOCAB + ce_starts[r],
                   sizeof(float) * ce_widths[r]);
        ops->cross_entropy_slice_forward(lse[r], target_logit[r], slice[r], targets, CE_N,
                                         ce_widths[r], ce_starts[r]);
    }
    // The merge as the head runs it, the all-reduces over the slices done by hand.
    float max[CE_N], sums[CE_SLICES][CE_N], target_sum[CE_N] = {0};
    double want[CE_N];
    for (int i = 0; i < CE_N; i++) {
        max[i] = lse[0][i];
        for (int r = 1; r < CE_SLICES; r++) max[i] = fmaxf(max[i], lse[r][i]);
    }
    for (int r = 0; r < CE_SLICES; r++) ops->cross_entropy_merge_exp(sums[r], lse[r], max, CE_N);
    for (int i = 0; i < CE_N; i++) {
        for (int r = 1; r < CE_SLICES; r++) sums[0][i] += sums[r][i];
        for (int r = 0; r < CE_SLICES; r++) target_sum[i] += target_logit[r][i];
        want[i] = ce_ref_row(c.logits + i * CE_VOCAB, targets[i]);
    }
    memcpy(row_lse, lse[0], sizeof row_lse);
    ops->cross_entropy_merge_finish(losses, row_lse, max, sums[0], target_sum, CE_N);
    assert_close("cross-entropy slices merged losses", losses, want, CE_N, 1e-4);

    double *ref = doubles_zero(CE_N * CE_VOCAB);
    ce_ref_backward(ref, &c);
    double *fd = fd_gradient(c.logits, CE_N * CE_VOCAB, ce_loss, &c);
    float *d = malloc(sizeof(float) * CE_N * CE_VOCAB);
    for (int r = 0; r < CE_SLICES; r++) {
        float *ds = calloc((size_t)CE_N * ce_widths[r], sizeof(float));
        ops->cross_entropy_slice_backward(ds, slice[r], row_lse, targets, CE_N, ce_widths[r],
                                          ce_starts[r], (float)c.dloss);
        for (int i = 0; i < CE_N; i++)
            memcpy(d + i * CE_VOCAB + ce_starts[r], ds + i * ce_widths[r],
                   sizeof(float) * ce_widths[r]);
        free(ds);
    }
    assert_close("cross-entropy slices dlogits", d, ref, CE_N * CE_VOCAB, FWD_TOL);
    assert_close("cross-entropy slices dlogits fd", d, fd, CE_N * CE_VOCAB, FD_TOL);
    for (int r = 0; r < CE_SLICES; r++) free(slice[r]);
    free(logits), free(c.logits), free(ref), free(fd), free(d);
}

// A table holding the vocabulary's rows [10, 14) (a vocab-parallel rank's slice): token 3,
// another slice's, looks up a zero row and takes no gradient; 12 and 10 are its rows 2 and 0.
static void test_embedding_foreign_ids(void **state) {
    (void)state;
    rng_seed(11);
    int tokens[3] = {12, 3, 10};
    float *table = floats_random(4 * EMB_DIM, 1.0), *out = floats_random(3 * EMB_DIM, 1.0);
    float *dout = floats_random(3 * EMB_DIM, 1.0), zeros[EMB_DIM] = {0};
    ops->embedding_forward(out, tokens, table, 3, EMB_DIM, 10, 4);
    assert_memory_equal(out + EMB_DIM, zeros, sizeof zeros);
    assert_memory_equal(out, table + 2 * EMB_DIM, sizeof zeros);
    float *dt = calloc(4 * EMB_DIM, sizeof(float));
    ops->embedding_backward(dt, dout, tokens, 3, EMB_DIM, 10, 4);
    assert_memory_equal(dt + EMB_DIM, zeros, sizeof zeros);      // row 1: nobody's
    assert_memory_equal(dt + 3 * EMB_DIM, zeros, sizeof zeros);  // row 3: nobody's
    assert_memory_equal(dt, dout + 2 * EMB_DIM, sizeof zeros);   // row 0: from position 2
    free(table), free(out), free(dout), free(dt);
}

// ---- add, scale, sum_squares, sum, bf16 casts, memory -----------------------------------------

static void test_add_scale_sum_squares(void **state) {
    (void)state;
    rng_seed(10);
    size_t n = 100003; // not a multiple of any chunk or vector width
    float *x = floats_random(n, 1.0), *y0 = floats_random(n, 1.0), *y = floats_copy(y0, n);
    ops->add(y, x, n);
    for (size_t i = 0; i < n; i++) assert_true(y[i] == y0[i] + x[i]);
    ops->scale(y, n, -0.3f);
    for (size_t i = 0; i < n; i++) assert_true(y[i] == (y0[i] + x[i]) * -0.3f);
    size_t sizes[] = {0, 5, 256, n};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        double want = 0.0;
        for (size_t i = 0; i < sizes[s]; i++) want += (double)x[i] * x[i];
        double got = ops->sum_squares(x, sizes[s]);
        assert_true(fabs(got - want) <= 1e-12 * want);
        double want_sum = 0.0, magnitude = 0.0;
        for (size_t i = 0; i < sizes[s]; i++) want_sum += x[i], magnitude += fabs(x[i]);
        assert_true(fabs(ops->sum(x, sizes[s]) - want_sum) <= 1e-12 * magnitude);
    }
    free(x), free(y0), free(y);
}

// bf16 keeps the top 16 bits, rounded to nearest even on the rest; NaN stays NaN, infinities
// and values that round up to them are infinite.
static void test_bf16_casts(void **state) {
    (void)state;
    const float in[] = {1.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, FLT_MAX,
                        INFINITY, -0.0f, NAN, 1e-40f};
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0xc020, 0x7f80, 0x7f80, 0x8000, 0, 0x0001};
    enum { N = sizeof in / sizeof in[0] };
    uint16_t got[N];
    float back[N];
    ops->to_bf16(got, in, N);
    ops->from_bf16(back, got, N);
    for (int i = 0; i < N; i++) {
        if (isnan(in[i])) {
            assert_true(isnan(back[i]));
            continue;
        }
        assert_int_equal(got[i], want[i]);
        uint32_t bits;
        memcpy(&bits, &back[i], sizeof bits);
        assert_int_equal(bits, (uint32_t)want[i] << 16);
    }
}

// The memory section: zeroed allocations, uploads and downloads, copies and strided row copies.
static void test_memory(void **state) {
    (void)state;
    float host[12], rows[6] = {0};
    for (int i = 0; i < 12; i++) host[i] = (float)i;
    float *a = ops->alloc(sizeof host), *b = ops->alloc(sizeof host);
    assert_non_null(a);
    float zeros[12] = {0}, got[12];
    ops->download(got, a, sizeof got);
    assert_memory_equal(got, zeros, sizeof got);
    ops->upload(a, host, sizeof host);
    ops->copy(b, a, sizeof host);
    ops->download(got, b, sizeof got);
    assert_memory_equal(got, host, sizeof got);
    // Columns 1..2 of a (4, 3) matrix into a (3, 2)... as 3 rows of 2 floats, pitch 3 -> 2.
    ops->copy_rows(b, 2 * sizeof(float), a + 1, 3 * sizeof(float), 2 * sizeof(float), 3);
    ops->download(rows, b, sizeof rows);
    const float want[6] = {1, 2, 4, 5, 7, 8};
    assert_memory_equal(rows, want, sizeof rows);
    ops->zero(b + 1, 2 * sizeof(float));
    ops->download(got, b, 4 * sizeof(float));
    assert_true(got[0] == 1 && got[1] == 0 && got[2] == 0 && got[3] == 5);
    ops->free(a), ops->free(b);
}

// Zeroings and copies large enough that the cpu splits them over its threads (1 MiB), at an
// odd offset and length, over 3 threads whatever the cores (uneven shares): every byte inside
// done, every byte around untouched; an overlapping copy moves as memmove does.
static void test_memory_large(void **state) {
    (void)state;
    int threads = omp_get_max_threads();
    omp_set_num_threads(3);
    size_t n = (3u << 20) + 12345, at = 7;
    unsigned char *a = malloc(n + 2 * at), *b = malloc(n + 2 * at), *want = malloc(n + 2 * at);
    for (size_t i = 0; i < n + 2 * at; i++) a[i] = (unsigned char)(i * 2654435761u >> 13);
    memset(b, 0xAB, n + 2 * at);
    ops->copy(b + at, a + at, n);
    memcpy(want, a, n + 2 * at);
    memset(want, 0xAB, at), memset(want + at + n, 0xAB, at);
    assert_memory_equal(b, want, n + 2 * at);
    ops->zero(b + at, n);
    memset(want + at, 0, n);
    assert_memory_equal(b, want, n + 2 * at);
    memcpy(want, a, n + 2 * at);
    memmove(want + at, want, n);
    ops->copy(a + at, a, n);
    assert_memory_equal(a, want, n + 2 * at);
    free(a), free(b), free(want);
    omp_set_num_threads(threads);
}

// ---- adamw ---------------------------------------------------------------------------------

static void test_adamw(void **state) {
    (void)state;
    rng_seed(11);
    enum { N = 1000, STEPS = 3 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = floats_random(N, 1.0), m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0}, dp[N];
    for (int i = 0; i < N; i++) rp[i] = p[i];
    for (int step = 1; step <= STEPS; step++) {
        float *g = floats_random(N, 1.0), *before = floats_copy(p, N);
        ops->adamw_update(p, g, m, v, N, lr, b1, b2, eps, wd, step);
        for (int i = 0; i < N; i++) { // the header's formula, literally
            double old = rp[i];
            rp[i] -= (double)lr * wd * rp[i];
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            rp[i] -=
                lr * (rm[i] / (1.0 - pow(b1, step))) / (sqrt(rv[i] / (1.0 - pow(b2, step))) + eps);
            dp[i] = rp[i] - old;
            before[i] = p[i] - before[i];
        }
        assert_close("adamw param", p, rp, N, FWD_TOL);
        assert_close("adamw update", before, dp, N, 1e-4); // p - p_old loses p's ulp
        assert_close("adamw m", m, rm, N, FWD_TOL);
        assert_close("adamw v", v, rv, N, FWD_TOL);
        free(g), free(before);
    }
    free(p);
}

// The outer SGD step against the header's formula in double, Nesterov and plain, with the
// local weights kept in part (alpha) and replaced (alpha 0), over two steps (momentum from zero).
static void test_outer_sgd(void **state) {
    (void)state;
    rng_seed(13);
    enum { N = 777 };
    const float lr = 0.7f, mu = 0.9f;
    for (int variant = 0; variant < 2; variant++) {
        bool nesterov = variant == 0;
        float alpha = nesterov ? 0.0f : 0.25f;
        float *outer = floats_random(N, 1.0), *param = floats_random(N, 1.0), mom[N] = {0};
        double ro[N], rm[N] = {0}, rp[N];
        for (int i = 0; i < N; i++) ro[i] = outer[i], rp[i] = param[i];
        for (int step = 0; step < 2; step++) {
            float *delta = floats_random(N, 0.01);
            ops->outer_sgd_update(outer, mom, param, delta, N, lr, mu, nesterov, alpha);
            for (int i = 0; i < N; i++) {
                rm[i] = mu * rm[i] + delta[i];
                ro[i] -= lr * (nesterov ? delta[i] + mu * rm[i] : rm[i]);
                rp[i] = ro[i] + alpha * (rp[i] - ro[i]);
            }
            assert_close("outer momentum", mom, rm, N, FWD_TOL);
            assert_close("outer weights", outer, ro, N, FWD_TOL);
            assert_close("local weights", param, rp, N, FWD_TOL);
            free(delta);
        }
        free(outer), free(param);
    }
}

// ---- determinism ---------------------------------------------------------------------------

// Two identical calls must give identical bits: no atomics, reductions in a fixed order.
static void test_determinism(void **state) {
    (void)state;
    AttnCase c = attn_case_make(attn_causal(2, 200, 4, 2, 16));
    size_t nq = attn_q_size(&c), nkv = attn_kv_size(&c);
    AttnRun r[2];
    for (int i = 0; i < 2; i++) {
        rng_seed(12);
        r[i] = attn_run_make(&c);
        attn_run_ops(&r[i], &c);
    }
    assert_memory_equal(r[0].out, r[1].out, nq * sizeof(float));
    assert_memory_equal(r[0].dq, r[1].dq, nq * sizeof(float));
    assert_memory_equal(r[0].dk, r[1].dk, nkv * sizeof(float));
    assert_memory_equal(r[0].dv, r[1].dv, nkv * sizeof(float));

    int n = 2048, dim = 96, tokens[2048];
    size_t nd = (size_t)n * dim;
    for (int i = 0; i < n; i++) tokens[i] = i % 7; // heavy repetition
    float *dout = floats_random(nd, 1.0), *x = floats_random(nd, 1.0), *y = floats_random(nd, 1.0);
    float *w = floats_random(dim, 1.0), rstd[2048], dtab[2][7 * 96], dw[2][96], *dx[2];
    ops->rmsnorm_forward(y, DTYPE_FP32, rstd, x, w, n, dim, 1e-5f);
    for (int i = 0; i < 2; i++) {
        memset(dtab[i], 0, sizeof dtab[i]), memset(dw[i], 0, sizeof dw[i]);
        ops->embedding_backward(dtab[i], dout, tokens, n, dim, 0, 7);
        dx[i] = floats_copy(x, nd);
        ops->rmsnorm_backward(dx[i], dw[i], dout, x, w, rstd, n, dim);
    }
    assert_memory_equal(dtab[0], dtab[1], sizeof dtab[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
    assert_memory_equal(dx[0], dx[1], nd * sizeof(float));
    double s0 = ops->sum_squares(dout, (size_t)n * dim),
           s1 = ops->sum_squares(dout, (size_t)n * dim);
    assert_memory_equal(&s0, &s1, sizeof s0);
    attn_run_free(&r[0]), attn_run_free(&r[1]);
    attn_case_free(&c);
    free(dout), free(x), free(y), free(w), free(dx[0]), free(dx[1]);
}

static int setup_backend(void **state) {
    (void)state;
    ops = kernels_backend("cpu");
    return ops ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_registry),
        cmocka_unit_test(test_matmul_transposes_and_beta),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention_gqa2),
        cmocka_unit_test(test_attention_mha),
        cmocka_unit_test(test_attention_gqa4),
        cmocka_unit_test(test_attention_offsets),
        cmocka_unit_test(test_attention_unmasked),
        cmocka_unit_test(test_attention_documents),
        cmocka_unit_test(test_attention_merge),
        cmocka_unit_test(test_attention_decode),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_cross_entropy_slices),
        cmocka_unit_test(test_zero_masked_rows),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_embedding_foreign_ids),
        cmocka_unit_test(test_add_scale_sum_squares),
        cmocka_unit_test(test_bf16_casts),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_memory_large),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_outer_sgd),
        cmocka_unit_test(test_determinism),
    };
    return cmocka_run_group_tests(tests, setup_backend, NULL);
}
