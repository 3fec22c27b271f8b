// Pipeline stage split (parallel/pp/stage.c) against torchtitan's generate_llm_fqn_per_model_part
// worked by hand: the embedding and head weigh first_less and last_less layers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "parallel/pp/stage.h"

static void expect_split(int layers, int stages, int first_less, int last_less,
                         const int *want) {
    int first[64];
    char err[256];
    assert_true(pp_split_blocks(layers, stages, first_less, last_less, first, err, sizeof err));
    for (int s = 0; s <= stages; s++) assert_int_equal(first[s], want[s]);
}

static void test_splits(void **state) {
    (void)state;
    // debugmodel, pp 2: embed + layers 0-2 | layers 3-5 + head (blocks 0..7).
    expect_split(6, 2, 1, 1, (int[]){0, 4, 8});
    // 8 virtual stages of 6 layers: the embedding alone, one layer each, the head alone.
    expect_split(6, 8, 1, 1, (int[]){0, 1, 2, 3, 4, 5, 6, 7, 8});
    // Llama 3 8B on 4 stages: 34 effective layers, the first two stages one more:
    // embed + 0-7 | 8-16 | 17-24 | 25-31 + head.
    expect_split(32, 4, 1, 1, (int[]){0, 9, 18, 26, 34});
    // Without the weights the layers spread evenly: embed + 0-1 | 2-3 + head.
    expect_split(4, 2, 0, 0, (int[]){0, 3, 6});
}

static void test_refusals(void **state) {
    (void)state;
    int first[16];
    char err[256];
    assert_false(pp_split_blocks(1, 4, 1, 1, first, err, sizeof err));
    assert_non_null(strstr(err, "4 pipeline stages for 1 layers"));
    assert_false(pp_split_blocks(2, 2, 5, 1, first, err, sizeof err));
    assert_non_null(strstr(err, "pipeline stage 0 of 2 would get -1 transformer layers"));
    // torchtitan: ceil((layers + first_less + last_less) / layers_per_stage) virtual stages.
    assert_int_equal(pp_stages_per_rank(6, 2, 2, 1, 1, err, sizeof err), 2);
    assert_int_equal(pp_stages_per_rank(6, 2, 1, 1, 1, err, sizeof err), 4);
    assert_int_equal(pp_stages_per_rank(32, 4, 3, 1, 1, err, sizeof err), 3);  // 12 stages
    assert_int_equal(pp_stages_per_rank(6, 2, 3, 1, 1, err, sizeof err), -1);
    assert_string_equal(err, "parallelism.pipeline_parallel_layers_per_stage 3 makes 3 stages "
                             "of 8 effective layers, which pipeline_parallel_degree 2 does not "
                             "divide");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
