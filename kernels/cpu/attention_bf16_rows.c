// Attention's backward softmax rows under bf16 compute (kernels/cpu/attention.c's tiles): P
// again from the log-sum-exp and dS = P o (dP - D), each written as the bf16 words of the tile
// GEMMs that read them.
//
// A file of their own so that they compile with fused multiply-adds (the Makefile's
// -ffp-contract=fast, as small_gemm.c): cpu_expf's range reduction and polynomial fused, the
// debug model's attention took 8% less time, its outputs still within bf16's bound. fp32 attention's rows stay in attention.c, unfused, its bits unchanged.
#include <math.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"

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

void cpu_attention_probs_rows_bf16(float *p0, float *p1, float lse0, float lse1, int n0, int n1,
                                   uint32_t *pt, int ws) {
    int vectors = round16(n0 > n1 ? n0 : n1);
#pragma omp simd
    for (int j = 0; j < vectors; j++) {
        float e0 = keep_or_zero(cpu_expf(p0[j] - lse0), j < n0);
        float e1 = keep_or_zero(cpu_expf(p1[j] - lse1), j < n1);
        p0[j] = e0, p1[j] = e1;
        pt[j] = bf16_word(e0, e1);
    }
    memset(pt + vectors, 0, (size_t)(ws - vectors) * sizeof *pt);  // dV's GEMM reads them
}

void cpu_attention_dscores_rows_bf16(const float *p0, const float *p1, const float *dp0,
                                     const float *dp1, float d0, float d1, int n0, int n1,
                                     uint16_t *ds0, uint16_t *ds1, uint32_t *dst, int ws) {
    int vectors = round16(n0 > n1 ? n0 : n1);
#pragma omp simd
    for (int j = 0; j < vectors; j++) {
        float g0 = keep_or_zero(p0[j] * (dp0[j] - d0), j < n0);
        float g1 = keep_or_zero(p1[j] * (dp1[j] - d1), j < n1);
        ds0[j] = bf16_from_float(g0), ds1[j] = bf16_from_float(g1);
        dst[j] = bf16_word(g0, g1);
    }
    size_t rest = (size_t)(ws - vectors);
    memset(ds0 + vectors, 0, rest * sizeof *ds0), memset(ds1 + vectors, 0, rest * sizeof *ds1);
    memset(dst + vectors, 0, rest * sizeof *dst);
}
