// DeepSeek V3's sequence-wise balance loss (kernels.h moe_aux_stats / moe_aux_backward). Each
// sequence's sums have one owner thread, adding its rows in order: the same bits every run.
#include "kernels/cpu/cpu.h"

static float row_sum(const float *x, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

void cpu_moe_aux_stats(float *frac, float *prob, const float *scores, const int *experts,
                       const MoeRouter *r, int n, int first, int T) {
    int E = r->n_experts, k = r->top_k, b0 = first / T, b1 = (first + n - 1) / T;
    float per_slot = (float)E / ((float)k * T);
#pragma omp parallel for
    for (int b = b0; b <= b1; b++) {
        int lo = b * T > first ? b * T - first : 0;
        int hi = (b + 1) * T - first < n ? (b + 1) * T - first : n;
        float *f = frac + (size_t)b * E, *p = prob + (size_t)b * E;
        for (int t = lo; t < hi; t++) {
            const float *s = scores + (size_t)t * E;
            float norm = 1.0f / (row_sum(s, E) * T);
            for (int e = 0; e < E; e++) p[e] += s[e] * norm;
            for (int j = 0; j < k; j++) f[experts[(size_t)t * k + j]] += per_slot;
        }
    }
}

// Row t: g_i = dloss frac_i / T is the gradient of its normalised scores s_i / S, so
// ds_j = (g_j - sum_i g_i s_i / S) / S; then softmax's (s_j (ds_j - sum_i ds_i s_i)) or
// sigmoid's (ds_j s_j (1 - s_j)) backward.
void cpu_moe_aux_backward(float *dlogits, const float *frac, const float *scores,
                          const MoeRouter *r, int n, int first, int T, float dloss) {
    int E = r->n_experts;
#pragma omp parallel for
    for (int t = 0; t < n; t++) {
        const float *s = scores + (size_t)t * E, *f = frac + (size_t)((first + t) / T) * E;
        float *dl = dlogits + (size_t)t * E, S = row_sum(s, E), g = dloss / T, dot = 0;
        for (int e = 0; e < E; e++) dot += f[e] * s[e];
        dot *= g / S;
        float ds_dot_s = 0;
        for (int e = 0; e < E; e++) ds_dot_s += (g * f[e] - dot) / S * s[e];
        for (int e = 0; e < E; e++) {
            float ds = (g * f[e] - dot) / S;
            dl[e] += r->score_func == MOE_SCORE_SOFTMAX ? s[e] * (ds - ds_dot_s)
                                                        : ds * s[e] * (1.0f - s[e]);
        }
    }
}
