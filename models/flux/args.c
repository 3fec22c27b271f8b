// FLUX's flavors (torchtitan's models/flux/__init__.py flux_configs) and the latent packing.
#include <stdio.h>
#include <string.h>

#include "core/errors.h"
#include "models/flux/flux.h"

// FLUX.1 [schnell] and [dev]: 19 double and 38 single blocks of width 3072, 24 heads of 128
// (RoPE axes 16 + 56 + 56), T5-XXL text (4096) and CLIP-L pooled (768) inputs, 16 latent
// channels in 2x2 patches. torchtitan's flux_dev run: 512 T5 tokens, 256x256 images.
static const FluxArgs FLUX_12B = {
    .in_channels = 64, .out_channels = 64, .vec_in_dim = 768, .context_in_dim = 4096,
    .hidden_size = 3072, .mlp_ratio = 4.0, .num_heads = 24, .depth = 19,
    .depth_single_blocks = 38, .axes_dim = {16, 56, 56}, .theta = 10000, .qkv_bias = true,
    .txt_len = 512, .latent_height = 32, .latent_width = 32,
};

bool flux_flavor(const char *name, FluxArgs *a) {
    *a = FLUX_12B;
    if (!strcmp(name, "flux-schnell")) return true;
    if (!strcmp(name, "flux-dev")) {
        a->guidance_embed = true;
        return true;
    }
    if (!strcmp(name, "flux-debug")) {  // and torchtitan's flux_debugmodel run: 256 T5 tokens
        a->hidden_size = 1536;
        a->num_heads = 12;
        a->depth = a->depth_single_blocks = 2;
        a->txt_len = 256;
        return true;
    }
    if (!strcmp(name, "flux-digits")) {  // tests and `make flux`: a few CPU minutes on the digits
        *a = (FluxArgs){.hidden_size = 64, .mlp_ratio = 4.0, .num_heads = 4, .depth = 1,
                        .depth_single_blocks = 1, .axes_dim = {4, 6, 6}, .theta = 10000,
                        .qkv_bias = true};
        flux_args_from_data(a, 1, 16, 16, 8, 64, 32);  // the digits set's shapes
        return true;
    }
    return false;
}

const char *flux_flavor_names(void) {
    return "flux-debug, flux-schnell, flux-dev, flux-digits";
}

void flux_args_from_data(FluxArgs *a, int C, int H, int W, int L, int D_t5, int D_clip) {
    a->in_channels = a->out_channels = C * FLUX_PATCH * FLUX_PATCH;
    a->latent_height = H;
    a->latent_width = W;
    a->txt_len = L;
    a->context_in_dim = D_t5;
    a->vec_in_dim = D_clip;
}

const char *flux_args_check(const FluxArgs *a, char *err, size_t len) {
    int axes = 0;
    for (int i = 0; i < FLUX_AXES; i++) axes += a->axes_dim[i];
    if (a->num_heads < 1 || a->hidden_size % a->num_heads != 0)
        snprintf(err, len, "hidden_size %d is not a multiple of num_heads %d", a->hidden_size,
                 a->num_heads);
    else if (axes != flux_head_dim(a) || a->axes_dim[0] % 2 || a->axes_dim[1] % 2 ||
             a->axes_dim[2] % 2)
        snprintf(err, len, "RoPE axes %d + %d + %d (each even) do not make head_dim %d",
                 a->axes_dim[0], a->axes_dim[1], a->axes_dim[2], flux_head_dim(a));
    else if (a->latent_height < FLUX_PATCH || a->latent_width < FLUX_PATCH ||
             a->latent_height % FLUX_PATCH || a->latent_width % FLUX_PATCH)
        snprintf(err, len, "latents of %dx%d are not cut into %dx%d patches", a->latent_height,
                 a->latent_width, FLUX_PATCH, FLUX_PATCH);
    else if (a->in_channels % (FLUX_PATCH * FLUX_PATCH))
        snprintf(err, len, "in_channels %d is not latent channels times %d patch elements",
                 a->in_channels, FLUX_PATCH * FLUX_PATCH);
    else if (a->depth < 0 || a->depth_single_blocks < 0)
        snprintf(err, len, "depth %d, depth_single_blocks %d: block counts cannot be negative",
                 a->depth, a->depth_single_blocks);
    else if (a->txt_len < 1)
        snprintf(err, len, "txt_len %d: at least one T5 token", a->txt_len);
    else
        return NULL;
    return err;
}

// Element (b, c, y, x) of latents (B, C, H, W) is element (b, token, channel) of the packed
// (B, N, C p p): token = (y / p) (W / p) + x / p, channel = (c p + y % p) p + x % p.
static size_t packed_index(int b, int c, int y, int x, int C, int H, int W) {
    int p = FLUX_PATCH, token = (y / p) * (W / p) + x / p;
    size_t per_sample = (size_t)C * H * W;
    return b * per_sample + (size_t)token * C * p * p + (size_t)(c * p + y % p) * p + x % p;
}

void flux_pack_latents(float *packed, const float *latents, int B, int C, int H, int W) {
    size_t i = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    packed[packed_index(b, c, y, x, C, H, W)] = latents[i++];
}

void flux_unpack_latents(float *latents, const float *packed, int B, int C, int H, int W) {
    size_t i = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    latents[i++] = packed[packed_index(b, c, y, x, C, H, W)];
}

int flux_describe(const FluxArgs *a, CkptAttr out[FLUX_MAX_ATTRS]) {
    int n = 0;
#define INT_ATTR(key, value) \
    out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_INT, .i = (value)}
#define REAL_ATTR(key, value) \
    out[n++] = (CkptAttr){.name = "model." key, .type = CKPT_DOUBLE, .d = (value)}
    INT_ATTR("in_channels", a->in_channels);
    INT_ATTR("out_channels", a->out_channels);
    INT_ATTR("vec_in_dim", a->vec_in_dim);
    INT_ATTR("context_in_dim", a->context_in_dim);
    INT_ATTR("hidden_size", a->hidden_size);
    REAL_ATTR("mlp_ratio", a->mlp_ratio);
    INT_ATTR("num_heads", a->num_heads);
    INT_ATTR("depth", a->depth);
    INT_ATTR("depth_single_blocks", a->depth_single_blocks);
    INT_ATTR("axes_dim_0", a->axes_dim[0]);
    INT_ATTR("axes_dim_1", a->axes_dim[1]);
    INT_ATTR("axes_dim_2", a->axes_dim[2]);
    REAL_ATTR("theta", a->theta);
    INT_ATTR("qkv_bias", a->qkv_bias);
    INT_ATTR("guidance_embed", a->guidance_embed);
    INT_ATTR("txt_len", a->txt_len);
    INT_ATTR("latent_height", a->latent_height);
    INT_ATTR("latent_width", a->latent_width);
#undef INT_ATTR
#undef REAL_ATTR
    return n;
}

// A size the checkpoint records: in [1, INT32_MAX] (an int of the args).
static int size_attr(const char *path, const char *name) {
    return (int)ckpt_read_int_in(path, name, 1, INT32_MAX);
}

void flux_args_from_checkpoint(const char *path, FluxArgs *a) {
    *a = (FluxArgs){
        .in_channels = size_attr(path, "model.in_channels"),
        .out_channels = size_attr(path, "model.out_channels"),
        .vec_in_dim = size_attr(path, "model.vec_in_dim"),
        .context_in_dim = size_attr(path, "model.context_in_dim"),
        .hidden_size = size_attr(path, "model.hidden_size"),
        .mlp_ratio = ckpt_read_double(path, "model.mlp_ratio"),
        .num_heads = size_attr(path, "model.num_heads"),
        .depth = (int)ckpt_read_int_in(path, "model.depth", 0, INT32_MAX),
        .depth_single_blocks = (int)ckpt_read_int_in(path, "model.depth_single_blocks", 0,
                                                     INT32_MAX),
        .axes_dim = {size_attr(path, "model.axes_dim_0"), size_attr(path, "model.axes_dim_1"),
                     size_attr(path, "model.axes_dim_2")},
        .theta = ckpt_read_double(path, "model.theta"),
        .qkv_bias = ckpt_read_int_in(path, "model.qkv_bias", 0, 1) != 0,
        .guidance_embed = ckpt_read_int_in(path, "model.guidance_embed", 0, 1) != 0,
        .txt_len = size_attr(path, "model.txt_len"),
        .latent_height = size_attr(path, "model.latent_height"),
        .latent_width = size_attr(path, "model.latent_width"),
    };
    char err[256];
    if (flux_args_check(a, err, sizeof err) || !(a->mlp_ratio > 0) || !(a->theta > 0))
        die_user("checkpoint %s: its FLUX model.* attributes do not make a model (%s)", path,
                 flux_args_check(a, err, sizeof err) ? err : "mlp_ratio and theta must be > 0");
}

const char *flux_cp_check(const FluxArgs *a, int cp, char *err, size_t len) {
    int Tj = a->txt_len + flux_img_tokens(a);
    if (Tj % (2 * cp) == 0) return NULL;
    snprintf(err, len, "parallelism.context_parallel_degree %d: FLUX's joint sequence of %d "
             "tokens (%d T5 + %d image patches) is not a multiple of 2 x cp = %d (each rank's "
             "share is cut into two chunks)", cp, Tj, a->txt_len, flux_img_tokens(a), 2 * cp);
    return err;
}
