#include <math.h>

#include "kernels/cpu/cpu.h"

// Columns per task of the dweight reduction: each task owns whole columns, so every dweight
// element is summed over rows in row order whatever the thread count.
#define RMSNORM_COL_CHUNK 32

void cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int n,
                         int dim, float eps) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < dim; j++) ss += xi[j] * xi[j];
        float r = 1.0f / sqrtf(ss / dim + eps);
        rstd[i] = r;
#pragma omp simd
        for (int j = 0; j < dim; j++) oi[j] = xi[j] * r * weight[j];
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
    rmsnorm_backward_weight(dweight, dout, x, rstd, n, dim);
}
