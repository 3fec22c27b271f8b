// The cpu backend's fp32 GEMM: oneDNN's dnnl_sgemm, chosen over OpenBLAS's cblas_sgemm by
// measurement on the training step's own shapes (scripts/bench_peer.sh's fp32 step, and the
// per-GEMM table of scripts/bench_gemm.sh): on the debug model at 2 threads the whole step ran
// about 1.35x faster on an AMD EPYC (Zen 5, avx512_bf16) and 1.13x on a Xeon with AMX. Both
// accumulate in fp32; the order of the sums inside a GEMM is the library's. Attention's tiles
// have their own kernels (kernels/cpu/small_gemm.c).
#include <oneapi/dnnl/dnnl.h>

#include "kernels/cpu/cpu.h"

void cpu_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
               int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: c = beta c, and c is not read when beta is 0
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * c[(size_t)i * ldc + j];
        return;
    }
    dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                      a, lda, b, ldb, beta, c, ldc);
    if (status != dnnl_success)
        die_internal(__FILE__, __LINE__, "dnnl_sgemm(%c%c, m %d, n %d, k %d, lda %d, ldb %d, "
                     "ldc %d): status %d", trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k,
                     lda, ldb, ldc, (int)status);
}
