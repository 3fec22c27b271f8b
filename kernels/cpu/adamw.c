#include <math.h>

#include "kernels/cpu/cpu.h"

// The operation order of torch.optim.AdamW (single-tensor path), so results track PyTorch's
// to rounding: decay first, m by lerp, bias corrections folded into a step size and a
// denominator.
void cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int step) {
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float step_size = (float)(lr / (1.0 - pow(beta1, step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        m[i] += (1.0f - beta1) * (g - m[i]);
        v[i] = v[i] * beta2 + (1.0f - beta2) * g * g;
        param[i] = param[i] * decay - step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
    }
}

void cpu_ema_update(float *ema, const float *param, size_t n, float weight) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) ema[i] += weight * (param[i] - ema[i]);
}

void cpu_outer_sgd_update(float *outer, float *momentum, float *param, const float *delta,
                          size_t n, float lr, float mu, bool nesterov, float alpha) {
#pragma omp parallel for simd
    for (size_t i = 0; i < n; i++) {
        float m = momentum[i] * mu + delta[i];
        momentum[i] = m;
        outer[i] -= lr * (nesterov ? delta[i] + mu * m : m);
        param[i] = outer[i] + alpha * (param[i] - outer[i]);
    }
}
