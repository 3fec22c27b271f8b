// FLUX's embed and head blocks: torchtitan's FluxModel.forward up to the double blocks, and its
// final_layer with the trainer's rectified-flow loss (torchtitan's flux/trainer.py
// forward_backward_step, MSELoss with sum reduction over the number of latent elements).
#include "core/errors.h"
#include "models/flux/layers.h"

#define TIME_MAX_PERIOD 10000.0f
#define TIME_FACTOR 1000.0f

// The microbatch's inputs, read only when computing (a sizing pass has none).
static const FluxBatch *flux_batch(const StepCtx *s) {
    CHECK(s->input);
    return s->input;
}

// target (n) = noise - img, the velocity the model learns.
static void flow_target(const StepCtx *s, float *target, const float *img, const float *noise,
                        size_t n) {
    s->k->copy(target, img, n * sizeof(float));
    s->k->scale(target, n, -1);
    s->k->add(target, noise, n);
}

// Room for a copy of the share's rows of a batch tensor: n floats under context parallel,
// none when the share is the whole sequence (the batch's tensors are then read in place).
static float *share_room(const StepCtx *s, FluxDims d, size_t n) {
    return arena_floats(s->act, d.shares > 1 ? n : 0);
}

// The share's rows [first, first + count) of each sample of src (B, total, width): src itself
// when they are all of them, else their copy in room.
static const float *share_rows(const StepCtx *s, float *room, const float *src, FluxDims d,
                               int total, int first, int count, int width) {
    if (count == total) return src;
    flux_rows_gather(s, room, src, d.B, total, first, count, width);
    return room;
}

// The share's image tokens of the batch's clean latents and noise (B*N, C) each; room: 2 B*N*C
// floats of share_room.
static void share_latents(const StepCtx *s, const FluxBatch *in, float *room, FluxDims d, int C,
                          const float **img, const float **noise) {
    *img = share_rows(s, room, in->img, d, d.N_all, d.n0, d.N, C);
    *noise = share_rows(s, room + (size_t)d.B * d.N * C, in->noise, d, d.N_all, d.n0, d.N, C);
}

// ---- embed: the hidden state's rows from the batch ----------------------------------------
//
//   vec = time_in(temb(t)) + vector_in(clip) [+ guidance_in(temb(guidance))]
//   txt rows = txt_in(t5), img rows = img_in(x_t), x_t = (1 - t) img + t noise

typedef struct {
    float *h, *a;  // (B, D) each: in_layer's output, silu(h)
} EmbedderSaved;

typedef struct {
    float *x_t;                 // (B*N, C): img_in's input
    const float *txt;           // (B*L, context_in_dim): txt_in's input, the share's T5 rows
    float *txt_room;            // their copy under context parallel
    float *temb, *gemb;         // (B, FLUX_TIME_DIM): the timestep's and guidance's embeddings
    EmbedderSaved time_in, vector_in, guidance_in;
} EmbedSaved;

// out (B, D) = out_layer(silu(in_layer(x))) + beta out.
static void embedder_forward(const FluxMlpEmbedder *e, const StepCtx *s, EmbedderSaved *sv,
                             float *out, const float *x, int B, float beta) {
    flux_linear_forward(&e->in_layer, s, sv->h, x, B, 0);
    s->k->silu_forward(sv->a, sv->h, (size_t)B * flux_linear_out(&e->in_layer));
    flux_linear_forward(&e->out_layer, s, out, sv->a, B, beta);
}

// The embedder's parameter gradients from dout (B, D); x takes none. scratch: 2 (B, D).
static void embedder_backward(const FluxMlpEmbedder *e, const StepCtx *s, const EmbedderSaved *sv,
                              const float *dout, const float *x, int B, float *scratch) {
    size_t n = (size_t)B * flux_linear_out(&e->in_layer);
    float *da = scratch, *dh = scratch + n;
    flux_linear_backward(&e->out_layer, s, da, dout, sv->a, B, 0);
    s->k->zero(dh, n * sizeof(float));
    s->k->silu_backward(dh, da, sv->h, n);
    flux_linear_backward(&e->in_layer, s, NULL, dh, x, B, 0);
}

static void embedder_carve(const StepCtx *s, EmbedderSaved *sv, FluxDims d) {
    sv->h = arena_floats(s->act, (size_t)d.B * d.D);
    sv->a = arena_floats(s->act, (size_t)d.B * d.D);
}

static void embed_reserve(const FluxEmbed *e, const StepCtx *s, FluxDims d) {
    const FluxLinear *per_sample[] = {&e->time_in.in_layer, &e->time_in.out_layer,
                                      &e->vector_in.in_layer, &e->vector_in.out_layer,
                                      &e->guidance_in.in_layer, &e->guidance_in.out_layer};
    flux_linears_reserve(s, per_sample, e->args->guidance_embed ? 6 : 4, d.B);
    flux_linears_reserve(s, (const FluxLinear *[]){&e->img_in}, 1, d.B * d.N);
    flux_linears_reserve(s, (const FluxLinear *[]){&e->txt_in}, 1, d.B * d.L);
}

// The forward math: scratch (B*N*C + B*N*D + B*L*D + B*D) for the target, the rows, vec;
// room for the share's latents (share_latents).
static void embed_compute(const FluxEmbed *e, const StepCtx *s, EmbedSaved *sv, float *y,
                          FluxDims d, float *scratch, float *room) {
    const FluxBatch *in = flux_batch(s);
    int C = e->args->in_channels;
    size_t nc = (size_t)d.B * d.N * C;
    float *target = scratch, *img = target + nc, *txt = img + (size_t)d.B * d.N * d.D;
    float *vec = txt + (size_t)d.B * d.L * d.D;
    const float *clean, *noise;
    share_latents(s, in, room, d, C, &clean, &noise);
    sv->txt = share_rows(s, sv->txt_room, in->txt, d, d.L_all, d.l0, d.L,
                         e->args->context_in_dim);
    // x_t = img + t (noise - img): the sample's t scales all N*C of its elements.
    flow_target(s, target, clean, noise, nc);
    s->k->copy(sv->x_t, clean, nc * sizeof(float));
    s->k->gated_add_forward(sv->x_t, target, in->t, 1, d.B, d.N * C, 1);
    flux_linear_forward(&e->img_in, s, img, sv->x_t, d.B * d.N, 0);
    if (d.L) flux_linear_forward(&e->txt_in, s, txt, sv->txt, d.B * d.L, 0);
    s->k->timestep_embedding(sv->temb, in->t, d.B, FLUX_TIME_DIM, TIME_MAX_PERIOD, TIME_FACTOR);
    embedder_forward(&e->time_in, s, &sv->time_in, vec, sv->temb, d.B, 0);
    embedder_forward(&e->vector_in, s, &sv->vector_in, vec, in->clip, d.B, 1);
    if (e->args->guidance_embed) {
        CHECK(in->guidance);
        s->k->timestep_embedding(sv->gemb, in->guidance, d.B, FLUX_TIME_DIM, TIME_MAX_PERIOD,
                                 TIME_FACTOR);
        embedder_forward(&e->guidance_in, s, &sv->guidance_in, vec, sv->gemb, d.B, 1);
    }
    flux_rows_scatter(s, y, vec, d.B, d.S, 0, 1, d.D);
    flux_rows_scatter(s, y, txt, d.B, d.S, 1, d.L, d.D);
    flux_rows_scatter(s, y, img, d.B, d.S, 1 + d.L, d.N, d.D);
}

static void embed_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    (void)x;
    FluxEmbed *e = b->self;
    EmbedSaved *sv = saved;
    FluxDims d = flux_dims(e->args, e->share, s);
    int C = e->args->in_channels;
    sv->x_t = arena_floats(s->act, (size_t)d.B * d.N * C);
    sv->txt_room = share_room(s, d, (size_t)d.B * d.L * e->args->context_in_dim);
    sv->temb = arena_floats(s->act, (size_t)d.B * FLUX_TIME_DIM);
    embedder_carve(s, &sv->time_in, d);
    embedder_carve(s, &sv->vector_in, d);
    if (e->args->guidance_embed) {
        sv->gemb = arena_floats(s->act, (size_t)d.B * FLUX_TIME_DIM);
        embedder_carve(s, &sv->guidance_in, d);
    }
    size_t mark = arena_mark(s->act);  // scratch from here
    size_t rows = (size_t)d.B * (d.N + d.L + 1);
    float *scratch = arena_floats(s->act, (size_t)d.B * d.N * C + rows * d.D);
    float *room = share_room(s, d, 2 * (size_t)d.B * d.N * C);
    embed_reserve(e, s, d);
    if (!step_sizing(s)) embed_compute(e, s, sv, y, d, scratch, room);
    arena_release(s->act, mark);
}

// Parameter gradients only: the inputs are data.
static void embed_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                           const float *dy, float *dx) {
    (void)x;
    (void)dx;
    if (phase == BLOCK_BACKWARD_WEIGHT) return;  // taken with the input part
    FluxEmbed *e = b->self;
    EmbedSaved *sv = saved;
    FluxDims d = flux_dims(e->args, e->share, s);
    size_t bd = (size_t)d.B * d.D;
    float *dvec = arena_floats(s->act, bd), *scratch = arena_floats(s->act, 2 * bd);
    float *dimg = arena_floats(s->act, (size_t)d.B * d.N * d.D);
    float *dtxt = arena_floats(s->act, (size_t)d.B * d.L * d.D);
    embed_reserve(e, s, d);
    if (step_sizing(s)) return;
    const FluxBatch *in = flux_batch(s);
    flux_rows_gather(s, dvec, dy, d.B, d.S, 0, 1, d.D);
    flux_rows_gather(s, dtxt, dy, d.B, d.S, 1, d.L, d.D);
    flux_rows_gather(s, dimg, dy, d.B, d.S, 1 + d.L, d.N, d.D);
    flux_linear_backward(&e->img_in, s, NULL, dimg, sv->x_t, d.B * d.N, 0);
    if (d.L) flux_linear_backward(&e->txt_in, s, NULL, dtxt, sv->txt, d.B * d.L, 0);
    embedder_backward(&e->time_in, s, &sv->time_in, dvec, sv->temb, d.B, scratch);
    embedder_backward(&e->vector_in, s, &sv->vector_in, dvec, in->clip, d.B, scratch);
    if (e->args->guidance_embed)
        embedder_backward(&e->guidance_in, s, &sv->guidance_in, dvec, sv->gemb, d.B, scratch);
}

// ---- head: final_layer and the rectified-flow loss -----------------------------------------
//
//   shift, scale = adaLN_modulation(silu(vec)); pred = linear(adaLN(img rows; shift, scale))
//   loss = sum (pred - (noise - img))^2 / (B N C)
// Under context parallel each rank sums over its share's image tokens and divides by its
// average share of the elements, B N C / cp: the trainer's mean over the cp ranks (of the
// losses, and FSDP's of the gradients) then makes the global batch's MSE. (A share of text
// tokens only adds nothing.)

typedef struct {
    FluxCond cond;
    float *xi;         // (B*N, D): the image rows
    float *mod;        // (B, 2D)
    FluxNorm n;
    float *m;          // (B*N, D): linear's input
    float *pred;       // (B*N, C): StepCtx.output
} HeadSaved;

// The elements the loss divides by: the batch's B N C, over the ranks sharing the sequence.
static double head_elements(FluxDims d, int C) { return (double)d.B * d.N_all * C / d.shares; }

static void head_reserve(const FluxHead *h, const StepCtx *s, FluxDims d) {
    flux_linears_reserve(s, (const FluxLinear *[]){&h->linear}, 1, d.B * d.N);
    flux_linears_reserve(s, (const FluxLinear *[]){&h->adaln}, 1, d.B);
}

static void head_forward(Block *b, StepCtx *s, void *saved, const float *x, float *y) {
    (void)y;
    FluxHead *h = b->self;
    HeadSaved *sv = saved;
    FluxDims d = flux_dims(h->args, h->share, s);
    int C = h->args->out_channels, rows = d.B * d.N;
    size_t nc = (size_t)rows * C;
    flux_cond_carve(s, &sv->cond, d);
    sv->xi = arena_floats(s->act, (size_t)rows * d.D);
    sv->mod = arena_floats(s->act, (size_t)d.B * 2 * d.D);
    flux_norm_carve(s, &sv->n, rows, d.D);
    sv->m = arena_floats(s->act, (size_t)rows * d.D);
    sv->pred = arena_floats(s->act, nc);
    s->output = sv->pred;
    size_t mark = arena_mark(s->act);  // scratch from here
    float *target = arena_floats(s->act, nc), *sq = arena_floats(s->act, (size_t)rows);
    float *room = share_room(s, d, 2 * nc);
    head_reserve(h, s, d);
    s->loss = 0;
    if (!step_sizing(s) && d.N) {
        const float *clean, *noise;
        share_latents(s, flux_batch(s), room, d, C, &clean, &noise);
        flux_cond_forward(s, &sv->cond, x, NULL, d);
        flux_rows_gather(s, sv->xi, x, d.B, d.S, 1 + d.L, d.N, d.D);
        flux_linear_forward(&h->adaln, s, sv->mod, sv->cond.svec, d.B, 0);
        flux_adaln_forward(s, &sv->n, sv->m, sv->xi, sv->mod, sv->mod + d.D, 2 * d.D, d.B, d.N,
                           d.D);
        flux_linear_forward(&h->linear, s, sv->pred, sv->m, rows, 0);
        flow_target(s, target, clean, noise, nc);
        s->k->squared_error_forward(sq, sv->pred, target, rows, C);
        s->loss = s->k->sum(sq, (size_t)rows) / head_elements(d, C);
    }
    arena_release(s->act, mark);
}

// Parameter gradients in the input part, as the other blocks.
static void head_backward(Block *b, StepCtx *s, void *saved, BlockPhase phase, const float *x,
                          const float *dy, float *dx) {
    (void)x;
    (void)dy;
    if (phase == BLOCK_BACKWARD_WEIGHT) return;
    FluxHead *h = b->self;
    HeadSaved *sv = saved;
    FluxDims d = flux_dims(h->args, h->share, s);
    int C = h->args->out_channels, rows = d.B * d.N;
    size_t nc = (size_t)rows * C, n = (size_t)rows * d.D, bd = (size_t)d.B * d.D;
    float *target = arena_floats(s->act, nc), *dpred = arena_floats(s->act, nc);
    float *dm = arena_floats(s->act, n), *dxi = arena_floats(s->act, n);
    float *dmod = arena_floats(s->act, 2 * bd), *dsvec = arena_floats(s->act, bd);
    float *scratch = arena_floats(s->act, n), *room = share_room(s, d, 2 * nc);
    head_reserve(h, s, d);
    if (step_sizing(s) || !d.N) return;
    const float *clean, *noise;
    share_latents(s, flux_batch(s), room, d, C, &clean, &noise);
    flow_target(s, target, clean, noise, nc);
    s->k->zero(dpred, nc * sizeof(float));
    s->k->squared_error_backward(dpred, sv->pred, target, nc,
                                 s->loss_scale / (float)head_elements(d, C));
    flux_linear_backward(&h->linear, s, dm, dpred, sv->m, rows, 0);
    s->k->zero(dxi, n * sizeof(float));
    s->k->zero(dmod, 2 * bd * sizeof(float));
    flux_adaln_backward(s, &sv->n, dxi, dmod, dmod + d.D, dm, sv->xi, sv->mod + d.D, 2 * d.D, d.B,
                        d.N, d.D, scratch);
    flux_rows_scatter(s, dx, dxi, d.B, d.S, 1 + d.L, d.N, d.D);
    flux_linear_backward(&h->adaln, s, dsvec, dmod, sv->cond.svec, d.B, 0);
    flux_cond_backward(s, &sv->cond, dx, NULL, dsvec, scratch, d);
}

const BlockOps FLUX_EMBED_OPS = {"embed", sizeof(EmbedSaved), embed_forward, embed_backward};
const BlockOps FLUX_HEAD_OPS = {"head", sizeof(HeadSaved), head_forward, head_backward};
