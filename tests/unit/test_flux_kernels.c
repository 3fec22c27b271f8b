// The cpu backend's diffusion-transformer ops (FLUX's MMDiT, kernels/ops.def) against naive
// double-precision loops: each forward against the loop, each backward against the loop's
// analytic derivative and against central finite differences of loss = sum(out * w) for fixed
// random w. Gradient buffers start from random values, so each check also asserts that
// backward accumulates; the reductions over rows must give the same bits on any thread count.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/unit/kernel_check.h"

static const KernelOps *ops;

// got (n), a gradient buffer that started as prefill, must hold prefill + ref (the analytic
// gradient) within FWD_TOL and prefill + fd (finite differences) within FD_TOL.
static void check_grad(const char *what, const float *got, const float *prefill,
                       const double *ref, const double *fd, size_t n) {
    double *want = doubles_sum(prefill, ref, n), *want_fd = doubles_sum(prefill, fd, n);
    char name[96];
    assert_close(what, got, want, n, FWD_TOL);
    snprintf(name, sizeof name, "%s fd", what);
    assert_close(name, got, want_fd, n, FD_TOL);
    free(want), free(want_fd);
}

// ---- layernorm -----------------------------------------------------------------------------

typedef struct {
    int n, dim;
    double eps, *x;    // x (n, dim)
    const float *dout; // the loss weights (n, dim)
} LnCase;

static void layernorm_ref(double *out, double *mean, double *rstd, const LnCase *c) {
    for (int i = 0; i < c->n; i++) {
        const double *x = c->x + (size_t)i * c->dim;
        double mu = 0.0, var = 0.0;
        for (int j = 0; j < c->dim; j++) mu += x[j] / c->dim;
        for (int j = 0; j < c->dim; j++) var += (x[j] - mu) * (x[j] - mu) / c->dim;
        double r = 1.0 / sqrt(var + c->eps);
        if (mean) mean[i] = mu, rstd[i] = r;
        for (int j = 0; j < c->dim; j++) out[(size_t)i * c->dim + j] = (x[j] - mu) * r;
    }
}

static double layernorm_loss(const void *ctx) {
    const LnCase *c = ctx;
    size_t nd = (size_t)c->n * c->dim;
    double *out = doubles_zero(nd);
    layernorm_ref(out, NULL, NULL, c);
    double l = dot_weights(out, c->dout, nd);
    free(out);
    return l;
}

// Through the full Jacobian dy_j/dx_k = r (delta_jk - 1/dim) - r^3 (x_j - mu) (x_k - mu) / dim.
static void layernorm_ref_backward(double *dx, const LnCase *c) {
    int dim = c->dim;
    for (int i = 0; i < c->n; i++) {
        const double *x = c->x + (size_t)i * dim;
        double mu = 0.0, var = 0.0;
        for (int j = 0; j < dim; j++) mu += x[j] / dim;
        for (int j = 0; j < dim; j++) var += (x[j] - mu) * (x[j] - mu) / dim;
        double r = 1.0 / sqrt(var + c->eps);
        for (int k = 0; k < dim; k++)
            for (int j = 0; j < dim; j++)
                dx[(size_t)i * dim + k] += c->dout[(size_t)i * dim + j] *
                                           (r * ((j == k) - 1.0 / dim) -
                                            r * r * r * (x[j] - mu) * (x[k] - mu) / dim);
    }
}

// Rows offset by up to 50 from 0: the variance must not cancel against the mean.
static void test_layernorm(void **state) {
    (void)state;
    rng_seed(21);
    int n = 6, dim = 40;
    size_t nd = (size_t)n * dim;
    float *x = floats_random(nd, 2.0), *dout = floats_random(nd, 1.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) x[(size_t)i * dim + j] += 10.0f * i;
    float *out = floats_random(nd, 1.0), *mean = floats_random(n, 1.0);
    float *rstd = floats_random(n, 1.0);
    LnCase c = {n, dim, 1e-6, doubles_from(x, nd), dout};
    ops->layernorm_forward(out, mean, rstd, x, n, dim, 1e-6f);
    double *want = doubles_zero(nd), *want_mean = doubles_zero(n), *want_rstd = doubles_zero(n);
    layernorm_ref(want, want_mean, want_rstd, &c);
    assert_close("layernorm out", out, want, nd, FWD_TOL);
    assert_close("layernorm mean", mean, want_mean, n, FWD_TOL);
    assert_close("layernorm rstd", rstd, want_rstd, n, FWD_TOL);

    float *dx0 = floats_random(nd, 1.0), *dx = floats_copy(dx0, nd);
    ops->layernorm_backward(dx, dout, x, mean, rstd, n, dim);
    double *ref = doubles_zero(nd), *fd = fd_gradient(c.x, nd, layernorm_loss, &c);
    layernorm_ref_backward(ref, &c);
    check_grad("layernorm dx", dx, dx0, ref, fd, nd);
    free(x), free(dout), free(out), free(mean), free(rstd), free(c.x), free(want);
    free(want_mean), free(want_rstd), free(dx0), free(dx), free(ref), free(fd);
}

// ---- gelu_tanh and silu --------------------------------------------------------------------

enum { ACT_N = 1000 };

typedef struct {
    double (*f)(double);
    double *x;
    const float *dout;
} ActCase;

static double gelu_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// torch's gelu_backward for approximate="tanh": the product rule on 0.5 x (1 + tanh(u)).
static double gelu_tanh_grad(double x) {
    double u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x), th = tanh(u);
    double du = sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * x * x);
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

static double silu_grad(double x) {
    double s = 1.0 / (1.0 + exp(-x));
    return s + x * s * (1.0 - s);
}

static double act_loss(const void *ctx) {
    const ActCase *c = ctx;
    double l = 0.0;
    for (int i = 0; i < ACT_N; i++) l += c->f(c->x[i]) * c->dout[i];
    return l;
}

typedef void (*ActForward)(float *out, const float *x, size_t n);
typedef void (*ActBackward)(float *dx, const float *dout, const float *x, size_t n);

// x in [-range, range): both saturated tails and the curved middle; forward also in place.
static void act_check(const char *what, ActForward fwd, ActBackward bwd, double (*f)(double),
                      double (*grad)(double), double range) {
    float *x = floats_random(ACT_N, range), *dout = floats_random(ACT_N, 1.0);
    float *out = floats_random(ACT_N, 1.0), *in_place = floats_copy(x, ACT_N);
    ActCase c = {f, doubles_from(x, ACT_N), dout};
    double *want = doubles_zero(ACT_N), *ref = doubles_zero(ACT_N);
    for (int i = 0; i < ACT_N; i++) want[i] = f(c.x[i]), ref[i] = dout[i] * grad(c.x[i]);
    fwd(out, x, ACT_N);
    assert_close(what, out, want, ACT_N, FWD_TOL);
    fwd(in_place, in_place, ACT_N);
    assert_memory_equal(in_place, out, ACT_N * sizeof *out);

    float *dx0 = floats_random(ACT_N, 1.0), *dx = floats_copy(dx0, ACT_N);
    bwd(dx, dout, x, ACT_N);
    double *fd = fd_gradient(c.x, ACT_N, act_loss, &c);
    char name[64];
    snprintf(name, sizeof name, "%s dx", what);
    check_grad(name, dx, dx0, ref, fd, ACT_N);
    free(x), free(dout), free(out), free(in_place), free(c.x), free(want), free(ref), free(dx0);
    free(dx), free(fd);
}

static void test_gelu_tanh(void **state) {
    (void)state;
    rng_seed(22);
    act_check("gelu_tanh", ops->gelu_tanh_forward, ops->gelu_tanh_backward, gelu_tanh,
              gelu_tanh_grad, 8.0);
}

static void test_silu(void **state) {
    (void)state;
    rng_seed(23);
    act_check("silu", ops->silu_forward, ops->silu_backward, silu, silu_grad, 20.0);
}

// ---- modulate, gated_add, bias -------------------------------------------------------------

// B sequences of T rows of dim; the modulation (B, 3 dim) is the linear's output, its chunks
// (shift, scale, gate) mod_ld = 3 dim apart, as a FLUX block slices them.
enum { MOD_B = 2, MOD_T = 5, MOD_DIM = 40, MOD_LD = 3 * MOD_DIM };
#define MOD_N ((size_t)MOD_B * MOD_T * MOD_DIM)
#define MOD_V ((size_t)MOD_B * MOD_LD)
enum { SHIFT = 0, SCALE = MOD_DIM, GATE = 2 * MOD_DIM }; // each chunk's first column

typedef struct {
    double *x, *mod;   // x (B, T, dim), mod (B, MOD_LD)
    const float *dout; // the loss weights (B, T, dim)
} ModCase;

static double mod_at(const ModCase *c, int chunk, size_t row, int j) {
    return c->mod[row / (MOD_T * MOD_DIM) * MOD_LD + chunk + j];
}

// out = x (1 + scale) + shift, or (gated) y0 + gate x with y0 = 0 (its gradient is dy).
static void mod_ref(double *out, const ModCase *c, bool gated) {
    for (size_t r = 0; r < MOD_N; r += MOD_DIM)
        for (int j = 0; j < MOD_DIM; j++)
            out[r + j] = gated ? mod_at(c, GATE, r, j) * c->x[r + j]
                               : c->x[r + j] * (1.0 + mod_at(c, SCALE, r, j)) +
                                     mod_at(c, SHIFT, r, j);
}

static double mod_loss(const void *ctx, bool gated) {
    double *out = doubles_zero(MOD_N);
    mod_ref(out, ctx, gated);
    double l = dot_weights(out, ((const ModCase *)ctx)->dout, MOD_N);
    free(out);
    return l;
}

static double modulate_loss(const void *ctx) { return mod_loss(ctx, false); }
static double gated_loss(const void *ctx) { return mod_loss(ctx, true); }

// dx and dmod (B, MOD_LD) of mod_ref, the chunks the op does not read left 0.
static void mod_ref_backward(double *dx, double *dmod, const ModCase *c, bool gated) {
    for (size_t r = 0; r < MOD_N; r += MOD_DIM) {
        double *dm = dmod + r / (MOD_T * MOD_DIM) * MOD_LD;
        for (int j = 0; j < MOD_DIM; j++) {
            double g = c->dout[r + j];
            if (gated) {
                dx[r + j] += g * mod_at(c, GATE, r, j);
                dm[GATE + j] += g * c->x[r + j];
            } else {
                dx[r + j] += g * (1.0 + mod_at(c, SCALE, r, j));
                dm[SHIFT + j] += g;
                dm[SCALE + j] += g * c->x[r + j];
            }
        }
    }
}

typedef struct {
    float *x, *mod, *dout; // the op's inputs, as ModCase's
    ModCase c;
} ModInputs;

static ModInputs mod_inputs(void) {
    ModInputs in;
    in.x = floats_random(MOD_N, 2.0), in.mod = floats_random(MOD_V, 1.0);
    in.dout = floats_random(MOD_N, 1.0);
    in.c = (ModCase){doubles_from(in.x, MOD_N), doubles_from(in.mod, MOD_V), in.dout};
    return in;
}

static void mod_inputs_free(ModInputs *in) {
    free(in->x), free(in->mod), free(in->dout), free(in->c.x), free(in->c.mod);
}

// The backward's dx and dmod (whose unread chunk must stay as it was) against mod_ref's.
static void mod_check_backward(const char *what, const ModInputs *in, bool gated) {
    float *dx0 = floats_random(MOD_N, 1.0), *dm0 = floats_random(MOD_V, 1.0);
    float *dx = floats_copy(dx0, MOD_N), *dm = floats_copy(dm0, MOD_V);
    if (gated)
        ops->gated_add_backward(dx, dm + GATE, in->dout, in->x, in->mod + GATE, MOD_LD, MOD_B,
                                MOD_T, MOD_DIM);
    else
        ops->modulate_backward(dx, dm + SHIFT, dm + SCALE, in->dout, in->x, in->mod + SCALE,
                               MOD_LD, MOD_B, MOD_T, MOD_DIM);
    double *ref_dx = doubles_zero(MOD_N), *ref_dm = doubles_zero(MOD_V);
    mod_ref_backward(ref_dx, ref_dm, &in->c, gated);
    LossFn loss = gated ? gated_loss : modulate_loss;
    double *fd_dx = fd_gradient(in->c.x, MOD_N, loss, &in->c);
    double *fd_dm = fd_gradient(in->c.mod, MOD_V, loss, &in->c);
    char name[64];
    snprintf(name, sizeof name, "%s dx", what);
    check_grad(name, dx, dx0, ref_dx, fd_dx, MOD_N);
    snprintf(name, sizeof name, "%s dmod", what);
    check_grad(name, dm, dm0, ref_dm, fd_dm, MOD_V);
    free(dx0), free(dm0), free(dx), free(dm), free(ref_dx), free(ref_dm), free(fd_dx), free(fd_dm);
}

static void test_modulate(void **state) {
    (void)state;
    rng_seed(24);
    ModInputs in = mod_inputs();
    float *out = floats_random(MOD_N, 1.0), *in_place = floats_copy(in.x, MOD_N);
    ops->modulate_forward(out, in.x, in.mod + SHIFT, in.mod + SCALE, MOD_LD, MOD_B, MOD_T, MOD_DIM);
    double *want = doubles_zero(MOD_N);
    mod_ref(want, &in.c, false);
    assert_close("modulate out", out, want, MOD_N, FWD_TOL);
    ops->modulate_forward(in_place, in_place, in.mod + SHIFT, in.mod + SCALE, MOD_LD, MOD_B,
                          MOD_T, MOD_DIM);
    assert_memory_equal(in_place, out, MOD_N * sizeof *out);
    mod_check_backward("modulate", &in, false);
    mod_inputs_free(&in);
    free(out), free(in_place), free(want);
}

static void test_gated_add(void **state) {
    (void)state;
    rng_seed(25);
    ModInputs in = mod_inputs();
    float *y0 = floats_random(MOD_N, 1.0), *y = floats_copy(y0, MOD_N);
    ops->gated_add_forward(y, in.x, in.mod + GATE, MOD_LD, MOD_B, MOD_T, MOD_DIM);
    double *gh = doubles_zero(MOD_N);
    mod_ref(gh, &in.c, true);
    double *want = doubles_sum(y0, gh, MOD_N);
    assert_close("gated_add y", y, want, MOD_N, FWD_TOL);
    mod_check_backward("gated_add", &in, true);
    mod_inputs_free(&in);
    free(y0), free(y), free(gh), free(want);
}

typedef struct {
    int n, dim;
    double *bias;
    const float *dout;
} BiasCase;

static double bias_loss(const void *ctx) {
    const BiasCase *c = ctx;
    double l = 0.0;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->dim; j++) l += c->bias[j] * c->dout[(size_t)i * c->dim + j];
    return l;
}

static void test_bias(void **state) {
    (void)state;
    rng_seed(26);
    int n = 7, dim = 70; // a partial column chunk
    size_t nd = (size_t)n * dim;
    float *bias = floats_random(dim, 1.0), *y0 = floats_random(nd, 1.0), *y = floats_copy(y0, nd);
    float *dout = floats_random(nd, 1.0);
    ops->bias_add(y, bias, n, dim);
    double *want = doubles_zero(nd), *ref = doubles_zero(dim);
    for (size_t k = 0; k < nd; k++) {
        want[k] = (double)y0[k] + bias[k % dim];
        ref[k % dim] += dout[k];
    }
    assert_close("bias_add y", y, want, nd, FWD_TOL);
    float *db0 = floats_random(dim, 1.0), *db = floats_copy(db0, dim);
    ops->bias_backward(db, dout, n, dim);
    BiasCase c = {n, dim, doubles_from(bias, dim), dout};
    double *fd = fd_gradient(c.bias, dim, bias_loss, &c);
    check_grad("bias dbias", db, db0, ref, fd, dim);
    free(bias), free(y0), free(y), free(dout), free(want), free(ref), free(db0), free(db);
    free(c.bias), free(fd);
}

// The reductions over rows: the same bits on 1 thread as on 3 (chunks that do not divide
// the columns evenly among the threads), over enough rows that an order change would show.
static void test_row_sums_thread_count(void **state) {
    (void)state;
    rng_seed(27);
    int B = 3, T = 500, dim = 200, ld = 3 * dim, threads[2] = {1, 3};
    size_t n = (size_t)B * T * dim, nv = (size_t)B * ld;
    float *x = floats_random(n, 1.0), *dout = floats_random(n, 1.0), *mod = floats_random(nv, 1.0);
    float *dx[2], *dmod[2], *dbias[2];
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(threads[k]);
        dx[k] = floats_copy(x, n), dmod[k] = floats_copy(mod, nv), dbias[k] = floats_copy(mod, dim);
        ops->modulate_backward(dx[k], dmod[k], dmod[k] + dim, dout, x, mod + dim, ld, B, T, dim);
        ops->gated_add_backward(dx[k], dmod[k] + 2 * dim, dout, x, mod + 2 * dim, ld, B, T, dim);
        ops->bias_backward(dbias[k], dout, B * T, dim);
    }
    omp_set_num_threads(saved);
    assert_memory_equal(dx[0], dx[1], n * sizeof(float));
    assert_memory_equal(dmod[0], dmod[1], nv * sizeof(float));
    assert_memory_equal(dbias[0], dbias[1], dim * sizeof(float));
    free(x), free(dout), free(mod);
    for (int k = 0; k < 2; k++) free(dx[k]), free(dmod[k]), free(dbias[k]);
}

// ---- timestep embedding --------------------------------------------------------------------

// Row b of the embedding as a formula, with torch's fp32 roundings (fp32 set) or none.
static void timestep_ref(double *row, double t, int dim, double max_period, double factor,
                         bool fp32) {
    int h = dim / 2;
    float neg_log = (float)-log(max_period), tf = (float)(factor * (float)t);
    for (int i = 0; i < h; i++) {
        double a = fp32 ? (double)(tf * (float)exp((double)(neg_log * (float)i / (float)h)))
                        : factor * t * exp(-log(max_period) * i / h);
        row[i] = cos(a), row[h + i] = sin(a);
    }
    if (dim % 2) row[dim - 1] = 0.0;
}

// FLUX's settings, t in [0, 1] (the first row 0, the last 1), an even and an odd width. Without
// the fp32 roundings the angles (up to 1000 rad) differ by up to 1000 * 2^-24 each.
static void test_timestep_embedding(void **state) {
    (void)state;
    rng_seed(28);
    enum { B = 5 };
    int dims[] = {256, 33};
    for (int k = 0; k < 2; k++) {
        int dim = dims[k];
        float t[B] = {0.0f, 1.0f}, *out = floats_random((size_t)B * dim, 1.0);
        for (int b = 2; b < B; b++) t[b] = (float)(0.5 + 0.5 * rng_uniform());
        ops->timestep_embedding(out, t, B, dim, 10000.0f, 1000.0f);
        double *want = doubles_zero((size_t)B * dim), *exact = doubles_zero((size_t)B * dim);
        for (int b = 0; b < B; b++) {
            timestep_ref(want + (size_t)b * dim, t[b], dim, 10000.0, 1000.0, true);
            timestep_ref(exact + (size_t)b * dim, t[b], dim, 10000.0, 1000.0, false);
        }
        assert_close("timestep_embedding", out, want, (size_t)B * dim, 1e-6);
        assert_close("timestep_embedding (no fp32 rounding)", out, exact, (size_t)B * dim,
                     2e-4);
        if (dim % 2)
            for (int b = 0; b < B; b++) assert_true(out[(size_t)b * dim + dim - 1] == 0.0f);
        free(out), free(want), free(exact);
    }
}

// ---- squared error -------------------------------------------------------------------------

typedef struct {
    int n, dim;
    double *pred, scale;
    const float *target;
} SqCase;

// scale * the sum of the rows' squared errors: the loss squared_error_backward differentiates.
static double sq_loss(const void *ctx) {
    const SqCase *c = ctx;
    double l = 0.0;
    for (size_t k = 0; k < (size_t)c->n * c->dim; k++)
        l += (c->pred[k] - c->target[k]) * (c->pred[k] - c->target[k]);
    return c->scale * l;
}

static void test_squared_error(void **state) {
    (void)state;
    rng_seed(29);
    int n = 9, dim = 37;
    size_t nd = (size_t)n * dim;
    float *pred = floats_random(nd, 1.0), *target = floats_random(nd, 1.0);
    float *sq = floats_random(n, 1.0);
    ops->squared_error_forward(sq, pred, target, n, dim);
    double *want = doubles_zero(n), *ref = doubles_zero(nd);
    SqCase c = {n, dim, doubles_from(pred, nd), 1.0 / (n * dim), target};
    for (size_t k = 0; k < nd; k++) {
        double d = (double)pred[k] - target[k];
        want[k / dim] += d * d;
        ref[k] = c.scale * 2.0 * d;
    }
    assert_close("squared_error sq", sq, want, n, FWD_TOL);
    float *dp0 = floats_random(nd, 1.0), *dp = floats_copy(dp0, nd);
    ops->squared_error_backward(dp, pred, target, nd, (float)c.scale);
    double *fd = fd_gradient(c.pred, nd, sq_loss, &c);
    check_grad("squared_error dpred", dp, dp0, ref, fd, nd);
    free(pred), free(target), free(sq), free(want), free(ref), free(c.pred), free(dp0), free(dp);
    free(fd);
}

static int setup_backend(void **state) {
    (void)state;
    ops = kernels_backend("cpu");
    return ops ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),       cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_silu),            cmocka_unit_test(test_modulate),
        cmocka_unit_test(test_gated_add),       cmocka_unit_test(test_bias),
        cmocka_unit_test(test_row_sums_thread_count),
        cmocka_unit_test(test_timestep_embedding),
        cmocka_unit_test(test_squared_error),
    };
    return cmocka_run_group_tests(tests, setup_backend, NULL);
}
