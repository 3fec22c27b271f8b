// cuda_matmul: one cuBLASLt GEMM per call, its descriptors and algorithm planned once per shape.
//
// Row-major to column-major: cuBLASLt reads matrices column-major, and a row-major (r, c)
// buffer with leading dimension c, read column-major, is its transpose (c, r) with ld c. So the
// row-major c (m, n) = op(a) op(b) is, to cuBLASLt, the column-major C^T (n, m) = op(b)^T op(a)^T:
// b is cuBLASLt's A and a its B, each laid out as its buffer lies (matmul_layout), and m and n
// swap. For b: when op(b) = b, op(b)^T = b^T is exactly b's column-major view (CUBLAS_OP_N);
// when op(b) = b^T, op(b)^T = b is the transpose of that view (CUBLAS_OP_T). The same holds for
// a, so cuBLASLt's TRANSA is trans_b and its TRANSB is trans_a.
//
// No fused epilogue beyond beta: cuBLASLt's epilogues add a bias or apply ReLU/GELU (and their
// gradients) to one GEMM's output. Llama has no biases, and its SwiGLU combines the outputs of
// two GEMMs, which no single-GEMM epilogue can express. What does pay is the interface's
// accumulate, beta = 1: the attention and FFN output projections add into the residual stream
// and the weight gradients accumulate across microbatches inside the GEMM, saving a separate
// read-modify-write pass over c for each.
#include <stdint.h>

#include "kernels/cuda/cuda.h"

// Distinct shapes in a run are a few dozen (each layer kind's forward and backward GEMMs, the
// output head, validation and decoding batch sizes), so a small fixed table suffices.
#define MATMUL_PLANS 512

// What the plan depends on. beta is not part of it: cublasLtMatmulAlgoGetHeuristic never sees
// beta, and a plan serves any beta given at call time. The pointers' alignment is, because the
// heuristic otherwise assumes 256-byte aligned operands, and tensors carved from an arena at
// row offsets need not be.
typedef struct {
    int m, n, k;
    bool trans_a, trans_b;
    cublasComputeType_t compute;
    cudaDataType_t ab;  // a's and b's type: CUDA_R_32F, or CUDA_R_16BF (c is fp32 either way)
    uint32_t align_a, align_b, align_c;  // bytes, powers of two from 4 to 256
} MatmulShape;

typedef struct {
    MatmulShape shape;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;  // of titan's a, b and c (c is also D)
    cublasLtMatmulAlgo_t algo;
} MatmulPlan;

// Plans live for the process (the handles they were made with do too). Ops are issued from one
// host thread, so the table needs no lock.
static MatmulPlan plans[MATMUL_PLANS];
static int n_plans;

static bool matmul_shape_equal(const MatmulShape *x, const MatmulShape *y) {
    return x->m == y->m && x->n == y->n && x->k == y->k && x->trans_a == y->trans_a &&
           x->trans_b == y->trans_b && x->compute == y->compute &&
           x->ab == y->ab && x->align_a == y->align_a &&
           x->align_b == y->align_b && x->align_c == y->align_c;
}

uint32_t cuda_alignment(const void *p) {
    uint32_t align = 256;
    while (align > 4 && (uintptr_t)p % align != 0) align >>= 1;
    return align;
}

// A dense row-major (rows, cols) buffer of type as cuBLASLt sees it: column-major (cols, rows).
static cublasLtMatrixLayout_t matmul_layout(cudaDataType_t type, int rows, int cols) {
    cublasLtMatrixLayout_t layout;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, (uint64_t)cols, (uint64_t)rows,
                                            (int64_t)cols));
    return layout;
}

static void gemm_set_preference(cublasLtMatmulPreference_t pref,
                                cublasLtMatmulPreferenceAttributes_t attr, uint32_t value) {
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value));
}

cublasStatus_t cuda_gemm_algo(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                              uint32_t align_a, uint32_t align_b, uint32_t align_c,
                              cublasLtMatmulAlgo_t *algo) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t workspace = CUDA_GEMM_WORKSPACE;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    gemm_set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    gemm_set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    gemm_set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
    gemm_set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(cuda_cublaslt(), desc, a, b, c, c, pref, 1,
                                                       &result, &found);
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (rc == CUBLAS_STATUS_SUCCESS && found == 0) rc = CUBLAS_STATUS_NOT_SUPPORTED;
    if (rc == CUBLAS_STATUS_SUCCESS) *algo = result.algo;
    return rc;
}

// The heuristic's best algorithm within the backend's workspace, for operands as aligned as
// this call's (cuBLASLt's A is titan's b, its B titan's a).
static cublasLtMatmulAlgo_t matmul_find_algo(const MatmulPlan *p) {
    const MatmulShape *s = &p->shape;
    cublasLtMatmulAlgo_t algo = {};
    cublasStatus_t rc = cuda_gemm_algo(p->desc, p->layout_b, p->layout_a, p->layout_c, s->align_b,
                                       s->align_a, s->align_c, &algo);
    if (rc != CUBLAS_STATUS_SUCCESS)
        die_internal(__FILE__, __LINE__,
                     "cuBLASLt has no algorithm for matmul m %d n %d k %d trans_a %d trans_b %d "
                     "(%s compute, alignment a %u b %u c %u bytes): %s",
                     s->m, s->n, s->k, s->trans_a, s->trans_b,
                     s->compute == CUBLAS_COMPUTE_32F ? "fp32" : "bf16", s->align_a, s->align_b,
                     s->align_c, cublasLtGetStatusString(rc));
    return algo;
}

static void matmul_plan_init(MatmulPlan *p, const MatmulShape *s) {
    p->shape = *s;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, s->compute, CUDA_R_32F));
    cublasOperation_t op_b = s->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_a = s->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b,
                                                sizeof op_b));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a,
                                                sizeof op_a));
    // The buffers as they lie: a is (k, m) when transposed else (m, k); b (n, k) else (k, n).
    p->layout_a = s->trans_a ? matmul_layout(s->ab, s->k, s->m)
                             : matmul_layout(s->ab, s->m, s->k);
    p->layout_b = s->trans_b ? matmul_layout(s->ab, s->n, s->k)
                             : matmul_layout(s->ab, s->k, s->n);
    p->layout_c = matmul_layout(CUDA_R_32F, s->m, s->n);
    p->algo = matmul_find_algo(p);
}

// The shape's plan, made the first time the shape is seen (the only time this op allocates).
static const MatmulPlan *matmul_plan(const MatmulShape *s) {
    for (int i = 0; i < n_plans; i++)
        if (matmul_shape_equal(&plans[i].shape, s)) return &plans[i];
    if (n_plans == MATMUL_PLANS)
        die_internal(__FILE__, __LINE__,
                     "matmul: more than %d distinct shapes; raise MATMUL_PLANS", MATMUL_PLANS);
    matmul_plan_init(&plans[n_plans], s);
    return &plans[n_plans++];
}

// k == 0 is an empty sum, c = beta * c, as BLAS (and so the cpu twin) does it: with beta == 0 c
// is not read, so stale (even NaN) contents become zeros.
static void matmul_scale_c(float *c, size_t count, float beta) {
    if (beta == 0.0f)
        CUDA_CHECK(cudaMemsetAsync(c, 0, count * sizeof(float), cuda_stream()));
    else if (beta != 1.0f)
        cuda_scale(c, count, beta);
}

// bf16 operands run in CUBLAS_COMPUTE_32F: they are bf16 already, and fp32 accumulation is what
// FAST_16BF gives fp32 ones after rounding them.
void cuda_matmul(float *c, const void *a, const void *b, Dtype ab, int m, int n, int k,
                 bool trans_a, bool trans_b, float beta) {
    CHECK(m >= 0 && n >= 0 && k >= 0);
    CHECK(ab == DTYPE_FP32 || ab == DTYPE_BF16);
    if (m == 0 || n == 0) return;
    if (k == 0) {
        matmul_scale_c(c, (size_t)m * (size_t)n, beta);
        return;
    }
    bool bf16 = ab == DTYPE_BF16;
    MatmulShape shape = {m, n, k, trans_a, trans_b,
                         cuda_bf16_compute() && !bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                      : CUBLAS_COMPUTE_32F,
                         bf16 ? CUDA_R_16BF : CUDA_R_32F, cuda_alignment(a), cuda_alignment(b), cuda_alignment(c)};
    const MatmulPlan *p = matmul_plan(&shape);
    const float alpha = 1.0f;
    // c is both C and D (in place, same layout), which cuBLASLt allows.
    CUBLAS_CHECK(cublasLtMatmul(cuda_cublaslt(), p->desc, &alpha, b, p->layout_b, a, p->layout_a,
                                &beta, c, p->layout_c, c, p->layout_c, &p->algo,
                                cuda_gemm_workspace(), CUDA_GEMM_WORKSPACE, cuda_stream()));
}
