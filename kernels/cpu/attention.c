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
// (kernels/cpu/gemm_bf16.c); attention's single-threaded sgemms inside the OpenMP region stay.
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define ATTN_TILE 64

// The workspace holds one slice per OpenMP thread: two (ATTN_TILE, Tk) score tiles (forward
// uses one, backward P and dS).
static size_t attention_slice_floats(int Tk) { return (size_t)2 * ATTN_TILE * Tk; }

size_t cpu_attention_workspace_bytes(const AttnShape *s) {
    return (size_t)omp_get_max_threads() * attention_slice_floats(s->Tk) * sizeof(float);
}

static float *attention_scratch(void *workspace, int Tk) {
    return (float *)workspace + (size_t)omp_get_thread_num() * attention_slice_floats(Tk);
}

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

// The tile's o = softmax(scale q k^T) v through the (rows, width) scratch s; out and lse at
// the tile's first row.
static void attention_tile_forward(const AttnTile *t, float *o, float *lse, const float *q,
                                   const float *k, const float *v, float *s) {
    int w = t->width, hd = t->s->head_dim;
    float inv_sum[ATTN_TILE];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t->rows, w, hd, t->scale, q, t->ld_q,
                k, t->ld_kv, 0.0f, s, w);
    for (int r = 0; r < t->rows; r++) {
        float *sr = s + (size_t)r * w;
        inv_sum[r] = attention_exp_row(sr, attention_mask_row(t, sr, r), w, lse + r);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->rows, hd, w, 1.0f, s, w, v,
                t->ld_kv, 0.0f, o, t->ld_q);
    for (int r = 0; r < t->rows; r++) {
        float *orow = o + (size_t)r * t->ld_q;
#pragma omp simd
        for (int c = 0; c < hd; c++) orow[c] *= inv_sum[r];
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
    int n_tiles = (s->Tq + ATTN_TILE - 1) / ATTN_TILE;
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < s->n_heads; h++)
            for (int i = 0; i < n_tiles; i++) {
                AttnTile t = attention_tile(s, b, h, i * ATTN_TILE);
                if (t.width <= 0)
                    attention_tile_blind(&t, out + t.q0, lse + t.l0);
                else
                    attention_tile_forward(&t, out + t.q0, lse + t.l0, q + t.q0, k + t.kv0,
                                           v + t.kv0, attention_scratch(workspace, s->Tk));
            }
}

// ---- backward --------------------------------------------------------------------------------

// What backward reads and adds into, each at the tile's first query row or key.
typedef struct AttnGrads {
    const float *q, *k, *v, *o, *dout, *lse;
    float *dq, *dk, *dv;
} AttnGrads;

static AttnGrads attention_grads_at(const AttnGrads *g, const AttnTile *t) {
    return (AttnGrads){g->q + t->q0,  g->k + t->kv0,  g->v + t->kv0,
                       g->o + t->q0,  g->dout + t->q0, g->lse + t->l0,
                       g->dq + t->q0, g->dk + t->kv0, g->dv + t->kv0};
}

// P = exp(S - lse) over the keys each row sees, zeros elsewhere (and on rows with lse = -inf,
// which see none).
static void attention_tile_probs(const AttnTile *t, const AttnGrads *a, float *p) {
    int w = t->width;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t->rows, w, t->s->head_dim, t->scale,
                a->q, t->ld_q, a->k, t->ld_kv, 0.0f, p, w);
    for (int r = 0; r < t->rows; r++) {
        float *pr = p + (size_t)r * w, l = a->lse[r];
        int n_valid = l == -INFINITY ? 0 : attention_mask_row(t, pr, r);
#pragma omp simd
        for (int j = 0; j < n_valid; j++) pr[j] = cpu_expf(pr[j] - l);
        for (int j = n_valid; j < w; j++) pr[j] = 0.0f;
    }
}

// dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D).
static void attention_tile_dscores(const AttnTile *t, const AttnGrads *a, const float *p,
                                   float *ds) {
    int w = t->width, hd = t->s->head_dim;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t->rows, w, hd, 1.0f, a->dout,
                t->ld_q, a->v, t->ld_kv, 0.0f, ds, w);
    for (int r = 0; r < t->rows; r++) {
        const float *gr = a->dout + (size_t)r * t->ld_q, *orow = a->o + (size_t)r * t->ld_q;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int c = 0; c < hd; c++) d += gr[c] * orow[c];
        const float *pr = p + (size_t)r * w;
        float *dsr = ds + (size_t)r * w;
#pragma omp simd
        for (int j = 0; j < w; j++) dsr[j] = pr[j] * (dsr[j] - d);
    }
}

// One query tile's contribution to all three gradients, p and ds being (rows, width) scratch:
// dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO.
static void attention_tile_backward(const AttnTile *t, const AttnGrads *a, float *p, float *ds) {
    int w = t->width, hd = t->s->head_dim;
    attention_tile_probs(t, a, p);
    attention_tile_dscores(t, a, p, ds);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t->rows, hd, w, t->scale, ds, w,
                a->k, t->ld_kv, 1.0f, a->dq, t->ld_q);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w, hd, t->rows, t->scale, ds, w, a->q,
                t->ld_q, 1.0f, a->dk, t->ld_kv);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w, hd, t->rows, 1.0f, p, w, a->dout,
                t->ld_q, 1.0f, a->dv, t->ld_kv);
}

// One task per (batch, kv head): it alone writes that kv head's dK, dV and its query heads'
// dQ, in a fixed order, so GQA needs no atomics and results do not depend on scheduling.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            const AttnShape *s, void *workspace) {
    int group = s->n_heads / s->n_kv_heads;
    AttnGrads g = {q, k, v, out, dout, lse, dq, dk, dv};
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < s->B; b++)
        for (int kvh = 0; kvh < s->n_kv_heads; kvh++) {
            float *p = attention_scratch(workspace, s->Tk);
            float *ds = p + (size_t)ATTN_TILE * s->Tk;
            for (int h = kvh * group; h < (kvh + 1) * group; h++)
                for (int i0 = 0; i0 < s->Tq; i0 += ATTN_TILE) {
                    AttnTile t = attention_tile(s, b, h, i0);
                    if (t.width <= 0) continue;
                    AttnGrads a = attention_grads_at(&g, &t);
                    attention_tile_backward(&t, &a, p, ds);
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
