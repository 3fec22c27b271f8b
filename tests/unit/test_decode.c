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

#include "models/llama3/llama3.h"
#include "models/qwen3/qwen3.h"

#define DECODE_TOL 1e-5  // max |decode - forward| / max |forward| at each position

static void check_decode_matches_forward(LlamaArgs args, int T) {
    const KernelOps *k = kernels_backend("cpu");
    args.max_seq_len = T;
    Model m;
    Arena params, grads, acts;
    decoder_build(&m, &args, false);
    model_allocate(&m, model_activation_bytes(&m, k, 1, T), &params, &grads, &acts, NULL);
    params_initialize(&m.params, 3);
    int *tokens = calloc(T, sizeof(int)), *pos = calloc(T, sizeof(int));
    for (int t = 0; t < T; t++) tokens[t] = (t * 7919 + 13) % args.vocab_size, pos[t] = t;
    StepCtx s = {.k = k, .act = &acts, .B = 1, .T = T, .tokens = tokens, .targets = tokens,
                 .pos = pos, .loss_scale = 1};
    model_forward(&m, &s);

    DecoderKVCache cache;
    decoder_kv_cache_init(&cache, &m, T);
    for (int t = 0; t < T; t++) {
        const float *got = decoder_decode_step(&m, &cache, k, tokens[t], t);
        const float *want = s.logits + (size_t)t * args.vocab_size;
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_small),
        cmocka_unit_test(test_decode_tied_scaled_rope),
        cmocka_unit_test(test_decode_qwen3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
