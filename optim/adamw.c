#include "optim/optim.h"

void adamw_allocate(AdamW *opt, size_t numel, Arena *state) {
    opt->numel = numel;
    opt->exp_avg = arena_floats(state, numel);
    opt->exp_avg_sq = arena_floats(state, numel);
    opt->ema = opt->ema_decay > 0 ? arena_floats(state, numel) : NULL;
}

static void update(const AdamW *opt, const KernelOps *k, ParamTable *params, size_t first,
                   size_t n, double lr) {
    k->adamw_update(params->shard_data + first, params->shard_grad + first, opt->exp_avg + first,
                    opt->exp_avg_sq + first, n, (float)lr, (float)opt->beta1, (float)opt->beta2,
                    (float)opt->eps, (float)opt->weight_decay, opt->step);
}

// One update over the whole shard buffer; when the table has buffers (Param.buffer, which the
// optimizer must leave: weight decay would shrink them), one per run of contiguous trained
// shards between them.
static void update_trained(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    bool buffers = false;
    for (int i = 0; i < params->count; i++) buffers = buffers || params->items[i].buffer;
    if (!buffers) {
        update(opt, k, params, 0, opt->numel, lr);
        return;
    }
    size_t first = 0, end = 0;
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        if (p->buffer || p->shard_offset != end) {
            if (end > first) update(opt, k, params, first, end - first, lr);
            first = end = p->shard_offset + (p->buffer ? p->shard_numel : 0);
        }
        if (!p->buffer) end = p->shard_offset + p->shard_numel;
    }
    if (end > first) update(opt, k, params, first, end - first, lr);
}

void adamw_step(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    opt->step++;
    update_trained(opt, k, params, lr);
    if (opt->ema)
        k->ema_update(opt->ema, params->shard_data, opt->numel, (float)(1.0 - opt->ema_decay));
}
