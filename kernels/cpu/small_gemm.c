// The attention tiles' GEMMs: products whose inner dimension (head_dim) or row count (a tile's
// 64 queries) is small, called single-threaded inside attention's OpenMP region thousands of
// times per step. A BLAS call there spends more time packing and dispatching than multiplying
// (measured with perf on the debug model, head_dim 16: OpenBLAS's packing and small-K kernels
// were two thirds of attention's time); here b is already in the layout the loop wants, so
// nothing is packed: each output row block lives in registers while a's words are broadcast
// against b's rows, 16 words (one AVX-512 register) at a time.
//
// fp32 sums run over k in order with one fused multiply-add per term, then c = alpha sum, or
// alpha sum + c in one more fused multiply-add: the order and rounding of OpenBLAS's AVX-512
// sgemm kernels, which attention called before, so the debug model's fp32 losses stayed the
// same to the bit (scripts/bench_peer.sh's run, on an AMD EPYC). On the step, attention went
// from 86 ms to 70 ms (with attention.c's causal slabs and per-head panels).
//
// bf16 sums take a word (two bf16 of k and k + 1) per step as vdpbf16ps does: k + 1's product
// added first, then k's, each rounded to fp32 (bf16 products are exact in fp32). Where the cpu
// has avx512_bf16 the instruction does it (twice the multiply-adds per cycle: 206 against 112
// GFLOP/s on one Zen 5 core); elsewhere two fused multiply-adds do, the same numbers except
// for subnormals, which the instruction flushes to zero.
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/small_gemm_term.h"

// ROWS rows x VECS vectors of c from a's rows [i, i + ROWS) and b's columns [j, j + 16 VECS).
// Constant ROWS, VECS, TRANS_A, ACCUMULATE and TERM (the function always inlines) keep the
// accumulators in registers and a's addresses to one base register per four rows (a) or one
// in all (a^T).
// (Every loop over ROWS or VECS unrolls, at -O2 too, or the accumulators live on the stack.)
static inline __attribute__((always_inline)) void small_gemm_block(
    const SmallGemm *g, int i, int j, const int ROWS, const int VECS, const bool TRANS_A,
    const bool ACCUMULATE, const SmallGemmTerm TERM) {
    // a's rows as one base per four rows, the others at 1-3 lda from it: what x86 addressing
    // reaches with few registers (a pointer per row spills).
    size_t lda = g->lda;
    const Word *a0 = (const Word *)g->a + (TRANS_A ? (size_t)i : i * lda), *quad[4];
    const uint32_t *b = g->b;
#pragma GCC unroll 16
    for (int q = 0; q < 4; q++) quad[q] = a0 + 4 * q * lda;
    Vec16 acc[16][2] __attribute__((aligned(64)));  // [ROWS][VECS] used
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 16
        for (int v = 0; v < VECS; v++) acc[r][v] = (Vec16){0};
    for (int p = 0; p < g->k; p++) {
        Words16 bv[2];
#pragma GCC unroll 16
        for (int v = 0; v < VECS; v++)
            bv[v] = *(const Words16 *)(b + (size_t)p * g->ldb + j + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; r++) {
            uint32_t a = TRANS_A ? a0[p * lda + r] : quad[r / 4][(r % 4) * lda + p];
#pragma GCC unroll 16
            for (int v = 0; v < VECS; v++) small_gemm_term(&acc[r][v], a, &bv[v], TERM);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 16
        for (int v = 0; v < VECS; v++) {
            // ACCUMULATE is a constant so that each instantiation has one of these: GCC
            // shares alpha * acc between the two when both are there, and leaves + c unfused.
            Vec16 *c = (Vec16 *)(g->c + (size_t)(i + r) * g->ldc + j + 16 * v);
            *c = ACCUMULATE ? g->alpha * acc[r][v] + *c : g->alpha * acc[r][v];
        }
}

// c's columns in 2-vector strips, blocks of 8 rows (16 accumulators), then a 1-vector strip
// (head_dim 16's only one) in blocks of 16 rows; the rows left over in blocks of 4 and 1.
// Measured on one core of an AMD EPYC (Zen 5) at the debug model's tile shapes: 8 rows x 2
// vectors runs q k^T at 1.7x the speed of 4 x 2, and 16 x 1 runs P v 1.3x faster than 8 x 1:
// fewer independent sums than that leave the FMA unit waiting on their latency.
static inline __attribute__((always_inline)) void small_gemm(const SmallGemm *g,
                                                             const bool TRANS_A,
                                                             const bool ACCUMULATE,
                                                             const SmallGemmTerm TERM) {
    int n16 = (g->n + 15) / 16 * 16, j = 0;
    for (; j + 32 <= n16; j += 32) {
        int i = 0;
        for (; i + 8 <= g->m; i += 8) small_gemm_block(g, i, j, 8, 2, TRANS_A, ACCUMULATE, TERM);
        for (; i + 4 <= g->m; i += 4) small_gemm_block(g, i, j, 4, 2, TRANS_A, ACCUMULATE, TERM);
        for (; i < g->m; i++) small_gemm_block(g, i, j, 1, 2, TRANS_A, ACCUMULATE, TERM);
    }
    if (j < n16) {
        int i = 0;
        for (; i + 16 <= g->m; i += 16) small_gemm_block(g, i, j, 16, 1, TRANS_A, ACCUMULATE, TERM);
        for (; i + 4 <= g->m; i += 4) small_gemm_block(g, i, j, 4, 1, TRANS_A, ACCUMULATE, TERM);
        for (; i < g->m; i++) small_gemm_block(g, i, j, 1, 1, TRANS_A, ACCUMULATE, TERM);
    }
}

// The instantiation for g's orientation and accumulation.
static inline __attribute__((always_inline)) void small_gemm_for(const SmallGemm *g,
                                                                 const SmallGemmTerm TERM) {
    if (g->trans_a && g->accumulate)
        small_gemm(g, true, true, TERM);
    else if (g->trans_a)
        small_gemm(g, true, false, TERM);
    else if (g->accumulate)
        small_gemm(g, false, true, TERM);
    else
        small_gemm(g, false, false, TERM);
}

#if SMALL_GEMM_DPBF16
bool cpu_small_gemm_dpbf16(void) {
    static int has = -1;  // known after the first call
    int known = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (known < 0) {
        known = __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&has, known, __ATOMIC_RELAXED);
    }
    return known;
}

// vdpbf16ps needs AVX-512 registers, not GCC's avx512bf16 target.
__attribute__((target("avx512f"))) static void small_gemm_dpbf16(const SmallGemm *g) {
    small_gemm_for(g, TERM_DPBF16);
}
#else
bool cpu_small_gemm_dpbf16(void) { return false; }
static void small_gemm_dpbf16(const SmallGemm *g) { small_gemm_for(g, TERM_BF16); }
#endif

CPU_CLONES void cpu_small_gemm(const SmallGemm *g) {
    if (g->bf16 && cpu_small_gemm_dpbf16()) {
        small_gemm_dpbf16(g);
        return;
    }
    if (g->bf16)
        small_gemm_for(g, TERM_BF16);
    else
        small_gemm_for(g, TERM_FP32);
}
