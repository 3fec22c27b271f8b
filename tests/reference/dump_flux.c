// One forward/backward of titan's FLUX on seeded weights and a seeded batch, written as HDF5
// for tests/reference/flux_ref.py to compare against PyTorch:
//   dump_flux FLAVOR B TXT_LEN LATENT_H LATENT_W OUT.h5 [GUIDANCE DEPTH DEPTH_SINGLE]
// The optional three change the flavor's guidance_embed (0 or 1) and block counts, so that a
// short run covers flux-dev's guidance_in at flux-debug's width.
// The weights are torchtitan's init plus N(0, 0.02) noise on every element: its init zeroes
// the modulations and the final layer, which would leave every gate shut and most gradients
// zero, proving nothing. The batch: latents and noise (B, 16, H, W) N(0, 1) in image layout
// (titan packs them; the reference packs them its own way), t uniform in (0, 1), T5 and CLIP
// encodings N(0, 1), and for flux-dev guidance scales uniform in (1, 5).
// OUT holds the model's attributes (flux_describe), /model/<fqn>, /batch/{latents, noise, t,
// txt, clip[, guidance]}, /loss (1), /output (B*N, out_channels) and /grad/<fqn> (the
// gradient of the loss), all float32.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"
#include "core/rng.h"
#include "models/flux/flux.h"

#define SEED 1234

static void fill_normal(float *x, size_t n, const char *name, double mean, double std) {
    rng_fill_trunc_normal(x, n, rng_key(SEED, name), 0, mean, std, -INFINITY, INFINITY);
}

static void fill_uniform(float *x, size_t n, const char *name, double lo, double hi) {
    uint64_t key = rng_key(SEED, name);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rng_uniform(key, i));
}

// The initial weights, each element moved by uniform noise of std 0.02.
static void perturbed_weights(ParamTable *t, float *noise) {
    params_initialize(t, SEED);
    double a = 0.02 * sqrt(3.0);
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        fill_uniform(noise, p->numel, p->name, -a, a);
        for (size_t j = 0; j < p->numel; j++) p->data[j] += noise[j];
    }
}

typedef struct {
    float *latents, *noise, *t, *txt, *clip, *guidance;  // as the reference reads them
    float *img, *packed_noise;                           // packed for titan
    int64_t image_shape[4], txt_shape[3], clip_shape[2], b_shape[1];
} Batch;

static void batch_make(Batch *b, const FluxArgs *a, int B) {
    int C = a->in_channels / (FLUX_PATCH * FLUX_PATCH), H = a->latent_height, W = a->latent_width;
    size_t image = (size_t)B * C * H * W, txt = (size_t)B * a->txt_len * a->context_in_dim;
    *b = (Batch){.image_shape = {B, C, H, W}, .txt_shape = {B, a->txt_len, a->context_in_dim},
                 .clip_shape = {B, a->vec_in_dim}, .b_shape = {B}};
    b->latents = xmalloc(image * sizeof(float));
    b->noise = xmalloc(image * sizeof(float));
    b->img = xmalloc(image * sizeof(float));
    b->packed_noise = xmalloc(image * sizeof(float));
    b->t = xmalloc((size_t)B * sizeof(float));
    b->txt = xmalloc(txt * sizeof(float));
    b->clip = xmalloc((size_t)B * a->vec_in_dim * sizeof(float));
    fill_normal(b->latents, image, "latents", 0, 1);
    fill_normal(b->noise, image, "noise", 0, 1);
    fill_uniform(b->t, (size_t)B, "t", 0, 1);
    fill_normal(b->txt, txt, "txt", 0, 1);
    fill_normal(b->clip, (size_t)B * a->vec_in_dim, "clip", 0, 1);
    if (a->guidance_embed) {
        b->guidance = xmalloc((size_t)B * sizeof(float));
        fill_uniform(b->guidance, (size_t)B, "guidance", 1, 5);
    }
    flux_pack_latents(b->img, b->latents, B, C, H, W);
    flux_pack_latents(b->packed_noise, b->noise, B, C, H, W);
}

static CkptTensor tensor(const char *path, int ndim, const int64_t *shape, float *data) {
    return (CkptTensor){.path = path, .ndim = ndim, .shape = shape, .data = data};
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 10)
        die_user("usage: dump_flux FLAVOR B TXT_LEN LATENT_H LATENT_W OUT.h5 "
                 "[GUIDANCE DEPTH DEPTH_SINGLE]");
    FluxArgs a;
    if (!flux_flavor(argv[1], &a))
        die_user("dump_flux: no flavor %s (flavors: %s)", argv[1], flux_flavor_names());
    int B = atoi(argv[2]);
    a.txt_len = atoi(argv[3]);
    a.latent_height = atoi(argv[4]);
    a.latent_width = atoi(argv[5]);
    if (argc == 10) {
        a.guidance_embed = atoi(argv[7]) != 0;
        a.depth = atoi(argv[8]);
        a.depth_single_blocks = atoi(argv[9]);
    }
    char err[256];
    if (B < 1 || flux_args_check(&a, err, sizeof err))
        die_user("dump_flux: %s", B < 1 ? "B < 1" : err);
    const char *out = argv[6];
    const KernelOps *k = kernels_backend("cpu");
    Model m;
    flux_build(&m, &a, false);
    int T = flux_seq_len(&a);
    Arena params, grads, acts;
    model_allocate(&m, model_activation_bytes(&m, k, B, T), &params, &grads, &acts, NULL);
    float *scratch = xmalloc(m.params.numel * sizeof(float));
    perturbed_weights(&m.params, scratch);
    free(scratch);

    Batch b;
    batch_make(&b, &a, B);
    FluxBatch in = {.img = b.img, .noise = b.packed_noise, .t = b.t, .txt = b.txt,
                    .clip = b.clip, .guidance = b.guidance};
    StepCtx s = {.k = k, .act = &acts, .B = B, .T = T, .input = &in, .loss_scale = 1.0f};
    int64_t out_shape[2] = {(int64_t)B * flux_img_tokens(&a), a.out_channels}, one = 1;
    size_t n_out = (size_t)out_shape[0] * out_shape[1];
    float *output = xmalloc(n_out * sizeof(float));
    model_forward(&m, &s);
    for (size_t i = 0; i < n_out; i++) output[i] = s.output[i];
    arena_release(&acts, 0);
    float loss = (float)model_forward_backward(&m, &s);

    int n = 2 * m.params.count + 8;
    CkptTensor *list = xcalloc((size_t)n, sizeof(CkptTensor));
    char (*names)[PARAM_NAME_MAX + 8] = xcalloc(2 * (size_t)m.params.count, sizeof *names);
    int used = 0;
    list[used++] = tensor("/loss", 1, &one, &loss);
    list[used++] = tensor("/output", 2, out_shape, output);
    list[used++] = tensor("/batch/latents", 4, b.image_shape, b.latents);
    list[used++] = tensor("/batch/noise", 4, b.image_shape, b.noise);
    list[used++] = tensor("/batch/t", 1, b.b_shape, b.t);
    list[used++] = tensor("/batch/txt", 3, b.txt_shape, b.txt);
    list[used++] = tensor("/batch/clip", 2, b.clip_shape, b.clip);
    if (b.guidance) list[used++] = tensor("/batch/guidance", 1, b.b_shape, b.guidance);
    for (int i = 0; i < m.params.count; i++) {
        Param *p = &m.params.items[i];
        snprintf(names[2 * i], sizeof names[0], "/model/%s", p->name);
        snprintf(names[2 * i + 1], sizeof names[0], "/grad/%s", p->name);
        list[used++] = tensor(names[2 * i], p->ndim, p->shape, p->data);
        list[used++] = tensor(names[2 * i + 1], p->ndim, p->shape, p->grad);
    }
    CkptAttr attrs[FLUX_MAX_ATTRS];
    int n_attrs = flux_describe(&a, attrs);
    ckpt_save(out, list, used, attrs, n_attrs, MPI_COMM_NULL);
    printf("dump_flux: %s, %zu parameters, loss %.7f, %d gradients -> %s\n", argv[1],
           m.params.numel, loss, m.params.count, out);
    return 0;
}
