// Attention's backward softmax rows under bf16 compute (kernels/cpu/attention.c's tiles): P
// again from the log-sum-exp and dS = P o (dP - D), each written as the bf16 words of the tile
// GEMMs that read them, 16 keys at a time.
//
// A file of their own so that they compile with fused multiply-adds (the Makefile's
// -ffp-contract=fast, as small_gemm.c) where the build has them (NATIVE=1, and the avx512_bf16
// path): cpu_expf's range reduction and polynomial fused, the debug model's attention took 8%
// less time, its outputs still within bf16's bound. fp32 attention's rows stay in attention.c,
// unfused, its bits unchanged. Where the cpu has avx512_bf16 the rounding is vcvtne2ps2bf16's
// (small_gemm_term.h): P the same numbers, dS's subnormals flushed to zero as vdpbf16ps
// flushes its inputs'.
#include <math.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/small_gemm_term.h"

// x where keep, else 0, by its bits: a select the vectoriser takes where `keep ? x : 0` around
// a computation would become a branch it cannot (with trapping math) turn back into one.
static inline float keep_or_zero(float x, bool keep) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= -(uint32_t)keep;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static int round16(int n) { return (n + 15) / 16 * 16; }

static inline __attribute__((always_inline)) void probs_rows(float *p0, float *p1, float lse0,
                                                             float lse1, int n0, int n1,
                                                             uint32_t *pt, int ws,
                                                             const SmallGemmTerm TERM) {
    int vectors = round16(n0 > n1 ? n0 : n1);
    for (int j0 = 0; j0 < vectors; j0 += 16) {
        float *e0 = p0 + j0, *e1 = p1 + j0;
#pragma omp simd
        for (int l = 0; l < 16; l++) {
            e0[l] = keep_or_zero(cpu_expf(e0[l] - lse0), j0 + l < n0);
            e1[l] = keep_or_zero(cpu_expf(e1[l] - lse1), j0 + l < n1);
        }
        bf16_pairs16((Words16 *)(pt + j0), e0, e1, TERM);
    }
    memset(pt + vectors, 0, (size_t)(ws - vectors) * sizeof *pt);  // dV's GEMM reads them
}

static inline __attribute__((always_inline)) void dscores_rows(
    const float *p0, const float *p1, const float *dp0, const float *dp1, float d0, float d1,
    int n0, int n1, uint16_t *ds0, uint16_t *ds1, uint32_t *dst, int ws, const SmallGemmTerm TERM) {
    int vectors = round16(n0 > n1 ? n0 : n1);
    for (int j0 = 0; j0 < vectors; j0 += 16) {
        float g0[16], g1[16];
#pragma omp simd
        for (int l = 0; l < 16; l++) {
            int j = j0 + l;
            g0[l] = keep_or_zero(p0[j] * (dp0[j] - d0), j < n0);
            g1[l] = keep_or_zero(p1[j] * (dp1[j] - d1), j < n1);
        }
        Halves32 h;  // the two rows' bf16: their halves along each row, then their pairs
        bf16_halves32(&h, g0, g1, TERM);
        memcpy(ds0 + j0, &h, 16 * sizeof *ds0), memcpy(ds1 + j0, (uint16_t *)&h + 16, 16 * sizeof *ds1);
        bf16_pairs16((Words16 *)(dst + j0), g0, g1, TERM);
    }
    size_t rest = (size_t)(ws - vectors);
    memset(ds0 + vectors, 0, rest * sizeof *ds0), memset(ds1 + vectors, 0, rest * sizeof *ds1);
    memset(dst + vectors, 0, rest * sizeof *dst);
}

#if SMALL_GEMM_DPBF16
__attribute__((target("avx512f,avx512bw"))) static void probs_rows_dpbf16(
    float *p0, float *p1, float lse0, float lse1, int n0, int n1, uint32_t *pt, int ws) {
    probs_rows(p0, p1, lse0, lse1, n0, n1, pt, ws, TERM_DPBF16);
}

__attribute__((target("avx512f,avx512bw"))) static void dscores_rows_dpbf16(
    const float *p0, const float *p1, const float *dp0, const float *dp1, float d0, float d1,
    int n0, int n1, uint16_t *ds0, uint16_t *ds1, uint32_t *dst, int ws) {
    dscores_rows(p0, p1, dp0, dp1, d0, d1, n0, n1, ds0, ds1, dst, ws, TERM_DPBF16);
}
#endif

void cpu_attention_probs_rows_bf16(float *p0, float *p1, float lse0, float lse1, int n0, int n1,
                                   uint32_t *pt, int ws) {
#if SMALL_GEMM_DPBF16
    if (cpu_small_gemm_dpbf16()) {
        probs_rows_dpbf16(p0, p1, lse0, lse1, n0, n1, pt, ws);
        return;
    }
#endif
    probs_rows(p0, p1, lse0, lse1, n0, n1, pt, ws, TERM_BF16);
}

void cpu_attention_dscores_rows_bf16(const float *p0, const float *p1, const float *dp0,
                                     const float *dp1, float d0, float d1, int n0, int n1,
                                     uint16_t *ds0, uint16_t *ds1, uint32_t *dst, int ws) {
#if SMALL_GEMM_DPBF16
    if (cpu_small_gemm_dpbf16()) {
        dscores_rows_dpbf16(p0, p1, dp0, dp1, d0, d1, n0, n1, ds0, ds1, dst, ws);
        return;
    }
#endif
    dscores_rows(p0, p1, dp0, dp1, d0, d1, n0, n1, ds0, ds1, dst, ws, TERM_BF16);
}
