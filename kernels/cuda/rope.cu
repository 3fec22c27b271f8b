// Rotary embedding (RoFormer, Su et al. 2021) on interleaved pairs, as torchtitan's
// apply_rotary_emb: the pair (x0, x1) is x0 + i x1 times e^(i pos theta_k). One block per row
// of n_heads * head_dim floats, one pair per thread step; pair q of a row is pair q % half of
// its head. The rotation is orthogonal, so backward rotates by -theta (sin_sign = -1). Each
// pair is read before it is written by the same thread: in place is safe.
#include "kernels/cuda/device.cuh"

static __global__ void rope_rotate_rows(float *out, const float *x, const float *cos,
                                        const float *sin, const int *pos, int T, int width,
                                        int half, float sin_sign) {
    size_t row = blockIdx.x, at = (size_t)pos[row % T] * half;
    const float *c = cos + at, *s = sin + at, *xr = x + row * width;
    float *outr = out + row * width;
    for (int q = threadIdx.x; q < width / 2; q += blockDim.x) {
        int i = q % half;
        float x0 = xr[2 * q], x1 = xr[2 * q + 1], si = sin_sign * s[i];
        outr[2 * q] = x0 * c[i] - x1 * si;
        outr[2 * q + 1] = x0 * si + x1 * c[i];
    }
}

static void rope_rotate(float *out, const float *x, const float *cos, const float *sin,
                        const int *pos, int n_rows, int T, int n_heads, int head_dim,
                        float sin_sign) {
    if (n_rows == 0) return;  // an empty grid is a launch error
    rope_rotate_rows<<<n_rows, CUDA_THREADS, 0, cuda_stream()>>>(
        out, x, cos, sin, pos, T, n_heads * head_dim, head_dim / 2, sin_sign);
    CUDA_LAUNCH_CHECK();
}

void cuda_rope_forward(float *out, const float *x, const float *cos, const float *sin,
                       const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    rope_rotate(out, x, cos, sin, pos, n_rows, T, n_heads, head_dim, 1.0f);
}

void cuda_rope_backward(float *dx, const float *dout, const float *cos, const float *sin,
                        const int *pos, int n_rows, int T, int n_heads, int head_dim) {
    rope_rotate(dx, dout, cos, sin, pos, n_rows, T, n_heads, head_dim, -1.0f);
}
