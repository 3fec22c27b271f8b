// Optimizer, learning-rate schedule and gradient clipping, over a flat parameter table.
#pragma once

#include <stddef.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int step;               // updates done so far (AdamW's t is step + 1 in the next update)
    size_t numel;
    float *exp_avg;         // first moment, laid out like ParamTable.shard_data
    float *exp_avg_sq;      // second moment
    // The weights' exponential moving average (training.ema_decay > 0, else NULL), laid out
    // like shard_data: it lives with the moments, so that it is sharded, checkpointed and
    // resharded as they are.
    double ema_decay;
    float *ema;
} AdamW;

// Carves both moments, and the average when ema_decay > 0, from the optimizer arena (zeroed
// by arena_commit: the caller starts the average from the weights).
void adamw_allocate(AdamW *opt, size_t numel, Arena *state);
// One update of every parameter's shard at learning rate lr (torchtitan applies weight decay
// to all), then of the average over the whole shard (buffers averaged too, as they change).
void adamw_step(AdamW *opt, const KernelOps *k, ParamTable *params, double lr);

typedef enum { DECAY_LINEAR, DECAY_SQRT, DECAY_COSINE } DecayType;

// torchtitan's linear_warmup_stable_decay (components/lr_scheduler.py) driven by LambdaLR:
// linear warmup, a stable phase, then decay to min_lr_factor over decay_steps.
typedef struct {
    int warmup_steps, stable_steps, decay_steps;
    DecayType decay_type;
    double min_lr_factor;
} LrSchedule;

// decay_ratio < 0 (unset): decay over all steps after warmup.
LrSchedule lr_schedule_make(int total_steps, int warmup_steps, double decay_ratio,
                            DecayType decay_type, double min_lr_factor);
// Factor of the base lr used by the update of training step `step` (1-based).
double lr_schedule_factor(const LrSchedule *s, int step);

// Scales grad (n) as torch.nn.utils.clip_grad_norm_ when the global norm exceeds max_norm
// (> 0): by max_norm / (norm + 1e-6). The norm is the caller's (parallel/grads.h sums it over
// the pieces the ranks hold).
void grad_clip_to_norm(const KernelOps *k, float *grad, size_t n, double norm, double max_norm);
