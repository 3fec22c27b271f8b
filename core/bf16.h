// bfloat16 on the host: the top 16 bits of an IEEE float, rounded to nearest even. The cpu
// backend's casts and the MPI reduction of bf16 buffers share these two.
#pragma once

#include <stdint.h>
#include <string.h>

// A NaN becomes the quiet NaN of its sign, as in ml_dtypes (and Eigen): rounding could
// otherwise carry its payload into infinity.
static inline uint16_t bf16_from_float(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

// A bf16 word: the pair (lo, hi) of consecutive elements, lo in the lower half (little-endian,
// as oneDNN's VNNI layout and vdpbf16ps pair them). Loops of it over floats vectorise.
static inline uint32_t bf16_word(float lo, float hi) {
    return (uint32_t)bf16_from_float(lo) | (uint32_t)bf16_from_float(hi) << 16;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
