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
                                               size_t cols, size_t first_row, size_t first_col,
                                               size_t count, size_t box_cols, Nf4Tables t) {
    float offset = ((const float *)blob)[0];
    const float *group_absmax = (const float *)(blob + nf4_group_absmax_at());
    const uint8_t *absmax_codes = blob + nf4_absmax_codes_at(n), *codes = blob + nf4_codes_at(n);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t g = (first_row + i / box_cols) * cols + first_col + i % box_cols;  // in the blob
        size_t b = g / NF4_BLOCK;
        float absmax = nf4_absmax(t.map, absmax_codes[b], group_absmax[b / NF4_GROUP], offset);
        x[i] = nf4_value(t.levels, codes[g / 2], g, absmax);
    }
}

void cuda_nf4_dequantize(float *x, const uint8_t *blob, size_t n, size_t cols, size_t first_row,
                         size_t first_col, size_t rows, size_t box_cols) {
    static Nf4Tables tables;
    static bool filled;
    if (!filled) {
        memcpy(tables.levels, nf4_levels(), sizeof tables.levels);
        memcpy(tables.map, nf4_dynamic_map(), sizeof tables.map);
        filled = true;
    }
    size_t count = rows * box_cols;
    if (count == 0) return;
    nf4_dequantize_elements<<<cuda_grid(count), CUDA_THREADS, 0, cuda_stream()>>>(
        x, blob, n, cols, first_row, first_col, count, box_cols, tables);
    CUDA_LAUNCH_CHECK();
}
