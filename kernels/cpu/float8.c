// float8 training on the cpu: an exact emulation. The casts are core/float8.h's, bit for bit
// what the cuda kernels write; the GEMM decodes both operands to fp32 (exact) and runs one
// sgemm with fp32 accumulation, as the tensor cores accumulate, so only the summation order
// differs from cuBLASLt.
#include <cblas.h>

#include "kernels/cpu/cpu.h"

// The magnitude's bits: ordered as the magnitudes are, NaN above infinity, so that an integer
// max is max |x| with NaN winning, the same in any order (cuda's atomicMax does the same).
static inline uint32_t float8_abs_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits & 0x7fffffffu;
}

// amax index of element (r, c): the row of the bytes it is cast into, or 0 for tensorwise.
static inline size_t float8_scale_index(const Float8Cast *cast, int r, int c) {
    return !cast->rowwise ? 0 : cast->transpose ? (size_t)c : (size_t)r;
}

static inline size_t float8_scale_count(const Float8Cast *cast, int rows, int cols) {
    return !cast->rowwise ? 1 : cast->transpose ? (size_t)cols : (size_t)rows;
}

// Rows one after another so that each amax has one owner and no reduction across threads.
void cpu_float8_amax(float *amax, const float *x, int rows, int cols, const Float8Cast *cast) {
    size_t count = float8_scale_count(cast, rows, cols);
    uint32_t *bits = (uint32_t *)amax;  // written as bits, read back as the float they are
    for (size_t i = 0; i < count; i++) bits[i] = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint32_t v = float8_abs_bits(x[(size_t)r * cols + c]);
            size_t i = float8_scale_index(cast, r, c);
            if (v > bits[i]) bits[i] = v;
        }
}

static float float8_scale(float amax, const Float8Cast *cast) {
    float scale = float8_scale_from_amax(amax, cast->kind);
    return cast->pow2_scales ? float8_round_scale_pow2(scale) : scale;
}

// Scales first (one per amax, so a row of the bytes shares it), then the cast of each element.
void cpu_float8_quantize(uint8_t *out, float *scale_inv, const float *amax, const float *x,
                         int rows, int cols, const Float8Cast *cast) {
    size_t count = float8_scale_count(cast, rows, cols);
    for (size_t i = 0; i < count; i++) scale_inv[i] = 1.0f / float8_scale(amax[i], cast);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float scale = float8_scale(amax[float8_scale_index(cast, r, c)], cast);
            size_t at = cast->transpose ? (size_t)c * rows + r : (size_t)r * cols + c;
            out[at] = float8_from_float(x[(size_t)r * cols + c] * scale, cast->kind, true);
        }
}

size_t cpu_matmul_float8_workspace_bytes(int m, int n, int k) {
    return ((size_t)m + (size_t)n) * (size_t)k * sizeof(float);
}

// dst (rows, k) = the decoded bytes, times row r's scale_inv when rowwise. The rowwise recipe's
// scales are powers of two, so that product is exact and the sgemm's result is the scaled
// accumulation itself; tensorwise scales go into sgemm's alpha instead.
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
    float *a32 = workspace;                 // (m, k)
    float *b32 = a32 + (size_t)m * k;       // (n, k)
    float8_decode(a32, a, a_scale_inv, a_kind, m, k, rowwise);
    float8_decode(b32, b, b_scale_inv, b_kind, n, k, rowwise);
    float alpha = rowwise ? 1.0f : a_scale_inv[0] * b_scale_inv[0];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, a32, k > 0 ? k : 1, b32,
                k > 0 ? k : 1, beta, c, n);
}
