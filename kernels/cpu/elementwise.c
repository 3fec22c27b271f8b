#include <string.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/dropout.h"

#define SUM_CHUNKS 256

static inline float sigmoid(float x) { return 1.0f / (1.0f + cpu_expf(-x)); }

static inline float swiglu(float gate, float up) { return gate * sigmoid(gate) * up; }

// SwiGLU and the casts are built per instruction set in the portable build (CPU_CLONES): its
// baseline x86-64 loops ran four floats at a time (the debug model's bf16 step, AMD EPYC: the
// casts 20.5 ms, SwiGLU 32.3, against 5-10 and 9-11 cloned), and their results are the same
// bits at any vector width.
CPU_CLONES void cpu_swiglu_forward(void *out, Dtype out_type, const float *gate, const float *up,
                                   size_t n) {
    if (out_type == DTYPE_BF16) {
        uint16_t *o = out;
#pragma omp parallel for simd
        for (size_t i = 0; i < n; i++) o[i] = bf16_from_float(swiglu(gate[i], up[i]));
        return;
    }
    CHECK(out_type == DTYPE_FP32);
    float *o = out;
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) o[i] = swiglu(gate[i], up[i]);
}

// d silu(g)/dg = sig(g) (1 + g (1 - sig(g))).
static inline float swiglu_dgate(float d, float g, float u) {
    float sg = sigmoid(g);
    return d * u * sg * (1.0f + g * (1.0f - sg));
}

static inline float swiglu_dup(float d, float g) { return d * g * sigmoid(g); }

// Element i of swiglu_backward's outputs. BF16 and OUT are constants where it is inlined: each
// of cpu_swiglu_backward's loops is one case, with no test inside its vector loop.
static inline __attribute__((always_inline)) void swiglu_backward_at(
    size_t i, void *dgate, void *dup, void *out, const float *dout, const float *gate,
    const float *up, const bool BF16, const bool OUT) {
    float dg = swiglu_dgate(dout[i], gate[i], up[i]), du = swiglu_dup(dout[i], gate[i]);
    float o = OUT ? swiglu(gate[i], up[i]) : 0.0f;
    if (BF16) {
        ((uint16_t *)dgate)[i] = bf16_from_float(dg);
        ((uint16_t *)dup)[i] = bf16_from_float(du);
        if (OUT) ((uint16_t *)out)[i] = bf16_from_float(o);
    } else {
        ((float *)dgate)[i] = dg, ((float *)dup)[i] = du;
        if (OUT) ((float *)out)[i] = o;
    }
}

CPU_CLONES void cpu_swiglu_backward(void *dgate, void *dup, void *out, Dtype out_type,
                                    const float *dout, const float *gate, const float *up,
                                    size_t n) {
    CHECK(out_type == DTYPE_FP32 || out_type == DTYPE_BF16);
    bool bf16 = out_type == DTYPE_BF16;
    if (bf16 && out) {
#pragma omp parallel for simd
        for (size_t i = 0; i < n; i++) swiglu_backward_at(i, dgate, dup, out, dout, gate, up, 1, 1);
    } else if (bf16) {
#pragma omp parallel for simd
        for (size_t i = 0; i < n; i++) swiglu_backward_at(i, dgate, dup, out, dout, gate, up, 1, 0);
    } else if (out) {
#pragma omp parallel for simd
        for (size_t i = 0; i < n; i++) swiglu_backward_at(i, dgate, dup, out, dout, gate, up, 0, 1);
    } else {
#pragma omp parallel for simd
        for (size_t i = 0; i < n; i++) swiglu_backward_at(i, dgate, dup, out, dout, gate, up, 0, 0);
    }
}

// GELU's tanh form: 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), so
// gelu(x) = x sig(2u) and gelu'(x) = sig(2u) + 2 x sig(2u) (1 - sig(2u)) u'(x), free of tanh's
// cancellation near 0 and of inf - inf in the tails.
#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_KAPPA 0.044715f

static inline float gelu_tanh_sig(float x) {
    return sigmoid(2.0f * GELU_SQRT_2_OVER_PI * (x + GELU_KAPPA * x * x * x));
}

void cpu_gelu_tanh_forward(float *out, const float *x, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) out[i] = x[i] * gelu_tanh_sig(x[i]);
}

void cpu_gelu_tanh_backward(float *dx, const float *dout, const float *x, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i], s = gelu_tanh_sig(v);
        float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_KAPPA * v * v);
        dx[i] += dout[i] * (s + 2.0f * v * s * (1.0f - s) * du);
    }
}

void cpu_silu_forward(float *out, const float *x, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) out[i] = x[i] * sigmoid(x[i]);
}

// silu'(x) = sig(x) (1 + x (1 - sig(x))), as swiglu's gate.
void cpu_silu_backward(float *dx, const float *dout, const float *x, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float s = sigmoid(x[i]);
        dx[i] += dout[i] * s * (1.0f + x[i] * (1.0f - s));
    }
}

// Eight running maxima in a fixed-size array: GCC keeps them in two vector registers, where an
// `omp simd reduction(max)` spills its accumulator to the stack on every iteration.
float cpu_max_floats(const float *x, int n) {
    float lanes[8];
    for (int l = 0; l < 8; l++) lanes[l] = x[0];
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) lanes[l] = x[j + l] > lanes[l] ? x[j + l] : lanes[l];
    float mx = x[0];
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    for (int l = 0; l < 8; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    return mx;
}

void cpu_add(float *y, const float *x, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void cpu_scale(float *x, size_t n, float s) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void cpu_dropout(void *out, const void *x, Dtype dtype, size_t n, float p, uint64_t seed) {
    uint32_t threshold = dropout_threshold(p);
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        bool keep = dropout_keeps(seed, i, threshold);
        if (dtype == DTYPE_FP32) {
            ((float *)out)[i] = keep ? ((const float *)x)[i] * scale : 0.0f;
        } else {
            float v = bf16_to_float(((const uint16_t *)x)[i]);
            ((uint16_t *)out)[i] = bf16_from_float(keep ? v * scale : 0.0f);
        }
    }
}

void cpu_zero_masked_rows(float *x, const int *keep, int n, size_t width) {
#pragma omp parallel for
    for (int i = 0; i < n; i++)
        if (!keep[i]) memset(x + (size_t)i * width, 0, width * sizeof(float));
}

// x^2 (squares) or x summed over SUM_CHUNKS fixed chunks whatever the thread count, the
// partial sums added in chunk order: the result depends only on n, never on scheduling.
static double sum_chunked(const float *x, size_t n, bool squares) {
    double partial[SUM_CHUNKS];
    size_t chunk = (n + SUM_CHUNKS - 1) / SUM_CHUNKS;
#pragma omp parallel for
    for (int c = 0; c < SUM_CHUNKS; c++) {
        size_t i0 = c * chunk < n ? c * chunk : n, i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        if (squares) {
#pragma omp simd reduction(+ : s)
            for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        } else {
#pragma omp simd reduction(+ : s)
            for (size_t i = i0; i < i1; i++) s += x[i];
        }
        partial[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < SUM_CHUNKS; c++) total += partial[c];
    return total;
}

double cpu_sum_squares(const float *x, size_t n) { return sum_chunked(x, n, true); }

double cpu_sum(const float *x, size_t n) { return sum_chunked(x, n, false); }

CPU_CLONES void cpu_to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) dst[i] = bf16_from_float(src[i]);
}

CPU_CLONES void cpu_from_bf16(float *dst, const uint16_t *src, size_t n) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}
