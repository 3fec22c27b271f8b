// FLUX's row-vector ops (the cpu twin: kernels/cpu/modulate.c): adaLN modulation, the gated
// residual and a linear layer's bias, each a vector per sequence (or one for all rows) applied to
// every row. Their backward sums over rows without atomics, as rmsnorm's weight gradient: blocks
// own (column tile, row chunk, sequence) triples and write per-chunk partials to cuda_scratch(),
// then one thread per (sequence, column) adds its chunks in chunk order.
#include "kernels/cuda/device.cuh"

// Element i of a (B, T, dim) tensor lies in sequence i / (T dim), column i % dim: its vector
// entry in rows ld floats apart.
__device__ __forceinline__ size_t rowvec_at(size_t i, int ld, int T, int dim) {
    return i / ((size_t)T * dim) * ld + i % dim;
}

static __global__ void modulate_forward_elements(float *out, const float *x, const float *shift,
                                                 const float *scale, int ld, int T, int dim,
                                                 size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t v = rowvec_at(i, ld, T, dim);
        out[i] = x[i] * (1.0f + scale[v]) + shift[v];
    }
}

// y += gate h; the bias is a gate-less vector (h NULL: y += v) for one sequence of all rows.
static __global__ void rowvec_add_elements(float *y, const float *h, const float *v, int ld,
                                           int T, int dim, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = v[rowvec_at(i, ld, T, dim)];
        y[i] += h ? g * h[i] : g;
    }
}

// Block (column tile, row chunk c, sequence b), a thread per column j, the chunk's rows in order:
// din[b][t][j] += dout (offset + v[b][j]) (din non-NULL); the chunk's sums of dout and of
// dout x into p_sum and p_dot [b][c][j] (each when non-NULL).
static __global__ void rowvec_backward_partials(float *din, float *p_sum, float *p_dot,
                                                const float *dout, const float *x,
                                                const float *v, float offset, int ld, int T,
                                                int dim, int chunk_rows) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    int b = blockIdx.z, t0 = blockIdx.y * chunk_rows, t1 = min(t0 + chunk_rows, T);
    float factor = v ? offset + v[(size_t)b * ld + j] : 0.0f, s = 0.0f, d = 0.0f;
    for (int t = t0; t < t1; t++) {
        size_t k = ((size_t)b * T + t) * dim + j;
        float g = dout[k];
        if (din) din[k] += g * factor;
        s += g;
        if (p_dot) d += g * x[k];
    }
    size_t at = ((size_t)b * gridDim.y + blockIdx.y) * dim + j;
    if (p_sum) p_sum[at] = s;
    if (p_dot) p_dot[at] = d;
}

static __global__ void rowvec_backward_finish(float *dsum, float *ddot, const float *p_sum,
                                              const float *p_dot, int ld, int B, int dim,
                                              int n_chunks) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)B * dim;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / dim, j = i % dim, first = b * n_chunks * dim + j;
        float s = 0.0f, d = 0.0f;
        for (int c = 0; c < n_chunks; c++) {
            if (dsum) s += p_sum[first + (size_t)c * dim];
            if (ddot) d += p_dot[first + (size_t)c * dim];
        }
        if (dsum) dsum[b * ld + j] += s;
        if (ddot) ddot[b * ld + j] += d;
    }
}

// The backward of v[b] applied to the T rows of each of B sequences, outputs skipped when NULL:
// din += dout (offset + v[b]); dsum[b] += sum over t of dout; ddot[b] += sum over t of dout x.
// Row chunks: as many as fill the device next to the tiles and sequences (cuda_grid's 8 blocks
// an SM), never more than the rows.
static void rowvec_backward(float *din, float *dsum, float *ddot, const float *dout,
                            const float *x, const float *v, float offset, int ld, int B, int T,
                            int dim) {
    if (B == 0 || T == 0 || dim == 0) return;  // an empty grid is a launch error
    int tiles = (dim + CUDA_THREADS - 1) / CUDA_THREADS;
    long long want = (long long)cuda_sm_count() * 8 / ((long long)tiles * B);
    want = want < 1 ? 1 : want < T ? want : T;
    int chunk_rows = (int)((T + want - 1) / want), n_chunks = (T + chunk_rows - 1) / chunk_rows;
    size_t per_output = (size_t)B * n_chunks * dim;
    CHECK(B <= 65535 && 2 * per_output * sizeof(float) <= CUDA_SCRATCH);
    float *p_sum = dsum ? (float *)cuda_scratch() : NULL;
    float *p_dot = ddot ? (float *)cuda_scratch() + per_output : NULL;
    rowvec_backward_partials<<<dim3(tiles, n_chunks, B), CUDA_THREADS, 0, cuda_stream()>>>(
        din, p_sum, p_dot, dout, x, v, offset, ld, T, dim, chunk_rows);
    CUDA_LAUNCH_CHECK();
    if (!dsum && !ddot) return;
    rowvec_backward_finish<<<cuda_grid((size_t)B * dim), CUDA_THREADS, 0, cuda_stream()>>>(
        dsum, ddot, p_sum, p_dot, ld, B, dim, n_chunks);
    CUDA_LAUNCH_CHECK();
}

void cuda_modulate_forward(float *out, const float *x, const float *shift, const float *scale,
                           int mod_ld, int B, int T, int dim) {
    size_t n = (size_t)B * T * dim;
    if (n == 0) return;  // T * dim divides every index
    modulate_forward_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(
        out, x, shift, scale, mod_ld, T, dim, n);
    CUDA_LAUNCH_CHECK();
}

void cuda_modulate_backward(float *dx, float *dshift, float *dscale, const float *dout,
                            const float *x, const float *scale, int mod_ld, int B, int T,
                            int dim) {
    rowvec_backward(dx, dshift, dscale, dout, x, scale, 1.0f, mod_ld, B, T, dim);
}

void cuda_gated_add_forward(float *y, const float *h, const float *gate, int mod_ld, int B,
                            int T, int dim) {
    size_t n = (size_t)B * T * dim;
    if (n == 0) return;
    rowvec_add_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(y, h, gate, mod_ld, T,
                                                                          dim, n);
    CUDA_LAUNCH_CHECK();
}

void cuda_gated_add_backward(float *dh, float *dgate, const float *dy, const float *h,
                             const float *gate, int mod_ld, int B, int T, int dim) {
    rowvec_backward(dh, NULL, dgate, dy, h, gate, 0.0f, mod_ld, B, T, dim);
}

void cuda_bias_add(float *y, const float *bias, int n, int dim) {
    size_t count = (size_t)n * dim;
    if (count == 0) return;
    rowvec_add_elements<<<cuda_grid(count), CUDA_THREADS, 0, cuda_stream()>>>(y, NULL, bias, dim,
                                                                              n, dim, count);
    CUDA_LAUNCH_CHECK();
}

void cuda_bias_backward(float *dbias, const float *dy, int n, int dim) {
    rowvec_backward(NULL, dbias, NULL, dy, NULL, NULL, 0.0f, dim, 1, n, dim);
}
