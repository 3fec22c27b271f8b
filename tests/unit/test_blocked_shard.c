// The blocked Shard (core/param.h; MPI, also a plain unit test on 1 rank): a fused weight of
// parts {6, 6, 6, 8} (FLUX's [q; k; v; mlp_in] in small) cut by rank part by part over a tp
// group of 2, then FSDP's padded Shard over an fsdp group of 2, along dim 0 (linear1's
// column-parallel cut) and along dim 1 (a row-parallel linear2 over the concatenated parts).
// Every rank's box is checked against indices computed here from the parts; param_box_runs
// covers each global element once per layout; initialisation on any layout equals the 1-rank
// tensor there and FSDP's shards concatenate to the tp-only compute tensor; and a checkpoint
// saved by the world's ranks under the blocked layout loads on 1 rank, and back.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/train_state.h"
#include "parallel/comm.h"

enum { TP_GROUP = 4, FSDP_GROUP = 5 };  // opaque group ids
enum { TP = 2, FSDP = 2, PARTS = 4, FUSED = 3 * 6 + 8, OTHER = 4 };
static const int64_t PART[PARTS] = {6, 6, 6, 8};
static const uint64_t SEED = 5;

static CommGroup *world;

// A table of the fused (FUSED, OTHER) weight, blocked along dim 0, and its (OTHER, FUSED)
// transpose, blocked along dim 1: tp rank t of tp (1: no placement), then fsdp rank f of fsdp.
// shard_data allocated (zero); filled from SEED when fill.
static void place(ParamTable *t, int tp, int tr, int fsdp, int fr, bool fill) {
    params_init(t, 2);
    params_add(t, INIT_NORMAL, 1.0, 2, (const int64_t[]){FUSED, OTHER}, "single.linear1.weight");
    params_add(t, INIT_NORMAL, 1.0, 2, (const int64_t[]){OTHER, FUSED}, "single.linear2.weight");
    for (int i = 0; i < 2; i++) {
        Placement tp_shard = {.kind = PLACE_SHARD, .dim = i, .group = TP_GROUP, .size = tp,
                              .rank = tr, .n_blocks = PARTS};
        memcpy(tp_shard.blocks, PART, sizeof PART);
        params_place(t, &t->items[i], tp_shard);
        params_place(t, &t->items[i], (Placement){.kind = PLACE_SHARD_PADDED,
                                                  .group = FSDP_GROUP, .size = fsdp, .rank = fr});
    }
    t->shard_data = calloc(t->shard_numel + 1, sizeof(float));
    if (fill) params_initialize(t, SEED);
}

static void table_free(ParamTable *t) {
    free(t->shard_data);
    params_free(t);
}

// The global indices along the fused dim that tp rank t holds, in local order (n of them):
// rank t's slice of each part, part after part (the layout's definition, independently).
static int fused_indices(int t, int64_t *at) {
    int n = 0;
    for (int k = 0, first = 0; k < PARTS; first += (int)PART[k++])
        for (int64_t j = 0; j < PART[k] / TP; j++) at[n++] = first + t * PART[k] / TP + j;
    return n;
}

// The global flat index of element i of param `which`'s shard on rank (t, f), from
// fused_indices and FSDP's ceil(rows / FSDP) rows per rank of the compute tensor.
static size_t expected_global(int which, int t, int f, size_t i) {
    int64_t fused[FUSED];
    int n = fused_indices(t, fused);
    if (which == 0) {  // rows: FSDP cuts the fused rows tp left
        int64_t per = (n + FSDP - 1) / FSDP, row = f * per + (int64_t)i / OTHER;
        return (size_t)(fused[row] * OTHER + (int64_t)i % OTHER);
    }
    int64_t per = (OTHER + FSDP - 1) / FSDP, row = f * per + (int64_t)i / n;
    return (size_t)(row * FUSED + fused[(int64_t)i % n]);
}

static void test_boxes(void **state) {
    (void)state;
    for (int t = 0; t < TP; t++)
        for (int f = 0; f < FSDP; f++) {
            ParamTable table;
            place(&table, TP, t, FSDP, f, false);
            const Param *rows = &table.items[0], *cols = &table.items[1];
            assert_int_equal(rows->shape[0], FUSED / TP);  // 3 + 3 + 3 + 4
            assert_int_equal(rows->shape[1], OTHER);
            assert_int_equal(cols->shape[0], OTHER);
            assert_int_equal(cols->shape[1], FUSED / TP);
            assert_int_equal(rows->shard_numel, 7 * OTHER);  // 13 rows: 7 per fsdp rank
            ParamBox compute = param_box(rows, false), shard = param_box(rows, true);
            assert_int_equal(compute.ranges[0].n, PARTS);
            for (int k = 0; k < PARTS; k++)  // rank t's piece of each part
                assert_int_equal(compute.ranges[0].start[k], 6 * k + t * (k < 3 ? 3 : 4));
            // fsdp rank 0: rows 0-6 (q, k and v's first row); 1: v's last two rows, the mlp's
            int64_t want_n = f == 0 ? 3 : 2, want_count[2][3] = {{3, 3, 1}, {2, 4}};
            assert_int_equal(shard.ranges[0].n, want_n);
            for (int k = 0; k < want_n; k++)
                assert_int_equal(shard.ranges[0].count[k], want_count[f][k]);
            assert_int_equal(box_numel(&shard), (f == 0 ? 7 : 6) * OTHER);
            for (int which = 0; which < 2; which++) {
                const Param *p = &table.items[which];
                ParamBox b = param_box(p, true);
                for (size_t i = 0; i < box_numel(&b); i++)
                    assert_int_equal(param_global_index(p, &b, i), expected_global(which, t, f, i));
            }
            table_free(&table);
        }
}

static void count_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    (void)global_first, (void)local_first;
    *(size_t *)arg += count;
}

// Pipeline parallel places a stage's parameters before tensor parallel does: on another
// stage's rank the blocked Shard cuts an empty box, which stays empty.
static void test_other_stage_is_empty(void **state) {
    (void)state;
    ParamTable table;
    params_init(&table, 1);
    params_add(&table, INIT_NORMAL, 1.0, 2, (const int64_t[]){FUSED, OTHER}, "linear1.weight");
    Param *p = &table.items[0];
    params_place(&table, p, (Placement){.kind = PLACE_OWNED, .group = 1, .size = 2, .rank = 0,
                                        .owner = 1});
    Placement tp_shard = {.kind = PLACE_SHARD, .group = TP_GROUP, .size = TP, .rank = 1,
                          .n_blocks = PARTS};
    memcpy(tp_shard.blocks, PART, sizeof PART);
    params_place(&table, p, tp_shard);
    assert_int_equal(p->numel, 0);
    assert_int_equal(p->shard_numel, 0);
    ParamBox b = param_box(p, true);
    assert_int_equal(b.ranges[0].n, 0);
    size_t covered = 0;
    param_box_runs(p, &b, count_run, &covered);
    assert_int_equal(covered, 0);
    params_free(&table);
}

typedef struct {
    int which, t, f;
    int *seen;      // (FUSED * OTHER) per global element
    size_t local;   // the next local index expected
} Cover;

static void cover_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    Cover *c = arg;
    assert_int_equal(local_first, c->local);  // runs come in local order, without gaps
    for (size_t j = 0; j < count; j++) {
        assert_int_equal(global_first + j, expected_global(c->which, c->t, c->f, local_first + j));
        c->seen[global_first + j]++;
    }
    c->local += count;
}

// The runs of every rank's shard box hit each global element exactly once.
static void test_runs_cover_once(void **state) {
    (void)state;
    for (int which = 0; which < 2; which++) {
        int *seen = calloc(FUSED * OTHER, sizeof(int));
        for (int t = 0; t < TP; t++)
            for (int f = 0; f < FSDP; f++) {
                ParamTable table;
                place(&table, TP, t, FSDP, f, false);
                const Param *p = &table.items[which];
                ParamBox b = param_box(p, true);
                Cover c = {which, t, f, seen, 0};
                param_box_runs(p, &b, cover_run, &c);
                assert_int_equal(c.local, box_numel(&b));
                table_free(&table);
            }
        for (int i = 0; i < FUSED * OTHER; i++) assert_int_equal(seen[i], 1);
        free(seen);
    }
}

// Each rank's shard, initialised alone, holds the 1-rank tensor's values at its box, and zero
// padding; the fsdp ranks' shards, concatenated, are the tp-only compute tensor.
static void test_initialize_is_layout_free(void **state) {
    (void)state;
    ParamTable whole;
    place(&whole, 1, 0, 1, 0, true);
    for (int t = 0; t < TP; t++) {
        ParamTable tp_only;
        place(&tp_only, TP, t, 1, 0, true);
        size_t gathered[2] = {0, 0};  // rows of each compute tensor seen so far, in floats
        for (int f = 0; f < FSDP; f++) {
            ParamTable table;
            place(&table, TP, t, FSDP, f, true);
            for (int which = 0; which < 2; which++) {
                const Param *p = &table.items[which];
                const float *shard = table.shard_data + p->shard_offset;
                ParamBox b = param_box(p, true);
                size_t n = box_numel(&b);
                const float *global = whole.shard_data + whole.items[which].shard_offset;
                for (size_t i = 0; i < n; i++)
                    assert_true(shard[i] == global[expected_global(which, t, f, i)]);
                for (size_t i = n; i < p->shard_numel; i++) assert_true(shard[i] == 0.0f);
                const float *compute = tp_only.shard_data + tp_only.items[which].shard_offset;
                assert_memory_equal(shard, compute + gathered[which], n * sizeof(float));
                gathered[which] += n;
            }
            table_free(&table);
        }
        for (int which = 0; which < 2; which++)
            assert_int_equal(gathered[which], tp_only.items[which].numel);
        table_free(&tp_only);
    }
    table_free(&whole);
}

// Saved by the world (tp 2 x fsdp 2 on 4 ranks, tp 2 on 2) and loaded by one rank as whole
// tensors; saved by one rank and loaded into every rank of tp 2 x fsdp 2 (each simulated here,
// so one rank alone checks the reads): the values are the initial ones.
static void test_checkpoint_reshard(void **state) {
    (void)state;
    int n = comm_size(world), rank = comm_rank(world);
    int tp = n % TP == 0 ? TP : 1, fsdp = n / tp;
    char dir[64] = "/tmp/titan-test-blocked.XXXXXX", blocked_path[96], whole_path[96];
    if (rank == 0) assert_non_null(mkdtemp(dir));
    comm_broadcast(world, dir, sizeof dir, 0);
    snprintf(blocked_path, sizeof blocked_path, "%s/blocked.h5", dir);
    snprintf(whole_path, sizeof whole_path, "%s/whole.h5", dir);
    ParamTable blocked, whole, want_whole;
    place(&blocked, tp, rank % tp, fsdp, rank / tp, true);
    train_state_save(blocked_path, &blocked, NULL, (TrainProgress){0}, SEED, "", NULL, 0,
                     MPI_COMM_WORLD);
    place(&whole, 1, 0, 1, 0, false);
    place(&want_whole, 1, 0, 1, 0, true);
    train_state_load(blocked_path, &whole, NULL, NULL);
    assert_memory_equal(whole.shard_data, want_whole.shard_data,
                        whole.shard_numel * sizeof(float));
    if (rank == 0)
        train_state_save(whole_path, &want_whole, NULL, (TrainProgress){0}, SEED, "", NULL, 0,
                         MPI_COMM_SELF);
    comm_barrier(world);
    for (int r = 0; r < TP * FSDP; r++) {
        ParamTable loaded, want;
        place(&loaded, TP, r % TP, FSDP, r / TP, false);
        memset(loaded.shard_data, 0xff, loaded.shard_numel * sizeof(float));  // padding zeroed
        place(&want, TP, r % TP, FSDP, r / TP, true);
        train_state_load(whole_path, &loaded, NULL, NULL);
        assert_memory_equal(loaded.shard_data, want.shard_data, want.shard_numel * sizeof(float));
        table_free(&loaded), table_free(&want);
    }
    comm_barrier(world);
    if (rank == 0) {
        unlink(blocked_path), unlink(whole_path);
        rmdir(dir);
    }
    table_free(&blocked), table_free(&whole), table_free(&want_whole);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    world = comm_world();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_boxes),
        cmocka_unit_test(test_runs_cover_once),
        cmocka_unit_test(test_other_stage_is_empty),
        cmocka_unit_test(test_initialize_is_layout_free),
        cmocka_unit_test(test_checkpoint_reshard),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize();
    return failed;
}
