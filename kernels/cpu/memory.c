// The cpu backend's memory section: tensors are host memory, so uploads and downloads are
// plain copies and the queue is the calling thread.
#include <omp.h>
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

// Large zeroings and copies (gradients, residual streams) split over the threads: one core's
// memset reaches about half of what two reach. Cut at cache lines; a small one, one inside a
// parallel region or an overlapping copy stays one call.
#define CPU_SPLIT_BYTES (1 << 20)

static bool cpu_split(size_t bytes) { return bytes >= CPU_SPLIT_BYTES && !omp_in_parallel(); }

// [*lo, *hi) of [0, bytes): this thread's share.
static void cpu_share(size_t bytes, size_t *lo, size_t *hi) {
    size_t lines = (bytes + 63) / 64, n = (size_t)omp_get_num_threads();
    size_t t = (size_t)omp_get_thread_num(), per = (lines + n - 1) / n;
    *lo = t * per * 64 < bytes ? t * per * 64 : bytes;
    *hi = (t + 1) * per * 64 < bytes ? (t + 1) * per * 64 : bytes;
}

void cpu_copy(void *dst, const void *src, size_t bytes) {
    const char *s = src;
    char *d = dst;
    bool apart = d + bytes <= s || s + bytes <= d;
    if (!apart || !cpu_split(bytes)) {
        if (bytes) memmove(dst, src, bytes);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        cpu_share(bytes, &lo, &hi);
        if (hi > lo) memcpy(d + lo, s + lo, hi - lo);
    }
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
    if (!cpu_split(bytes)) {
        if (bytes) memset(dst, 0, bytes);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        cpu_share(bytes, &lo, &hi);
        if (hi > lo) memset((char *)dst + lo, 0, hi - lo);
    }
}

size_t cpu_memory_free(void) { return host_memory_free(); }

size_t cpu_memory_peak(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;  // ru_maxrss is in KiB on Linux
}
