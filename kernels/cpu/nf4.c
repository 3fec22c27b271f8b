// QLoRA's NF4 weights on the cpu: core/nf4.h's own dequantization.
#include "core/nf4.h"
#include "kernels/cpu/cpu.h"

void cpu_nf4_dequantize(float *x, const uint8_t *blob, size_t n, size_t cols, size_t first_row,
                        size_t first_col, size_t rows, size_t box_cols) {
    nf4_dequantize_box(x, blob, n, cols, first_row, first_col, rows, box_cols);
}
