// The data loader: batches of seq_len+1 token windows (data/shard.h) for training and
// validation, sharded over data-parallel ranks.
//
// The global microbatch is dp_size * rows consecutive windows starting at the loader's
// position; rank r reads the rows windows position + r*rows .. position + r*rows + rows-1, and
// every rank then advances the position by dp_size * rows. So the global batch is the same
// windows in the same order for any dp_size with the same dp_size * rows, and with dp_size 1
// microbatch m of step s (1-based, accum microbatches a step) reads windows
// ((s-1)*accum + m)*rows + r. The position (windows consumed by all ranks together) is the
// whole state: a checkpoint saves it, and a validation loader rewinds with position 0.
#pragma once

#include <stdint.h>

#include "data/shard.h"

typedef struct {
    const TokenStream *stream;  // not owned
    int seq_len, dp_rank, dp_size, rows;
    int64_t position;  // windows consumed globally
    int32_t *window;   // (seq_len + 1) one window being read
} DataLoader;

// die_user if the stream is too short for one window.
void loader_open(DataLoader *l, const TokenStream *stream, int seq_len, int dp_rank, int dp_size,
                 int rows);
void loader_close(DataLoader *l);
// This rank's next rows windows: inputs[r*seq_len + t] = window[t], targets[...] = window[t+1],
// (rows, seq_len) each; when loss_mask and doc_ends are not NULL, whether each target is
// trained and whether each input ends a document (the stream's TokenStream.flags, which must be
// set); then the position moves past the whole global microbatch.
void loader_next(DataLoader *l, int32_t *inputs, int32_t *targets, int32_t *loss_mask,
                 int32_t *doc_ends);
int64_t loader_position(const DataLoader *l);
void loader_set_position(DataLoader *l, int64_t position);
