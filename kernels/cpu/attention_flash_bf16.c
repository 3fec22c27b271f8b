// bf16 attention's forward for 16 query rows of one head at a time, fused as FlashAttention-2
// (Dao 2023) runs it: a vector's 16 lanes are the 16 rows, so each key's scores for them are
// one vector, the softmax's running max and sum are per lane (no reduction across a vector),
// and the scores, P and P V never leave the registers and the (head_dim, 16) accumulator:
// 16 keys at a time, S = scale q k^T by vdpbf16ps on q's words against each key's, the running
// max raised and what was summed rescaled, P = exp(S - max) rounded to bf16 pairs of keys, and
// o = alpha o + P v by vdpbf16ps against v's words across the same pairs (P rounded by
// vcvtne2ps2bf16 as bf16_from_float rounds it: P is 0 or normal, cpu_expf returning 0 below
// 2^-126). attention.c's tiled
// forward (fp32's) stores a tile's (64, keys) scores, reads them for the row maxima, again for
// the exps, and P again for P v: on the debug model (head_dim 16, one thread of an AMD EPYC)
// this forward takes 31% less time than those tiles under bf16 did.
//
// Numerics as cuDNN's flash attention: bf16 q, k, v and P, fp32 sums, softmax and statistics,
// P relative to the running max (rounded before the final max is known, as on the GPU).
// Compiled with -ffp-contract=fast (the Makefile) as attention_bf16_rows.c: the exps fused.
#include <math.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/small_gemm_term.h"

#define FLASH_KEYS 16  // keys per step: 16 sums in flight hide vdpbf16ps's latency

static inline __attribute__((always_inline)) void flash_rows(const FlashRows *f,
                                                             const SmallGemmTerm TERM) {
    // keys before first_masked are seen by every row: their steps skip the mask
    int W = f->words, hd = f->head_dim, first_masked = f->n, last = 0;
    float m[16], l[16], alpha[16], shift[16];
    int doc[16];
    for (int i = 0; i < 16; i++) {
        m[i] = -INFINITY, l[i] = 0.0f, doc[i] = f->kv_doc ? f->q_doc[i] : 0;
        first_masked = f->keys[i] < first_masked ? f->keys[i] : first_masked;
        last = f->keys[i] > last ? f->keys[i] : last;
    }
    if (f->kv_doc) first_masked = 0;
    memset(f->o, 0, (size_t)hd * 16 * sizeof(float));
    for (int j0 = 0; j0 < last; j0 += FLASH_KEYS) {
        Vec16 acc[FLASH_KEYS];  // acc[k]: key j0 + k's scores for the 16 rows, in registers
#pragma GCC unroll 16
        for (int k = 0; k < FLASH_KEYS; k++) acc[k] = (Vec16){0};
        for (int p = 0; p < W; p++) {
            Words16 qv = *(const Words16 *)(f->q + (size_t)p * 16);
            const Word *kp = (const Word *)f->k + (size_t)j0 * W + p;
#pragma GCC unroll 16
            for (int k = 0; k < FLASH_KEYS; k++)
                small_gemm_term(&acc[k], kp[(size_t)k * W], &qv, TERM);
        }
        float sf[FLASH_KEYS][16] __attribute__((aligned(64)));  // the softmax's lanes, from them
#pragma GCC unroll 16
        for (int k = 0; k < FLASH_KEYS; k++) *(Vec16 *)sf[k] = acc[k];
        bool masked = j0 + FLASH_KEYS > first_masked;
        for (int k = 0; k < FLASH_KEYS; k++) {
            int j = j0 + k, dk = f->kv_doc && j < f->n ? f->kv_doc[j] : 0;
#pragma omp simd
            for (int i = 0; i < 16; i++) {
                float x = sf[k][i] * f->scale;
                bool sees = !masked || (j < f->keys[i] && doc[i] == dk);
                sf[k][i] = sees ? x : -INFINITY;
            }
        }
#pragma omp simd
        for (int i = 0; i < 16; i++) {  // raise the running max; what was summed scales by alpha
            float mx = m[i];
            for (int k = 0; k < FLASH_KEYS; k++) mx = sf[k][i] > mx ? sf[k][i] : mx;
            shift[i] = mx == -INFINITY ? 0.0f : mx;  // a row that has seen nothing yet: P 0
            alpha[i] = cpu_expf(m[i] - shift[i]);
            m[i] = mx;
        }
        for (int k = 0; k < FLASH_KEYS; k++)
#pragma omp simd
            for (int i = 0; i < 16; i++) sf[k][i] = cpu_expf(sf[k][i] - shift[i]);
#pragma omp simd
        for (int i = 0; i < 16; i++) {
            float sum = l[i] * alpha[i];
            for (int k = 0; k < FLASH_KEYS; k++) sum += sf[k][i];
            l[i] = sum;
        }
        Words16 pw[FLASH_KEYS / 2];  // P's words across pairs of keys, lane = row
        for (int t = 0; t < FLASH_KEYS / 2; t++) bf16_pairs16(&pw[t], sf[2 * t], sf[2 * t + 1], TERM);
        const Word *vp = (const Word *)f->v + (size_t)(j0 / 2) * f->ld_v;
        Vec16 scale_o = *(const Vec16 *)alpha;
        for (int c = 0; c < hd; c++) {
            Vec16 acc = {0}, *oc = (Vec16 *)(f->o + (size_t)c * 16);
#pragma GCC unroll 8
            for (int t = 0; t < FLASH_KEYS / 2; t++)
                small_gemm_term(&acc, vp[(size_t)t * f->ld_v + c], &pw[t], TERM);
            *oc = *oc * scale_o + acc;  // after the terms: one rounding either way they run
        }
    }
    memcpy(f->m, m, sizeof m), memcpy(f->l, l, sizeof l);
}

#if SMALL_GEMM_DPBF16
__attribute__((target("avx512f,avx512bw"))) static void flash_rows_dpbf16(const FlashRows *f) {
    flash_rows(f, TERM_DPBF16);
}
#else
static void flash_rows_dpbf16(const FlashRows *f) { flash_rows(f, TERM_BF16); }
#endif

CPU_CLONES void cpu_attention_flash_bf16(const FlashRows *f) {
    if (cpu_small_gemm_dpbf16())
        flash_rows_dpbf16(f);
    else
        flash_rows(f, TERM_BF16);
}
