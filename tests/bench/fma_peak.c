// The hardware's limit for scripts/bench_peer.sh: one core's fp32 multiply-add rate, from 12
// independent chains of 16-float fused multiply-adds (enough to cover the unit's latency), in
// GFLOP/s (2 per multiply-add). Built -O2 -march=native -ffp-contract=fast, so the chains are
// the widest fused instructions this cpu has. On the AMD EPYC of 2026-12-07: 116.5 per core,
// which titan's fp32 GEMMs reach 91% of on the debug model's step. Where the cpu has
// avx512_bf16, the same for vdpbf16ps (two bf16 products and their sums into each of 16 floats:
// 4 FLOP a lane), the limit of the bf16 GEMMs without AMX: 234 per core on that EPYC.
#include <stdio.h>
#include <time.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

typedef float Vec16 __attribute__((vector_size(64)));

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum { CHAINS = 12 };
static const long steps = 50000000;

static void fp32_peak(void) {
    Vec16 acc[CHAINS], a = {0}, b = {0};
    a += 0.999f, b += 1e-3f;
    for (int c = 0; c < CHAINS; c++) acc[c] = (Vec16){0} + (float)c;  // distinct: no sharing
    double best = 0.0;
    for (int round = 0; round < 3; round++) {  // the best of three: other jobs only slow it
        double t0 = now_seconds();
        for (long i = 0; i < steps; i++)
#pragma GCC unroll 12
            for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;
        double gflops = 2.0 * 16 * CHAINS * steps / (now_seconds() - t0) / 1e9;
        best = gflops > best ? gflops : best;
    }
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; c++) sink += acc[c][0];
    printf("fp32 fused multiply-add peak: %.1f GFLOP/s per core (checksum %g)\n", best, sink);
}

#ifdef __AVX512BF16__
static void bf16_peak(void) {
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    double best = 0.0;
    for (int round = 0; round < 3; round++) {
        double t0 = now_seconds();
        for (long i = 0; i < steps; i++)
#pragma GCC unroll 12
            for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
        double gflops = 4.0 * 16 * CHAINS * steps / (now_seconds() - t0) / 1e9;
        best = gflops > best ? gflops : best;
    }
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; c++) sink += acc[c][0];
    printf("bf16 dot-product (vdpbf16ps) peak: %.1f GFLOP/s per core (checksum %g)\n", best,
           sink);
}
#endif

int main(void) {
    fp32_peak();
#ifdef __AVX512BF16__
    bf16_peak();
#endif
    return 0;
}
