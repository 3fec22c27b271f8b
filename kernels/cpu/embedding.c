#include "kernels/cpu/cpu.h"

// Columns per task of the backward scatter: a repeated token id sends several rows to the
// same dtable row, so tasks own disjoint columns and add rows in token order.
#define EMBEDDING_COL_CHUNK 32

// The row of token in a table holding rows [vocab_start, vocab_start + rows), -1 when another
// slice holds it.
static int slice_row(int token, int vocab_start, int rows) {
    int r = token - vocab_start;
    return r >= 0 && r < rows ? r : -1;
}

void cpu_embedding_forward(float *out, const int *tokens, const float *table, int n, int dim,
                           int vocab_start, int rows) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *dst = out + (size_t)i * dim;
        int r = slice_row(tokens[i], vocab_start, rows);
        if (r < 0)
            memset(dst, 0, dim * sizeof *out);
        else
            memcpy(dst, table + (size_t)r * dim, dim * sizeof *out);
    }
}

void cpu_embedding_backward(float *dtable, const float *dout, const int *tokens, int n, int dim,
                            int vocab_start, int rows) {
    int n_chunks = (dim + EMBEDDING_COL_CHUNK - 1) / EMBEDDING_COL_CHUNK;
#pragma omp parallel for
    for (int c = 0; c < n_chunks; c++) {
        int j0 = c * EMBEDDING_COL_CHUNK;
        int j1 = j0 + EMBEDDING_COL_CHUNK < dim ? j0 + EMBEDDING_COL_CHUNK : dim;
        for (int i = 0; i < n; i++) {
            int r = slice_row(tokens[i], vocab_start, rows);
            if (r < 0) continue;
            float *dst = dtable + (size_t)r * dim;
            const float *src = dout + (size_t)i * dim;
#pragma omp simd
            for (int j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
}
