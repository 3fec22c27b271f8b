// The hardware's limit for scripts/bench_peer.sh: one core's fp32 multiply-add rate, from 12
// independent chains of 16-float fused multiply-adds (enough to cover the unit's latency), in
// GFLOP/s (2 per multiply-add). Built -O2 -march=native -ffp-contract=fast, so the chains are
// the widest fused instructions this cpu has. On the AMD EPYC of 2026-12-07: 116.5 per core,
// which titan's fp32 GEMMs reach 91% of on the debug model's step.
#include <stdio.h>
#include <time.h>

typedef float Vec16 __attribute__((vector_size(64)));

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    enum { CHAINS = 12 };
    const long steps = 50000000;
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
    return 0;
}
