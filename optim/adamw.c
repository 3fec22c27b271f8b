#include "optim/optim.h"

void adamw_allocate(AdamW *opt, size_t numel, Arena *state) {
    opt->numel = numel;
    opt->exp_avg = arena_floats(state, numel);
    opt->exp_avg_sq = arena_floats(state, numel);
}

void adamw_step(AdamW *opt, const KernelOps *k, ParamTable *params, double lr) {
    opt->step++;
    k->adamw_update(params->shard_data, params->shard_grad, opt->exp_avg, opt->exp_avg_sq, opt->numel,
                    (float)lr, (float)opt->beta1, (float)opt->beta2, (float)opt->eps,
                    (float)opt->weight_decay, opt->step);
}
