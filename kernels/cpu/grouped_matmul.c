// Grouped GEMM over experts: one sgemm per group (as torch._grouped_mm's fallback loops).
#include <cblas.h>

#include "kernels/cpu/cpu.h"

// Group g's GEMM. Forward / input gradient: c rows R_g = a rows R_g times b_g (n, k) or (k, n).
// Weight gradient: c_g (k, n) = a[R_g]^T b[R_g]; with no rows BLAS leaves beta * c_g.
static void grouped_matmul_group(float *c, const float *a, const float *b, const int *offsets,
                                 int g, int n, int k, bool trans_a, bool trans_b, float beta) {
    size_t r0 = (size_t)offsets[g];
    int m = offsets[g + 1] - offsets[g];
    if (!trans_a) {
        if (m == 0) return;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                    1.0f, a + r0 * k, k, b + (size_t)g * n * k, trans_b ? k : n, beta,
                    c + r0 * n, n);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, m, 1.0f, a + r0 * k, k,
                b + r0 * n, n, beta, c + (size_t)g * k * n, n);
}

// Threads: see bench_grouped_matmul (tests/reference) for the measurement behind this choice.
void cpu_grouped_matmul(float *c, const float *a, const float *b, const int *offsets, int groups,
                        int n, int k, bool trans_a, bool trans_b, float beta) {
    CHECK(!(trans_a && trans_b));
    for (int g = 0; g < groups; g++)
        grouped_matmul_group(c, a, b, offsets, g, n, k, trans_a, trans_b, beta);
}
