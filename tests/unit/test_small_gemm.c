// kernels/cpu/small_gemm.c, attention's tile GEMMs, bit for bit against scalar loops that say
// what they promise: fp32 sums in k order with one fused multiply-add per term, then alpha sum
// (+ c in one more); bf16 sums a word at a time, the high bf16's product first. Its file is
// included (its terms are static), so both bf16 ways are checked on this cpu: the fused
// multiply-adds always, and vdpbf16ps, bit for bit the same on inputs without subnormals,
// where the cpu has avx512_bf16. Every block shape and leftover (16 x 1, 8 x 2, 4 x n, 1 x n),
// a in both orientations, accumulate or not, k 0 to 37 words. And small_gemm_term.h's bf16
// rounding by vcvtne2ps2bf16 against bf16_from_float, on every kind of float.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "core/bf16.h"
#include "kernels/cpu/small_gemm.c"
#include "tests/unit/kernel_check.h"

static int round16(int n) { return (n + 15) / 16 * 16; }

// a word of a or b: a float, or two bf16 (the low half the lower k)
static uint32_t random_word(bool bf16) {
    if (!bf16) {
        float f = (float)rng_uniform();
        uint32_t w;
        memcpy(&w, &f, sizeof w);
        return w;
    }
    return bf16_from_float((float)rng_uniform()) |
           (uint32_t)bf16_from_float((float)rng_uniform()) << 16;
}

static uint32_t *words_random(size_t n, bool bf16) {
    uint32_t *w = malloc((n ? n : 1) * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++) w[i] = random_word(bf16);
    return w;
}

static float half_float(uint32_t w, bool high) {
    return bf16_to_float((uint16_t)(high ? w >> 16 : w & 0xffff));
}

static float word_value(uint32_t w) {
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

// c's element (i, j) as the kernels promise to compute it.
static float expected(const SmallGemm *g, int i, int j, float c_old) {
    const uint32_t *a = g->a, *b = g->b;
    float s = 0.0f;
    for (int p = 0; p < g->k; p++) {
        uint32_t aw = g->trans_a ? a[(size_t)p * g->lda + i] : a[(size_t)i * g->lda + p];
        uint32_t bw = b[(size_t)p * g->ldb + j];
        if (g->bf16) {
            s = fmaf(half_float(aw, true), half_float(bw, true), s);
            s = fmaf(half_float(aw, false), half_float(bw, false), s);
        } else {
            s = fmaf(word_value(aw), word_value(bw), s);
        }
    }
    return g->accumulate ? fmaf(g->alpha, s, c_old) : g->alpha * s;
}

// One shape through `run` (a way to run SmallGemm), every element of c compared bitwise.
static void check_shape(int m, int n, int k, bool trans_a, bool accumulate, bool bf16,
                        void (*run)(const SmallGemm *)) {
    int n16 = round16(n);
    size_t lda = (size_t)(trans_a ? m + 5 : k + 3), ldb = (size_t)n16 + 16, ldc = (size_t)n16 + 8;
    uint32_t *a = words_random((size_t)(trans_a ? k : m) * lda, bf16);
    uint32_t *b = words_random((size_t)(k ? k : 1) * ldb, bf16);
    float *c = floats_random((size_t)m * ldc, 1.0), *c0 = floats_copy(c, (size_t)m * ldc);
    SmallGemm g = {.m = m, .n = n, .k = k, .alpha = 0.3f, .accumulate = accumulate,
                   .trans_a = trans_a, .bf16 = bf16, .a = a, .lda = lda, .b = b, .ldb = ldb,
                   .c = c, .ldc = ldc};
    run(&g);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n16; j++) {
            float want = expected(&g, i, j, c0[(size_t)i * ldc + j]);
            float got = c[(size_t)i * ldc + j];
            if (memcmp(&got, &want, sizeof got)) {
                fail_msg("m %d n %d k %d trans_a %d accumulate %d bf16 %d: c[%d][%d] = %.9g, "
                         "want %.9g", m, n, k, trans_a, accumulate, bf16, i, j, got, want);
            }
        }
    free(a), free(b), free(c), free(c0);
}

static void check_all(bool bf16, void (*run)(const SmallGemm *)) {
    static const int M[] = {1, 3, 4, 7, 8, 16, 17, 33, 64}, N[] = {5, 16, 20, 32, 40, 48, 64},
                     K[] = {0, 1, 3, 16, 37};
    for (size_t im = 0; im < sizeof M / sizeof *M; im++)
        for (size_t in = 0; in < sizeof N / sizeof *N; in++)
            for (size_t ik = 0; ik < sizeof K / sizeof *K; ik++)
                for (int t = 0; t < 4; t++)
                    check_shape(M[im], N[in], K[ik], t & 1, t & 2, bf16, run);
}

static void run_public(const SmallGemm *g) { cpu_small_gemm(g); }

// With fused multiply-adds, as cpu_small_gemm's AVX2 and AVX-512 builds run it where the cpu
// has no avx512_bf16 (the default build is for any x86-64, which has none).
#ifndef __FMA__
__attribute__((target("arch=x86-64-v3")))
#endif
static void run_bf16_fma(const SmallGemm *g) {
    small_gemm_for(g, TERM_BF16);
}

static void test_fp32(void **state) {
    (void)state;
    rng_seed(1);
    check_all(false, run_public);
}

static void test_bf16_fused_multiply_adds(void **state) {
    (void)state;
    rng_seed(2);
    check_all(true, run_bf16_fma);
}

static void test_bf16_dpbf16(void **state) {
    (void)state;
    if (!cpu_small_gemm_dpbf16()) {
        printf("skipped: this cpu has no avx512_bf16 (the fused multiply-adds run instead)\n");
        return;
    }
    rng_seed(3);
    check_all(true, small_gemm_dpbf16);
}

// ---- bf16 rounding (small_gemm_term.h) --------------------------------------------------------

#if SMALL_GEMM_DPBF16
__attribute__((target("avx512f,avx512bw"))) static void halves_dpbf16(Halves32 *h,
                                                                      const float *lo,
                                                                      const float *hi) {
    bf16_halves32(h, lo, hi, TERM_DPBF16);
}

__attribute__((target("avx512f,avx512bw"))) static void pairs_dpbf16(Words16 *w, const float *lo,
                                                                     const float *hi) {
    bf16_pairs16(w, lo, hi, TERM_DPBF16);
}

// What vcvtne2ps2bf16 gives for x: bf16_from_float's rounding, but a subnormal flushed to the
// zero of its sign (a NaN is checked to stay one: its payload may differ).
static uint16_t rounded_by_instruction(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bool subnormal = (bits & 0x7f800000u) == 0 && (bits & 0x7fffffu) != 0;
    return subnormal ? (uint16_t)((bits >> 16) & 0x8000u) : bf16_from_float(x);
}

static void check_rounded(uint16_t got, float x, const char *what) {
    if (isnan(x)) {
        assert_true((got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0);
        return;
    }
    uint16_t want = rounded_by_instruction(x);
    if (got != want) fail_msg("%s of %a: %#06x, want %#06x", what, (double)x, got, want);
}

// Floats of every kind: ties to even both ways, the largest (rounding to infinity),
// infinities, zeros, subnormals, NaNs, and random ones across the exponents.
static float rounding_case(int i) {
    static const uint32_t edge[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f807fffu,
                                    0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x00000000u,
                                    0x80000000u, 0x00000001u, 0x807fffffu, 0x7fc00001u,
                                    0xffa00000u, 0x00800000u, 0x0080ffffu, 0x477fe000u};
    uint32_t bits = i < 16 ? edge[i] : (uint32_t)(rng_uniform() * 2147483648.0) * 2u + (i & 1);
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}
#endif

// Where the cpu has avx512_bf16, the instruction's rounding: bf16_from_float's but for
// subnormals; the halves and the pairs laid out as the GEMM operands take them.
static void test_bf16_rounding(void **state) {
    (void)state;
#if SMALL_GEMM_DPBF16
    if (!cpu_small_gemm_dpbf16()) {
        printf("skipped: this cpu has no avx512_bf16\n");
        return;
    }
    rng_seed(4);
    for (int block = 0; block < 64; block++) {
        float lo[16], hi[16];
        for (int i = 0; i < 16; i++)
            lo[i] = rounding_case(block * 32 + i), hi[i] = rounding_case(block * 32 + 16 + i);
        Halves32 h;
        Words16 w;
        halves_dpbf16(&h, lo, hi);
        pairs_dpbf16(&w, lo, hi);
        const uint16_t *hx = (const uint16_t *)&h;
        const uint32_t *wx = (const uint32_t *)&w;
        for (int i = 0; i < 16; i++) {
            check_rounded(hx[i], lo[i], "halves' lo");
            check_rounded(hx[16 + i], hi[i], "halves' hi");
            check_rounded((uint16_t)(wx[i] & 0xffff), lo[i], "pair's lo");
            check_rounded((uint16_t)(wx[i] >> 16), hi[i], "pair's hi");
        }
    }
#else
    printf("skipped: built without the instruction's inline assembly\n");
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32),
        cmocka_unit_test(test_bf16_fused_multiply_adds),
        cmocka_unit_test(test_bf16_dpbf16),
        cmocka_unit_test(test_bf16_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
