// NF4 with double-quantized scales (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of
// Quantized LLMs"), bit for bit bitsandbytes' format: bnb.functional.quantize_4bit(x,
// blocksize=64, compress_statistics=True, quant_type="nf4") and dequantize_4bit.
//
// A tensor of n floats (row-major, flattened) is cut into blocks of NF4_BLOCK elements (the
// last may be shorter). Each block's absmax a scales it onto [-1, 1], and each element becomes
// the 4-bit index of the nearest of the 16 NormalFloat levels (nf4_levels; a tie takes the
// lower), two to a byte, the even element in the high nibble (an odd n's last low nibble is 7,
// the code of 0). The absmaxes (one float per block) are quantized again: their mean (the
// offset) is taken off, and they are cut into groups of NF4_GROUP, each group's absmax scaling
// it onto bitsandbytes' signed 8-bit dynamic map (nf4_dynamic_map), one byte a block: the code
// bitsandbytes' cpu kernel reads from its 65536-point table, not always the nearest map value.
// Dequantized: a = map[q] * group_absmax + offset, x = level[code] * a, in fp32 as bitsandbytes
// computes them. core/nf4.c lists the fp32 details (reciprocal or division, sum order, zeros).
//
// One tensor's quantized form is one blob of nf4_bytes(n) bytes, laid out as
//   float offset; float group_absmax[groups]; uint8 absmax_codes[blocks]; uint8 codes[(n+1)/2]
// (padded with zeros to a multiple of 4 bytes), the floats first so that they are aligned: a
// blob starts 4-byte aligned.
//
// Where this equals bitsandbytes 0.50.2:
//  - its cpu path, bit for bit (tests/unit/test_nf4.c), as long as torch sums the mean on one
//    thread, which it does below 32768 blocks (n <= 2,097,088) whatever its thread count; from
//    there on its offset, and so possibly any byte, depends on torch.get_num_threads() (with
//    one thread, equal still).
//  - its dequantize_4bit on an AVX-512 cpu only where shape[-1] is not a multiple of 16 or
//    is one of 64: otherwise that kernel takes a row's absmaxes from the wrong blocks (a bug);
//    its portable cpu path and its CUDA kernel index them flat, as here.
//  - not its CUDA quantize: that picks the nearest map value (about 0.6% of the absmax codes
//    of N(0, 0.02) weights differ), scales a partial last block by the reciprocal, gives an
//    all-zero block codes 0 (level -1) and absmax 0, and torch's CUDA mean sums in another order.
//  - x must be finite: a NaN or infinity anywhere makes the offset non-finite and every
//    dequantized element NaN (as in bitsandbytes), and so does a sum of block absmaxes past
//    FLT_MAX. n = 0 gives a NaN offset, torch's mean of nothing.
//
// The per-element decode (nf4_absmax, nf4_value) is float arithmetic on values the caller
// passes, so that the cpu kernels and the cuda ones (kernels/cuda/nf4.cu) share it: NF4_HD
// makes it __host__ __device__ under nvcc and is empty in C.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define NF4_HD __host__ __device__
#else
#define NF4_HD
#endif

#define NF4_BLOCK 64   // elements per absmax (bitsandbytes' QLoRA blocksize)
#define NF4_GROUP 256  // absmaxes per double-quantization scale

static inline NF4_HD size_t nf4_blocks(size_t n) { return (n + NF4_BLOCK - 1) / NF4_BLOCK; }
static inline NF4_HD size_t nf4_groups(size_t n) {
    return (nf4_blocks(n) + NF4_GROUP - 1) / NF4_GROUP;
}

// Where each part of a blob of n elements starts, in bytes.
static inline NF4_HD size_t nf4_group_absmax_at(void) { return sizeof(float); }
static inline NF4_HD size_t nf4_absmax_codes_at(size_t n) {
    return sizeof(float) * (1 + nf4_groups(n));
}
static inline NF4_HD size_t nf4_codes_at(size_t n) { return nf4_absmax_codes_at(n) + nf4_blocks(n); }
static inline NF4_HD size_t nf4_bytes(size_t n) {
    return (nf4_codes_at(n) + (n + 1) / 2 + 3) / 4 * 4;
}

// The 16 NF4 levels (bitsandbytes' get_4bit_type("nf4"), increasing, level 7 = 0, 15 = 1) and
// the 256 values of bitsandbytes' create_dynamic_map(signed=True), as fp32.
#ifdef __cplusplus
extern "C" {
#endif
const float *nf4_levels(void);
const float *nf4_dynamic_map(void);

// blob (nf4_bytes(n), 4-byte aligned) = x (n, finite) quantized, as bitsandbytes' quantize_4bit
// does on the cpu. Allocates nothing; reads x four times.
void nf4_quantize(uint8_t *blob, const float *x, size_t n);
// x (n) = blob dequantized, as bitsandbytes' dequantize_4bit.
void nf4_dequantize(float *x, const uint8_t *blob, size_t n);
// x (rows, box_cols) = the box at (first_row, first_col) of the blob's n elements seen as a
// matrix of `cols` columns, dequantized: a tensor-parallel rank's part of a weight.
void nf4_dequantize_box(float *x, const uint8_t *blob, size_t n, size_t cols, size_t first_row,
                        size_t first_col, size_t rows, size_t box_cols);
#ifdef __cplusplus
}
#endif

// Block b's absmax from its code q, its group's absmax and the offset.
// Two roundings, as torch's multiply then add: never contracted into one fma (nvcc would).
static inline NF4_HD float nf4_absmax(const float *dynamic_map, uint8_t q, float group_absmax,
                                      float offset) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(dynamic_map[q], group_absmax), offset);
#else
    float scaled = dynamic_map[q] * group_absmax;
    return scaled + offset;
#endif
}

// Element i's value from the blob's code byte and its block's absmax.
static inline NF4_HD float nf4_value(const float *levels, uint8_t byte, size_t i, float absmax) {
    return levels[i % 2 ? byte & 0xf : byte >> 4] * absmax;
}
