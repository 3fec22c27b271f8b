// Context parallel's head-tail layout (parallel/cp/layout.c): every position held by exactly
// one rank, each rank's causal work equal, and a batch's columns picked by position.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "parallel/cp/layout.h"

static void test_positions_tile_the_sequence(void **state) {
    (void)state;
    for (int cp = 1; cp <= 8; cp *= 2) {
        int T = 16 * cp, held[128] = {0}, pos[128];
        long work0 = -1;
        for (int r = 0; r < cp; r++) {
            cp_positions(T, cp, r, pos);
            long work = 0;  // keys a causal query at position p sees: p + 1
            for (int i = 0; i < T / cp; i++) {
                held[pos[i]]++;
                work += pos[i] + 1;
            }
            if (work0 < 0) work0 = work;
            assert_int_equal(work, work0);  // load balanced
        }
        for (int p = 0; p < T; p++) assert_int_equal(held[p], 1);
    }
    int pos[4];
    cp_positions(8, 2, 0, pos);  // chunks of 2: rank 0 holds chunk 0 and chunk 3
    assert_memory_equal(pos, ((int[]){0, 1, 6, 7}), sizeof pos);
    cp_positions(8, 2, 1, pos);
    assert_memory_equal(pos, ((int[]){2, 3, 4, 5}), sizeof pos);
}

static void test_select_and_check(void **state) {
    (void)state;
    int full[2 * 8], local[2 * 4], pos[4];
    for (int i = 0; i < 16; i++) full[i] = 100 + i;
    cp_positions(8, 2, 0, pos);
    cp_select(full, 2, 8, pos, 4, local);
    assert_memory_equal(local, ((int[]){100, 101, 106, 107, 108, 109, 114, 115}), sizeof local);
    char err[256];
    assert_null(cp_layout_check("training.seq_len", 8, 2, err, sizeof err));
    assert_non_null(cp_layout_check("validation.seq_len", 10, 2, err, sizeof err));
    assert_string_equal(err, "validation.seq_len 10 is not a multiple of 2 x "
                             "parallelism.context_parallel_degree 2 = 4: context parallel cuts "
                             "each sequence into 2 x cp chunks");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_positions_tile_the_sequence),
        cmocka_unit_test(test_select_and_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
