// Embedding lookup and its scatter-add, one block per token row, on a table holding the rows
// [vocab_start, vocab_start + rows) of the vocabulary (vocab-parallel: a token outside the
// slice is another rank's, so it reads a zero row and sends no gradient).
#include <stdint.h>

#include "kernels/cuda/device.cuh"

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The table row of token, -1 when another slice holds it.
__device__ __forceinline__ int embedding_slice_row(int token, int vocab_start, int rows) {
    int r = token - vocab_start;
    return r >= 0 && r < rows ? r : -1;
}

// vec: dim a multiple of 4 and both bases 16-byte aligned, so every row is too.
static __global__ void embedding_forward_rows(float *out, const int *tokens, const float *table,
                                              int dim, int vocab_start, int rows, bool vec) {
    int r = embedding_slice_row(tokens[blockIdx.x], vocab_start, rows);
    float *dst = out + (size_t)blockIdx.x * dim;
    const float *src = table + (size_t)(r < 0 ? 0 : r) * dim;
    int d4 = vec ? dim / 4 : 0;
    for (int j = threadIdx.x; j < d4; j += blockDim.x)
        ((float4 *)dst)[j] = r < 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : ((const float4 *)src)[j];
    for (int j = 4 * d4 + threadIdx.x; j < dim; j += blockDim.x) dst[j] = r < 0 ? 0.0f : src[j];
}

// Repeated tokens add into the same dtable row from different blocks, so the adds are atomic:
// their order, hence the last bit of a row that several tokens share, is not deterministic
// (as in torch's CUDA embedding backward).
static __global__ void embedding_backward_rows(float *dtable, const float *dout,
                                               const int *tokens, int dim, int vocab_start,
                                               int rows) {
    int r = embedding_slice_row(tokens[blockIdx.x], vocab_start, rows);
    if (r < 0) return;
    float *dst = dtable + (size_t)r * dim;
    const float *src = dout + (size_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) atomicAdd(&dst[j], src[j]);
}

void cuda_embedding_forward(float *out, const int *tokens, const float *table, int n, int dim,
                            int vocab_start, int rows) {
    if (n == 0) return;  // an empty grid is a launch error
    bool vec = dim % 4 == 0 && aligned16(out) && aligned16(table);
    embedding_forward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(out, tokens, table, dim,
                                                                  vocab_start, rows, vec);
    CUDA_LAUNCH_CHECK();
}

void cuda_embedding_backward(float *dtable, const float *dout, const int *tokens, int n, int dim,
                             int vocab_start, int rows) {
    if (n == 0) return;
    embedding_backward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(dtable, dout, tokens, dim,
                                                                   vocab_start, rows);
    CUDA_LAUNCH_CHECK();
}
