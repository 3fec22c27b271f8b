#include <cblas.h>
#include <omp.h>
#include <stdio.h>

#include "kernels/cpu/cpu.h"

// OpenBLAS picks its kernels for the CPU at load time (or as OPENBLAS_CORETYPE forces); with
// bf16 compute the GEMMs are oneDNN's, named by the implementation it picks on this cpu.
void cpu_describe(char *buf, size_t len) {
    bool bf16 = cpu_gemm_bf16_on();
    snprintf(buf, len, "cpu: %d OpenMP threads, OpenBLAS %s kernels (%s)%s%s",
             omp_get_max_threads(), openblas_get_corename(), openblas_get_config(),
             bf16 ? "; GEMMs: " : "", bf16 ? cpu_gemm_bf16_kernels() : "");
}

bool cpu_init(const KernelInit *init, char *why, size_t len) {
    return !init->bf16_compute || cpu_gemm_bf16_start(why, len);
}

void *cpu_queue(void) { return NULL; }

void cpu_synchronize(void) {}  // each op is done when it returns

double cpu_peak_flops(void) { return 0; }  // depends on cores, clocks and vector units

const KernelOps kernels_cpu = {
    .name = "cpu",
    .host_memory = true,
    .deterministic = true,
#define KERNEL_OP(ret, op, params) .op = cpu_##op,
#include "kernels/ops.def"
};
