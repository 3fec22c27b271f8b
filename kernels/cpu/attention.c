// Grouped-query attention, FlashAttention-style (Dao et al. 2022): queries go in tiles of
// ATTN_TILE rows, each tile's scores against the keys it may see live only in a per-thread
// scratch, and backward recomputes the probabilities from the saved log-sum-exp instead of
// storing the (Tq, Tk) matrix. A tile's keys are the span any of its rows sees (the causal
// bound, narrowed to its rows' documents); a tile that sees no key skips its GEMMs.
//
// The tiles' GEMMs run kernels/cpu/small_gemm.c's kernels. Under bf16 compute (AttnShape.compute
// bf16) they take bf16 operands (q, k, v, dO, P and dS rounded to nearest even) and sum in fp32,
// as cuDNN's flash attention does on cuda; softmax, its statistics, dS's elementwise math and
// the outputs stay fp32. (cuda runs cuDNN for plain causal blocks and fp32 fallback kernels for
// other masks, so its attention is not one numeric contract either way; here every mask takes
// the bf16 tiles, which on avx512_bf16 do twice the multiply-adds per instruction.) bf16's
// forward goes 16 query rows at a time through kernels/cpu/attention_flash_bf16.c instead, its
// scores and P in registers, the softmax online as FlashAttention-2's.
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "core/bf16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/small_gemm_term.h"

#define ATTN_TILE 64

static int round16(int n) { return (n + 15) / 16 * 16; }

// ---- the mask --------------------------------------------------------------------------------

// How many of the keys [lo, lo + width) query row i sees by position alone: a prefix (all of
// them without a mask).
static int attention_row_keys(const AttnShape *s, int i, int lo, int width) {
    if (s->mask == ATTN_NONE) return width;
    long n = (long)s->q_start + i - s->kv_start - lo + 1;
    return n < 0 ? 0 : n > width ? width : (int)n;
}

static bool attention_same_document(const AttnShape *s, int b, int i, int j) {
    return s->q_doc[(size_t)b * s->Tq + i] == s->kv_doc[(size_t)b * s->Tk + j];
}

// Whether any of query rows [i0, i0 + rows) of sequence b sees key j.
static bool attention_rows_see(const AttnShape *s, int b, int i0, int rows, int j) {
    for (int i = i0; i < i0 + rows; i++)
        if (attention_row_keys(s, i, j, 1) == 1 &&
            (s->mask != ATTN_DOCUMENT || attention_same_document(s, b, i, j)))
            return true;
    return false;
}

// One query tile of one head: rows [i0, i0 + rows) of sequence b, keys [lo, lo + width) (width
// <= 0: it sees none; lo even under bf16, whose GEMM words pair keys 2p and 2p + 1, the key
// before a narrowed span masked like the others outside it), and where they lie: q0 indexes
// q, out, dout, dq at row i0; kv0 indexes k, v, dk, dv at row lo; l0 indexes lse at row i0.
typedef struct AttnTile {
    const AttnShape *s;
    int b, i0, rows, lo, width, ld_q, ld_kv;
    size_t q0, kv0, l0;
    float scale;
} AttnTile;

static AttnTile attention_tile(const AttnShape *s, int b, int h, int i0, int rows, bool bf16) {
    int H = s->n_heads, KV = s->n_kv_heads, hd = s->head_dim;
    AttnTile t = {.s = s, .b = b, .i0 = i0, .ld_q = H * hd, .ld_kv = KV * hd,
                  .scale = 1.0f / sqrtf((float)hd)};
    t.rows = s->Tq - i0 < rows ? s->Tq - i0 : rows;
    int lo = 0, hi = attention_row_keys(s, i0 + t.rows - 1, 0, s->Tk);
    if (s->mask == ATTN_DOCUMENT) {
        while (lo < hi && !attention_rows_see(s, b, i0, t.rows, lo)) lo++;
        while (hi > lo && !attention_rows_see(s, b, i0, t.rows, hi - 1)) hi--;
        if (bf16 && lo < hi) lo &= ~1;
    }
    t.lo = lo, t.width = hi - lo;
    t.q0 = (((size_t)b * s->Tq + i0) * H + h) * hd;
    t.kv0 = (((size_t)b * s->Tk + lo) * KV + h / (H / KV)) * hd;
    t.l0 = ((size_t)b * H + h) * s->Tq + i0;
    return t;
}

// Row r of the tile's scores: returns how many keys it sees by position (a prefix), having set
// the scores of other documents' keys within it to -inf.
static int attention_mask_row(const AttnTile *t, float *srow, int r) {
    const AttnShape *s = t->s;
    int n = attention_row_keys(s, t->i0 + r, t->lo, t->width);
    if (s->mask == ATTN_DOCUMENT)
        for (int j = 0; j < n; j++)
            if (!attention_same_document(s, t->b, t->i0 + r, t->lo + j)) srow[j] = -INFINITY;
    return n;
}

// ---- scratch and the tile GEMMs' operands ---------------------------------------------------

// The tile GEMMs (kernels/cpu/small_gemm.c) sum over words: fp32 floats, or under bf16 compute
// two bf16 of consecutive k. A count of n elements along k is words(n) words.
static int words(int n, bool bf16) { return bf16 ? (n + 1) / 2 : n; }

// One OpenMP thread's scratch, in 4-byte units (floats or words). The tile GEMMs read b a row
// of words at a time, 16 columns together, so k and v come as panels in that layout: with k
// along their columns for q k^T and dO v^T (kt, vt: k^T, v^T), along their rows for P v, dS k,
// dS^T q and P^T dO (kr, vr, qr, dor, and under bf16 P's and dS's pairs of rows for the
// transposed a of the last two). Panels are `panel` keys wide: a tile's columns run to its
// first key plus its width rounded up to 16.
typedef struct AttnScratch {
    bool bf16;  // AttnShape.compute bf16: bf16 operands, fp32 sums, softmax and outputs
    int panel, hd16;
    float *s, *ds;  // (ATTN_TILE, panel): scores or P, and dP then dS, fp32
    uint32_t *kt, *vt;  // (words(head_dim), panel)
    uint32_t *kr, *vr;  // (words(panel), hd16): zero-padded; fp32 with head_dim % 16 == 0 reads
                        // k and v in place
    uint32_t *qr, *dor;  // (words(ATTN_TILE), hd16): a tile's q and dO rows, likewise
    float *acc;  // (ATTN_TILE, hd16): P v's output (bf16's fused forward: its (head_dim, 16)
                 // o); (max(panel, ATTN_TILE), hd16) where the keys' gradients go through it
                 // (head_dim % 16 != 0)
    // bf16 only: dS as a (pairs along keys), P and dS as a^T (pairs along rows), q and dO as a
    // (the fused forward's q words across its rows in q_a's room).
    uint32_t *ds_a, *p_at, *ds_at;  // (ATTN_TILE, panel / 2), (ATTN_TILE / 2, panel)
    uint32_t *q_a, *do_a;           // (ATTN_TILE, words(head_dim))
} AttnScratch;

// What one slice holds, in 4-byte units, each buffer only where it is used: the row panels
// where fp32 operands cannot be read in place (head_dim not a multiple of 16) or under bf16,
// the keys' gradients' acc where they cannot be added in place (the former).
typedef struct AttnSlice {
    size_t s, kt, kr, qr, acc, bf16_pairs, bf16_a;  // each buffer's size (ds, vt, ... likewise)
} AttnSlice;

static AttnSlice attention_slice(const AttnShape *s, bool bf16) {
    size_t panel = (size_t)round16(s->Tk) + 16, hd16 = (size_t)round16(s->head_dim);
    bool padded = (size_t)s->head_dim != hd16, copies = bf16 || padded;
    AttnSlice a = {.s = ATTN_TILE * panel,
                   .kt = (size_t)words(s->head_dim, bf16) * panel,
                   .kr = copies ? (size_t)words((int)panel, bf16) * hd16 : 0,
                   .qr = copies ? (size_t)words(ATTN_TILE, bf16) * hd16 : 0,
                   .acc = (padded && panel > ATTN_TILE ? panel : ATTN_TILE) * hd16,
                   .bf16_pairs = bf16 ? ATTN_TILE * panel / 2 : 0,
                   .bf16_a = bf16 ? (size_t)ATTN_TILE * words(s->head_dim, true) : 0};
    return a;
}

static size_t attention_slice_floats(const AttnShape *s, bool bf16) {
    AttnSlice a = attention_slice(s, bf16);
    return 2 * (a.s + a.kt + a.kr + a.qr + a.bf16_a) + a.acc + 3 * a.bf16_pairs;
}

// The workspace: backward's row dots (B, H, Tq), rounded up to whole cache lines, then one
// slice per thread.
static size_t attention_dots_floats(const AttnShape *s) {
    size_t n = (size_t)s->B * s->n_heads * s->Tq;
    return (n + 15) / 16 * 16;
}

size_t cpu_attention_workspace_bytes(const AttnShape *s) {
    bool bf16 = s->compute == DTYPE_BF16;
    size_t slices = (size_t)omp_get_max_threads() * attention_slice_floats(s, bf16);
    return (attention_dots_floats(s) + slices) * sizeof(float);
}

static AttnScratch attention_scratch(void *workspace, const AttnShape *s) {
    AttnScratch a = {.bf16 = s->compute == DTYPE_BF16, .panel = round16(s->Tk) + 16,
                     .hd16 = round16(s->head_dim)};
    AttnSlice n = attention_slice(s, a.bf16);
    float *f = (float *)workspace + attention_dots_floats(s) +
               (size_t)omp_get_thread_num() * attention_slice_floats(s, a.bf16);
    a.s = f, f += n.s;
    a.ds = f, f += n.s;
    a.kt = (uint32_t *)f, f += n.kt;
    a.vt = (uint32_t *)f, f += n.kt;
    a.kr = (uint32_t *)f, f += n.kr;
    a.vr = (uint32_t *)f, f += n.kr;
    a.qr = (uint32_t *)f, f += n.qr;
    a.dor = (uint32_t *)f, f += n.qr;
    a.acc = f, f += n.acc;
    a.ds_a = (uint32_t *)f, f += n.bf16_pairs;
    a.p_at = (uint32_t *)f, f += n.bf16_pairs;
    a.ds_at = (uint32_t *)f, f += n.bf16_pairs;
    a.q_a = (uint32_t *)f, f += n.bf16_a;
    a.do_a = (uint32_t *)f;
    return a;
}

// Words are read where attention_words_along wrote them as halves.
typedef uint32_t AttnWord __attribute__((may_alias));

// A row's words along it: w[p] = (x[2p], x[2p + 1]), x[n] taken as 0 for an odd n. Written
// as halves: a loop of bf16_from_float vectorises with one conversion per vector, where
// pairing neighbours would shuffle.
static void attention_words_along(AttnWord *w, const float *x, int n) {
    uint16_t *h = (uint16_t *)w;
#pragma omp simd
    for (int c = 0; c < n; c++) h[c] = bf16_from_float(x[c]);
    if (n % 2) h[n] = 0;
}

// Two rows' words across them: w[c] = (lo[c], hi[c]); hi NULL: zeros.
static void attention_words_across(uint32_t *w, const float *lo, const float *hi, int n) {
    if (hi) {
#pragma omp simd
        for (int c = 0; c < n; c++) w[c] = bf16_word(lo[c], hi[c]);
    } else {
#pragma omp simd
        for (int c = 0; c < n; c++) w[c] = bf16_word(lo[c], 0.0f);
    }
}

// Whether rows of n floats go through the *_by_vectors functions below: 16 floats (64 bytes)
// at a time, transposed and rounded in registers, each built for AVX-512 in every build and run
// where the cpu has it. Without AVX-512 their 64-byte vectors and shuffles lower to slower code
// than the row-at-a-time loops they replace (measured, portable build: 16% slower), which stay
// for that case and for other n.
static bool attention_by_vectors(int n) {
    return n % 16 == 0 && __builtin_cpu_supports("avx512f");
}

// The 16 x 16 floats x[r][c] become x[c][r] in four rounds: round b (1, 2, 4, 8) swaps the
// row's and the column's bit of value b, rows r and r + b trading the elements whose column
// has it set, each new row one shuffle of two vectors.
static inline __attribute__((always_inline)) void attention_transpose16(Vec16 x[16]) {
    for (int r = 0; r < 16; r++) {
        if (r & 1) continue;
        Vec16 lo = x[r], hi = x[r + 1];
        x[r] = __builtin_shufflevector(lo, hi, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28,
                                               14, 30);
        x[r + 1] = __builtin_shufflevector(lo, hi, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13,
                                                   29, 15, 31);
    }
    for (int r = 0; r < 16; r++) {
        if (r & 2) continue;
        Vec16 lo = x[r], hi = x[r + 2];
        x[r] = __builtin_shufflevector(lo, hi, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28,
                                               29);
        x[r + 2] = __builtin_shufflevector(lo, hi, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14,
                                                   15, 30, 31);
    }
    for (int r = 0; r < 16; r++) {
        if (r & 4) continue;
        Vec16 lo = x[r], hi = x[r + 4];
        x[r] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26,
                                               27);
        x[r + 4] = __builtin_shufflevector(lo, hi, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28,
                                                   29, 30, 31);
    }
    for (int r = 0; r < 16; r++) {
        if (r & 8) continue;
        Vec16 lo = x[r], hi = x[r + 8];
        x[r] = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22,
                                               23);
        x[r + 8] = __builtin_shufflevector(lo, hi, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28,
                                                   29, 30, 31);
    }
}

// attention_operand_cols of rows whose head_dim is a multiple of 16, in 16 x 16 blocks: a
// vector read per row, a transpose in registers, then per panel row a vector written (fp32) or
// two rounded into their bf16 pairs. Against the word blocks below, the debug model's fp32
// attention (one thread, AMD EPYC) went from 13.4 to 12.4 ms in backward, 8.1 to 7.8 in
// forward. The rows lie a token's heads apart; the word blocks read each by a call and moved
// 256 words one at a time between one block's reads and the next's, which waited on them.
__attribute__((target("avx512f"))) static void attention_cols_by_vectors(
    uint32_t *dst, int width, const float *src, int ld, int n, int hd, bool bf16) {
    for (int j0 = 0; j0 < n; j0 += 16)
        for (int c0 = 0; c0 < hd; c0 += 16) {
            Vec16 x[16];
            for (int j = 0; j < 16; j++)  // zeros past n: columns [n, width) are zero anyway
                x[j] = j0 + j < n ? *(const Vec16 *)(src + (size_t)(j0 + j) * ld + c0)
                                  : (Vec16){0};
            attention_transpose16(x);
            for (int p = 0; !bf16 && p < 16; p++)
                *(Vec16 *)(dst + (size_t)(c0 + p) * width + j0) = x[p];
            for (int p = 0; bf16 && p < 8; p++)
                bf16_pairs16((Words16 *)(dst + (size_t)(c0 / 2 + p) * width + j0),
                             (const float *)&x[2 * p], (const float *)&x[2 * p + 1], TERM_BF16);
        }
}

// b with k along src's columns: dst (words(hd), width) holds src's rows [0, n) (hd floats
// each, ld apart) transposed, word (p, j) = src[j][p] or (src[j][2p], src[j][2p + 1]); zeros
// in columns [n, width). 16 rows at a time go through a block of their words, so that the
// rows are read and the panel written a vector at a time.
static void attention_operand_cols(uint32_t *dst, int width, const float *src, int ld, int n,
                                   int hd, bool bf16) {
    int hw = words(hd, bf16);
    if (attention_by_vectors(hd))
        attention_cols_by_vectors(dst, width, src, ld, n, hd, bf16);
    else
        for (int j0 = 0; j0 < n; j0 += 16) {
            int m = n - j0 < 16 ? n - j0 : 16;
            AttnWord block[16][hw];
            for (int j = 0; j < m; j++) {
                const float *x = src + (size_t)(j0 + j) * ld;
                if (bf16)
                    attention_words_along(block[j], x, hd);
                else
                    memcpy(block[j], x, (size_t)hd * sizeof(float));
            }
            for (int p = 0; p < hw; p++)
                for (int j = 0; j < m; j++) dst[(size_t)p * width + j0 + j] = block[j][p];
        }
    for (int p = 0; p < hw; p++) memset(dst + (size_t)p * width + n, 0, (size_t)(width - n) * 4);
}

// The missing partner of an odd count of rows or of 16-float chunks, rounded as zeros.
static const float attention_zeros16[16];

// attention_operand_rows under bf16 where cols is a multiple of 16 (so cols16 == cols: no
// padding columns to zero): each two rows rounded into their pairs 16 columns at a time, with
// no call per row.
__attribute__((target("avx512f"))) static void attention_pairs_by_vectors(
    uint32_t *dst, int cols16, const float *src, int ld, int n, int cols) {
    for (int p = 0; p < words(n, true); p++) {
        const float *lo = src + (size_t)(2 * p) * ld;
        const float *hi = 2 * p + 1 < n ? lo + ld : NULL;
        for (int c = 0; c < cols; c += 16)
            bf16_pairs16((Words16 *)(dst + (size_t)p * cols16 + c), lo + c,
                         hi ? hi + c : attention_zeros16, TERM_BF16);
    }
}

// b with k along src's rows: dst (words(n), cols16) holds src's rows [0, n) (cols floats each,
// ld apart), word (p, c) = src[p][c] or (src[2p][c], src[2p + 1][c]); zeros in columns
// [cols, cols16) and for the missing row of an odd n.
static void attention_operand_rows(uint32_t *dst, int cols16, const float *src, int ld, int n,
                                   int cols, bool bf16) {
    if (bf16 && attention_by_vectors(cols)) {
        attention_pairs_by_vectors(dst, cols16, src, ld, n, cols);
        return;
    }
    for (int p = 0; p < words(n, bf16); p++) {
        uint32_t *row = dst + (size_t)p * cols16;
        if (bf16) {
            const float *lo = src + (size_t)(2 * p) * ld;
            attention_words_across(row, lo, 2 * p + 1 < n ? lo + ld : NULL, cols);
        } else {
            memcpy(row, src + (size_t)p * ld, (size_t)cols * sizeof(float));
        }
        memset(row + cols, 0, (size_t)(cols16 - cols) * sizeof *row);
    }
}

// src's rows [0, n) as a GEMM's b (k along them): fp32 src itself when cols is a multiple of
// 16, else built into dst; *ldb its row stride in words.
static const uint32_t *attention_rows_operand(uint32_t *dst, int cols16, const float *src,
                                              int ld, int n, int cols, bool bf16, size_t *ldb) {
    if (!bf16 && cols == cols16) return *ldb = (size_t)ld, (const uint32_t *)src;
    attention_operand_rows(dst, cols16, src, ld, n, cols, bf16);
    return *ldb = (size_t)cols16, dst;
}

// w (n, words(hd)) = the bf16 words of src's rows [0, n) (hd floats each, ld apart) along
// them: k's for bf16's forward, q's and dO's as the a of backward's GEMMs. Where hd is a
// multiple of 16 the words are the rows' halves in order, rounded 32 at a time with no call
// per row; an odd count of 16 halves ends in 8 words of zeros past the rows (n is then odd:
// w, ATTN_TILE or panel rows, has a row to spare).
__attribute__((target("avx512f"))) static void attention_rows_words_by_vectors(
    uint32_t *w, const float *src, int ld, int n, int hd) {
    // w's chunks of 16 halves in order, two per rounding; chunk (r, c): row r's floats from c
    int r = 0, c = 0;
    for (uint32_t *at = w; r < n; at += 16) {
        const float *lo = src + (size_t)r * ld + c, *hi = attention_zeros16;
        if ((c += 16) == hd) r++, c = 0;
        if (r < n) {
            hi = src + (size_t)r * ld + c;
            if ((c += 16) == hd) r++, c = 0;
        }
        bf16_halves32((Halves32 *)at, lo, hi, TERM_BF16);
    }
}

static void attention_rows_words(uint32_t *w, const float *src, int ld, int n, int hd) {
    if (attention_by_vectors(hd)) {
        attention_rows_words_by_vectors(w, src, ld, n, hd);
        return;
    }
    int hw = words(hd, true);
    for (int j = 0; j < n; j++) attention_words_along(w + (size_t)j * hw, src + (size_t)j * ld, hd);
}

// src's rows [0, rows) as a GEMM's a (k along them, n elements): fp32 src itself, or its bf16
// words into dst (rows, words(n)); *lda its row stride in words.
static const uint32_t *attention_a_operand(uint32_t *dst, const float *src, int ld, int rows,
                                           int n, bool bf16, size_t *lda) {
    if (!bf16) return *lda = (size_t)ld, (const uint32_t *)src;
    attention_rows_words(dst, src, ld, rows, n);
    return *lda = (size_t)words(n, true), dst;
}

// What a tile GEMM's rows and sum run over, for attention_tile_gemm to skip what a causal
// mask makes zero or leaves unread: row r of the tile sees its first attention_row_keys keys.
typedef enum {
    ATTN_ROWS_X_KEYS,  // c (rows, keys), S or dP: columns past what a row sees are left unset
    ATTN_ROWS_SUM_KEYS,  // c (rows, hd) = a (rows, keys) b, P v or dS k: a is 0 past them
    ATTN_KEYS_SUM_ROWS,  // c (keys, hd) = a^T b, dS^T q or P^T dO: rows that see none of a key
} AttnTileGemm;            //   are 0 in its column of a

// Slabs of 16 rows of c (one or two of the kernel's row blocks), each cut to the keys (or, for
// the keys' gradients, the query rows) its last (first) row needs. The skipped terms are zeros
// at an end of each sum, so every sum is the one the whole GEMM computes, bit for bit: a causal
// tile's diagonal block costs half.
#define ATTN_SLAB 16

static void attention_tile_gemm(const AttnTile *t, const SmallGemm *g, AttnTileGemm kind) {
    int extent = kind == ATTN_KEYS_SUM_ROWS ? t->width : t->rows;
    const uint32_t *a = g->a, *b = g->b;
    for (int i = 0; i < extent; i += ATTN_SLAB) {
        SmallGemm slab = *g;
        slab.m = extent - i < ATTN_SLAB ? extent - i : ATTN_SLAB;
        slab.c = g->c + (size_t)i * g->ldc;
        if (kind == ATTN_KEYS_SUM_ROWS) {  // from the word of the first query row seeing key i
            int r = 0;
            while (r < t->rows && attention_row_keys(t->s, t->i0 + r, t->lo, t->width) <= i) r++;
            int w0 = g->bf16 ? r / 2 : r;
            slab.k = g->k - w0;
            slab.a = a + (size_t)w0 * g->lda + i;
            slab.b = b + (size_t)w0 * g->ldb;
        } else {
            int seen = attention_row_keys(t->s, t->i0 + i + slab.m - 1, t->lo, t->width);
            slab.a = a + (size_t)i * g->lda;
            if (kind == ATTN_ROWS_X_KEYS) {
                if (seen == 0) continue;
                slab.n = seen;
            } else
                slab.k = words(seen, g->bf16);
        }
        cpu_small_gemm(&slab);
    }
}

// dst's rows [0, m) += op(a) b as in SmallGemm g (its c, ldc and accumulate set here): in place
// when head_dim is a multiple of 16, else through the scratch acc. Either way each sum and its
// addition round as one sgemm with beta 1 does.
static void attention_accumulate(const AttnTile *t, SmallGemm g, AttnTileGemm kind, float *dst,
                                 int ld, const AttnScratch *w) {
    int hd = t->s->head_dim;
    g.accumulate = true;
    if (hd == w->hd16) {
        g.c = dst, g.ldc = (size_t)ld;
        attention_tile_gemm(t, &g, kind);
        return;
    }
    for (int j = 0; j < g.m; j++) {
        memcpy(w->acc + (size_t)j * w->hd16, dst + (size_t)j * ld, (size_t)hd * sizeof(float));
        memset(w->acc + (size_t)j * w->hd16 + hd, 0, (size_t)(w->hd16 - hd) * sizeof(float));
    }
    g.c = w->acc, g.ldc = (size_t)w->hd16;
    attention_tile_gemm(t, &g, kind);
    for (int j = 0; j < g.m; j++)
        memcpy(dst + (size_t)j * ld, w->acc + (size_t)j * w->hd16, (size_t)hd * sizeof(float));
}

// ---- forward ---------------------------------------------------------------------------------

// x[j] = exp(x[j] - shift) for j < n_valid, zeros from there to width. The exps run over
// whole vectors, the keys past n_valid in the last one as -inf (exp 0): a causal tile's rows
// end anywhere, and a loop over n_valid alone took its last few exps one at a time, scalar
// (the debug model's attention, one thread: forward 9.0 -> 8.3 ms, backward 14.2 -> 13.7).
// The portable build makes it once per instruction set (CPU_CLONES): an exp is the same
// bits at any vector width, where the row sums, left to the callers, would not be (its
// attention, one thread, AMD EPYC: fp32 forward 10.5 -> 7.3 ms, backward 15.6 -> 12.3).
CPU_CLONES static void attention_exp_shifted(float *x, int n_valid, int width,
                                                      float shift) {
    int whole = round16(n_valid);  // <= round16(width), the scratch rows' stride
    for (int j = n_valid; j < whole; j++) x[j] = -INFINITY;
#pragma omp simd
    for (int j = 0; j < whole; j++) x[j] = cpu_expf(x[j] - shift);
    for (int j = whole; j < width; j++) x[j] = 0.0f;
}

// A row of s (width wide, the first n_valid keys seen by position) becomes exp(s - max) there
// and zeros beyond; returns 1 / sum, which is applied to the (narrower) output row after P V
// instead. A row that sees no key gets lse = -inf and 0 (so out = 0). The sum is a loop of
// its own over the n_valid exps, which GCC vectorises as it did inside the exps' loop (the
// same lanes, then the remainder into lane 0): the same order of additions, the same bits
// (compared byte for byte with GCC 12 and clang 14, portable and native builds; a compiler
// that vectorised the two loops differently would change fp32's last bits, not the math).
static float attention_exp_row(float *s, int n_valid, int width, float *lse) {
    float mx = n_valid > 0 ? cpu_max_floats(s, n_valid) : -INFINITY, sum = 0.0f;
    if (mx == -INFINITY) {
        for (int j = 0; j < width; j++) s[j] = 0.0f;
        *lse = -INFINITY;
        return 0.0f;
    }
    attention_exp_shifted(s, n_valid, width, mx);
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n_valid; j++) sum += s[j];
    *lse = mx + logf(sum);
    return 1.0f / sum;
}

// A (batch, kv head)'s keys and values as the tile GEMMs' b, over all Tk keys (a tile reads
// from its first key on): k along columns (kt, vt, ld_t words apart) and along rows (kb, vb,
// ld_rows words apart); for bf16's fused forward, each key's words along head_dim (kw, words
// (head_dim) apart, in kt's room).
typedef struct AttnPanels {
    const uint32_t *kt, *vt, *kb, *vb, *kw;
    size_t ld_t, ld_rows;
} AttnPanels;

// bf16's forward reads kw and vb (zeros past the keys: its last 16 keys may run past them),
// fp32's kt and vb. Built once per head, not per tile: a transpose reads a float at a time.
static AttnPanels attention_panels(const AttnShape *s, int b, int kv_head, const float *k,
                                   const float *v, const AttnScratch *w, bool backward) {
    int ld = s->n_kv_heads * s->head_dim, hd = s->head_dim, hw = words(hd, w->bf16);
    size_t at = ((size_t)b * s->Tk * s->n_kv_heads + kv_head) * hd;
    k += at, v += at;
    AttnPanels p = {.kt = w->kt, .vt = w->vt, .ld_t = (size_t)w->panel};
    p.vb = attention_rows_operand(w->vr, w->hd16, v, ld, s->Tk, hd, w->bf16, &p.ld_rows);
    if (w->bf16 && !backward) {
        uint32_t *kw = w->kt;
        attention_rows_words(kw, k, ld, s->Tk, hd);
        memset(kw + (size_t)s->Tk * hw, 0, (size_t)(w->panel - s->Tk) * hw * sizeof *kw);
        int pairs = words(s->Tk, true);
        memset(w->vr + (size_t)pairs * w->hd16, 0,
               (size_t)(w->panel / 2 - pairs) * w->hd16 * sizeof *w->vr);
        p.kw = kw;
        return p;
    }
    attention_operand_cols(w->kt, w->panel, k, ld, s->Tk, hd, w->bf16);
    if (backward) {
        attention_operand_cols(w->vt, w->panel, v, ld, s->Tk, hd, w->bf16);
        p.kb = attention_rows_operand(w->kr, w->hd16, k, ld, s->Tk, hd, w->bf16, &p.ld_rows);
    }
    return p;
}

// The panel rows (k along them) from the tile's first key: its word row.
static const uint32_t *attention_keys_at(const AttnTile *t, const uint32_t *rows, size_t ld,
                                         bool bf16) {
    return rows + (size_t)(bf16 ? t->lo / 2 : t->lo) * ld;
}

// scale q k^T into the (rows, round16(width)) scratch p: q (the tile's rows, ld_q apart) as a
// (its bf16 pairs into q_a), k^T from the panel kt; with dO, v^T and scale 1, dP = dO v^T.
static void attention_tile_scores(const AttnTile *t, const float *q, uint32_t *q_a,
                                  const uint32_t *kt, size_t ld_t, float scale, float *p,
                                  const AttnScratch *w) {
    int hd = t->s->head_dim;
    SmallGemm g = {.m = t->rows, .n = t->width, .k = words(hd, w->bf16), .alpha = scale,
                   .bf16 = w->bf16, .b = kt + t->lo, .ldb = ld_t, .c = p,
                   .ldc = (size_t)round16(t->width)};
    g.a = attention_a_operand(q_a, q, t->ld_q, t->rows, hd, w->bf16, &g.lda);
    attention_tile_gemm(t, &g, ATTN_ROWS_X_KEYS);
}

// fp32: the tile's o = softmax(scale q k^T) v through the scratch's scores; out and lse at
// the tile's first row.
static void attention_tile_forward(const AttnTile *t, float *o, float *lse, const float *q,
                                   const AttnPanels *kv, const AttnScratch *w) {
    int width = t->width, ws = round16(width), hd = t->s->head_dim;
    float inv_sum[ATTN_TILE];
    attention_tile_scores(t, q, w->q_a, kv->kt, kv->ld_t, t->scale, w->s, w);
    for (int r = 0; r < t->rows; r++) {
        float *sr = w->s + (size_t)r * ws;
        inv_sum[r] = attention_exp_row(sr, attention_mask_row(t, sr, r), width, lse + r);
    }
    SmallGemm pv = {.m = t->rows, .n = hd, .k = width, .alpha = 1.0f, .a = w->s,
                    .lda = (size_t)ws, .b = attention_keys_at(t, kv->vb, kv->ld_rows, false),
                    .ldb = kv->ld_rows, .c = w->acc, .ldc = (size_t)w->hd16};
    attention_tile_gemm(t, &pv, ATTN_ROWS_SUM_KEYS);
    for (int r = 0; r < t->rows; r++) {
        float *orow = o + (size_t)r * t->ld_q;
        const float *arow = w->acc + (size_t)r * w->hd16;
#pragma omp simd
        for (int c = 0; c < hd; c++) orow[c] = arow[c] * inv_sum[r];
    }
}

// A tile that sees no key: out = 0, lse = -inf.
static void attention_tile_blind(const AttnTile *t, float *o, float *lse) {
    for (int r = 0; r < t->rows; r++) {
        memset(o + (size_t)r * t->ld_q, 0, (size_t)t->s->head_dim * sizeof(float));
        lse[r] = -INFINITY;
    }
}

// bf16: the fused kernel (attention_flash_bf16.c) on FLASH_ROWS query rows at a time, from
// q's words across the rows (q_a's room), into acc's room; out and lse at the rows' first.
#define FLASH_ROWS 16

// o's rows [0, rows) (head_dim floats, ld apart) = the columns of acc (head_dim, FLASH_ROWS),
// row i scaled by inv[i]: in 16 x 16 blocks transposed in registers where head_dim allows.
__attribute__((target("avx512f"))) static void attention_rows_scaled_by_vectors(
    float *o, int ld, const float *acc, int rows, int hd, const float *inv) {
    for (int c0 = 0; c0 < hd; c0 += 16) {
        Vec16 x[16];
        for (int c = 0; c < 16; c++) x[c] = *(const Vec16 *)(acc + (size_t)(c0 + c) * FLASH_ROWS);
        attention_transpose16(x);
        for (int i = 0; i < rows; i++) *(Vec16 *)(o + (size_t)i * ld + c0) = x[i] * inv[i];
    }
}

static void attention_rows_scaled(float *o, int ld, const float *acc, int rows, int hd,
                                  const float *inv) {
    if (attention_by_vectors(hd)) {
        attention_rows_scaled_by_vectors(o, ld, acc, rows, hd, inv);
        return;
    }
    for (int i = 0; i < rows; i++)
        for (int c = 0; c < hd; c++) o[(size_t)i * ld + c] = acc[c * FLASH_ROWS + i] * inv[i];
}

static void attention_rows_forward_bf16(const AttnTile *t, float *o, float *lse, const float *q,
                                        const AttnPanels *kv, const AttnScratch *w) {
    const AttnShape *s = t->s;
    int hd = s->head_dim, hw = words(hd, true), keys[FLASH_ROWS], docs[FLASH_ROWS];
    float m[FLASH_ROWS], l[FLASH_ROWS], inv[FLASH_ROWS];
    uint32_t *qw = w->q_a;  // (hw, FLASH_ROWS): q^T's words, as a panel of the rows
    attention_operand_cols(qw, FLASH_ROWS, q, t->ld_q, t->rows, hd, true);
    for (int i = 0; i < FLASH_ROWS; i++) {
        bool row = i < t->rows;
        keys[i] = row ? attention_row_keys(s, t->i0 + i, t->lo, t->width) : 0;
        docs[i] = row && s->mask == ATTN_DOCUMENT ? s->q_doc[(size_t)t->b * s->Tq + t->i0 + i] : 0;
    }
    FlashRows f = {.q = qw, .k = kv->kw + (size_t)t->lo * hw,
                   .v = attention_keys_at(t, kv->vb, kv->ld_rows, true), .ld_v = kv->ld_rows,
                   .words = hw, .head_dim = hd, .n = t->width, .scale = t->scale, .keys = keys,
                   .q_doc = docs, .o = w->acc, .m = m, .l = l};
    if (s->mask == ATTN_DOCUMENT) f.kv_doc = s->kv_doc + (size_t)t->b * s->Tk + t->lo;
    cpu_attention_flash_bf16(&f);
    for (int i = 0; i < t->rows; i++) {
        inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        lse[i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
    }
    attention_rows_scaled(o, t->ld_q, w->acc, t->rows, hd, inv);
}

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, const AttnShape *s, void *workspace) {
    int group = s->n_heads / s->n_kv_heads;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->n_heads; h++) {
            AttnScratch w = attention_scratch(workspace, s);
            AttnPanels kv = attention_panels(s, b, h / group, k, v, &w, false);
            for (int i0 = 0; w.bf16 && i0 < s->Tq; i0 += FLASH_ROWS) {
                AttnTile t = attention_tile(s, b, h, i0, FLASH_ROWS, true);
                if (t.width <= 0)
                    attention_tile_blind(&t, out + t.q0, lse + t.l0);
                else
                    attention_rows_forward_bf16(&t, out + t.q0, lse + t.l0, q + t.q0, &kv, &w);
            }
            for (int i0 = 0; !w.bf16 && i0 < s->Tq; i0 += ATTN_TILE) {
                AttnTile t = attention_tile(s, b, h, i0, ATTN_TILE, false);
                if (t.width <= 0)
                    attention_tile_blind(&t, out + t.q0, lse + t.l0);
                else
                    attention_tile_forward(&t, out + t.q0, lse + t.l0, q + t.q0, &kv, &w);
            }
        }
}

// ---- backward --------------------------------------------------------------------------------

// What backward reads and adds into, each at the tile's first query row or key; dots: D =
// rowsum(dO o O), laid out as lse.
typedef struct AttnGrads {
    const float *q, *dout, *lse, *dots;
    float *dq, *dk, *dv;
} AttnGrads;

static AttnGrads attention_grads_at(const AttnGrads *g, const AttnTile *t) {
    return (AttnGrads){g->q + t->q0,  g->dout + t->q0, g->lse + t->l0, g->dots + t->l0,
                       g->dq + t->q0, g->dk + t->kv0,  g->dv + t->kv0};
}

// How many keys row r of the tile takes gradient through: those it sees by position (a
// prefix), none when its lse is -inf (it sees no key) or it lies past the tile (the partner of
// an odd last row).
static int attention_grad_keys(const AttnTile *t, const AttnGrads *a, int r) {
    if (r >= t->rows || a->lse[r] == -INFINITY) return 0;
    return attention_row_keys(t->s, t->i0 + r, t->lo, t->width);
}

// attention_grad_keys, the scores of other documents' keys among them set to -inf.
static int attention_probs_row(const AttnTile *t, const AttnGrads *a, float *pr, int r) {
    return attention_grad_keys(t, a, r) ? attention_mask_row(t, pr, r) : 0;
}

// P = exp(S - lse) over the keys each row sees, zeros elsewhere. Under bf16 also P's words
// across pairs of rows (P^T as dV's a) into p_at, over whole vectors of each row (no scalar
// remainder on the diagonal's ragged rows); the scratch has a row past an odd last one.
static void attention_tile_probs(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                 float *p, const AttnScratch *sc) {
    int w = t->width, ws = round16(w);
    attention_tile_scores(t, a->q, sc->q_a, kv->kt, kv->ld_t, t->scale, p, sc);
    if (!sc->bf16) {
        for (int r = 0; r < t->rows; r++) {
            float *pr = p + (size_t)r * ws, l = a->lse[r];
            attention_exp_shifted(pr, attention_probs_row(t, a, pr, r), w, l);
        }
        return;
    }
    for (int r = 0; r < t->rows; r += 2) {
        float *p0 = p + (size_t)r * ws, *p1 = p0 + ws;
        float l0 = a->lse[r], l1 = r + 1 < t->rows ? a->lse[r + 1] : 0.0f;
        int n0 = attention_probs_row(t, a, p0, r), n1 = attention_probs_row(t, a, p1, r + 1);
        cpu_attention_probs_rows_bf16(p0, p1, l0, l1, n0, n1, sc->p_at + (size_t)(r / 2) * ws, ws);
    }
}

// dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D) into ds. Under bf16 dS goes straight to
// its bf16 words, along rows into ds_a (dQ's a) and across pairs of rows into ds_at (dK's),
// whole vectors at a time as P's; its fp32 rows are not kept.
static void attention_tile_dscores(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                   const float *p, float *ds, const AttnScratch *sc) {
    int w = t->width, ws = round16(w);
    attention_tile_scores(t, a->dout, sc->do_a, kv->vt, kv->ld_t, 1.0f, ds, sc);
    if (!sc->bf16) {
        for (int r = 0; r < t->rows; r++) {
            float d = a->dots[r];
            const float *pr = p + (size_t)r * ws;
            float *dsr = ds + (size_t)r * ws;
            int seen = attention_row_keys(t->s, t->i0 + r, t->lo, w);  // dP is unset past them
#pragma omp simd
            for (int j = 0; j < seen; j++) dsr[j] = pr[j] * (dsr[j] - d);
            for (int j = seen; j < w; j++) dsr[j] = 0.0f;
        }
        return;
    }
    for (int r = 0; r < t->rows; r += 2) {
        const float *p0 = p + (size_t)r * ws, *p1 = p0 + ws;
        const float *dp0 = ds + (size_t)r * ws, *dp1 = dp0 + ws;
        // P's rows hold only their grad keys (nothing else was written): dS's too
        int seen0 = attention_grad_keys(t, a, r), seen1 = attention_grad_keys(t, a, r + 1);
        float d0 = a->dots[r], d1 = seen1 ? a->dots[r + 1] : 0.0f;
        uint16_t *ds0 = (uint16_t *)(sc->ds_a + (size_t)r * (ws / 2)), *ds1 = ds0 + ws;
        cpu_attention_dscores_rows_bf16(p0, p1, dp0, dp1, d0, d1, seen0, seen1, ds0, ds1,
                                        sc->ds_at + (size_t)(r / 2) * ws, ws);
    }
}

// One query tile's contribution to all three gradients: dQ += scale dS K, dK += scale dS^T Q,
// dV += P^T dO.
static void attention_tile_backward(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                    const AttnScratch *w) {
    int width = t->width, ws = round16(width), hd = t->s->head_dim, rows = t->rows;
    bool bf16 = w->bf16;
    attention_tile_probs(t, a, kv, w->s, w);
    attention_tile_dscores(t, a, kv, w->s, w->ds, w);
    SmallGemm dq = {.m = rows, .n = hd, .k = words(width, bf16), .alpha = t->scale,
                    .bf16 = bf16, .b = attention_keys_at(t, kv->kb, kv->ld_rows, bf16),
                    .ldb = kv->ld_rows};
    dq.a = bf16 ? (const void *)w->ds_a : w->ds, dq.lda = bf16 ? (size_t)ws / 2 : (size_t)ws;
    attention_accumulate(t, dq, ATTN_ROWS_SUM_KEYS, a->dq, t->ld_q, w);
    SmallGemm dk = {.m = width, .n = hd, .k = words(rows, bf16), .alpha = t->scale,
                    .trans_a = true, .bf16 = bf16, .lda = (size_t)ws,
                    .a = bf16 ? (const void *)w->ds_at : w->ds};
    dk.b = attention_rows_operand(w->qr, w->hd16, a->q, t->ld_q, rows, hd, bf16, &dk.ldb);
    attention_accumulate(t, dk, ATTN_KEYS_SUM_ROWS, a->dk, t->ld_kv, w);
    SmallGemm dv = {.m = width, .n = hd, .k = words(rows, bf16), .alpha = 1.0f, .trans_a = true,
                    .bf16 = bf16, .lda = (size_t)ws,
                    .a = bf16 ? (const void *)w->p_at : w->s};
    dv.b = attention_rows_operand(w->dor, w->hd16, a->dout, t->ld_q, rows, hd, bf16, &dv.ldb);
    attention_accumulate(t, dv, ATTN_KEYS_SUM_ROWS, a->dv, t->ld_kv, w);
}

// D = rowsum(dO o O) of every query row of every head into dots (B, H, Tq), in one pass over
// dO and O in memory order before the tiles, as FlashAttention-2 computes it ahead of its
// backward. Each tile reading its own rows of O took a cache miss on every one (rows H
// head_dim floats apart, O read nowhere else): a seventh of the debug model's attention
// backward (measured with perf, one thread on an AMD EPYC; 13.6 ms a call, 11.6 ms after).
static void attention_row_dots(float *dots, const float *dout, const float *out,
                               const AttnShape *s) {
    int H = s->n_heads, hd = s->head_dim, Tq = s->Tq;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < s->B; b++)
        for (int i = 0; i < Tq; i++)
            for (int h = 0; h < H; h++) {
                size_t row = (((size_t)b * Tq + i) * H + h) * hd;
                float d = 0.0f;
#pragma omp simd reduction(+ : d)
                for (int c = 0; c < hd; c++) d += dout[row + c] * out[row + c];
                dots[((size_t)b * H + h) * Tq + i] = d;
            }
}

// One task per (batch, kv head): it alone writes that kv head's dK, dV and its query heads'
// dQ, in a fixed order, so GQA needs no atomics and results do not depend on scheduling.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const AttnShape *s, void *workspace) {
    int group = s->n_heads / s->n_kv_heads;
    float *dots = workspace;  // its first attention_dots_floats
    attention_row_dots(dots, dout, out, s);
    AttnGrads g = {q, dout, lse, dots, dq, dk, dv};
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int kvh = 0; kvh < s->n_kv_heads; kvh++) {
            AttnScratch w = attention_scratch(workspace, s);
            AttnPanels kv = attention_panels(s, b, kvh, k, v, &w, true);
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int i0 = 0; i0 < s->Tq; i0 += ATTN_TILE) {
                    AttnTile t = attention_tile(s, b, h, i0, ATTN_TILE, w.bf16);
                    if (t.width <= 0) continue;
                    AttnGrads a = attention_grads_at(&g, &t);
                    attention_tile_backward(&t, &a, &kv, &w);
                }
        }
}

// ---- merge -----------------------------------------------------------------------------------

// Weights e^(lse - merged), e^(lse2 - merged) of one row, and its merged lse; both 0 (and lse
// -inf) when neither side saw a key.
static float attention_merge_weights(float a, float b, float *wa, float *wb) {
    float m = fmaxf(a, b);
    if (m == -INFINITY) {
        *wa = *wb = 0.0f;
        return -INFINITY;
    }
    float ea = expf(a - m), eb = expf(b - m), sum = ea + eb;
    *wa = ea / sum, *wb = eb / sum;
    return m + logf(sum);
}

void cpu_attention_merge(float *out, float *lse, const float *out2, const float *lse2, int B,
                         int T, int n_heads, int head_dim) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++) {
                size_t l = ((size_t)b * n_heads + h) * T + t;
                size_t o = (((size_t)b * T + t) * n_heads + h) * head_dim;
                float wa, wb;
                lse[l] = attention_merge_weights(lse[l], lse2[l], &wa, &wb);
#pragma omp simd
                for (int c = 0; c < head_dim; c++) out[o + c] = wa * out[o + c] + wb * out2[o + c];
            }
}
