// float8 on the host: the two formats of float8 training (Micikevicius et al. 2022, "FP8
// Formats for Deep Learning"), bit for bit as ml_dtypes defines them.
//   e4m3fn: bias 7, 3 mantissa bits, max 448, no infinities, NaN only at 0x7f / 0xff.
//   e5m2:   bias 15, 2 mantissa bits, max 57344, IEEE-like: 0x7c infinity, 0x7d-0x7f NaN.
// Casts from float round to nearest even. Beyond max a saturating cast gives +-max (float8
// training: torchao clamps to +-max before the cast, infinities included); a non-saturating one
// gives what numpy's astype does with ml_dtypes: NaN for e4m3fn, infinity for e5m2. NaN casts
// to ml_dtypes' NaN code of the input's sign either way. Decoding is exact. (torch 2.15's
// .to(float8_e4m3fn) on the cpu saturates, infinities too: it is the saturating cast here; its
// NaN codes and decoded NaNs carry other bits.)
//
// Integer and float arithmetic and memcpy, no libm, so that the cpu kernels and the cuda ones
// (kernels/cuda/float8.cu) share these very functions: FLOAT8_HD makes them __host__
// __device__ under nvcc and is empty in C.
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FLOAT8_HD __host__ __device__
#else
#define FLOAT8_HD
#endif

typedef enum { FLOAT8_E4M3FN, FLOAT8_E5M2 } Float8Kind;

typedef struct {
    int man_bits;      // explicit mantissa bits
    int bias;          // exponent bias
    uint32_t max_code; // the largest finite magnitude (sign bit clear)
    uint32_t nan_code; // the NaN ml_dtypes casts to (sign bit clear)
    bool has_inf;      // max_code + 1 is infinity
} Float8Format;

static inline FLOAT8_HD Float8Format float8_format(Float8Kind kind) {
    Float8Format e4m3fn = {3, 7, 0x7e, 0x7f, false}, e5m2 = {2, 15, 0x7b, 0x7e, true};
    return kind == FLOAT8_E4M3FN ? e4m3fn : e5m2;
}

static inline FLOAT8_HD float float8_bits_to_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// A code's value is (implicit bit + mantissa) * 2^(exponent - bias - man_bits), with the
// exponent field 0 read as 1 and no implicit bit (subnormals). Both factors are exact floats,
// so is their product.
static inline FLOAT8_HD float float8_to_float(uint8_t code, Float8Kind kind) {
    Float8Format f = float8_format(kind);
    uint32_t sign = (uint32_t)(code & 0x80) << 24, mag = code & 0x7fu;
    if (mag > f.max_code)
        return float8_bits_to_float(sign | (f.has_inf && mag == f.max_code + 1 ? 0x7f800000u
                                                                               : 0x7fc00000u));
    uint32_t exponent = mag >> f.man_bits, mantissa = mag & ((1u << f.man_bits) - 1);
    uint32_t significand = exponent ? mantissa | (1u << f.man_bits) : mantissa;
    int scale = (exponent ? (int)exponent : 1) - f.bias - f.man_bits;  // >= -16: a normal float
    float value = (float)significand * float8_bits_to_float((uint32_t)(scale + 127) << 23);
    return sign ? -value : value;
}

// Rounds the float's significand (implicit bit included) to the format's mantissa bits at its
// exponent, or at the smallest normal exponent below it (the subnormals): the dropped bits
// round to nearest even, and a carry out of the mantissa steps the exponent up, which is where
// the next code's value is. Above max_code it has overflowed (fp32 infinity does too). No
// branch that returns early: a NaN's code is chosen last, so that a loop of casts vectorizes.
static inline FLOAT8_HD uint8_t float8_from_float(float x, Float8Kind kind, bool saturate) {
    Float8Format f = float8_format(kind);
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    uint32_t mag = bits & 0x7fffffffu;
    int exponent = (int)(mag >> 23);
    uint32_t significand = exponent ? (mag & 0x7fffffu) | 0x800000u : mag;
    int target = (exponent ? exponent : 1) - 127 + f.bias;  // biased exponent in the format
    int drop = 23 - f.man_bits + (target < 1 ? 1 - target : 0);
    if (drop > 25) drop = 25;  // everything dropped is below half the smallest subnormal
    uint32_t rounded =
        (significand + (1u << (drop - 1)) - 1 + ((significand >> drop) & 1)) >> drop;
    uint32_t code = ((uint32_t)(target > 1 ? target - 1 : 0) << f.man_bits) + rounded;
    if (code > f.max_code)
        code = saturate ? f.max_code : f.has_inf ? f.max_code + 1 : f.nan_code;
    if (mag > 0x7f800000u) code = f.nan_code;
    return sign | (uint8_t)code;
}

static inline FLOAT8_HD float float8_max(Float8Kind kind) {
    return float8_to_float((uint8_t)float8_format(kind).max_code, kind);
}

// torchao's amax floor (float8_utils.EPS): an all-zero tensor gets a finite scale.
#define FLOAT8_AMAX_EPS 1e-12

// The scale that maps a tensor's amax onto the format's max (x * scale is cast, the matmul
// output divided by it), as torchao's amax_to_scale computes it: max / max(amax, EPS) in double,
// rounded once to float. A NaN amax gives a NaN scale, as torch.clamp passes NaN through.
static inline FLOAT8_HD float float8_scale_from_amax(float amax, Float8Kind kind) {
    double floored = amax < FLOAT8_AMAX_EPS ? FLOAT8_AMAX_EPS : (double)amax;
    return (float)((double)float8_max(kind) / floored);
}

// torchao's _round_scale_down_to_power_of_2, exp2(floor(log2(scale))) in fp32 (the rowwise
// recipe's scales), without libm. scale = m 2^e, m in [1, 2), gives 2^e unless the fp32 log2,
// e + log2(m) rounded to nearest, has rounded up to the integer t = e + 1: then 2^t (above the
// scale). That happens when the gap delta = t - (e + log2(m)) = -log2(1 - x), x = 1 - m/2, is
// under half the fp32 spacing at t on delta's side, at most 2^-17 for |t| <= 128; so only for
// x < 2^-17 (the top few dozen significands of a binade), where the series x + x^2/2 + x^3/3
// in double gives delta to far better than its distance from that half spacing. With a
// correctly rounded log2 this is exactly torch's result (equal to torch 1.13's on the cpu for
// every scale within 300 ulps below a power of two of every binade). 0 gives 0 and infinity
// infinity, as exp2(log2(.)) does; NaN and negative scales (never made) give NaN.
static inline FLOAT8_HD float float8_round_scale_pow2(float scale) {
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    if (scale != scale || (bits >> 31 && scale != 0)) return float8_bits_to_float(0x7fc00000u);
    if (scale == 0 || bits == 0x7f800000u) return scale;
    int e = (int)(bits >> 23) - 127;
    uint32_t significand = bits & 0x7fffffu;
    if (e == -127) {  // subnormal: normalise the significand to 24 bits
        for (e = -126; significand < 0x800000u; e--) significand <<= 1;
    } else {
        significand |= 0x800000u;
    }
    int t = e + 1;
    uint32_t k = 0x1000000u - significand;  // x = k 2^-24
    if (t != 0 && k < 0x100u) {
        int at = t > 0 ? t : -t, q = 0;
        while ((2 << q) <= at) q++;                    // 2^q <= |t| < 2^(q+1)
        if (t > 0 && at == (1 << q)) q--;              // the floats below a power of two
        double half_gap = 1.0, x = (double)k / 16777216.0;
        for (int i = q - 24; i < 0; i++) half_gap *= 0.5;  // 2^(q-24)
        double delta = (x + x * x / 2 + x * x * x / 3) * 1.4426950408889634;  // / ln 2
        if (delta < half_gap) e = t;
    }
    uint32_t out = e >= 128 ? 0x7f800000u : e >= -126 ? (uint32_t)(e + 127) << 23
                                                       : 1u << (e + 149);
    return float8_bits_to_float(out);
}
