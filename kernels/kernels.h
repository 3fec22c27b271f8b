// The one op interface. Model code calls only these; each backend (kernels/cpu, kernels/cuda
// with CUDA=1) fills one KernelOps table, picked at run time by kernels_backend(name).
//
// Conventions shared by every op:
// - Row-major fp32 tensors in the backend's memory (host memory on cpu, device memory on
//   cuda), allocated through the memory section below. Shapes are given in the comments as
//   (rows, cols). Index arrays (tokens, targets, positions, document ids, expert ids and
//   counts) live in the same memory, unless an op says otherwise.
// - Ops run in issue order on the backend's one queue (a CUDA stream on cuda) and may return
//   before they finish; download, sum and sum_squares wait for everything queued.
// - Numerics: fp32 storage and reductions on both backends. The cpu backend computes in fp32;
//   the cuda backend computes GEMMs and attention in bf16 with fp32 accumulation when
//   KernelInit.bf16_compute is set (torchtitan's mixed_precision_param: bfloat16), else in
//   fp32.
// - Linear layers keep weights as (out_features, in_features), like torch.nn.Linear, so a
//   forward is y = x W^T.
// - Backward ops ACCUMULATE (+=) into every gradient they produce, inputs' and parameters'
//   alike (as in llm.c): the residual stream and gradient accumulation need no extra adds.
//   Callers zero gradient buffers when a fresh gradient is wanted.
// - Attention tensors use the layout (B, T, n_heads, head_dim); log-sum-exp is (B, n_heads, T).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// What a backend is started with.
typedef struct {
    int local_rank;     // this process's index among the ranks of its node: picks the device
    bool bf16_compute;  // GEMMs and attention in bf16 (fp32 accumulation) where supported
} KernelInit;

// Which keys a query sees, by global sequence position (query row i is at q_start + i, key
// row j at kv_start + j): ATTN_CAUSAL, keys at or before the query; ATTN_NONE, every key;
// ATTN_DOCUMENT, causal and of the same document (block-causal attention over packed
// documents, as torchtitan's document masking).
typedef enum { ATTN_CAUSAL, ATTN_NONE, ATTN_DOCUMENT } AttnMask;

// One attention call: B sequences of Tq query rows against Tk key/value rows. A single
// sequence is Tq = Tk = T, q_start = kv_start = 0; context parallel pairs a query chunk with
// another rank's key/value chunk through the offsets.
typedef struct AttnShape {
    int B, Tq, Tk, n_heads, n_kv_heads, head_dim;
    int q_start, kv_start;  // global positions of the first query row and first key row
    AttnMask mask;
    const int *q_doc, *kv_doc;  // ATTN_DOCUMENT only: document ids (B, Tq), (B, Tk)
} AttnShape;

// A token-choice router's settings (torchtitan's TokenChoiceTopKRouter, models/moe): each of n
// tokens picks top_k of n_experts experts.
typedef enum { MOE_SCORE_SOFTMAX, MOE_SCORE_SIGMOID } MoeScoreFunc;
typedef struct {
    int n_experts, top_k;
    MoeScoreFunc score_func;
    // Group-limited routing (DeepSeek V3): the experts form n_groups groups of equal size and a
    // token chooses only within the limited_groups groups whose top-2 selection scores sum
    // highest. n_groups 0 or 1: off.
    int n_groups, limited_groups;
    bool route_norm;    // the chosen scores are divided by their sum (+ 1e-20)
    float route_scale;  // and then multiplied by this
} MoeRouter;

typedef struct KernelOps {
    const char *name;
    // One line naming what runs underneath (library, kernels, threads): benchmarks report it.
    void (*describe)(char *buf, size_t len);
    // The device's dense peak FLOP/s in the compute dtype (after init), the denominator of MFU
    // when metrics.peak_flops is 0; 0 when unknown (cpu).
    double (*peak_flops)(void);

    // ---- memory and the queue ----------------------------------------------------------------
    // Starts the backend (device, stream, library handles); false with a one-line reason in why
    // when it cannot run on this machine (no device, no driver).
    bool (*init)(const KernelInit *init, char *why, size_t len);
    // True when tensors are host memory (cpu): host code may then read and write them directly.
    bool host_memory;
    // True when the backend honours KernelInit.bf16_compute (cuda), and training then follows
    // torchtitan's mixed precision (bf16 compute weights under FSDP); the cpu backend computes
    // and communicates fp32 whatever mixed_precision_param asks.
    bool mixed_precision;
    // True when every op gives the same bits on every run (cpu: each output element has one
    // owner that sums in a fixed order). cuda is not: its embedding backward adds repeated
    // tokens' rows with atomics, and cuDNN's attention backward adds dQ with atomics, so
    // training.deterministic is refused there (torch.use_deterministic_algorithms raises too).
    bool deterministic;
    // The queue every op is issued on (a cudaStream_t), which collectives must wait for; NULL
    // on cpu.
    void *(*queue)(void);
    // bytes of zeroed tensor memory, aligned to at least 256 bytes; NULL when there is no room.
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    // Bytes of tensor memory this process could still allocate (after init): cpu: the smaller
    // of /proc/meminfo's MemAvailable and the room left under the process's memory cgroups
    // (v2 memory.max, v1 memory.limit_in_bytes, ancestors included), which every process of
    // the node draws on; cuda: the device's free memory (cudaMemGetInfo). SIZE_MAX if unknown.
    size_t (*memory_free)(void);
    // host -> tensor memory and back; both return once the bytes have arrived (download waits
    // for the queued work that produces them).
    void (*upload)(void *dst, const void *host_src, size_t bytes);
    void (*download)(void *host_dst, const void *src, size_t bytes);
    // Within tensor memory: bytes; and `rows` rows of row_bytes each, from rows src_pitch bytes
    // apart to rows dst_pitch bytes apart (a strided 2-D copy).
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*copy_rows)(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t row_bytes, size_t rows);
    void (*zero)(void *dst, size_t bytes);

    // c (m, n) = op(a) op(b) + beta * c, op(x) = x^T when trans_x. op(a) is (m, k), op(b) is
    // (k, n); a, b, c are dense row-major (leading dimension = their column count).
    void (*matmul)(float *c, const float *a, const float *b, int m, int n, int k, bool trans_a,
                   bool trans_b, float beta);

    // out (n, dim) = x / sqrt(mean(x^2) + eps) * weight; rstd (n) saved for backward.
    void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *weight, int n,
                            int dim, float eps);
    void (*rmsnorm_backward)(float *dx, float *dweight, const float *dout, const float *x,
                             const float *weight, const float *rstd, int n, int dim);

    // Rotary embedding on interleaved pairs (x[2i], x[2i+1]) of each head, as torchtitan's
    // complex-number formulation: row r of x (n_rows = B*T, each n_heads*head_dim wide) is at
    // position pos[r % T]; cos/sin are (max_pos, head_dim/2) tables. In place allowed.
    void (*rope_forward)(float *out, const float *x, const float *cos, const float *sin,
                         const int *pos, int n_rows, int T, int n_heads, int head_dim);
    // dx += R(pos)^T dout
    void (*rope_backward)(float *dx, const float *dout, const float *cos, const float *sin,
                          const int *pos, int n_rows, int T, int n_heads, int head_dim);

    // Grouped-query attention of a block of queries against a block of keys and values,
    // softmax scale 1/sqrt(head_dim), as AttnShape describes (see there for the mask). q, out:
    // (B, Tq, n_heads, head_dim); k, v: (B, Tk, n_kv_heads, head_dim); query head h reads kv
    // head h / (n_heads / n_kv_heads). lse (B, n_heads, Tq) is the natural-log log-sum-exp of
    // each row of visible scaled scores, saved for backward and for attention_merge; a row
    // that sees no key gets lse = -inf and out = 0, so a chunk pair whose keys all lie in the
    // queries' future is legal.
    // workspace: attention_workspace_bytes(shape) of scratch for the call's duration (the same
    // for forward and backward), carved by the caller from its arena so that no op allocates
    // inside the step. It depends on the sizes only, not on the mask, offsets or document ids:
    // the pass that sizes the arena runs before any batch's documents are known.
    size_t (*attention_workspace_bytes)(const AttnShape *shape);
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                              const float *v, const AttnShape *shape, void *workspace);
    // out and lse are the final ones, over every key the queries see (FlashAttention's
    // backward): when the keys came in chunks merged by attention_merge, backward runs once
    // per chunk with the merged out and lse, its dq contributions adding up over the chunks. A
    // row with lse = -inf takes and gives no gradient.
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v, const float *out,
                               const float *lse, const AttnShape *shape, void *workspace);
    // In place, the softmax-weighted merge of two partial attentions of the same queries over
    // disjoint key sets: lse = logaddexp(lse, lse2); out = e^(lse_old - lse) out +
    // e^(lse2 - lse) out2 (a side with lse = -inf weighs 0; both -inf give out = 0, lse =
    // -inf). out, out2: (B, T, n_heads, head_dim); lse, lse2: (B, n_heads, T).
    void (*attention_merge)(float *out, float *lse, const float *out2, const float *lse2, int B,
                            int T, int n_heads, int head_dim);
    // One decoding step over a KV cache: q (n_heads, head_dim), the newest position's queries,
    // attends to cache rows [0, n_ctx) of k_cache, v_cache (rows n_kv_heads*head_dim wide; query
    // head h reads kv head h / (n_heads / n_kv_heads) as above), scale 1/sqrt(head_dim); out
    // (n_heads, head_dim). With the cache holding a sequence's k and v this is row n_ctx - 1 of
    // attention_forward; rows from n_ctx on are never read. Needs no workspace.
    void (*attention_decode)(float *out, const float *q, const float *k_cache,
                             const float *v_cache, int n_ctx, int n_heads, int n_kv_heads,
                             int head_dim);

    // out (n) = silu(gate) * up, the SwiGLU of the FFN (gate = x W1^T, up = x W3^T).
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);

    // out (n, dim) = table[tokens[i] - vocab_start] for a table (rows, dim) holding the rows
    // [vocab_start, vocab_start + rows) of the whole vocabulary; backward scatters dout rows
    // into dtable. A token outside the slice gives a zero row and takes no gradient
    // (vocab-parallel: another rank's slice holds it); one table: vocab_start 0, rows = vocab.
    void (*embedding_forward)(float *out, const int *tokens, const float *table, int n, int dim,
                              int vocab_start, int rows);
    void (*embedding_backward)(float *dtable, const float *dout, const int *tokens, int n,
                               int dim, int vocab_start, int rows);

    // losses (n) = logsumexp(logits[i]) - logits[i][targets[i]].
    void (*cross_entropy_forward)(float *losses, const float *logits, const int *targets, int n,
                                  int vocab);
    // dlogits (n, vocab) += dloss * (softmax(logits[i]) - onehot(targets[i])): the gradient of
    // dloss * sum(losses). dlogits may alias logits (then it is overwritten, not accumulated).
    void (*cross_entropy_backward)(float *dlogits, const float *logits, const int *targets,
                                   int n, int vocab, float dloss);

    // Vocab-parallel cross-entropy (Megatron-LM's), on a slice of the vocabulary: logits (n,
    // vocab) are columns [vocab_start, vocab_start + vocab) of each row. lse (n) = logsumexp of
    // the row's slice; target_logit (n) = the target's logit, 0 when another slice holds it.
    // Over slices s: loss = M + log(sum_s exp(lse_s - M)) - sum_s target_logit_s, M = max_s lse_s.
    void (*cross_entropy_slice_forward)(float *lse, float *target_logit, const float *logits,
                                        const int *targets, int n, int vocab, int vocab_start);
    // dlogits (n, vocab) += dloss * (exp(logits - lse[i]) - onehot(targets[i] - vocab_start)),
    // lse (n) that of the whole row; dlogits may alias logits (then it is overwritten).
    void (*cross_entropy_slice_backward)(float *dlogits, const float *logits, const float *lse,
                                         const int *targets, int n, int vocab, int vocab_start,
                                         float dloss);
    // The merge's two elementwise steps around the all-reduces over slices: sums (n) =
    // exp(lse - max); then lse (n) = max + log(sums) and losses (n) = lse - target_logit.
    void (*cross_entropy_merge_exp)(float *sums, const float *lse, const float *max, int n);
    void (*cross_entropy_merge_finish)(float *losses, float *lse, const float *max,
                                       const float *sums, const float *target_logit, int n);

    // ---- mixture of experts (models/moe) -----------------------------------------------------
    // A MoE layer routes each of n tokens to k experts: its n*k "slots" (slot s: token s / k,
    // its s % k-th choice) run through the experts sorted by expert, rows [offsets[e],
    // offsets[e+1]) of the expert-sorted tensors being expert e's. row_of_slot (n*k) maps each
    // slot to its sorted row, -1 for a slot dropped by a capacity (which every op skips).

    // The router in fp32: scores (n, E) = softmax or sigmoid of logits (n, E); each token's
    // experts (n, k) = the top k of scores + bias (bias (E) or NULL: it steers the selection
    // only), within its limited groups when r->n_groups > 1, in descending order of that
    // selection score, ties to the lower expert id (and group); weight (n, k) = their scores,
    // normed and scaled as r says.
    void (*moe_router_forward)(float *weight, int *experts, float *scores, const float *logits,
                               const float *bias, const MoeRouter *r, int n);
    // dlogits (n, E) += the gradient of logits from dweight (n, k), the gradient of weight,
    // through the scores (scores and experts: forward's; the selection itself has none).
    void (*moe_router_backward)(float *dlogits, const float *dweight, const float *scores,
                                const int *experts, const MoeRouter *r, int n);
    // The expert-sorted order of n_slots slots with experts (n_slots) as the router chose them
    // (a stable sort: an expert's rows are its slots in slot order, on every backend): counts
    // (E) = slots routed to each expert, dropped ones included; when capacity > 0 an expert
    // keeps only its first capacity slots, the rest getting row -1; offsets (E + 1) the kept
    // rows' prefix sums (offsets[0] = 0, offsets[E] = rows kept); row_of_slot (n_slots).
    void (*moe_sort)(int *counts, int *offsets, int *row_of_slot, const int *experts,
                     int n_slots, int n_experts, int capacity);
    // out (rows, dim): row row_of_slot[s] = x[s / k] * weight[s] (weight (n*k), or NULL for 1):
    // the dispatch of tokens x (n, dim) to the sorted rows; with weight, combine's backward.
    // Writes every kept row (each is exactly one slot's).
    void (*moe_permute)(float *out, const float *x, const float *weight, const int *row_of_slot,
                        int n, int k, int dim);
    // y (n, dim) += for each token, the sum over its slots s in slot order of weight[s] *
    // rows[row_of_slot[s]] (weight NULL: 1): the weighted combine of the experts' outputs;
    // without weight, the dispatch's backward.
    void (*moe_unpermute)(float *y, const float *rows, const float *weight,
                          const int *row_of_slot, int n, int k, int dim);
    // dweight (n*k) += dot(dy[s / k], rows[row_of_slot[s]]): the combine's weight gradient.
    void (*moe_weight_grad)(float *dweight, const float *dy, const float *rows,
                            const int *row_of_slot, int n, int k, int dim);
    // Grouped GEMM over experts (torch._grouped_mm): offsets (groups + 1, HOST memory: the
    // layer reads its counts back once, expert parallel exchanges them anyway) split the rows
    // of a (rows, k) into groups, group g's rows R_g = [offsets[g], offsets[g+1]), possibly
    // none. trans_a false: c[R_g] (|R_g|, n) = a[R_g] op(b_g) + beta c[R_g], b (groups, n, k)
    // when trans_b (c = a W^T, the forward) else (groups, k, n) (the input gradient). trans_a
    // true (trans_b false): c_g (k, n) = a[R_g]^T b[R_g] + beta c_g, b (rows, n) split the
    // same way, c (groups, k, n): the weight gradient; a group with no rows gives beta c_g.
    void (*grouped_matmul)(float *c, const float *a, const float *b, const int *offsets,
                           int groups, int n, int k, bool trans_a, bool trans_b, float beta);

    // DeepSeek V3's sequence-wise balance loss, sum over experts i of frac_i prob_i per
    // sequence, on rows [first, first + n) of a batch of sequences of T tokens (batch row r in
    // sequence r / T), scores (n, E) and experts (n, k) as the router gave them: frac (rows'
    // sequences, E) += E / (k T) * each sequence's slots routed to expert i; prob += 1/T * the
    // sum over its rows of the scores normalised to sum 1 per row. Partial sums over the
    // pieces of a split sequence add up; frac and prob are indexed by sequence r / T.
    void (*moe_aux_stats)(float *frac, float *prob, const float *scores, const int *experts,
                          const MoeRouter *r, int n, int first, int T);
    // dlogits (n, E) += the gradient of dloss * sum_b sum_i frac[b][i] prob[b][i] (frac: the
    // whole sequences', a count of choices, constant) through prob's normalisation and the
    // score function, for the same rows.
    void (*moe_aux_backward)(float *dlogits, const float *frac, const float *scores,
                             const MoeRouter *r, int n, int first, int T, float dloss);

    // y (n) += x
    void (*add)(float *y, const float *x, size_t n);
    // x (n) *= s
    void (*scale)(float *x, size_t n, float s);
    // sum of x^2, and sum of x, in double precision (global grad norm; mean loss), on the host
    double (*sum_squares)(const float *x, size_t n);
    double (*sum)(const float *x, size_t n);
    // bf16 (round to nearest even, NaN kept NaN) and back: FSDP's bf16 all-gather of the
    // compute weights (torchtitan's mixed_precision_param).
    void (*to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*from_bf16)(float *dst, const uint16_t *src, size_t n);

    // One AdamW step (Loshchilov & Hutter, decoupled weight decay) as torch.optim.AdamW:
    // p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    // p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps). step counts from 1.
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, size_t n,
                         float lr, float beta1, float beta2, float eps, float weight_decay,
                         int step);
} KernelOps;

// The table for "cpu" (always built) or "cuda" (built with CUDA=1); NULL if not built.
const KernelOps *kernels_backend(const char *name);

#ifdef __cplusplus
}
#endif
