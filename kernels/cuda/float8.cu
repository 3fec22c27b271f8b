// float8_amax and float8_quantize on the device: the casts and scales are core/float8.h's own
// functions (FLOAT8_HD), so the bytes and scales equal the cpu backend's bit for bit.
//
// amax is the max of the magnitudes' bits (NaN above infinity, as the cpu takes it): an integer
// max, exact and independent of order, so blocks may combine their partials with atomicMax and
// the result is still the same on every run.
#include <stdint.h>

#include "kernels/cuda/device.cuh"

#define FLOAT8_TILE 32  // the transposing kernels' square tile
#define FLOAT8_TILE_ROWS 8  // their threads: FLOAT8_TILE x FLOAT8_TILE_ROWS, each a column strip

__device__ __forceinline__ uint32_t float8_abs_bits(float x) {
    return __float_as_uint(x) & 0x7fffffffu;
}

// The block's max (blockDim.x a multiple of 32), returned to thread 0. shared: 32 words.
__device__ __forceinline__ uint32_t float8_block_max(uint32_t v, uint32_t *shared) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    v = __reduce_max_sync(0xffffffffu, v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < n_warps ? shared[lane] : 0u;
    return __reduce_max_sync(0xffffffffu, v);
}

// Tensorwise: a grid-stride share per thread, one atomicMax per block into amax (zeroed).
static __global__ void float8_amax_tensor(uint32_t *amax, const float *x, size_t n) {
    __shared__ uint32_t shared[32];
    uint32_t v = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        v = max(v, float8_abs_bits(x[i]));
    v = float8_block_max(v, shared);
    if (threadIdx.x == 0) atomicMax(amax, v);
}

// Rowwise: a block per row of x.
static __global__ void float8_amax_rows(uint32_t *amax, const float *x, int cols) {
    __shared__ uint32_t shared[32];
    const float *row = x + (size_t)blockIdx.x * cols;
    uint32_t v = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) v = max(v, float8_abs_bits(row[c]));
    v = float8_block_max(v, shared);
    if (threadIdx.x == 0) amax[blockIdx.x] = v;
}

// Rowwise transposed, a max per column of x: a block per tile of FLOAT8_TILE columns and
// FLOAT8_TILE rows (threads along the columns read coalesced), atomicMax into amax (zeroed).
static __global__ void float8_amax_cols(uint32_t *amax, const float *x, int rows, int cols) {
    __shared__ uint32_t tile[FLOAT8_TILE_ROWS][FLOAT8_TILE];
    int c = blockIdx.x * FLOAT8_TILE + threadIdx.x, r0 = blockIdx.y * FLOAT8_TILE;
    uint32_t v = 0;
    for (int r = r0 + threadIdx.y; c < cols && r < rows && r < r0 + FLOAT8_TILE;
         r += FLOAT8_TILE_ROWS)
        v = max(v, float8_abs_bits(x[(size_t)r * cols + c]));
    tile[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y != 0 || c >= cols) return;
    for (int y = 1; y < FLOAT8_TILE_ROWS; y++) v = max(v, tile[y][threadIdx.x]);
    atomicMax(amax + c, v);
}

static dim3 float8_tiles(int rows, int cols) {
    return dim3((unsigned)((cols + FLOAT8_TILE - 1) / FLOAT8_TILE),
                (unsigned)((rows + FLOAT8_TILE - 1) / FLOAT8_TILE));
}

static size_t float8_scale_count(const Float8Cast *cast, int rows, int cols) {
    return !cast->rowwise ? 1 : cast->transpose ? (size_t)cols : (size_t)rows;
}

void cuda_float8_amax(float *amax, const float *x, int rows, int cols, const Float8Cast *cast) {
    CHECK(rows >= 0 && cols >= 0);
    size_t count = float8_scale_count(cast, rows, cols), n = (size_t)rows * (size_t)cols;
    uint32_t *bits = (uint32_t *)amax;  // written as bits, read as the floats they are
    if (cast->rowwise && !cast->transpose) {
        if (rows > 0) float8_amax_rows<<<rows, CUDA_THREADS, 0, cuda_stream()>>>(bits, x, cols);
    } else {
        CUDA_CHECK(cudaMemsetAsync(amax, 0, count * sizeof *amax, cuda_stream()));
        if (n == 0) return;
        if (cast->rowwise)
            float8_amax_cols<<<float8_tiles(rows, cols), dim3(FLOAT8_TILE, FLOAT8_TILE_ROWS), 0,
                               cuda_stream()>>>(bits, x, rows, cols);
        else
            float8_amax_tensor<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(bits, x, n);
    }
    CUDA_LAUNCH_CHECK();
}

// scale (count) for the cast kernels (in cuda_scratch), and scale_inv (count), the op's output.
static __global__ void float8_scales(float *scale, float *scale_inv, const float *amax,
                                     size_t count, Float8Kind kind, bool pow2) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = float8_scale_from_amax(amax[i], kind);
        if (pow2) s = float8_round_scale_pow2(s);
        scale[i] = s;
        scale_inv[i] = 1.0f / s;  // IEEE division (nvcc's default -prec-div=true), as the cpu's
    }
}

// out (rows, cols): element i's scale is its row's (rowwise) or the one.
static __global__ void float8_cast(uint8_t *out, const float *x, const float *scale, size_t n,
                                   int cols, bool rowwise, Float8Kind kind) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = float8_from_float(x[i] * scale[rowwise ? i / (size_t)cols : 0], kind, true);
}

// out (cols, rows) = the cast of x^T, a tile at a time through shared memory so that both the
// reads of x and the writes of out are coalesced. Element (r, c) of x lands in row c of out,
// whose scale it takes when rowwise.
static __global__ void float8_cast_transposed(uint8_t *out, const float *x, const float *scale,
                                              int rows, int cols, bool rowwise,
                                              Float8Kind kind) {
    __shared__ uint8_t tile[FLOAT8_TILE][FLOAT8_TILE + 1];
    int r0 = blockIdx.y * FLOAT8_TILE, c0 = blockIdx.x * FLOAT8_TILE;
    for (int y = threadIdx.y; y < FLOAT8_TILE; y += FLOAT8_TILE_ROWS) {
        int r = r0 + y, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[y][threadIdx.x] = float8_from_float(
                x[(size_t)r * cols + c] * scale[rowwise ? c : 0], kind, true);
    }
    __syncthreads();
    for (int y = threadIdx.y; y < FLOAT8_TILE; y += FLOAT8_TILE_ROWS) {
        int c = c0 + y, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][y];
    }
}

void cuda_float8_quantize(uint8_t *out, float *scale_inv, const float *amax, const float *x,
                          int rows, int cols, const Float8Cast *cast) {
    CHECK(rows >= 0 && cols >= 0);
    size_t count = float8_scale_count(cast, rows, cols), n = (size_t)rows * (size_t)cols;
    CHECK(count * sizeof(float) <= CUDA_SCRATCH);
    float *scale = (float *)cuda_scratch();
    float8_scales<<<cuda_grid(count), CUDA_THREADS, 0, cuda_stream()>>>(
        scale, scale_inv, amax, count, cast->kind, cast->pow2_scales);
    CUDA_LAUNCH_CHECK();
    if (n == 0) return;
    if (cast->transpose)
        float8_cast_transposed<<<float8_tiles(rows, cols), dim3(FLOAT8_TILE, FLOAT8_TILE_ROWS), 0,
                                 cuda_stream()>>>(out, x, scale, rows, cols, cast->rowwise,
                                                  cast->kind);
    else
        float8_cast<<<cuda_grid(n), CUDA_THREADS, 0, cuda_stream()>>>(out, x, scale, n, cols,
                                                                      cast->rowwise, cast->kind);
    CUDA_LAUNCH_CHECK();
}

// out (cols, rows) = in^T through a shared tile, both sides coalesced (as float8_cast_transposed).
static __global__ void float8_transpose_tiles(uint8_t *out, const uint8_t *in, int rows,
                                              int cols) {
    __shared__ uint8_t tile[FLOAT8_TILE][FLOAT8_TILE + 1];
    int r0 = blockIdx.y * FLOAT8_TILE, c0 = blockIdx.x * FLOAT8_TILE;
    for (int y = threadIdx.y; y < FLOAT8_TILE; y += FLOAT8_TILE_ROWS) {
        int r = r0 + y, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[y][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < FLOAT8_TILE; y += FLOAT8_TILE_ROWS) {
        int c = c0 + y, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = tile[threadIdx.x][y];
    }
}

void cuda_float8_transpose(uint8_t *out, const uint8_t *in, int rows, int cols) {
    CHECK(rows >= 0 && cols >= 0);
    if (rows == 0 || cols == 0) return;
    float8_transpose_tiles<<<float8_tiles(rows, cols), dim3(FLOAT8_TILE, FLOAT8_TILE_ROWS), 0,
                             cuda_stream()>>>(out, in, rows, cols);
    CUDA_LAUNCH_CHECK();
}
