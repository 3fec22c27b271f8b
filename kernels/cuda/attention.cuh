// Private to the cuda backend's attention: the shape its functions share, and the fp32 kernels
// (attention_fallback.cu) that run whenever cuDNN's fused attention does not (fp32 compute, or
// a shape cuDNN declines). Semantics as attention_forward / attention_backward in kernels.h.
#pragma once

#include <stddef.h>

typedef struct AttnShape {
    int B, T, n_heads, n_kv_heads, head_dim;
} AttnShape;

// Scratch attn_fallback_backward needs: D_i = rowsum(dout_i * out_i), (B, n_heads, T) floats.
size_t attn_fallback_workspace_bytes(AttnShape s);

// out (B, T, n_heads, head_dim) and lse (B, n_heads, T) are overwritten.
void attn_fallback_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           AttnShape s);

// dq, dk, dv += the gradients; deterministic (no atomics).
void attn_fallback_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            AttnShape s, void *workspace);
