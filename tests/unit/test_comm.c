// Communication tests (parallel/comm.h, MPI backend): run on one rank by run_all.sh and on four
// by tests/integration/test_comm.sh. Every operation is checked against values computed here
// from each rank's known input, on the world and on split groups (2x2 on four ranks, and one
// with reversed keys), together with the byte and operation counts the header promises; then
// the flight recorder's dumps. A plain main(), not cmocka: a failing rank exits 1 and mpirun
// ends the others, where a test runner would carry on into mismatched collectives.
//
// `staged` runs the same checks through the host-staged MPI backend (comm.backend: mpi on a
// GPU, parallel/comm_staged.c) with the cpu backend's upload and download as its copies.
//
// Two more modes are driven by test_comm.sh: `sigusr1 DIR` (rank 1 waits in an all-reduce
// until DIR/go appears, so the script can signal it) and `timeout` (rank 0 stops; the others'
// all-reduce must time out and abort the job).
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "parallel/comm.h"

static int world_rank;

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL ", world_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) fail("%s:%d: %s", __FILE__, __LINE__, #cond);                             \
    } while (0)

static void expect_floats(const float *got, const float *want, size_t n, const char *what,
                          const CommGroup *g) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail("%s on %s: [%zu] = %.9g, want %.9g", what, comm_name(g), i, got[i], want[i]);
}

typedef struct {
    uint64_t bytes, ops;
} Counts;

static Counts counts_of(const CommGroup *g) { return (Counts){comm_bytes(g), comm_ops(g)}; }

// g's counters grew by exactly bytes and ops since `before`.
static void expect_counted(const CommGroup *g, Counts before, uint64_t bytes, uint64_t ops,
                           const char *what) {
    Counts now = counts_of(g);
    if (now.bytes - before.bytes != bytes || now.ops - before.ops != ops)
        fail("%s on %s: counted %" PRIu64 " bytes in %" PRIu64 " ops, want %" PRIu64 " in %" PRIu64,
             what, comm_name(g), now.bytes - before.bytes, now.ops - before.ops, bytes, ops);
}

// ---- collectives --------------------------------------------------------------------------

static void test_all_reduce(CommGroup *g) {
    enum { N = 5 };
    int r = comm_rank(g), p = comm_size(g);
    float buf[N], want[N];
    Counts before = counts_of(g);
    for (int i = 0; i < N; i++) {
        buf[i] = (float)((r + 1) * (i + 1));
        want[i] = (float)((i + 1) * p * (p + 1) / 2);
    }
    comm_all_reduce(g, buf, N, COMM_SUM);
    expect_floats(buf, want, N, "all_reduce sum", g);
    for (int i = 0; i < N; i++) {
        buf[i] = r == i % p ? (float)(100 + i) : (float)(i - r);
        want[i] = (float)(100 + i);
    }
    comm_all_reduce(g, buf, N, COMM_MAX);
    expect_floats(buf, want, N, "all_reduce max", g);
    for (int i = 0; i < N; i++) {
        buf[i] = (float)(r + 2 * i);
        want[i] = (float)(p - 1) / 2 + (float)(2 * i);
    }
    comm_all_reduce(g, buf, N, COMM_AVG);
    expect_floats(buf, want, N, "all_reduce avg", g);
    expect_counted(g, before, 3 * 4 * N, 3, "all_reduce");
}

static void test_all_gather(CommGroup *g) {
    enum { N = 3 };
    int r = comm_rank(g), p = comm_size(g);
    float send[N], *recv = malloc(sizeof(float) * N * p), *want = malloc(sizeof(float) * N * p);
    Counts before = counts_of(g);
    for (int j = 0; j < N; j++) send[j] = (float)(1000 * r + j);
    for (int q = 0; q < p; q++)
        for (int j = 0; j < N; j++) want[q * N + j] = (float)(1000 * q + j);
    comm_all_gather(g, send, recv, N);
    expect_floats(recv, want, (size_t)N * p, "all_gather", g);
    // In place: this rank's block already sits in recv.
    for (int i = 0; i < N * p; i++) recv[i] = -1;
    memcpy(recv + r * N, send, sizeof(send));
    comm_all_gather(g, recv + r * N, recv, N);
    expect_floats(recv, want, (size_t)N * p, "all_gather in place", g);
    expect_counted(g, before, 2 * 4 * N, 2, "all_gather");
    free(recv);
    free(want);
}

// An odd byte count, so that nothing rides on a wider element: FSDP's float8 all-gather.
static void test_all_gather_bytes(CommGroup *g) {
    enum { N = 5 };
    int r = comm_rank(g), p = comm_size(g);
    uint8_t send[N], *recv = malloc((size_t)N * p);
    Counts before = counts_of(g);
    for (int j = 0; j < N; j++) send[j] = (uint8_t)(37 * r + j);
    CommHandle h = comm_all_gather_bytes_start(g, send, recv, N);
    comm_wait(&h);
    for (int q = 0; q < p; q++)
        for (int j = 0; j < N; j++)
            if (recv[q * N + j] != (uint8_t)(37 * q + j))
                fail("all_gather_bytes on %s: [%d] = %d", comm_name(g), q * N + j, recv[q * N + j]);
    expect_counted(g, before, N, 1, "all_gather_bytes");
    free(recv);
}

static void test_reduce_scatter(CommGroup *g) {
    enum { N = 4 };
    int r = comm_rank(g), p = comm_size(g);
    float *send = malloc(sizeof(float) * N * p), recv[N], want[N];
    Counts before = counts_of(g);
    for (int q = 0; q < p; q++)
        for (int j = 0; j < N; j++) send[q * N + j] = (float)(r + 10 * q + j);
    const CommOp ops[3] = {COMM_SUM, COMM_MAX, COMM_AVG};
    for (int k = 0; k < 3; k++) {
        // Block r summed over ranks s of (s + 10 r + j): the rank part is p (p - 1) / 2.
        for (int j = 0; j < N; j++) {
            float own = (float)(10 * r + j);
            want[j] = ops[k] == COMM_SUM   ? (float)(p * (p - 1) / 2) + p * own
                      : ops[k] == COMM_MAX ? (float)(p - 1) + own
                                           : (float)(p - 1) / 2 + own;
        }
        comm_reduce_scatter(g, send, recv, N, ops[k]);
        expect_floats(recv, want, N, "reduce_scatter", g);
    }
    expect_counted(g, before, 3 * 4 * (uint64_t)N * p, 3, "reduce_scatter");
    free(send);
}

// A float reduce-scatter adds the ranks' chunks in rank order, ((g0 + g1) + g2) + g3 (one rank's
// accumulation of the same microbatches): rank 0 sends 1 and the others 2^-24, half an ulp of
// 1, which each add in that order rounds away (to even) but a tree's (g0 + g1) + (g2 + g3) keeps.
static void test_reduce_scatter_rank_order(CommGroup *g) {
    enum { N = 3 };
    int r = comm_rank(g), p = comm_size(g);
    float *send = malloc(sizeof(float) * N * p), recv[N], want[N];
    float mine = r == 0 ? 1.0f : 0x1p-24f, in_order = 1.0f;
    for (int q = 1; q < p; q++) in_order += 0x1p-24f;
    for (int i = 0; i < N * p; i++) send[i] = mine;
    for (int j = 0; j < N; j++) want[j] = in_order;
    if (p == 4) EXPECT(in_order != (1.0f + 0x1p-24f) + (0x1p-24f + 0x1p-24f));
    comm_reduce_scatter(g, send, recv, N, COMM_SUM);
    expect_floats(recv, want, N, "reduce_scatter in rank order", g);
    for (int j = 0; j < N; j++) want[j] = in_order / (float)p;
    comm_reduce_scatter(g, send, recv, N, COMM_AVG);
    expect_floats(recv, want, N, "reduce_scatter average in rank order", g);
    free(send);
}

// Floats rank a sends rank b: uneven, zero for some pairs on four ranks.
static int a2a_count(int a, int b) { return (2 * a + b + 1) % 4; }

static void test_all_to_allv(CommGroup *g) {
    int r = comm_rank(g), p = comm_size(g);
    int *sc = malloc(sizeof(int) * p), *sd = malloc(sizeof(int) * p);
    int *rc = malloc(sizeof(int) * p), *rd = malloc(sizeof(int) * p);
    int sent = 0, got = 0;
    for (int q = 0; q < p; q++) {
        sc[q] = a2a_count(r, q), sd[q] = sent, sent += sc[q];
        rc[q] = a2a_count(q, r), rd[q] = got, got += rc[q];
    }
    float *send = malloc(sizeof(float) * (sent + 1)), *recv = malloc(sizeof(float) * (got + 1));
    float *want = malloc(sizeof(float) * (got + 1));
    for (int q = 0; q < p; q++)
        for (int k = 0; k < sc[q]; k++) send[sd[q] + k] = (float)(100 * r + 10 * q + k);
    for (int q = 0; q < p; q++)
        for (int k = 0; k < rc[q]; k++) want[rd[q] + k] = (float)(100 * q + 10 * r + k);
    Counts before = counts_of(g);
    CommHandle h = comm_all_to_allv_start(g, send, sc, sd, recv, rc, rd);
    comm_wait(&h);
    expect_floats(recv, want, (size_t)got, "all_to_allv", g);
    expect_counted(g, before, 4 * (uint64_t)sent, 1, "all_to_allv");
    free(sc), free(sd), free(rc), free(rd), free(send), free(recv), free(want);
}

// Host ints, two per pair: rank a sends b the values 100a + 10b + k.
static void test_all_to_all_ints(CommGroup *g) {
    int r = comm_rank(g), p = comm_size(g), n = 2;
    int *send = malloc(sizeof(int) * p * n), *recv = malloc(sizeof(int) * p * n);
    for (int q = 0; q < p; q++)
        for (int k = 0; k < n; k++) send[q * n + k] = 100 * r + 10 * q + k;
    Counts before = counts_of(g);
    comm_all_to_all_ints(g, send, recv, n);
    for (int q = 0; q < p; q++)
        for (int k = 0; k < n; k++) EXPECT(recv[q * n + k] == 100 * q + 10 * r + k);
    expect_counted(g, before, sizeof(int) * (uint64_t)(p * n), 1, "all_to_all_ints");
    free(send), free(recv);
}

static void test_broadcast(CommGroup *g) {
    const char message[13] = "from the root";  // 13 bytes: not a whole number of floats
    int root = comm_size(g) - 1;
    char buf[13] = {0};
    if (comm_rank(g) == root) memcpy(buf, message, sizeof(buf));
    Counts before = counts_of(g);
    comm_broadcast(g, buf, sizeof(buf), root);
    if (memcmp(buf, message, sizeof(buf)) != 0) fail("broadcast on %s", comm_name(g));
    expect_counted(g, before, sizeof(buf), 1, "broadcast");
}

// Each rank sends to the next and receives from the previous (itself on one rank).
static void test_send_recv_ring(CommGroup *g) {
    enum { N = 6 };
    int r = comm_rank(g), p = comm_size(g), next = (r + 1) % p, prev = (r + p - 1) % p;
    float send[N], recv[N], want[N];
    for (int j = 0; j < N; j++) send[j] = (float)(10 * r + j), want[j] = (float)(10 * prev + j);
    Counts before = counts_of(g);
    CommHandle hr = comm_recv_start(g, recv, N, prev, 7);
    CommHandle hs = comm_send_start(g, send, N, next, 7);
    comm_wait(&hs);
    comm_wait(&hr);
    expect_floats(recv, want, N, "send/recv ring", g);
    expect_counted(g, before, 4 * N, 2, "send/recv");  // a receive counts no bytes
}

// A ring of messages past MPI's eager limit completes by comm_test polls alone (what lets a
// computing rank move them), and a wait on a handle a test completed returns at once.
static void test_completion_by_test(CommGroup *g) {
    enum { N = 1 << 16 };
    int r = comm_rank(g), p = comm_size(g), next = (r + 1) % p, prev = (r + p - 1) % p;
    float *send = malloc(N * sizeof(float)), *recv = malloc(N * sizeof(float));
    float *want = malloc(N * sizeof(float));
    for (int j = 0; j < N; j++) send[j] = (float)(r * N + j), want[j] = (float)(prev * N + j);
    CommHandle hr = comm_recv_start(g, recv, N, prev, 8);
    CommHandle hs = comm_send_start(g, send, N, next, 8);
    bool received = false, sent = false;
    while (!received || !sent) {
        received = comm_test(&hr);
        sent = comm_test(&hs);
    }
    EXPECT(hr.request == NULL && hs.request == NULL);
    comm_wait(&hr);
    comm_wait(&hs);
    expect_floats(recv, want, N, "send/recv completed by tests", g);
    free(send);
    free(recv);
    free(want);
}

// Two operations in flight, waited in reverse order; the average is divided exactly once,
// however often its handle is waited on.
static void test_overlap(CommGroup *g) {
    enum { N = 4 };
    int r = comm_rank(g), p = comm_size(g);
    float a[N], b[N], want_a[N], want_b[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)(r + i), want_a[i] = (float)(p - 1) / 2 + (float)i;
        b[i] = (float)(r * i), want_b[i] = (float)(i * p * (p - 1) / 2);
    }
    CommHandle ha = comm_all_reduce_start(g, a, N, COMM_AVG);
    CommHandle hb = comm_all_reduce_start(g, b, N, COMM_SUM);
    comm_wait(&hb);
    comm_wait(&ha);
    comm_wait(&ha);
    CommHandle none = {0};
    comm_wait(&none);
    expect_floats(a, want_a, N, "overlapped avg", g);
    expect_floats(b, want_b, N, "overlapped sum", g);
}

static void test_scalars_and_barrier(CommGroup *g) {
    int r = comm_rank(g), p = comm_size(g);
    Counts before = counts_of(g);
    EXPECT(comm_all_reduce_double(g, r + 0.5, COMM_SUM) == p * (p - 1) / 2.0 + 0.5 * p);
    EXPECT(comm_all_reduce_double(g, r + 0.5, COMM_MAX) == p - 0.5);
    EXPECT(comm_all_reduce_double(g, r + 0.5, COMM_AVG) == (p - 1) / 2.0 + 0.5);
    comm_barrier(g);
    expect_counted(g, before, 3 * sizeof(double), 4, "doubles and barrier");
}

static void test_group(CommGroup *g) {
    test_all_reduce(g);
    test_all_gather(g);
    test_all_gather_bytes(g);
    test_reduce_scatter(g);
    test_reduce_scatter_rank_order(g);
    test_all_to_allv(g);
    test_all_to_all_ints(g);
    test_broadcast(g);
    test_send_recv_ring(g);
    test_completion_by_test(g);
    test_overlap(g);
    test_scalars_and_barrier(g);
}

// Rows {0,1},{2,3}, ... and columns of equal parity: on four ranks a 2x2 mesh, whose row sums
// summed over a column are the world's sum.
static void test_splits(CommGroup *world) {
    int r = world_rank, p = comm_size(world);
    CommGroup *row = comm_split(world, r / 2, r % 2, "row");
    CommGroup *col = comm_split(world, r % 2, r / 2, "col");
    CommGroup *reversed = comm_split(world, 0, -r, "reversed");
    EXPECT(comm_size(row) == (r / 2 * 2 + 1 < p ? 2 : 1) && comm_rank(row) == r % 2);
    EXPECT(comm_size(col) == (p - r % 2 + 1) / 2 && comm_rank(col) == r / 2);
    EXPECT(comm_size(reversed) == p && comm_rank(reversed) == p - 1 - r);
    EXPECT(strcmp(comm_name(row), "row") == 0);
    if (p % 2 == 0 || p == 1) {
        double row_sum = comm_all_reduce_double(row, r, COMM_SUM);
        EXPECT(comm_all_reduce_double(col, row_sum, COMM_SUM) == p * (p - 1) / 2.0);
    }
    CommGroup *groups[3] = {row, col, reversed};
    for (int i = 0; i < 3; i++) test_group(groups[i]);
}

// ---- flight recorder and report -----------------------------------------------------------

static char captured[1 << 16];

// What fn writes to fd (1 or 2) while it runs.
static const char *capture(int fd, void (*fn)(void)) {
    fflush(NULL);
    FILE *tmp = tmpfile();
    EXPECT(tmp);
    int saved = dup(fd);
    EXPECT(saved >= 0 && dup2(fileno(tmp), fd) == fd);
    fn();
    fflush(NULL);
    EXPECT(dup2(saved, fd) == fd && close(saved) == 0);
    rewind(tmp);
    size_t n = fread(captured, 1, sizeof(captured) - 1, tmp);
    captured[n] = '\0';
    fclose(tmp);
    return captured;
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = strstr(text, needle); s; s = strstr(s + 1, needle)) n++;
    return n;
}

static void expect_contains(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail("expected \"%s\" in:\n%s", needle, text);
}

static void dump_for_test(void) { comm_dump_trace("unit test"); }

static void barrier_after_sigusr1(void) {
    EXPECT(raise(SIGUSR1) == 0);
    comm_barrier(comm_world());  // the next comm call dumps
}

static void report(void) { comm_report(); }

static void configure(int timeout_seconds, int trace_buf_size) {
    comm_configure(&(CommConfig){.timeout_seconds = timeout_seconds,
                                 .trace_buf_size = trace_buf_size});
}

static void test_dumps(CommGroup *world) {
    char want[128];
    comm_barrier(world);
    const char *out = capture(2, dump_for_test);
    snprintf(want, sizeof(want), "titan: rank %d: flight recorder (unit test):", world_rank);
    expect_contains(out, want);
    EXPECT(count_of(out, "  seq ") == 32);  // the last 32 of many more
    expect_contains(out, "barrier on group world, 0 bytes");
    expect_contains(out, "completed in");

    out = capture(2, barrier_after_sigusr1);
    snprintf(want, sizeof(want), "titan: rank %d: flight recorder (SIGUSR1):", world_rank);
    expect_contains(out, want);

    // A ring of 8 keeps the last 8.
    configure(30, 8);
    for (int i = 0; i < 20; i++) comm_barrier(world);
    out = capture(2, dump_for_test);
    EXPECT(count_of(out, "  seq ") == 8 && count_of(out, "the last 8:") == 1);

    // A receive left pending behind 40 newer operations is listed after the last 32.
    configure(30, 100);
    float self = (float)world_rank, got = -1;
    CommHandle hr = comm_recv_start(world, &got, 1, world_rank, 99);
    for (int i = 0; i < 40; i++) comm_barrier(world);
    out = capture(2, dump_for_test);
    expect_contains(out, "older operations still pending:");
    snprintf(want, sizeof(want), "recv on group world peer %d, 0 bytes", world_rank);
    expect_contains(out, want);
    expect_contains(out, "PENDING for");
    CommHandle hs = comm_send_start(world, &self, 1, world_rank, 99);
    comm_wait(&hs);
    comm_wait(&hr);
    EXPECT(got == self);

    configure(30, 0);
    out = capture(2, dump_for_test);
    expect_contains(out, "flight recorder (unit test): off");
    configure(30, 1000);
}

// Rank 0 reports each group used, but a group of one rank, which moves nothing: on one rank,
// no line at all.
static void test_report(CommGroup *world) {
    const char *out = capture(1, report);
    if (world_rank != 0 || comm_size(world) == 1) {
        EXPECT(out[0] == '\0');
        return;
    }
    char want[64];
    snprintf(want, sizeof(want), " %" PRIu64 " ops", comm_ops(world));
    expect_contains(out, "comm: group world ");
    expect_contains(out, want);
    expect_contains(out, "comm: group reversed ");
}

static int run_checks(void) {
    CommGroup *world = comm_world();
    configure(30, 1000);  // a broken test times out instead of hanging
    test_group(world);
    test_splits(world);
    test_dumps(world);
    test_report(world);
    // The tests run on one machine: every rank's index on its node is its world rank.
    EXPECT(comm_local_rank() == world_rank);
    if (world_rank == 0) printf("comm: all checks passed on %d ranks\n", comm_size(world));
    return 0;
}

// ---- modes for test_comm.sh ---------------------------------------------------------------

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
}

// Rank 1 starts an all-reduce and only then publishes its pid, so that the SIGUSR1 the script
// sends always finds the operation pending; the others join once DIR/go appears.
static int run_sigusr1(const char *dir) {
    CommGroup *world = comm_world();
    configure(30, 1000);
    comm_barrier(world);
    float x = 1;
    char path[512];
    if (world_rank == 1) {
        CommHandle h = comm_all_reduce_start(world, &x, 1, COMM_SUM);
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s/pid.tmp", dir);
        snprintf(path, sizeof(path), "%s/pid", dir);
        FILE *f = fopen(tmp, "w");
        EXPECT(f && fprintf(f, "%d\n", (int)getpid()) > 0 && fclose(f) == 0);
        EXPECT(rename(tmp, path) == 0);
        comm_wait(&h);
    } else {
        snprintf(path, sizeof(path), "%s/go", dir);
        for (int i = 0; access(path, F_OK) != 0; i++) {
            EXPECT(i < 2000);  // 20 s
            sleep_ms(10);
        }
        comm_all_reduce(world, &x, 1, COMM_SUM);
    }
    EXPECT(x == (float)comm_size(world));
    return 0;
}

// Rank 0 stops (as a hung rank would) and never enters the all-reduce the others wait in,
// which must time out and abort the job; mpirun resumes rank 0 only to kill it.
static int run_timeout(void) {
    CommGroup *world = comm_world();
    configure(2, 1000);
    comm_barrier(world);
    if (world_rank == 0) {
        EXPECT(raise(SIGSTOP) == 0);
        sleep_ms(60000);
        fail("rank 0 outlived the abort");
    }
    float x = 1;
    comm_all_reduce(world, &x, 1, COMM_SUM);
    fail("the all-reduce completed without rank 0");
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    world_rank = comm_rank(comm_world());
    int rc;
    if (argc == 1) rc = run_checks();
    else if (argc == 2 && strcmp(argv[1], "staged") == 0) {
        const KernelOps *cpu = kernels_backend("cpu");
        comm_use_staged(cpu->upload, cpu->download);
        rc = run_checks();
    }
    else if (argc == 3 && strcmp(argv[1], "sigusr1") == 0) rc = run_sigusr1(argv[2]);
    else if (argc == 2 && strcmp(argv[1], "timeout") == 0) rc = run_timeout();
    else fail("usage: test_comm [staged | sigusr1 DIR | timeout]");
    comm_finalize();
    return rc;
}
