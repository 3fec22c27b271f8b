// cuda_matmul_float8: one cuBLASLt FP8 GEMM per call (torch._scaled_mm's cuBLASLt path), its
// descriptors and algorithm planned once per shape; cuda_grouped_matmul_float8: one per group
// (torch._scaled_grouped_mm runs a CUTLASS grouped kernel instead: one launch for all groups).
//
// cuBLASLt's FP8 kernels take only the "TN" layout: its A transposed, its B not. titan's c (m,
// n) = a b^T with a (m, k) and b (n, k) both K-contiguous is, column-major (matmul.cu explains
// the mapping), C^T (n, m) = b a^T: cuBLASLt's A is titan's b, a (k, n) column-major buffer with
// ld k used transposed (CUBLAS_OP_T), and its B is titan's a, (k, m) with ld k, not transposed:
// exactly TN, which is why float8_quantize writes every operand K-contiguous. The dequantising
// scales are cuBLASLt's A and B scale pointers (so b's come first): one float each
// (tensorwise), or per row of each operand, CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
// (rowwise): element (i, j) of cuBLASLt's product times A's i-th and B's j-th scale.
// Accumulation in fp32 without the "fast accumulation" mode (torchao uses that for the forward
// GEMM only; it is cuBLASLt's CUBLASLT_MATMUL_DESC_FAST_ACCUM, not enabled here).
//
// Where cuBLASLt has no outer-vector scales (13.1 on Hopper finds no algorithm with them; torch
// runs its own CUTLASS kernel there) a rowwise GEMM runs unscaled and the scales are applied
// around it: c = beta c / (sa_i sb_j), c = a b^T + c, c *= sa_i sb_j (float8_scale_around). The
// rowwise recipe's scales are powers of two, so both products are exact and c equals the scaled
// GEMM's; other scales add a rounding per element.
#include <stdint.h>

#include "kernels/cuda/device.cuh"

#define MATMUL_FLOAT8_PLANS 256

typedef struct {
    int m, n, k;
    Float8Kind a_kind, b_kind;
    bool rowwise;
    uint32_t align_c;  // bytes (the float8 operands must be 16-byte aligned)
} Float8Shape;

typedef struct {
    Float8Shape shape;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_c;  // titan's a, b and c
    cublasLtMatmulAlgo_t algo;
    bool scale_around;  // rowwise without outer-vector scales: scaled around the GEMM
} Float8Plan;

static Float8Plan plans[MATMUL_FLOAT8_PLANS];  // ops are issued from one host thread
static long n_plans;  // made so far: the next goes to plans[n_plans % MATMUL_FLOAT8_PLANS]

static bool float8_shape_equal(const Float8Shape *x, const Float8Shape *y) {
    return x->m == y->m && x->n == y->n && x->k == y->k && x->a_kind == y->a_kind &&
           x->b_kind == y->b_kind && x->rowwise == y->rowwise && x->align_c == y->align_c;
}

static cudaDataType_t float8_type(Float8Kind kind) {
    return kind == FLOAT8_E4M3FN ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

static void float8_desc_set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                            const void *value, size_t size) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, value, size));
}

// The heuristic's best algorithm for the plan into p->algo, or its failure (cuBLASLt's A is
// titan's b, its B titan's a: both float8, 16-byte aligned).
static cublasStatus_t float8_find_algo(Float8Plan *p) {
    return cuda_gemm_algo(p->desc, p->layout_b, p->layout_a, p->layout_c, 16, 16,
                          p->shape.align_c, &p->algo);
}

// The GEMM's descriptor, its scales outer vectors (rowwise) or one float each.
static void float8_desc_create(Float8Plan *p, bool outer_vectors) {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t);
    float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n);
    if (outer_vectors) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
    }
}

static void float8_plan_init(Float8Plan *p, const Float8Shape *s) {
    p->shape = *s;
    p->scale_around = false;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->layout_a, float8_type(s->a_kind), (uint64_t)s->k,
                                            (uint64_t)s->m, (int64_t)s->k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->layout_b, float8_type(s->b_kind), (uint64_t)s->k,
                                            (uint64_t)s->n, (int64_t)s->k));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->layout_c, CUDA_R_32F, (uint64_t)s->n,
                                            (uint64_t)s->m, (int64_t)s->n));
    float8_desc_create(p, s->rowwise);
    cublasStatus_t rc = float8_find_algo(p);
    if (rc != CUBLAS_STATUS_SUCCESS && s->rowwise) {  // no outer-vector scales here
        CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
        p->scale_around = true;
        float8_desc_create(p, false);
        rc = float8_find_algo(p);
    }
    if (rc != CUBLAS_STATUS_SUCCESS)
        die_internal(__FILE__, __LINE__,
                     "cuBLASLt has no FP8 algorithm for matmul_float8 m %d n %d k %d (a %s, b %s, "
                     "%s scales, c aligned to %u bytes): %s",
                     s->m, s->n, s->k, s->a_kind == FLOAT8_E4M3FN ? "e4m3" : "e5m2",
                     s->b_kind == FLOAT8_E4M3FN ? "e4m3" : "e5m2",
                     s->rowwise ? "rowwise" : "tensorwise", s->align_c,
                     cublasLtGetStatusString(rc));
}

// c (m, n) times row_scale[i] col_scale[j], or times beta / (row_scale[i] col_scale[j]) when
// dividing (the unscaled GEMM then adds onto it).
static __global__ void float8_scale_around(float *c, const float *row_scale,
                                           const float *col_scale, int m, int n, float beta,
                                           bool dividing) {
    size_t count = (size_t)m * n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < count;
         e += (size_t)gridDim.x * blockDim.x) {
        float s = row_scale[e / n] * col_scale[e % n];
        c[e] = dividing ? c[e] * (beta / s) : c[e] * s;
    }
}

// One float 1.0 in device memory: the scale pointers of a GEMM scaled around (allocated on
// first use, for the life of the process).
static const float *float8_device_one(void) {
    static float *one;
    if (!one) {
        const float host_one = 1.0f;
        CUDA_CHECK(cudaMalloc((void **)&one, sizeof *one));
        CUDA_CHECK(cudaMemcpy(one, &host_one, sizeof host_one, cudaMemcpyHostToDevice));
    }
    return one;
}

static void float8_plan_destroy(Float8Plan *p) {
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->layout_a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->layout_b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->layout_c));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
}

// A cache of the shapes seen, the oldest making room when it is full: grouped_matmul_float8's
// groups bring new row counts every step. cuBLASLt reads the descriptors when a matmul is
// enqueued, so destroying a plan does not touch the GEMMs still queued with it.
static Float8Plan *float8_plan(const Float8Shape *s) {
    long cached = n_plans < MATMUL_FLOAT8_PLANS ? n_plans : MATMUL_FLOAT8_PLANS;
    for (long i = 0; i < cached; i++)
        if (float8_shape_equal(&plans[i].shape, s)) return &plans[i];
    Float8Plan *p = &plans[n_plans % MATMUL_FLOAT8_PLANS];
    if (n_plans >= MATMUL_FLOAT8_PLANS) float8_plan_destroy(p);
    n_plans++;
    float8_plan_init(p, s);
    return p;
}

// FP8 tensor cores came with Ada (sm_89) and Hopper (sm_90); the check runs once.
static void float8_require_device(void) {
    static int capability = -1;
    if (capability < 0) {
        int device, major, minor;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        capability = major * 10 + minor;
    }
    if (capability < 89)
        die_user("float8 GEMMs need a GPU of compute capability 8.9 or later (Ada, Hopper, "
                 "Blackwell); this one is %d.%d: turn float8 training off",
                 capability / 10, capability % 10);
}

size_t cuda_matmul_float8_workspace_bytes(int m, int n, int k) {
    (void)m, (void)n, (void)k;
    return 0;  // cuBLASLt reads the float8 bytes as they are, with the backend's GEMM workspace
}

void cuda_matmul_float8(float *c, const uint8_t *a, const float *a_scale_inv, Float8Kind a_kind,
                        const uint8_t *b, const float *b_scale_inv, Float8Kind b_kind, int m,
                        int n, int k, bool rowwise, float beta, void *workspace) {
    (void)workspace;
    CHECK(!(a_kind == FLOAT8_E5M2 && b_kind == FLOAT8_E5M2));
    CHECK(m >= 0 && n >= 0 && k >= 0);
    if (m == 0 || n == 0) return;
    if (k == 0) {  // an empty sum: c = beta c, not reading c when beta is 0 (as BLAS)
        if (beta == 0.0f)
            CUDA_CHECK(cudaMemsetAsync(c, 0, (size_t)m * n * sizeof *c, cuda_stream()));
        else if (beta != 1.0f)
            cuda_scale(c, (size_t)m * n, beta);
        return;
    }
    float8_require_device();
    if (k % 16 != 0 || n % 16 != 0 || (uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0)
        die_internal(__FILE__, __LINE__,
                     "matmul_float8 m %d n %d k %d: cuBLASLt's FP8 GEMMs need k and n multiples "
                     "of 16 and 16-byte aligned operands",
                     m, n, k);
    Float8Shape shape = {m, n, k, a_kind, b_kind, rowwise, cuda_alignment(c)};
    Float8Plan *p = float8_plan(&shape);
    // cuBLASLt's A is titan's b: b's scales are its A scales.
    const float *scale_a = b_scale_inv, *scale_b = a_scale_inv;
    float gemm_beta = beta;
    if (p->scale_around) {
        scale_a = scale_b = float8_device_one();
        if (beta != 0.0f) {
            float8_scale_around<<<cuda_grid((size_t)m * n), CUDA_THREADS, 0, cuda_stream()>>>(
                c, a_scale_inv, b_scale_inv, m, n, beta, true);
            CUDA_LAUNCH_CHECK();
            gemm_beta = 1.0f;
        }
    }
    float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof scale_a);
    float8_desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof scale_b);
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(cuda_cublaslt(), p->desc, &alpha, b, p->layout_b, a, p->layout_a,
                                &gemm_beta, c, p->layout_c, c, p->layout_c, &p->algo,
                                cuda_gemm_workspace(), CUDA_GEMM_WORKSPACE, cuda_stream()));
    if (p->scale_around) {
        float8_scale_around<<<cuda_grid((size_t)m * n), CUDA_THREADS, 0, cuda_stream()>>>(
            c, a_scale_inv, b_scale_inv, m, n, 1.0f, false);
        CUDA_LAUNCH_CHECK();
    }
}

// ---- grouped: one cuBLASLt GEMM per group ------------------------------------------------------

#define ROUND_UP(x, m) (((x) + (m)-1) / (m) * (m))

size_t cuda_grouped_matmul_float8_workspace_bytes(int rows, int groups, int n, int k,
                                                  bool weight_grad) {
    if (weight_grad)  // each group's operands with their reduced axis padded to 16
        return ((size_t)k + (size_t)n) * ((size_t)rows + 15 * (size_t)groups);
    return ((size_t)rows + 3 * (size_t)groups) * sizeof(float);  // each group's a scales, aligned
}

// c[R_g] = a[R_g] b_g^T: the group's rows of a are 16-byte aligned (k is a multiple of 16), its
// row scales are copied to a 16-byte boundary of the workspace (cuBLASLt's outer-vector scales
// are read as vectors).
static void grouped_rows(float *c, const uint8_t *a, const float *a_scale_inv, const uint8_t *b,
                         const float *b_scale_inv, const int *offsets, int groups, int n, int k,
                         float beta, float *scales) {
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g];
        int m = offsets[g + 1] - offsets[g];
        if (m == 0) continue;
        CUDA_CHECK(cudaMemcpyAsync(scales, a_scale_inv + r0, (size_t)m * sizeof(float),
                                   cudaMemcpyDeviceToDevice, cuda_stream()));
        cuda_matmul_float8(c + r0 * n, a + r0 * k, scales, FLOAT8_E4M3FN, b + (size_t)g * n * k,
                           b_scale_inv + (size_t)g * n, FLOAT8_E4M3FN, m, n, k, true, beta, NULL);
        scales += ROUND_UP(m, 4);
    }
}

// The group's block (rows, m) as a (rows, padded) one in dst, its extra columns zero (they add
// nothing to the sums).
static void grouped_pad(uint8_t *dst, const uint8_t *src, int rows, int m, int padded) {
    CUDA_CHECK(cudaMemsetAsync(dst, 0, (size_t)rows * padded, cuda_stream()));
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)padded, src, (size_t)m, (size_t)m, (size_t)rows,
                                 cudaMemcpyDeviceToDevice, cuda_stream()));
}

// c_g = a_g b_g^T over the group's tokens, which cuBLASLt's FP8 GEMMs take in multiples of 16:
// a group of another count runs on zero-padded copies (torchtitan pads each expert's tokens to
// 16 before the grouped GEMM for the same reason).
static void grouped_tokens(float *c, const uint8_t *a, const float *a_scale_inv,
                           const uint8_t *b, const float *b_scale_inv, const int *offsets,
                           int groups, int n, int k, float beta, uint8_t *pad) {
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g];
        int m = offsets[g + 1] - offsets[g], padded = ROUND_UP(m, 16);
        const uint8_t *a_g = a + r0 * k, *b_g = b + r0 * n;  // (k, m), (n, m)
        if (padded != m) {
            grouped_pad(pad, a_g, k, m, padded);
            grouped_pad(pad + (size_t)k * padded, b_g, n, m, padded);
            a_g = pad, b_g = pad + (size_t)k * padded;
            pad += ((size_t)k + n) * padded;
        }
        cuda_matmul_float8(c + (size_t)g * k * n, a_g, a_scale_inv + (size_t)g * k,
                           FLOAT8_E4M3FN, b_g, b_scale_inv + (size_t)g * n, FLOAT8_E4M3FN, k, n,
                           padded, true, beta, NULL);
    }
}

void cuda_grouped_matmul_float8(float *c, const uint8_t *a, const float *a_scale_inv,
                                const uint8_t *b, const float *b_scale_inv, const int *offsets,
                                int groups, int n, int k, bool weight_grad, float beta,
                                void *workspace) {
    CHECK(groups >= 0 && n >= 0 && k >= 0);
    if (weight_grad)
        grouped_tokens(c, a, a_scale_inv, b, b_scale_inv, offsets, groups, n, k, beta,
                       (uint8_t *)workspace);
    else
        grouped_rows(c, a, a_scale_inv, b, b_scale_inv, offsets, groups, n, k, beta,
                     (float *)workspace);
}
