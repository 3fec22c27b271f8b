// Grouped-query attention, FlashAttention-style (Dao et al. 2022): queries go in tiles of
// ATTN_TILE rows, each tile's scores against the keys it may see live only in a per-thread
// scratch, and backward recomputes the probabilities from the saved log-sum-exp instead of
// storing the (Tq, Tk) matrix. A tile's keys are the span any of its rows sees (the causal
// bound, narrowed to its rows' documents); a tile that sees no key skips its GEMMs.
//
// fp32 under bf16 compute too (KernelInit.precision bf16), unlike cuda's cuDNN flash attention,
// which rounds q, k, v, P, dO and its outputs to bf16. Chosen because the attention's precision
// is not one numeric contract even on cuda: every mask but plain causal, context parallel's
// chunk pairs and shapes cuDNN declines run cuda's fp32 fallback kernels; and rounding just the
// inputs here would still not reproduce cuDNN's bits (its P, online softmax and bf16 outputs).
// The GEMMs, where the time and mixed precision's error go, follow cuda's contract
// (kernels/cpu/gemm_bf16.c); attention's tiles run kernels/cpu/small_gemm.c's fp32 kernels.
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

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
// <= 0: it sees none), and where they lie: q0 indexes q, out, dout, dq at row i0; kv0 indexes
// k, v, dk, dv at row lo; l0 indexes lse at row i0.
typedef struct AttnTile {
    const AttnShape *s;
    int b, i0, rows, lo, width, ld_q, ld_kv;
    size_t q0, kv0, l0;
    float scale;
} AttnTile;

static AttnTile attention_tile(const AttnShape *s, int b, int h, int i0) {
    int H = s->n_heads, KV = s->n_kv_heads, hd = s->head_dim;
    AttnTile t = {.s = s, .b = b, .i0 = i0, .ld_q = H * hd, .ld_kv = KV * hd,
                  .scale = 1.0f / sqrtf((float)hd)};
    t.rows = s->Tq - i0 < ATTN_TILE ? s->Tq - i0 : ATTN_TILE;
    int lo = 0, hi = attention_row_keys(s, i0 + t.rows - 1, 0, s->Tk);
    if (s->mask == ATTN_DOCUMENT) {
        while (lo < hi && !attention_rows_see(s, b, i0, t.rows, lo)) lo++;
        while (hi > lo && !attention_rows_see(s, b, i0, t.rows, hi - 1)) hi--;
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

// One OpenMP thread's scratch. The tile GEMMs (kernels/cpu/small_gemm.c) read b row by row,
// 16 columns at a time, so k and v come as panels in that layout: transposed (keys along a row)
// for q k^T and dO v^T, and as rows padded to a multiple of 16 columns for P v, dS k. Panels are
// `panel` keys wide: a tile's columns run to its first key plus its width rounded up to 16.
typedef struct AttnScratch {
    int panel, hd16;
    float *s, *ds;  // (ATTN_TILE, panel): scores or P, and dP then dS
    float *kt, *vt;  // (head_dim, panel): k^T, v^T
    float *kr, *vr;  // (panel, hd16): k, v rows, zero-padded
    float *qr, *dor;  // (ATTN_TILE, hd16): a tile's q and dO rows, zero-padded
    float *acc;  // (max(panel, ATTN_TILE), hd16): a GEMM's output before it is added where it belongs
} AttnScratch;

static size_t attention_slice_floats(const AttnShape *s) {
    size_t panel = (size_t)round16(s->Tk) + 16, hd16 = (size_t)round16(s->head_dim);
    size_t acc_rows = panel > ATTN_TILE ? panel : ATTN_TILE;
    return 2 * ATTN_TILE * panel + 2 * (size_t)s->head_dim * panel + 2 * panel * hd16 +
           acc_rows * hd16 + 2 * ATTN_TILE * hd16;
}

size_t cpu_attention_workspace_bytes(const AttnShape *s) {
    return (size_t)omp_get_max_threads() * attention_slice_floats(s) * sizeof(float);
}

static AttnScratch attention_scratch(void *workspace, const AttnShape *s) {
    AttnScratch a = {.panel = round16(s->Tk) + 16, .hd16 = round16(s->head_dim)};
    size_t panel = (size_t)a.panel, hd16 = (size_t)a.hd16, hd = (size_t)s->head_dim;
    float *f = (float *)workspace + (size_t)omp_get_thread_num() * attention_slice_floats(s);
    a.s = f, f += ATTN_TILE * panel;
    a.ds = f, f += ATTN_TILE * panel;
    a.kt = f, f += hd * panel;
    a.vt = f, f += hd * panel;
    a.kr = f, f += panel * hd16;
    a.vr = f, f += panel * hd16;
    a.acc = f, f += (panel > ATTN_TILE ? panel : ATTN_TILE) * hd16;
    a.qr = f, f += ATTN_TILE * hd16;
    a.dor = f;
    return a;
}

// dst (hd, width) = src's rows [0, n) (hd floats each, ld apart) transposed, zeros in columns
// [n, width).
static void attention_panel_transposed(float *dst, int width, const float *src, int ld, int n,
                                       int hd) {
    for (int c = 0; c < hd; c++) {
        float *row = dst + (size_t)c * width;
        for (int j = 0; j < n; j++) row[j] = src[(size_t)j * ld + c];
        for (int j = n; j < width; j++) row[j] = 0.0f;
    }
}

// dst (n, hd16) = src's rows [0, n) with zeros in columns [hd, hd16).
static void attention_panel_rows(float *dst, int hd16, const float *src, int ld, int n, int hd) {
    for (int j = 0; j < n; j++) {
        memcpy(dst + (size_t)j * hd16, src + (size_t)j * ld, (size_t)hd * sizeof(float));
        for (int c = hd; c < hd16; c++) dst[(size_t)j * hd16 + c] = 0.0f;
    }
}

// src's rows [0, n) as a GEMM's b: src itself when head_dim is a multiple of 16, else padded
// into dst; *ldb its row stride.
static const float *attention_rows_operand(float *dst, int hd16, const float *src, int ld, int n,
                                           int hd, size_t *ldb) {
    if (hd == hd16) return *ldb = (size_t)ld, src;
    attention_panel_rows(dst, hd16, src, ld, n, hd);
    return *ldb = (size_t)hd16, dst;
}

// What a tile GEMM's rows and sum run over, for attention_tile_gemm to skip what a causal
// mask makes zero or leaves unread: row r of the tile sees its first attention_row_keys keys.
typedef enum {
    ATTN_ROWS_X_KEYS,  // c (rows, keys), S or dP: columns past what a row sees are left unset
    ATTN_ROWS_SUM_KEYS,  // c (rows, hd) = a (rows, keys) b, P v or dS k: a is 0 past them
    ATTN_KEYS_SUM_ROWS,  // c (keys, hd) = a^T b, dS^T q or P^T dO: rows that see none of a key
} AttnTileGemm;            //   are 0 in its column of a

// Slabs of 16 rows of c (the kernel's row block), each cut to the keys (or, for the keys'
// gradients, the query rows) its last (first) row needs. The skipped terms are zeros at an end
// of each sum, so every sum is the one the whole GEMM computes, bit for bit: a causal tile's
// diagonal block costs half.
#define ATTN_SLAB 16

static void attention_tile_gemm(const AttnTile *t, const SmallGemm *g, AttnTileGemm kind) {
    int extent = kind == ATTN_KEYS_SUM_ROWS ? t->width : t->rows;
    for (int i = 0; i < extent; i += ATTN_SLAB) {
        SmallGemm slab = *g;
        slab.m = extent - i < ATTN_SLAB ? extent - i : ATTN_SLAB;
        slab.c = g->c + (size_t)i * g->ldc;
        if (kind == ATTN_KEYS_SUM_ROWS) {  // the first query row that sees key i
            int r = 0;
            while (r < t->rows && attention_row_keys(t->s, t->i0 + r, t->lo, t->width) <= i) r++;
            slab.k = g->k - r;
            slab.a = g->a + (size_t)r * g->lda + i;
            slab.b = g->b + (size_t)r * g->ldb;
        } else {
            int seen = attention_row_keys(t->s, t->i0 + i + slab.m - 1, t->lo, t->width);
            slab.a = g->a + (size_t)i * g->lda;
            if (kind == ATTN_ROWS_X_KEYS) {
                if (seen == 0) continue;
                slab.n = seen;
            } else
                slab.k = seen;
        }
        cpu_small_gemm(&slab);
    }
}

// dst's rows [0, n) += op(a) b as in SmallGemm g (its c, ldc and accumulate set here): in place
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
    attention_panel_rows(w->acc, w->hd16, dst, ld, g.m, hd);
    g.c = w->acc, g.ldc = (size_t)w->hd16;
    attention_tile_gemm(t, &g, kind);
    for (int j = 0; j < g.m; j++)
        memcpy(dst + (size_t)j * ld, w->acc + (size_t)j * w->hd16, (size_t)hd * sizeof(float));
}

// ---- forward ---------------------------------------------------------------------------------

// A row of s (width wide, the first n_valid keys seen by position) becomes exp(s - max) there
// and zeros beyond; returns 1 / sum, which is applied to the (narrower) output row after P V
// instead. A row that sees no key gets lse = -inf and 0 (so out = 0).
static float attention_exp_row(float *s, int n_valid, int width, float *lse) {
    float mx = n_valid > 0 ? cpu_max_floats(s, n_valid) : -INFINITY, sum = 0.0f;
    if (mx == -INFINITY) {
        for (int j = 0; j < width; j++) s[j] = 0.0f;
        *lse = -INFINITY;
        return 0.0f;
    }
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n_valid; j++) {
        s[j] = cpu_expf(s[j] - mx);
        sum += s[j];
    }
    for (int j = n_valid; j < width; j++) s[j] = 0.0f;
    *lse = mx + logf(sum);
    return 1.0f / sum;
}

// A (batch, kv head)'s keys and values as the tile GEMMs' b, over all Tk keys (a tile reads
// from its first key on): transposed (kt, vt, ld_t apart) and as rows (kb, vb, ld_rows apart).
typedef struct AttnPanels {
    const float *kt, *vt, *kb, *vb;
    size_t ld_t, ld_rows;
} AttnPanels;

// Forward reads only kt and vb. Built once per head, not per tile: a transpose reads a float
// at a time.
static AttnPanels attention_panels(const AttnShape *s, int b, int kv_head, const float *k,
                                   const float *v, const AttnScratch *w, bool backward) {
    int ld = s->n_kv_heads * s->head_dim, hd = s->head_dim;
    size_t at = ((size_t)b * s->Tk * s->n_kv_heads + kv_head) * hd;
    k += at, v += at;
    attention_panel_transposed(w->kt, w->panel, k, ld, s->Tk, hd);
    AttnPanels p = {.kt = w->kt, .vt = w->vt, .ld_t = (size_t)w->panel};
    p.vb = attention_rows_operand(w->vr, w->hd16, v, ld, s->Tk, hd, &p.ld_rows);
    if (backward) {
        attention_panel_transposed(w->vt, w->panel, v, ld, s->Tk, hd);
        p.kb = attention_rows_operand(w->kr, w->hd16, k, ld, s->Tk, hd, &p.ld_rows);
    }
    return p;
}

// scale q k^T into the (rows, round16(width)) scratch p, k^T from the panel kt; with dO, v^T
// and scale 1, dP = dO v^T.
static void attention_tile_scores(const AttnTile *t, const float *q, const float *kt,
                                  size_t ld_t, float scale, float *p) {
    SmallGemm g = {.m = t->rows, .n = t->width, .k = t->s->head_dim, .alpha = scale, .a = q,
                   .lda = (size_t)t->ld_q, .b = kt + t->lo, .ldb = ld_t, .c = p,
                   .ldc = (size_t)round16(t->width)};
    attention_tile_gemm(t, &g, ATTN_ROWS_X_KEYS);
}

// The tile's o = softmax(scale q k^T) v through the scratch's scores; out and lse at the
// tile's first row.
static void attention_tile_forward(const AttnTile *t, float *o, float *lse, const float *q,
                                   const AttnPanels *kv, const AttnScratch *w) {
    int width = t->width, ws = round16(width), hd = t->s->head_dim;
    float inv_sum[ATTN_TILE];
    attention_tile_scores(t, q, kv->kt, kv->ld_t, t->scale, w->s);
    for (int r = 0; r < t->rows; r++) {
        float *sr = w->s + (size_t)r * ws;
        inv_sum[r] = attention_exp_row(sr, attention_mask_row(t, sr, r), width, lse + r);
    }
    SmallGemm pv = {.m = t->rows, .n = hd, .k = width, .alpha = 1.0f, .a = w->s,
                    .lda = (size_t)ws, .b = kv->vb + (size_t)t->lo * kv->ld_rows,
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

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, const AttnShape *s, void *workspace) {
    int group = s->n_heads / s->n_kv_heads;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->n_heads; h++) {
            AttnScratch w = attention_scratch(workspace, s);
            AttnPanels kv = attention_panels(s, b, h / group, k, v, &w, false);
            for (int i0 = 0; i0 < s->Tq; i0 += ATTN_TILE) {
                AttnTile t = attention_tile(s, b, h, i0);
                if (t.width <= 0)
                    attention_tile_blind(&t, out + t.q0, lse + t.l0);
                else
                    attention_tile_forward(&t, out + t.q0, lse + t.l0, q + t.q0, &kv, &w);
            }
        }
}

// ---- backward --------------------------------------------------------------------------------

// What backward reads and adds into, each at the tile's first query row or key.
typedef struct AttnGrads {
    const float *q, *o, *dout, *lse;
    float *dq, *dk, *dv;
} AttnGrads;

static AttnGrads attention_grads_at(const AttnGrads *g, const AttnTile *t) {
    return (AttnGrads){g->q + t->q0,  g->o + t->q0,   g->dout + t->q0, g->lse + t->l0,
                       g->dq + t->q0, g->dk + t->kv0, g->dv + t->kv0};
}

// P = exp(S - lse) over the keys each row sees, zeros elsewhere (and on rows with lse = -inf,
// which see none).
static void attention_tile_probs(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                 float *p) {
    int w = t->width, ws = round16(w);
    attention_tile_scores(t, a->q, kv->kt, kv->ld_t, t->scale, p);
    for (int r = 0; r < t->rows; r++) {
        float *pr = p + (size_t)r * ws, l = a->lse[r];
        int n_valid = l == -INFINITY ? 0 : attention_mask_row(t, pr, r);
#pragma omp simd
        for (int j = 0; j < n_valid; j++) pr[j] = cpu_expf(pr[j] - l);
        for (int j = n_valid; j < w; j++) pr[j] = 0.0f;
    }
}

// dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D).
static void attention_tile_dscores(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                   const float *p, float *ds) {
    int w = t->width, ws = round16(w), hd = t->s->head_dim;
    attention_tile_scores(t, a->dout, kv->vt, kv->ld_t, 1.0f, ds);
    for (int r = 0; r < t->rows; r++) {
        const float *gr = a->dout + (size_t)r * t->ld_q, *orow = a->o + (size_t)r * t->ld_q;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int c = 0; c < hd; c++) d += gr[c] * orow[c];
        const float *pr = p + (size_t)r * ws;
        float *dsr = ds + (size_t)r * ws;
        int seen = attention_row_keys(t->s, t->i0 + r, t->lo, w);  // dP is unset past them
#pragma omp simd
        for (int j = 0; j < seen; j++) dsr[j] = pr[j] * (dsr[j] - d);
        for (int j = seen; j < w; j++) dsr[j] = 0.0f;
    }
}

// One query tile's contribution to all three gradients: dQ += scale dS K, dK += scale dS^T Q,
// dV += P^T dO.
static void attention_tile_backward(const AttnTile *t, const AttnGrads *a, const AttnPanels *kv,
                                    const AttnScratch *w) {
    int width = t->width, ws = round16(width), hd = t->s->head_dim;
    attention_tile_probs(t, a, kv, w->s);
    attention_tile_dscores(t, a, kv, w->s, w->ds);
    SmallGemm dq = {.m = t->rows, .n = hd, .k = width, .alpha = t->scale, .a = w->ds,
                    .lda = (size_t)ws, .b = kv->kb + (size_t)t->lo * kv->ld_rows,
                    .ldb = kv->ld_rows};
    attention_accumulate(t, dq, ATTN_ROWS_SUM_KEYS, a->dq, t->ld_q, w);
    SmallGemm dk = {.m = width, .n = hd, .k = t->rows, .alpha = t->scale, .trans_a = true,
                    .a = w->ds, .lda = (size_t)ws};
    dk.b = attention_rows_operand(w->qr, w->hd16, a->q, t->ld_q, t->rows, hd, &dk.ldb);
    attention_accumulate(t, dk, ATTN_KEYS_SUM_ROWS, a->dk, t->ld_kv, w);
    SmallGemm dv = {.m = width, .n = hd, .k = t->rows, .alpha = 1.0f, .trans_a = true,
                    .a = w->s, .lda = (size_t)ws};
    dv.b = attention_rows_operand(w->dor, w->hd16, a->dout, t->ld_q, t->rows, hd, &dv.ldb);
    attention_accumulate(t, dv, ATTN_KEYS_SUM_ROWS, a->dv, t->ld_kv, w);
}

// One task per (batch, kv head): it alone writes that kv head's dK, dV and its query heads'
// dQ, in a fixed order, so GQA needs no atomics and results do not depend on scheduling.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const AttnShape *s, void *workspace) {
    int group = s->n_heads / s->n_kv_heads;
    AttnGrads g = {q, out, dout, lse, dq, dk, dv};
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int kvh = 0; kvh < s->n_kv_heads; kvh++) {
            AttnScratch w = attention_scratch(workspace, s);
            AttnPanels kv = attention_panels(s, b, kvh, k, v, &w, true);
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int i0 = 0; i0 < s->Tq; i0 += ATTN_TILE) {
                    AttnTile t = attention_tile(s, b, h, i0);
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
