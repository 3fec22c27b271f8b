#include <cblas.h>
#include <omp.h>
#include <stdio.h>

#include "kernels/cpu/cpu.h"

// OpenBLAS picks its kernels for the CPU at load time (or as OPENBLAS_CORETYPE forces).
static void cpu_describe(char *buf, size_t len) {
    snprintf(buf, len, "cpu: %d OpenMP threads, OpenBLAS %s kernels (%s)", omp_get_max_threads(),
             openblas_get_corename(), openblas_get_config());
}

static bool cpu_init(const KernelInit *init, char *why, size_t len) {
    (void)init, (void)why, (void)len;
    return true;
}

static void *cpu_queue(void) { return NULL; }

static double cpu_peak_flops(void) { return 0; }  // depends on cores, clocks and vector units

const KernelOps kernels_cpu = {
    .name = "cpu",
    .describe = cpu_describe,
    .peak_flops = cpu_peak_flops,
    .init = cpu_init,
    .host_memory = true,
    .mixed_precision = false,
    .deterministic = true,
    .queue = cpu_queue,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memory_free = cpu_memory_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .zero = cpu_zero,
    .matmul = cpu_matmul,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_workspace_bytes = cpu_attention_workspace_bytes,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_merge = cpu_attention_merge,
    .attention_decode = cpu_attention_decode,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .cross_entropy_slice_forward = cpu_cross_entropy_slice_forward,
    .cross_entropy_slice_backward = cpu_cross_entropy_slice_backward,
    .cross_entropy_merge_exp = cpu_cross_entropy_merge_exp,
    .cross_entropy_merge_finish = cpu_cross_entropy_merge_finish,
    .moe_router_forward = cpu_moe_router_forward,
    .moe_router_backward = cpu_moe_router_backward,
    .moe_sort = cpu_moe_sort,
    .moe_permute = cpu_moe_permute,
    .moe_unpermute = cpu_moe_unpermute,
    .moe_weight_grad = cpu_moe_weight_grad,
    .grouped_matmul = cpu_grouped_matmul,
    .moe_aux_stats = cpu_moe_aux_stats,
    .moe_aux_backward = cpu_moe_aux_backward,
    .add = cpu_add,
    .scale = cpu_scale,
    .sum_squares = cpu_sum_squares,
    .sum = cpu_sum,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .adamw_update = cpu_adamw_update,
};
