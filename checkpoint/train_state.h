// What a training checkpoint holds, in torchtitan's terms: the model's state dict under
// /model/<fqn>, AdamW's exp_avg / exp_avg_sq under /optimizer/..., and the progress (step,
// optimizer step, data-loader position) plus the resolved config and the model's arguments
// as root attributes. A seed checkpoint (checkpoint.create_seed_checkpoint) has the model only.
#pragma once

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

// opt may be NULL (model only). model_attrs describe the architecture (e.g. "model.dim").
void train_state_save(const char *path, const ParamTable *params, const AdamW *opt,
                      TrainProgress progress, uint64_t seed, const char *config_yaml,
                      const CkptAttr *model_attrs, int n_model_attrs);
// Loads the model; with opt, also the optimizer state when the file has it (a seed or
// model-only file leaves the moments at zero); with progress, the step and data position.
// Steps (the trainer's int) and the position are range-checked: a value outside dies naming
// the file and attribute, exit 2. Both NULL: weights only, from any file with /model/<fqn>
// datasets (initial_load_path).
void train_state_load(const char *path, ParamTable *params, AdamW *opt, TrainProgress *progress);
