#include "kernels/cpu/cpu.h"

// One sgemm; with bf16 operands, or fp32 ones under bf16 compute (rounded to bf16 first), one
// oneDNN bf16 GEMM, or where oneDNN has none sgemm of the bf16 values widened to floats (the
// same numbers: a product of two bf16 values is exact in fp32). With beta == 0 c is not read,
// so stale (even NaN) contents are ignored; k == 0 is an empty sum (c = beta c).
void cpu_matmul(float *c, const void *a, const void *b, Dtype ab, int m, int n, int k,
                bool trans_a, bool trans_b, float beta) {
    CHECK(ab == DTYPE_FP32 || ab == DTYPE_BF16);
    bool onednn = cpu_gemm_bf16_on() && !cpu_gemm_bf16_emulated() && k > 0;
    if (ab == DTYPE_BF16 && onednn) {
        cpu_gemm_bf16(c, a, b, m, n, k, trans_a, trans_b, beta, false);
        return;
    }
    if (ab == DTYPE_FP32 && onednn) {
        const uint16_t *a16 = cpu_gemm_bf16_round(0, a, (size_t)m * k);
        const uint16_t *b16 = cpu_gemm_bf16_round(1, b, (size_t)k * n);
        cpu_gemm_bf16(c, a16, b16, m, n, k, trans_a, trans_b, beta, false);
        return;
    }
    if (ab == DTYPE_BF16) {
        a = cpu_gemm_bf16_widen(0, a, (size_t)m * k);
        b = cpu_gemm_bf16_widen(1, b, (size_t)k * n);
    } else if (cpu_gemm_bf16_on()) {
        a = cpu_gemm_bf16_round_floats(0, a, (size_t)m * k);
        b = cpu_gemm_bf16_round_floats(1, b, (size_t)k * n);
    }
    cpu_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, trans_a ? m : k, b, trans_b ? k : n, beta, c,
              n);
}
