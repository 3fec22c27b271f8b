// NF4 quantization bit for bit as bitsandbytes 0.50.2 computes it on the cpu (core/nf4.h):
//  - the 4-bit codes come from bnb's default torch kernel for quantize_4bit. A full block is
//    scaled by x * (1 / max(absmax, 1e-38)), the last partial block by x / max(absmax, 1e-38)
//    (a division, and that block stores the clamped absmax). The code is torch.bucketize
//    against the midpoints of the levels: the count of midpoints below the value, so a value on
//    a midpoint takes the lower level.
//  - the offset is torch's fp32 mean of the absmaxes: its cascade sum, then a division.
//  - the 8-bit absmax codes come from bnb's C++ kernel quantize_cpu (blocksize 256). It does
//    not search for the nearest map value: it rounds the scaled value onto a grid of 65536
//    points of [-1, 1] and looks the grid point's code up in a table.
// bnb's CUDA kernels differ in both searches and in the mean: see nf4.h.
#include "core/nf4.h"

#include <math.h>
#include <string.h>

// bitsandbytes' get_4bit_type("nf4") as fp32 (QLoRA's quantiles of N(0, 1)) and
// create_dynamic_map(signed=True), printed once with Python's float.hex from bitsandbytes
// 0.50.2 (tests/reference/make_nf4_fixture.py stores both; test_nf4 compares them).
static const float NF4_LEVELS[16] = {
    -0x1p+0f, -0x1.647362p-1f, -0x1.0cd66p-1f, -0x1.94654p-2f,
    -0x1.23449ap-2f, -0x1.7a6a7ep-3f, -0x1.74f0e2p-4f, 0x0p+0f,
    0x1.45f5fep-4f, 0x1.4995c6p-3f, 0x1.f809bap-3f, 0x1.5a0674p-2f,
    0x1.c3497p-2f, 0x1.200f56p-1f, 0x1.722766p-1f, 0x1p+0f,
};

static const float DYNAMIC_MAP[256] = {
    -0x1.fc6666p-1f, -0x1.f53334p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f, -0x1.df999ap-1f,
    -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f, -0x1.c2ccccp-1f, -0x1.bb999ap-1f,
    -0x1.b46666p-1f, -0x1.ad3334p-1f, -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.97999ap-1f,
    -0x1.906666p-1f, -0x1.893334p-1f, -0x1.82p-1f, -0x1.7accccp-1f, -0x1.73999ap-1f,
    -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56ccccp-1f, -0x1.4f999ap-1f,
    -0x1.486668p-1f, -0x1.413334p-1f, -0x1.3ap-1f, -0x1.32ccccp-1f, -0x1.2b999ap-1f,
    -0x1.246668p-1f, -0x1.1d3334p-1f, -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.079998p-1f,
    -0x1.006666p-1f, -0x1.f26664p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f,
    -0x1.b8ccccp-2f, -0x1.aa6666p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f, -0x1.7f3334p-2f,
    -0x1.70ccccp-2f, -0x1.626666p-2f, -0x1.54p-2f, -0x1.459998p-2f, -0x1.373334p-2f,
    -0x1.28ccccp-2f, -0x1.1a6668p-2f, -0x1.0cp-2f, -0x1.fb3332p-3f, -0x1.de6666p-3f,
    -0x1.c1999ap-3f, -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3334p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f, -0x1.93d70ap-4f,
    -0x1.8851eep-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f, -0x1.65c29p-4f, -0x1.5a3d7p-4f,
    -0x1.4eb854p-4f, -0x1.433334p-4f, -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f,
    -0x1.151ebap-4f, -0x1.09999ap-4f, -0x1.fc28f6p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f, -0x1.5ae146p-5f,
    -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c29p-5f, -0x1.fd70a4p-6f, -0x1.cf5c2ap-6f,
    -0x1.a147aep-6f, -0x1.733334p-6f, -0x1.451ebap-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f,
    -0x1.75c29p-7f, -0x1.3e76c8p-7f, -0x1.2c083p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f, -0x1.56041ap-8f,
    -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f, -0x1.851eb8p-9f, -0x1.3b645ap-9f,
    -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f,
    -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f,
    -0x1.b43528p-19f, -0x1.27476ep-21f, 0x0p+0f, 0x1.27476ep-21f, 0x1.b43528p-19f,
    0x1.040bfep-17f, 0x1.64840cp-16f, 0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f,
    0x1.47ae16p-13f, 0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f,
    0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f, 0x1.e353f8p-10f,
    0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f, 0x1.0c49bap-8f, 0x1.3126e8p-8f,
    0x1.56041ap-8f, 0x1.7ae148p-8f, 0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f,
    0x1.072b02p-7f, 0x1.19999ap-7f, 0x1.2c083p-7f, 0x1.3e76c8p-7f, 0x1.75c29p-7f,
    0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451ebap-6f, 0x1.733334p-6f, 0x1.a147aep-6f,
    0x1.cf5c2ap-6f, 0x1.fd70a4p-6f, 0x1.15c29p-5f, 0x1.2ccccep-5f, 0x1.43d70ap-5f,
    0x1.5ae146p-5f, 0x1.71eb86p-5f, 0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f,
    0x1.ce147ap-5f, 0x1.e51ebap-5f, 0x1.fc28f6p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f, 0x1.4eb854p-4f,
    0x1.5a3d7p-4f, 0x1.65c29p-4f, 0x1.7147aep-4f, 0x1.7ccccep-4f, 0x1.8851eep-4f,
    0x1.93d70ap-4f, 0x1.b66668p-4f, 0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f,
    0x1.4e6666p-3f, 0x1.6b3334p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f,
    0x1.de6666p-3f, 0x1.fb3332p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f, 0x1.28ccccp-2f,
    0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f, 0x1.626666p-2f, 0x1.70ccccp-2f,
    0x1.7f3334p-2f, 0x1.8d9998p-2f, 0x1.9cp-2f, 0x1.aa6666p-2f, 0x1.b8ccccp-2f,
    0x1.c73334p-2f, 0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26664p-2f, 0x1.006666p-1f,
    0x1.079998p-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f, 0x1.246668p-1f,
    0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f, 0x1.413334p-1f, 0x1.486668p-1f,
    0x1.4f999ap-1f, 0x1.56ccccp-1f, 0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f,
    0x1.73999ap-1f, 0x1.7accccp-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.97999ap-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3334p-1f, 0x1.b46666p-1f,
    0x1.bb999ap-1f, 0x1.c2ccccp-1f, 0x1.cap-1f, 0x1.d13334p-1f, 0x1.d86666p-1f,
    0x1.df999ap-1f, 0x1.e6ccccp-1f, 0x1.eep-1f, 0x1.f53334p-1f, 0x1.fc6666p-1f,
    0x1p+0f,
};

const float *nf4_levels(void) { return NF4_LEVELS; }
const float *nf4_dynamic_map(void) { return DYNAMIC_MAP; }

// torch clamps the absmax it divides by to 1e-38 (a subnormal fp32), so that an all-zero
// block scales to zeros.
#define NF4_TINY 1e-38f

// The lanes of torch's vectorized fp32 sum on x86-64: 8, measured with its DEFAULT, AVX2 and
// AVX512 kernels alike.
#define TORCH_SUM_LANES 8

// Block b's absmax as bitsandbytes stores it: max |x| (torch's max: a NaN wins), the last
// block's clamped to NF4_TINY if it is partial.
static float block_absmax(const float *x, size_t n, size_t b) {
    size_t start = b * NF4_BLOCK, end = start + NF4_BLOCK < n ? start + NF4_BLOCK : n;
    float absmax = 0.0f;
    for (size_t i = start; i < end; i++) {
        float a = fabsf(x[i]);
        if (isnan(a)) return a;
        if (a > absmax) absmax = a;
    }
    return end - start < NF4_BLOCK && absmax < NF4_TINY ? NF4_TINY : absmax;
}

// ---- the offset: torch's fp32 sum of the absmaxes ---------------------------------------

// ATen's CeilLog2: ceil(log2(count)), 1 for count <= 2.
static size_t ceil_log2(size_t count) {
    if (count <= 2) return 1;
    size_t bits = 0;
    for (size_t v = count - 1; v; v >>= 1) bits++;
    return bits;
}

// ATen's multi_row_sum for 4 interleaved rows of `count` terms, term (i, k) being absmax
// first + (4 i + k) stride: each row sums runs of 2^p terms, folded into a 4-level cascade
// (torch's SumKernel.cpp: only sums of similar magnitude meet).
static void multi_row_sum(float rows[4], const float *x, size_t n, size_t first, size_t stride,
                          size_t count) {
    size_t power = ceil_log2(count) / 4 > 4 ? ceil_log2(count) / 4 : 4;
    size_t step = (size_t)1 << power, mask = step - 1;
    float acc[4][4] = {{0}};
    size_t i = 0;
    while (i + step <= count) {
        for (size_t j = 0; j < step; j++, i++)
            for (size_t k = 0; k < 4; k++)
                acc[0][k] += block_absmax(x, n, first + (4 * i + k) * stride);
        for (size_t level = 1; level < 4; level++) {
            for (size_t k = 0; k < 4; k++) {
                acc[level][k] += acc[level - 1][k];
                acc[level - 1][k] = 0;
            }
            if (i & (mask << (level * power))) break;
        }
    }
    for (; i < count; i++)
        for (size_t k = 0; k < 4; k++)
            acc[0][k] += block_absmax(x, n, first + (4 * i + k) * stride);
    for (size_t k = 0; k < 4; k++) rows[k] = acc[0][k] + acc[1][k] + acc[2][k] + acc[3][k];
}

// ATen's row_sum: the absmaxes first + i stride, i < count, as 4 interleaved rows plus the
// rest.
static float row_sum(const float *x, size_t n, size_t first, size_t stride, size_t count) {
    float rows[4];
    multi_row_sum(rows, x, n, first, stride, count / 4);
    for (size_t i = count / 4 * 4; i < count; i++)
        rows[0] += block_absmax(x, n, first + i * stride);
    return rows[0] + rows[1] + rows[2] + rows[3];
}

// absmax.mean() as torch computes it on one thread: a contiguous row of at least
// TORCH_SUM_LANES floats is summed lane by lane (lane l: elements l, l + lanes, ...), then 0 +
// the leftover elements + each lane's sum, in order; the sum is divided by the count.
static float absmax_mean(const float *x, size_t n) {
    size_t blocks = nf4_blocks(n);
    if (blocks < TORCH_SUM_LANES) return row_sum(x, n, 0, 1, blocks) / (float)blocks;
    size_t vectors = blocks / TORCH_SUM_LANES;
    float sum = 0.0f;
    for (size_t b = vectors * TORCH_SUM_LANES; b < blocks; b++) sum += block_absmax(x, n, b);
    for (size_t lane = 0; lane < TORCH_SUM_LANES; lane++)
        sum += row_sum(x, n, lane, TORCH_SUM_LANES, vectors);
    return sum / (float)blocks;
}

// ---- the 4-bit codes -------------------------------------------------------------------------

// torch.bucketize(v, midpoints): its binary search, which moves up while !(midpoint >= v), so
// v takes the count of midpoints below it (a tie the lower level) and NaN takes 15. (torch
// clamps v to [-1, 1] first, which moves no value across a midpoint.)
static uint8_t level_code(const float midpoints[15], float v) {
    uint8_t lo = 0, hi = 15;
    while (lo < hi) {
        uint8_t mid = (uint8_t)((lo + hi) / 2);
        if (!(midpoints[mid] >= v)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Block b's 4-bit codes into codes (two a byte, the even element high). An odd n's last low
// nibble is 7, the code of the 0 torch pads the scaled values with.
static void quantize_block(uint8_t *codes, const float midpoints[15], const float *x, size_t n,
                           size_t b) {
    size_t start = b * NF4_BLOCK, end = start + NF4_BLOCK < n ? start + NF4_BLOCK : n;
    float absmax = block_absmax(x, n, b);
    float divisor = absmax < NF4_TINY ? NF4_TINY : absmax;  // a NaN stays
    float inverse = 1.0f / divisor;
    for (size_t i = start; i < end; i++) {
        float v = end - start == NF4_BLOCK ? x[i] * inverse : x[i] / divisor;
        uint8_t code = level_code(midpoints, v);
        codes[i / 2] = i % 2 ? (uint8_t)((codes[i / 2] & 0xf0) | code) : (uint8_t)(code << 4 | 7);
    }
}

// ---- the 8-bit absmax codes ------------------------------------------------------------------

// quantize_cpu's code for v (a block's absmax less the offset, times its group's 1 / absmax).
// Its table maps grid point i, the fp32 value 2 i / 65535 - 1, to the count of map midpoints
// (fp32 0.5 (m[j] + m[j+1])) below it; v takes grid point (v + 1) * 0.5 * 65535 + 0.5
// truncated, the last multiply-add fused into one fma as the shipped x86-64 library computes
// it (its -ffp-contract default; unfused, every float in [-1, 1] would take the same code:
// checked exhaustively).
static uint8_t dynamic_code(const float midpoints[255], float v) {
    v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;  // std::clamp: a NaN stays
    float point = fmaf((v + 1.0f) * 0.5f, 65535.0f, 0.5f);
    // NaN: x86's cvttss2si gives 0x80000000, which the cast to uint16_t cuts to 0.
    float grid = 2.0f * (float)(point >= 0.0f ? (uint32_t)point : 0) / 65535.0f - 1.0f;
    size_t lo = 0, hi = 255;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (midpoints[mid] < grid) lo = mid + 1;
        else hi = mid;
    }
    return (uint8_t)lo;
}

// Each group of NF4_GROUP block absmaxes less the offset, scaled by its absmax onto the map.
// quantize_cpu's absmax is std::max over |a - offset| from 0, so a NaN never wins; a group whose
// absmax is 0 gets codes 0.
static void quantize_absmaxes(float *group_absmax, uint8_t *absmax_codes, const float *x,
                              size_t n, float offset) {
    float midpoints[255];
    for (size_t j = 0; j < 255; j++) midpoints[j] = 0.5f * (DYNAMIC_MAP[j] + DYNAMIC_MAP[j + 1]);
    size_t blocks = nf4_blocks(n);
    for (size_t g = 0; g < nf4_groups(n); g++) {
        size_t start = g * NF4_GROUP, end = start + NF4_GROUP < blocks ? start + NF4_GROUP : blocks;
        float absmax = 0.0f;
        for (size_t b = start; b < end; b++) {
            float a = fabsf(block_absmax(x, n, b) - offset);
            if (absmax < a) absmax = a;
        }
        group_absmax[g] = absmax;
        float inverse = 1.0f / absmax;
        for (size_t b = start; b < end; b++) {
            float v = (block_absmax(x, n, b) - offset) * inverse;
            absmax_codes[b] = absmax == 0.0f ? 0 : dynamic_code(midpoints, v);
        }
    }
}

// ---- the blob ----------------------------------------------------------------------------------

void nf4_quantize(uint8_t *blob, const float *x, size_t n) {
    size_t codes_end = nf4_codes_at(n) + (n + 1) / 2;
    memset(blob + codes_end, 0, nf4_bytes(n) - codes_end);
    float offset = absmax_mean(x, n);  // n = 0: NaN, torch's mean of nothing
    memcpy(blob, &offset, sizeof offset);
    quantize_absmaxes((float *)(blob + nf4_group_absmax_at()), blob + nf4_absmax_codes_at(n), x, n,
                      offset);
    float midpoints[15];
    for (size_t j = 0; j < 15; j++) midpoints[j] = (NF4_LEVELS[j] + NF4_LEVELS[j + 1]) / 2;
    // Blocks of an even NF4_BLOCK elements own whole bytes of the codes: each thread its own.
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t b = 0; b < nf4_blocks(n); b++)
        quantize_block(blob + nf4_codes_at(n), midpoints, x, n, b);
}

// x (count) = elements [first, first + count) of the blob of n elements, dequantized block run
// by block run.
static void dequantize_run(float *x, const uint8_t *blob, size_t n, size_t first, size_t count) {
    float offset;
    memcpy(&offset, blob, sizeof offset);
    const float *group_absmax = (const float *)(blob + nf4_group_absmax_at());
    const uint8_t *absmax_codes = blob + nf4_absmax_codes_at(n), *codes = blob + nf4_codes_at(n);
    for (size_t i = first, end = first + count; i < end;) {
        size_t b = i / NF4_BLOCK, stop = (b + 1) * NF4_BLOCK < end ? (b + 1) * NF4_BLOCK : end;
        float absmax =
            nf4_absmax(DYNAMIC_MAP, absmax_codes[b], group_absmax[b / NF4_GROUP], offset);
        if (i % 2) x[i - first] = nf4_value(NF4_LEVELS, codes[i / 2], i, absmax), i++;
        // whole bytes, both their elements: a loop that vectorizes (one per element did not)
        size_t pairs = (stop - i) / 2;
        const uint8_t *bytes = codes + i / 2;
        float *out = x + (i - first);
#pragma omp simd
        for (size_t p = 0; p < pairs; p++) {
            out[2 * p] = NF4_LEVELS[bytes[p] >> 4] * absmax;
            out[2 * p + 1] = NF4_LEVELS[bytes[p] & 0xf] * absmax;
        }
        for (i += 2 * pairs; i < stop; i++)
            x[i - first] = nf4_value(NF4_LEVELS, codes[i / 2], i, absmax);
    }
}

void nf4_dequantize(float *x, const uint8_t *blob, size_t n) {
    nf4_dequantize_box(x, blob, n, NF4_BLOCK, 0, 0, nf4_blocks(n), NF4_BLOCK);
}

void nf4_dequantize_box(float *x, const uint8_t *blob, size_t n, size_t cols, size_t first_row,
                        size_t first_col, size_t rows, size_t box_cols) {
#pragma omp parallel for schedule(static) if (rows * box_cols >= 65536)
    for (size_t r = 0; r < rows; r++) {
        size_t first = (first_row + r) * cols + first_col;
        if (first >= n) continue;  // past a whole blob's last short block
        size_t count = first + box_cols <= n ? box_cols : n - first;
        dequantize_run(x + r * box_cols, blob, n, first, count);
    }
}
