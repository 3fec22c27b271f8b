// Grouped-query attention in fp32 kernels, after FlashAttention-2 (Dao 2023), for any AttnShape
// (offsets, Tq != Tk, every mask): the (Tq, Tk) score matrix never exists. The forward gives a
// block ATTN_Q_ROWS query rows of one head and walks 32-key tiles of K and V through shared
// memory, each row's running max, running sum and unnormalised output (the online softmax)
// staying in registers. The backward recomputes the probabilities from the saved log-sum-exp:
// first D_i = rowsum(dout_i * out_i), then one kernel whose blocks own a tile of keys
// accumulates their dK, dV over every query row that may see them, of every query head in the
// kv head's group, and one whose blocks own a tile of query rows accumulates their dQ over the
// keys. Every gradient row has one owner that adds into it once: no atomics, the same bits on
// every run, for computing the scores twice (FA-2 instead adds dQ atomically).
//
// Lanes map to keys (forward, dQ) or to query rows (dK/dV) for the dot products over head_dim,
// and to columns d = lane + 32c for the accumulations; NC = ceil(head_dim / 32) rounded up to 1,
// 2, 4 or 8 picks the instantiation, so any head_dim up to 256 and any Tq, Tk run. Blocks walk
// the keys (or query rows) that the causal bound lets them see; within a tile each lane tests
// its own (query, key) pair against the mask, and a row that has seen no key yet keeps a
// running max of -inf without producing NaN.
#include <math.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/device.cuh"

#define ATTN_WARPS 4
#define ATTN_THREADS (ATTN_WARPS * 32)
// Forward and dQ: a warp carries ATTN_ROWS_PER_WARP query rows over tiles of 32 keys.
#define ATTN_ROWS_PER_WARP 4
#define ATTN_Q_ROWS (ATTN_WARPS * ATTN_ROWS_PER_WARP)
#define ATTN_KEYS 32
// dK/dV: a warp carries ATTN_KEYS_PER_WARP keys over tiles of 32 query rows.
#define ATTN_KEYS_PER_WARP 4
#define ATTN_KV_ROWS (ATTN_WARPS * ATTN_KEYS_PER_WARP)
#define ATTN_Q_TILE 32
#define ATTN_FULL_MASK 0xffffffffu

static float attn_scale(AttnShape s) { return 1.0f / sqrtf((float)s.head_dim); }

// Shared rows that each lane reads whole (lane j: row j) get an odd pitch, so that the 32 lanes
// reading column d hit 32 different banks.
static __host__ __device__ __forceinline__ int attn_pitch(int head_dim) { return head_dim | 1; }

// Whether query row i of sequence b sees key row j (AttnShape's mask).
static __device__ __forceinline__ bool attn_sees(const AttnShape &s, int b, int i, int j) {
    if (s.mask == ATTN_NONE) return true;
    if (s.kv_start + j > s.q_start + i) return false;
    return s.mask == ATTN_CAUSAL ||
           s.q_doc[(size_t)b * s.Tq + i] == s.kv_doc[(size_t)b * s.Tk + j];
}

// Keys [0, end) that query rows before rows_end may see by position.
static __device__ __forceinline__ int attn_keys_end(const AttnShape &s, int rows_end) {
    if (s.mask == ATTN_NONE) return s.Tk;
    return max(0, min(s.q_start + rows_end - s.kv_start, s.Tk));
}

// The first query row that may see key j by position.
static __device__ __forceinline__ int attn_rows_begin(const AttnShape &s, int j) {
    if (s.mask == ATTN_NONE) return 0;
    return max(0, min(s.kv_start + j - s.q_start, s.Tq));
}

// Offset of (b, t, head, 0) in a (B, T, heads, head_dim) tensor.
static __device__ __forceinline__ size_t attn_at(int b, int t, int head, int T, int heads,
                                                 int head_dim) {
    return (((size_t)b * T + t) * heads + head) * head_dim;
}

// Rows [t0, t0 + n) of one head into shared memory, pitch floats apart; rows from T on read as
// zeros. Consecutive threads take consecutive columns of a row: coalesced.
static __device__ void attn_load_rows(float *dst, int pitch, int n, const float *src, int b,
                                      int t0, int head, int T, int heads, int head_dim) {
    for (int e = threadIdx.x; e < n * head_dim; e += blockDim.x) {
        int r = e / head_dim, d = e - r * head_dim, t = t0 + r;
        dst[r * pitch + d] = t < T ? src[attn_at(b, t, head, T, heads, head_dim) + d] : 0.0f;
    }
}

static __device__ __forceinline__ float attn_dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma unroll 8
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

// The key tiles that query rows [q0, q0 + ATTN_Q_ROWS) of one head may see, walked alike by the
// forward and the dQ kernels: each tile of ATTN_KEYS rows of K and V (kv head kvh) into ks and
// vs (pitch attn_pitch(D)), then tile(r, row, sees, n) for each of this warp's rows r that
// exists: row its index in the block (query q0 + row), sees whether it sees this lane's key of
// the tile, n the tile's keys. The first barrier also waits for the rows the caller loaded.
template <typename Tile>
static __device__ __forceinline__ void attn_key_tiles(const AttnShape &s, const float *k,
                                                      const float *v, float *ks, float *vs,
                                                      int b, int kvh, int q0, Tile tile) {
    int D = s.head_dim, pitch = attn_pitch(D), Tq = s.Tq, KV = s.n_kv_heads;
    int n_keys = attn_keys_end(s, min(q0 + ATTN_Q_ROWS, Tq));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int k0 = 0; k0 < n_keys; k0 += ATTN_KEYS) {
        __syncthreads();  // the previous tile is consumed (and, at first, the rows are loaded)
        attn_load_rows(ks, pitch, ATTN_KEYS, k, b, k0, kvh, s.Tk, KV, D);
        attn_load_rows(vs, pitch, ATTN_KEYS, v, b, k0, kvh, s.Tk, KV, D);
        __syncthreads();
        int j = k0 + lane, n = min(ATTN_KEYS, n_keys - k0);
#pragma unroll
        for (int r = 0; r < ATTN_ROWS_PER_WARP; r++) {
            int row = warp * ATTN_ROWS_PER_WARP + r, i = q0 + row;
            if (i < Tq) tile(r, row, j < n_keys && attn_sees(s, b, i, j), n);
        }
    }
}

// ---- forward ---------------------------------------------------------------------------------

// acc (this lane's columns lane + 32c of D) += sum over the tile's first n rows of w_j row_j,
// w_j being lane j's w: the probability- or gradient-weighted sum of a tile of V or K rows.
template <int NC>
static __device__ __forceinline__ void attn_add_weighted_rows(float acc[NC], float w,
                                                              const float *rows, int pitch,
                                                              int n, int D) {
    int lane = threadIdx.x & 31;
    for (int j = 0; j < n; j++) {
        float wj = __shfl_sync(ATTN_FULL_MASK, w, j);
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < D) acc[c] += wj * rows[j * pitch + lane + 32 * c];
    }
}

// Row i's update over one key tile of n keys (lane j: key k0 + j, seen when sees): the scores,
// the new running max m, the running sum l and acc (this lane's columns of sum_j p_j v_j)
// rescaled to that max. While the row has seen no key, m stays -inf and the shift is 0, so that
// p and alpha are 0 rather than NaN.
template <int NC>
static __device__ __forceinline__ void attn_forward_tile(float *m, float *l, float acc[NC],
                                                         const float *qrow, const float *ks,
                                                         const float *vs, int D, bool sees,
                                                         int n, float scale) {
    int lane = threadIdx.x & 31, pitch = attn_pitch(D);
    float s = sees ? attn_dot(qrow, ks + lane * pitch, D) * scale : -INFINITY;
    float m_new = fmaxf(*m, warp_max(s)), shift = m_new == -INFINITY ? 0.0f : m_new;
    float p = sees ? expf(s - shift) : 0.0f, alpha = expf(*m - shift);  // 0 at first
    *l = *l * alpha + warp_sum(p);
    *m = m_new;
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] *= alpha;
    attn_add_weighted_rows<NC>(acc, p, vs, pitch, n, D);
}

template <int NC>
static __device__ __forceinline__ void attn_forward_store(float *orow, float *lse, float m,
                                                          float l, const float acc[NC], int D) {
    int lane = threadIdx.x & 31;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key: out 0, lse -inf
#pragma unroll
    for (int c = 0; c < NC; c++)
        if (lane + 32 * c < D) orow[lane + 32 * c] = acc[c] * inv;
    if (lane == 0) *lse = l > 0.0f ? m + logf(l) : -INFINITY;
}

template <int NC>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_forward_rows(float *out, float *lse, const float *q, const float *k, const float *v,
                      AttnShape s, float scale) {
    extern __shared__ float smem[];
    int D = s.head_dim, pitch = attn_pitch(D), Tq = s.Tq, H = s.n_heads, KV = s.n_kv_heads;
    float *qs = smem, *ks = qs + ATTN_Q_ROWS * D, *vs = ks + ATTN_KEYS * pitch;
    int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV), warp = threadIdx.x >> 5;
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATTN_Q_ROWS;  // the longest rows are scheduled first
    float m[ATTN_ROWS_PER_WARP], l[ATTN_ROWS_PER_WARP], acc[ATTN_ROWS_PER_WARP][NC];
#pragma unroll
    for (int r = 0; r < ATTN_ROWS_PER_WARP; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    }
    attn_load_rows(qs, D, ATTN_Q_ROWS, q, b, q0, h, Tq, H, D);
    attn_key_tiles(s, k, v, ks, vs, b, kvh, q0, [&](int r, int row, bool sees, int n) {
        attn_forward_tile<NC>(&m[r], &l[r], acc[r], qs + row * D, ks, vs, D, sees, n, scale);
    });
#pragma unroll
    for (int r = 0; r < ATTN_ROWS_PER_WARP; r++) {
        int i = q0 + warp * ATTN_ROWS_PER_WARP + r;
        if (i < Tq)
            attn_forward_store<NC>(out + attn_at(b, i, h, Tq, H, D),
                                   lse + ((size_t)b * H + h) * Tq + i, m[r], l[r], acc[r], D);
    }
}

// ---- backward --------------------------------------------------------------------------------

// dvec (B, H, Tq): D_i = rowsum(dout_i * out_i), one warp per (b, t, head) row.
static __global__ void attn_dvec_rows(float *dvec, const float *dout, const float *out,
                                      AttnShape s) {
    int lane = threadIdx.x & 31, D = s.head_dim;
    size_t rows = (size_t)s.B * s.Tq * s.n_heads, warps = (size_t)gridDim.x * blockDim.x / 32;
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < rows;
         row += warps) {
        const float *g = dout + row * D, *o = out + row * D;
        float acc = 0.0f;
        for (int d = lane; d < D; d += 32) acc += g[d] * o[d];
        acc = warp_sum(acc);
        size_t bt = row / s.n_heads, h = row % s.n_heads, b = bt / s.Tq, t = bt % s.Tq;
        if (lane == 0) dvec[(b * s.n_heads + h) * s.Tq + t] = acc;
    }
}

// Key j's contributions from one tile of n query rows (lane r: row i0 + r, live when it sees
// the key): p = exp(scale q.k - lse), ds = p (dout.v - D); dv += sum_r p_r dout_r,
// dk += sum_r ds_r q_r.
template <int NC>
static __device__ __forceinline__ void attn_dkdv_tile(float dk[NC], float dv[NC],
                                                      const float *krow, const float *vrow,
                                                      const float *qs, const float *gs,
                                                      const float *lse, const float *dvec,
                                                      int D, bool sees, int n, float scale) {
    int lane = threadIdx.x & 31, pitch = attn_pitch(D);
    float p = 0.0f, ds = 0.0f;
    if (sees) {
        p = expf(attn_dot(qs + lane * pitch, krow, D) * scale - lse[lane]);
        ds = p * (attn_dot(gs + lane * pitch, vrow, D) - dvec[lane]);
    }
    for (int r = 0; r < n; r++) {
        float pr = __shfl_sync(ATTN_FULL_MASK, p, r), dsr = __shfl_sync(ATTN_FULL_MASK, ds, r);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (d < D) dv[c] += pr * gs[r * pitch + d], dk[c] += dsr * qs[r * pitch + d];
        }
    }
}

// A block owns ATTN_KV_ROWS keys of one kv head and sweeps the query rows that see them.
template <int NC>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_dkdv_rows(float *dk, float *dv, const float *dout, const float *q, const float *k,
                   const float *v, const float *lse, const float *dvec, AttnShape s,
                   float scale) {
    extern __shared__ float smem[];
    int D = s.head_dim, pitch = attn_pitch(D), Tq = s.Tq, H = s.n_heads, KV = s.n_kv_heads;
    float *ks = smem, *vs = ks + ATTN_KV_ROWS * D, *qs = vs + ATTN_KV_ROWS * D;
    float *gs = qs + ATTN_Q_TILE * pitch, *ls = gs + ATTN_Q_TILE * pitch, *dsum = ls + ATTN_Q_TILE;
    int b = blockIdx.z, kvh = blockIdx.y, group = H / KV, warp = threadIdx.x >> 5;
    int j0 = (gridDim.x - 1 - blockIdx.x) * ATTN_KV_ROWS;  // the keys most rows see go first
    float dk_acc[ATTN_KEYS_PER_WARP][NC], dv_acc[ATTN_KEYS_PER_WARP][NC];
#pragma unroll
    for (int kk = 0; kk < ATTN_KEYS_PER_WARP; kk++)
#pragma unroll
        for (int c = 0; c < NC; c++) dk_acc[kk][c] = dv_acc[kk][c] = 0.0f;
    attn_load_rows(ks, D, ATTN_KV_ROWS, k, b, j0, kvh, s.Tk, KV, D);
    attn_load_rows(vs, D, ATTN_KV_ROWS, v, b, j0, kvh, s.Tk, KV, D);
    int lane = threadIdx.x & 31;
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int i0 = attn_rows_begin(s, j0) / ATTN_Q_TILE * ATTN_Q_TILE; i0 < Tq;
             i0 += ATTN_Q_TILE) {
            __syncthreads();  // the previous tile is consumed
            attn_load_rows(qs, pitch, ATTN_Q_TILE, q, b, i0, h, Tq, H, D);
            attn_load_rows(gs, pitch, ATTN_Q_TILE, dout, b, i0, h, Tq, H, D);
            if (threadIdx.x < ATTN_Q_TILE) {
                int i = i0 + threadIdx.x;
                size_t at = ((size_t)b * H + h) * Tq + i;
                ls[threadIdx.x] = i < Tq ? lse[at] : 0.0f;
                dsum[threadIdx.x] = i < Tq ? dvec[at] : 0.0f;
            }
            __syncthreads();
            int n = min(Tq - i0, ATTN_Q_TILE), i = i0 + lane;
#pragma unroll
            for (int kk = 0; kk < ATTN_KEYS_PER_WARP; kk++) {
                int jl = warp * ATTN_KEYS_PER_WARP + kk, j = j0 + jl;
                if (j < s.Tk)
                    attn_dkdv_tile<NC>(dk_acc[kk], dv_acc[kk], ks + jl * D, vs + jl * D, qs, gs,
                                       ls, dsum, D, lane < n && attn_sees(s, b, i, j), n, scale);
            }
        }
#pragma unroll
    for (int kk = 0; kk < ATTN_KEYS_PER_WARP; kk++) {
        int j = j0 + warp * ATTN_KEYS_PER_WARP + kk;
        if (j >= s.Tk) continue;
        size_t at = attn_at(b, j, kvh, s.Tk, KV, D);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            int d = lane + 32 * c;
            if (d < D) dk[at + d] += dk_acc[kk][c] * scale, dv[at + d] += dv_acc[kk][c];
        }
    }
}

// Row i's dQ contribution from one key tile of n keys (lane j: key k0 + j, live when seen):
// ds = p (dout.v - D), p = exp(scale q.k - lse); acc += sum_j ds_j k_j.
template <int NC>
static __device__ __forceinline__ void attn_dq_tile(float acc[NC], const float *qrow,
                                                    const float *grow, const float *ks,
                                                    const float *vs, int D, bool sees, int n,
                                                    float lse, float dvec, float scale) {
    int lane = threadIdx.x & 31, pitch = attn_pitch(D);
    float ds = 0.0f;
    if (sees) {
        float p = expf(attn_dot(qrow, ks + lane * pitch, D) * scale - lse);
        ds = p * (attn_dot(grow, vs + lane * pitch, D) - dvec);
    }
    attn_add_weighted_rows<NC>(acc, ds, ks, pitch, n, D);
}

// A block owns ATTN_Q_ROWS query rows of one head and sweeps the keys they see.
template <int NC>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_dq_rows(float *dq, const float *dout, const float *q, const float *k, const float *v,
                 const float *lse, const float *dvec, AttnShape s, float scale) {
    extern __shared__ float smem[];
    int D = s.head_dim, pitch = attn_pitch(D), Tq = s.Tq, H = s.n_heads, KV = s.n_kv_heads;
    float *qs = smem, *gs = qs + ATTN_Q_ROWS * D, *ks = gs + ATTN_Q_ROWS * D;
    float *vs = ks + ATTN_KEYS * pitch;
    int b = blockIdx.z, h = blockIdx.y, kvh = h / (H / KV), warp = threadIdx.x >> 5;
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATTN_Q_ROWS;
    float row_lse[ATTN_ROWS_PER_WARP], row_d[ATTN_ROWS_PER_WARP], acc[ATTN_ROWS_PER_WARP][NC];
#pragma unroll
    for (int r = 0; r < ATTN_ROWS_PER_WARP; r++) {
        int i = q0 + warp * ATTN_ROWS_PER_WARP + r;
        size_t at = ((size_t)b * H + h) * Tq + i;
        row_lse[r] = i < Tq ? lse[at] : 0.0f, row_d[r] = i < Tq ? dvec[at] : 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) acc[r][c] = 0.0f;
    }
    attn_load_rows(qs, D, ATTN_Q_ROWS, q, b, q0, h, Tq, H, D);
    attn_load_rows(gs, D, ATTN_Q_ROWS, dout, b, q0, h, Tq, H, D);
    attn_key_tiles(s, k, v, ks, vs, b, kvh, q0, [&](int r, int row, bool sees, int n) {
        attn_dq_tile<NC>(acc[r], qs + row * D, gs + row * D, ks, vs, D, sees, n, row_lse[r],
                         row_d[r], scale);
    });
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < ATTN_ROWS_PER_WARP; r++) {
        int i = q0 + warp * ATTN_ROWS_PER_WARP + r;
        if (i >= Tq) continue;
        float *dqrow = dq + attn_at(b, i, h, Tq, H, D);
#pragma unroll
        for (int c = 0; c < NC; c++)
            if (lane + 32 * c < D) dqrow[lane + 32 * c] += acc[r][c] * scale;
    }
}

// ---- launches --------------------------------------------------------------------------------

// Columns per lane, ceil(head_dim / 32), rounded up to an instantiated kernel.
static int attn_chunks(int head_dim) {
    CHECK(head_dim >= 1 && head_dim <= 256);
    int nc = (head_dim + 31) / 32;
    return nc == 1 ? 1 : nc == 2 ? 2 : nc <= 4 ? 4 : 8;
}

// Blocks above 48 KiB of dynamic shared memory (head_dim past about 128) must opt in.
template <typename Kernel>
static void attn_allow_smem(Kernel kernel, size_t bytes) {
    if (bytes > (size_t)48 << 10)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)bytes));
}

// Q rows, then the K and V tiles.
static size_t attn_forward_smem(int D) {
    return ((size_t)ATTN_Q_ROWS * D + 2 * (size_t)ATTN_KEYS * attn_pitch(D)) * sizeof(float);
}

// Q and dout rows, then the K and V tiles.
static size_t attn_dq_smem(int D) {
    return (2 * (size_t)ATTN_Q_ROWS * D + 2 * (size_t)ATTN_KEYS * attn_pitch(D)) * sizeof(float);
}

// K and V rows, the Q and dout tiles, and the tile's lse and D.
static size_t attn_dkdv_smem(int D) {
    return (2 * (size_t)ATTN_KV_ROWS * D + 2 * (size_t)ATTN_Q_TILE * attn_pitch(D) +
            2 * ATTN_Q_TILE) *
           sizeof(float);
}

template <int NC>
static void attn_forward_launch(float *out, float *lse, const float *q, const float *k,
                                const float *v, AttnShape s) {
    size_t smem = attn_forward_smem(s.head_dim);
    attn_allow_smem(attn_forward_rows<NC>, smem);
    dim3 grid((s.Tq + ATTN_Q_ROWS - 1) / ATTN_Q_ROWS, s.n_heads, s.B);
    attn_forward_rows<NC><<<grid, ATTN_THREADS, smem, cuda_stream()>>>(out, lse, q, k, v, s,
                                                                         attn_scale(s));
    CUDA_LAUNCH_CHECK();
}

template <int NC>
static void attn_backward_launch(float *dq, float *dk, float *dv, const float *dout,
                                 const float *q, const float *k, const float *v,
                                 const float *lse, const float *dvec, AttnShape s) {
    size_t kv_smem = attn_dkdv_smem(s.head_dim), q_smem = attn_dq_smem(s.head_dim);
    attn_allow_smem(attn_dkdv_rows<NC>, kv_smem);
    dim3 kv_grid((s.Tk + ATTN_KV_ROWS - 1) / ATTN_KV_ROWS, s.n_kv_heads, s.B);
    attn_dkdv_rows<NC><<<kv_grid, ATTN_THREADS, kv_smem, cuda_stream()>>>(
        dk, dv, dout, q, k, v, lse, dvec, s, attn_scale(s));
    CUDA_LAUNCH_CHECK();
    attn_allow_smem(attn_dq_rows<NC>, q_smem);
    dim3 q_grid((s.Tq + ATTN_Q_ROWS - 1) / ATTN_Q_ROWS, s.n_heads, s.B);
    attn_dq_rows<NC><<<q_grid, ATTN_THREADS, q_smem, cuda_stream()>>>(dq, dout, q, k, v, lse,
                                                                        dvec, s, attn_scale(s));
    CUDA_LAUNCH_CHECK();
}

size_t attn_fallback_workspace_bytes(AttnShape s) {
    return (size_t)s.B * s.n_heads * s.Tq * sizeof(float);
}

void attn_fallback_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                           AttnShape s) {
    switch (attn_chunks(s.head_dim)) {
    case 1: attn_forward_launch<1>(out, lse, q, k, v, s); break;
    case 2: attn_forward_launch<2>(out, lse, q, k, v, s); break;
    case 4: attn_forward_launch<4>(out, lse, q, k, v, s); break;
    default: attn_forward_launch<8>(out, lse, q, k, v, s); break;
    }
}

void attn_fallback_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *out, const float *lse,
                            AttnShape s, void *workspace) {
    float *dvec = (float *)workspace;
    size_t rows = (size_t)s.B * s.Tq * s.n_heads;
    attn_dvec_rows<<<cuda_grid(rows * 32), CUDA_THREADS, 0, cuda_stream()>>>(dvec, dout, out, s);
    CUDA_LAUNCH_CHECK();
    switch (attn_chunks(s.head_dim)) {
    case 1: attn_backward_launch<1>(dq, dk, dv, dout, q, k, v, lse, dvec, s); break;
    case 2: attn_backward_launch<2>(dq, dk, dv, dout, q, k, v, lse, dvec, s); break;
    case 4: attn_backward_launch<4>(dq, dk, dv, dout, q, k, v, lse, dvec, s); break;
    default: attn_backward_launch<8>(dq, dk, dv, dout, q, k, v, lse, dvec, s); break;
    }
}
