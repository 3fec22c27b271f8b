// FLUX's row-vector ops: adaLN modulation, the gated residual and a linear layer's bias, each a
// vector per sequence (or one for all rows) applied to every row. Their backward sums over the
// rows, which tasks owning (sequence, column chunk) pairs do in row order: the same bits on any
// thread count.
#include "kernels/cpu/cpu.h"

#define ROWVEC_COL_CHUNK 32

void cpu_modulate_forward(float *out, const float *x, const float *shift, const float *scale,
                          int mod_ld, int B, int T, int dim) {
#pragma omp parallel for
    for (int r = 0; r < B * T; r++) {
        const float *sh = shift + (size_t)(r / T) * mod_ld, *sc = scale + (size_t)(r / T) * mod_ld;
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
#pragma omp simd
        for (int j = 0; j < dim; j++) o[j] = xr[j] * (1.0f + sc[j]) + sh[j];
    }
}

void cpu_gated_add_forward(float *y, const float *h, const float *gate, int mod_ld, int B, int T,
                           int dim) {
#pragma omp parallel for
    for (int r = 0; r < B * T; r++) {
        const float *g = gate + (size_t)(r / T) * mod_ld, *hr = h + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
#pragma omp simd
        for (int j = 0; j < dim; j++) yr[j] += g[j] * hr[j];
    }
}

void cpu_bias_add(float *y, const float *bias, int n, int dim) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *yi = y + (size_t)i * dim;
#pragma omp simd
        for (int j = 0; j < dim; j++) yi[j] += bias[j];
    }
}

// The backward of a vector v[b] (rows ld floats apart) applied to the T rows of sequence b, for
// B sequences of (T, dim) rows; each output is skipped when NULL:
//   din[b][t] += dout[b][t] (offset + v[b])     the input gradient (v's factor 1 + scale, or gate)
//   dsum[b] += sum over t of dout[b][t]         shift's and bias's gradient
//   ddot[b] += sum over t of dout[b][t] x[b][t] scale's and gate's gradient
static void rowvec_backward(float *din, float *dsum, float *ddot, const float *dout,
                            const float *x, const float *v, float offset, int ld, int B, int T,
                            int dim) {
    int n_chunks = (dim + ROWVEC_COL_CHUNK - 1) / ROWVEC_COL_CHUNK;
#pragma omp parallel for
    for (int task = 0; task < B * n_chunks; task++) {
        int b = task / n_chunks, j0 = task % n_chunks * ROWVEC_COL_CHUNK;
        int j1 = j0 + ROWVEC_COL_CHUNK < dim ? j0 + ROWVEC_COL_CHUNK : dim;
        float acc_sum[ROWVEC_COL_CHUNK] = {0}, acc_dot[ROWVEC_COL_CHUNK] = {0};
        const float *vb = v ? v + (size_t)b * ld : NULL;
        for (int t = 0; t < T; t++) {
            size_t row = ((size_t)b * T + t) * dim;
            const float *g = dout + row;
            if (din) {
#pragma omp simd
                for (int j = j0; j < j1; j++) din[row + j] += g[j] * (offset + vb[j]);
            }
            if (dsum) {
#pragma omp simd
                for (int j = j0; j < j1; j++) acc_sum[j - j0] += g[j];
            }
            if (ddot) {
#pragma omp simd
                for (int j = j0; j < j1; j++) acc_dot[j - j0] += g[j] * x[row + j];
            }
        }
        for (int j = j0; j < j1; j++) {
            if (dsum) dsum[(size_t)b * ld + j] += acc_sum[j - j0];
            if (ddot) ddot[(size_t)b * ld + j] += acc_dot[j - j0];
        }
    }
}

// out = x (1 + scale) + shift: dx = dout (1 + scale), dshift = sum dout, dscale = sum dout x.
void cpu_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout,
                           const float *x, const float *scale, int mod_ld, int B, int T,
                           int dim) {
    rowvec_backward(dx, dshift, dscale, dout, x, scale, 1.0f, mod_ld, B, T, dim);
}

void cpu_gated_add_backward(float *dh, float *dgate, const float *dy, const float *h,
                            const float *gate, int mod_ld, int B, int T, int dim) {
    rowvec_backward(dh, NULL, dgate, dy, h, gate, 0.0f, mod_ld, B, T, dim);
}

// The bias is one vector for all n rows: a single sequence of n rows.
void cpu_bias_backward(float *dbias, const float *dy, int n, int dim) {
    rowvec_backward(NULL, dbias, NULL, dy, NULL, NULL, 0.0f, dim, 1, n, dim);
}
