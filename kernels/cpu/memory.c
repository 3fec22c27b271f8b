// The cpu backend's memory section: tensors are host memory, so uploads and downloads are
// plain copies and the queue is the calling thread.
#include <stdlib.h>
#include <sys/resource.h>

#include "core/host_memory.h"
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

void cpu_upload(void *dst, const void *host_src, size_t bytes) {
    cpu_copy(dst, host_src, bytes);
}

void cpu_download(void *host_dst, const void *src, size_t bytes) {
    cpu_copy(host_dst, src, bytes);
}

void cpu_copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                   size_t row_bytes, size_t rows) {
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

void cpu_zero(void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
}

size_t cpu_memory_free(void) { return host_memory_free(); }

size_t cpu_memory_peak(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;  // ru_maxrss is in KiB on Linux
}
