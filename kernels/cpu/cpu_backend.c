#include <cblas.h>
#include <omp.h>
#include <stdio.h>

#include "kernels/cpu/cpu.h"

// OpenBLAS picks its kernels for the CPU at load time (or as OPENBLAS_CORETYPE forces).
void cpu_describe(char *buf, size_t len) {
    snprintf(buf, len, "cpu: %d OpenMP threads, OpenBLAS %s kernels (%s)", omp_get_max_threads(),
             openblas_get_corename(), openblas_get_config());
}

bool cpu_init(const KernelInit *init, char *why, size_t len) {
    (void)init, (void)why, (void)len;
    return true;
}

void *cpu_queue(void) { return NULL; }

double cpu_peak_flops(void) { return 0; }  // depends on cores, clocks and vector units

const KernelOps kernels_cpu = {
    .name = "cpu",
    .host_memory = true,
    .mixed_precision = false,
    .deterministic = true,
#define KERNEL_OP(ret, op, params) .op = cpu_##op,
#include "kernels/ops.def"
};
