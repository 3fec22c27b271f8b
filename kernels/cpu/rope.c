#include "kernels/cpu/cpu.h"

// Each pair (x0, x1) is the complex number x0 + i x1 multiplied by e^(i pos theta_k)
// (RoFormer, Su et al. 2021), as torchtitan's apply_rotary_emb. The rotation is orthogonal, so
// backward is the same loop rotating by -theta (sin_sign = -1). Each pair is read before it is
// written: in place is safe.
static void rope_rotate(float *out, const float *x, const float *cos, const float *sin,
                        const int *pos, int n_rows, int T, int n_heads, int head_dim,
                        float sin_sign) {
    int half = head_dim / 2, width = n_heads * head_dim;
#pragma omp parallel for
    for (int r = 0; r < n_rows; r++) {
        const float *c = cos + (size_t)pos[r % T] * half, *s = sin + (size_t)pos[r % T] * half;
        for (int h = 0; h < n_heads; h++) {
            const float *xh = x + (size_t)r * width + h * head_dim;
            float *oh = out + (size_t)r * width + h * head_dim;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                float x0 = xh[2 * i], x1 = xh[2 * i + 1], si = sin_sign * s[i];
                oh[2 * i] = x0 * c[i] - x1 * si;
                oh[2 * i + 1] = x0 * si + x1 * c[i];
            }
        }
    }
}

void cpu_rope_forward(float *out, const float *x, const float *cos, const float *sin,
                      const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    rope_rotate(out, x, cos, sin, pos, n_rows, T, n_heads, head_dim, 1.0f);
}

void cpu_rope_backward(float *dx, const float *dout, const float *cos, const float *sin,
                       const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    rope_rotate(dx, dout, cos, sin, pos, n_rows, T, n_heads, head_dim, -1.0f);
}
