// Grouped GEMM over experts: one sgemm per group (as torch._grouped_mm's fallback loops).
#include <omp.h>

#include "kernels/cpu/cpu.h"

// The operands of one grouped GEMM: fp32 (with emulated bf16 compute, rounded to bf16 values),
// or with oneDNN's bf16 compute their bf16 copies.
typedef struct {
    const float *a, *b;
    const uint16_t *a16, *b16;  // NULL but with oneDNN's bf16 compute
} GroupedOperands;

// c (m, n) = op(a) op(b) + beta c at the given offsets into the operands, dense row-major (a
// (m, k) or, transposed, (k, m); b (k, n) or (n, k)), k >= 1.
static void grouped_matmul_gemm(float *c, const GroupedOperands *x, size_t a0, size_t b0, int m,
                                int n, int k, bool trans_a, bool trans_b, float beta) {
    if (x->a16) {
        cpu_gemm_bf16(c, x->a16 + a0, x->b16 + b0, m, n, k, trans_a, trans_b, beta, true);
        return;
    }
    cpu_sgemm(trans_a, trans_b, m, n, k, 1.0f, x->a + a0, trans_a ? m : k, x->b + b0,
              trans_b ? k : n, beta, c, n);
}

// Group g's GEMM. Forward / input gradient: c rows R_g = a rows R_g times b_g (n, k) or (k, n).
// Weight gradient: c_g (k, n) = a[R_g]^T b[R_g]; with no rows, beta * c_g (as BLAS leaves it).
static void grouped_matmul_group(float *c, const GroupedOperands *x, const int *offsets, int g,
                                 int n, int k, bool trans_a, bool trans_b, float beta) {
    size_t r0 = (size_t)offsets[g];
    int m = offsets[g + 1] - offsets[g];
    if (!trans_a) {
        if (m == 0) return;
        grouped_matmul_gemm(c + r0 * n, x, r0 * k, (size_t)g * n * k, m, n, k, false, trans_b,
                            beta);
        return;
    }
    float *cg = c + (size_t)g * k * n;
    if (m > 0) {
        grouped_matmul_gemm(cg, x, r0 * k, r0 * n, k, n, m, true, false, beta);
        return;
    }
    for (size_t i = 0; i < (size_t)k * n; i++) cg[i] = beta == 0.0f ? 0.0f : beta * cg[i];
}

// Threads: one sgemm per expert, OpenMP over the experts. The measurement behind it
// (scripts/bench_moe.sh): OpenBLAS's own threads inside each of a loop of sgemms reached 0.4-0.8
// of one sgemm of the same total size, OpenMP over experts (each sgemm single-threaded: the
// OpenMP OpenBLAS runs so inside a parallel region) close to 1, most of all with many small
// experts. Over experts alone cannot split one expert, though: a group with more than a
// thread's share of the rows (skewed routing on many threads) runs first, by itself, with
// OpenBLAS's threads. Every group's result is one GEMM's either way (sgemm, or with bf16
// compute oneDNN's, likewise single-threaded in the region): deterministic.
static void grouped_matmul_run(float *c, const GroupedOperands *x, const int *offsets,
                               int groups, int n, int k, bool trans_a, bool trans_b,
                               float beta) {
    long rows = offsets[groups], threads = omp_get_max_threads();
    for (int g = 0; g < groups; g++)
        if ((long)(offsets[g + 1] - offsets[g]) * threads > rows)
            grouped_matmul_group(c, x, offsets, g, n, k, trans_a, trans_b, beta);
#pragma omp parallel for schedule(dynamic, 1)
    for (int g = 0; g < groups; g++)
        if ((long)(offsets[g + 1] - offsets[g]) * threads <= rows)
            grouped_matmul_group(c, x, offsets, g, n, k, trans_a, trans_b, beta);
}

void cpu_grouped_matmul(float *c, const float *a, const float *b, const int *offsets, int groups,
                        int n, int k, bool trans_a, bool trans_b, float beta) {
    CHECK(!(trans_a && trans_b));
    long rows = offsets[groups];
    GroupedOperands x = {a, b, NULL, NULL};
    size_t a_len = (size_t)rows * k, b_len = trans_a ? (size_t)rows * n : (size_t)groups * n * k;
    if (cpu_gemm_bf16_on() && rows > 0 && !cpu_gemm_bf16_emulated()) {
        x.a16 = cpu_gemm_bf16_round(0, a, a_len);
        x.b16 = cpu_gemm_bf16_round(1, b, b_len);
    } else if (cpu_gemm_bf16_on() && rows > 0) {
        x.a = cpu_gemm_bf16_round_floats(0, a, a_len);
        x.b = cpu_gemm_bf16_round_floats(1, b, b_len);
    }
    grouped_matmul_run(c, &x, offsets, groups, n, k, trans_a, trans_b, beta);
}

void cpu_grouped_matmul_fp32(float *c, const float *a, const float *b, const int *offsets,
                             int groups, int n, int k, bool trans_a, bool trans_b, float beta) {
    CHECK(!(trans_a && trans_b));
    GroupedOperands x = {a, b, NULL, NULL};
    grouped_matmul_run(c, &x, offsets, groups, n, k, trans_a, trans_b, beta);
}
