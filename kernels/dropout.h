// Dropout's keep decision, shared by the cpu and cuda kernels so that both drop the same
// elements: element i of a pass seeded by seed is kept when the top 32 bits of splitmix64's
// output for (seed, i) reach p's share of 2^32. A pure function of (seed, i): a recompute, or
// the backward's pass over a gradient of the same shape, drops the same elements.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define DROPOUT_FN __host__ __device__ static inline
#else
#define DROPOUT_FN static inline
#endif

// The threshold for probability p of dropping, in [0, 1).
DROPOUT_FN uint32_t dropout_threshold(float p) {
    double t = (double)p * 4294967296.0;
    return t >= 4294967295.0 ? 4294967295u : (uint32_t)t;
}

DROPOUT_FN bool dropout_keeps(uint64_t seed, uint64_t i, uint32_t threshold) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32) >= threshold;
}
