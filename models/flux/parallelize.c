// FLUX's tensor-parallel plan (Megatron-LM without sequence parallel; torchtitan's FLUX has no
// TP plan): the hidden state stays whole on every tp rank. In each block the Linears that
// project into the heads or the MLP are column-parallel (Shard(0): this rank's heads of q, k,
// v and its MLP columns; the fused ones blocked, so that each rank holds its slice of every
// part), the ones that project back are row-parallel (Shard(1), their outputs summed over the
// ranks, models/flux/layers.h's flux_linear_forward_reduced), and attention runs on the rank's
// heads. Everything else (the modulations, embedders, final layer, the row-parallel Linears'
// biases) is replicated and computed redundantly on every rank, so its gradient is whole there
// (TP_REDUNDANT); only the QK-norm weights, applied to the rank's heads alone, get partial
// gradients (TP_REPLICATE, summed over tp).
#include <stdio.h>

#include "core/errors.h"
#include "models/flux/layers.h"
#include "parallel/tp.h"

const char *flux_tp_check(const FluxArgs *a, int tp, char *err, size_t len) {
    if (a->num_heads % tp)
        snprintf(err, len, "model flux: parallelism.tensor_parallel_degree %d does not divide "
                 "num_heads (%d)", tp, a->num_heads);
    else if (flux_mlp_hidden(a) % tp)
        snprintf(err, len, "model flux: parallelism.tensor_parallel_degree %d does not divide "
                 "the MLP width (%d)", tp, flux_mlp_hidden(a));
    else
        return NULL;
    return err;
}

// l's weight as the table's (the Linear reads it through a const pointer).
static Param *weight_of(ParamTable *t, const FluxLinear *l) {
    return &t->items[l->linear.weight - t->items];
}

// Column-parallel: the weight (out, in) and its bias (out) cut along out, in n parts.
static void colwise(const Tp *tp, ParamTable *t, FluxLinear *l, int n, const int64_t *parts) {
    tp_shard_blocked(tp, t, weight_of(t, l), 0, n, parts);
    if (l->bias) tp_shard_blocked(tp, t, l->bias, 0, n, parts);
}

// Row-parallel: the weight cut along in, in n parts; the bias added once after the sum.
static void rowwise(const Tp *tp, ParamTable *t, FluxLinear *l, int n, const int64_t *parts) {
    tp_shard_blocked(tp, t, weight_of(t, l), 1, n, parts);
    if (l->bias) tp_shard(tp, t, l->bias, TP_REDUNDANT);
}

static void qk_norms(const Tp *tp, ParamTable *t, Param *q_norm, Param *k_norm) {
    tp_shard(tp, t, q_norm, TP_REPLICATE);
    tp_shard(tp, t, k_norm, TP_REPLICATE);
}

static void parallelize_stream(const Tp *tp, ParamTable *t, FluxStream *st, int64_t D,
                               int64_t M) {
    colwise(tp, t, &st->qkv, 3, (int64_t[]){D, D, D});
    rowwise(tp, t, &st->proj, 1, (int64_t[]){D});
    colwise(tp, t, &st->mlp_in, 1, (int64_t[]){M});
    rowwise(tp, t, &st->mlp_out, 1, (int64_t[]){M});
    qk_norms(tp, t, st->q_norm, st->k_norm);
}

static void parallelize_single(const Tp *tp, ParamTable *t, FluxSingle *b, int64_t D,
                               int64_t M) {
    colwise(tp, t, &b->linear1, 4, (int64_t[]){D, D, D, M});
    rowwise(tp, t, &b->linear2, 2, (int64_t[]){D, M});
    qk_norms(tp, t, b->q_norm, b->k_norm);
}

void flux_parallelize_tp(Model *m, const Tp *tp) {
    ParamTable *t = &m->params;
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        if (b->ops == &FLUX_DOUBLE_OPS) {
            FluxDouble *blk = b->self;
            int64_t D = blk->args->hidden_size, M = flux_mlp_hidden(blk->args);
            parallelize_stream(tp, t, &blk->img, D, M);
            parallelize_stream(tp, t, &blk->txt, D, M);
        } else if (b->ops == &FLUX_SINGLE_OPS) {
            FluxSingle *blk = b->self;
            parallelize_single(tp, t, blk, blk->args->hidden_size, flux_mlp_hidden(blk->args));
        }
    }
    for (int i = 0; i < t->count; i++)  // what the blocks did not cut
        if (!param_placement_on(&t->items[i], MESH_TP)) tp_shard(tp, t, &t->items[i], TP_REDUNDANT);
    m->tp = &tp->hooks;
    m->tp_whole_rows = true;
}

// Blocks of [first, last) within [lo, hi).
static int overlap(int first, int last, int lo, int hi) {
    int a = first > lo ? first : lo, b = last < hi ? last : hi;
    return b > a ? b - a : 0;
}

// All-reduces of whole rows, whatever the group's size: a double block sums its streams' rows
// (B (T - 1) in all: the vec row aside) twice in forward (proj's and mlp_out's outputs) and
// twice in backward (qkv's and mlp_in's input gradients), a single block once each (linear2,
// linear1). A recomputed layer's forward runs again: exact under full checkpointing (all of
// them), under selective checkpointing the double blocks counted first.
uint64_t flux_tp_bytes_per_microbatch(const FluxArgs *a, int B, int T, int recomputed_layers,
                                      int first_block, int last_block) {
    int doubles = overlap(first_block, last_block, 1, 1 + a->depth);
    int singles = overlap(first_block, last_block, 1 + a->depth,
                          1 + a->depth + a->depth_single_blocks);
    int rec_doubles = recomputed_layers < doubles ? recomputed_layers : doubles;
    int rec_singles = recomputed_layers - rec_doubles;
    CHECK(rec_singles <= singles);
    uint64_t seams = 4 * (uint64_t)doubles + 2 * (uint64_t)rec_doubles + 2 * (uint64_t)singles +
                     (uint64_t)rec_singles;
    return 4 * seams * (uint64_t)B * (uint64_t)(T - 1) * (uint64_t)a->hidden_size;
}
