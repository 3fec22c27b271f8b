#include <cblas.h>

#include "kernels/cpu/cpu.h"

// One sgemm; with beta == 0 BLAS does not read c, so stale (even NaN) contents are ignored.
void cpu_matmul(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                bool trans_b, float beta) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, c, n);
}
