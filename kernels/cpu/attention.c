// Causal grouped-query attention, FlashAttention-style (Dao et al. 2022): queries go in tiles
// of ATTN_TILE rows, each tile's scores against keys [0, tile end) live only in a per-thread
// scratch, and backward recomputes the probabilities from the saved log-sum-exp instead of
// storing the (T, T) matrix.
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"

#define ATTN_TILE 64

// The workspace holds one slice per OpenMP thread: two (ATTN_TILE, T) score tiles (forward
// uses one, backward P and dS).
static size_t attention_slice_floats(int T) { return (size_t)2 * ATTN_TILE * T; }

size_t cpu_attention_workspace_bytes(int B, int T, int n_heads, int n_kv_heads, int head_dim) {
    (void)B, (void)n_heads, (void)n_kv_heads, (void)head_dim;
    return (size_t)omp_get_max_threads() * attention_slice_floats(T) * sizeof(float);
}

static float *attention_scratch(void *workspace, int T) {
    return (float *)workspace + (size_t)omp_get_thread_num() * attention_slice_floats(T);
}

// Where one (batch, head) starts in a (B, T, heads, head_dim) tensor, and its row stride.
typedef struct HeadView {
    size_t offset;
    int ld;
} HeadView;

static HeadView attention_head(int b, int h, int T, int heads, int head_dim) {
    return (HeadView){((size_t)b * T * heads + h) * head_dim, heads * head_dim};
}

// Row r of s (query i0 + r, kv_len wide) becomes exp(s - max) over keys [0, i0 + r] and zeros
// beyond; returns 1 / sum, which is applied to the (narrower) output row after P V instead.
static float attention_exp_row(float *s, int n_valid, int kv_len, float *lse) {
    float mx = cpu_max_floats(s, n_valid), sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n_valid; j++) {
        s[j] = cpu_expf(s[j] - mx);
        sum += s[j];
    }
    for (int j = n_valid; j < kv_len; j++) s[j] = 0.0f;
    *lse = mx + logf(sum);
    return 1.0f / sum;
}

// One query tile (rows queries from i0, row stride ld_q) of one head against keys
// [0, i0 + rows): o = softmax(scale q k^T) v, through the (rows, kv_len) scratch s.
static void attention_tile_forward(float *o, float *lse, const float *q, int ld_q,
                                   const float *k, const float *v, int ld_kv, int rows, int i0,
                                   int head_dim, float *s) {
    int kv_len = i0 + rows;
    float inv_sum[ATTN_TILE];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kv_len, head_dim,
                1.0f / sqrtf((float)head_dim), q, ld_q, k, ld_kv, 0.0f, s, kv_len);
    for (int r = 0; r < rows; r++)
        inv_sum[r] = attention_exp_row(s + (size_t)r * kv_len, i0 + r + 1, kv_len, lse + r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, head_dim, kv_len, 1.0f, s,
                kv_len, v, ld_kv, 0.0f, o, ld_q);
    for (int r = 0; r < rows; r++) {
        float *orow = o + (size_t)r * ld_q;
#pragma omp simd
        for (int c = 0; c < head_dim; c++) orow[c] *= inv_sum[r];
    }
}

void cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                           const float *v, int B, int T, int n_heads, int n_kv_heads,
                           int head_dim, void *workspace) {
    int n_tiles = (T + ATTN_TILE - 1) / ATTN_TILE, group = n_heads / n_kv_heads;
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < n_heads; h++)
            for (int t = 0; t < n_tiles; t++) {
                int i0 = t * ATTN_TILE, rows = T - i0 < ATTN_TILE ? T - i0 : ATTN_TILE;
                HeadView qh = attention_head(b, h, T, n_heads, head_dim);
                HeadView kh = attention_head(b, h / group, T, n_kv_heads, head_dim);
                size_t q0 = qh.offset + (size_t)i0 * qh.ld;
                attention_tile_forward(out + q0, lse + ((size_t)b * n_heads + h) * T + i0,
                                       q + q0, qh.ld, k + kh.offset, v + kh.offset, kh.ld,
                                       rows, i0, head_dim,
                                       attention_scratch(workspace, T));
            }
}

// One query tile's contribution to all four gradients. p and ds are (rows, kv_len) scratch.
// P = exp(S - lse), dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D); then
// dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO.
typedef struct AttnTile {
    const float *q, *k, *v, *o, *dout, *lse; // q, o, dout at the tile's first row
    float *dq, *dk, *dv;                     // dq at the tile's first row
    int ld_q, ld_kv, rows, i0, head_dim;
    float scale;
} AttnTile;

static void attention_tile_probs(const AttnTile *a, float *p, int kv_len) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a->rows, kv_len, a->head_dim, a->scale,
                a->q, a->ld_q, a->k, a->ld_kv, 0.0f, p, kv_len);
    for (int r = 0; r < a->rows; r++) {
        float *pr = p + (size_t)r * kv_len, l = a->lse[r];
        int n_valid = a->i0 + r + 1;
#pragma omp simd
        for (int j = 0; j < n_valid; j++) pr[j] = cpu_expf(pr[j] - l);
        for (int j = n_valid; j < kv_len; j++) pr[j] = 0.0f;
    }
}

static void attention_tile_dscores(const AttnTile *a, const float *p, float *ds, int kv_len) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a->rows, kv_len, a->head_dim, 1.0f,
                a->dout, a->ld_q, a->v, a->ld_kv, 0.0f, ds, kv_len);
    for (int r = 0; r < a->rows; r++) {
        const float *gr = a->dout + (size_t)r * a->ld_q, *orow = a->o + (size_t)r * a->ld_q;
        float d = 0.0f;
#pragma omp simd reduction(+ : d)
        for (int c = 0; c < a->head_dim; c++) d += gr[c] * orow[c];
        const float *pr = p + (size_t)r * kv_len;
        float *dsr = ds + (size_t)r * kv_len;
#pragma omp simd
        for (int j = 0; j < kv_len; j++) dsr[j] = pr[j] * (dsr[j] - d);
    }
}

static void attention_tile_backward(const AttnTile *a, float *p, float *ds) {
    int kv_len = a->i0 + a->rows, hd = a->head_dim;
    attention_tile_probs(a, p, kv_len);
    attention_tile_dscores(a, p, ds, kv_len);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, a->rows, hd, kv_len, a->scale, ds,
                kv_len, a->k, a->ld_kv, 1.0f, a->dq, a->ld_q);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kv_len, hd, a->rows, a->scale, ds,
                kv_len, a->q, a->ld_q, 1.0f, a->dk, a->ld_kv);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kv_len, hd, a->rows, 1.0f, p, kv_len,
                a->dout, a->ld_q, 1.0f, a->dv, a->ld_kv);
}

// One task per (batch, kv head): it alone writes that kv head's dK, dV and its query heads'
// dQ, in a fixed order, so GQA needs no atomics and results do not depend on scheduling.
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            int B, int T, int n_heads, int n_kv_heads, int head_dim,
                            void *workspace) {
    int group = n_heads / n_kv_heads;
    float scale = 1.0f / sqrtf((float)head_dim);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int kvh = 0; kvh < n_kv_heads; kvh++) {
            float *p = attention_scratch(workspace, T);
            float *ds = p + (size_t)ATTN_TILE * T;
            HeadView kh = attention_head(b, kvh, T, n_kv_heads, head_dim);
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                HeadView qh = attention_head(b, h, T, n_heads, head_dim);
                for (int i0 = 0; i0 < T; i0 += ATTN_TILE) {
                    size_t q0 = qh.offset + (size_t)i0 * qh.ld;
                    AttnTile a = {
                        .q = q + q0, .k = k + kh.offset, .v = v + kh.offset, .o = out + q0,
                        .dout = dout + q0, .lse = lse + ((size_t)b * n_heads + h) * T + i0,
                        .dq = dq + q0, .dk = dk + kh.offset, .dv = dv + kh.offset,
                        .ld_q = qh.ld, .ld_kv = kh.ld,
                        .rows = T - i0 < ATTN_TILE ? T - i0 : ATTN_TILE, .i0 = i0,
                        .head_dim = head_dim, .scale = scale,
                    };
                    attention_tile_backward(&a, p, ds);
                }
            }
        }
}
