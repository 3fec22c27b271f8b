#include "data/flux_loader.h"

#include <stdlib.h>

#include "core/errors.h"
#include "core/rng.h"

void flux_loader_open(FluxLoader *l, FluxShards *shards, uint64_t seed, int dp_rank, int dp_size,
                      int rows) {
    CHECK(rows > 0 && dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size && shards->n > 0);
    *l = (FluxLoader){.shards = shards, .key = rng_key(seed, "flux.data.shuffle"),
                      .dp_rank = dp_rank, .dp_size = dp_size, .rows = rows, .epoch = -1,
                      .order = xmalloc((size_t)shards->n * sizeof(int64_t))};
}

void flux_loader_close(FluxLoader *l) {
    free(l->order);
    *l = (FluxLoader){0};
}

// Fisher-Yates (Knuth, TAOCP 3.4.2 Algorithm P) from the identity; draw k of epoch e is
// element e * n + k of the key's stream, so an epoch's order depends on (seed, e) alone.
static void order_draw(FluxLoader *l, int64_t epoch) {
    int64_t n = l->shards->n;
    for (int64_t k = 0; k < n; k++) l->order[k] = k;
    for (int64_t k = n - 1; k > 0; k--) {
        double u = rng_uniform(l->key, (uint64_t)epoch * (uint64_t)n + (uint64_t)k);
        int64_t j = (int64_t)(u * (double)(k + 1));  // uniform in [0, k]
        int64_t t = l->order[k];
        l->order[k] = l->order[j], l->order[j] = t;
    }
    l->epoch = epoch;
}

static int64_t example_at(FluxLoader *l, int64_t q) {
    int64_t n = l->shards->n;
    if (q / n != l->epoch) order_draw(l, q / n);
    return l->order[q % n];
}

int64_t flux_loader_next(FluxLoader *l, const FluxExamples *b) {
    const FluxShards *s = l->shards;
    size_t latent = (size_t)s->C * s->H * s->W, t5 = (size_t)s->L * s->D_t5;
    int64_t first = l->position + (int64_t)l->dp_rank * l->rows;
    for (int r = 0; r < l->rows; r++) {
        int64_t i = example_at(l, first + r);
        if (b->index) b->index[r] = i;
        flux_shards_read(l->shards, i, b->latents ? b->latents + r * latent : NULL,
                         b->t5 ? b->t5 + r * t5 : NULL,
                         b->clip ? b->clip + (size_t)r * s->D_clip : NULL,
                         b->labels ? b->labels + r : NULL);
    }
    l->position += (int64_t)l->dp_size * l->rows;
    return first;
}

int64_t flux_loader_position(const FluxLoader *l) { return l->position; }

void flux_loader_set_position(FluxLoader *l, int64_t position) {
    CHECK(position >= 0);
    l->position = position;
}
