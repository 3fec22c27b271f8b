// FLUX's training inputs (the registry's ModelData): cached encodings from HDF5 shards
// (data/flux_shards.h) in the epoch-shuffled dp-sharded order of data/flux_loader.h, and the
// rectified-flow draws of torchtitan's flux/trainer.py and flux_datasets.py: per example a
// timestep t ~ U(0, 1) (torch.rand), noise ~ N(0, 1) of the latent's shape (torch.randn_like),
// and classifier-free-guidance prompt dropout, the T5 and the CLIP encoding each replaced by
// the empty prompt's with probability training.classifier_free_guidance_prob (two draws, as
// torchtitan's two rng.random() calls).
//
// Every draw is element `position` (or a fixed offset of it) of a counter-based stream keyed by
// (training.seed, a name): position is the example's global position in the loader's stream,
// so a layout that splits the global batch otherwise (dp_shard, HSDP, accumulation) draws the
// same values for each example, and a resumed run continues the same draws. The cp ranks of
// a dp rank read the same examples (each computes on its share of their sequences).
//
// The empty prompt's encodings are zeros: the digits' stand-in encoder (docs/flux.md, "The digits
// set") maps a caption to one vector per word with zero padding and CLIP to the mean of the words,
// so the empty caption has no word rows and a zero pooled vector. (Real T5 / CLIP encode "" to
// non-zero vectors; shards from them would carry those, which the format does not yet.)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/host_memory.h"
#include "core/rng.h"
#include "data/flux_loader.h"
#include "models/registry.h"

typedef struct {
    FluxShards shards;
    FluxLoader loader;
    int rows, C, H, W, N, P;      // examples per microbatch; latents (C, H, W); packed (N, P)
    int L, D_t5, D_clip;
    bool guidance;                // the model has guidance_in: fed the scale 1 (see below)
    double drop_prob;             // training.classifier_free_guidance_prob
    uint64_t key_t, key_noise, key_drop;
    // Host memory, what the loader and the draws write:
    float *latents, *noise;       // (rows, C, H, W) each
    float *img, *packed_noise;    // (rows, N, P) each
    float *t, *t5, *clip, *gscale;  // (rows), (rows, L, D_t5), (rows, D_clip), (rows)
    FluxBatch batch;              // the same tensors in the backend's memory (carve)
} FluxData;

static const char *check(const Config *c, char *err, size_t len) {
    char origin[512];
    bool seq_len_set = config_key_origin(c, "training.seq_len", origin, sizeof origin) &&
                       strcmp(origin, "default") != 0;
    if (c->validation.enable)
        snprintf(err, len, "model flux: validation.enable: FLUX has no validation loop yet");
    else if (c->model.tokenizer_path)
        snprintf(err, len, "model flux: model.tokenizer_path: FLUX reads cached encodings "
                 "(scripts/flux_preprocess.py), no tokenizer");
    else if (c->training.document_masking)
        snprintf(err, len, "model flux: training.document_masking: FLUX reads no documents");
    else if (seq_len_set)
        snprintf(err, len, "%s: training.seq_len: FLUX's sequence is its data's (1 + T5 tokens "
                 "+ latent patches), not set", origin);
    else
        return NULL;
    return err;
}

static void *open_data(const Config *c, ModelArgs *a, int dp_rank, int dp_size, int rows) {
    if (!c->training.dataset_path)
        die_user("training.dataset_path is not set (FLUX shards: scripts/flux_preprocess.py)");
    FluxData *d = xcalloc(1, sizeof(FluxData));
    FluxShards *s = &d->shards;
    flux_shards_open(s, c->training.dataset_path, FLUX_PATCH);
    flux_loader_open(&d->loader, s, (uint64_t)c->training.seed, dp_rank, dp_size, rows);
    FluxArgs *f = &a->as.flux;
    flux_args_from_data(f, s->C, s->H, s->W, s->L, s->D_t5, s->D_clip);
    d->rows = rows, d->C = s->C, d->H = s->H, d->W = s->W;
    d->N = flux_img_tokens(f), d->P = f->in_channels;
    d->L = s->L, d->D_t5 = s->D_t5, d->D_clip = s->D_clip;
    d->guidance = f->guidance_embed;
    d->drop_prob = c->training.classifier_free_guidance_prob;
    uint64_t seed = (uint64_t)c->training.seed;
    d->key_t = rng_key(seed, "flux.timestep");
    d->key_noise = rng_key(seed, "flux.noise");
    d->key_drop = rng_key(seed, "flux.prompt_dropout");
    // The shard reader bounds an example's sizes (data/flux_shards.c); the microbatch's buffers
    // must fit the host before they are taken (the memory check, after the data opens, then
    // counts them as used). In double: rows x an example's floats may pass 2^64 bytes.
    double example = 4.0 * s->C * s->H * s->W + 2.0 + (double)s->L * s->D_t5 + s->D_clip;
    double host = example * rows * sizeof(float), room = (double)host_memory_free();
    if (host > room)
        die_user("flux dataset %s: a microbatch of %d examples (latents %dx%dx%d, T5 %dx%d, "
                 "CLIP %d) needs %.2f GiB of host memory for its inputs, but %.2f GiB is free",
                 c->training.dataset_path, rows, s->C, s->H, s->W, s->L, s->D_t5, s->D_clip,
                 host / 1073741824.0, room / 1073741824.0);
    size_t latent = (size_t)rows * s->C * s->H * s->W;
    d->latents = xmalloc(4 * latent * sizeof(float));
    d->noise = d->latents + latent, d->img = d->noise + latent;
    d->packed_noise = d->img + latent;
    d->t = xmalloc((2 + (size_t)s->L * s->D_t5 + s->D_clip) * rows * sizeof(float));
    d->gscale = d->t + rows, d->t5 = d->gscale + rows;
    d->clip = d->t5 + (size_t)rows * s->L * s->D_t5;
    for (int r = 0; r < rows; r++) d->gscale[r] = 1;
    log_info("data: %s, %lld examples of latents %dx%dx%d, T5 %dx%d, CLIP %d",
             c->training.dataset_path, (long long)s->n, s->C, s->H, s->W, s->L, s->D_t5,
             s->D_clip);
    return d;
}

static void carve(void *data, Arena *arena) {
    FluxData *d = data;
    size_t latent = (size_t)d->rows * d->N * d->P;
    d->batch = (FluxBatch){
        .img = arena_floats(arena, latent),
        .noise = arena_floats(arena, latent),
        .t = arena_floats(arena, (size_t)d->rows),
        .txt = arena_floats(arena, (size_t)d->rows * d->L * d->D_t5),
        .clip = arena_floats(arena, (size_t)d->rows * d->D_clip),
        .guidance = d->guidance ? arena_floats(arena, (size_t)d->rows) : NULL,
    };
}

// Example r of the microbatch, at global position q: its timestep, noise and prompt dropout.
static void draw(FluxData *d, int r, int64_t q) {
    size_t latent = (size_t)d->C * d->H * d->W;
    d->t[r] = (float)rng_uniform(d->key_t, (uint64_t)q);
    rng_fill_trunc_normal(d->noise + r * latent, latent, d->key_noise, (uint64_t)q * latent, 0, 1,
                          -INFINITY, INFINITY);
    if (rng_uniform(d->key_drop, 2 * (uint64_t)q) < d->drop_prob)
        memset(d->t5 + (size_t)r * d->L * d->D_t5, 0, (size_t)d->L * d->D_t5 * sizeof(float));
    if (rng_uniform(d->key_drop, 2 * (uint64_t)q + 1) < d->drop_prob)
        memset(d->clip + (size_t)r * d->D_clip, 0, (size_t)d->D_clip * sizeof(float));
}

// Flow matching with constant guidance: a guidance_in model (flux-dev) trains with scale 1.
static const void *next(void *data, const KernelOps *k) {
    FluxData *d = data;
    int64_t first = flux_loader_next(
        &d->loader, &(FluxExamples){.latents = d->latents, .t5 = d->t5, .clip = d->clip});
    for (int r = 0; r < d->rows; r++) draw(d, r, first + r);
    flux_pack_latents(d->img, d->latents, d->rows, d->C, d->H, d->W);
    flux_pack_latents(d->packed_noise, d->noise, d->rows, d->C, d->H, d->W);
    size_t latent = (size_t)d->rows * d->N * d->P * sizeof(float);
    FluxBatch *b = &d->batch;
    k->upload((float *)b->img, d->img, latent);
    k->upload((float *)b->noise, d->packed_noise, latent);
    k->upload((float *)b->t, d->t, (size_t)d->rows * sizeof(float));
    k->upload((float *)b->txt, d->t5, (size_t)d->rows * d->L * d->D_t5 * sizeof(float));
    k->upload((float *)b->clip, d->clip, (size_t)d->rows * d->D_clip * sizeof(float));
    if (b->guidance) k->upload((float *)b->guidance, d->gscale, (size_t)d->rows * sizeof(float));
    return b;
}

static void input_rows(const void *data, const void *input, int first, int rows, void *out) {
    const FluxData *d = data;
    const FluxBatch *b = input;
    CHECK(first >= 0 && first + rows <= d->rows);
    size_t r = (size_t)first, latent = (size_t)d->N * d->P;
    *(FluxBatch *)out = (FluxBatch){
        .img = b->img + r * latent, .noise = b->noise + r * latent, .t = b->t + r,
        .txt = b->txt + r * d->L * d->D_t5, .clip = b->clip + r * d->D_clip,
        .guidance = b->guidance ? b->guidance + r : NULL};
}

static int example_rows(const ModelArgs *a, int cp) {
    char err[256];
    if (flux_cp_check(&a->as.flux, cp, err, sizeof err)) die_user("%s", err);
    return flux_cp_rows(&a->as.flux, cp);
}

static int64_t position(const void *data) {
    return flux_loader_position(&((const FluxData *)data)->loader);
}

static void set_position(void *data, int64_t position) {
    flux_loader_set_position(&((FluxData *)data)->loader, position);
}

static void close_data(void *data) {
    FluxData *d = data;
    flux_loader_close(&d->loader);
    flux_shards_close(&d->shards);
    free(d->latents);
    free(d->t);
    free(d);
}

const ModelData FLUX_DATA = {
    .check = check, .open = open_data, .carve = carve, .next = next,
    .input_bytes = sizeof(FluxBatch), .input_rows = input_rows, .example_rows = example_rows,
    .position = position, .set_position = set_position, .close = close_data, .images = true,
};
