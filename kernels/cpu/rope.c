#include "kernels/cpu/cpu.h"

// Each pair (x0, x1) is the complex number x0 + i x1 multiplied by e^(i pos theta_k)
// (RoFormer, Su et al. 2021), as torchtitan's apply_rotary_emb.
void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin,
                      const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    int half = head_dim / 2, width = n_heads * head_dim;
#pragma omp parallel for
    for (int r = 0; r < n_rows; r++) {
        const float *c = cos + (size_t)pos[r % T] * half, *s = sin + (size_t)pos[r % T] * half;
        for (int h = 0; h < n_heads; h++) {
            const float *xh = x + (size_t)r * width + h * head_dim;
            float *oh = out + (size_t)r * width + h * head_dim;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x0 = xh[2 * i], x1 = xh[2 * i + 1];
                oh[2 * i] = x0 * c[i] - x1 * s[i];
                oh[2 * i + 1] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

// The rotation is orthogonal, so its transpose is the rotation by -theta.
void cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin,
                       const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    int half = head_dim / 2, width = n_heads * head_dim;
#pragma omp parallel for
    for (int r = 0; r < n_rows; r++) {
        const float *c = cos + (size_t)pos[r % T] * half, *s = sin + (size_t)pos[r % T] * half;
        for (int h = 0; h < n_heads; h++) {
            const float *gh = dout + (size_t)r * width + h * head_dim;
            float *dh = dx + (size_t)r * width + h * head_dim;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float g0 = gh[2 * i], g1 = gh[2 * i + 1];
                dh[2 * i] += g0 * c[i] + g1 * s[i];
                dh[2 * i + 1] += g1 * c[i] - g0 * s[i];
            }
        }
    }
}
