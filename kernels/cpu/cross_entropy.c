#include <math.h>

#include "kernels/cpu/cpu.h"

// log(sum(exp(x))) shifted by the row maximum, so no exp overflows (logits of any size).
static float cross_entropy_lse(const float *x, int vocab) {
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int j = 1; j < vocab; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < vocab; j++) sum += cpu_expf(x[j] - mx);
    return mx + logf(sum);
}

void cpu_cross_entropy_forward(float *losses, const float *logits, const int *targets, int n,
                               int vocab) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * vocab;
        losses[i] = cross_entropy_lse(x, vocab) - x[targets[i]];
    }
}

void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, int n,
                                int vocab, float dloss) {
    // Aliased, the logits are consumed: the gradient overwrites them instead of adding.
    bool overwrite = dlogits == logits;
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * vocab;
        float *d = dlogits + (size_t)i * vocab;
        float lse = cross_entropy_lse(x, vocab);
        if (overwrite) {
#pragma omp simd
            for (int j = 0; j < vocab; j++) d[j] = dloss * cpu_expf(x[j] - lse);
        } else {
#pragma omp simd
            for (int j = 0; j < vocab; j++) d[j] += dloss * cpu_expf(x[j] - lse);
        }
        d[targets[i]] -= dloss;
    }
}
