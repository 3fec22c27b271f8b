// The expert sort and the moves between token order and expert-sorted rows. Each output row
// has one owner: permute and weight_grad go by slot (each kept row is exactly one slot's),
// unpermute by token, adding its slots in slot order.
#include "kernels/cpu/cpu.h"

// Serial: one pass of integer work per slot, far below the GEMMs it feeds, and the stable
// placement is sequential by nature.
void cpu_moe_sort(int *counts, int *offsets, int *row_of_slot, const int *experts, int n_slots,
                  int n_experts, int capacity) {
    for (int e = 0; e < n_experts; e++) counts[e] = 0;
    for (int s = 0; s < n_slots; s++) {
        CHECK(experts[s] >= 0 && experts[s] < n_experts);
        counts[experts[s]]++;
    }
    offsets[0] = 0;
    for (int e = 0; e < n_experts; e++) {
        int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
        offsets[e + 1] = offsets[e] + kept;
    }
    int next[n_experts];  // expert e's next row
    for (int e = 0; e < n_experts; e++) next[e] = offsets[e];
    for (int s = 0; s < n_slots; s++) {
        int e = experts[s];
        row_of_slot[s] = next[e] < offsets[e + 1] ? next[e]++ : -1;
    }
}

void cpu_moe_permute(float *out, const float *x, const float *weight, const int *row_of_slot,
                     int n, int k, int dim) {
#pragma omp parallel for
    for (int s = 0; s < n * k; s++) {
        if (row_of_slot[s] < 0) continue;
        float *dst = out + (size_t)row_of_slot[s] * dim;
        const float *src = x + (size_t)(s / k) * dim;
        float w = weight ? weight[s] : 1.0f;
#pragma omp simd
        for (int d = 0; d < dim; d++) dst[d] = src[d] * w;
    }
}

void cpu_moe_unpermute(float *y, const float *rows, const float *weight, const int *row_of_slot,
                       int n, int k, int dim) {
#pragma omp parallel for
    for (int t = 0; t < n; t++) {
        float *dst = y + (size_t)t * dim;
        for (int s = t * k; s < (t + 1) * k; s++) {
            if (row_of_slot[s] < 0) continue;
            const float *src = rows + (size_t)row_of_slot[s] * dim;
            float w = weight ? weight[s] : 1.0f;
#pragma omp simd
            for (int d = 0; d < dim; d++) dst[d] += w * src[d];
        }
    }
}

void cpu_moe_weight_grad(float *dweight, const float *dy, const float *rows,
                         const int *row_of_slot, int n, int k, int dim) {
#pragma omp parallel for
    for (int s = 0; s < n * k; s++) {
        if (row_of_slot[s] < 0) continue;
        const float *a = dy + (size_t)(s / k) * dim, *b = rows + (size_t)row_of_slot[s] * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < dim; d++) dot += a[d] * b[d];
        dweight[s] += dot;
    }
}
