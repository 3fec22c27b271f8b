// The pipeline executor (parallel/pp/executor.c; MPI, also a plain unit test on 1 rank) running
// a chain of stages with one weight each: stage s maps its input x (WIDTH floats) to
// a_s x + s, and the last stage's output y gives microbatch mb the loss sum(r * y). Each stage
// checks what the executor hands it against the chain computed directly: in forward its input
// (the stage before's output), in backward its output's gradient (the stage after's input
// gradient, dx there, which must become dy here); after the step, the weights' gradients summed
// over the ranks equal the closed form. On 1 rank the looped and V-shaped schedules put every
// stage on the one rank, and the executor copies outputs and input gradients between them; on
// more (tests/integration/test_pp.sh runs it on 2 and 4) every generated schedule sends them,
// ZBVZeroBubble and DualPipeV also copying between the two stages they keep on one rank.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "parallel/comm.h"
#include "parallel/pp/executor.h"
#include "parallel/pp/schedule.h"

enum { WIDTH = 4, MICROBATCHES = 8, MAX_STAGES = 16 };

static CommGroup *world;

static double weight(int st) { return 1.5 + 0.25 * st; }
static double input(int mb, int i) { return 0.5 + mb + 0.1 * i; }
static double loss_weight(int i) { return 1 + 0.5 * i; }  // r

// The chain computed directly: stage st's input, and its output's gradient (the same for every
// microbatch: the chain is linear in x).
static double want_x(int st, int mb, int i) {
    double x = input(mb, i);
    for (int s = 0; s < st; s++) x = weight(s) * x + s;
    return x;
}

static double want_dy(int st, int stages, int i) {
    double g = loss_weight(i);
    for (int s = stages - 1; s > st; s--) g *= weight(s);
    return g;
}

typedef struct {
    PpStageFns fns;  // first: the callbacks find the chain from it
    int stages;
    float *x[MAX_STAGES][MICROBATCHES];         // each stage's input as forward got it, kept
                                                // in its region (WIDTH) as a block keeps its own
    float dy[MAX_STAGES][MICROBATCHES][WIDTH];  // its output's gradient, as backward got it
    double grad[MAX_STAGES];                    // d loss / d a_s over this rank's microbatches
    int wrong;                                  // values unlike the direct chain's
    char first_wrong[256];
} Chain;

// Records a value unlike the direct chain's (failing here would leave the other ranks waiting).
static void check_value(Chain *c, const char *what, int st, int mb, int i, double got,
                        double want) {
    if (fabs(got - want) <= 1e-5 * fabs(want)) return;
    if (c->wrong++ == 0)
        snprintf(c->first_wrong, sizeof c->first_wrong,
                 "rank %d: stage %d microbatch %d: %s[%d] %g, the chain's %g", comm_rank(world),
                 st, mb, what, i, got, want);
}

static float *chain_forward(const PpStageFns *f, int st, int mb, int region, Arena *act,
                            const float *x) {
    (void)region;
    Chain *c = (Chain *)f;
    float *kept = arena_floats(act, WIDTH);
    float *y = st + 1 < c->stages ? arena_floats(act, WIDTH) : NULL;
    if (!act->base) return y;  // the sizing pass
    c->x[st][mb] = kept;
    for (int i = 0; i < WIDTH; i++) {
        float xi = st == 0 ? (float)input(mb, i) : x[i];
        check_value(c, "input", st, mb, i, xi, want_x(st, mb, i));
        kept[i] = xi;
        if (y) y[i] = (float)weight(st) * xi + (float)st;
    }
    return y;
}

// dx = a_s dy (B, I); the weight's gradient += sum(x * dy) (B, W).
static float *chain_backward(const PpStageFns *f, int st, int mb, int region, Arena *act,
                             BlockPhase phase, const float *dy) {
    (void)region;
    Chain *c = (Chain *)f;
    bool input_part = phase != BLOCK_BACKWARD_WEIGHT;
    float *dx = input_part && st > 0 ? arena_floats(act, WIDTH) : NULL;
    if (!act->base) return dx;
    for (int i = 0; input_part && i < WIDTH; i++) {
        float g = st + 1 == c->stages ? (float)loss_weight(i) : dy[i];
        check_value(c, "output gradient", st, mb, i, g, want_dy(st, c->stages, i));
        c->dy[st][mb][i] = g;
        if (dx) dx[i] = (float)weight(st) * g;
    }
    for (int i = 0; phase != BLOCK_BACKWARD_INPUT && i < WIDTH; i++)
        c->grad[st] += (double)c->x[st][mb][i] * c->dy[st][mb][i];
    return dx;
}

// Two steps of the named schedule over the world (pp = its size, v stages per rank, 0: the
// schedule's own), each checked.
static void run_schedule(const char *name, int v) {
    int rank = comm_rank(world), n = comm_size(world);
    PpSchedule s;
    PpReport report;
    char err[512];
    if (!pp_schedule_generate(&s, name, n, MICROBATCHES, v, err, sizeof err) ||
        !pp_schedule_check(&s, &report, err, sizeof err))
        fail_msg("%s on %d ranks: %s", name, n, err);
    assert_true(s.stages <= MAX_STAGES);
    Chain *c = calloc(1, sizeof *c);
    *c = (Chain){.fns = {chain_forward, chain_backward}, .stages = s.stages};
    const KernelOps *k = kernels_backend("cpu");
    PpExecutor *e = pp_executor_create(&s, &report, rank, (rank + n - 1) % n, (rank + 1) % n,
                                       world, WIDTH, k, &c->fns);
    int *regions = calloc((size_t)n, sizeof(int));
    pp_region_counts(&s, &report, regions);
    ArenaBytes one = pp_region_bytes(&s, rank, WIDTH, &c->fns), all = {0};
    all.total = one.total * (size_t)regions[rank];
    for (int d = 0; d < DTYPE_COUNT; d++) all.by[d] = one.by[d] * (size_t)regions[rank];
    Arena acts;
    arena_init_sizing(&acts, "activations");
    arena_reserve(&acts, all);
    arena_commit(&acts, NULL);
    for (int step = 0; step < 2; step++) {  // the second reuses the regions
        for (int st = 0; st < MAX_STAGES; st++) c->grad[st] = 0;
        pp_executor_step(e, &acts);
        int wrong = (int)comm_all_reduce_double(world, c->wrong, COMM_SUM);
        if (c->wrong) print_error("%s step %d: %s\n", name, step, c->first_wrong);
        if (wrong) fail_msg("%s: %d values unlike the chain's", name, wrong);
        for (int st = 0; st < s.stages; st++) {
            double got = comm_all_reduce_double(world, c->grad[st], COMM_SUM), want = 0;
            for (int mb = 0; mb < MICROBATCHES; mb++)
                for (int i = 0; i < WIDTH; i++)
                    want += want_x(st, mb, i) * want_dy(st, s.stages, i);
            if (fabs(got - want) > 1e-5 * fabs(want))
                fail_msg("%s step %d: stage %d's weight gradient %.9g, the chain's %.9g", name,
                         step, st, got, want);
        }
    }
    arena_free(&acts);
    free(regions);
    pp_executor_free(e);
    free(c);
    pp_report_free(&report);
    pp_schedule_free(&s);
}

// 1F1B and GPipe with one stage per rank (on 1 rank: one stage, nothing between stages).
static void test_single_stage_schedules(void **state) {
    (void)state;
    run_schedule("GPipe", 0);
    run_schedule("1F1B", 0);
}

// Stages 0 and 1 on rank 0 (1 rank) or loop placement (several): B, and I then W.
static void test_looped_schedules(void **state) {
    (void)state;
    run_schedule("LoopedBFS", 2);
    run_schedule("Interleaved1F1B", 3);
    run_schedule("InterleavedZeroBubble", 2);
}

// V placement: rank 0 holds stages 0 and 2 pp - 1, the last rank pp - 1 and pp, one after the
// other (a copy on that rank, sends between the others).
static void test_v_schedules(void **state) {
    (void)state;
    run_schedule("ZBVZeroBubble", 0);
    if (MICROBATCHES >= 2 * comm_size(world)) run_schedule("DualPipeV", 0);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    world = comm_world();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_stage_schedules),
        cmocka_unit_test(test_looped_schedules),
        cmocka_unit_test(test_v_schedules),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    comm_finalize();
    return failed;
}
