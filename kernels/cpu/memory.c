// The cpu backend's memory section: tensors are host memory, so uploads and downloads are
// plain copies and the queue is the calling thread.
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

#define CPU_ALIGN 256  // kernels.h promises 256-byte alignment (enough for AVX-512 and cache lines)

void *cpu_alloc(size_t bytes) {
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    void *p = aligned_alloc(CPU_ALIGN, rounded ? rounded : CPU_ALIGN);
    if (p) memset(p, 0, rounded);
    return p;
}

void cpu_free(void *p) { free(p); }

void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}

void cpu_copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                   size_t row_bytes, size_t rows) {
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

void cpu_zero(void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}
