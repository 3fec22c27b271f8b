#include <math.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"

// Columns per task of the dweight reduction: each task owns whole columns, so every dweight
// element is summed over rows in row order whatever the thread count.
#define RMSNORM_COL_CHUNK 32

// The row's 1 / rms, stored in rstd; its normed values are x r w.
static float rmsnorm_row_rstd(const float *x, int dim, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < dim; j++) ss += x[j] * x[j];
    return 1.0f / sqrtf(ss / dim + eps);
}

void cpu_rmsnorm_forward(void *out, Dtype out_type, float *rstd, const float *x,
                         const float *weight, int n, int dim, float eps) {
    CHECK(out_type == DTYPE_FP32 || out_type == DTYPE_BF16);
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float r = rmsnorm_row_rstd(xi, dim, eps);
        rstd[i] = r;
        size_t row = (size_t)i * dim;
        if (out_type == DTYPE_BF16) {
            uint16_t *oi = (uint16_t *)out + row;
#pragma omp simd
            for (int j = 0; j < dim; j++) oi[j] = bf16_from_float(xi[j] * r * weight[j]);
        } else {
            float *oi = (float *)out + row;
#pragma omp simd
            for (int j = 0; j < dim; j++) oi[j] = xi[j] * r * weight[j];
        }
    }
}

// y = x r w with r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / dim, so
// dx_j = r (dy_j w_j - x_j r^2 mean(dy w x)).
static void rmsnorm_backward_input(float *dx, const float *dout, const float *x,
                                   const float *weight, const float *rstd, int n, int dim) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
        float *dxi = dx + (size_t)i * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < dim; j++) dot += gi[j] * weight[j] * xi[j];
        float r = rstd[i];
        float c = r * r * dot / dim;
#pragma omp simd
        for (int j = 0; j < dim; j++) dxi[j] += r * (gi[j] * weight[j] - xi[j] * c);
    }
}

static void rmsnorm_backward_weight(float *dweight, const float *dout, const float *x,
                                    const float *rstd, int n, int dim) {
    int n_chunks = (dim + RMSNORM_COL_CHUNK - 1) / RMSNORM_COL_CHUNK;
#pragma omp parallel for
    for (int c = 0; c < n_chunks; c++) {
        int j0 = c * RMSNORM_COL_CHUNK;
        int j1 = j0 + RMSNORM_COL_CHUNK < dim ? j0 + RMSNORM_COL_CHUNK : dim;
        float acc[RMSNORM_COL_CHUNK] = {0};
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
#pragma omp simd
            for (int j = j0; j < j1; j++) acc[j - j0] += gi[j] * xi[j] * rstd[i];
        }
        for (int j = j0; j < j1; j++) dweight[j] += acc[j - j0];
    }
}

void cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                          const float *weight, const float *rstd, int n, int dim) {
    rmsnorm_backward_input(dx, dout, x, weight, rstd, n, dim);
    if (dweight) rmsnorm_backward_weight(dweight, dout, x, rstd, n, dim);
}

// Two passes over the row (the mean, then the variance about it): no cancellation in
// E[x^2] - E[x]^2 when |mean| >> std.
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *x, int n, int dim,
                           float eps) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        float sum = 0.0f, ss = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < dim; j++) sum += xi[j];
        float mu = sum / dim;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < dim; j++) ss += (xi[j] - mu) * (xi[j] - mu);
        float r = 1.0f / sqrtf(ss / dim + eps);
        mean[i] = mu, rstd[i] = r;
#pragma omp simd
        for (int j = 0; j < dim; j++) oi[j] = (xi[j] - mu) * r;
    }
}

// y = (x - mu) r: dy_j/dx_k = r (delta_jk - 1/dim - y_j y_k / dim), so
// dx = r (dout - mean(dout) - y mean(dout y)).
void cpu_layernorm_backward(float *dx, const float *dout, const float *x, const float *mean,
                            const float *rstd, int n, int dim) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim, *gi = dout + (size_t)i * dim;
        float *dxi = dx + (size_t)i * dim;
        float mu = mean[i], r = rstd[i], g_sum = 0.0f, gy_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, gy_sum)
        for (int j = 0; j < dim; j++) {
            g_sum += gi[j];
            gy_sum += gi[j] * (xi[j] - mu) * r;
        }
        float g_mean = g_sum / dim, gy_mean = gy_sum / dim;
#pragma omp simd
        for (int j = 0; j < dim; j++) dxi[j] += r * (gi[j] - g_mean - (xi[j] - mu) * r * gy_mean);
    }
}
