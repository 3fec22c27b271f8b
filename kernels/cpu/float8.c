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

// A transposed cast's bytes (row o: x's column o) go FLOAT8_COLUMNS columns at a time, x read
// along its rows: a column read alone touches a cache line per element.
#define FLOAT8_COLUMNS 64

static int float8_min(int a, int b) { return a < b ? a : b; }

// Rows of the bytes in parallel, each max taken by one thread in a fixed order; the tensorwise
// max of their maxes is the same in any order, so a tensorwise cast's transpose reads x as it
// lies.
CPU_CLONES void cpu_float8_amax(float *amax, const float *x, int rows, int cols,
                                const Float8Cast *cast) {
    if (cast->transpose && cast->rowwise) {  // column maxima, a block of columns at a time
#pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < cols; o0 += FLOAT8_COLUMNS) {
            int n = float8_min(FLOAT8_COLUMNS, cols - o0);
            uint32_t column[FLOAT8_COLUMNS] = {0};
            for (int i = 0; i < rows; i++) {
                const float *xi = x + (size_t)i * cols + o0;
#pragma omp simd
                for (int j = 0; j < n; j++) {
                    uint32_t v = float8_abs_bits(xi[j]);
                    column[j] = v > column[j] ? v : column[j];
                }
            }
            for (int j = 0; j < n; j++) amax[o0 + j] = float8_bits_to_float(column[j]);
        }
        return;
    }
    uint32_t total = 0;
#pragma omp parallel for schedule(static) reduction(max : total)
    for (int o = 0; o < rows; o++) {
        const float *xo = x + (size_t)o * cols;
        uint32_t row = 0;
#pragma omp simd reduction(max : row)
        for (int i = 0; i < cols; i++) {
            uint32_t v = float8_abs_bits(xo[i]);
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

// Bytes row o's scale: the tensor's (tensor_scale) or, rowwise, its own, its inverse into
// scale_inv[o].
static float float8_row_scale(float *scale_inv, const float *amax, int o, const Float8Cast *cast,
                              float tensor_scale) {
    if (!cast->rowwise) return tensor_scale;
    float scale = float8_scale(amax[o], cast);
    scale_inv[o] = 1.0f / scale;
    return scale;
}

CPU_CLONES void cpu_float8_quantize(uint8_t *out, float *scale_inv, const float *amax,
                                    const float *x, int rows, int cols, const Float8Cast *cast) {
    Float8Kind kind = cast->kind;
    float tensor_scale = cast->rowwise ? 0.0f : float8_scale(amax[0], cast);
    if (!cast->rowwise) scale_inv[0] = 1.0f / tensor_scale;
    if (!cast->transpose) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < rows; o++) {
            float scale = float8_row_scale(scale_inv, amax, o, cast, tensor_scale);
            const float *xo = x + (size_t)o * cols;
            uint8_t *bytes = out + (size_t)o * cols;
#pragma omp simd
            for (int i = 0; i < cols; i++) bytes[i] = float8_from_float(xo[i] * scale, kind, true);
        }
        return;
    }
    // out (cols, rows): each block of columns cast along x's rows, its bytes stored across
#pragma omp parallel for schedule(static)
    for (int o0 = 0; o0 < cols; o0 += FLOAT8_COLUMNS) {
        int n = float8_min(FLOAT8_COLUMNS, cols - o0);
        float scale[FLOAT8_COLUMNS];
        for (int j = 0; j < n; j++) scale[j] = float8_row_scale(scale_inv, amax, o0 + j, cast, tensor_scale);
        for (int i = 0; i < rows; i++) {
            const float *xi = x + (size_t)i * cols + o0;
            uint8_t codes[FLOAT8_COLUMNS];
#pragma omp simd
            for (int j = 0; j < n; j++) codes[j] = float8_from_float(xi[j] * scale[j], kind, true);
            for (int j = 0; j < n; j++) out[(size_t)(o0 + j) * rows + i] = codes[j];
        }
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
// Decoding looks each byte up in its kind's 256 values (float8_to_float's, built per call).
static void float8_values(float values[256], Float8Kind kind) {
    for (int code = 0; code < 256; code++) values[code] = float8_to_float((uint8_t)code, kind);
}

CPU_CLONES static void float8_decode(float *dst, const uint8_t *src, const float *scale_inv,
                                     Float8Kind kind, int rows, int k, bool rowwise) {
    float values[256];
    float8_values(values, kind);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float s = rowwise ? scale_inv[r] : 1.0f;
        const uint8_t *codes = src + (size_t)r * k;
        float *row = dst + (size_t)r * k;
#pragma omp simd
        for (int i = 0; i < k; i++) row[i] = values[codes[i]] * s;
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
    float values[256];
    float8_values(values, FLOAT8_E4M3FN);
#pragma omp parallel for schedule(dynamic, 1)
    for (int g = 0; g < groups; g++) {
        size_t r0 = (size_t)offsets[g];
        int m = offsets[g + 1] - offsets[g];
        const uint8_t *block = src + r0 * cols;  // (cols, m)
        for (int i = 0; i < cols; i++) {
            float s = scale_inv[(size_t)g * cols + i];
            for (int r = 0; r < m; r++)
                dst[(r0 + r) * cols + i] = values[block[(size_t)i * m + r]] * s;
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
