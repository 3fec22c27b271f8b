// Where a multi-rank checkpoint's chunks fall (checkpoint/save.c): every tensor is chunked on a
// grid whose lines include every writer's box boundaries, so that each chunk lies inside one
// rank's box and that rank writes it, its checksum included, with no other rank's bytes.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"

// A box of one range along each dim: a writer's part of a tensor (a ParamBox of several ranges
// per dim is several blocks).
typedef struct {
    int64_t start[CKPT_MAX_DIMS], count[CKPT_MAX_DIMS];
} CkptBlock;

// A chunk is about CKPT_CHUNK_FLOATS, up to 4 times it where the boundaries leave no size
// closer (an FSDP shard of 1366 rows: 683 rows rather than 2).
#define CHUNK_GRID_MAX_FLOATS (4 * CKPT_CHUNK_FLOATS)

// The chunk dims for a tensor of `shape` written as `blocks` (every writer's, together tiling
// it), trailing dims first, each taking what the chunk's budget leaves: along a dim with
// interior block boundaries, the divisor of them all nearest the budget (by ratio, at most 4
// times over it); along one without, the budget spread evenly over the dim's length.
void chunk_grid_dims(int ndim, const int64_t *shape, const CkptBlock *blocks, int n_blocks,
                     int64_t chunk[CKPT_MAX_DIMS]);

// The chunks of a grid: their number over the whole tensor, and inside one block (whose
// boundaries are grid lines). Chunk k of a block has its origin at chunk_grid_origin's.
int64_t chunk_grid_count(int ndim, const int64_t *shape, const int64_t *chunk);
int64_t chunk_grid_block_count(int ndim, const int64_t *shape, const int64_t *chunk,
                               const CkptBlock *b);
void chunk_grid_origin(int ndim, const int64_t *chunk, const CkptBlock *b, int64_t k,
                       int64_t origin[CKPT_MAX_DIMS]);
