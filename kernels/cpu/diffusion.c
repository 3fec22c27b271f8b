// The rectified-flow model's input and loss pieces: the timestep embedding and the squared
// error of the predicted velocity.
#include <math.h>

#include "kernels/cpu/cpu.h"

// fp32 roundings in torch's order (see kernels/ops.def): FLUX's parity with torchtitan at 1e-5
// rests on a_i, up to time_factor radians, being the same float.
void cpu_timestep_embedding(float *out, const float *t, int B, int dim, float max_period,
                            float time_factor) {
    int h = dim / 2;
    float neg_log = (float)-log((double)max_period);
#pragma omp parallel for
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * dim, tb = time_factor * t[b];
        for (int i = 0; i < h; i++) {
            float f = (float)exp((double)(neg_log * (float)i / (float)h)), a = tb * f;
            o[i] = (float)cos((double)a);
            o[h + i] = (float)sin((double)a);
        }
        if (dim % 2) o[dim - 1] = 0.0f;
    }
}

void cpu_squared_error_forward(float *sq, const float *pred, const float *target, int n,
                               int dim) {
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *p = pred + (size_t)i * dim, *q = target + (size_t)i * dim;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < dim; j++) s += (p[j] - q[j]) * (p[j] - q[j]);
        sq[i] = s;
    }
}

void cpu_squared_error_backward(float *dpred, const float *pred, const float *target,
                                size_t count, float scale) {
#pragma omp parallel for simd
    for (size_t i = 0; i < count; i++) dpred[i] += scale * 2.0f * (pred[i] - target[i]);
}
