// The cuda backend's table, its shared state (device, stream, library handles, scratch) and its
// memory ops. Every op is issued on one non-blocking stream, so the ops keep issue order among
// themselves and never wait on the legacy default stream.
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/device.h"

static struct {
    bool ready;  // init has run
    bool bf16_compute;
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasLtHandle_t cublaslt;
    cublasHandle_t cublas;  // bound to stream
    cudnnHandle_t cudnn;   // bound to stream
    void *gemm_workspace;  // CUDA_GEMM_WORKSPACE bytes
    void *scratch;         // CUDA_SCRATCH bytes
} state;

cudaStream_t cuda_stream(void) { return state.stream; }
bool cuda_bf16_compute(void) { return state.bf16_compute; }
int cuda_sm_count(void) { return state.sm_count; }
cublasLtHandle_t cuda_cublaslt(void) { return state.cublaslt; }
cublasHandle_t cuda_cublas(void) { return state.cublas; }
cudnnHandle_t cuda_cudnn(void) { return state.cudnn; }
void *cuda_gemm_workspace(void) { return state.gemm_workspace; }
void *cuda_scratch(void) { return state.scratch; }

// A machine without a device or with too old a driver is a reason to pick another backend, not
// an internal error: only cudaGetDeviceCount's failure is reported through why. Once a device
// exists every failure is fatal. A second call keeps the first call's settings.
bool cuda_init(const KernelInit *init, char *why, size_t len) {
    if (state.ready) return true;
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();  // so that no later runtime call reports it again
        snprintf(why, len, "no CUDA device: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return false;
    }
    if (count == 0) {
        snprintf(why, len, "no CUDA device: cudaGetDeviceCount found none");
        return false;
    }
    state.device = init->local_rank % count;
    CUDA_CHECK(cudaSetDevice(state.device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&state.cublaslt));
    CUDNN_CHECK(cudnnCreate(&state.cudnn));
    CUDNN_CHECK(cudnnSetStream(state.cudnn, state.stream));
    CUDA_CHECK(cudaMalloc(&state.gemm_workspace, CUDA_GEMM_WORKSPACE));
    CUDA_CHECK(cudaMalloc(&state.scratch, CUDA_SCRATCH));
    CUBLAS_CHECK(cublasCreate(&state.cublas));
    CUBLAS_CHECK(cublasSetStream(state.cublas, state.stream));
    CUBLAS_CHECK(cublasSetWorkspace(state.cublas, state.gemm_workspace, CUDA_GEMM_WORKSPACE));
    CUDA_CHECK(cudaDeviceGetAttribute(&state.sm_count, cudaDevAttrMultiProcessorCount,
                                      state.device));
    state.bf16_compute = init->precision.param == DTYPE_BF16;
    state.ready = true;
    return true;
}

// Library versions are encoded major*10000 + minor*100 + patch (CUBLAS_VERSION, CUDNN_VERSION).
void cuda_describe(char *buf, size_t len) {
    if (!state.ready) {
        snprintf(buf, len, "cuda: not started");
        return;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, state.device));
    size_t lt = cublasLtGetVersion(), dnn = cudnnGetVersion();
    snprintf(buf, len,
             "cuda: %s (sm_%d%d, %d SMs, %.1f GiB), cuBLASLt %zu.%zu.%zu, cuDNN %zu.%zu.%zu, %s",
             prop.name, prop.major, prop.minor, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (double)(1u << 30), lt / 10000, lt / 100 % 100,
             lt % 100, dnn / 10000, dnn / 100 % 100, dnn % 100,
             state.bf16_compute ? "bf16 compute (fp32 accumulation)" : "fp32 compute");
}

void *cuda_queue(void) { return (void *)state.stream; }

void cuda_synchronize(void) { CUDA_CHECK(cudaStreamSynchronize(state.stream)); }

// cudaMalloc aligns to 256 bytes. A zero-byte request still gets a distinct pointer, since NULL
// means no room. The zeroing is queued on the stream, so every later op sees it.
void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1);
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();  // out of memory is an answer, not a sticky error
        return NULL;
    }
    if (rc != cudaSuccess)
        die_internal(__FILE__, __LINE__, "cudaMalloc(%zu bytes): %s", bytes,
                     cudaGetErrorString(rc));
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, state.stream));
    return p;
}

void cuda_free(void *p) { CUDA_CHECK(cudaFree(p)); }

void cuda_device_id(char *buf, size_t n) {
    CUDA_CHECK(cudaDeviceGetPCIBusId(buf, (int)n, state.device));
}

size_t cuda_memory_free(void) {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

size_t cuda_memory_peak(void) {
    static size_t peak;  // ops are issued from one host thread
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (total - free_bytes > peak) peak = total - free_bytes;
    return peak;
}

// On the stream, so the bytes land after the queued work that may still read the old ones; the
// wait is the contract (and frees the host buffer for reuse).
void cuda_upload(void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, state.stream));
    CUDA_CHECK(cudaStreamSynchronize(state.stream));
}

void cuda_download(void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, state.stream));
    CUDA_CHECK(cudaStreamSynchronize(state.stream));
}

void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state.stream));
}

void cuda_copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                    size_t row_bytes, size_t rows) {
    if (row_bytes == 0 || rows == 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                 cudaMemcpyDeviceToDevice, state.stream));
}

void cuda_zero(void *dst, size_t bytes) {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, state.stream));
}

// The data sheet's dense bf16 tensor-core peak of the GPU's kept row (kernels/device_table.c),
// the same asked again. fp32 compute runs off the tensor cores: no MFU is claimed for it.
double cuda_peak_flops(bool again) {
    (void)again;
    if (!state.ready || !state.bf16_compute) return 0;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, state.device));
    const DeviceTable *row = device_table_for_gpu(prop.name);
    return row ? row->peak[GEMM_BF16] : 0;
}

// In KernelOps' declaration order (C++ requires it of designated initializers).
extern "C" const KernelOps kernels_cuda = {
    .name = "cuda",
    .host_memory = false,
    .deterministic = false,
#define KERNEL_OP(ret, op, params) .op = cuda_##op,
#include "kernels/ops.def"
};
