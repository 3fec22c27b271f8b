// The tile kernels' multiply-add term (small_gemm.c, attention_flash_bf16.c): one word of a,
// broadcast, against 16 words of b, into 16 fp32 sums, as fp32, as bf16 pairs by fused
// multiply-adds, or as bf16 pairs by vdpbf16ps. Each kernel instantiates its loops once per
// term (a constant argument of always-inline functions) and picks one for the cpu at run time.
#pragma once

#include <stdint.h>
#include <string.h>

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
