// float8 training on the cpu: an exact emulation. The casts are core/float8.h's, bit for bit
// what the cuda kernels write; the GEMM decodes both operands to fp32 (exact) and runs one
// sgemm with fp32 accumulation, as the tensor cores accumulate, so only the summation order
// differs from cuBLASLt.

#include "kernels/cpu/cpu.h"

// The magnitude's bits: ordered as the magnitudes are, NaN above infinity, so that an integer
// max is max |x| with NaN winning, the same in any order (cuda's atomicMax does the same).
static inline uint32_t float8_abs_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits & 0x7fffffffu;
}

// Element i of row o of the bytes as cast writes them: x[o][i], or x[i][o] when transposed.
static inline float float8_element(const float *x, int cols, const Float8Cast *cast, int o,
                                   int i) {
    return cast->transpose ? x[(size_t)i * cols + o] : x[(size_t)o * cols + i];
}

// Rows of the bytes in parallel, each max taken by one thread in a fixed order; the tensorwise
// max of their maxes is the same in any order.
void cpu_float8_amax(float *amax, const float *x, int rows, int cols, const Float8Cast *cast) {
    int out_rows = cast->transpose ? cols : rows, out_cols = cast->transpose ? rows : cols;
    uint32_t total = 0;
#pragma omp parallel for schedule(static) reduction(max : total)
    for (int o = 0; o < out_rows; o++) {
        uint32_t row = 0;
        for (int i = 0; i < out_cols; i++) {
            uint32_t v = float8_abs_bits(float8_element(x, cols, cast, o, i));
            row = v > row ? v : row;
        }
        if (cast->rowwise) amax[o] = float8_bits_to_float(row);
        total = row > total ? row : total;
    }
    if (!cast->rowwise) amax[0] = float8_bits_to_float(total);
}

static float float8_scale(float amax, const Float8Cast *cast) {
    float scale = float8_scale_from_amax(amax, cast->kind);
    return cast->pow2_scales ? float8_round_scale_pow2(scale) : scale;
}

void cpu_float8_quantize(uint8_t *out, float *scale_inv, const float *amax, const float *x,
                         int rows, int cols, const Float8Cast *cast) {
    int out_rows = cast->transpose ? cols : rows, out_cols = cast->transpose ? rows : cols;
    if (!cast->rowwise) scale_inv[0] = 1.0f / float8_scale(amax[0], cast);
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out_rows; o++) {
        float scale = float8_scale(amax[cast->rowwise ? o : 0], cast);
        if (cast->rowwise) scale_inv[o] = 1.0f / scale;
        for (int i = 0; i < out_cols; i++)
            out[(size_t)o * out_cols + i] =
                float8_from_float(float8_element(x, cols, cast, o, i) * scale, cast->kind, true);
    }
}

void cpu_float8_transpose(uint8_t *out, const uint8_t *in, int rows, int cols) {
    CHECK(rows >= 0 && cols >= 0);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) out[(size_t)c * rows + r] = in[(size_t)r * cols + c];
}

size_t cpu_matmul_float8_workspace_bytes(int m, int n, int k) {
    return ((size_t)m + (size_t)n) * (size_t)k * sizeof(float);
}

// dst (rows, k) = the decoded bytes, times row r's scale_inv when rowwise. The rowwise recipe's
// scales are powers of two, so that product is exact and the sgemm's result is the scaled
// accumulation itself (other rowwise scales add one rounding per element, where cuBLASLt
// scales the sums); tensorwise scales go into sgemm's alpha instead, as cuBLASLt's do.
static void float8_decode(float *dst, const uint8_t *src, const float *scale_inv, Float8Kind kind,
                          int rows, int k, bool rowwise) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float s = rowwise ? scale_inv[r] : 1.0f;
        for (int i = 0; i < k; i++) {
            size_t at = (size_t)r * k + i;
            dst[at] = float8_to_float(src[at], kind) * s;
        }
    }
}

void cpu_matmul_float8(float *c, const uint8_t *a, const float *a_scale_inv, Float8Kind a_kind,
                       const uint8_t *b, const float *b_scale_inv, Float8Kind b_kind, int m, int n,
                       int k, bool rowwise, float beta, void *workspace) {
    CHECK(!(a_kind == FLOAT8_E5M2 && b_kind == FLOAT8_E5M2));
    CHECK(m >= 0 && n >= 0 && k >= 0);
    if (m == 0 || n == 0) return;
    float *a32 = workspace;            // (m, k)
    float *b32 = a32 + (size_t)m * k;  // (n, k)
    float8_decode(a32, a, a_scale_inv, a_kind, m, k, rowwise);
    float8_decode(b32, b, b_scale_inv, b_kind, n, k, rowwise);
    float alpha = rowwise ? 1.0f : a_scale_inv[0] * b_scale_inv[0];
    cpu_sgemm(false, true, m, n, k, alpha, a32, k, b32, k, beta, c, n);
}

size_t cpu_grouped_matmul_float8_workspace_bytes(int rows, int groups, int n, int k,
                                                 bool weight_grad) {
    size_t b_rows = weight_grad ? (size_t)rows : (size_t)groups * n;
    return ((size_t)rows * k + b_rows * (weight_grad ? n : k)) * sizeof(float);
}

// dst (rows, cols) token-major from the groups' blocks (cols, |R_g|) at byte cols offsets[g] of
// src, row i of block g times scale_inv[g cols + i]: the weight gradient's operands decoded
// back to the layout grouped_matmul's transposed form reads. Powers of two: exact.
static void float8_decode_groups(float *dst, const uint8_t *src, const float *scale_inv,
                                 const int *offsets, int groups, int cols) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g];
        int m = offsets[g + 1] - offsets[g];
        const uint8_t *block = src + r0 * cols;  // (cols, m)
        for (int i = 0; i < cols; i++) {
            float s = scale_inv[(size_t)g * cols + i];
            for (int r = 0; r < m; r++)
                dst[(r0 + r) * cols + i] =
                    float8_to_float(block[(size_t)i * m + r], FLOAT8_E4M3FN) * s;
        }
    }
}

// Decodes both operands (exact, as matmul_float8's) and runs the fp32 grouped GEMM of the same
// groups: the forward form's is grouped_matmul's c = a b_g^T, the weight gradient's its
// transposed form c_g = a[R_g]^T b[R_g] on the token-major decodings.
void cpu_grouped_matmul_float8(float *c, const uint8_t *a, const float *a_scale_inv,
                               const uint8_t *b, const float *b_scale_inv, const int *offsets,
                               int groups, int n, int k, bool weight_grad, float beta,
                               void *workspace) {
    CHECK(groups >= 0 && n >= 0 && k >= 0);
    int rows = offsets[groups];
    float *a32 = workspace;            // (rows, k)
    float *b32 = a32 + (size_t)rows * k;  // (groups, n, k), or (rows, n) for the weight gradient
    if (weight_grad) {
        float8_decode_groups(a32, a, a_scale_inv, offsets, groups, k);
        float8_decode_groups(b32, b, b_scale_inv, offsets, groups, n);
    } else {
        float8_decode(a32, a, a_scale_inv, FLOAT8_E4M3FN, rows, k, true);
        float8_decode(b32, b, b_scale_inv, FLOAT8_E4M3FN, groups * n, k, true);
    }
    cpu_grouped_matmul_fp32(c, a32, b32, offsets, groups, n, k, weight_grad, !weight_grad, beta);
}
