// Elementwise ops: SwiGLU, GELU-tanh, SiLU, add, scale and the bf16 conversions. Each kernel is
// one grid-stride loop over the float4 groups [0, n4) (n4 = n / 4 when every pointer allows the
// vector access, else 0) and one over the elements from 4 * n4 on: an odd n or a misaligned
// slice of a flat buffer takes the scalar loop.
#include <stdint.h>

#include "kernels/cuda/device.cuh"
#include "kernels/dropout.h"

static bool aligned(const void *p, uintptr_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

// Blocks for n4 vector groups and the scalar elements past them.
static unsigned elementwise_grid(size_t n, size_t n4) { return cuda_grid(n4 ? n4 + n % 4 : n); }

__device__ __forceinline__ size_t thread_first(void) {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ size_t thread_stride(void) { return (size_t)gridDim.x * blockDim.x; }

// Same expression as the cpu twin: silu(g) u = g sig(g) u.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }

// d silu(g)/dg = sig(g) (1 + g (1 - sig(g))): the gradients of gate and up.
__device__ __forceinline__ void swiglu_grad(float *dg, float *du, float d, float g, float u) {
    float sg = sigmoid(g);
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

// The activations, as the cpu twin writes them: value(x) and grad(x) = d value / dx.
// GELU's tanh form through 0.5 (1 + tanh(u)) = sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
struct GeluTanh {
    static __device__ __forceinline__ float sig2u(float x) {
        return sigmoid(2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x));
    }
    static __device__ __forceinline__ float value(float x) { return x * sig2u(x); }
    static __device__ __forceinline__ float grad(float x) {
        float s = sig2u(x), du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
        return s + 2.0f * x * s * (1.0f - s) * du;
    }
};

struct Silu {
    static __device__ __forceinline__ float value(float x) { return x * sigmoid(x); }
    static __device__ __forceinline__ float grad(float x) {
        float s = sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    }
};

template <class Act>
static __global__ void activation_forward_elements(float *out, const float *x, size_t n,
                                                   size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 v = ((const float4 *)x)[i];
        ((float4 *)out)[i] =
            make_float4(Act::value(v.x), Act::value(v.y), Act::value(v.z), Act::value(v.w));
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride()) out[i] = Act::value(x[i]);
}

template <class Act>
static __global__ void activation_backward_elements(float *dx, const float *dout, const float *x,
                                                    size_t n, size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 d = ((const float4 *)dout)[i], v = ((const float4 *)x)[i], g = ((float4 *)dx)[i];
        g.x += d.x * Act::grad(v.x);
        g.y += d.y * Act::grad(v.y);
        g.z += d.z * Act::grad(v.z);
        g.w += d.w * Act::grad(v.w);
        ((float4 *)dx)[i] = g;
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride())
        dx[i] += dout[i] * Act::grad(x[i]);
}

// n4: the float4 groups of an fp32 out (0 for bf16, stored one element at a time).
static __global__ void swiglu_forward_elements(void *out, Dtype out_type, const float *gate,
                                               const float *up, size_t n, size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 g = ((const float4 *)gate)[i], u = ((const float4 *)up)[i];
        ((float4 *)out)[i] = make_float4(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y),
                                         swiglu_value(g.z, u.z), swiglu_value(g.w, u.w));
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride())
        store_as(out, out_type, i, swiglu_value(gate[i], up[i]));
}

// n4: the float4 groups of fp32 outputs (0 for bf16, stored one element at a time). out:
// swiglu_forward's too, where not NULL.
static __global__ void swiglu_backward_elements(void *dgate, void *dup, void *out,
                                                Dtype out_type, const float *dout,
                                                const float *gate, const float *up, size_t n,
                                                size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 d = ((const float4 *)dout)[i], g = ((const float4 *)gate)[i];
        float4 u = ((const float4 *)up)[i];
        float4 dg, du;
        swiglu_grad(&dg.x, &du.x, d.x, g.x, u.x);
        swiglu_grad(&dg.y, &du.y, d.y, g.y, u.y);
        swiglu_grad(&dg.z, &du.z, d.z, g.z, u.z);
        swiglu_grad(&dg.w, &du.w, d.w, g.w, u.w);
        ((float4 *)dgate)[i] = dg;
        ((float4 *)dup)[i] = du;
        if (out)
            ((float4 *)out)[i] = make_float4(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y),
                                             swiglu_value(g.z, u.z), swiglu_value(g.w, u.w));
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride()) {
        float dg, du;
        swiglu_grad(&dg, &du, dout[i], gate[i], up[i]);
        store_as(dgate, out_type, i, dg);
        store_as(dup, out_type, i, du);
        if (out) store_as(out, out_type, i, swiglu_value(gate[i], up[i]));
    }
}

static __global__ void add_elements(float *y, const float *x, size_t n, size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 a = ((float4 *)y)[i], b = ((const float4 *)x)[i];
        ((float4 *)y)[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride()) y[i] += x[i];
}

static __global__ void scale_elements(float *x, size_t n, size_t n4, float s) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 a = ((float4 *)x)[i];
        ((float4 *)x)[i] = make_float4(a.x * s, a.y * s, a.z * s, a.w * s);
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride()) x[i] *= s;
}

static __global__ void to_bf16_elements(uint16_t *dst, const float *src, size_t n, size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        float4 a = ((const float4 *)src)[i];
        ((uint2 *)dst)[i] = make_uint2(bf16_pair(a.x, a.y), bf16_pair(a.z, a.w));
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride())
        dst[i] = (uint16_t)bf16_bits(src[i]);
}

static __global__ void from_bf16_elements(float *dst, const uint16_t *src, size_t n, size_t n4) {
    for (size_t i = thread_first(); i < n4; i += thread_stride()) {
        uint2 w = ((const uint2 *)src)[i];
        ((float4 *)dst)[i] = make_float4(__uint_as_float(w.x << 16),
                                         __uint_as_float(w.x & 0xffff0000u),
                                         __uint_as_float(w.y << 16),
                                         __uint_as_float(w.y & 0xffff0000u));
    }
    for (size_t i = 4 * n4 + thread_first(); i < n; i += thread_stride())
        dst[i] = __uint_as_float((uint32_t)src[i] << 16);
}

void cuda_swiglu_forward(void *out, Dtype out_type, const float *gate, const float *up,
                         size_t n) {
    CHECK(out_type == DTYPE_FP32 || out_type == DTYPE_BF16);
    bool vec = out_type == DTYPE_FP32 && aligned(out, 16) && aligned(gate, 16) && aligned(up, 16);
    size_t n4 = vec ? n / 4 : 0;
    swiglu_forward_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(
        out, out_type, gate, up, n, n4);
    CUDA_LAUNCH_CHECK();
}

void cuda_swiglu_backward(void *dgate, void *dup, void *out, Dtype out_type,
                          const float *dout, const float *gate, const float *up, size_t n) {
    CHECK(out_type == DTYPE_FP32 || out_type == DTYPE_BF16);
    bool vec = out_type == DTYPE_FP32 && aligned(dgate, 16) && aligned(dup, 16) &&
               aligned(dout, 16) && aligned(gate, 16) && aligned(up, 16) &&
               (!out || aligned(out, 16));
    size_t n4 = vec ? n / 4 : 0;
    swiglu_backward_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(
        dgate, dup, out, out_type, dout, gate, up, n, n4);
    CUDA_LAUNCH_CHECK();
}

template <class Act> static void activation_forward(float *out, const float *x, size_t n) {
    size_t n4 = aligned(out, 16) && aligned(x, 16) ? n / 4 : 0;
    activation_forward_elements<Act>
        <<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(out, x, n, n4);
    CUDA_LAUNCH_CHECK();
}

template <class Act>
static void activation_backward(float *dx, const float *dout, const float *x, size_t n) {
    size_t n4 = aligned(dx, 16) && aligned(dout, 16) && aligned(x, 16) ? n / 4 : 0;
    activation_backward_elements<Act>
        <<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(dx, dout, x, n, n4);
    CUDA_LAUNCH_CHECK();
}

void cuda_gelu_tanh_forward(float *out, const float *x, size_t n) {
    activation_forward<GeluTanh>(out, x, n);
}

void cuda_gelu_tanh_backward(float *dx, const float *dout, const float *x, size_t n) {
    activation_backward<GeluTanh>(dx, dout, x, n);
}

void cuda_silu_forward(float *out, const float *x, size_t n) {
    activation_forward<Silu>(out, x, n);
}

void cuda_silu_backward(float *dx, const float *dout, const float *x, size_t n) {
    activation_backward<Silu>(dx, dout, x, n);
}

void cuda_add(float *y, const float *x, size_t n) {
    size_t n4 = aligned(y, 16) && aligned(x, 16) ? n / 4 : 0;
    add_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(y, x, n, n4);
    CUDA_LAUNCH_CHECK();
}

void cuda_scale(float *x, size_t n, float s) {
    size_t n4 = aligned(x, 16) ? n / 4 : 0;
    scale_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(x, n, n4, s);
    CUDA_LAUNCH_CHECK();
}

static __global__ void dropout_elements(void *out, const void *x, bool bf16, size_t n,
                                        uint32_t threshold, float scale, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        bool keep = dropout_keeps(seed, i, threshold);
        if (!bf16) {
            ((float *)out)[i] = keep ? ((const float *)x)[i] * scale : 0.0f;
        } else {
            float v = __uint_as_float((uint32_t)((const uint16_t *)x)[i] << 16);
            ((uint16_t *)out)[i] = (uint16_t)bf16_bits(keep ? v * scale : 0.0f);
        }
    }
}

void cuda_dropout(void *out, const void *x, Dtype dtype, size_t n, float p, uint64_t seed) {
    if (n == 0) return;
    dropout_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(
        out, x, dtype == DTYPE_BF16, n, dropout_threshold(p), 1.0f / (1.0f - p), seed);
    CUDA_LAUNCH_CHECK();
}

// One block per row of x; the rows to keep are left as they are.
static __global__ void zero_masked_rows_kernel(float *x, const int *keep, size_t width) {
    if (keep[blockIdx.x]) return;
    float *row = x + (size_t)blockIdx.x * width;
    for (size_t j = threadIdx.x; j < width; j += blockDim.x) row[j] = 0.0f;
}

// n == 0 returns before any launch: an empty grid is a launch error.
void cuda_zero_masked_rows(float *x, const int *keep, int n, size_t width) {
    if (n == 0) return;
    zero_masked_rows_kernel<<<n, CUDA_THREADS, 0, cuda_stream()>>>(x, keep, width);
    CUDA_LAUNCH_CHECK();
}

void cuda_to_bf16(uint16_t *dst, const float *src, size_t n) {
    size_t n4 = aligned(dst, 8) && aligned(src, 16) ? n / 4 : 0;
    to_bf16_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, n,
                                                                                  n4);
    CUDA_LAUNCH_CHECK();
}

void cuda_from_bf16(float *dst, const uint16_t *src, size_t n) {
    size_t n4 = aligned(dst, 16) && aligned(src, 8) ? n / 4 : 0;
    from_bf16_elements<<<elementwise_grid(n, n4), CUDA_THREADS, 0, cuda_stream()>>>(dst, src, n,
                                                                                    n4);
    CUDA_LAUNCH_CHECK();
}
