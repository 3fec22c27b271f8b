// The layout-aware Param (core/param.h): placements compose into this rank's box of the global
// tensor for every rank of a 2D (tp x fsdp) layout and a 3-dim tensor; the boxes of all ranks
// tile the global tensor exactly once per replica; FSDP's padding is stored, never boxed; a
// group of one rank is no placement; and params_initialize fills any box with the values the
// whole tensor has there.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "core/param.h"

enum { TP_GROUP = 4, FSDP_GROUP = 5, REPLICATE_GROUP = 1 };  // opaque group ids

// A table of one (E, R, C) parameter, placed Shard(tp_dim) over tp ranks, then FSDP's padded
// Shard(0) over fsdp ranks, then Replicate over replicas: rank coordinates (t, f, r).
static void place(ParamTable *table, const int64_t shape[3], int tp_dim, int tp, int t, int fsdp,
                  int f, int replicas, int r) {
    params_init(table, 1);
    params_add(table, INIT_NORMAL, 0.02, 3, shape, "experts.w1");
    Param *p = &table->items[0];
    params_place(table, p, (Placement){.kind = PLACE_SHARD, .dim = tp_dim, .group = TP_GROUP,
                                       .size = tp, .rank = t});
    params_place(table, p, (Placement){.kind = PLACE_SHARD_PADDED, .group = FSDP_GROUP,
                                       .size = fsdp, .rank = f});
    params_place(table, p, (Placement){.kind = PLACE_REPLICATE, .group = REPLICATE_GROUP,
                                       .size = replicas, .rank = r});
}

static void test_boxes_tile_the_tensor(void **state) {
    (void)state;
    const int64_t shape[3] = {3, 8, 6};  // 3 rows over 2 fsdp ranks: padded
    enum { TP = 2, FSDP = 2, REPLICAS = 2 };
    for (int tp_dim = 1; tp_dim <= 2; tp_dim++) {
        int *seen = calloc(3 * 8 * 6, sizeof(int));
        for (int t = 0; t < TP; t++)
            for (int f = 0; f < FSDP; f++)
                for (int r = 0; r < REPLICAS; r++) {
                    ParamTable table;
                    place(&table, shape, tp_dim, TP, t, FSDP, f, REPLICAS, r);
                    const Param *p = &table.items[0];
                    ParamBox compute = param_box(p, false), shard = param_box(p, true);
                    assert_int_equal(compute.count[tp_dim], shape[tp_dim] / TP);
                    assert_int_equal(box_start(&compute, tp_dim), t * shape[tp_dim] / TP);
                    assert_int_equal(p->numel, box_numel(&compute));
                    // Rows 0-1 on fsdp rank 0, row 2 and a padding row on rank 1.
                    assert_int_equal(box_start(&shard, 0), f * 2);
                    assert_int_equal(shard.count[0], f == 0 ? 2 : 1);
                    assert_int_equal(p->shard_numel, 2 * p->numel / 3);
                    assert_int_equal(table.shard_numel, p->shard_numel);
                    assert_true(param_is_primary_replica(p) == (r == 0));
                    for (size_t i = 0; i < box_numel(&shard) && r == 0; i++) {
                        int64_t at[3], rest = (int64_t)i;
                        for (int d = 2; d >= 0; d--) {
                            at[d] = box_start(&shard, d) + rest % shard.count[d];
                            rest /= shard.count[d];
                        }
                        seen[(at[0] * 8 + at[1]) * 6 + at[2]]++;
                    }
                    params_free(&table);
                }
        for (int i = 0; i < 3 * 8 * 6; i++) assert_int_equal(seen[i], 1);
        free(seen);
    }
}

static void test_group_of_one_is_no_placement(void **state) {
    (void)state;
    ParamTable table;
    place(&table, (const int64_t[]){3, 8, 6}, 1, 1, 0, 1, 0, 1, 0);
    const Param *p = &table.items[0];
    assert_int_equal(p->n_placements, 0);
    assert_int_equal(p->numel, 3 * 8 * 6);
    assert_int_equal(p->shard_numel, p->numel);
    params_free(&table);
}

typedef struct {
    const float *whole;
    const float *box;
    size_t compared;
} Compare;

static void compare_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    Compare *c = arg;
    assert_memory_equal(c->box + local_first, c->whole + global_first, count * sizeof(float));
    c->compared += count;
}

// Each rank's shard, filled alone, holds the whole tensor's values at its box; the padding
// after it is zero.
static void test_initialize_fills_boxes(void **state) {
    (void)state;
    const int64_t shape[3] = {3, 8, 6};
    ParamTable whole;
    place(&whole, shape, 1, 1, 0, 1, 0, 1, 0);
    whole.shard_data = calloc(whole.shard_numel, sizeof(float));
    params_initialize(&whole, 11);
    for (int f = 0; f < 2; f++) {
        ParamTable table;
        place(&table, shape, 2, 2, 1, 2, f, 1, 0);
        table.shard_data = malloc(table.shard_numel * sizeof(float));
        memset(table.shard_data, 0xff, table.shard_numel * sizeof(float));
        params_initialize(&table, 11);
        const Param *p = &table.items[0];
        ParamBox b = param_box(p, true);
        Compare c = {whole.shard_data, table.shard_data, 0};
        param_box_runs(p, &b, compare_run, &c);
        assert_int_equal(c.compared, box_numel(&b));
        for (size_t i = box_numel(&b); i < p->shard_numel; i++)
            assert_true(table.shard_data[i] == 0.0f);
        ParamBox compute = param_box(p, false);
        for (size_t i = 0; i < p->numel && f == 0; i++)  // tp rank 1: columns 3-5
            assert_int_equal(param_global_index(p, &compute, i) % 6 >= 3, 1);
        free(table.shard_data);
        params_free(&table);
    }
    free(whole.shard_data);
    params_free(&whole);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boxes_tile_the_tensor),
        cmocka_unit_test(test_group_of_one_is_no_placement),
        cmocka_unit_test(test_initialize_fills_boxes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
