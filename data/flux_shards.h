// FLUX training data: cached encodings in HDF5 shards, so that training never runs the T5,
// CLIP or the autoencoder (scripts/flux_preprocess.py writes them).
//
// One shard = one HDF5 file holding N examples (N may differ between shards):
//   /latents         float32 (N, C, H, W)    the autoencoder's latents (or pixels, for the digits)
//   /t5_encodings    float32 (N, L, D_t5)    the T5 encoder's sequence output
//   /clip_encodings  float32 (N, D_clip)     CLIP's pooled text vector
//   /captions        string (N), optional    the caption each example was encoded from
//   /labels          int32 (N), optional     the class, for sets that have classes (digits)
// and root attributes naming what made them:
//   t5_encoder, clip_encoder, autoencoder    strings (autoencoder "none" for pixel space)
//   image_size                               integer (2): the source images' height, width
// A dataset path is one shard file, a folder (its *.h5 files, hidden ones aside, in bytewise
// name order, as data/dataset.h reads folders) or a glob pattern (its matches in that order).
// Examples are numbered across the shards in that order: example i of the dataset is example
// i - first[k] of shard k.
//
// Opening validates every shard against the first: the three encodings present, float32,
// of the ranks above, with one N per shard; C, H, W, L, D_t5, D_clip, the attributes and the
// presence of captions and labels equal to the first shard's; H and W divisible by the
// model's patch size; every size within its limit (data/flux_shards.c: FLUX_MAX_*), so that
// the sizes titan derives from them fit an int. Any violation is one line naming the file and the dataset or attribute,
// exit 2 (die_user). Shards are read with the serial HDF5 API, one open shard at a time.
#pragma once

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The datasets of a shard, in the order FluxShards keeps their handles.
enum { FLUX_LATENTS, FLUX_T5, FLUX_CLIP, FLUX_CAPTIONS, FLUX_LABELS, FLUX_N_DATASETS };

typedef struct {
    char *path;        // the dataset path, for messages
    char **files;      // (n_shards) shard paths in example order
    int64_t *first;    // (n_shards + 1) first[k] = dataset index of shard k's first example
    int n_shards;
    int64_t n;         // examples in all shards
    int C, H, W;       // latent channels, height, width
    int L, D_t5;       // T5 sequence length and width
    int D_clip;        // CLIP pooled width
    int image_size[2]; // source image height, width (attribute image_size)
    char *t5_encoder, *clip_encoder, *autoencoder;  // the first shard's attributes
    bool has_captions, has_labels;
    // The one open shard (-1: none): reading example after example of a shuffled order touches
    // shards at random, and a dataset of thousands of shards must not hold a descriptor each.
    int open;
    hid_t file;
    hid_t dsets[FLUX_N_DATASETS];  // -1 for an absent optional dataset
} FluxShards;

// Opens and validates every shard of the dataset at path (see above) for a model whose patch
// size is patch; die_user on any bad input, naming the file and what is wrong.
void flux_shards_open(FluxShards *s, const char *path, int patch);
// The same without dying: false and the one-line reason in err (s is left closed).
bool flux_shards_try_open(FluxShards *s, const char *path, int patch, char *err, size_t errlen);
void flux_shards_close(FluxShards *s);

// Example i (0 <= i < n) into each non-NULL output: latent (C, H, W), t5 (L, D_t5),
// clip (D_clip), label (1; the set must have labels). die_user naming the file and dataset when
// a shard that validated cannot be read (damaged since).
void flux_shards_read(FluxShards *s, int64_t i, float *latent, float *t5, float *clip,
                      int32_t *label);
// Example i's caption, malloc'd (the set must have captions).
char *flux_shards_caption(FluxShards *s, int64_t i);
// The first example whose caption is exactly caption, or -1 (or when the set has no captions):
// how sampling finds a prompt's cached encodings when the text encoder is not at hand.
int64_t flux_shards_find_caption(FluxShards *s, const char *caption);
