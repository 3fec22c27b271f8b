#include "optim/optim.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/errors.h"

// Whether AdamW updates parameter i: not a buffer (Param.buffer: weight decay would shrink
// it) nor frozen (Param.frozen), nor one of Muon's.
static bool adamw_updates(const AdamW *opt, const ParamTable *params, int i) {
    const Param *p = &params->items[i];
    return !p->buffer && !p->frozen && !(opt->muon.is_muon && opt->muon.is_muon[i]);
}

size_t adamw_first_at(const AdamW *opt, const ParamTable *params, int i) {
    return opt->first_at ? opt->first_at[i] : params->items[i].shard_offset;
}

size_t adamw_second_at(const AdamW *opt, const ParamTable *params, int i) {
    return opt->second_at ? opt->second_at[i] : params->items[i].shard_offset;
}

// at (parameters) = where each one's moment starts in an array holding those of the
// parameters `has` keeps, one after another; returns their floats.
static size_t moments_layout(size_t **at, const ParamTable *params, const bool *has) {
    free(*at);
    *at = xcalloc((size_t)(params->count ? params->count : 1), sizeof(size_t));
    size_t n = 0;
    for (int i = 0; i < params->count; i++) {
        (*at)[i] = has[i] ? n : SIZE_MAX;
        n += has[i] ? params->items[i].shard_numel : 0;
    }
    return n;
}

void adamw_allocate(AdamW *opt, const ParamTable *params, Arena *state) {
    opt->numel = opt->first_numel = opt->second_numel = params->shard_numel;
    bool frozen = false;
    for (int i = 0; i < params->count; i++) frozen = frozen || params->items[i].frozen;
    if (frozen || opt->muon.is_muon) {  // compacted: only the parameters that have them
        bool *has = xcalloc((size_t)(params->count ? params->count : 1), sizeof(bool));
        for (int i = 0; i < params->count; i++) has[i] = !params->items[i].frozen;
        if (frozen) opt->first_numel = moments_layout(&opt->first_at, params, has);
        for (int i = 0; i < params->count; i++)
            has[i] = has[i] && !(opt->muon.is_muon && opt->muon.is_muon[i]);
        opt->second_numel = moments_layout(&opt->second_at, params, has);
        free(has);
    }
    opt->exp_avg = arena_floats(state, opt->first_numel);
    opt->exp_avg_sq = arena_floats(state, opt->second_numel);
    opt->ema = opt->ema_decay > 0 ? arena_floats(state, opt->numel) : NULL;
    OuterState *o = &opt->outer;
    o->weights = o->on ? arena_floats(state, opt->numel) : NULL;
    o->momentum = o->on ? arena_floats(state, opt->numel) : NULL;
    o->delta = o->on ? arena_floats(state, opt->numel) : NULL;
    if (opt->muon.is_muon) muon_allocate(&opt->muon, state);
}

// AdamW over the n floats of shard storage from parameter i's shard on: parameters laid out
// one after another, every one AdamW's.
static void update(const AdamW *opt, const KernelOps *k, ParamTable *params, int i, size_t n,
                   double lr) {
    size_t at = params->items[i].shard_offset, first = adamw_first_at(opt, params, i);
    size_t second = adamw_second_at(opt, params, i), grad = params->items[i].shard_grad_offset;
    k->adamw_update(params->shard_data + at, params->shard_grad + grad, opt->exp_avg + first,
                    opt->exp_avg_sq + second, n, (float)lr, (float)opt->beta1,
                    (float)opt->beta2, (float)opt->eps, (float)opt->weight_decay, opt->step);
}

// One update over the whole shard buffer; when some parameters are not AdamW's, one per run of
// contiguous shards of those that are.
static void update_trained(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    bool others = false;
    for (int i = 0; i < params->count; i++) others = others || !adamw_updates(opt, params, i);
    if (!others) {
        if (params->count) update(opt, k, params, 0, opt->numel, lr);
        return;
    }
    int run = -1;  // the first parameter of the run, -1: none open
    size_t end = 0;
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        bool mine = adamw_updates(opt, params, i);
        if (run >= 0 && (!mine || p->shard_offset != end)) {
            update(opt, k, params, run, end - params->items[run].shard_offset, lr);
            run = -1;
        }
        if (mine && run < 0) run = i;
        end = p->shard_offset + p->shard_numel;
    }
    if (run >= 0) update(opt, k, params, run, end - params->items[run].shard_offset, lr);
}

static void update_muon(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    for (int i = 0, ordinal = 0; opt->muon.is_muon && i < params->count; i++) {
        const Param *p = &params->items[i];
        size_t at = p->shard_offset;
        if (!opt->muon.is_muon[i] || !p->shard_numel) continue;  // (other stages': empty)
        muon_update(&opt->muon, k, p, ordinal++, params->shard_data + at,
                    params->shard_grad + p->shard_grad_offset,
                    opt->exp_avg + adamw_first_at(opt, params, i), lr,
                    opt->weight_decay);
    }
}

void adamw_step(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    opt->step++;
    update_trained(opt, k, params, lr);
    update_muon(opt, k, params, lr);
    if (opt->ema)
        k->ema_update(opt->ema, params->shard_data, opt->numel, (float)(1.0 - opt->ema_decay));
}
