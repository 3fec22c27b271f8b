// Private to the cuda backend: the state every op shares (device, stream, library handles)
// and the functions behind kernels_cuda (semantics in kernels/ops.def). Host-only, so that
// it can be included by C and by the .cu files alike; device helpers are in device.cuh.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <stdint.h>

#include "core/errors.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const KernelOps kernels_cuda;

// ---- shared state (cuda_backend.cu), valid after kernels_cuda.init ---------------------------
cudaStream_t cuda_stream(void);  // the one compute stream every op is issued on
bool cuda_bf16_compute(void);    // KernelInit.precision bf16
int cuda_sm_count(void);         // multiprocessors of the device: sizes grid-stride launches
cublasLtHandle_t cuda_cublaslt(void);
// cuBLAS (the grouped GEMM), bound to cuda_stream(), sharing the GEMM workspace below.
cublasHandle_t cuda_cublas(void);
cudnnHandle_t cuda_cudnn(void);  // bound to cuda_stream()
// Scratch owned by the backend, allocated once at init (no allocation inside a step): the
// GEMM workspace cuBLASLt's heuristics may use, CUDA_GEMM_WORKSPACE bytes.
#define CUDA_GEMM_WORKSPACE ((size_t)32 << 20)
void *cuda_gemm_workspace(void);
// And CUDA_SCRATCH bytes for the partial results of reductions (sum, sum_squares, the rmsnorm
// weight gradient, ...): ops run one after another on the stream, so they may all use it.
#define CUDA_SCRATCH ((size_t)64 << 20)
void *cuda_scratch(void);
// The largest power of two dividing the address, capped at cuBLASLt's assumed 256 (and at least
// 4): what a GEMM plan promises cuBLASLt's heuristic about an operand (matmul.cu).
uint32_t cuda_alignment(const void *p);
// The preference and heuristic every cuBLASLt GEMM plan runs (matmul.cu, matmul_float8.cu): the
// best algorithm for desc over cuBLASLt's A, B and C = D layouts within the GEMM workspace, for
// its A, B and C = D aligned to align_a, align_b and align_c bytes. CUBLAS_STATUS_SUCCESS with
// *algo, or why not (CUBLAS_STATUS_NOT_SUPPORTED when the heuristic finds none).
cublasStatus_t cuda_gemm_algo(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                              uint32_t align_a, uint32_t align_b, uint32_t align_c,
                              cublasLtMatmulAlgo_t *algo);

// ---- ops (one .cu file each concern; the memory section in cuda_backend.cu) -----------------
// cuda_NAME for each op NAME of kernels/ops.def.
#define KERNEL_OP(ret, op, params) ret cuda_##op params;
#include "kernels/ops.def"

#ifdef __cplusplus
}
#endif
