#include "optim/optim.h"

void adamw_allocate(AdamW *opt, size_t numel, Arena *state) {
    opt->numel = numel;
    opt->exp_avg = arena_floats(state, numel);
    opt->exp_avg_sq = arena_floats(state, numel);
    opt->ema = opt->ema_decay > 0 ? arena_floats(state, numel) : NULL;
    if (opt->muon.is_muon) muon_allocate(&opt->muon, state);
}

// Whether AdamW updates parameter i: not a buffer (Param.buffer: weight decay would shrink
// it), nor one of Muon's.
static bool adamw_updates(const AdamW *opt, const ParamTable *params, int i) {
    return !params->items[i].buffer && !(opt->muon.is_muon && opt->muon.is_muon[i]);
}

static void update(const AdamW *opt, const KernelOps *k, ParamTable *params, size_t first,
                   size_t n, double lr) {
    k->adamw_update(params->shard_data + first, params->shard_grad + first, opt->exp_avg + first,
                    opt->exp_avg_sq + first, n, (float)lr, (float)opt->beta1, (float)opt->beta2,
                    (float)opt->eps, (float)opt->weight_decay, opt->step);
}

// One update over the whole shard buffer; when some parameters are not AdamW's, one per run of
// contiguous shards of those that are.
static void update_trained(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    bool others = false;
    for (int i = 0; i < params->count; i++) others = others || !adamw_updates(opt, params, i);
    if (!others) {
        update(opt, k, params, 0, opt->numel, lr);
        return;
    }
    size_t first = 0, end = 0;
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        bool mine = adamw_updates(opt, params, i);
        if (!mine || p->shard_offset != end) {
            if (end > first) update(opt, k, params, first, end - first, lr);
            first = end = p->shard_offset + (mine ? 0 : p->shard_numel);
        }
        if (mine) end = p->shard_offset + p->shard_numel;
    }
    if (end > first) update(opt, k, params, first, end - first, lr);
}

static void update_muon(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    for (int i = 0, ordinal = 0; opt->muon.is_muon && i < params->count; i++) {
        const Param *p = &params->items[i];
        size_t at = p->shard_offset;
        if (!opt->muon.is_muon[i] || !p->shard_numel) continue;  // (other stages': empty)
        muon_update(&opt->muon, k, p, ordinal++, params->shard_data + at,
                    params->shard_grad + at, opt->exp_avg + at, lr, opt->weight_decay);
    }
}

void adamw_step(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    opt->step++;
    update_trained(opt, k, params, lr);
    update_muon(opt, k, params, lr);
    if (opt->ema)
        k->ema_update(opt->ema, params->shard_data, opt->numel, (float)(1.0 - opt->ema_decay));
}
