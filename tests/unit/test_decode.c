// KV-cache decoding against the training forward: decoding a sequence one token at a time
// must give, at every position, the logits model_forward computes for the whole sequence.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/token_batch.h"
#include "models/llama3/llama3.h"
#include "models/qwen3/qwen3.h"

#define DECODE_TOL 1e-5  // max |decode - forward| / max |forward| at each position

// Every MoE layer's routing bias (zeros at init) set to a spread of E values, so that it moves
// the choice of experts away from the scores' own top k (in decode as in the forward).
static void spread_expert_bias(Model *m) {
    for (int i = 0; i < m->params.count; i++) {
        Param *p = &m->params.items[i];
        if (!strstr(p->name, "expert_bias")) continue;
        for (size_t e = 0; e < p->numel; e++) p->data[e] = 0.05f * (float)((e * 5) % 7) - 0.15f;
    }
}

static void check_decode_matches_forward(LlamaArgs args, int T) {
    const KernelOps *k = kernels_backend("cpu");
    args.max_seq_len = T;
    Model m;
    Arena params, grads, acts;
    decoder_build(&m, &args, false);
    model_allocate(&m, model_activation_bytes(&m, k, 1, T), &params, &grads, &acts, NULL);
    params_initialize(&m.params, 3);
    spread_expert_bias(&m);
    int *tokens = calloc(T, sizeof(int)), *pos = calloc(T, sizeof(int));
    for (int t = 0; t < T; t++) tokens[t] = (t * 7919 + 13) % args.vocab_size, pos[t] = t;
    TokenBatch batch = {.tokens = tokens, .targets = tokens, .pos = pos};
    StepCtx s = {.k = k, .act = &acts, .B = 1, .T = T, .input = &batch, .loss_scale = 1};
    model_forward(&m, &s);

    DecoderKVCache cache;
    decoder_kv_cache_init(&cache, &m, T, k);
    for (int t = 0; t < T; t++) {
        const float *got = decoder_decode_step(&m, &cache, k, tokens[t], t);
        const float *want = s.output + (size_t)t * args.vocab_size;
        double err = 0, scale = 0;
        for (int j = 0; j < args.vocab_size; j++) {
            double d = fabs((double)got[j] - want[j]);
            err = d > err || isnan(d) ? d : err;
            scale = fmax(scale, fabs(want[j]));
        }
        if (!(err <= DECODE_TOL * scale))
            fail_msg("position %d: decode logits differ from the forward's by %.3g (scale %.3g)", t,
                     err, scale);
    }
    decoder_kv_cache_free(&cache);
    free(tokens), free(pos);
    arena_free(&params), arena_free(&grads), arena_free(&acts);
    decoder_free(&m);
}

// GQA (8 query heads over 4 kv heads), untied output.
static void test_decode_small(void **state) {
    (void)state;
    LlamaArgs args;
    assert_true(llama3_flavor("small", &args));
    check_decode_matches_forward(args, 32);
}

// Multi-head attention with the classifier tied to the embeddings and Llama 3.1 RoPE scaling.
static void test_decode_tied_scaled_rope(void **state) {
    (void)state;
    LlamaArgs args;
    assert_true(llama3_flavor("debugmodel", &args));
    args.n_layers = 2;
    args.tie_word_embeddings = true;
    args.rope_scaling = true;
    check_decode_matches_forward(args, 20);
}

// Qwen3: QK-norm before RoPE, heads of head_dim wider than dim / n_heads, GQA.
static void test_decode_qwen3(void **state) {
    (void)state;
    Qwen3Args args;
    assert_true(qwen3_flavor("small", &args));
    check_decode_matches_forward(args.decoder, 24);
}

// Qwen3's MoE (8 experts, top 2, softmax scores normalised over the chosen): decode routes the
// one token with the expert bias as the forward routes every row.
static void test_decode_qwen3_moe(void **state) {
    (void)state;
    Qwen3Args args;
    assert_true(qwen3_flavor("small_moe", &args));
    check_decode_matches_forward(args.decoder, 24);
}

// The MoE layer's other options through decode: DeepSeek's sigmoid scores scaled, shared
// experts beside the routed ones, top 3, and a balance loss (computed on the one row, unused).
static void test_decode_moe_shared_sigmoid(void **state) {
    (void)state;
    Qwen3Args args;
    assert_true(qwen3_flavor("small_moe", &args));
    MoeArgs *moe = &args.decoder.moe;
    moe->router.score_func = MOE_SCORE_SIGMOID;
    moe->router.route_scale = 2.5f;
    moe->router.top_k = 3;
    moe->shared_hidden = 48;
    moe->aux_loss_alpha = 1e-2;
    check_decode_matches_forward(args.decoder, 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_small),
        cmocka_unit_test(test_decode_tied_scaled_rope),
        cmocka_unit_test(test_decode_qwen3),
        cmocka_unit_test(test_decode_qwen3_moe),
        cmocka_unit_test(test_decode_moe_shared_sigmoid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
