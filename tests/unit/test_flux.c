// FLUX model tests (the PyTorch parity is tests/integration/test_flux_parity.sh): the flavors'
// parameter counts (FLUX.1-dev's published 11,901,408,320) and torchtitan's names, init
// statistics and the prediction of a freshly initialised model (zero: the final layer starts at
// zero), the rectified flow's noised input and velocity target (their sign), the sizing pass
// equal to a real step's arena, activation checkpointing and the split
// backward giving the same bits, latent packing against torchtitan's index formula, and the
// argument checks.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/flux/flux.h"

// A FLUX small enough for unit tests with every feature: 2 heads of 16 (RoPE axes 4 + 6 + 6),
// guidance_in, 3 text tokens and a 2x3 patch grid.
static FluxArgs tiny(void) {
    return (FluxArgs){.in_channels = 16, .out_channels = 16, .vec_in_dim = 8,
                      .context_in_dim = 12, .hidden_size = 32, .mlp_ratio = 2.0, .num_heads = 2,
                      .depth = 2, .depth_single_blocks = 2, .axes_dim = {4, 6, 6},
                      .theta = 10000, .qkv_bias = true, .guidance_embed = true, .txt_len = 3,
                      .latent_height = 4, .latent_width = 6};
}

typedef struct {
    FluxArgs args;
    Model m;
    Arena params, grads, acts;
    int B, T;
    float *img, *noise, *t, *txt, *clip, *guidance;
    FluxBatch batch;
} Built;

static float *random_floats(size_t n, unsigned seed, float lo, float hi) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) / (float)(1u << 24);
    }
    return x;
}

// The step of the split backward (pipeline schedules): the input parts of every block, then
// the weight parts, keeping what the input parts carved.
static void step_split(Model *m, StepCtx *s) {
    model_forward_blocks(m, s, &m->slots, 0, m->n_blocks, NULL);
    model_backward_blocks(m, s, &m->slots, 0, m->n_blocks, BLOCK_BACKWARD_INPUT, NULL);
    model_backward_blocks(m, s, &m->slots, 0, m->n_blocks, BLOCK_BACKWARD_WEIGHT, NULL);
}

// split: the activation arena sized for step_split.
static void build(Built *b, bool ac, int B, bool split) {
    b->args = tiny();
    b->B = B;
    b->T = flux_seq_len(&b->args);
    flux_build(&b->m, &b->args, ac);
    const KernelOps *k = kernels_backend("cpu");
    Arena sizing;
    arena_init_sizing(&sizing, "activations");
    StepCtx s = {.k = k, .act = &sizing, .B = B, .T = b->T};
    if (split) step_split(&b->m, &s);
    ArenaBytes bytes = split ? sizing.peak : model_activation_bytes(&b->m, k, B, b->T);
    model_allocate(&b->m, bytes, &b->params, &b->grads, &b->acts, NULL);
    const FluxArgs *a = &b->args;
    size_t image = (size_t)B * flux_img_tokens(a) * a->in_channels;
    b->img = random_floats(image, 1, -1, 1);
    b->noise = random_floats(image, 2, -1, 1);
    b->t = random_floats((size_t)B, 3, 0, 1);
    b->txt = random_floats((size_t)B * a->txt_len * a->context_in_dim, 4, -1, 1);
    b->clip = random_floats((size_t)B * a->vec_in_dim, 5, -1, 1);
    b->guidance = random_floats((size_t)B, 6, 1, 5);
    b->batch = (FluxBatch){b->img, b->noise, b->t, b->txt, b->clip, b->guidance};
}

static void unbuild(Built *b) {
    arena_free(&b->params);
    arena_free(&b->grads);
    arena_free(&b->acts);
    flux_free(&b->m);
    free(b->img), free(b->noise), free(b->t), free(b->txt), free(b->clip), free(b->guidance);
}

static StepCtx step_ctx(Built *b) {
    return (StepCtx){.k = kernels_backend("cpu"), .act = &b->acts, .B = b->B, .T = b->T,
                     .input = &b->batch, .loss_scale = 1};
}

// Every weight moved off torchtitan's init (whose zero gates would leave most gradients 0).
static void init_perturbed(Built *b) {
    params_initialize(&b->m.params, 11);
    float *noise = random_floats(b->m.params.numel, 12, -0.05f, 0.05f);
    for (size_t i = 0; i < b->m.params.numel; i++) b->m.params.data[i] += noise[i];
    free(noise);
}

static void test_flavors_match_torchtitan(void **state) {
    (void)state;
    const struct { const char *name; size_t params; int blocks; } want[] = {
        {"flux-dev", 11901408320u, 59}, {"flux-schnell", 11891178560u, 59},
        {"flux-debug", 258286144u, 6}};
    for (int i = 0; i < 3; i++) {
        FluxArgs a;
        Model m;
        assert_true(flux_flavor(want[i].name, &a));
        flux_build(&m, &a, false);
        assert_int_equal(m.params.numel, want[i].params);
        assert_int_equal(m.n_blocks, want[i].blocks);
        assert_string_equal(m.params.items[0].name, "img_in.weight");
        assert_non_null(params_find(&m.params, "double_blocks.1.txt_attn.norm.key_norm.weight"));
        assert_non_null(params_find(&m.params, "single_blocks.1.linear2.bias"));
        assert_true((params_find(&m.params, "guidance_in.out_layer.bias") != NULL) ==
                    !strcmp(want[i].name, "flux-dev"));
        assert_string_equal(m.params.items[m.params.count - 1].name,
                            "final_layer.adaLN_modulation.1.bias");
        flux_free(&m);
    }
    FluxArgs a;
    assert_false(flux_flavor("flux-pro", &a));
}

static void test_init_matches_torchtitan(void **state) {
    (void)state;
    Built b;
    build(&b, false, 2, false);
    params_initialize(&b.m.params, 5);
    ParamTable *t = &b.m.params;
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        bool zero = strstr(p->name, "mod") || strstr(p->name, "final_layer") ||
                    strstr(p->name, ".bias");
        for (size_t j = 0; j < p->numel; j++) {
            if (zero) assert_true(p->data[j] == 0);
            if (strstr(p->name, "norm")) assert_true(p->data[j] == 1);
        }
    }
    // Xavier-uniform: within sqrt(6 / (in + out)), std a / sqrt(3).
    const Param *w = params_find(t, "single_blocks.0.linear1.weight");
    double a = sqrt(6.0 / (w->shape[0] + w->shape[1])), s2 = 0;
    for (size_t j = 0; j < w->numel; j++) {
        assert_true(fabs(w->data[j]) <= a);
        s2 += (double)w->data[j] * w->data[j];
    }
    assert_true(fabs(sqrt(s2 / w->numel) / (a / sqrt(3)) - 1) < 0.05);
    // The zero final layer predicts 0: the loss is the mean of (noise - img)^2.
    StepCtx s = step_ctx(&b);
    double loss = model_forward(&b.m, &s), want = 0;
    size_t n = (size_t)b.B * flux_img_tokens(&b.args) * b.args.in_channels;
    for (size_t j = 0; j < n; j++) want += pow((double)b.noise[j] - b.img[j], 2);
    assert_true(fabs(loss - want / n) < 1e-6 * want / n);
    unbuild(&b);
}

// The arena is committed at exactly what the sizing pass counted, and a real step reaches it.
static void test_activation_sizing_is_exact(void **state) {
    (void)state;
    for (int ac = 0; ac < 2; ac++) {
        Built b;
        build(&b, ac, 2, false);
        init_perturbed(&b);
        StepCtx s = step_ctx(&b);
        ArenaBytes planned = b.acts.peak;
        b.acts.peak = (ArenaBytes){0};
        assert_true(isfinite(model_forward_backward(&b.m, &s)));
        assert_memory_equal(&b.acts.peak, &planned, sizeof planned);
        unbuild(&b);
    }
}

// Recomputing checkpointed blocks, or splitting backward into its input and weight parts,
// gives the plain step's loss and gradients bit for bit, checkpointing in less memory.
static void test_checkpointing_and_split_backward_match(void **state) {
    (void)state;
    Built plain, ac, split;
    build(&plain, false, 2, false);
    build(&ac, true, 2, false);
    build(&split, false, 2, true);
    Built *all[3] = {&plain, &ac, &split};
    double loss[3];
    for (int r = 0; r < 3; r++) {
        init_perturbed(all[r]);
        StepCtx s = step_ctx(all[r]);
        Model *m = &all[r]->m;
        if (r < 2) {
            loss[r] = model_forward_backward(m, &s);
            continue;
        }
        step_split(m, &s);
        loss[r] = s.loss;
    }
    for (int r = 1; r < 3; r++) {
        assert_true(loss[r] == loss[0]);
        assert_memory_equal(all[r]->m.params.grad, plain.m.params.grad,
                            plain.m.params.numel * sizeof(float));
    }
    assert_true(ac.acts.size < plain.acts.size);
    for (int r = 0; r < 3; r++) unbuild(all[r]);
}

// The rectified flow of torchtitan's flux trainer: the model sees x_t = (1 - t) img + t noise
// and learns the velocity noise - img. Both read here: with img_in the identity into the first
// in_channels columns, the embed's image rows are x_t; with final_layer.linear's weight zero
// the prediction is its bias b, and the loss the mean of (b - (noise - img))^2, whose gradient
// in b is 2 (b - (noise - img)) / (B N C) summed over the rows.
static void test_flow_target(void **state) {
    (void)state;
    Built b;
    build(&b, false, 2, false);
    init_perturbed(&b);
    const FluxArgs *a = &b.args;
    int C = a->in_channels, N = flux_img_tokens(a), L = a->txt_len, D = a->hidden_size;
    Param *img_in = params_find(&b.m.params, "img_in.weight");
    memset(img_in->data, 0, img_in->numel * sizeof(float));
    for (int c = 0; c < C; c++) img_in->data[c * C + c] = 1;  // (D, C): row c picks channel c
    memset(params_find(&b.m.params, "img_in.bias")->data, 0, (size_t)D * sizeof(float));
    StepCtx s = step_ctx(&b);
    const float *h = model_forward_blocks(&b.m, &s, &b.m.slots, 0, 1, NULL);
    for (int i = 0; i < b.B; i++)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                size_t at = ((size_t)i * N + n) * C + c;
                double want = (1 - b.t[i]) * b.img[at] + b.t[i] * b.noise[at];
                float got = h[((size_t)i * (1 + L + N) + 1 + L + n) * D + c];
                if (fabs(got - want) > 1e-6)
                    fail_msg("sample %d token %d channel %d: x_t %g, (1 - t) img + t noise %g",
                             i, n, c, got, want);
            }
    arena_release(&b.acts, 0);
    Param *w = params_find(&b.m.params, "final_layer.linear.weight");
    Param *bias = params_find(&b.m.params, "final_layer.linear.bias");
    memset(w->data, 0, w->numel * sizeof(float));
    for (int c = 0; c < C; c++) bias->data[c] = 0.5f - 0.1f * (float)c;
    memset(b.m.params.grad, 0, b.m.params.numel * sizeof(float));
    s = step_ctx(&b);
    double loss = model_forward_backward(&b.m, &s), want = 0, flipped = 0;
    size_t elements = (size_t)b.B * N * C;
    double *dbias = calloc((size_t)C, sizeof(double));
    for (size_t j = 0; j < elements; j++) {
        double v = (double)b.noise[j] - b.img[j], pred = bias->data[j % C];
        want += (pred - v) * (pred - v) / elements;
        flipped += (pred + v) * (pred + v) / elements;
        dbias[j % C] += 2 * (pred - v) / elements;
    }
    assert_true(fabs(flipped - want) > 0.01 * want);  // the data tells the two signs apart
    if (fabs(loss - want) > 1e-6 * want)
        fail_msg("loss %.9g, mean (b - (noise - img))^2 %.9g (with img - noise: %.9g)", loss,
                 want, flipped);
    for (int c = 0; c < C; c++)
        if (fabs(bias->grad[c] - dbias[c]) > 1e-6)
            fail_msg("final_layer.linear.bias grad[%d] %g, want %g", c, bias->grad[c], dbias[c]);
    free(dbias);
    unbuild(&b);
}

// torchtitan's pack_latents: (b, c, y, x) -> token (y/2)(W/2) + x/2, channel (2c + y%2) 2 + x%2.
static void test_pack_latents(void **state) {
    (void)state;
    enum { B = 2, C = 3, H = 4, W = 6, N = B * C * H * W };
    float latents[N], packed[N], back[N];
    for (int i = 0; i < N; i++) latents[i] = (float)i;
    flux_pack_latents(packed, latents, B, C, H, W);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    int token = (y / 2) * (W / 2) + x / 2, ch = (c * 2 + y % 2) * 2 + x % 2;
                    float want = latents[((b * C + c) * H + y) * W + x];
                    assert_true(packed[(b * (H / 2) * (W / 2) + token) * C * 4 + ch] == want);
                }
    flux_unpack_latents(back, packed, B, C, H, W);
    assert_memory_equal(back, latents, sizeof latents);
}

static void test_args_check(void **state) {
    (void)state;
    char err[256];
    FluxArgs a = tiny();
    assert_null(flux_args_check(&a, err, sizeof err));
    a.num_heads = 3;
    assert_string_equal(flux_args_check(&a, err, sizeof err),
                        "hidden_size 32 is not a multiple of num_heads 3");
    a = tiny();
    a.axes_dim[0] = 6;
    assert_string_equal(flux_args_check(&a, err, sizeof err),
                        "RoPE axes 6 + 6 + 6 (each even) do not make head_dim 16");
    a = tiny();
    a.latent_width = 5;
    assert_string_equal(flux_args_check(&a, err, sizeof err),
                        "latents of 4x5 are not cut into 2x2 patches");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flavors_match_torchtitan),
        cmocka_unit_test(test_init_matches_torchtitan),
        cmocka_unit_test(test_activation_sizing_is_exact),
        cmocka_unit_test(test_checkpointing_and_split_backward_match),
        cmocka_unit_test(test_flow_target),
        cmocka_unit_test(test_pack_latents),
        cmocka_unit_test(test_args_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
