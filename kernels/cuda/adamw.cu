// AdamW over the one flat buffer of every parameter: a single launch is the multi-tensor fused
// update. The operation order is the cpu twin's, that of torch.optim.AdamW (decay first, m by
// lerp, bias corrections folded into a step size and a denominator), so results track it to
// rounding; the bias corrections are computed once on the host in double, as the cpu does.
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/device.cuh"

typedef struct {
    float beta1, beta2, eps;
    float decay;      // 1 - lr wd
    float step_size;  // lr / (1 - beta1^step)
    float bc2_sqrt;   // sqrt(1 - beta2^step)
} AdamwCoeffs;

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

__device__ __forceinline__ void adamw_update_one(float *p, float g, float *m, float *v,
                                                 AdamwCoeffs c) {
    *m += (1.0f - c.beta1) * (g - *m);
    *v = *v * c.beta2 + (1.0f - c.beta2) * g * g;
    *p = *p * c.decay - c.step_size * *m / (sqrtf(*v) / c.bc2_sqrt + c.eps);
}

// float4 groups [0, n4), then the elements from 4 * n4 on.
static __global__ void adamw_update_elements(float *param, const float *grad, float *m,
                                             float *v, size_t n, size_t n4, AdamwCoeffs c) {
    size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = first; i < n4; i += stride) {
        float4 p = ((float4 *)param)[i], g = ((const float4 *)grad)[i];
        float4 mi = ((float4 *)m)[i], vi = ((float4 *)v)[i];
        adamw_update_one(&p.x, g.x, &mi.x, &vi.x, c);
        adamw_update_one(&p.y, g.y, &mi.y, &vi.y, c);
        adamw_update_one(&p.z, g.z, &mi.z, &vi.z, c);
        adamw_update_one(&p.w, g.w, &mi.w, &vi.w, c);
        ((float4 *)param)[i] = p;
        ((float4 *)m)[i] = mi;
        ((float4 *)v)[i] = vi;
    }
    for (size_t i = 4 * n4 + first; i < n; i += stride)
        adamw_update_one(&param[i], grad[i], &m[i], &v[i], c);
}

void cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int step) {
    AdamwCoeffs c = {beta1,
                     beta2,
                     eps,
                     (float)(1.0 - (double)lr * weight_decay),
                     (float)(lr / (1.0 - pow(beta1, step))),
                     (float)sqrt(1.0 - pow(beta2, step))};
    bool vec = aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
    size_t n4 = vec ? n / 4 : 0;
    adamw_update_elements<<<cuda_grid(n4 ? n4 + n % 4 : n), CUDA_THREADS, 0, cuda_stream()>>>(
        param, grad, m, v, n, n4, c);
    CUDA_LAUNCH_CHECK();
}

static __global__ void ema_update_elements(float *ema, const float *param, size_t n,
                                           float weight) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        ema[i] += weight * (param[i] - ema[i]);
}

void cuda_ema_update(float *ema, const float *param, size_t n, float weight) {
    ema_update_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(ema, param, n, weight);
    CUDA_LAUNCH_CHECK();
}

static __global__ void outer_sgd_elements(float *outer, float *momentum, float *param,
                                          const float *delta, size_t n, float lr, float mu,
                                          bool nesterov, float alpha) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float m = momentum[i] * mu + delta[i];
        momentum[i] = m;
        float o = outer[i] - lr * (nesterov ? delta[i] + mu * m : m);
        outer[i] = o;
        param[i] = o + alpha * (param[i] - o);
    }
}

void cuda_outer_sgd_update(float *outer, float *momentum, float *param, const float *delta,
                           size_t n, float lr, float mu, bool nesterov, float alpha) {
    outer_sgd_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(
        outer, momentum, param, delta, n, lr, mu, nesterov, alpha);
    CUDA_LAUNCH_CHECK();
}
