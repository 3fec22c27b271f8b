// NCCL's point-to-point semantics played (parallel/p2p_check.h): a ring whose every rank sends
// to its next and then receives from its previous deadlocks on one stream per rank and runs
// with a stream per peer and direction; a wait for an operation whose match comes only after
// the peer's own wait deadlocks on any streams; unmatched and mismatched pairs are named. The
// CP alltoall ring's order (cp_ring_program, what cp.c posts) runs at cp 2/4/8 with a stream
// per peer and direction, and deadlocks on one stream. The pipeline executor's order is proven
// for every schedule in test_pp_schedule.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "parallel/cp/cp.h"
#include "parallel/p2p_check.h"

#define MAX_RANKS 8

static int op(P2pProgram *p, P2pKind kind, int peer, int64_t message, P2pStreams streams) {
    return p2p_add(p, (P2pStep){.kind = kind, .peer = peer, .message = message,
                                .stream = p2p_stream(streams, peer, kind == P2P_SEND)});
}

static void wait_op(P2pProgram *p, int i) { p2p_add(p, (P2pStep){.kind = P2P_WAIT, .op = i}); }

static bool check(P2pProgram *progs, int ranks, char *err, size_t n) {
    bool ok = p2p_check_nccl(progs, ranks, err, n);
    for (int r = 0; r < ranks; r++) p2p_program_free(&progs[r]);
    return ok;
}

// Each rank sends message 0 to its next, then receives its previous one's, then waits both.
static bool ring(int ranks, P2pStreams streams, char *err, size_t n) {
    P2pProgram progs[MAX_RANKS] = {0};
    for (int r = 0; r < ranks; r++) {
        int s = op(&progs[r], P2P_SEND, (r + 1) % ranks, 0, streams);
        int v = op(&progs[r], P2P_RECV, (r + ranks - 1) % ranks, 0, streams);
        wait_op(&progs[r], s);
        wait_op(&progs[r], v);
    }
    return check(progs, ranks, err, n);
}

static void test_ring(void **state) {
    (void)state;
    char err[512];
    for (int ranks = 2; ranks <= MAX_RANKS; ranks *= 2) {
        assert_false(ring(ranks, P2P_ONE_STREAM, err, sizeof err));
        assert_non_null(strstr(err, "deadlock on NCCL: rank 0 waits for its send to rank 1"));
        assert_true(ring(ranks, P2P_CHANNELS, err, sizeof err));
    }
}

// Rank 0 waits for its receive before sending what rank 1 waits for first: no streams help.
static void test_wait_cycle(void **state) {
    (void)state;
    char err[512];
    P2pProgram progs[2] = {0};
    wait_op(&progs[0], op(&progs[0], P2P_RECV, 1, 7, P2P_CHANNELS));
    op(&progs[0], P2P_SEND, 1, 8, P2P_CHANNELS);
    wait_op(&progs[1], op(&progs[1], P2P_RECV, 0, 8, P2P_CHANNELS));
    op(&progs[1], P2P_SEND, 0, 7, P2P_CHANNELS);
    assert_false(check(progs, 2, err, sizeof err));
    assert_non_null(strstr(err, "deadlock on NCCL: rank 0 waits for its receive from rank 1 "
                                "(message 7, step 0), whose match that rank has not posted yet"));
}

static void test_unmatched(void **state) {
    (void)state;
    char err[512];
    P2pProgram progs[2] = {0};
    op(&progs[0], P2P_SEND, 1, 3, P2P_CHANNELS);
    assert_false(check(progs, 2, err, sizeof err));
    assert_string_equal(err, "rank 0's send 0 (message 3) to rank 1 is never received");
    op(&progs[1], P2P_RECV, 0, 3, P2P_CHANNELS);
    assert_false(check(progs, 2, err, sizeof err));
    assert_string_equal(err, "rank 1's receive 0 (message 3) from rank 0 has no send");
    op(&progs[0], P2P_SEND, 1, 3, P2P_CHANNELS);
    op(&progs[0], P2P_SEND, 1, 4, P2P_CHANNELS);
    op(&progs[1], P2P_RECV, 0, 4, P2P_CHANNELS);
    op(&progs[1], P2P_RECV, 0, 3, P2P_CHANNELS);
    assert_false(check(progs, 2, err, sizeof err));
    assert_non_null(strstr(err, "rank 1's step 0 receives message 4 from rank 0, which sends "
                                "message 3 first"));
}

static bool cp_ring(int cp, P2pStreams streams, char *err, size_t n) {
    P2pProgram progs[MAX_RANKS] = {0};
    for (int r = 0; r < cp; r++) cp_ring_program(r, cp, streams, &progs[r]);
    return check(progs, cp, err, n);
}

static void test_cp_ring(void **state) {
    (void)state;
    char err[512];
    for (int cp = 2; cp <= MAX_RANKS; cp *= 2) {
        if (!cp_ring(cp, P2P_CHANNELS, err, sizeof err)) fail_msg("cp %d: %s", cp, err);
        assert_false(cp_ring(cp, P2P_ONE_STREAM, err, sizeof err));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring),
        cmocka_unit_test(test_wait_cycle),
        cmocka_unit_test(test_unmatched),
        cmocka_unit_test(test_cp_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
