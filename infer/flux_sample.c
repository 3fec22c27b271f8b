// titan generate for FLUX: images drawn by Euler steps of the learned flow, as torchtitan's
// flux/inference/sampling.py (denoise), written as one PNG grid (infer/png_grid.h).
//
//   titan generate --checkpoint C --data SHARDS --prompt TEXT [--prompt TEXT ...]
//                  [--samples 8] [--steps 50] [--seed 0] [--cfg-scale 1] [--guidance 3.5]
//                  [--out samples.png] [--device cpu|cuda]
//
// The text encoders do not run in titan (scripts/flux_preprocess.py does), so a prompt is a
// caption of the shards SHARDS, whose cached T5 and CLIP encodings it takes (the first example
// with exactly that caption). Sample s of prompt p starts from the noise drawn from
// (--seed, p * samples + s), N(0, 1) of the latent's shape, and moves from t = 1 to t = 0 over
// the schedule linspace(1, 0, steps + 1): x += (t_next - t) v(x, t). For a model with
// guidance_in (flux-dev) the schedule is shifted as torchtitan's get_schedule (mu linear in
// latent_height * latent_width, from 0.5 at 256 to 1.15 at 4096; t -> e^mu / (e^mu + 1/t - 1))
// and --guidance feeds guidance_in; FLUX.1-schnell and the small flavors step unshifted.
// --cfg-scale g != 1 is classifier-free guidance: v = v_empty + g (v_prompt - v_empty), with
// the empty prompt's encodings zeros (models/flux/data.c says why), as the training dropout.
// Row p of the grid holds prompt p's samples; latents are taken as pixels (the digits are
// pixel space; the FLUX autoencoder's decoder does not run in titan). --device cuda keeps the
// weights, activations and model inputs in the GPU's memory, uploading each step's x and t and
// bringing the velocity back; cpu runs the same code with memcpy copies.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint/train_state.h"
#include "core/errors.h"
#include "core/rng.h"
#include "data/flux_shards.h"
#include "infer/generate.h"
#include "infer/png_grid.h"
#include "models/registry.h"

#define USAGE                                                                                 \
    "usage: titan generate --checkpoint C --data SHARDS --prompt TEXT [--prompt TEXT ...] "   \
    "[--samples N] [--steps N] [--seed s] [--cfg-scale g] [--guidance g] [--out FILE.png] "   \
    "[--device cpu|cuda]"
#define HELP                                                                                  \
    USAGE "\n"                                                                                \
    "\n"                                                                                      \
    "Flags (a FLUX checkpoint's sampler):\n"                                                  \
    "  --checkpoint C        a titan HDF5 checkpoint of a FLUX model\n"                        \
    "  --data SHARDS         the preprocessed shards (scripts/flux_preprocess.py) whose cached\n" \
    "                        T5 and CLIP encodings the prompts take\n"                         \
    "  --prompt TEXT         a caption of --data (exactly); repeat for more prompts, one grid\n" \
    "                        row each (at most 64)\n"                                            \
    "  --samples N           images per prompt, one grid column each (default 8)\n"             \
    "  --steps N             Euler steps from noise (t = 1) to the image (t = 0) (default 50)\n" \
    "  --seed s              seeds the starting noise: one seed, one grid (default 0)\n"        \
    "  --cfg-scale g         classifier-free guidance: v = v_empty + g (v_prompt - v_empty); 1\n" \
    "                        is off (default 1)\n"                                               \
    "  --guidance g          the guidance_in value of a model that has one (flux-dev) (default\n" \
    "                        3.5)\n"                                                             \
    "  --out FILE.png        the PNG grid's path (default samples.png)\n"                       \
    "  --device D            cpu (default) or cuda: the model and its inputs on the GPU\n"      \
    "  -h, --help            this text\n"                                                        \
    "\n"                                                                                      \
    "A summary line (samples, steps, seconds, the PNG's path) goes to stderr."
#define MAX_PROMPTS 64

typedef struct {
    const char *checkpoint, *data, *out;
    const char *device;  // the kernels backend
    const char *prompts[MAX_PROMPTS];
    int n_prompts;
    long samples, steps, seed;
    double cfg_scale, guidance;
    bool guidance_set;
} SampleOptions;

static bool set_option(SampleOptions *o, const char *f, const char *value) {
    if (!strcmp(f, "--checkpoint")) {
        o->checkpoint = generate_need(f, value);
    } else if (!strcmp(f, "--data")) {
        o->data = generate_need(f, value);
    } else if (!strcmp(f, "--out")) {
        o->out = generate_need(f, value);
    } else if (!strcmp(f, "--device")) {
        o->device = generate_need(f, value);
    } else if (!strcmp(f, "--prompt")) {
        if (o->n_prompts == MAX_PROMPTS) die_user("--prompt: at most %d prompts", MAX_PROMPTS);
        o->prompts[o->n_prompts++] = generate_need(f, value);
    } else if (!strcmp(f, "--samples")) {
        o->samples = generate_parse_long(f, generate_need(f, value), 1, 4096);
    } else if (!strcmp(f, "--steps")) {
        o->steps = generate_parse_long(f, generate_need(f, value), 1, 100000);
    } else if (!strcmp(f, "--seed")) {
        o->seed = generate_parse_long(f, generate_need(f, value), 0, LONG_MAX);
    } else if (!strcmp(f, "--cfg-scale")) {
        o->cfg_scale = generate_parse_double(f, generate_need(f, value), -1e6, 1e6);
    } else if (!strcmp(f, "--guidance")) {
        o->guidance = generate_parse_double(f, generate_need(f, value), 0, 1e6);
        o->guidance_set = true;
    } else {
        return false;
    }
    return true;
}

static void parse_options(SampleOptions *o, int argc, char **argv) {
    help_exit_if_asked(argc, argv, HELP);
    *o = (SampleOptions){.out = "samples.png", .device = "cpu", .samples = 8, .steps = 50,
                         .cfg_scale = 1, .guidance = 3.5};
    for (int i = 1; i < argc; i++)
        if (set_option(o, argv[i], i + 1 < argc ? argv[i + 1] : NULL)) i++;
        else die_user("generate: unknown option '%s' for a FLUX checkpoint; " USAGE, argv[i]);
    if (!o->data) die_user("generate needs --data: the shards whose captions are the prompts");
    if (!o->n_prompts) die_user("generate needs at least one --prompt (a caption of --data)");
}

// ---- the prompts' encodings --------------------------------------------------------------

typedef struct {
    int C, H, W, N, P, L, D_t5, D_clip;
    float *t5, *clip;  // (n_prompts, L, D_t5), (n_prompts, D_clip)
} Prompts;

static Prompts read_prompts(const SampleOptions *o, const FluxArgs *a) {
    FluxShards s;
    flux_shards_open(&s, o->data, FLUX_PATCH);
    FluxArgs want = *a;
    flux_args_from_data(&want, s.C, s.H, s.W, s.L, s.D_t5, s.D_clip);
    if (memcmp(&want, a, sizeof want))
        die_user("--data %s: latents %dx%dx%d, T5 %dx%d, CLIP %d are not the shapes %s was "
                 "trained on", o->data, s.C, s.H, s.W, s.L, s.D_t5, s.D_clip, o->checkpoint);
    Prompts p = {.C = s.C, .H = s.H, .W = s.W, .N = flux_img_tokens(a), .P = a->in_channels,
                 .L = s.L, .D_t5 = s.D_t5, .D_clip = s.D_clip};
    p.t5 = xmalloc((size_t)o->n_prompts * p.L * p.D_t5 * sizeof(float));
    p.clip = xmalloc((size_t)o->n_prompts * p.D_clip * sizeof(float));
    for (int i = 0; i < o->n_prompts; i++) {
        int64_t ex = flux_shards_find_caption(&s, o->prompts[i]);
        if (ex < 0)
            die_user("--prompt '%s': no example of %s has this caption (prompts are the shards' "
                     "captions: their encoders run in scripts/flux_preprocess.py)", o->prompts[i],
                     o->data);
        flux_shards_read(&s, ex, NULL, p.t5 + (size_t)i * p.L * p.D_t5,
                         p.clip + (size_t)i * p.D_clip, NULL);
    }
    flux_shards_close(&s);
    return p;
}

// ---- the flow ----------------------------------------------------------------------------

// torchtitan's get_schedule: steps + 1 times from 1 to 0, shifted toward 1 when shift is set.
static void schedule(double *ts, int steps, int image_seq_len, bool shift) {
    double mu = 0.5 + (1.15 - 0.5) / (4096 - 256) * (image_seq_len - 256);
    for (int i = 0; i <= steps; i++) {
        double t = 1.0 - (double)i / steps;
        ts[i] = !shift || t == 0 ? t : exp(mu) / (exp(mu) + (1 / t - 1));
    }
}

typedef struct {
    ModelArgs model_args;  // the checkpoint's
    Model model;
    const FluxArgs *args;  // model_args' FLUX member
    const KernelOps *k;
    ArenaMemory memory;  // k's: the weights' and activations'
    Arena act;
    int B;           // rows of a model call: samples, twice with classifier-free guidance
    FluxBatch in;    // its inputs in k's memory
    float *host;     // their host copy, one allocation: img, noise, t (what each call changes)
                     // first, then guidance, T5 and CLIP encodings
    float *inputs;   // the same in k's memory
    size_t floats;   // floats of host (and inputs)
    float *v;        // (B, N, P) the velocity, in host memory
} Flow;

// v (B, N, P) of x_t (B, N, P) at time t: the model's velocity. The model noises its input
// itself (x_t = img + t (noise - img)); with noise = img that is img, exactly.
static const float *velocity(Flow *f, const float *x, float t) {
    size_t latent = (size_t)f->B * flux_img_tokens(f->args) * f->args->in_channels;
    float *img = f->host, *noise = img + latent, *ts = noise + latent;
    memcpy(img, x, latent * sizeof(float));
    memcpy(noise, x, latent * sizeof(float));
    for (int b = 0; b < f->B; b++) ts[b] = t;
    f->k->upload(f->inputs, f->host, (2 * latent + (size_t)f->B) * sizeof(float));
    arena_release(&f->act, 0);
    StepCtx s = {.k = f->k, .act = &f->act, .B = f->B, .T = flux_seq_len(f->args),
                 .input = &f->in, .loss_scale = 1};
    model_forward(&f->model, &s);
    f->k->download(f->v, s.output, latent * sizeof(float));
    return f->v;
}

// The batch's conditioning: rows [0, n) the empty prompt (zeros) when cfg, then sample j's
// prompt's encodings; guidance g for guidance_in.
static void flow_inputs(Flow *f, const Prompts *p, int n, int samples, bool cfg, double g) {
    int L = p->L * p->D_t5, first = cfg ? n : 0;
    size_t latent = (size_t)f->B * p->N * p->P;
    f->floats = 2 * latent + (size_t)f->B * (2 + L + p->D_clip);
    f->host = xcalloc(f->floats, sizeof(float));
    f->v = xmalloc(latent * sizeof(float));
    float *txt = f->host + 2 * latent + 2 * (size_t)f->B, *clip = txt + (size_t)f->B * L;
    float *gs = txt - f->B;
    for (int j = 0; j < n; j++) {
        int prompt = j / samples;
        memcpy(txt + (size_t)(first + j) * L, p->t5 + (size_t)prompt * L, L * sizeof(float));
        memcpy(clip + (size_t)(first + j) * p->D_clip, p->clip + (size_t)prompt * p->D_clip,
               p->D_clip * sizeof(float));
    }
    for (int b = 0; b < f->B; b++) gs[b] = (float)g;
    f->inputs = f->k->alloc(f->floats * sizeof(float));
    if (!f->inputs) die_user("--device %s: no room for the model's inputs", f->k->name);
    f->k->upload(f->inputs, f->host, f->floats * sizeof(float));  // the encodings, once
    float *img = f->inputs, *noise = img + latent, *t = noise + latent;
    float *dev_gs = t + f->B, *dev_txt = dev_gs + f->B, *dev_clip = dev_txt + (size_t)f->B * L;
    f->in = (FluxBatch){img, noise, t, dev_txt, dev_clip,
                        f->args->guidance_embed ? dev_gs : NULL};
}

static void flow_open(Flow *f, const char *path, const Prompts *p, const SampleOptions *o,
                      Arena *weights) {
    f->model_args.spec->build(&f->model, &f->model_args, false);
    generate_allocate_weights(&f->model, weights, NULL);
    train_state_load(path, &f->model.params, NULL, NULL);
    f->k = generate_backend(o->device);
    generate_place_weights(&f->model, weights, &f->memory, f->k);
    int n = o->n_prompts * (int)o->samples;
    bool cfg = o->cfg_scale != 1;
    f->B = cfg ? 2 * n : n;
    arena_init_sizing(&f->act, "activations");
    arena_reserve(&f->act, model_activation_bytes(&f->model, f->k, f->B, flux_seq_len(f->args)));
    arena_commit(&f->act, f->k->host_memory ? NULL : &f->memory);
    flow_inputs(f, p, n, (int)o->samples, cfg, o->guidance);
}

// Sample j's starting noise, drawn from (seed, j) in the latent's shape, packed: x (n, N, P).
static float *initial_noise(const Prompts *p, int n, long seed) {
    size_t latent = (size_t)p->C * p->H * p->W;
    float *raw = xmalloc(n * latent * sizeof(float)), *x = xmalloc(n * latent * sizeof(float));
    uint64_t key = rng_key((uint64_t)seed, "flux.sample.noise");
    for (int j = 0; j < n; j++)
        rng_fill_trunc_normal(raw + j * latent, latent, key, (uint64_t)j * latent, 0, 1,
                              -INFINITY, INFINITY);
    flux_pack_latents(x, raw, n, p->C, p->H, p->W);
    free(raw);
    return x;
}

// The Euler steps over x (n, N, P); with classifier-free guidance each model call runs the
// empty prompt's rows [0, n) and the prompts' [n, 2n) on the same x.
static void denoise(Flow *f, float *x, int n, const SampleOptions *o) {
    size_t latent = (size_t)flux_img_tokens(f->args) * f->args->in_channels, nx = n * latent;
    bool cfg = f->B != n;
    float *xx = xmalloc((size_t)f->B * latent * sizeof(float));
    double *ts = xmalloc((size_t)(o->steps + 1) * sizeof(double));
    schedule(ts, (int)o->steps, f->args->latent_height * f->args->latent_width,
             f->args->guidance_embed);
    for (long i = 0; i < o->steps; i++) {
        memcpy(xx, x, nx * sizeof(float));
        if (cfg) memcpy(xx + nx, x, nx * sizeof(float));
        const float *v = velocity(f, xx, (float)ts[i]);
        float dt = (float)(ts[i + 1] - ts[i]), g = (float)o->cfg_scale;
        for (size_t e = 0; e < nx; e++)
            x[e] += dt * (cfg ? v[e] + g * (v[nx + e] - v[e]) : v[e]);
    }
    free(ts);
    free(xx);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int flux_generate_main(int argc, char **argv) {
    SampleOptions o;
    parse_options(&o, argc, argv);
    Flow f = {0};
    model_spec_of_checkpoint(o.checkpoint, NULL)->args_from_checkpoint(o.checkpoint,
                                                                       &f.model_args);
    f.args = &f.model_args.as.flux;
    if (o.guidance_set && !f.args->guidance_embed)
        die_user("--guidance: %s has no guidance_in (flux-dev's); --cfg-scale guides any model",
                 o.checkpoint);
    Prompts p = read_prompts(&o, f.args);
    if (p.C != 1 && p.C != 3)
        die_user("--data %s: latents of %d channels are not pixels (the FLUX autoencoder's "
                 "decoder does not run in titan)", o.data, p.C);
    Arena weights;
    flow_open(&f, o.checkpoint, &p, &o, &weights);
    int n = o.n_prompts * (int)o.samples;
    float *x = initial_noise(&p, n, o.seed);
    double start = now_seconds();
    denoise(&f, x, n, &o);
    double seconds = now_seconds() - start;
    float *images = xmalloc((size_t)n * p.C * p.H * p.W * sizeof(float));
    flux_unpack_latents(images, x, n, p.C, p.H, p.W);
    png_grid_write(o.out, images, n, p.C, p.H, p.W, o.n_prompts, png_grid_scale(p.H, p.W));
    fprintf(stderr, "generate: %d samples of %d prompts, %ld steps in %.3f s -> %s\n", n,
            o.n_prompts, o.steps, seconds, o.out);
    free(images), free(x), free(f.host), free(f.v), free(p.t5), free(p.clip);
    f.k->free(f.inputs);
    arena_free(&f.act);
    arena_free(&weights);
    f.model_args.spec->free(&f.model);
    return 0;
}
