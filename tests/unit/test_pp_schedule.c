// Pipeline schedules and their checker: every generated schedule for pp in {2, 4, 8} and
// microbatches in {pp, 2pp, 4pp} passes; GPipe and 1F1B idle exactly (pp-1)/(m+pp-1) of the
// time under F=1, B=2; the zero-bubble schedules idle less than 1F1B; 1F1B's stage 0 keeps pp
// activations live whatever m, GPipe's m; DualPipeV checks for every m from 2pp to 4pp, idles
// less than 1F1B, keeps 2pp+1 live and runs PyTorch's per-rank order (pp=2, m=4 written out);
// hand-broken CSVs are refused naming rank and action.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "parallel/pp/executor.h"
#include "parallel/pp/schedule.h"

static const char *const ALL[] = {"GPipe", "1F1B", "LoopedBFS", "Interleaved1F1B",
                                  "InterleavedZeroBubble", "ZBVZeroBubble"};
#define N_ALL (sizeof ALL / sizeof *ALL)

// Every generator, DualPipeV included (it needs m >= 2pp, so ALL leaves it out).
static const char *const EVERY[] = {"GPipe", "1F1B", "LoopedBFS", "Interleaved1F1B",
                                    "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};
#define N_EVERY (sizeof EVERY / sizeof *EVERY)

// s = the named schedule for pp ranks, m microbatches, v stages per rank (0: its own), which
// must pass the checker (r its report).
static void generate_checked(PpSchedule *s, PpReport *r, const char *name, int pp, int m,
                             int v) {
    char err[512] = "";
    assert_true(pp_schedule_generate(s, name, pp, m, v, err, sizeof err));
    if (!pp_schedule_check(s, r, err, sizeof err))
        fail_msg("%s pp=%d m=%d v=%d: %s", name, pp, m, v, err);
}

static void check_ok(const char *name, int pp, int m, PpReport *r) {
    PpSchedule s;
    generate_checked(&s, r, name, pp, m, 0);
    pp_schedule_free(&s);
}

static void test_every_schedule_checks(void **state) {
    (void)state;
    for (size_t k = 0; k < N_ALL; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int f = 1; f <= 4; f *= 2) {
                PpReport r;
                check_ok(ALL[k], pp, f * pp, &r);
                // each rank computes F and B of every (stage, microbatch) it holds: busy time
                // is 3 units per (stage, microbatch) in total
                int stages = (!strcmp(ALL[k], "GPipe") || !strcmp(ALL[k], "1F1B") ? 1 : 2) * pp;
                assert_int_equal(r.busy, 3 * stages * f * pp);
                pp_report_free(&r);
            }
}

static void test_analytic_bubble(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int f = 1; f <= 4; f *= 2) {
                int m = f * pp;
                PpReport r;
                check_ok(k ? "1F1B" : "GPipe", pp, m, &r);
                // idle / (pp * makespan) == (pp-1) / (m+pp-1), compared exactly
                assert_int_equal(r.idle * (m + pp - 1), (int64_t)(pp - 1) * pp * r.makespan);
                assert_int_equal(r.makespan, 3 * (m + pp - 1));
                pp_report_free(&r);
            }
}

static void test_zero_bubble_beats_1f1b(void **state) {
    (void)state;
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int f = 1; f <= 4; f *= 2) {
            PpReport base, zb, zbv;
            check_ok("1F1B", pp, f * pp, &base);
            check_ok("InterleavedZeroBubble", pp, f * pp, &zb);
            check_ok("ZBVZeroBubble", pp, f * pp, &zbv);
            assert_true(zb.bubble < base.bubble);
            assert_true(zbv.bubble < base.bubble);
            pp_report_free(&base), pp_report_free(&zb), pp_report_free(&zbv);
        }
}

// Deferred Ws do not pile up: the zero-bubble schedules' live activations stop growing with m.
static void test_zero_bubble_memory_bounded(void **state) {
    (void)state;
    for (size_t k = 4; k < N_ALL; k++)
        for (int pp = 2; pp <= 8; pp *= 2) {
            PpReport two, four;
            check_ok(ALL[k], pp, 2 * pp, &two);
            check_ok(ALL[k], pp, 4 * pp, &four);
            for (int r = 0; r < pp; r++) {
                assert_int_equal(two.peak_live[r], four.peak_live[r]);
                assert_true(four.peak_live[r] <= 4 * pp);
            }
            pp_report_free(&two), pp_report_free(&four);
        }
}

static void test_peak_live(void **state) {
    (void)state;
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int f = 1; f <= 4; f *= 2) {
            PpReport one, gpipe;
            check_ok("1F1B", pp, f * pp, &one);
            check_ok("GPipe", pp, f * pp, &gpipe);
            assert_int_equal(one.peak_live[0], pp);
            assert_int_equal(one.peak_live[pp - 1], 1);
            assert_int_equal(gpipe.peak_live[0], f * pp);
            pp_report_free(&one), pp_report_free(&gpipe);
        }
}

// DualPipeV accepts any m >= 2pp. Every rank forwards 2pp microbatches to fill the V (rank r:
// 2(pp-1-r) down, then r+1 down-up pairs; an I, W, F round keeps the count) and the steady
// state's forward runs before its paired backward: 2pp+1 live on every rank, whatever m.
static void test_dualpipev(void **state) {
    (void)state;
    for (int pp = 2; pp <= 8; pp *= 2)
        for (int m = 2 * pp; m <= 4 * pp; m++) {
            PpReport dual, base;
            check_ok("DualPipeV", pp, m, &dual);
            check_ok("1F1B", pp, m, &base);
            assert_int_equal(dual.busy, 3 * 2 * pp * m);
            assert_true(dual.bubble < base.bubble);
            for (int r = 0; r < pp; r++) assert_int_equal(dual.peak_live[r], 2 * pp + 1);
            pp_report_free(&dual), pp_report_free(&base);
        }
}

// Rank r's compute actions, space-separated, sends and recvs left out.
static void compute_order(const PpSchedule *s, int r, char *out, size_t n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < s->count[r]; i++) {
        char name[48];
        if (s->actions[r][i].kind >= PP_SEND_ACT) continue;
        len += (size_t)snprintf(out + len, n - len, "%s%s", len ? " " : "",
                                pp_action_name(&s->actions[r][i], name, sizeof name));
    }
}

// pp=2, m=4 by hand from ScheduleDualPipeV's steps. Rank 0 holds stages 0 (down) and 3 (up):
// 2 forwards down; 1 down-up pair; 1 round I3 W3 F3; 1 steady round F0.3+B3.1, F3.2+B0.0 (an
// overlapped pair is its forward then its backward); 1 round B3.2, F3.3+B0.1; the cooldown's
// 2 backwards B3.3, then split I0.2; 1 round W0.2 I0.3; the last W. Rank 1 holds 1 and 2:
// 2 down-up pairs; 2 steady rounds; cooldown B2.2 B1.2, then split I2.3 I1.3; the Ws.
static void test_dualpipev_order(void **state) {
    (void)state;
    static const char *const want[2] = {
        "F0.0 F0.1 F0.2 F3.0 I3.0 W3.0 F3.1 F0.3 B3.1 F3.2 B0.0 B3.2 F3.3 B0.1 B3.3 I0.2 W0.2 "
        "I0.3 W0.3",
        "F1.0 F2.0 F1.1 F2.1 F1.2 B2.0 F2.2 B1.0 F1.3 B2.1 F2.3 B1.1 B2.2 B1.2 I2.3 I1.3 W2.3 "
        "W1.3",
    };
    PpSchedule s;
    char err[512] = "", got[1024];
    assert_true(pp_schedule_generate(&s, "DualPipeV", 2, 4, 0, err, sizeof err));
    int stage_rank[4] = {0, 1, 1, 0};
    assert_memory_equal(s.stage_rank, stage_rank, sizeof stage_rank);
    for (int r = 0; r < 2; r++) {
        compute_order(&s, r, got, sizeof got);
        assert_string_equal(got, want[r]);
    }
    pp_schedule_free(&s);
}

// The executor's regions (pp_region_counts): proven by the checker playing the executor's
// reuse rule, never fewer than the peak live count, at most one more; 1F1B needs exactly its
// peak. Interleaved1F1B at pp 2, m 4 runs out at its peak (5 and 3): its next microbatch's
// input arrives before the oldest region's gradient send is received.
static void test_regions(void **state) {
    (void)state;
    for (size_t k = 0; k < N_ALL; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int f = 1; f <= 4; f *= 2) {
                PpSchedule s;
                PpReport r;
                char err[512];
                generate_checked(&s, &r, ALL[k], pp, f * pp, 0);
                int regions[8];
                pp_region_counts(&s, &r, regions);
                if (!pp_schedule_check_regions(&s, regions, err, sizeof err))
                    fail_msg("%s pp=%d m=%d: %s", ALL[k], pp, f * pp, err);
                for (int q = 0; q < pp; q++) {
                    assert_true(regions[q] >= r.peak_live[q] && regions[q] <= r.peak_live[q] + 1);
                    if (!strcmp(ALL[k], "1F1B")) assert_int_equal(regions[q], r.peak_live[q]);
                }
                pp_report_free(&r);
                pp_schedule_free(&s);
            }
    PpSchedule s;
    char err[512];
    assert_true(pp_schedule_generate(&s, "Interleaved1F1B", 2, 4, 0, err, sizeof err));
    assert_false(pp_schedule_check_regions(&s, (int[]){5, 3}, err, sizeof err));
    assert_non_null(strstr(err, "rank 0 is stuck at action 15 (F0.3), waiting for its oldest "
                                "free activation region of 5"));
    assert_true(pp_schedule_check_regions(&s, (int[]){6, 4}, err, sizeof err));
    pp_schedule_free(&s);
}

// More stages per rank (pipeline_parallel_layers_per_stage): the looped schedules run any v
// >= 2, and the bubble of Interleaved1F1B shrinks as v grows (Narayanan et al. 2021: by v).
static void test_stages_per_rank(void **state) {
    (void)state;
    const char *looped[] = {"LoopedBFS", "Interleaved1F1B", "InterleavedZeroBubble"};
    for (size_t k = 0; k < 3; k++)
        for (int pp = 2; pp <= 4; pp *= 2) {
            double last = 1;
            for (int v = 2; v <= 4; v++) {
                PpSchedule s;
                PpReport r;
                generate_checked(&s, &r, looped[k], pp, 2 * pp, v);
                assert_int_equal(s.stages, v * pp);
                if (!strcmp(looped[k], "Interleaved1F1B")) {
                    assert_true(r.bubble < last);
                    last = r.bubble;
                }
                pp_report_free(&r);
                pp_schedule_free(&s);
            }
        }
    PpSchedule s;
    char err[512];
    assert_false(pp_schedule_generate(&s, "1F1B", 2, 4, 2, err, sizeof err));
    assert_string_equal(err, "pipeline schedule 1F1B runs 1 stages per rank, not 2");
    assert_false(pp_schedule_generate(&s, "ZBVZeroBubble", 2, 4, 3, err, sizeof err));
    assert_string_equal(err, "pipeline schedule ZBVZeroBubble runs 2 stages per rank, not 3");
    assert_false(pp_schedule_generate(&s, "Interleaved1F1B", 2, 4, 1, err, sizeof err));
    assert_string_equal(err, "pipeline schedule Interleaved1F1B runs at least 2 stages per rank, "
                             "not 1");
}

// Every generated schedule receives from each peer in the order the peer sends (NCCL matches
// a pair's messages in issue order): the zero-bubble ones only because their receives are
// posted early. A CSV taken as written that receives out of order is named.
static void test_channels_in_order(void **state) {
    (void)state;
    for (size_t k = 0; k < N_EVERY; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int f = 2; f <= 4; f *= 2) {
                PpSchedule s;
                PpReport r;
                char err[512];
                generate_checked(&s, &r, EVERY[k], pp, f * pp, 0);
                if (!pp_schedule_channels_in_order(&s, err, sizeof err))
                    fail_msg("%s pp=%d m=%d: %s", EVERY[k], pp, f * pp, err);
                pp_report_free(&r);
                pp_schedule_free(&s);
            }
    const char *text = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                       "1RECV_F1,1F1,1RECV_F0,1F0,1B0,1SEND_B0,1B1,1SEND_B1\n";
    PpSchedule s;
    PpReport r;
    char err[512];
    assert_true(pp_schedule_load_csv(&s, text, "t.csv", err, sizeof err));
    assert_true(pp_schedule_check(&s, &r, err, sizeof err));  // sound with tags (MPI)
    assert_false(pp_schedule_channels_in_order(&s, err, sizeof err));
    assert_string_equal(err, "rank 1, action 0 (RECV_F1.1): rank 0 sends SEND_F0.0 first, and "
                             "NCCL matches a pair's messages in order");
    pp_report_free(&r);
    pp_schedule_free(&s);
}

// Validation's forward-only schedule on each training placement: it checks, keeps at most one
// microbatch per local stage in flight (plus one crossing the V's turn), its regions are
// proven, and on one stage per rank it idles exactly GPipe's forward half: (pp-1)/(m+pp-1).
static void test_forward_only(void **state) {
    (void)state;
    for (size_t k = 0; k < N_EVERY; k++)
        for (int pp = 2; pp <= 8; pp *= 2) {
            PpSchedule train, eval;
            PpReport tr, r;
            char err[512];
            int m = 4 * pp, regions[8];
            generate_checked(&train, &tr, EVERY[k], pp, 2 * pp, 0);
            pp_report_free(&tr);
            pp_schedule_forward_only(&eval, &train, m);
            if (!pp_schedule_check(&eval, &r, err, sizeof err))
                fail_msg("%s pp=%d: %s", EVERY[k], pp, err);
            assert_true(pp_schedule_channels_in_order(&eval, err, sizeof err));
            pp_region_counts(&eval, &r, regions);
            assert_true(pp_schedule_check_regions(&eval, regions, err, sizeof err));
            for (int q = 0; q < pp; q++) assert_true(r.peak_live[q] <= train.stages / pp + 1);
            if (train.stages == pp)
                assert_true(fabs(r.bubble - (double)(pp - 1) / (m + pp - 1)) < 1e-12);
            pp_report_free(&r);
            pp_schedule_free(&eval);
            pp_schedule_free(&train);
        }
}

// NCCL (parallel/p2p_check.h): the executor's posting order, with the regions pp_region_counts
// gives it, runs without deadlock under NCCL's semantics with a stream per peer and direction
// for every schedule at pp 2/4/8 and m in {pp, 2pp, 4pp} (DualPipeV at 2pp and 4pp), training
// and evaluation; with one stream per rank (the cuda backend before its channels) most orders
// deadlock.
static bool nccl_order_runs(PpSchedule *s, PpReport *r, P2pStreams streams, char *err,
                            size_t n) {
    int regions[8];
    pp_region_counts(s, r, regions);
    return pp_schedule_check_nccl(s, regions, streams, err, n);
}

static void test_nccl_order(void **state) {
    (void)state;
    int proven = 0, one_stream_deadlocks = 0;
    for (size_t k = 0; k < N_EVERY; k++)
        for (int pp = 2; pp <= 8; pp *= 2)
            for (int f = 1; f <= 4; f *= 2) {
                if (!strcmp(EVERY[k], "DualPipeV") && f == 1) continue;  // needs m >= 2pp
                PpSchedule s, eval;
                PpReport r, er;
                char err[512];
                generate_checked(&s, &r, EVERY[k], pp, f * pp, 0);
                pp_schedule_forward_only(&eval, &s, f * pp);
                assert_true(pp_schedule_check(&eval, &er, err, sizeof err));
                PpSchedule *both[] = {&s, &eval};
                PpReport *reports[] = {&r, &er};
                for (int e = 0; e < 2; e++) {
                    if (!nccl_order_runs(both[e], reports[e], P2P_CHANNELS, err, sizeof err))
                        fail_msg("%s pp=%d m=%d%s: %s", EVERY[k], pp, f * pp,
                                 e ? " (evaluation)" : "", err);
                    proven++;
                    one_stream_deadlocks +=
                        !nccl_order_runs(both[e], reports[e], P2P_ONE_STREAM, err, sizeof err);
                }
                pp_report_free(&er);
                pp_schedule_free(&eval);
                pp_report_free(&r);
                pp_schedule_free(&s);
            }
    assert_int_equal(proven, 2 * (7 * 9 - 3));
    print_message("one stream per rank: %d of %d orders deadlock\n", one_stream_deadlocks, proven);
    assert_true(one_stream_deadlocks > 0);
    PpSchedule s;
    PpReport r;
    char err[512];
    generate_checked(&s, &r, "LoopedBFS", 2, 4, 0);
    assert_false(nccl_order_runs(&s, &r, P2P_ONE_STREAM, err, sizeof err));
    print_message("LoopedBFS pp=2 m=4 on one stream: %s\n", err);
    assert_non_null(strstr(err, "deadlock on NCCL: rank"));
    pp_report_free(&r);
    pp_schedule_free(&s);
}

static void test_refusals(void **state) {
    (void)state;
    PpSchedule s;
    char err[512];
    assert_false(pp_schedule_generate(&s, "Interleaved1F1B", 4, 6, 0, err, sizeof err));
    assert_non_null(strstr(err, "multiple of pipeline_parallel_degree (4)"));
    assert_false(pp_schedule_generate(&s, "DualPipeV", 4, 7, 0, err, sizeof err));
    assert_non_null(strstr(err, "DualPipeV needs at least as many microbatches (7) as stages "
                                "(2 x pipeline_parallel_degree = 8)"));
    assert_false(pp_schedule_generate(&s, "Nope", 2, 4, 0, err, sizeof err));
    // fewer microbatches than ranks still runs (torchtitan#775 hangs there)
    PpReport r;
    check_ok("1F1B", 4, 2, &r);
    pp_report_free(&r);
}

// The checker's verdict on a CSV: NULL when it passes, else its message must contain want.
static void csv_expect(const char *text, const char *want) {
    PpSchedule s;
    PpReport r;
    char err[512] = "";
    bool ok = pp_schedule_load_csv(&s, text, "t.csv", err, sizeof err);
    if (ok) {
        ok = pp_schedule_check(&s, &r, err, sizeof err);
        if (ok) pp_report_free(&r);
        pp_schedule_free(&s);
    }
    if (!want) {
        if (!ok) fail_msg("CSV refused: %s", err);
        return;
    }
    assert_false(ok);
    if (!strstr(err, want)) fail_msg("message '%s' lacks '%s'", err, want);
}

static void test_csv(void **state) {
    (void)state;
    // compute only: sends and recvs are added, as torchtitan's loader does
    csv_expect("0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n", NULL);
    // with comms, taken as written; I and W split; UNSHARD hints skipped
    csv_expect("0UNSHARD,0F0,0SEND_F0,0RECV_B0,0I0,0W0\n1RECV_F0,1F0,1B0,1SEND_B0\n", NULL);
    // missing recv: rank 1 forwards stage 1 with no input
    csv_expect("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n",
               "rank 1, action 0 (F1.0): runs before its input activation arrives");
    // swapped order: each rank waits for the other's send first
    csv_expect("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
               "deadlock: rank 0 is stuck at action 0 (RECV_B0.0)");
    // duplicated forward
    csv_expect("0F0,0F0,0B0\n", "rank 0, action 1 (F0.0): runs a second time");
    // an I without its W
    csv_expect("0F0,0SEND_F0,0RECV_B0,0I0\n1RECV_F0,1F0,1B0,1SEND_B0\n", "rank 0 never runs W0.0");
    // a W before its I, and a B or an I before its F
    csv_expect("0F0,0SEND_F0,0RECV_B0,0W0,0I0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
               "rank 0, action 3 (W0.0): runs before its backward-input (I)");
    csv_expect("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1B0,1F0,1SEND_B0\n",
               "rank 1, action 1 (B1.0): runs before its forward");
    csv_expect("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1I0,1F0,1W0,1SEND_B0\n",
               "rank 1, action 1 (I1.0): runs before its forward");
    // a send nobody receives
    csv_expect("0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n",
               "rank 0's SEND_F0.1 is never received by rank 1");
    csv_expect("0F0,0X0\n", "t.csv:1:5: '0X0' is not an action");
    // a prefix of UNSHARD or RESHARD is no hint; a long cell is refused whole, not cut
    csv_expect("0F0,0U7,0B0\n", "t.csv:1:5: '0U7' is not an action");
    csv_expect("0F0,0R9,0B0\n", "t.csv:1:5: '0R9' is not an action");
    csv_expect("0F0,0RESHARD1,0B0\n", NULL);
    csv_expect("0F0,0B000000000000000000000000000000000000000000000000000000000003GARBAGE!!\n",
               "t.csv:1:5: a cell of 71 characters ('0B0000");
    csv_expect("0F0,0B0\n0F1\n", "t.csv:2:1: stage 0 is on rank 0 and rank 1");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_schedule_checks), cmocka_unit_test(test_analytic_bubble),
        cmocka_unit_test(test_zero_bubble_beats_1f1b),
        cmocka_unit_test(test_zero_bubble_memory_bounded), cmocka_unit_test(test_peak_live),
        cmocka_unit_test(test_dualpipev),             cmocka_unit_test(test_dualpipev_order),
        cmocka_unit_test(test_regions),               cmocka_unit_test(test_stages_per_rank),
        cmocka_unit_test(test_channels_in_order),     cmocka_unit_test(test_forward_only),
        cmocka_unit_test(test_refusals),              cmocka_unit_test(test_csv),
        cmocka_unit_test(test_nccl_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
