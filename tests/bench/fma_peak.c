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

// steps of CHAINS fp32 chains; returns a checksum of every lane (so no work is dropped).
static float fp32_chains(void) {
    Vec16 acc[CHAINS], a = {0}, b = {0};
    a += 0.999f, b += 1e-3f;
    for (int c = 0; c < CHAINS; c++) acc[c] = (Vec16){0} + (float)c;  // distinct: no sharing
    for (long i = 0; i < steps; i++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * a + b;
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; c++)
        for (int l = 0; l < 16; l++) sink += acc[c][l];
    return sink;
}

#ifdef __AVX512BF16__
// The same with vdpbf16ps.
static float bf16_chains(void) {
    __m512 acc[CHAINS];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < steps; i++)
#pragma GCC unroll 12
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    float sink = 0.0f;
    for (int c = 0; c < CHAINS; c++) sink += _mm512_reduce_add_ps(acc[c]);
    return sink;
}
#endif

// The best of three runs of `chains` (other jobs only slow it), flop a lane of a step.
static void print_peak(const char *what, float (*chains)(void), double flop) {
    double best = 0.0;
    volatile float sink = 0.0f;  // stored before the clock is read again: the work stays inside
    for (int round = 0; round < 3; round++) {
        double t0 = now_seconds();
        sink = chains();
        double gflops = flop * 16 * CHAINS * steps / (now_seconds() - t0) / 1e9;
        best = gflops > best ? gflops : best;
    }
    printf("%s peak: %.1f GFLOP/s per core (checksum %g)\n", what, best, (double)sink);
}

int main(void) {
    print_peak("fp32 fused multiply-add", fp32_chains, 2.0);
#ifdef __AVX512BF16__
    print_peak("bf16 dot-product (vdpbf16ps)", bf16_chains, 4.0);
#endif
    return 0;
}
