// Private to the cuda backend's attention: the fp32 kernels (attention_fallback.cu) that run
// whenever cuDNN's fused attention does not (fp32 compute, offsets, masks other than plain
// causal, or a shape cuDNN declines). Semantics as attention_forward / attention_backward in
// kernels.h, AttnShape's included.
#pragma once

#include <stddef.h>

#include "kernels/kernels.h"

// Scratch attn_fallback_backward needs: D_i = rowsum(dout_i * out_i), (B, n_heads, Tq) floats.
size_t attn_fallback_workspace_bytes(AttnShape s);

// out (B, Tq, n_heads, head_dim) and lse (B, n_heads, Tq) are overwritten.
void attn_fallback_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           AttnShape s);

// dq, dk, dv += the gradients; deterministic (no atomics).
void attn_fallback_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            AttnShape s, void *workspace);
