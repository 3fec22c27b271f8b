// Data loader tests: batches checked token by token against the stream's definition of a
// window, the same global batches for dp = 1, 2, 4, resume from a saved position, and rewind.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "data/loader.h"

#define N_TOKENS 1000
#define T 8
#define GLOBAL_ROWS 4
#define STEPS 40  // 160 windows: past the stream's 124, so epochs wrap

// Token i of the stream; distinct values, so a misplaced token cannot pass for another.
static int32_t token_at(int64_t i) { return (int32_t)((i * 7919 + 13) % 50021); }

static void stream_make(TokenStream *s) {
    int32_t *tokens = malloc(N_TOKENS * sizeof(int32_t));
    for (int i = 0; i < N_TOKENS; i++) tokens[i] = token_at(i);
    token_stream_from_tokens(s, "memory", tokens, N_TOKENS);
}

// Window w's token k by the stream's definition: tokens from (w mod windows) * T.
static int32_t window_token(int64_t w, int k) {
    int64_t windows = (N_TOKENS - 1) / T;
    return token_at((w % windows) * T + k);
}

// With dp = 1, microbatch s reads windows s*B .. s*B + B-1, as train/data.c always has.
static void test_single_rank_windows(void **state) {
    (void)state;
    TokenStream s;
    stream_make(&s);
    DataLoader l;
    loader_open(&l, &s, T, 0, 1, GLOBAL_ROWS);
    int32_t in[GLOBAL_ROWS * T], tgt[GLOBAL_ROWS * T];
    for (int64_t step = 0; step < STEPS; step++) {
        loader_next(&l, in, tgt, NULL, NULL);
        for (int r = 0; r < GLOBAL_ROWS; r++)
            for (int k = 0; k < T; k++) {
                assert_int_equal(in[r * T + k], window_token(step * GLOBAL_ROWS + r, k));
                assert_int_equal(tgt[r * T + k], window_token(step * GLOBAL_ROWS + r, k + 1));
            }
        assert_int_equal(loader_position(&l), (step + 1) * GLOBAL_ROWS);
    }
    loader_close(&l);
    token_stream_close(&s);
}

// The ranks' batches, in rank order, are exactly the one-rank global batch, step by step.
static void dp_matches_single_rank(const TokenStream *s, int dp) {
    int rows = GLOBAL_ROWS / dp;
    DataLoader one, ranks[4];
    loader_open(&one, s, T, 0, 1, GLOBAL_ROWS);
    for (int r = 0; r < dp; r++) loader_open(&ranks[r], s, T, r, dp, rows);
    int32_t in[GLOBAL_ROWS * T], tgt[GLOBAL_ROWS * T], rin[GLOBAL_ROWS * T], rtgt[GLOBAL_ROWS * T];
    for (int step = 0; step < STEPS; step++) {
        loader_next(&one, in, tgt, NULL, NULL);
        for (int r = 0; r < dp; r++) {
            loader_next(&ranks[r], rin + r * rows * T, rtgt + r * rows * T, NULL, NULL);
            assert_int_equal(loader_position(&ranks[r]), loader_position(&one));
        }
        assert_memory_equal(rin, in, sizeof(in));
        assert_memory_equal(rtgt, tgt, sizeof(tgt));
    }
    loader_close(&one);
    for (int r = 0; r < dp; r++) loader_close(&ranks[r]);
}

static void test_data_parallel_layouts(void **state) {
    (void)state;
    TokenStream s;
    stream_make(&s);
    for (int dp = 1; dp <= 4; dp *= 2) dp_matches_single_rank(&s, dp);
    token_stream_close(&s);
}

// A loader restored to the position saved after step k continues exactly as the original;
// rewinding to 0 (validation) replays the first batch.
static void test_resume_and_rewind(void **state) {
    (void)state;
    TokenStream s;
    stream_make(&s);
    DataLoader a, b;
    loader_open(&a, &s, T, 1, 2, 3);
    int32_t first[3 * T], in[3 * T], tgt[3 * T], in_b[3 * T], tgt_b[3 * T];
    loader_next(&a, first, tgt, NULL, NULL);
    for (int r = 0; r < 3; r++)  // rank 1 of 2, 3 rows: windows 3, 4, 5
        for (int k = 0; k < T; k++) assert_int_equal(first[r * T + k], window_token(3 + r, k));
    for (int step = 1; step < 7; step++) loader_next(&a, in, tgt, NULL, NULL);
    int64_t saved = loader_position(&a);
    assert_int_equal(saved, 7 * 2 * 3);
    loader_open(&b, &s, T, 1, 2, 3);
    loader_set_position(&b, saved);
    for (int step = 0; step < 30; step++) {
        loader_next(&a, in, tgt, NULL, NULL);
        loader_next(&b, in_b, tgt_b, NULL, NULL);
        assert_memory_equal(in, in_b, sizeof(in));
        assert_memory_equal(tgt, tgt_b, sizeof(tgt));
    }
    loader_set_position(&b, 0);
    loader_next(&b, in_b, tgt_b, NULL, NULL);
    assert_memory_equal(in_b, first, sizeof(first));
    loader_close(&a);
    loader_close(&b);
    token_stream_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_rank_windows),
        cmocka_unit_test(test_data_parallel_layouts),
        cmocka_unit_test(test_resume_and_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
