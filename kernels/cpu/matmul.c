#include <cblas.h>

#include "kernels/cpu/cpu.h"

// One sgemm, or with bf16 compute one oneDNN bf16 GEMM of the operands rounded to bf16 (or
// sgemm of them rounded, where oneDNN has none). With beta == 0 c is not read, so stale (even
// NaN) contents are ignored; k == 0 (an empty sum, c = beta c) is left to BLAS either way.
void cpu_matmul(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                bool trans_b, float beta) {
    if (cpu_gemm_bf16_on() && k > 0) {
        if (!cpu_gemm_bf16_emulated()) {
            const uint16_t *a16 = cpu_gemm_bf16_round(0, a, (size_t)m * k);
            const uint16_t *b16 = cpu_gemm_bf16_round(1, b, (size_t)k * n);
            cpu_gemm_bf16(c, a16, b16, m, n, k, trans_a, trans_b, beta, false);
            return;
        }
        a = cpu_gemm_bf16_round_floats(0, a, (size_t)m * k);
        b = cpu_gemm_bf16_round_floats(1, b, (size_t)k * n);
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, c, n);
}
