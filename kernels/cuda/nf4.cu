// QLoRA's NF4 weights on the device: core/nf4.h's per-element decode (NF4_HD), so that the
// dequantized weight equals the cpu's bit for bit.
#include <stdint.h>
#include <string.h>

#include "core/nf4.h"
#include "kernels/cuda/device.cuh"

// The levels and the dynamic map, passed by value (a kernel's parameters live in constant
// memory, which serves the warp's lookups).
typedef struct {
    float levels[16];
    float map[256];
} Nf4Tables;

static __global__ void nf4_dequantize_elements(float *x, const uint8_t *blob, size_t n,
                                               Nf4Tables t) {
    float offset = ((const float *)blob)[0];
    const float *group_absmax = (const float *)(blob + nf4_group_absmax_at());
    const uint8_t *absmax_codes = blob + nf4_absmax_codes_at(n), *codes = blob + nf4_codes_at(n);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / NF4_BLOCK;
        float absmax = nf4_absmax(t.map, absmax_codes[b], group_absmax[b / NF4_GROUP], offset);
        x[i] = nf4_value(t.levels, codes[i / 2], i, absmax);
    }
}

void cuda_nf4_dequantize(float *x, const uint8_t *blob, size_t n) {
    static Nf4Tables tables;
    static bool filled;
    if (!filled) {
        memcpy(tables.levels, nf4_levels(), sizeof tables.levels);
        memcpy(tables.map, nf4_dynamic_map(), sizeof tables.map);
        filled = true;
    }
    if (n == 0) return;
    nf4_dequantize_elements<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(x, blob, n, tables);
    CUDA_LAUNCH_CHECK();
}
