// Semi-synchronous training over dp_replicate (semi_sync.method): DiLoCo (Douillard et al.
// 2023) and Streaming DiLoCo (Douillard et al. 2025), as TorchFT's local_sgd.DiLoCo runs them
// for torchtitan. Each replica group (with HSDP, TP, PP, CP and EP inside it) takes inner
// steps alone: its gradients are reduced within the group, never over dp_replicate. Every
// `period` = sync_steps / num_fragments steps one fragment of the model syncs, the fragments
// in turn (so each every sync_steps): its pseudo-gradient delta = outer - local weights is
// averaged over dp_replicate, the outer SGD (lr, momentum, Nesterov) steps the outer weights
// with it, and the local weights become outer + alpha (local - outer). With a delay the
// all-reduce starts `delay` steps before the outer step that waits for it, overlapping those
// inner steps (the local weights go on training meanwhile, as TorchFT's do). The inner
// optimizer's state carries on across syncs. Buffers (the MoE expert bias) are no one's to
// average: the trainer keeps them equal over the world.
//
// The outer state lives in AdamW.outer (optim/optim.h), laid out like the shards.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "core/param.h"
#include "kernels/kernels.h"
#include "optim/optim.h"
#include "parallel/comm.h"

typedef struct {
    int sync_steps, fragments, delay;
    double lr, momentum, alpha;
    bool nesterov;
} SemiSyncConfig;

// A run of parameters one after another in shard storage that the outer step updates.
typedef struct {
    size_t first, count;  // shard floats
} SemiSyncRun;

typedef struct {
    SemiSyncConfig config;
    int period;             // sync_steps / fragments
    size_t *first;          // (fragments + 1) fragment f holds shard floats [first[f], first[f + 1])
    int *first_param;       // (fragments + 1) and parameters [first_param[f], first_param[f + 1])
    SemiSyncRun *runs;      // each fragment's trained parameters (not buffers), in order
    int *first_run;         // (fragments + 1) fragment f's runs [first_run[f], first_run[f + 1])
    CommGroup *replicate;   // dp_replicate
    CommHandle pending;     // the all-reduce of the fragment in flight
    int pending_fragment;   // -1: none
} SemiSync;

// Fragments of the model: its blocks (the embedding, each layer, the head: torchtitan's
// fragment split weighs the first and the last as a layer each) in `fragments` equal runs.
// False and one line in err where they cannot be cut so: the blocks not divisible, or a
// parameter copy (Param.copy) in another fragment than its original (they must stay equal).
// block_params (n_blocks): each block's parameters, consecutive in the table in block order.
bool semi_sync_plan(SemiSync *s, const SemiSyncConfig *config, const ParamTable *t,
                    const int *block_params, int n_blocks, char *err, size_t errlen);
// Whether after `step` steps a fragment's all-reduce is in flight (started, its outer step
// not yet taken): then its parameters are [*from, *to).
bool semi_sync_window(const SemiSync *s, int step, int *from, int *to);
// After the state is loaded or initialised (`step` steps done): without loaded_outer (a fresh
// start, or a checkpoint without semi-sync state) the outer weights are the weights. In a
// window, a delta the load gave (opt->outer.delta_from < delta_to) is taken as the
// all-reduce's result; without one the all-reduce starts now.
void semi_sync_start(SemiSync *s, const KernelOps *k, const ParamTable *params, AdamW *opt,
                     CommGroup *replicate, int step, bool loaded_outer);
// After optimizer step `step` (1-based): starts the all-reduce of the fragment whose window
// opens, completes the sync of the one whose window closes.
void semi_sync_after_step(SemiSync *s, const KernelOps *k, ParamTable *params, AdamW *opt,
                          int step);
// The fragment in flight's all-reduce, completed (before a checkpoint saves its delta, at the
// end of the run); opt->outer.delta_from / delta_to name its parameters.
void semi_sync_wait(SemiSync *s);
// Floats all-reduced over dp_replicate in `steps` steps from step 1 (for --estimate's mean
// bytes per step): each fragment's floats once per sync whose all-reduce starts by then.
size_t semi_sync_floats(const SemiSync *s, int steps);
