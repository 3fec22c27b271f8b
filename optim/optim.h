// Optimizer, learning-rate schedule and gradient clipping, over a flat parameter table.
#pragma once

#include <stddef.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"

// How Muon's matrices cut over ranks are made whole and cut again (parallel/muon_shards.h,
// torchtitan's DistMuon).
typedef struct MuonShards MuonShards;
struct MuonShards {
    // p's whole update, from shard (this rank's) and the other ranks': shard itself where it is
    // whole here, else gathered into whole (p's global tensor); NULL on the ranks that do not
    // orthogonalize it (one does; ordinal: the count of Muon's parameters before p).
    float *(*gather)(MuonShards *h, const Param *p, int ordinal, const float *shard,
                     float *whole);
    // shard = this rank's box of whole as gather's chosen rank orthogonalized it (nothing where
    // shard was whole).
    void (*scatter)(MuonShards *h, const Param *p, int ordinal, float *whole, float *shard);
    float *buffer;  // (floats) theirs, carved by muon_allocate
    size_t floats;
};

// Muon (optim/muon.c; Jordan et al. 2024, torch.optim.Muon) for the matrices it selects: per
// matrix, momentum = beta momentum + (1 - beta) grad; U = (1 - beta) grad + beta momentum
// (Nesterov) or the momentum; O = U orthogonalized by ns_steps of Newton-Schulz's quintic
// (torch's coefficients) on U / ||U||_F; w = (1 - lr wd) w - lr adjust(rows, cols) O. A
// stacked expert weight (E, rows, cols) is E matrices. A matrix cut over ranks (FSDP, TP) is
// made whole for the iteration by Muon.shards.
typedef struct {
    double momentum;
    bool nesterov, match_rms_adamw;  // adjust_lr_fn: match_rms_adamw, else original
    int ns_steps;
    bool *is_muon;           // (parameters) which it updates; NULL: none (AdamW alone)
    MuonShards *shards;      // NULL: each matrix is whole on the rank updating it
    float *scratch;          // (scratch_floats) a parameter's whole update and this rank's
    size_t scratch_floats;   // shard of it, one matrix's iteration operand and two (s, s)
                             // Gram products
} Muon;

// Chooses the parameters whose names `pattern` (optimizer.muon_pattern, PCRE2) matches; false
// and one line in err (from `origin`, where the key was set) for a bad pattern, a 1-D match or
// no match at all.
bool muon_select(Muon *m, const ParamTable *params, const char *pattern, const char *origin,
                 char *err, size_t errlen);
// Carves the scratch from the optimizer arena.
void muon_allocate(Muon *m, Arena *state);
// The FLOPs of orthogonalizing n of p's elements (whole matrices): ns_steps of 4 s^2 l + 2 s^3
// per (s, l) matrix, s its shorter side.
double muon_flops(const Muon *m, const Param *p, size_t n);
// One Muon update of p's shard (weight, grad, momentum: its shard_numel floats); ordinal: the
// count of Muon's parameters before p (MuonShards'). Collective over p's shard groups when
// m->shards cuts it.
void muon_update(const Muon *m, const KernelOps *k, const Param *p, int ordinal, float *weight,
                 const float *grad, float *momentum, double lr, double weight_decay);

// Semi-synchronous training's outer state (parallel/semi_sync.h), laid out like shard_data
// and kept with the moments as the average is, so that it is checkpointed and resharded as they
// are: the outer weights (each fragment's at its last sync), the outer SGD's momentum, and the
// averaged pseudo-gradient of the fragment whose sync is in flight.
typedef struct {
    bool on;
    float *weights, *momentum, *delta;  // (shard_numel each) NULL: off
    // What a checkpoint keeps apart: the replica groups' own weights and moments, which differ
    // between syncs (this rank's group `replica` of `replicas`, over mesh group `group`), and
    // the parameters [delta_from, delta_to) whose delta is in flight (equal: none).
    int replica, replicas, group;
    int delta_from, delta_to;
    bool loaded;  // set by a checkpoint load that gave the outer weights and momentum
} OuterState;

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int step;               // updates done so far (AdamW's t is step + 1 in the next update)
    size_t numel;           // ParamTable.shard_numel: the average's and the outer state's
    float *exp_avg;         // (first_numel) first moment: laid out like ParamTable.shard_data,
                            // or, with frozen parameters (which have none), at first_at
    size_t first_numel;
    size_t *first_at;       // (parameters) where each one's first moment starts, SIZE_MAX for
                            // a frozen one; NULL: at its shard_offset
    float *exp_avg_sq;      // (second_numel) second moment: laid out like shard_data, or, with
                            // Muon's matrices or frozen parameters (which have none), at
                            // second_at
    size_t second_numel;
    size_t *second_at;      // (parameters) where each one's second moment starts, SIZE_MAX
                            // for Muon's and frozen ones; NULL: at its shard_offset
    // The weights' exponential moving average (training.ema_decay > 0, else NULL), laid out
    // like shard_data: it lives with the moments, so that it is sharded, checkpointed and
    // resharded as they are.
    double ema_decay;
    float *ema;
    // optimizer.name Muon: the matrices it updates in AdamW's place, each one's exp_avg its
    // momentum buffer.
    Muon muon;
    OuterState outer;  // semi_sync.method other than none
} AdamW;

// Carves both moments (none for frozen parameters, the second for AdamW's parameters only),
// the average when
// ema_decay > 0 and the outer state when outer.on, from the optimizer arena (zeroed by arena_commit: the caller starts the
// average from the weights).
void adamw_allocate(AdamW *opt, const ParamTable *params, Arena *state);
// Where parameter i's first moment (Muon's: its momentum) starts in exp_avg; SIZE_MAX: it has
// none (frozen).
size_t adamw_first_at(const AdamW *opt, const ParamTable *params, int i);
// Where parameter i's second moment starts in exp_avg_sq; SIZE_MAX: it has none (Muon's, or
// frozen).
size_t adamw_second_at(const AdamW *opt, const ParamTable *params, int i);
// One update of every parameter's shard at learning rate lr (torchtitan applies weight decay
// to all): Muon's for its matrices, AdamW's for the others; then of the average over the whole
// shard (buffers averaged too, as they change).
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
