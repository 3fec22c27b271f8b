// QLoRA's NF4 weights on the cpu: core/nf4.h's own dequantization.
#include "core/nf4.h"
#include "kernels/cpu/cpu.h"

void cpu_nf4_dequantize(float *x, const uint8_t *blob, size_t n) { nf4_dequantize(x, blob, n); }
