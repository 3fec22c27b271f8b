#include "parallel/cp/cp.h"

#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "parallel/cp/attention.h"

// MPI matches the ring's two kinds of message by tag (NCCL, which ignores tags, is not used
// for the ring: see train/setup.c).
enum { TAG_KV = 1, TAG_DKV = 2 };

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The workspace of one call: allgather holds every rank's unit and their gradients (plus this
// rank's summed one); the ring two units (in hand, arriving) and three gradients (two sent in
// turn, one arriving).
static CpWork carve(const Cp *cp, const KernelOps *k, const AttnShape *local, void *base) {
    bool ring = cp->rotate == CP_ALLTOALL;
    return cp_work_carve(cp->rank, cp->size, ring ? 2 : cp->size, ring ? 3 : cp->size + 1, k,
                         local, base);
}

// Waits for h, counting the time blocked as exposed K/V traffic.
static void traffic_wait(Cp *cp, CommHandle *h) {
    double t0 = now_seconds();
    comm_wait(h);
    cp->wait_seconds += now_seconds() - t0;
}

// The ring's transfers in flight while a unit is computed: tested between chunk pairs, so that
// MPI, which moves a large message only inside its calls, moves them meanwhile. The tests'
// time counts as blocked: it is the copy.
typedef struct {
    Cp *cp;
    CommHandle *h[4];
    int n;
} InFlight;

static void in_flight_progress(void *ctx) {
    InFlight *f = ctx;
    double t0 = now_seconds();
    for (int i = 0; i < f->n; i++) comm_test(f->h[i]);
    f->cp->wait_seconds += now_seconds() - t0;
}

// The rank whose unit this rank holds at ring step i: its own first, then the previous one's.
static int ring_owner(const Cp *cp, int i) { return (cp->rank - i + cp->size) % cp->size; }

static void forward_ring(Cp *cp, const KernelOps *k, const CpWork *w, bool filled[2]) {
    float *cur = w->kv, *next = w->kv + w->unit;
    for (int i = 0; i < cp->size; i++) {
        CommHandle send = {0}, recv = {0};
        if (i + 1 < cp->size) {  // the next unit travels while this one is computed
            send = comm_send_start(cp->group, cur, w->unit, cp->next, TAG_KV);
            recv = comm_recv_start(cp->group, next, w->unit, cp->prev, TAG_KV);
            cp->transfers++;
            cp->bytes_sent += w->unit * sizeof(float);
        }
        InFlight in_flight = {cp, {&send, &recv}, 2};
        CpBetweenPairs between = {in_flight_progress, &in_flight};
        cp_forward_unit(w, k, ring_owner(cp, i), cur, filled, &between);
        traffic_wait(cp, &send);
        traffic_wait(cp, &recv);
        float *t = cur;
        cur = next;
        next = t;
    }
}

// Each step's dK/dV of the unit in hand (this rank's queries' share) is added to what the
// ranks before it on the ring accumulated, and sent on; after size steps each unit's sum
// arrives at its owner.
static void backward_ring(Cp *cp, const KernelOps *k, const CpWork *w, float *dunit_home) {
    float *cur = w->kv, *next = w->kv + w->unit;
    float *mine[2] = {w->dkv, w->dkv + w->unit}, *received = w->dkv + 2 * w->unit;
    CommHandle dsend[2] = {{0}, {0}};
    for (int i = 0; i < cp->size; i++) {
        CommHandle drecv = {0}, send = {0}, recv = {0};
        if (i > 0)
            drecv = comm_recv_start(cp->group, received, w->unit, cp->prev, TAG_DKV);
        if (i + 1 < cp->size) {
            send = comm_send_start(cp->group, cur, w->unit, cp->next, TAG_KV);
            recv = comm_recv_start(cp->group, next, w->unit, cp->prev, TAG_KV);
            cp->transfers++;
            cp->bytes_sent += w->unit * sizeof(float);
        }
        float *d = mine[i % 2];
        traffic_wait(cp, &dsend[i % 2]);  // its send two steps ago is done
        k->zero(d, w->unit * sizeof(float));
        InFlight in_flight = {cp, {&drecv, &send, &recv, &dsend[(i + 1) % 2]}, 4};
        CpBetweenPairs between = {in_flight_progress, &in_flight};
        cp_backward_unit(w, k, ring_owner(cp, i), cur, d, &between);
        traffic_wait(cp, &drecv);
        if (i > 0) k->add(d, received, w->unit);
        dsend[i % 2] = comm_send_start(cp->group, d, w->unit, cp->next, TAG_DKV);
        cp->transfers++;
        cp->bytes_sent += w->unit * sizeof(float);
        traffic_wait(cp, &send);
        traffic_wait(cp, &recv);
        float *t = cur;
        cur = next;
        next = t;
    }
    CommHandle home = comm_recv_start(cp->group, dunit_home, w->unit, cp->prev, TAG_DKV);
    traffic_wait(cp, &home);
    traffic_wait(cp, &dsend[0]);
    traffic_wait(cp, &dsend[1]);
}

// Every rank's unit into w->kv (rank order), this rank's packed in place first.
static void gather_units(Cp *cp, const KernelOps *k, const CpWork *w, const float *kk,
                         const float *v) {
    float *own = w->kv + (size_t)cp->rank * w->unit;
    cp_pack_unit(w, k, own, kk, v);
    CommHandle h = comm_all_gather_start(cp->group, own, w->kv, w->unit);
    traffic_wait(cp, &h);
    cp->transfers++;
    cp->bytes_sent += w->unit * sizeof(float);
}

static void cp_forward(const AttnHooks *h, const StepCtx *s, float *out, float *lse,
                       const float *q, const float *kk, const float *v, const AttnShape *local,
                       void *workspace) {
    Cp *cp = (Cp *)h;
    const KernelOps *k = s->k;
    CpWork w = carve(cp, k, local, workspace);
    cp_forward_begin(&w, k, q);
    bool filled[2] = {false, false};
    if (cp->rotate == CP_ALLTOALL) {
        cp_pack_unit(&w, k, w.kv, kk, v);
        forward_ring(cp, k, &w, filled);
    } else {
        gather_units(cp, k, &w, kk, v);
        for (int i = 0; i < cp->size; i++) {
            int j = ring_owner(cp, i);  // the same order as the ring: the same sums
            cp_forward_unit(&w, k, j, w.kv + (size_t)j * w.unit, filled, NULL);
        }
    }
    // Every query chunk sees at least its own positions: both were written.
    CHECK(filled[0] && filled[1]);
    cp_forward_end(&w, k, out, lse);
}

static void cp_backward(const AttnHooks *h, const StepCtx *s, float *dq, float *dk, float *dv,
                        const float *dout, const float *q, const float *kk, const float *v,
                        const float *out, const float *lse, const AttnShape *local,
                        void *workspace) {
    Cp *cp = (Cp *)h;
    const KernelOps *k = s->k;
    CpWork w = carve(cp, k, local, workspace);
    cp_backward_begin(&w, k, q, dout, out, lse);
    float *dunit = w.dkv + (size_t)(cp->rotate == CP_ALLTOALL ? 2 : cp->size) * w.unit;
    if (cp->rotate == CP_ALLTOALL) {
        cp_pack_unit(&w, k, w.kv, kk, v);
        backward_ring(cp, k, &w, dunit);
    } else {
        gather_units(cp, k, &w, kk, v);
        k->zero(w.dkv, (size_t)cp->size * w.unit * sizeof(float));
        for (int i = 0; i < cp->size; i++) {
            int j = ring_owner(cp, i);
            cp_backward_unit(&w, k, j, w.kv + (size_t)j * w.unit, w.dkv + (size_t)j * w.unit,
                             NULL);
        }
        CommHandle rs = comm_reduce_scatter_start(cp->group, w.dkv, dunit, w.unit, COMM_SUM);
        traffic_wait(cp, &rs);
        cp->transfers++;
        cp->bytes_sent += (uint64_t)cp->size * w.unit * sizeof(float);
    }
    cp_backward_end(&w, k, dq, dk, dv, dunit);
}

static size_t cp_workspace_bytes(const AttnHooks *h, const StepCtx *s, const AttnShape *local) {
    return carve((const Cp *)h, s->k, local, NULL).bytes;
}

bool cp_rotate_parse(const char *name, CpRotate *out) {
    if (strcmp(name, "allgather") == 0) *out = CP_ALLGATHER;
    else if (strcmp(name, "alltoall") == 0) *out = CP_ALLTOALL;
    else return false;
    return true;
}

void cp_plan(Cp *cp, int rank, int size, CpRotate rotate) {
    *cp = (Cp){.hooks = {.workspace_bytes = cp_workspace_bytes,
                         .forward = cp_forward, .backward = cp_backward},
               .rank = rank, .size = size, .rotate = rotate};
}

void cp_init(Cp *cp, CommGroup *group, int prev, int next, CpRotate rotate) {
    cp_plan(cp, comm_rank(group), comm_size(group), rotate);
    cp->group = group;
    cp->prev = prev;
    cp->next = next;
    if (rotate == CP_ALLTOALL) comm_p2p_ring(group);
}

// A unit is this rank's K and V. allgather: one all-gather of it (comm.h counts the local input:
// one unit); backward gathers again and reduce-scatters every rank's dK/dV (size units).
// alltoall: size - 1 ring steps send a unit; backward's size steps each also send the dK/dV
// accumulated so far.
uint64_t cp_attention_bytes(const Cp *cp, uint64_t kv_floats, bool backward) {
    uint64_t unit = 2 * kv_floats * sizeof(float), size = (uint64_t)cp->size;
    if (cp->rotate == CP_ALLGATHER) return backward ? (1 + size) * unit : unit;
    return backward ? (2 * size - 1) * unit : (size - 1) * unit;
}
