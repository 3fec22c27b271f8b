// The decoder's tensor-parallel plan: which weight is column-, row- or vocab-parallel (the
// model's own knowledge, as torchtitan's models/llama3/infra/parallelize.py and qwen3's); the
// mechanisms are parallel/tp's.
#include <stdio.h>

#include "core/errors.h"
#include "models/decoder/blocks.h"
#include "parallel/tp.h"

const char *decoder_tp_check(const DecoderArgs *a, int tp, int B, int T, char *err,
                             size_t len) {
    struct { const char *what; long long n; } splits[] = {
        {"model n_heads", a->n_heads},
        {"model n_kv_heads", a->n_kv_heads},
        {"the FFN hidden dim", decoder_hidden_dim(a)},  // 0 in MoE layers: they are whole
        {"model vocab_size", a->vocab_size},
        {"the rows of a microbatch on a cp rank (local_batch_size x seq_len / "
         "context_parallel_degree, sequence parallel)",
         (long long)B * T},
    };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++)
        if (splits[i].n % tp != 0) {
            snprintf(err, len, "parallelism.tensor_parallel_degree %d does not divide %s (%lld)",
                     tp, splits[i].what, splits[i].n);
            return err;
        }
    return NULL;
}

// A MoE layer runs on each rank's sequence-parallel rows with all of its weights: replicated.
static void parallelize_moe(MoeLayer *moe, ParamTable *t, const Tp *tp) {
    Param *params[MOE_MAX_PARAMS];
    int n = moe_layer_params(moe, params);
    for (int i = 0; i < n; i++) tp_shard(tp, t, params[i], TP_REPLICATE);
}

// torchtitan's deepseek_v3 plan: the up-projections (wq or wq_b, wkv_b) column-parallel by
// head; the low-rank down-projections and their norms replicated, run by every rank on the
// gathered rows. Their gradients come from this rank's heads only, a partial sum: TP_REPLICATE.
static void parallelize_mla(MlaWeights *w, ParamTable *t, const Tp *tp) {
    Param *colwise[] = {w->wq, w->wq_b, w->wkv_b}, *replicated[] = {w->wq_a, w->q_norm, w->wkv_a,
                                                                      w->kv_norm};
    for (size_t i = 0; i < 3; i++)
        if (colwise[i]) tp_shard(tp, t, colwise[i], 0);
    for (size_t i = 0; i < 4; i++)
        if (replicated[i]) tp_shard(tp, t, replicated[i], TP_REPLICATE);
}

static void parallelize_layer(DecoderLayer *L, ParamTable *t, const Tp *tp) {
    if (L->mla.on) {
        parallelize_mla(&L->mla, t, tp);
    } else {
        tp_shard(tp, t, L->wq, 0);
        tp_shard(tp, t, L->wk, 0);
        tp_shard(tp, t, L->wv, 0);
    }
    tp_shard(tp, t, L->wo, 1);
    if (L->moe) {
        parallelize_moe(L->moe, t, tp);
    } else {
        tp_shard(tp, t, L->w1, 0);
        tp_shard(tp, t, L->w3, 0);
        tp_shard(tp, t, L->w2, 1);
    }
    tp_shard(tp, t, L->attention_norm, TP_REPLICATE);
    tp_shard(tp, t, L->ffn_norm, TP_REPLICATE);
    if (L->q_norm) {  // each rank's heads are whole: every rank needs all of the weights
        tp_shard(tp, t, L->q_norm, TP_REPLICATE);
        tp_shard(tp, t, L->k_norm, TP_REPLICATE);
    }
}

// An MTP module's norms and eh_proj run on this rank's sequence-parallel rows, replicated with
// partial gradients (as the MoE layers); its layer is a layer.
static void parallelize_mtp(DecoderMtp *mtp, ParamTable *t, const Tp *tp) {
    Param *replicated[] = {mtp->enorm, mtp->hnorm, mtp->eh_proj, mtp->mtp_norm};
    for (size_t i = 0; i < 4; i++) tp_shard(tp, t, replicated[i], TP_REPLICATE);
    parallelize_layer(&mtp->layer, t, tp);
}

void decoder_parallelize_tp(Model *m, const Tp *tp) {
    ParamTable *t = &m->params;
    for (int i = 1; i + 1 < m->n_blocks; i++) parallelize_layer(m->blocks[i].self, t, tp);
    DecoderEmbed *e = m->blocks[0].self;
    DecoderHead *h = m->blocks[m->n_blocks - 1].self;
    for (int j = 0; j < h->args->mtp_layers; j++) parallelize_mtp(&h->mtp[j], t, tp);
    tp_shard(tp, t, e->tok_embeddings, 0);
    if (h->embed) tp_shard(tp, t, h->embed, 0);
    if (h->output != e->tok_embeddings) tp_shard(tp, t, h->output, 0);
    tp_shard(tp, t, h->norm, TP_REPLICATE);
    m->tp = &tp->hooks;
}

uint64_t decoder_tp_bytes_per_microbatch(const DecoderArgs *args, int tp, int B, int T,
                                         int recomputed_layers, bool loss_parallel,
                                         int first_block, int last_block) {
    bool embed = first_block == 0, head = last_block == args->n_layers + 2;
    uint64_t bt = (uint64_t)B * T;
    // A MoE FFN has no seam (it runs on the rank's rows); its balance loss all-reduces its
    // sequences' statistics, 2 B E floats, in every forward and recompute. The recomputed
    // layers are counted as the range's first ones.
    uint64_t seams = embed + head, moe_forwards = 0;
    for (int b = first_block + embed, i = 0; b < last_block - head; b++, i++) {
        bool moe = decoder_layer_is_moe(args, b - 1);
        uint64_t per_layer = moe ? 2 : 4, forwards = 1 + (i < recomputed_layers);
        seams += per_layer + per_layer / 2 * (forwards - 1);
        moe_forwards += moe ? forwards : 0;
    }
    uint64_t loss = !head            ? 0
                    : loss_parallel ? 3 * bt
                                    : bt * (uint64_t)args->vocab_size / (uint64_t)tp;
    // The MTP modules, in the head: each its inputs' lookup as the embedding's, its layer's
    // seams (a copy of the last layer's, never recomputed) and its loss's as the head's.
    bool mtp_moe = decoder_layer_is_moe(args, args->n_layers - 1);
    uint64_t mtp = head ? (uint64_t)args->mtp_layers : 0;
    seams += mtp * (1 + (mtp_moe ? 2 : 4) + 1);
    moe_forwards += mtp_moe ? mtp : 0;
    loss *= 1 + mtp;
    uint64_t aux = args->moe.aux_loss_alpha > 0
                       ? moe_forwards * 2 * (uint64_t)B * (uint64_t)args->moe.router.n_experts
                       : 0;
    return 4 * (seams * (bt + bt / (uint64_t)tp) * (uint64_t)args->dim + loss + aux);
}
