// Context parallel's K/V traffic with and without compute to hide it, for scripts/bench_cp.sh:
//   mpirun -np CP bench_cp_ring ROTATE B T N_HEADS N_KV_HEADS HEAD_DIM CALLS
// Drives the real Cp hooks (parallel/cp) over the CP ranks of the world, for B sequences of T
// tokens (T / CP per rank), through the cpu backend's kernels wrapped in timers: CALLS attention
// forward + backward pairs with the attention kernels skipped ("alone": the same messages of
// the same sizes, started and waited on in the same order, with no chunk compute to overlap
// them), then CALLS pairs with them ("under compute"). A pair's communication time is its wall
// time less the time in kernels (the attention chunks, and the copies that pack and unpack the
// chunks): the time spent in the comm calls, starts included (a shared-memory receive may copy
// the message as it is posted), which is what the pair's traffic cost. Every transfer starts and
// ends inside a hook call, so the attention chunks are all the compute that could hide it. A
// barrier before each pair lines the ranks up, so a peer's late start is not counted.
// Prints rank 0's line (a training run's K/V line is rank 0's too): the alone pairs' bytes in
// all; the least communication time of a pair, alone and under compute (the least, as other
// jobs on a shared machine, and a peer they slow down, only ever add to it); and the least wall
// time of a pair under compute:
//   "alone: M MiB sent in N pairs; communication per pair: A ms alone, C ms under compute of W ms"
// Exit 1 when the bytes sent differ from cp_attention_bytes's (it would not be the training
// run's traffic).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/errors.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/cp/cp.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The kernels Cp calls, each timed into in_kernels; the attention ones run only when attend.
static const KernelOps *cpu;
static bool attend;
static double in_kernels;
#define TIMED(call)                           \
    do {                                      \
        double t0_ = now_seconds();           \
        call;                                 \
        in_kernels += now_seconds() - t0_;    \
    } while (0)

static void timed_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          const AttnShape *shape, void *workspace) {
    if (attend) TIMED(cpu->attention_forward(out, lse, q, k, v, shape, workspace));
}
static void timed_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                           const float *k, const float *v, const float *out, const float *lse,
                           const AttnShape *shape, void *workspace) {
    if (attend)
        TIMED(cpu->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, shape, workspace));
}
static void timed_merge(float *out, float *lse, const float *out2, const float *lse2, int B,
                        int T, int n_heads, int head_dim) {
    if (attend) TIMED(cpu->attention_merge(out, lse, out2, lse2, B, T, n_heads, head_dim));
}
static void timed_copy_rows(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                            size_t row_bytes, size_t rows) {
    TIMED(cpu->copy_rows(dst, dst_pitch, src, src_pitch, row_bytes, rows));
}
static void timed_zero(void *dst, size_t bytes) { TIMED(cpu->zero(dst, bytes)); }
static void timed_add(float *y, const float *x, size_t n) { TIMED(cpu->add(y, x, n)); }

static double minimum(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++) m = v[i] < m ? v[i] : m;
    return m;
}

// One call's tensors, zeros (attention costs the same on any values).
typedef struct {
    float *q, *out, *dout, *dq;  // (B, T / CP, n_heads, head_dim)
    float *k, *v, *dk, *dv;      // (B, T / CP, n_kv_heads, head_dim)
    float *lse;                  // (B, n_heads, T / CP)
    void *workspace;
} Tensors;

static float *zeros(size_t n) {
    float *p = calloc(n, sizeof(float));
    CHECK(p);
    return p;
}

// calls pairs through cp's hooks on the timed kernels, after one to warm up: the least
// communication and (when wall is not NULL) wall seconds of a pair; cp->bytes_sent counts the
// timed pairs'.
static void time_pairs(Cp *cp, const StepCtx *s, const AttnShape *shape, Tensors *t, int calls,
                       double *comm, double *wall) {
    double *c = xmalloc(calls * sizeof(double)), *w = xmalloc(calls * sizeof(double));
    for (int i = -1; i < calls; i++) {
        if (i == 0) cp->bytes_sent = 0;
        comm_barrier(cp->group);
        double kernels = in_kernels, t0 = now_seconds();
        cp->hooks.forward(&cp->hooks, s, t->out, t->lse, t->q, t->k, t->v, shape, t->workspace);
        cp->hooks.backward(&cp->hooks, s, t->dq, t->dk, t->dv, t->dout, t->q, t->k, t->v, t->out,
                           t->lse, shape, t->workspace);
        if (i < 0) continue;
        w[i] = now_seconds() - t0;
        c[i] = w[i] - (in_kernels - kernels);
    }
    *comm = minimum(c, calls);
    if (wall) *wall = minimum(w, calls);
    free(c);
    free(w);
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    CpRotate rotate;
    if (argc != 8 || !cp_rotate_parse(argv[1], &rotate))
        die_user("usage: mpirun -np CP bench_cp_ring allgather|alltoall B T N_HEADS N_KV_HEADS "
                 "HEAD_DIM CALLS");
    int B = atoi(argv[2]), T = atoi(argv[3]), nh = atoi(argv[4]), nkv = atoi(argv[5]);
    int hd = atoi(argv[6]), calls = atoi(argv[7]);
    CommGroup *world = comm_world();
    int size = comm_size(world);
    if (B < 1 || T % (2 * size) != 0 || nh < 1 || nkv < 1 || nh % nkv != 0 || hd < 1 || calls < 1)
        die_user("bench_cp_ring: B, N_HEADS, N_KV_HEADS (dividing N_HEADS), HEAD_DIM and CALLS "
                 "must be positive and T a multiple of 2 x %d ranks", size);
    cpu = kernels_backend("cpu");
    KernelOps timed = *cpu;
    timed.attention_forward = timed_forward;
    timed.attention_backward = timed_backward;
    timed.attention_merge = timed_merge;
    timed.copy_rows = timed_copy_rows;
    timed.zero = timed_zero;
    timed.add = timed_add;
    Cp cp;
    int rank = comm_rank(world);  // the world is the ring, in rank order
    cp_init(&cp, world, (rank + size - 1) % size, (rank + 1) % size, rotate);
    int Tl = T / size;
    StepCtx s = {.k = &timed, .attn = &cp.hooks, .B = B, .T = Tl};
    AttnShape shape = {.B = B, .Tq = Tl, .Tk = Tl, .n_heads = nh, .n_kv_heads = nkv,
                       .head_dim = hd, .mask = ATTN_CAUSAL};
    size_t qn = (size_t)B * Tl * nh * hd, kvn = (size_t)B * Tl * nkv * hd;
    Tensors t = {zeros(qn), zeros(qn), zeros(qn), zeros(qn), zeros(kvn), zeros(kvn),
                 zeros(kvn), zeros(kvn), zeros((size_t)B * nh * Tl),
                 xmalloc(cp.hooks.workspace_bytes(&cp.hooks, &s, &shape))};
    double alone, comm, wall;
    time_pairs(&cp, &s, &shape, &t, calls, &alone, NULL);
    uint64_t sent = cp.bytes_sent;
    uint64_t want = (uint64_t)calls * (cp_attention_bytes(&cp, kvn, false) +
                                       cp_attention_bytes(&cp, kvn, true));
    if (sent != want) {
        fprintf(stderr, "bench_cp_ring: sent %llu bytes, cp_attention_bytes says %llu\n",
                (unsigned long long)sent, (unsigned long long)want);
        return 1;
    }
    attend = true;
    time_pairs(&cp, &s, &shape, &t, calls, &comm, &wall);
    if (rank == 0)
        printf("alone: %.2f MiB sent in %d pairs; communication per pair: %.3f ms alone, %.3f ms "
               "under compute of %.3f ms\n", sent / 1048576.0, calls, 1e3 * alone, 1e3 * comm,
               1e3 * wall);
    free(t.q), free(t.out), free(t.dout), free(t.dq), free(t.k), free(t.v), free(t.dk);
    free(t.dv), free(t.lse), free(t.workspace);
    comm_finalize();
    return 0;
}
