// Context parallel's attention math on one rank, without communication (docs/design.md
// "Parallelisms"): a call's workspace, this rank's tokens in chunk-major order, and its two
// query chunks (head and tail, parallel/cp/layout.h) against one rank's "unit" of key/value
// chunks, the partial results merged by their log-sum-exp (KernelOps.attention_merge);
// backward runs each chunk pair with the merged out and lse. parallel/cp/cp.c moves the units
// between the ranks.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "protocols/block.h"

// One call's sizes and its workspace, carved in one order for sizing and for use. A unit is
// what travels: one rank's K and V in chunk-major order [k head | k tail | v head | v tail],
// each chunk (B, c, n_kv_heads, head_dim).
typedef struct {
    int rank, size;            // this rank's place in the cp group
    int B, c, nh, nkv, hd;     // rows, chunk length, query and kv heads, head dim
    size_t qn, kvn, ln, unit;  // floats: a query chunk, a K (or V) chunk, an lse chunk, a unit
    AttnMask mask;
    Dtype compute;  // the kernel's operands (AttnShape.compute)
    size_t bytes;              // the whole workspace
    // Chunk-major (2, B, c, ...) copies of the local tensors, the slot index the chunk's.
    float *q, *out, *lse, *dout, *dq;
    float *part_out, *part_lse;  // one chunk pair's attention before it is merged
    float *kv;                   // (kv_units, unit): the units the rotation holds
    float *dkv;                  // (dkv_units, unit): their gradients
    int *doc;                    // (2 size, B, c) every chunk's document ids (carved always:
                                 // the sizing pass runs before a batch's documents are known)
    const int *seq_doc;          // (B, 2 size c) the whole sequences' ids they are cut from
                                 // (local's kv_doc, AttnHooks), under a document mask
    void *kernel_workspace;      // the kernel's, for one chunk pair
} CpWork;

// Carves base (NULL: only sizes) for a call on local (this rank's share of each sequence, as
// AttnHooks get it), with room for kv_units units and dkv_units of their gradients.
CpWork cp_work_carve(int rank, int size, int kv_units, int dkv_units, const KernelOps *k,
                     const AttnShape *local, void *base);
// Forward's inputs into the workspace: q (B, 2c, n_heads, head_dim) in chunks, and the chunks'
// document ids under a document mask; then its results back: out (like q), lse (B, n_heads,
// 2c).
void cp_forward_begin(const CpWork *w, const KernelOps *k, const float *q);
void cp_forward_end(const CpWork *w, const KernelOps *k, float *out, float *lse);
// The same for backward (dq zeroed), and its results: dq, and dk, dv from dunit, this rank's
// unit's summed gradient.
void cp_backward_begin(const CpWork *w, const KernelOps *k, const float *q, const float *dout,
                       const float *out, const float *lse);
void cp_backward_end(const CpWork *w, const KernelOps *k, float *dq, float *dk, float *dv,
                     const float *dunit);
// unit = this rank's k, v (B, 2c, n_kv_heads, head_dim) each, in chunks.
void cp_pack_unit(const CpWork *w, const KernelOps *k, float *unit, const float *kk,
                  const float *v);

// Called between chunk pairs (the rotation lets its transfers progress); NULL: nothing.
typedef struct {
    void (*fn)(void *ctx);
    void *ctx;
} CpBetweenPairs;

// Merges the attention of both query chunks against rank j's unit into w->out and w->lse; the
// first pair a query chunk sees writes them (filled), later ones are merged in.
void cp_forward_unit(const CpWork *w, const KernelOps *k, int j, const float *unit,
                     bool filled[2], const CpBetweenPairs *between);
// w->dq and dunit (rank j's unit's gradient) += both query chunks' gradients through it.
void cp_backward_unit(const CpWork *w, const KernelOps *k, int j, const float *unit,
                      float *dunit, const CpBetweenPairs *between);
