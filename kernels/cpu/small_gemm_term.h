// The tile kernels' multiply-add term (small_gemm.c, attention_flash_bf16.c): one word of a,
// broadcast, against 16 words of b, into 16 fp32 sums, as fp32, as bf16 pairs by fused
// multiply-adds, or as bf16 pairs by vdpbf16ps. Each kernel instantiates its loops once per
// term (a constant argument of always-inline functions) and picks one for the cpu at run time.
#pragma once

#include <stdint.h>
#include <string.h>

#include "core/bf16.h"

// 16 floats or 16 words, one AVX-512 register; aligned(4): loads and stores at any word;
// may_alias: they read the floats or the bf16 halves their callers wrote.
typedef float Vec16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t Words16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef uint32_t Word __attribute__((may_alias));  // one of a's words

// vdpbf16ps through inline assembly (an x86 instruction the assembler knows, needing no GCC
// target) where optimisation folds the terms' constants: at -O0 every term's branch would be
// compiled, the 512-bit operands too, in builds without AVX-512.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__OPTIMIZE__)
#define SMALL_GEMM_DPBF16 1
#else
#define SMALL_GEMM_DPBF16 0
#endif


typedef enum {
    TERM_FP32,     // a float times 16 floats
    TERM_BF16,     // two bf16 times 16 pairs, by fused multiply-adds
    TERM_DPBF16,   // the same by vdpbf16ps
} SmallGemmTerm;

static inline __attribute__((always_inline)) float word_float(uint32_t w) {
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

// *acc += a b for one word of a (broadcast) against 16 of b (pointers: vectors passed by
// value would change the ABI between the builds for each instruction set).
static inline __attribute__((always_inline)) void small_gemm_term(Vec16 *acc, uint32_t a,
                                                                  const Words16 *b,
                                                                  const SmallGemmTerm TERM) {
    if (TERM == TERM_FP32) {
        *acc += word_float(a) * (Vec16)*b;
    } else if (TERM == TERM_BF16) {  // a bf16's float is its bits in the high half
        *acc += word_float(a & 0xffff0000u) * (Vec16)(*b & 0xffff0000u);
        *acc += word_float(a << 16) * (Vec16)(*b << 16);
    } else {
#if SMALL_GEMM_DPBF16
        Words16 a16 = (Words16){0} + a;
        __asm__("vdpbf16ps %2, %1, %0" : "+v"(*acc) : "v"(*b), "v"(a16));
#endif
    }
}

// ---- bf16 rounding, 16 floats at a time ------------------------------------------------------

typedef uint16_t Halves32 __attribute__((vector_size(64), aligned(2), may_alias));

// Where vdpbf16ps runs, so does vcvtne2ps2bf16: one instruction rounds two vectors of floats
// to bf16 where bf16_from_float takes eight integer operations on each. It flushes subnormals
// to zero, as vdpbf16ps does on its inputs, and keeps a NaN's payload where bf16_from_float
// makes it the quiet NaN; every other float rounds the same either way.

// h (32 bf16) = lo's 16 floats, then hi's.
static inline __attribute__((always_inline)) void bf16_halves32(Halves32 *h, const float *lo,
                                                                const float *hi,
                                                                const SmallGemmTerm TERM) {
    (void)TERM;  // without the assembly, one way
#if SMALL_GEMM_DPBF16
    if (TERM == TERM_DPBF16) {
        __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(*h) : "v"(*(const Vec16 *)hi),
                "v"(*(const Vec16 *)lo));
        return;
    }
#endif
    uint16_t *x = (uint16_t *)h;
#pragma omp simd
    for (int i = 0; i < 16; i++) x[i] = bf16_from_float(lo[i]), x[16 + i] = bf16_from_float(hi[i]);
}

// w (16 words) = (lo[i], hi[i]): the pairs across two rows of 16 a bf16 GEMM operand takes.
static inline __attribute__((always_inline)) void bf16_pairs16(Words16 *w, const float *lo,
                                                               const float *hi,
                                                               const SmallGemmTerm TERM) {
    (void)TERM;
#if SMALL_GEMM_DPBF16
    if (TERM == TERM_DPBF16) {
        Halves32 h;
        bf16_halves32(&h, lo, hi, TERM);
        // __builtin_shufflevector: GCC's (12 on) and clang's, which the fuzz build uses
        *w = (Words16)__builtin_shufflevector(h, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6,
                                              22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                              13, 29, 14, 30, 15, 31);
        return;
    }
#endif
    uint32_t *x = (uint32_t *)w;
#pragma omp simd
    for (int i = 0; i < 16; i++) x[i] = bf16_word(lo[i], hi[i]);
}
