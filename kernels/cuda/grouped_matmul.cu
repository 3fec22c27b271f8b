// cuda_grouped_matmul: the non-empty groups as one cublasGemmGroupedBatchedEx call, each group
// a problem of its own size (cuBLAS's group of one), in fp32 compute. Under bf16 compute each
// group is a cuda_matmul of its own instead: cublasGemmGroupedBatchedEx refuses
// CUBLAS_COMPUTE_32F_FAST_16BF ("the requested functionality is not supported", cuBLAS 13.1 on
// an H200), and the bf16 numerics contract needs the operands rounded as cuda_matmul rounds them.
// Row-major to column-major as in matmul.cu: c (M, N) = op(a) op(b) is, to cuBLAS, C^T (N, M)
// = op(b)^T op(a)^T, so cuBLAS's A is titan's b with TRANSA = trans_b, its B is titan's a with
// TRANSB = trans_a, and M and N swap; each leading dimension is the buffer's column count.
#include "kernels/cuda/cuda.h"

// Groups per call: experts per rank, which no MoE model comes near.
#define GROUPED_MAX 4096

// The arguments cuBLAS reads from host memory, one entry per problem (static: no allocation
// in the step; ops are issued from one host thread).
static struct {
    cublasOperation_t trans_a[GROUPED_MAX], trans_b[GROUPED_MAX];
    int m[GROUPED_MAX], n[GROUPED_MAX], k[GROUPED_MAX], one[GROUPED_MAX];
    int lda[GROUPED_MAX], ldb[GROUPED_MAX], ldc[GROUPED_MAX];
    float alpha[GROUPED_MAX], beta[GROUPED_MAX];
    const void *ptr[3][GROUPED_MAX];  // cuBLAS's A, B and C of each problem
} args;

// c_g = beta c_g for a weight-gradient group without rows (beta 0: c_g is not read).
static void grouped_scale_empty(float *c, size_t count, float beta) {
    if (beta == 0.0f)
        CUDA_CHECK(cudaMemsetAsync(c, 0, count * sizeof(float), cuda_stream()));
    else if (beta != 1.0f)
        cuda_scale(c, count, beta);
}

// Adds titan's c (M, N) = op(a) op(b) + beta c as the next problem, or runs it now under bf16
// compute.
static void grouped_add(int *problems, float *c, const float *a, const float *b, int M, int N,
                        int K, bool trans_a, bool trans_b, float beta) {
    if (cuda_bf16_compute()) {
        cuda_matmul(c, a, b, DTYPE_FP32, M, N, K, trans_a, trans_b, beta);
        return;
    }
    int i = (*problems)++;
    args.trans_a[i] = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    args.trans_b[i] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    args.m[i] = N, args.n[i] = M, args.k[i] = K, args.one[i] = 1;
    args.lda[i] = trans_b ? K : N, args.ldb[i] = trans_a ? M : K, args.ldc[i] = N;
    args.alpha[i] = 1.0f, args.beta[i] = beta;
    args.ptr[0][i] = b, args.ptr[1][i] = a, args.ptr[2][i] = c;
}

void cuda_grouped_matmul(float *c, const float *a, const float *b, const int *offsets,
                         int groups, int n, int k, bool trans_a, bool trans_b, float beta) {
    CHECK(!(trans_a && trans_b) && groups <= GROUPED_MAX && n > 0 && k > 0);
    int problems = 0;
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g];
        int m = offsets[g + 1] - offsets[g];
        if (trans_a && m == 0)
            grouped_scale_empty(c + (size_t)g * k * n, (size_t)k * n, beta);
        else if (trans_a)
            grouped_add(&problems, c + (size_t)g * k * n, a + r0 * k, b + r0 * n, k, n, m, true,
                        false, beta);
        else if (m > 0)
            grouped_add(&problems, c + r0 * n, a + r0 * k, b + (size_t)g * n * k, m, n, k,
                        false, trans_b, beta);
    }
    if (problems == 0) return;
    // cuBLAS reads the pointer arrays from device memory: they go to the backend's scratch on
    // the stream (after the ops that may still use it; the host arrays are free on return).
    const void **ptrs = (const void **)cuda_scratch();
    size_t bytes = (size_t)problems * sizeof(void *);
    for (int p = 0; p < 3; p++)
        CUDA_CHECK(cudaMemcpyAsync(ptrs + (size_t)p * problems, args.ptr[p], bytes,
                                   cudaMemcpyHostToDevice, cuda_stream()));
    CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cuda_cublas(), args.trans_a, args.trans_b, args.m, args.n, args.k, args.alpha, ptrs,
        CUDA_R_32F, args.lda, ptrs + problems, CUDA_R_32F, args.ldb, args.beta,
        (void *const *)(ptrs + 2 * problems), CUDA_R_32F, args.ldc, problems, args.one,
        CUBLAS_COMPUTE_32F));
}
