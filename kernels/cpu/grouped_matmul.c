// Grouped GEMM over experts: one sgemm per group (as torch._grouped_mm's fallback loops).
#include <cblas.h>
#include <omp.h>

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

// Threads: one sgemm per expert, OpenMP over the experts. The measurement behind it
// (scripts/bench_moe.sh): OpenBLAS's own threads inside each of a loop of sgemms reached 0.4-0.8
// of one sgemm of the same total size, OpenMP over experts (each sgemm single-threaded: the
// OpenMP OpenBLAS runs so inside a parallel region) close to 1, most of all with many small
// experts. Over experts alone cannot split one expert, though: a group with more than a
// thread's share of the rows (skewed routing on many threads) runs first, by itself, with
// OpenBLAS's threads. Every group's result is one sgemm's either way: deterministic.
void cpu_grouped_matmul(float *c, const float *a, const float *b, const int *offsets, int groups,
                        int n, int k, bool trans_a, bool trans_b, float beta) {
    CHECK(!(trans_a && trans_b));
    long rows = offsets[groups], threads = omp_get_max_threads();
    for (int g = 0; g < groups; g++)
        if ((long)(offsets[g + 1] - offsets[g]) * threads > rows)
            grouped_matmul_group(c, a, b, offsets, g, n, k, trans_a, trans_b, beta);
#pragma omp parallel for schedule(dynamic, 1)
    for (int g = 0; g < groups; g++)
        if ((long)(offsets[g + 1] - offsets[g]) * threads <= rows)
            grouped_matmul_group(c, a, b, offsets, g, n, k, trans_a, trans_b, beta);
}
