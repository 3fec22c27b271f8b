// Shared by the kernel unit tests (header-only; include after cmocka.h): tolerances, a seeded
// generator, the normalised error check and central finite differences.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FWD_TOL 1e-5 // float kernel vs double loop, normalised by the largest reference value
#define FD_TOL 1e-4  // float backward vs double central differences
#define FD_STEP 1e-5 // in double: truncation ~ h^2, rounding ~ 1e-16 / h, both far below FD_TOL

static uint64_t rng_state;

static inline void rng_seed(uint64_t seed) { rng_state = seed; }

// splitmix64, mapped to a uniform double in [-1, 1).
static inline double rng_uniform(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

static inline float *floats_random(size_t n, double scale) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * rng_uniform());
    return x;
}

static inline float *floats_copy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof *y);
    assert_non_null(y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static inline double *doubles_from(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof *y);
    assert_non_null(y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static inline double *doubles_zero(size_t n) {
    double *y = calloc(n ? n : 1, sizeof *y);
    assert_non_null(y);
    return y;
}

// max |got - want| / max |want|: the normalised error ggml's backend tests use.
static inline void assert_close(const char *what, const float *got, const double *want, size_t n,
                         double tol) {
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        err = d > err || isnan(d) ? d : err;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    if (!(err / scale <= tol)) fail_msg("%s: normalised error %.3g > %.3g", what, err / scale, tol);
}

// want = prefill + gradient, for checking that a backward accumulated into prefill.
static inline double *doubles_sum(const float *prefill, const double *grad, size_t n) {
    double *y = doubles_zero(n);
    for (size_t i = 0; i < n; i++) y[i] = prefill[i] + grad[i];
    return y;
}

static inline double dot_weights(const double *out, const float *w, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += out[i] * w[i];
    return s;
}

// Central differences of loss(ctx) with respect to each element of x, which lives in ctx.
typedef double (*LossFn)(const void *ctx);

static inline double *fd_gradient(double *x, size_t n, LossFn loss, const void *ctx) {
    double *g = doubles_zero(n);
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_STEP;
        double up = loss(ctx);
        x[i] = x0 - FD_STEP;
        double down = loss(ctx);
        x[i] = x0;
        g[i] = (up - down) / (2.0 * FD_STEP);
    }
    return g;
}
