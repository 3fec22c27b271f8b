#include <math.h>

#include "optim/optim.h"

// torchtitan's build_lr_schedulers: warmup capped at the run length, decay over
// round(steps * decay_ratio) steps (Python's round: half to even), and one "virtual last step"
// in the stable phase so that the final update's lr stays above min_lr_factor * lr.
LrSchedule lr_schedule_make(int total_steps, int warmup_steps, double decay_ratio,
                            DecayType decay_type, double min_lr_factor) {
    if (warmup_steps > total_steps) warmup_steps = total_steps;
    int decay_steps = total_steps - warmup_steps;
    if (decay_ratio >= 0) {
        int by_ratio = (int)nearbyint(total_steps * decay_ratio);
        if (by_ratio < decay_steps) decay_steps = by_ratio;
    }
    int stable_steps = total_steps + 1 - warmup_steps - decay_steps;
    return (LrSchedule){warmup_steps, stable_steps, decay_steps, decay_type, min_lr_factor};
}

double lr_schedule_factor(const LrSchedule *s, int step) {
    int current = step - 1;  // LambdaLR's counter: updates already taken
    if (current < s->warmup_steps) return (double)(current + 1) / s->warmup_steps;
    if (current < s->warmup_steps + s->stable_steps || s->decay_steps == 0) return 1.0;
    double progress = (double)(current + 1 - s->warmup_steps - s->stable_steps) / s->decay_steps;
    double factor;
    switch (s->decay_type) {
    case DECAY_SQRT: factor = 1 - sqrt(progress); break;
    case DECAY_COSINE: factor = 0.5 * (1 + cos(M_PI * progress)); break;
    default: factor = 1 - progress; break;
    }
    return s->min_lr_factor + (1 - s->min_lr_factor) * factor;
}
