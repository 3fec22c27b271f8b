// What a training checkpoint holds, in torchtitan's terms: the model's state dict under
// /model/<fqn>, AdamW's exp_avg / exp_avg_sq under /optimizer/... (Muon's matrices: their
// momentum as exp_avg, no exp_avg_sq), titan's average of the
// weights under /ema/<fqn> (training.ema_decay > 0), and the progress (step,
// optimizer step, data-loader position) plus the resolved config and the model's arguments
// as root attributes. A seed checkpoint (checkpoint.create_seed_checkpoint) has the model only.
//
// Semi-synchronous training (AdamW.outer; parallel/semi_sync.h) adds /semi_sync/outer_weights
// and /semi_sync/outer_momentum/<fqn>, the averaged delta of the fragment in flight under
// /semi_sync/delta/<fqn>, and, since the replica groups' weights and moments differ between
// syncs, group r's under /semi_sync/replica_<r>/model/..., .../optimizer/..., .../ema/... (group
// 0's under the usual names, which model-only readers take). A load under as many groups gives
// each its own; under another count every group takes group 0's.
//
// Each rank saves and loads its parameters' shards (core/param.h: the shard box of every
// global tensor; replicas write once, FSDP's padding is never written), so a checkpoint of any
// layout loads under any other.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "core/param.h"
#include "optim/optim.h"

// The loader adds each step's windows to its position: a position up to 2^62 (far beyond
// any dataset's epochs) leaves room for any run's additions without overflow.
#define TRAIN_STATE_MAX_WINDOWS ((int64_t)1 << 62)

typedef struct {
    int64_t step;              // training steps completed
    int64_t windows_consumed;  // data-loader position: windows read so far
} TrainProgress;

// opt may be NULL (model only), or hold only an average (ema set, the moments NULL: the model
// and its average, a model-only save of a run that keeps one). attrs describe the run (the
// architecture, "model.dim"; the mesh; the sequence length). Collective over comm's ranks
// (ckpt_save).
void train_state_save(const char *path, const ParamTable *params, const AdamW *opt,
                      TrainProgress progress, uint64_t seed, const char *config_yaml,
                      const CkptAttr *attrs, int n_attrs, MPI_Comm comm);
// train_state_save without dying on a failed write (ckpt_try_save): false and the agreed line.
bool train_state_try_save(const char *path, const ParamTable *params, const AdamW *opt,
                          TrainProgress progress, uint64_t seed, const char *config_yaml,
                          const CkptAttr *attrs, int n_attrs, MPI_Comm comm, char *err,
                          size_t errlen);
// Whether the file holds optimizer state (a model-only or seed file does not), and the
// average of the weights (saved with the optimizer state when the run kept one).
bool train_state_has_optimizer(const char *path);
bool train_state_has_ema(const char *path);
// Loads this rank's shards of the model; with opt, also the optimizer state (the file must
// hold it: train_state_has_optimizer), and the average when opt keeps one and the file has it
// (returns whether it did: else the caller starts it), and under opt->outer.on the outer state
// when the file has it (setting outer.loaded; the delta of parameters [outer.delta_from,
// delta_to) when it has that, else that range is emptied); with progress, the step and data
// position. Steps (the trainer's int) and the position are range-checked: a value outside
// dies naming the file and attribute, exit 2. Both NULL: weights only, from any file with
// /model/<fqn> datasets (initial_load_path). Shard padding is zeroed.
bool train_state_load(const char *path, ParamTable *params, AdamW *opt, TrainProgress *progress);
// Loads the average of the weights (/ema/<fqn>) into params in place of the weights: what
// generate and convert read with --ema. A file without it dies naming it, exit 2.
void train_state_load_ema(const char *path, ParamTable *params);
