#include "parallel/cp/attention.h"

#include "core/errors.h"
#include "parallel/cp/layout.h"

static AttnShape chunk_shape(const CpWork *w) {
    return (AttnShape){.B = w->B, .Tq = w->c, .Tk = w->c, .n_heads = w->nh,
                       .n_kv_heads = w->nkv, .head_dim = w->hd, .mask = w->mask,
                       .compute = w->compute};
}

CpWork cp_work_carve(int rank, int size, int kv_units, int dkv_units, const KernelOps *k,
                     const AttnShape *local, void *base) {
    CHECK(local->Tq == local->Tk && local->Tq % 2 == 0);
    CpWork w = {.rank = rank, .size = size, .B = local->B, .c = local->Tq / 2,
                .nh = local->n_heads, .nkv = local->n_kv_heads, .hd = local->head_dim,
                .mask = local->mask, .compute = local->compute, .seq_doc = local->kv_doc};
    w.qn = (size_t)w.B * w.c * w.nh * w.hd;
    w.kvn = (size_t)w.B * w.c * w.nkv * w.hd;
    w.ln = (size_t)w.B * w.nh * w.c;
    w.unit = 4 * w.kvn;
    char *p = base;
    size_t at = 0;
#define CARVE(field, type, count)                                      \
    do {                                                               \
        w.field = base ? (type *)(p + at) : NULL;                      \
        at += ((count) * sizeof(type) + 255) / 256 * 256;              \
    } while (0)
    CARVE(q, float, 2 * w.qn);
    CARVE(out, float, 2 * w.qn);
    CARVE(lse, float, 2 * w.ln);
    CARVE(dout, float, 2 * w.qn);
    CARVE(dq, float, 2 * w.qn);
    CARVE(part_out, float, w.qn);
    CARVE(part_lse, float, w.ln);
    CARVE(kv, float, (size_t)kv_units * w.unit);
    CARVE(dkv, float, (size_t)dkv_units * w.unit);
    CARVE(doc, int, (size_t)2 * size * w.B * w.c);
#undef CARVE
    AttnShape pair = chunk_shape(&w);
    w.kernel_workspace = base ? p + at : NULL;
    at += k->attention_workspace_bytes(&pair);
    w.bytes = at;
    return w;
}

// The global position of the first token of rank j's chunk `slot` (0: head, 1: tail).
static int chunk_start(const CpWork *w, int j, int slot) {
    int head, tail, len;
    cp_chunks(2 * w->size * w->c, w->size, j, &head, &tail, &len);
    return slot == 0 ? head : tail;
}

// chunks (2, B, c, width) <-> x (B, 2c, width): a rank's tokens, head chunk then tail chunk.
static void to_chunks(const KernelOps *k, float *chunks, const float *x, int B, int c,
                      size_t width) {
    size_t row = (size_t)c * width * sizeof(float);
    for (int slot = 0; slot < 2; slot++)
        k->copy_rows(chunks + slot * (size_t)B * c * width, row, x + slot * (size_t)c * width,
                     2 * row, row, B);
}
static void from_chunks(const KernelOps *k, float *x, const float *chunks, int B, int c,
                        size_t width) {
    size_t row = (size_t)c * width * sizeof(float);
    for (int slot = 0; slot < 2; slot++)
        k->copy_rows(x + slot * (size_t)c * width, 2 * row, chunks + slot * (size_t)B * c * width,
                     row, row, B);
}
// The same for lse, laid out (B, n_heads, T): its chunks are (B * n_heads) rows of c.
static void lse_to_chunks(const KernelOps *k, float *chunks, const float *lse, const CpWork *w) {
    to_chunks(k, chunks, lse, w->B * w->nh, w->c, 1);
}
static void lse_from_chunks(const KernelOps *k, float *lse, const float *chunks, const CpWork *w) {
    from_chunks(k, lse, chunks, w->B * w->nh, w->c, 1);
}

void cp_pack_unit(const CpWork *w, const KernelOps *k, float *unit, const float *kk,
                  const float *v) {
    size_t width = (size_t)w->nkv * w->hd;
    to_chunks(k, unit, kk, w->B, w->c, width);
    to_chunks(k, unit + 2 * w->kvn, v, w->B, w->c, width);
}

// k, v (B, 2c, n_kv_heads, head_dim) each from a unit: cp_pack_unit's inverse.
static void unpack_unit(const CpWork *w, const KernelOps *k, float *kk, float *v,
                        const float *unit) {
    size_t width = (size_t)w->nkv * w->hd;
    from_chunks(k, kk, unit, w->B, w->c, width);
    from_chunks(k, v, unit + 2 * w->kvn, w->B, w->c, width);
}

// Every chunk's document ids (B, c), chunk (j, slot) at index 2j + slot, from the (B, T) ids
// of the whole sequences.
static void gather_documents(const CpWork *w, const KernelOps *k) {
    size_t T = (size_t)2 * w->size * w->c, row = (size_t)w->c * sizeof(int);
    for (int j = 0; j < w->size; j++)
        for (int slot = 0; slot < 2; slot++)
            k->copy_rows(w->doc + (size_t)(2 * j + slot) * w->B * w->c, row,
                         w->seq_doc + chunk_start(w, j, slot), T * sizeof(int), row, w->B);
}

// The attention of this rank's query chunk q_slot against rank j's key chunk kv_slot, or false
// when the mask hides every key from every query (the key chunk lies in the queries' future).
static bool pair_shape(const CpWork *w, int q_slot, int j, int kv_slot, AttnShape *out) {
    *out = chunk_shape(w);
    out->q_start = chunk_start(w, w->rank, q_slot);
    out->kv_start = chunk_start(w, j, kv_slot);
    if (w->mask != ATTN_NONE && out->kv_start >= out->q_start + w->c) return false;
    // Every key in the queries' past: no mask to apply (the kernels' cheaper path).
    if (w->mask == ATTN_CAUSAL && out->kv_start + w->c <= out->q_start) out->mask = ATTN_NONE;
    if (w->mask == ATTN_DOCUMENT) {
        out->q_doc = w->doc + (size_t)(2 * w->rank + q_slot) * w->B * w->c;
        out->kv_doc = w->doc + (size_t)(2 * j + kv_slot) * w->B * w->c;
    }
    return true;
}

static void between_pairs(const CpBetweenPairs *between) {
    if (between) between->fn(between->ctx);
}

void cp_forward_unit(const CpWork *w, const KernelOps *k, int j, const float *unit,
                     bool filled[2], const CpBetweenPairs *between) {
    for (int kv_slot = 0; kv_slot < 2; kv_slot++)
        for (int q_slot = 0; q_slot < 2; q_slot++) {
            AttnShape pair;
            if (!pair_shape(w, q_slot, j, kv_slot, &pair)) continue;
            float *out = w->out + q_slot * w->qn, *lse = w->lse + q_slot * w->ln;
            const float *kc = unit + kv_slot * w->kvn, *vc = unit + (2 + kv_slot) * w->kvn;
            const float *q = w->q + q_slot * w->qn;
            if (!filled[q_slot]) {
                k->attention_forward(out, lse, q, kc, vc, &pair, w->kernel_workspace);
                filled[q_slot] = true;
            } else {
                k->attention_forward(w->part_out, w->part_lse, q, kc, vc, &pair,
                                     w->kernel_workspace);
                k->attention_merge(out, lse, w->part_out, w->part_lse, w->B, w->c, w->nh, w->hd);
            }
            between_pairs(between);
        }
}

void cp_backward_unit(const CpWork *w, const KernelOps *k, int j, const float *unit,
                      float *dunit, const CpBetweenPairs *between) {
    for (int kv_slot = 0; kv_slot < 2; kv_slot++)
        for (int q_slot = 0; q_slot < 2; q_slot++) {
            AttnShape pair;
            if (!pair_shape(w, q_slot, j, kv_slot, &pair)) continue;
            size_t qo = q_slot * w->qn, lo = q_slot * w->ln;
            k->attention_backward(w->dq + qo, dunit + kv_slot * w->kvn,
                                  dunit + (2 + kv_slot) * w->kvn, w->dout + qo, w->q + qo,
                                  unit + kv_slot * w->kvn, unit + (2 + kv_slot) * w->kvn,
                                  w->out + qo, w->lse + lo, &pair, w->kernel_workspace);
            between_pairs(between);
        }
}

void cp_forward_begin(const CpWork *w, const KernelOps *k, const float *q) {
    to_chunks(k, w->q, q, w->B, w->c, (size_t)w->nh * w->hd);
    if (w->mask == ATTN_DOCUMENT) gather_documents(w, k);
}

void cp_forward_end(const CpWork *w, const KernelOps *k, float *out, float *lse) {
    from_chunks(k, out, w->out, w->B, w->c, (size_t)w->nh * w->hd);
    lse_from_chunks(k, lse, w->lse, w);
}

void cp_backward_begin(const CpWork *w, const KernelOps *k, const float *q, const float *dout,
                       const float *out, const float *lse) {
    size_t width = (size_t)w->nh * w->hd;
    to_chunks(k, w->q, q, w->B, w->c, width);
    to_chunks(k, w->dout, dout, w->B, w->c, width);
    to_chunks(k, w->out, out, w->B, w->c, width);
    lse_to_chunks(k, w->lse, lse, w);
    k->zero(w->dq, 2 * w->qn * sizeof(float));
    if (w->mask == ATTN_DOCUMENT) gather_documents(w, k);
}

void cp_backward_end(const CpWork *w, const KernelOps *k, float *dq, float *dk, float *dv,
                     const float *dunit) {
    from_chunks(k, dq, w->dq, w->B, w->c, (size_t)w->nh * w->hd);
    unpack_unit(w, k, dk, dv, dunit);
}
