// Cross-entropy over rows of logits, one block per row, fp32 throughout. The row's log-sum-exp
// is one pass of the online softmax (Milakov & Gimelshein 2018): each thread keeps a running
// max m and sum of exp(x - m), rescaled when m grows, so a 128K-wide row is read once; the
// block then combines the (m, sum) pairs around the row max. A row is read as float4 groups
// when vocab is a multiple of 4 and the bases are 16-byte aligned (then every row is).
#include <stdint.h>

#include "kernels/cuda/device.cuh"

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// A -inf logit adds exp(-inf) = 0, so it is skipped: while m is still -inf, exp(x - m) would
// be exp(NaN) and poison the row (the cpu twin, shifting by the row max, gets 0). NaN still adds.
__device__ __forceinline__ void lse_push(float *m, float *s, float x) {
    if (x > *m) {
        *s = *s * expf(*m - x) + 1.0f;
        *m = x;
    } else if (x != -INFINITY) {
        *s += expf(x - *m);
    }
}

// log(sum(exp(x))) of a row, to every thread of the block (which must all call it). A thread
// that saw no element has s = 0 and adds nothing (its m is -inf).
static __device__ float cross_entropy_lse(const float *x, int vocab, bool vec, float *shared) {
    float m = -INFINITY, s = 0.0f;
    int v4 = vec ? vocab / 4 : 0;
    for (int j = threadIdx.x; j < v4; j += blockDim.x) {
        float4 v = ((const float4 *)x)[j];
        lse_push(&m, &s, v.x);
        lse_push(&m, &s, v.y);
        lse_push(&m, &s, v.z);
        lse_push(&m, &s, v.w);
    }
    for (int j = 4 * v4 + threadIdx.x; j < vocab; j += blockDim.x) lse_push(&m, &s, x[j]);
    float mx = block_max(m, shared);
    float sum = block_sum(s == 0.0f ? 0.0f : s * expf(m - mx), shared);
    return mx + logf(sum);
}

// d = (overwrite ? 0 : d) + dloss exp(x - lse) over the row, then d[t] -= dloss when the target
// t is in the row. Each element is read before the same thread writes it, so d may alias x
// (overwrite); the caller's cross_entropy_lse has synchronised after its reads of the row.
static __device__ void cross_entropy_write_grad(float *d, const float *x, float lse, int t,
                                                int vocab, float dloss, bool overwrite,
                                                bool vec) {
    int v4 = vec ? vocab / 4 : 0;
    for (int j = threadIdx.x; j < v4; j += blockDim.x) {
        float4 v = ((const float4 *)x)[j];
        float4 g = overwrite ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : ((float4 *)d)[j];
        g.x += dloss * expf(v.x - lse);
        g.y += dloss * expf(v.y - lse);
        g.z += dloss * expf(v.z - lse);
        g.w += dloss * expf(v.w - lse);
        ((float4 *)d)[j] = g;
    }
    for (int j = 4 * v4 + threadIdx.x; j < vocab; j += blockDim.x)
        d[j] = (overwrite ? 0.0f : d[j]) + dloss * expf(x[j] - lse);
    __syncthreads();  // d[t] was written by whichever thread owns it
    if (threadIdx.x == 0 && t >= 0 && t < vocab) d[t] -= dloss;
}

static __global__ void cross_entropy_forward_rows(float *losses, const float *logits,
                                                  const int *targets, int vocab, bool vec) {
    __shared__ float shared[32];
    const float *x = logits + (size_t)blockIdx.x * vocab;
    float lse = cross_entropy_lse(x, vocab, vec, shared);
    if (threadIdx.x == 0) losses[blockIdx.x] = lse - x[targets[blockIdx.x]];
}

// The full row's lse is recomputed here, as the cpu twin does, rather than saved by forward.
static __global__ void cross_entropy_backward_rows(float *dlogits, const float *logits,
                                                   const int *targets, int vocab, float dloss,
                                                   bool overwrite, bool vec) {
    __shared__ float shared[32];
    size_t at = (size_t)blockIdx.x * vocab;
    float lse = cross_entropy_lse(logits + at, vocab, vec, shared);
    cross_entropy_write_grad(dlogits + at, logits + at, lse, targets[blockIdx.x], vocab, dloss,
                             overwrite, vec);
}

static __global__ void cross_entropy_slice_forward_rows(float *lse, float *target_logit,
                                                        const float *logits, const int *targets,
                                                        int vocab, int vocab_start, bool vec) {
    __shared__ float shared[32];
    const float *x = logits + (size_t)blockIdx.x * vocab;
    float l = cross_entropy_lse(x, vocab, vec, shared);
    if (threadIdx.x == 0) {
        int t = targets[blockIdx.x] - vocab_start;
        lse[blockIdx.x] = l;
        target_logit[blockIdx.x] = t >= 0 && t < vocab ? x[t] : 0.0f;
    }
}

static __global__ void cross_entropy_slice_backward_rows(float *dlogits, const float *logits,
                                                         const float *lse, const int *targets,
                                                         int vocab, int vocab_start, float dloss,
                                                         bool overwrite, bool vec) {
    size_t at = (size_t)blockIdx.x * vocab;
    cross_entropy_write_grad(dlogits + at, logits + at, lse[blockIdx.x],
                             targets[blockIdx.x] - vocab_start, vocab, dloss, overwrite, vec);
}

static __global__ void cross_entropy_merge_exp_rows(float *sums, const float *lse,
                                                    const float *max, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        sums[i] = expf(lse[i] - max[i]);
}

static __global__ void cross_entropy_merge_finish_rows(float *losses, float *lse,
                                                       const float *max, const float *sums,
                                                       const float *target_logit, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float l = max[i] + logf(sums[i]), t = target_logit[i];
        lse[i] = l;
        losses[i] = l - t;
    }
}

static bool rows_vec(const float *a, const float *b, int vocab) {
    return vocab % 4 == 0 && aligned16(a) && aligned16(b);
}

// n == 0 returns before any launch: an empty grid is a launch error.
void cuda_cross_entropy_forward(float *losses, const float *logits, const int *targets, int n,
                                int vocab) {
    if (n == 0) return;
    cross_entropy_forward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(
        losses, logits, targets, vocab, rows_vec(logits, logits, vocab));
    CUDA_LAUNCH_CHECK();
}

void cuda_cross_entropy_backward(float *dlogits, const float *logits, const int *targets, int n,
                                 int vocab, float dloss) {
    if (n == 0) return;
    cross_entropy_backward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(
        dlogits, logits, targets, vocab, dloss, dlogits == logits,
        rows_vec(dlogits, logits, vocab));
    CUDA_LAUNCH_CHECK();
}

void cuda_cross_entropy_slice_forward(float *lse, float *target_logit, const float *logits,
                                      const int *targets, int n, int vocab, int vocab_start) {
    if (n == 0) return;
    cross_entropy_slice_forward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(
        lse, target_logit, logits, targets, vocab, vocab_start, rows_vec(logits, logits, vocab));
    CUDA_LAUNCH_CHECK();
}

void cuda_cross_entropy_slice_backward(float *dlogits, const float *logits, const float *lse,
                                       const int *targets, int n, int vocab, int vocab_start,
                                       float dloss) {
    if (n == 0) return;
    cross_entropy_slice_backward_rows<<<n, CUDA_THREADS, 0, cuda_stream()>>>(
        dlogits, logits, lse, targets, vocab, vocab_start, dloss, dlogits == logits,
        rows_vec(dlogits, logits, vocab));
    CUDA_LAUNCH_CHECK();
}

// Both merge steps read an element's inputs before writing its outputs: in place is safe.
void cuda_cross_entropy_merge_exp(float *sums, const float *lse, const float *max, int n) {
    cross_entropy_merge_exp_rows<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(sums, lse,
                                                                                   max, n);
    CUDA_LAUNCH_CHECK();
}

void cuda_cross_entropy_merge_finish(float *losses, float *lse, const float *max,
                                     const float *sums, const float *target_logit, int n) {
    cross_entropy_merge_finish_rows<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(
        losses, lse, max, sums, target_logit, n);
    CUDA_LAUNCH_CHECK();
}
