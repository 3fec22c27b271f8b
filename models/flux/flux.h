// FLUX.1's MMDiT (torchtitan's models/flux, after Black Forest Labs' FLUX): a rectified-flow
// diffusion transformer over patchified image latents and T5 text encodings, conditioned on a
// timestep and a CLIP pooled vector. Its blocks: embed (img_in, txt_in, the time_in /
// vector_in / guidance_in MLPs summing into the conditioning vector `vec`), `depth`
// double-stream blocks (the text and image tokens keep their own weights but attend jointly),
// `depth_single_blocks` single-stream blocks (one fused linear1 / linear2 over the joint
// sequence), and the head (the final adaLN layer and the rectified-flow loss).
//
// The hidden state between blocks (protocols/block.h's x, (B*T, dim) with StepCtx.T =
// flux_seq_len) carries, for each sample, T = 1 + txt_len + img_tokens rows:
//   row 0            vec, the conditioning vector (B, hidden) every block's modulation reads;
//   rows 1 .. L      the text tokens (L = txt_len);
//   rows L+1 .. T-1  the image tokens, in raster order of the patch grid.
// Every block passes the vec row through unchanged, so its gradient accumulates through the
// residual stream (each block adds its modulations' vec gradient to the one from above) and
// reaches the embed block, where time_in / vector_in / guidance_in take it. So the model is a
// list of blocks mapping (B*T, dim) -> (B*T, dim) like any other: pipeline stages send the vec
// rows with the tokens and FSDP units need nothing new. A layout that splits the sequence over
// ranks gives every rank its samples' vec rows (context parallel: flux_parallelize_cp).
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "models/model.h"

#define FLUX_PATCH 2          // latents are cut into FLUX_PATCH x FLUX_PATCH patches
#define FLUX_AXES 3           // EmbedND's position axes: (unused, row, column)
#define FLUX_TIME_DIM 256     // width of the sinusoidal timestep (and guidance) embedding

typedef struct {
    int in_channels;          // per image token: latent channels * FLUX_PATCH^2
    int out_channels;         // per image token of the prediction
    int vec_in_dim;           // CLIP pooled vector
    int context_in_dim;       // T5 encoding of a text token
    int hidden_size;
    double mlp_ratio;         // MLP width = hidden_size * mlp_ratio
    int num_heads;
    int depth;                // double-stream blocks
    int depth_single_blocks;
    int axes_dim[FLUX_AXES];  // RoPE widths per position axis; sum = head_dim
    double theta;             // RoPE base
    bool qkv_bias;            // the qkv projections of the double blocks have biases
    bool guidance_embed;      // guidance_in: the distilled guidance scale (FLUX.1-dev)
    // The run's shapes, fixed at build (the RoPE tables are built for them):
    int txt_len;              // T5 tokens per sample
    int latent_height, latent_width;  // latents per sample, each a multiple of FLUX_PATCH
} FluxArgs;

// Fills a with torchtitan's flavor (flux-debug, flux-schnell, flux-dev: flux-dev adds
// guidance_in, as Black Forest Labs' FLUX.1-dev; torchtitan's trains without it) and the
// shapes of torchtitan's flux_debugmodel run (256-token T5, 256x256 images: 32x32 latents).
// flux-digits: a tiny model (width 64, 4 heads, one double and one single block) with the
// shapes of scripts/flux_preprocess.py --digits, for tests and `make flux`.
bool flux_flavor(const char *name, FluxArgs *a);
const char *flux_flavor_names(void);
// The shapes of the data a is trained on: latents (C, H, W), T5 encodings (L, D_t5), CLIP
// vectors (D_clip); in and out channels are C times the patch's elements.
void flux_args_from_data(FluxArgs *a, int C, int H, int W, int L, int D_t5, int D_clip);
// Why a cannot be built (one line in err, returned), or NULL: the heads, the RoPE axes, the
// patch grid, the channels.
const char *flux_args_check(const FluxArgs *a, char *err, size_t len);

static inline int flux_head_dim(const FluxArgs *a) { return a->hidden_size / a->num_heads; }
static inline int flux_mlp_hidden(const FluxArgs *a) {
    return (int)(a->hidden_size * a->mlp_ratio);
}
static inline int flux_img_tokens(const FluxArgs *a) {
    return (a->latent_height / FLUX_PATCH) * (a->latent_width / FLUX_PATCH);
}
// StepCtx.T: the rows of one sample in the hidden state (vec, text, image).
static inline int flux_seq_len(const FluxArgs *a) { return 1 + a->txt_len + flux_img_tokens(a); }

// The parameter table (torchtitan's names, shapes and init) and the block list embed,
// double_blocks.0 .. , single_blocks.0 .. , head (final_layer). activation_checkpoint:
// checkpoint every double and single block. a must pass flux_args_check.
void flux_build(Model *m, const FluxArgs *a, bool activation_checkpoint);
void flux_free(Model *m);
// Context parallel over size ranks: this rank holds, of each sample, its vec row and the
// contiguous share [rank, rank + 1) x Tj / size of the joint sequence's Tj = txt_len +
// img_tokens tokens (StepCtx.T = flux_cp_rows), its queries attending to every rank's keys
// through StepCtx.attn, RoPE by global position. The attention is not causal: contiguous
// shares are as balanced as the decoders' head-tail chunks. The vec row, the same on every
// rank, gets a partial gradient on each (its share's), as every replicated parameter does,
// summed by FSDP's reduction over dp_shard x cp. Before placing buffers.
void flux_parallelize_cp(Model *m, int rank, int size);
// Why a cannot be split over cp ranks (one line in err, returned), or NULL: 2 cp must divide
// the joint sequence (the ring's attention cuts each share in two chunks).
const char *flux_cp_check(const FluxArgs *a, int cp, char *err, size_t len);
// StepCtx.T under context parallel over cp ranks: the vec row and the share's tokens.
static inline int flux_cp_rows(const FluxArgs *a, int cp) {
    return 1 + (a->txt_len + flux_img_tokens(a)) / cp;
}

// Tensor parallel over tp ranks (models/flux/parallelize.c, Megatron-LM without sequence
// parallel): why a cannot be split (one line in err, returned: tp must divide the heads and
// the MLP width), or NULL; the plan, applied to a built, unallocated model; and the bytes one
// rank all-reduces over its tp group per microbatch of B samples of T rows (StepCtx.T) in
// blocks [first_block, last_block), recomputed_layers of whose layers run forward twice.
typedef struct Tp Tp;  // parallel/tp.h
const char *flux_tp_check(const FluxArgs *a, int tp, char *err, size_t len);
void flux_parallelize_tp(Model *m, const Tp *tp);
uint64_t flux_tp_bytes_per_microbatch(const FluxArgs *a, int B, int T, int recomputed_layers,
                                      int first_block, int last_block);

// A microbatch (StepCtx.input) of B samples, tensors in the backend's memory. The model
// noises the latents itself, as torchtitan's trainer does: x_t = (1 - t) img + t noise, and
// learns the velocity noise - img with the mean squared error over all B*N*C elements
// (StepCtx.loss); StepCtx.output is the prediction (B*N, out_channels).
typedef struct {
    const float *img;       // (B, N, in_channels): clean latents, patchified (flux_pack_latents)
    const float *noise;     // (B, N, in_channels): N(0, 1), in the same layout
    const float *t;         // (B): timesteps (sigmas) in [0, 1]
    const float *txt;       // (B, txt_len, context_in_dim): T5 encodings
    const float *clip;      // (B, vec_in_dim): CLIP pooled vectors
    const float *guidance;  // (B): guidance scales with guidance_embed, else NULL
} FluxBatch;

// Host memory: packed (B, (H/p)(W/p), C p p) = latents (B, C, H, W) cut into p x p patches,
// torchtitan's pack_latents ("b c (h ph) (w pw) -> b (h w) (c ph pw)"), p = FLUX_PATCH; and back.
void flux_pack_latents(float *packed, const float *latents, int B, int C, int H, int W);
void flux_unpack_latents(float *latents, const float *packed, int B, int C, int H, int W);

// ---- checkpoint attributes (args.c) ------------------------------------------------------

// The architecture as "model.*" attributes, so that a reader (the PyTorch reference, a
// converter) rebuilds the model from the file alone; returns the count.
#define FLUX_MAX_ATTRS 20
int flux_describe(const FluxArgs *a, CkptAttr out[FLUX_MAX_ATTRS]);
// The args from those attributes; die_user naming the file when they do not make a model.
void flux_args_from_checkpoint(const char *path, FluxArgs *a);
