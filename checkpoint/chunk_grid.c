#include "checkpoint/chunk_grid.h"

#include <stdbool.h>

#include "core/errors.h"

static int64_t gcd(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

// The divisor of n nearest limit by ratio: the largest at most limit, or the smallest above it
// when that is nearer and at most 4 x limit.
static int64_t divisor_near(int64_t n, int64_t limit) {
    if (n <= limit) return n;
    int64_t below = 1, above = n;
    for (int64_t k = 1; k * k <= n; k++) {
        if (n % k) continue;
        int64_t pair[2] = {k, n / k};
        for (int j = 0; j < 2; j++) {
            if (pair[j] <= limit && pair[j] > below) below = pair[j];
            if (pair[j] > limit && pair[j] < above) above = pair[j];
        }
    }
    bool nearer_above = (double)above / (double)limit < (double)limit / (double)below;
    return above <= 4 * limit && nearer_above ? above : below;
}

void chunk_grid_dims(int ndim, const int64_t *shape, const CkptBlock *blocks, int n_blocks,
                     int64_t chunk[CKPT_MAX_DIMS]) {
    int64_t budget = CKPT_CHUNK_FLOATS;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t lines = 0;  // the gcd of the interior boundaries; 0 while there is none
        for (int i = 0; i < n_blocks; i++) {
            int64_t ends[2] = {blocks[i].start[d], blocks[i].start[d] + blocks[i].count[d]};
            for (int e = 0; e < 2; e++)
                if (ends[e] > 0 && ends[e] < shape[d]) lines = gcd(lines, ends[e]);
        }
        int64_t limit = budget > 1 ? budget : 1;
        int64_t pieces = (shape[d] + limit - 1) / limit;  // no boundary: even pieces
        chunk[d] = lines ? divisor_near(lines, limit) : (shape[d] + pieces - 1) / pieces;
        budget /= chunk[d];
    }
}

int64_t chunk_grid_count(int ndim, const int64_t *shape, const int64_t *chunk) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (shape[d] + chunk[d] - 1) / chunk[d];
    return n;
}

// Along dim d, a block's chunks: from its start (a grid line) to its end, the last one cut
// only at the tensor's end.
static int64_t block_chunks_along(const int64_t *chunk, const CkptBlock *b, int d) {
    return (b->count[d] + chunk[d] - 1) / chunk[d];
}

int64_t chunk_grid_block_count(int ndim, const int64_t *shape, const int64_t *chunk,
                               const CkptBlock *b) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        CHECK(b->start[d] % chunk[d] == 0);
        CHECK(b->start[d] + b->count[d] == shape[d] || b->count[d] % chunk[d] == 0);
        n *= block_chunks_along(chunk, b, d);
    }
    return n;
}

void chunk_grid_origin(int ndim, const int64_t *chunk, const CkptBlock *b, int64_t k,
                       int64_t origin[CKPT_MAX_DIMS]) {
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t along = block_chunks_along(chunk, b, d);
        origin[d] = b->start[d] + (k % along) * chunk[d];
        k /= along;
    }
}
