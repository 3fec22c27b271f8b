// Private to the cpu backend: the functions behind kernels_cpu (semantics in kernels/ops.def)
// and the few inline helpers the op files share.
#pragma once

#include <stdint.h>
#include <string.h>

#include "core/errors.h"
#include "kernels/kernels.h"

extern const KernelOps kernels_cpu;

// cpu_NAME for each op NAME of kernels/ops.def.
#define KERNEL_OP(ret, op, params) ret cpu_##op params;
#include "kernels/ops.def"

// The default build is for any x86-64 (CI runs on whatever it gets), where the hot loops would
// be SSE without fused multiply-adds: GCC builds a function marked CPU_CLONES again for AVX2
// with FMA and for AVX-512 and picks one for the cpu at load time (as OpenBLAS picks its
// kernels), OpenMP regions inside included. Only for functions whose results do not depend on
// the vector width (no sum across a vector's lanes; files compiled with -ffp-contract=fast
// differ only on a cpu without fused multiply-adds). NATIVE=1 builds everything for the cpu it
// runs on instead.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__AVX512F__)
#define CPU_CLONES \
    __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define CPU_CLONES
#endif

// ---- bf16 compute (gemm_bf16.c) ----------------------------------------------------------
// Starts oneDNN for KernelInit.precision bf16: from then on matmul and grouped_matmul round their
// inputs to bf16 and accumulate in fp32. false with a one-line reason when it cannot.
bool cpu_gemm_bf16_start(char *why, size_t len);
bool cpu_gemm_bf16_on(void);
// True when oneDNN has no bf16 matmul for this cpu: callers then round with
// cpu_gemm_bf16_round_floats and run sgemm (the same numbers), else cpu_gemm_bf16_round and
// cpu_gemm_bf16.
bool cpu_gemm_bf16_emulated(void);
// What runs on this cpu: "oneDNN VERSION bf16 matmul (IMPLEMENTATION), attention fp32", or the
// emulation's line.
const char *cpu_gemm_bf16_kernels(void);
// x (n) rounded to bf16 (nearest even) into scratch slot 0 or 1, as bf16 or as the floats they
// are; the slot grows to the largest call seen and is overwritten by the next call for the
// slot. Call outside OpenMP regions.
uint16_t *cpu_gemm_bf16_round(int slot, const float *x, size_t n);
float *cpu_gemm_bf16_round_floats(int slot, const float *x, size_t n);
// bf16 x (n) as floats, into scratch slot 0 or 1 as above: bf16 operands where oneDNN has none.
float *cpu_gemm_bf16_widen(int slot, const uint16_t *x, size_t n);
// c (m, n) = op(a) op(b) + beta c in fp32 from bf16 a and b, dense as in cpu_matmul, k >= 1.
// runtime_rows: the primitive serves any count of a's rows (m, or k when trans_a), for the
// grouped GEMM's groups. Callable inside OpenMP regions (single-threaded there).
void cpu_gemm_bf16(float *c, const uint16_t *a, const uint16_t *b, int m, int n, int k,
                   bool trans_a, bool trans_b, float beta, bool runtime_rows);

// ---- fp32 GEMM (sgemm.c) ---------------------------------------------------------------------
// c (m, n) = alpha op(a) op(b) + beta c, row-major with leading dimensions as BLAS's; with
// beta == 0 c is not read; k == 0 is an empty sum. Callable inside OpenMP regions
// (single-threaded there).
void cpu_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
               int lda, const float *b, int ldb, float beta, float *c, int ldc);

// ---- attention's tile GEMMs (small_gemm.c) ---------------------------------------------------
// c (m, round16(n)) = alpha op(a) b (+ c when accumulate) in fp32, over k words: a word is a
// float, or with bf16 two bf16 of consecutive k (even k in the low half; an odd k's last word
// pairs it with a zero). op(a) (m, k words) is a or, with trans_a, a^T (a's rows lda words apart
// either way); b (k, round16(n) words) rows ldb words apart, c's ldc floats. With bf16, b's
// word (p, j) holds b's elements (2p, j) and (2p + 1, j) (oneDNN's VNNI layout), as does a's
// under trans_a. The columns from n up to the next multiple of 16 are computed too (b must
// hold them; c gets them). Single-threaded: attention calls it inside its OpenMP region.
typedef struct SmallGemm {
    int m, n, k;
    float alpha;
    bool accumulate, trans_a, bf16;
    const void *a;
    size_t lda;
    const void *b;
    size_t ldb;
    float *c;
    size_t ldc;
} SmallGemm;
void cpu_small_gemm(const SmallGemm *g);
// Whether bf16 tile GEMMs run on vdpbf16ps (avx512_bf16), else on fused multiply-adds.
bool cpu_small_gemm_dpbf16(void);

// ---- grouped GEMM (grouped_matmul.c) ----------------------------------------------------------
// cpu_grouped_matmul in fp32 whatever the compute dtype: the float8 emulation's GEMM of decoded
// operands (which it keeps exact, as matmul_float8's sgemm does).
void cpu_grouped_matmul_fp32(float *c, const float *a, const float *b, const int *offsets,
                             int groups, int n, int k, bool trans_a, bool trans_b, float beta);

// ---- bf16 attention's fused forward (attention_flash_bf16.c) ----------------------------------
// 16 query rows of one head (lane i of every vector: row i) against keys [0, n): online
// softmax, P in bf16, o and the statistics fp32. A row sees key j when j < keys[i] (by
// position) and, with kv_doc, kv_doc[j] == q_doc[i]; rows past the block's get keys 0.
typedef struct FlashRows {
    const uint32_t *q;  // (words, 16): the rows' q as bf16 words along head_dim
    const uint32_t *k;  // (round16(n), words): each key's bf16 words along head_dim
    const uint32_t *v;  // (round16(n) / 2, ld_v words): v's words across keys 2t and 2t + 1
    size_t ld_v;
    int words, head_dim, n;
    float scale;
    const int *keys, *q_doc, *kv_doc;  // [16], [16] and [n]; kv_doc NULL: no document mask
    float *o;      // (head_dim, 16): out: sum_j P_j v_j per row, not yet divided by l
    float *m, *l;  // [16]: out: each row's max score and sum of exp(score - max); l 0: none seen
} FlashRows;
void cpu_attention_flash_bf16(const FlashRows *f);

// ---- attention's bf16 backward softmax rows (attention_bf16_rows.c) --------------------------
// Whole vectors of 16 keys at a time, the lanes past a row's n keys 0 (no scalar remainder on
// a causal tile's ragged rows), ws (a multiple of 16) wide, zeros past the vectors; two rows
// of a tile at a time. p0, p1 = exp(S - lse) in place (fp32, for dS) and pt (ws words) = P's
// words across the two rows (P^T as dV's a).
void cpu_attention_probs_rows_bf16(float *p0, float *p1, float lse0, float lse1, int n0, int n1,
                                   uint32_t *pt, int ws);
// dS = P o (dP - D) of the two rows: along each row as bf16 (ds0, ds1: dQ's a) and across them
// as words (dst: dK's a).
void cpu_attention_dscores_rows_bf16(const float *p0, const float *p1, const float *dp0,
                                     const float *dp1, float d0, float d1, int n0, int n1,
                                     uint16_t *ds0, uint16_t *ds1, uint32_t *dst, int ws);

// max of x[0..n), n >= 1: the shift that makes softmax and log-sum-exp overflow-free.
float cpu_max_floats(const float *x, int n);

// exp(x), accurate to a few float ulps, written so that `omp simd` loops calling it vectorise:
// glibc's expf is a scalar call, which makes softmax, cross-entropy and SiLU several times
// slower than the GEMMs around them. Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then
// the Cephes expf polynomial. 2^n comes from the low mantissa bits of x log2(e) + 1.5 * 2^23
// (which hold round(x log2(e)) as an integer), in unsigned arithmetic so that any x is
// defined behaviour; out-of-range x is then fixed up with bit masks, not branches: GCC sinks
// the arithmetic under a branch and, with trapping math (the default), will not if-convert
// it back. Above x = 88.0 it returns +inf (true overflow is at 88.72); the kernels only take
// exp of x <= 0. Inline because it must inline to vectorise.
static inline float cpu_expf(float x) {
    const float round_magic = 12582912.0f;
    float t = x * 1.44269504f + round_magic;
    float n = t - round_magic;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 127u) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    float y = p * two_n;
    uint32_t y_bits;
    memcpy(&y_bits, &y, sizeof y_bits);
    uint32_t underflow = -(uint32_t)(x < -87.3f), overflow = -(uint32_t)(x > 88.0f);
    y_bits = (y_bits & ~(underflow | overflow)) | (overflow & 0x7f800000u); // 0 or +inf
    memcpy(&y, &y_bits, sizeof y);
    return y;
}
