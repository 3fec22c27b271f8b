// Model-level tests: torchtitan's initialisation statistics (llama3's; every qwen3 flavor's per
// tensor, and a tied one's first loss near ln(vocab)), seed determinism, the activation
// arena sized by the sizing pass equals what a real step uses, activation checkpointing
// shrinks it and re-runs the blocks torchtitan's every-n-th count picks, the chunked head
// (logits recomputed in backward) gives the one-chunk step's loss and grads in less memory,
// document masking keeps a packed window's documents apart, the LR schedule's values on a
// hand-computed case, and Qwen3's QK-norm gradients against finite differences.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/documents.h"
#include "data/token_batch.h"
#include "models/llama3/llama3.h"
#include "models/qwen3/qwen3.h"
#include "optim/optim.h"

static void moments(const Param *p, double *mean, double *std, double *max_abs) {
    double s = 0, s2 = 0, m = 0;
    for (size_t i = 0; i < p->numel; i++) {
        s += p->data[i];
        s2 += (double)p->data[i] * p->data[i];
        m = fmax(m, fabs(p->data[i]));
    }
    *mean = s / p->numel;
    *std = sqrt(s2 / p->numel - *mean * *mean);
    *max_abs = m;
}

typedef struct {
    LlamaArgs args;
    Model m;
    Arena params, grads, acts;
} Built;

// b->args' model for B x T tokens, its arenas allocated.
static void build_args(Built *b, bool ac, int B, int T) {
    b->args.max_seq_len = T;
    decoder_build(&b->m, &b->args, ac);
    model_allocate(&b->m, model_activation_bytes(&b->m, kernels_backend("cpu"), B, T), &b->params,
                   &b->grads, &b->acts, NULL);
}

// loss_chunk_rows: LlamaArgs' (0: the head's own budget).
static void build_chunked(Built *b, const char *flavor, bool ac, int B, int T,
                          int loss_chunk_rows) {
    assert_true(llama3_flavor(flavor, &b->args));
    b->args.loss_chunk_rows = loss_chunk_rows;
    build_args(b, ac, B, T);
}

static void build_qwen3(Built *b, const char *flavor, int B, int T) {
    Qwen3Args q;
    assert_true(qwen3_flavor(flavor, &q));
    b->args = q.decoder;
    build_args(b, false, B, T);
}

// A fixed batch of at most FIXED_TOKENS tokens: token i is (37 i + 11) mod vocab, its target
// (53 i + 7) mod vocab, positions 0..T-1; the StepCtx that runs it on the cpu backend.
enum { FIXED_TOKENS = 256 };
typedef struct {
    int tokens[FIXED_TOKENS], targets[FIXED_TOKENS], pos[FIXED_TOKENS];
    TokenBatch batch;
} FixedBatch;

static StepCtx fixed_step(Built *b, FixedBatch *f, int B, int T) {
    assert_true(B * T <= FIXED_TOKENS);
    for (int i = 0; i < B * T; i++) {
        f->tokens[i] = (i * 37 + 11) % b->args.vocab_size;
        f->targets[i] = (i * 53 + 7) % b->args.vocab_size;
    }
    for (int i = 0; i < T; i++) f->pos[i] = i;
    f->batch = (TokenBatch){.tokens = f->tokens, .targets = f->targets, .pos = f->pos};
    return (StepCtx){.k = kernels_backend("cpu"), .act = &b->acts, .B = B, .T = T,
                     .input = &f->batch, .loss_scale = 1};
}

static void build(Built *b, const char *flavor, bool ac, int B, int T) {
    build_chunked(b, flavor, ac, B, T, 0);
}

static void unbuild(Built *b) {
    arena_free(&b->params);
    arena_free(&b->grads);
    arena_free(&b->acts);
    decoder_free(&b->m);
}

static void test_init_matches_torchtitan(void **state) {
    (void)state;
    Built b;
    build(&b, "debugmodel", false, 1, 8);
    params_initialize(&b.m.params, 0);
    double mean, std, max_abs;
    struct { const char *name; double std, cutoff; } cases[] = {
        {"tok_embeddings.weight", 1.0, INFINITY},
        {"layers.0.attention.wq.weight", 0.02, 2.0},
        {"layers.0.attention.wo.weight", 0.02 / sqrt(2.0), 2.0},
        {"layers.5.feed_forward.w2.weight", 0.02 / sqrt(12.0), 2.0},
        {"layers.3.feed_forward.w1.weight", 0.02, 2.0},
        // truncated at 3 sigma: the std of N(0,1) cut at +-3 is 0.98658
        {"output.weight", 0.98658 / 16.0, 3 / 16.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Param *p = params_find(&b.m.params, cases[i].name);
        assert_non_null(p);
        moments(p, &mean, &std, &max_abs);
        assert_true(fabs(mean) < 0.05 * cases[i].std);
        assert_true(fabs(std / cases[i].std - 1) < 0.01);
        assert_true(max_abs <= cases[i].cutoff);
    }
    Param *norm = params_find(&b.m.params, "layers.2.ffn_norm.weight");
    for (size_t i = 0; i < norm->numel; i++) assert_true(norm->data[i] == 1.0f);
    unbuild(&b);
}

// torchtitan 0.3.0's qwen3 init (models/qwen3/__init__.py), written out again here: every
// weight N(0, 0.02) untruncated; in MoE flavors wo and the experts' w2_EDF N(0, 0.02 /
// sqrt(2 n_layers)); norms ones (std 0 here), expert biases zeros (-1 here).
static double qwen3_expected_std(const char *name, int n_layers, bool moe) {
    size_t n = strlen(name);
    if (n >= 11 && !strcmp(name + n - 11, "norm.weight")) return 0;
    if (strstr(name, "expert_bias")) return -1;
    if (moe && (strstr(name, "attention.wo.") || strstr(name, ".w2_EDF")))
        return 0.02 / sqrt(2.0 * n_layers);
    return 0.02;
}

// Every parameter of every qwen3 flavor, from its first n <= SAMPLES values (param_fill fills
// any piece as params_initialize would, so even 235B-A22B is built without its weights): the
// std within 5 standard errors (1 / sqrt(2n) relative) of torchtitan's, the mean within 6, and
// of SAMPLES values one past 3 std (no truncation there, as llama3's output head's; ~11
// expected); norms ones, expert biases zeros.
// Tied flavors share one matrix of std 0.02.
static void test_qwen3_init_matches_torchtitan(void **state) {
    (void)state;
    enum { SAMPLES = 4096 };
    const char *flavors[] = {"debugmodel", "small", "0.6B", "1.7B", "4B", "8B", "14B", "32B",
                             "small_moe", "debugmodel_moe", "debugmodel_moe_dense", "30B-A3B",
                             "235B-A22B"};
    const char *tied[] = {"debugmodel", "0.6B", "1.7B", "4B"};
    float *x = malloc(SAMPLES * sizeof(float));
    for (size_t f = 0; f < sizeof flavors / sizeof flavors[0]; f++) {
        Qwen3Args q;
        assert_true(qwen3_flavor(flavors[f], &q));
        q.decoder.max_seq_len = 16;
        Model m;
        decoder_build(&m, &q.decoder, false);
        bool moe = decoder_has_moe(&q.decoder), is_tied = false;
        for (size_t t = 0; t < sizeof tied / sizeof tied[0]; t++)
            is_tied |= !strcmp(flavors[f], tied[t]);
        assert_int_equal(params_find(&m.params, "output.weight") == NULL, is_tied);
        int scaled = 0;
        for (int i = 0; i < m.params.count; i++) {
            const Param *p = &m.params.items[i];
            double want = qwen3_expected_std(p->name, q.decoder.n_layers, moe);
            size_t n = param_global_numel(p) < SAMPLES ? param_global_numel(p) : SAMPLES;
            param_fill(p, 11, 0, n, x);
            if (want <= 0) {
                for (size_t j = 0; j < n; j++)
                    if (x[j] != (want == 0 ? 1.0f : 0.0f))
                        fail_msg("%s %s: element %zu is %g", flavors[f], p->name, j, x[j]);
                continue;
            }
            double s = 0, s2 = 0, max_abs = 0;
            for (size_t j = 0; j < n; j++) {
                s += x[j];
                s2 += (double)x[j] * x[j];
                max_abs = fmax(max_abs, fabs(x[j]));
            }
            double mean = s / n, std = sqrt(s2 / n - mean * mean);
            bool tails = n < SAMPLES || max_abs > 3 * want;
            if (!(fabs(std / want - 1) < 5 / sqrt(2.0 * n) && fabs(mean) < 6 * want / sqrt(n) &&
                  tails))
                fail_msg("%s %s: std %.5g (torchtitan's %.5g), mean %.3g, max |x| %.3g",
                         flavors[f], p->name, std, want, mean, max_abs);
            scaled += want < 0.02;
        }
        assert_int_equal(scaled, moe ? 2 * q.decoder.n_layers : 0);
        decoder_free(&m);
    }
    free(x);
}

// A tied flavor's first loss is that of near-uniform logits, ln(vocab) (llama3's std-1
// embedding as its output head gave ~238 on qwen3's debugmodel).
static void test_qwen3_tied_first_loss_is_log_vocab(void **state) {
    (void)state;
    enum { B = 2, T = 32 };
    Built b;
    build_qwen3(&b, "debugmodel", B, T);
    assert_true(b.args.tie_word_embeddings);
    params_initialize(&b.m.params, 0);
    FixedBatch batch;
    StepCtx s = fixed_step(&b, &batch, B, T);
    double loss = model_forward(&b.m, &s);
    if (!(fabs(loss - log(b.args.vocab_size)) < 0.5))
        fail_msg("qwen3 debugmodel's first loss %.4g, not near ln(%d) = %.4g", loss,
                 b.args.vocab_size, log(b.args.vocab_size));
    unbuild(&b);
}

static void test_seed_determines_weights(void **state) {
    (void)state;
    Built a, b;
    build(&a, "small", false, 1, 8);
    build(&b, "small", false, 1, 8);
    params_initialize(&a.m.params, 7);
    params_initialize(&b.m.params, 7);
    assert_memory_equal(a.m.params.data, b.m.params.data, a.m.params.numel * sizeof(float));
    params_initialize(&b.m.params, 8);
    assert_true(memcmp(a.m.params.data, b.m.params.data, a.m.params.numel * sizeof(float)) != 0);
    unbuild(&a);
    unbuild(&b);
}

// The activation arena is committed at exactly the size the sizing pass counted; a real step
// must fit in it and reach it (so the estimate is neither short nor padded).
static void check_step_uses_planned_bytes(bool ac) {
    Built b;
    int B = 2, T = 16;
    build(&b, "small", ac, B, T);
    params_initialize(&b.m.params, 0);
    int *tokens = calloc(B * T, sizeof(int)), *pos = calloc(T, sizeof(int));
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 37) % b.args.vocab_size;
    for (int i = 0; i < T; i++) pos[i] = i;
    TokenBatch batch = {.tokens = tokens, .targets = tokens, .pos = pos};
    StepCtx s = {.k = kernels_backend("cpu"), .act = &b.acts, .B = B, .T = T, .input = &batch,
                 .loss_scale = 1};
    ArenaBytes planned = b.acts.peak;
    b.acts.peak = (ArenaBytes){0};
    double loss = model_forward_backward(&b.m, &s);
    assert_true(isfinite(loss) && loss > 0);
    assert_memory_equal(&b.acts.peak, &planned, sizeof planned);  // bytes and their dtypes
    free(tokens);
    free(pos);
    unbuild(&b);
}

static void test_activation_sizing_is_exact(void **state) {
    (void)state;
    check_step_uses_planned_bytes(false);
    check_step_uses_planned_bytes(true);
}

static void test_checkpointing_saves_memory(void **state) {
    (void)state;
    Built none, full;
    build(&none, "debugmodel", false, 4, 64);
    build(&full, "debugmodel", true, 4, 64);
    assert_true(full.acts.size < none.acts.size / 2);
    unbuild(&none);
    unbuild(&full);
}

// Which transformer blocks activation checkpointing re-runs, against torchtitan's count in
// _apply_ac_to_transformer_block (from 1, incremented before the modulo): selective 4 on 6
// layers is the 4th alone (a count from 0 would take the 1st and the 5th), 2 is the 2nd,
// 4th and 6th; full takes all, `op` none (each keeps its GEMMs' outputs instead).
static void expect_checkpointed(Model *m, const char *mode, const char *option,
                                const char *want) {
    model_set_checkpointing(m, mode, option);
    char got[16] = "";
    for (int i = 1; i + 1 < m->n_blocks; i++) strcat(got, m->blocks[i].checkpointed ? "x" : ".");
    if (strcmp(got, want)) fail_msg("%s %s: blocks %s, not %s", mode, option, got, want);
    assert_false(m->blocks[0].checkpointed || m->blocks[m->n_blocks - 1].checkpointed);
}

static void test_checkpointing_every_nth_counts_from_one(void **state) {
    (void)state;
    LlamaArgs args;
    Model m;
    assert_true(llama3_flavor("debugmodel", &args));
    decoder_build(&m, &args, false);
    assert_int_equal(m.n_blocks, 6 + 2);
    expect_checkpointed(&m, "selective", "4", "...x..");
    expect_checkpointed(&m, "selective", "2", ".x.x.x");
    expect_checkpointed(&m, "selective", "1", "xxxxxx");
    expect_checkpointed(&m, "selective", "7", "......");
    expect_checkpointed(&m, "full", "4", "xxxxxx");
    expect_checkpointed(&m, "none", "4", "......");
    expect_checkpointed(&m, "selective", "op", "......");
    assert_true(m.blocks[3].recompute_cheap);
    expect_checkpointed(&m, "selective", "4", "...x..");
    assert_false(m.blocks[3].recompute_cheap);
    decoder_free(&m);
}

// Chunks of 5 of the 32 rows (the last one short): the same loss and grads as the logits of
// all rows at once, to float rounding (the output GEMMs add over the chunks), in an
// activation arena smaller by most of the logits.
static void test_chunked_head_matches_one_chunk(void **state) {
    (void)state;
    enum { B = 2, T = 16 };
    Built one, chunked;
    build(&one, "small", false, B, T);
    build_chunked(&chunked, "small", false, B, T, 5);
    params_initialize(&one.m.params, 3);
    params_initialize(&chunked.m.params, 3);
    Built *runs[2] = {&one, &chunked};
    double loss[2];
    for (int r = 0; r < 2; r++) {
        FixedBatch batch;
        StepCtx s = fixed_step(runs[r], &batch, B, T);
        loss[r] = model_forward_backward(&runs[r]->m, &s);
    }
    assert_true(fabs(loss[1] - loss[0]) <= 1e-6 * loss[0]);
    double err = 0, scale = 0;
    for (size_t i = 0; i < one.m.params.numel; i++) {
        err = fmax(err, fabs((double)chunked.m.params.grad[i] - one.m.params.grad[i]));
        scale = fmax(scale, fabs((double)one.m.params.grad[i]));
    }
    assert_true(err <= 1e-5 * scale);
    size_t logits_bytes = (size_t)B * T * one.args.vocab_size * sizeof(float);
    assert_true(chunked.acts.size + logits_bytes / 2 < one.acts.size);
    unbuild(&one);
    unbuild(&chunked);
}

// Document masking: a window packing document A (ended by its end-of-text token) and document
// B gives B's tokens the logits of a run on B alone (to float rounding: B's positions are
// shifted by A's length, and RoPE's scores depend on relative positions only), and without
// the mask they differ (B's tokens see A's).
static float *forward_logits(Built *b, const int *tokens, const int *doc, int T) {
    int pos[64];
    for (int i = 0; i < T; i++) pos[i] = i;
    TokenBatch batch = {.tokens = tokens, .targets = tokens, .pos = pos, .doc = doc};
    StepCtx s = {.k = kernels_backend("cpu"), .act = &b->acts, .B = 1, .T = T, .input = &batch,
                 .loss_scale = 1};
    arena_release(&b->acts, 0);
    model_forward(&b->m, &s);
    size_t n = (size_t)T * b->args.vocab_size;
    float *logits = malloc(n * sizeof(float));
    memcpy(logits, s.output, n * sizeof(float));
    return logits;
}

// Supervised data marks its documents' ends (TOKEN_ENDS_DOCUMENT): an EOS inside a conversation
// (an instruct model's end of turn) ends no document, the marked token does.
static void test_document_ids_from_ends(void **state) {
    (void)state;
    enum { EOS = 9 };
    int tokens[2 * 4] = {5, EOS, 6, EOS, EOS, 7, 8, 3}, ends[2 * 4] = {0, 0, 0, 1, 0, 0, 1, 0};
    int doc[2 * 4], want_ends[2 * 4] = {0, 0, 0, 0, 0, 0, 0, 1},
                    want_eos[2 * 4] = {0, 0, 1, 1, 0, 1, 1, 1};
    document_ids(tokens, ends, 2, 4, EOS, doc);
    assert_memory_equal(doc, want_ends, sizeof doc);
    document_ids(tokens, NULL, 2, 4, EOS, doc);
    assert_memory_equal(doc, want_eos, sizeof doc);
}

static void test_document_masking_isolates_documents(void **state) {
    (void)state;
    enum { T = 32, A = 12, EOS = 1 };
    Built window, alone;
    build(&window, "small", false, 1, T);
    build(&alone, "small", false, 1, T - A);
    params_initialize(&window.m.params, 5);
    params_initialize(&alone.m.params, 5);
    int tokens[T], doc[T];
    for (int i = 0; i < T; i++) tokens[i] = 2 + (i * 37 + 11) % (window.args.vocab_size - 2);
    tokens[A - 1] = EOS;
    document_ids(tokens, NULL, 1, T, EOS, doc);
    assert_int_equal(doc[A - 1], 0);  // the end-of-text token ends document 0
    assert_int_equal(doc[A], 1);
    float *masked = forward_logits(&window, tokens, doc, T);
    float *unmasked = forward_logits(&window, tokens, NULL, T);
    float *solo = forward_logits(&alone, tokens + A, NULL, T - A);
    size_t V = window.args.vocab_size, n = (size_t)(T - A) * V;
    double err = 0, leak = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double)masked[A * V + i] - solo[i]));
        leak = fmax(leak, fabs((double)unmasked[A * V + i] - solo[i]));
        scale = fmax(scale, fabs((double)solo[i]));
    }
    assert_true(err <= 1e-5 * scale);
    assert_true(leak > 1e-3 * scale);
    free(masked);
    free(unmasked);
    free(solo);
    unbuild(&window);
    unbuild(&alone);
}

// warmup 2, 10 steps, decay_ratio 0.8: decay over 8 steps, one stable (virtual) step.
// QK-norm (Qwen3): the derivative of the loss along each checked tensor's gradient g, by
// central differences (loss(w + h g/|g|) - loss(w - h g/|g|)) / 2h, equals |g|: the q_norm and
// k_norm weights (set away from ones, so that every element matters and HF's per-head
// permutation would show) and the projections whose heads they normalise.
static double loss_at(Built *b, StepCtx *s) {
    arena_release(&b->acts, 0);
    return model_forward(&b->m, s);
}

static void check_directional_derivative(Built *b, StepCtx *s, const char *name) {
    Param *p = params_find(&b->m.params, name);
    assert_non_null(p);
    // The loss is fp32 (~7.6, ulp ~5e-7): its rounding moves the difference quotient by about
    // 1e-6 / 2h, against |g| as small as 8e-4 (layers.1's q_norm); the projections' curvature
    // moves it by O(h^2). 3e-2 keeps both under 1% on either build (1e-2 gave 2.4% under the
    // sanitizers' code on an AMX Xeon).
    double norm = 0, h = 3e-2;
    for (size_t i = 0; i < p->numel; i++) norm += (double)p->grad[i] * p->grad[i];
    norm = sqrt(norm);
    float *w = malloc(p->numel * sizeof(float));
    memcpy(w, p->data, p->numel * sizeof(float));
    double loss[2];
    for (int sign = 0; sign < 2; sign++) {
        for (size_t i = 0; i < p->numel; i++)
            p->data[i] = (float)(w[i] + (sign ? -h : h) * p->grad[i] / norm);
        loss[sign] = loss_at(b, s);
    }
    memcpy(p->data, w, p->numel * sizeof(float));
    free(w);
    double fd = (loss[0] - loss[1]) / (2 * h);
    if (!(fabs(fd - norm) <= 2e-2 * norm))
        fail_msg("%s: finite differences %.6g, gradient norm %.6g", name, fd, norm);
}

static void test_qk_norm_gradients_match_finite_differences(void **state) {
    (void)state;
    enum { B = 2, T = 16 };
    Built b;
    build_qwen3(&b, "small", B, T);
    params_initialize(&b.m.params, 5);
    const char *norms[] = {"layers.0.attention.q_norm.weight", "layers.0.attention.k_norm.weight",
                           "layers.1.attention.q_norm.weight", "layers.1.attention.k_norm.weight"};
    for (int n = 0; n < 4; n++) {
        Param *p = params_find(&b.m.params, norms[n]);
        assert_int_equal(p->numel, b.args.head_dim);
        for (size_t i = 0; i < p->numel; i++) p->data[i] = (float)(1 + 0.5 * sin(3.0 * i + n));
    }
    FixedBatch batch;
    StepCtx s = fixed_step(&b, &batch, B, T);
    model_forward_backward(&b.m, &s);
    for (int n = 0; n < 4; n++) check_directional_derivative(&b, &s, norms[n]);
    check_directional_derivative(&b, &s, "layers.0.attention.wq.weight");
    check_directional_derivative(&b, &s, "layers.1.attention.wk.weight");
    unbuild(&b);
}

static void test_lr_schedule_values(void **state) {
    (void)state;
    LrSchedule s = lr_schedule_make(10, 2, 0.8, DECAY_LINEAR, 0.0);
    double expect[] = {0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125};
    for (int step = 1; step <= 10; step++)
        assert_true(fabs(lr_schedule_factor(&s, step) - expect[step - 1]) < 1e-12);
    // No warmup, decay over all 10 steps after the virtual stable step: step s has progress
    // (s - 1) / 10, so the last update still runs above min_lr_factor.
    LrSchedule c = lr_schedule_make(10, 0, -1, DECAY_COSINE, 0.1);
    assert_true(lr_schedule_factor(&c, 1) == 1.0);
    for (int step = 2; step <= 10; step++) {
        double cosine = 0.5 * (1 + cos(M_PI * (step - 1) / 10.0));
        assert_true(fabs(lr_schedule_factor(&c, step) - (0.1 + 0.9 * cosine)) < 1e-12);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_matches_torchtitan),
        cmocka_unit_test(test_qwen3_init_matches_torchtitan),
        cmocka_unit_test(test_qwen3_tied_first_loss_is_log_vocab),
        cmocka_unit_test(test_seed_determines_weights),
        cmocka_unit_test(test_activation_sizing_is_exact),
        cmocka_unit_test(test_checkpointing_saves_memory),
        cmocka_unit_test(test_checkpointing_every_nth_counts_from_one),
        cmocka_unit_test(test_chunked_head_matches_one_chunk),
        cmocka_unit_test(test_document_ids_from_ends),
        cmocka_unit_test(test_document_masking_isolates_documents),
        cmocka_unit_test(test_lr_schedule_values),
        cmocka_unit_test(test_qk_norm_gradients_match_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
