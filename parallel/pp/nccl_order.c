// The executor's posting order as each rank's point-to-point program (parallel/p2p_check.h),
// played under NCCL's semantics. Each step here is what executor.c does at the same action;
// the two change together:
// - a send or receive is posted where the list has it; a RECV_F first takes the region it
//   receives into, which waits for the region's last holder's sends;
// - F takes its region (if its input was not received into one) and waits for its input's
//   receive; B and I wait for their output gradient's receive; B, W (and evaluation's F, as
//   executor.c) give their region back, remembering its holder, whose sends (a B's SEND_B
//   comes after it) the region's next taker waits for;
// - at the end every region waits for its last holder's sends.
#include <stdlib.h>

#include "core/errors.h"
#include "parallel/p2p_check.h"
#include "parallel/pp/schedule.h"

// One rank's play of the executor: its regions and, per (stage, microbatch), the program's
// step index of each of its operations (-1: none posted).
typedef struct {
    const PpSchedule *s;
    int rank;
    P2pProgram *prog;
    P2pStreams streams;
    int *region;             // (stages * m) the region held; -1 none
    int *recv_x, *recv_dy, *send_y, *send_dx;  // (stages * m)
    // (regions) the (stage, microbatch) that last held each, whose sends (posted after it gave
    // the region back, as a B's SEND_B is) a taker waits for, as executor.c's region_drain
    // does through its pointers to them; -1: none
    int *holder;
    int *released, n_released;
} Play;

static bool local(const Play *p, int stage) {
    return stage >= 0 && stage < p->s->stages && p->s->stage_rank[stage] == p->rank;
}

static void wait_for(Play *p, int op) {
    if (op >= 0) p2p_add(p->prog, (P2pStep){.kind = P2P_WAIT, .op = op});
}

// Waits for the sends the region's last holder made from it.
static void region_drain(Play *p, int g) {
    int k = p->holder[g];
    if (k < 0) return;
    wait_for(p, p->send_y[k]);
    wait_for(p, p->send_dx[k]);
    p->holder[g] = -1;
}

static void region_acquire(Play *p, int key) {
    if (p->region[key] >= 0) return;
    CHECK(p->n_released > 0);  // the caller's region counts passed pp_schedule_check_regions
    int g = p->released[0];
    for (int j = 1; j < p->n_released; j++) p->released[j - 1] = p->released[j];
    p->n_released--;
    region_drain(p, g);
    p->region[key] = g;
}

static void region_release(Play *p, int key) {
    int g = p->region[key];
    p->holder[g] = key;
    p->released[p->n_released++] = g;
    p->region[key] = -1;
}

// The message a send or receive carries, as executor.c's tag: (receiving stage, microbatch,
// direction).
static int64_t message_of(const PpSchedule *s, const PpAction *a) {
    bool grad = a->kind == PP_SEND_GRAD || a->kind == PP_RECV_GRAD;
    int stage = a->kind == PP_SEND_ACT ? a->stage + 1 : a->kind == PP_RECV_GRAD ? a->stage + 1
                                                                               : a->stage;
    return 2 * ((int64_t)stage * s->microbatches + a->microbatch) + (grad ? 1 : 0);
}

static void post(Play *p, const PpAction *a) {
    int key = a->stage * p->s->microbatches + a->microbatch;
    if (a->kind == PP_RECV_ACT) region_acquire(p, key);
    bool send = a->kind == PP_SEND_ACT || a->kind == PP_SEND_GRAD;
    int op = p2p_add(p->prog, (P2pStep){.kind = send ? P2P_SEND : P2P_RECV, .peer = a->peer,
                                        .message = message_of(p->s, a),
                                        .stream = p2p_stream(p->streams, a->peer, send)});
    int *slot = a->kind == PP_RECV_ACT ? p->recv_x : a->kind == PP_RECV_GRAD ? p->recv_dy
                : a->kind == PP_SEND_ACT ? p->send_y : p->send_dx;
    slot[key] = op;
}

static void compute(Play *p, const PpAction *a) {
    int m = p->s->microbatches, key = a->stage * m + a->microbatch;
    switch (a->kind) {
    case PP_FORWARD:
        region_acquire(p, key);
        wait_for(p, p->recv_x[key]);
        if (!p->s->forward_only) break;
        if (local(p, a->stage - 1)) region_release(p, key - m);
        if (!local(p, a->stage + 1)) region_release(p, key);
        break;
    case PP_BACKWARD_WEIGHT: region_release(p, key); break;
    default:
        wait_for(p, p->recv_dy[key]);
        if (a->kind == PP_BACKWARD) region_release(p, key);
        break;
    }
}

static void rank_program(const PpSchedule *s, int rank, int regions, P2pStreams streams,
                         P2pProgram *prog) {
    size_t cells = (size_t)s->stages * (size_t)s->microbatches;
    Play p = {.s = s, .rank = rank, .prog = prog, .streams = streams,
              .region = xcalloc(cells, sizeof(int)),
              .recv_x = xcalloc(cells, sizeof(int)), .recv_dy = xcalloc(cells, sizeof(int)),
              .send_y = xcalloc(cells, sizeof(int)), .send_dx = xcalloc(cells, sizeof(int)),
              .holder = xcalloc((size_t)regions, sizeof(int)),
              .released = xcalloc((size_t)regions, sizeof(int))};
    for (size_t k = 0; k < cells; k++)
        p.region[k] = p.recv_x[k] = p.recv_dy[k] = p.send_y[k] = p.send_dx[k] = -1;
    for (int g = 0; g < regions; g++) {
        p.holder[g] = -1;
        p.released[p.n_released++] = g;
    }
    for (int i = 0; i < s->count[rank]; i++) {
        const PpAction *a = &s->actions[rank][i];
        if (a->kind >= PP_SEND_ACT) post(&p, a);
        else compute(&p, a);
    }
    for (int g = 0; g < regions; g++) region_drain(&p, g);
    free(p.region), free(p.recv_x), free(p.recv_dy), free(p.send_y), free(p.send_dx);
    free(p.holder), free(p.released);
}

bool pp_schedule_check_nccl(const PpSchedule *s, const int *regions, P2pStreams streams,
                            char *err, size_t n) {
    P2pProgram *progs = xcalloc((size_t)s->ranks, sizeof *progs);
    for (int r = 0; r < s->ranks; r++) rank_program(s, r, regions[r], streams, &progs[r]);
    bool ok = p2p_check_nccl(progs, s->ranks, err, n);
    for (int r = 0; r < s->ranks; r++) p2p_program_free(&progs[r]);
    free(progs);
    return ok;
}
