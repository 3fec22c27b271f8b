#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include <oneapi/dnnl/dnnl.h>

#include "core/signal_stack.h"
#include "kernels/cpu/cpu.h"
#include "kernels/device.h"

// The instruction set oneDNN dispatches to on this cpu (DNNL_MAX_CPU_ISA may lower it).
static const char *cpu_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

// The fp32 GEMMs are oneDNN's sgemm (kernels/cpu/sgemm.c), on the widest instruction set it
// finds; attention's tiles titan's own (kernels/cpu/small_gemm.c); with bf16 compute the GEMMs
// are oneDNN's bf16 matmul, named by the implementation it picks on this cpu.
void cpu_describe(char *buf, size_t len) {
    bool bf16 = cpu_gemm_bf16_on();
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, len, "cpu: %d OpenMP threads, fp32 GEMMs: oneDNN %d.%d.%d sgemm (%s); "
             "attention's tiles: titan's fp32 kernels%s%s", omp_get_max_threads(), v->major,
             v->minor, v->patch, cpu_isa_name(dnnl_get_effective_cpu_isa()),
             bf16 ? "; bf16 compute: " : "", bf16 ? cpu_gemm_bf16_kernels() : "");
}

bool cpu_init(const KernelInit *init, char *why, size_t len) {
    // Every OpenMP thread runs oneDNN's kernels, which a signal's frame on their stack would
    // corrupt: each gets an alternate signal stack (core/signal_stack.h).
#pragma omp parallel
    signal_stack_ensure();
    return init->precision.param != DTYPE_BF16 || cpu_gemm_bf16_start(why, len);
}

void *cpu_queue(void) { return NULL; }

void cpu_synchronize(void) {}  // each op is done when it returns

void cpu_device_id(char *buf, size_t n) { snprintf(buf, n, "host"); }

// No table knows a cpu's cores, clocks and vector units, nor a rank's share of them beside the
// node's other ranks: the peak is this rank's GEMMs' own, measured once (the first call, after
// init) on square GEMMs of 1024 as the training's run (fp32 operands, or bf16 ones under bf16
// compute), the best of as many as 0.05 s holds (every training run pays it: CI runs hundreds).
double cpu_peak_flops(bool again) {
    static double peak;
    if (peak <= 0 || again) {
        double now = device_probe_gemm(&kernels_cpu, cpu_gemm_bf16_on() ? DTYPE_BF16 : DTYPE_FP32,
                                       1024, 0.05);
        peak = now > peak ? now : peak;
    }
    return peak;
}

const KernelOps kernels_cpu = {
    .name = "cpu",
    .host_memory = true,
    .deterministic = true,
#define KERNEL_OP(ret, op, params) .op = cpu_##op,
#include "kernels/ops.def"
};
