// The expert sort and the moves between token order and expert-sorted rows. No float atomics:
// each output element has one owner (permute: a block per slot; unpermute: a block per token,
// adding its slots in slot order with unfused multiply-adds, so that it matches the cpu
// backend bit for bit; weight_grad: a warp per slot), so all of them are deterministic.
#include "kernels/cuda/device.cuh"

static __global__ void sort_count(int *counts, const int *experts, int n_slots) {
    for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n_slots; s += gridDim.x * blockDim.x)
        atomicAdd(&counts[experts[s]], 1);
}

// One thread: the kept rows' prefix sums over a few hundred experts at most.
static __global__ void sort_offsets(int *offsets, const int *counts, int n_experts,
                                    int capacity) {
    offsets[0] = 0;
    for (int e = 0; e < n_experts; e++) {
        int kept = capacity > 0 && counts[e] > capacity ? capacity : counts[e];
        offsets[e + 1] = offsets[e] + kept;
    }
}

// Block e places expert e's slots: it scans every slot in order, CUDA_THREADS at a time, and
// ranks its own by a block prefix count (ballots within warps, warp totals across them), so
// that rows follow slot order (a stable sort, the same as cpu's); ranks past the expert's kept
// rows are the capacity's drops.
static __global__ void sort_place(int *row_of_slot, const int *experts, const int *offsets,
                                  int n_slots) {
    __shared__ int warp_total[CUDA_THREADS / 32];
    int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int first = offsets[e], kept = offsets[e + 1] - offsets[e], base = 0;
    for (int start = 0; start < n_slots; start += CUDA_THREADS) {
        int s = start + threadIdx.x;
        bool mine = s < n_slots && experts[s] == e;
        unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_total[warp] = __popc(ballot);
        __syncthreads();
        int rank = base + __popc(ballot & ((1u << lane) - 1u)), total = 0;
        for (int w = 0; w < CUDA_THREADS / 32; w++) {
            rank += w < warp ? warp_total[w] : 0;
            total += warp_total[w];
        }
        if (mine) row_of_slot[s] = rank < kept ? first + rank : -1;
        base += total;
        __syncthreads();  // warp_total is rewritten next round
    }
}

void cuda_moe_sort(int *counts, int *offsets, int *row_of_slot, const int *experts, int n_slots,
                   int n_experts, int capacity) {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)n_experts * sizeof(int), cuda_stream()));
    if (n_slots > 0) {
        sort_count<<<cuda_grid((size_t)n_slots), CUDA_THREADS, 0, cuda_stream()>>>(
            counts, experts, n_slots);
        CUDA_LAUNCH_CHECK();
    }
    sort_offsets<<<1, 1, 0, cuda_stream()>>>(offsets, counts, n_experts, capacity);
    CUDA_LAUNCH_CHECK();
    if (n_slots == 0) return;
    sort_place<<<n_experts, CUDA_THREADS, 0, cuda_stream()>>>(row_of_slot, experts, offsets,
                                                              n_slots);
    CUDA_LAUNCH_CHECK();
}

static __global__ void permute_slots(float *out, const float *x, const float *weight,
                                     const int *row_of_slot, int k, int dim) {
    int s = blockIdx.x, row = row_of_slot[s];
    if (row < 0) return;
    float w = weight ? weight[s] : 1.0f;
    const float *src = x + (size_t)(s / k) * dim;
    float *dst = out + (size_t)row * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) dst[d] = __fmul_rn(src[d], w);
}

static __global__ void unpermute_tokens(float *y, const float *rows, const float *weight,
                                        const int *row_of_slot, int k, int dim) {
    int t = blockIdx.x;
    float *dst = y + (size_t)t * dim;
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = dst[d];
        for (int s = t * k; s < (t + 1) * k; s++) {
            int row = row_of_slot[s];
            if (row < 0) continue;
            float w = weight ? weight[s] : 1.0f;
            acc = __fadd_rn(acc, __fmul_rn(w, rows[(size_t)row * dim + d]));
        }
        dst[d] = acc;
    }
}

// A warp per slot, CUDA_THREADS / 32 slots a block.
static __global__ void weight_grad_slots(float *dweight, const float *dy, const float *rows,
                                         const int *row_of_slot, int n_slots, int k, int dim) {
    int s = blockIdx.x * (CUDA_THREADS / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (s >= n_slots || row_of_slot[s] < 0) return;  // the whole warp leaves together
    const float *a = dy + (size_t)(s / k) * dim, *b = rows + (size_t)row_of_slot[s] * dim;
    float dot = 0.0f;
    for (int d = lane; d < dim; d += 32) dot += a[d] * b[d];
    dot = warp_sum(dot);
    if (lane == 0) dweight[s] += dot;
}

void cuda_moe_permute(float *out, const float *x, const float *weight, const int *row_of_slot,
                      int n, int k, int dim) {
    if (n == 0) return;
    permute_slots<<<n * k, CUDA_THREADS, 0, cuda_stream()>>>(out, x, weight, row_of_slot, k,
                                                             dim);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_unpermute(float *y, const float *rows, const float *weight, const int *row_of_slot,
                        int n, int k, int dim) {
    if (n == 0) return;
    unpermute_tokens<<<n, CUDA_THREADS, 0, cuda_stream()>>>(y, rows, weight, row_of_slot, k,
                                                            dim);
    CUDA_LAUNCH_CHECK();
}

void cuda_moe_weight_grad(float *dweight, const float *dy, const float *rows,
                          const int *row_of_slot, int n, int k, int dim) {
    if (n == 0) return;
    int per_block = CUDA_THREADS / 32;
    weight_grad_slots<<<(n * k + per_block - 1) / per_block, CUDA_THREADS, 0, cuda_stream()>>>(
        dweight, dy, rows, row_of_slot, n * k, k, dim);
    CUDA_LAUNCH_CHECK();
}
