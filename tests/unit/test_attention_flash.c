// kernels/cpu/attention_flash_bf16.c, bf16 attention's fused forward for 16 query rows: its
// o / l, m and l against attention in double over the same bf16 q, k and v (within bf16's
// error: P is rounded to bf16 relative to the running max), every mask the kernel takes (each
// row's prefix of keys, documents, rows that see nothing), head_dim odd (a zero-padded pair)
// and wider than a vector, key counts off the 16-key step. Its file is included (its paths are
// static), so both ways it runs are checked on this cpu: fused multiply-adds always, and
// vdpbf16ps with vcvtne2ps2bf16 where the cpu has avx512_bf16, bit for bit the same.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>

#include "core/bf16.h"
#include "kernels/cpu/attention_flash_bf16.c"
#include "tests/unit/kernel_check.h"

#define FLASH_TOL 1e-2  // bf16 P (8 bits), normalised by the largest output

// With fused multiply-adds, as the AVX2 and AVX-512 builds run it where the cpu has no
// avx512_bf16 (the default build is for any x86-64, which has none).
#ifndef __FMA__
__attribute__((target("arch=x86-64-v3")))
#endif
static void run_fma(const FlashRows *f) {
    flash_rows(f, TERM_BF16);
}

typedef struct {
    int hd, n, words;
    uint32_t *q, *k, *v;  // the kernel's layouts (FlashRows)
    int keys[16], q_doc[16], *kv_doc;
    float o[16 * 64], m[16], l[16];
} Case;

static uint32_t random_pair(void) {
    return bf16_from_float((float)rng_uniform()) | (uint32_t)bf16_from_float((float)rng_uniform())
                                                       << 16;
}

// bf16 element c of a row of words (c past head_dim: the pair's zero).
static double half(const uint32_t *row, int c) {
    uint32_t w = row[c / 2];
    return bf16_to_float((uint16_t)(c % 2 ? w >> 16 : w & 0xffff));
}

// Rows' keys: a causal diagonal ending at n, with row 3 blind and rows 14, 15 past the block;
// or (full) every row seeing all n, where the steps before the last skip the mask.
static Case case_new(int hd, int n, bool documents, bool full) {
    Case c = {.hd = hd, .n = n, .words = (hd + 1) / 2};
    int W = c.words, n16 = (n + 15) / 16 * 16;
    c.q = malloc((size_t)W * 16 * sizeof *c.q);
    c.k = malloc(((size_t)n16 * W + 1) * sizeof *c.k);
    c.v = malloc(((size_t)n16 / 2 * 64 + 1) * sizeof *c.v);  // ld_v 64 words
    for (int i = 0; i < W * 16; i++) c.q[i] = random_pair();
    for (int i = 0; i < n16 * W; i++) c.k[i] = random_pair();
    for (int i = 0; i < n16 / 2 * 64; i++) c.v[i] = random_pair();
    if (hd % 2)  // the padded half of the last pair is zero in q and k, as attention.c builds
        for (int i = 0; i < 16; i++) c.q[(W - 1) * 16 + i] &= 0xffff;
    for (int j = 0; hd % 2 && j < n16; j++) c.k[(size_t)j * W + W - 1] &= 0xffff;
    c.kv_doc = documents ? malloc((size_t)n * sizeof *c.kv_doc) : NULL;
    for (int j = 0; documents && j < n; j++) c.kv_doc[j] = j < n / 3 ? 0 : 1;
    for (int i = 0; i < 16; i++) {
        c.keys[i] = full ? n : i >= 14 ? 0 : i == 3 ? 0 : n - 13 + i > 0 ? n - 13 + i : 0;
        c.q_doc[i] = documents ? i % 2 : 0;
    }
    return c;
}

static FlashRows case_rows(Case *c) {
    return (FlashRows){.q = c->q, .k = c->k, .v = c->v, .ld_v = 64, .words = c->words,
                       .head_dim = c->hd, .n = c->n, .scale = 0.7f, .keys = c->keys,
                       .q_doc = c->q_doc, .kv_doc = c->kv_doc, .o = c->o, .m = c->m,
                       .l = c->l};
}

static void case_free(Case *c) { free(c->q), free(c->k), free(c->v), free(c->kv_doc); }

static void check_reference(Case *c) {
    int W = c->words;
    double worst = 0.0, largest = 0.0;
    for (int i = 0; i < 16; i++) {
        double s[256], mx = -INFINITY, sum = 0.0, qrow[64];
        for (int x = 0; x < c->hd; x++) {
            uint32_t w = c->q[(x / 2) * 16 + i];
            qrow[x] = bf16_to_float((uint16_t)(x % 2 ? w >> 16 : w & 0xffff));
        }
        for (int j = 0; j < c->n; j++) {
            bool sees = j < c->keys[i] && (!c->kv_doc || c->kv_doc[j] == c->q_doc[i]);
            double dot = 0.0;
            for (int x = 0; x < c->hd; x++) dot += qrow[x] * half(c->k + (size_t)j * W, x);
            s[j] = sees ? 0.7f * dot : -INFINITY;
            mx = fmax(mx, s[j]);
        }
        if (mx == -INFINITY) {  // sees nothing: l 0 and o 0
            assert_true(c->l[i] == 0.0f);
            for (int x = 0; x < c->hd; x++) assert_true(c->o[x * 16 + i] == 0.0f);
            continue;
        }
        assert_true(fabs(c->m[i] - mx) <= 1e-5 * fmax(1.0, fabs(mx)));
        for (int j = 0; j < c->n; j++) sum += exp(s[j] - mx);
        assert_true(fabs(c->l[i] * exp(c->m[i] - mx) - sum) <= 1e-5 * sum);
        for (int x = 0; x < c->hd; x++) {
            double want = 0.0;
            for (int j = 0; j < c->n; j++) {
                const uint32_t *pair = c->v + (size_t)(j / 2) * 64;
                uint32_t w = pair[x];
                double vx = bf16_to_float((uint16_t)(j % 2 ? w >> 16 : w & 0xffff));
                want += exp(s[j] - mx) / sum * vx;
            }
            double got = c->o[x * 16 + i] / c->l[i];
            worst = fmax(worst, fabs(got - want)), largest = fmax(largest, fabs(want));
        }
    }
    if (worst > FLASH_TOL * largest)
        fail_msg("head_dim %d, %d keys: o / l off by %g of %g", c->hd, c->n, worst, largest);
}

static void check_case(int hd, int n, bool documents, bool full) {
    Case c = case_new(hd, n, documents, full);
    FlashRows f = case_rows(&c);
    run_fma(&f);
    check_reference(&c);
    if (cpu_small_gemm_dpbf16()) {
        float o[16 * 64], m[16], l[16];
        memcpy(o, c.o, sizeof o), memcpy(m, c.m, sizeof m), memcpy(l, c.l, sizeof l);
        flash_rows_dpbf16(&f);
        assert_memory_equal(o, c.o, sizeof(float) * 16 * (size_t)hd);
        assert_memory_equal(m, c.m, sizeof m);
        assert_memory_equal(l, c.l, sizeof l);
    }
    case_free(&c);
}

static void test_flash_rows(void **state) {
    (void)state;
    rng_seed(11);
    if (!cpu_small_gemm_dpbf16())
        printf("this cpu has no avx512_bf16: the fused multiply-adds alone are checked\n");
    check_case(16, 256, false, false);
    check_case(16, 256, false, true);
    check_case(16, 37, true, false);
    check_case(15, 50, false, true);
    check_case(40, 70, true, false);
    check_case(64, 16, false, false);
    check_case(16, 0, false, false);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flash_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
