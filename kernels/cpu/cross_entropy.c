#include <math.h>

#include "kernels/cpu/cpu.h"

// log(sum(exp(x))) shifted by the row maximum, so no exp overflows (logits of any size).
static float cross_entropy_lse(const float *x, int vocab) {
    float mx = cpu_max_floats(x, vocab);
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

// Aliased, the row is consumed: exp(x - max) is written over it while summing, then scaled,
// one exp per logit instead of two.
static void cross_entropy_backward_overwrite(float *x, int target, int vocab, float dloss) {
    float mx = cpu_max_floats(x, vocab), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < vocab; j++) {
        x[j] = cpu_expf(x[j] - mx);
        sum += x[j];
    }
    float s = dloss / sum;
#pragma omp simd
    for (int j = 0; j < vocab; j++) x[j] *= s;
    x[target] -= dloss;
}

static void cross_entropy_backward_add(float *d, const float *x, int target, int vocab,
                                       float dloss) {
    float lse = cross_entropy_lse(x, vocab);
#pragma omp simd
    for (int j = 0; j < vocab; j++) d[j] += dloss * cpu_expf(x[j] - lse);
    d[target] -= dloss;
}

void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, int n,
                                int vocab, float dloss) {
    bool overwrite = dlogits == logits;
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *d = dlogits + (size_t)i * vocab;
        if (overwrite)
            cross_entropy_backward_overwrite(d, targets[i], vocab, dloss);
        else
            cross_entropy_backward_add(d, logits + (size_t)i * vocab, targets[i], vocab, dloss);
    }
}

void cpu_cross_entropy_slice_forward(float *lse, float *target_logit, const float *logits,
                                     const int *targets, int n, int vocab, int vocab_start) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *x = logits + (size_t)i * vocab;
        int t = targets[i] - vocab_start;
        lse[i] = cross_entropy_lse(x, vocab);
        target_logit[i] = t >= 0 && t < vocab ? x[t] : 0.0f;
    }
}

void cpu_cross_entropy_slice_backward(float *dlogits, const float *logits, const float *lse,
                                      const int *targets, int n, int vocab, int vocab_start,
                                      float dloss) {
    bool overwrite = dlogits == logits;
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *d = dlogits + (size_t)i * vocab;
        const float *x = logits + (size_t)i * vocab;
        float m = lse[i];
#pragma omp simd
        for (int j = 0; j < vocab; j++)
            d[j] = (overwrite ? 0.0f : d[j]) + dloss * cpu_expf(x[j] - m);
        int t = targets[i] - vocab_start;
        if (t >= 0 && t < vocab) d[t] -= dloss;
    }
}

void cpu_cross_entropy_merge_exp(float *sums, const float *lse, const float *max, int n) {
    for (int i = 0; i < n; i++) sums[i] = expf(lse[i] - max[i]);
}

void cpu_cross_entropy_merge_finish(float *losses, float *lse, const float *max,
                                    const float *sums, const float *target_logit, int n) {
    for (int i = 0; i < n; i++) {
        lse[i] = max[i] + logf(sums[i]);
        losses[i] = lse[i] - target_logit[i];
    }
}
