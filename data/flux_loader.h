// The FLUX data loader: batches of cached encodings (data/flux_shards.h), shuffled per epoch
// and sharded over data-parallel ranks, resumable from one saved number.
//
// The dataset is read as an endless stream of epochs; epoch e visits every example once, in a
// permutation drawn from (seed, e) alone. Global position q is example order_{q / n}[q % n].
// As in the text loader (data/loader.h), the global microbatch is the dp_size * rows positions
// from the loader's position p; rank r takes positions p + r*rows .. p + r*rows + rows - 1, and
// every rank then advances p by dp_size * rows. So the ranks' batches, in rank order, are the
// one-rank global batch for any dp_size with the same dp_size * rows, and the position
// (examples consumed by all ranks together) is the loader's whole state: a checkpoint saves it
// as the text loader's (checkpoint/train_state.h: TrainProgress.windows_consumed).
#pragma once

#include <stdint.h>

#include "data/flux_shards.h"

typedef struct {
    FluxShards *shards;  // not owned
    uint64_t key;        // the shuffles' random stream, from the seed
    int dp_rank, dp_size, rows;
    int64_t position;    // examples consumed globally
    int64_t epoch;       // the epoch whose permutation order holds; -1: none yet
    int64_t *order;      // (n) order[k] = the example at position epoch * n + k
} FluxLoader;

// A batch in the caller's buffers; a NULL member is not filled.
typedef struct {
    float *latents;   // (rows, C, H, W)
    float *t5;        // (rows, L, D_t5)
    float *clip;      // (rows, D_clip)
    int64_t *index;   // (rows) each row's example: its index in the dataset
    int32_t *labels;  // (rows) each row's class (the set must have labels)
} FluxExamples;

void flux_loader_open(FluxLoader *l, FluxShards *shards, uint64_t seed, int dp_rank, int dp_size,
                      int rows);
void flux_loader_close(FluxLoader *l);
// This rank's next rows examples into b, then the position moves past the whole global
// microbatch. Returns the global position of this rank's first row (row k is at that + k): a
// per-example random draw keyed by it (timestep, noise) is the same on any layout.
int64_t flux_loader_next(FluxLoader *l, const FluxExamples *b);
int64_t flux_loader_position(const FluxLoader *l);
void flux_loader_set_position(FluxLoader *l, int64_t position);
