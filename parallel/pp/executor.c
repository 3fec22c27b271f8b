#include "parallel/pp/executor.h"

#include <stdlib.h>

#include "core/errors.h"

// One (stage, microbatch) in flight on this rank.
typedef struct {
    int region;                // -1: none held
    float *x;                  // (width) its input: received, or copied from the stage before
    float *y;                  // (width) its output, until sent or copied on
    float *dy;                 // (width) its output's gradient
    float *dx;                 // (width) its input's gradient, until sent or copied back
    CommHandle recv_x, recv_dy, send_y, send_dx;
} InFlight;

typedef struct {
    Arena arena;
    CommHandle *sends[2];      // its last holder's sends, waited for before it is reused
} Region;

struct PpExecutor {
    const PpSchedule *s;
    int rank;
    CommGroup *group;
    size_t width;
    const KernelOps *k;        // copies between stages on this rank
    const PpStageFns *fns;
    int n_regions;
    size_t region_bytes;
    Region *regions;
    int *released;             // (n_regions) FIFO of released regions, oldest first
    int n_released;
    InFlight *mbs;             // (stages * microbatches)
};

static bool stage_is_local(const PpExecutor *e, int stage) {
    return stage >= 0 && stage < e->s->stages && e->s->stage_rank[stage] == e->rank;
}

ArenaBytes pp_region_bytes(const PpSchedule *s, int rank, size_t width,
                           const PpStageFns *fns) {
    bool split = pp_rank_splits_backward(s, rank);
    ArenaBytes most = {0};
    for (int st = 0; st < s->stages; st++) {
        if (s->stage_rank[st] != rank) continue;
        Arena a;
        arena_init_sizing(&a, "pipeline region");
        const float *x = st > 0 ? arena_floats(&a, width) : NULL;
        fns->forward(fns, st, 0, 0, &a, x);
        if (s->forward_only) {
            if (a.peak.total > most.total) most = a.peak;
            continue;
        }
        const float *dy = st + 1 < s->stages ? arena_floats(&a, width) : NULL;
        if (split) {
            fns->backward(fns, st, 0, 0, &a, BLOCK_BACKWARD_INPUT, dy);
            fns->backward(fns, st, 0, 0, &a, BLOCK_BACKWARD_WEIGHT, NULL);
        } else {
            fns->backward(fns, st, 0, 0, &a, BLOCK_BACKWARD, dy);
        }
        if (a.peak.total > most.total) most = a.peak;
    }
    return most;
}

void pp_region_counts(const PpSchedule *s, const PpReport *r, int *regions) {
    // From the peak live count up: no rank runs with fewer regions than microbatches in flight.
    // With as many as (stage, microbatch) pairs no region is reused, and the plain check
    // passed, so the loop ends.
    int extra = 0;
    char err[512];
    do {
        for (int q = 0; q < s->ranks; q++) {
            int pairs = 0;
            for (int st = 0; st < s->stages; st++) pairs += s->stage_rank[st] == q;
            pairs *= s->microbatches;
            regions[q] = r->peak_live[q] + extra < pairs ? r->peak_live[q] + extra : pairs;
        }
        extra++;
    } while (!pp_schedule_check_regions(s, regions, err, sizeof err));
}

PpExecutor *pp_executor_create(const PpSchedule *s, const PpReport *r, int rank, int prev,
                               int next, CommGroup *group, size_t width, const KernelOps *k,
                               const PpStageFns *fns) {
    // The schedule's placements put neighbouring stages on neighbouring ranks.
    for (int i = 0; i < s->count[rank]; i++) {
        int peer = s->actions[rank][i].peer;
        CHECK(peer < 0 || peer == prev || peer == next);
    }
    comm_p2p_ring(group);
    PpExecutor *e = xcalloc(1, sizeof *e);
    int *regions = xcalloc((size_t)s->ranks, sizeof(int));
    pp_region_counts(s, r, regions);
    *e = (PpExecutor){.s = s, .rank = rank, .group = group, .width = width, .k = k, .fns = fns,
                      .n_regions = regions[rank]};
    free(regions);
    e->region_bytes = pp_region_bytes(s, rank, width, fns).total;
    e->regions = xcalloc((size_t)e->n_regions, sizeof(Region));
    e->released = xcalloc((size_t)e->n_regions, sizeof(int));
    e->mbs = xcalloc((size_t)s->stages * s->microbatches, sizeof(InFlight));
    return e;
}

void pp_executor_free(PpExecutor *e) {
    if (!e) return;
    free(e->regions);
    free(e->released);
    free(e->mbs);
    free(e);
}

// ---- regions -------------------------------------------------------------------------------

// Waits until the sends made from the region have left.
static void region_drain(Region *g) {
    for (int j = 0; j < 2; j++)
        if (g->sends[j]) comm_wait(g->sends[j]);
    g->sends[0] = g->sends[1] = NULL;
}

// The oldest released region, once its last holder's sends have left, for (stage, mb).
static void region_acquire(PpExecutor *e, int key) {
    InFlight *f = &e->mbs[key];
    if (f->region >= 0) return;
    // The checker played these regions (pp_region_counts): a shortfall is titan's bug.
    CHECK(e->n_released > 0);
    int i = e->released[0];
    for (int j = 1; j < e->n_released; j++) e->released[j - 1] = e->released[j];
    e->n_released--;
    Region *g = &e->regions[i];
    region_drain(g);
    arena_release(&g->arena, 0);
    f->region = i;
}

// The region's compute is done; its sends may still be leaving.
static void region_release(PpExecutor *e, int key) {
    InFlight *f = &e->mbs[key];
    Region *g = &e->regions[f->region];
    g->sends[0] = &f->send_y;
    g->sends[1] = &f->send_dx;
    e->released[e->n_released++] = f->region;
    f->region = -1;
}

static Arena *region_arena(PpExecutor *e, int key) {
    return &e->regions[e->mbs[key].region].arena;
}

// ---- actions -------------------------------------------------------------------------------

static int key_of(const PpExecutor *e, int stage, int mb) {
    return stage * e->s->microbatches + mb;
}

// Message tags: one per (stage, microbatch, direction), so a recv matches only its send.
static int tag_of(const PpExecutor *e, int stage, int mb, bool grad) {
    return 2 * key_of(e, stage, mb) + (grad ? 1 : 0);
}

static void run_forward(PpExecutor *e, int st, int mb) {
    int key = key_of(e, st, mb);
    InFlight *f = &e->mbs[key];
    region_acquire(e, key);
    Arena *a = region_arena(e, key);
    if (stage_is_local(e, st - 1)) {  // the previous stage ran here: its output, copied in
        f->x = arena_floats(a, e->width);
        e->k->copy(f->x, e->mbs[key_of(e, st - 1, mb)].y, e->width * sizeof(float));
    }
    comm_wait(&f->recv_x);
    f->y = e->fns->forward(e->fns, st, mb, f->region, a, f->x);
    if (!e->s->forward_only) return;
    // Evaluation keeps nothing for backward (check.c plays the same rule): the previous
    // stage's region once its output is copied in, this one's once its output is on its way.
    if (stage_is_local(e, st - 1)) region_release(e, key_of(e, st - 1, mb));
    if (!stage_is_local(e, st + 1)) region_release(e, key);
}

static void run_backward(PpExecutor *e, int st, int mb, PpActionKind kind) {
    int key = key_of(e, st, mb);
    InFlight *f = &e->mbs[key];
    Arena *a = region_arena(e, key);
    if (kind == PP_BACKWARD_WEIGHT) {
        e->fns->backward(e->fns, st, mb, f->region, a, BLOCK_BACKWARD_WEIGHT, NULL);
        region_release(e, key);
        return;
    }
    comm_wait(&f->recv_dy);
    BlockPhase phase = kind == PP_BACKWARD ? BLOCK_BACKWARD : BLOCK_BACKWARD_INPUT;
    f->dx = e->fns->backward(e->fns, st, mb, f->region, a, phase, f->dy);
    // The previous stage runs here: the gradient goes into its region now, as this region
    // may be reused before that stage's backward runs.
    if (stage_is_local(e, st - 1)) {
        InFlight *prev = &e->mbs[key_of(e, st - 1, mb)];
        prev->dy = arena_floats(region_arena(e, key_of(e, st - 1, mb)), e->width);
        e->k->copy(prev->dy, f->dx, e->width * sizeof(float));
    }
    if (kind == PP_BACKWARD) region_release(e, key);
}

static void run_comm(PpExecutor *e, const PpAction *act) {
    int key = key_of(e, act->stage, act->microbatch);
    InFlight *f = &e->mbs[key];
    int st = act->stage, mb = act->microbatch;
    switch (act->kind) {
    case PP_RECV_ACT:
        region_acquire(e, key);
        f->x = arena_floats(region_arena(e, key), e->width);
        f->recv_x = comm_recv_start(e->group, f->x, e->width, act->peer, tag_of(e, st, mb, false));
        break;
    case PP_RECV_GRAD:
        f->dy = arena_floats(region_arena(e, key), e->width);
        f->recv_dy = comm_recv_start(e->group, f->dy, e->width, act->peer,
                                     tag_of(e, st + 1, mb, true));
        break;
    case PP_SEND_ACT:
        f->send_y = comm_send_start(e->group, f->y, e->width, act->peer,
                                    tag_of(e, st + 1, mb, false));
        break;
    case PP_SEND_GRAD:
        f->send_dx = comm_send_start(e->group, f->dx, e->width, act->peer,
                                     tag_of(e, st, mb, true));
        break;
    default:
        CHECK(false);
    }
}

void pp_executor_step(PpExecutor *e, Arena *acts) {
    const PpSchedule *s = e->s;
    for (int k = 0; k < s->stages * s->microbatches; k++)
        e->mbs[k] = (InFlight){.region = -1};
    arena_release(acts, 0);
    e->n_released = 0;
    for (int i = 0; i < e->n_regions; i++) {
        char *base = arena_alloc(acts, e->region_bytes);
        CHECK(base != NULL);  // acts is committed with pp_region_counts' regions
        e->regions[i] = (Region){.arena = {.name = "pipeline region", .memory = acts->memory,
                                           .base = base, .size = e->region_bytes}};
        e->released[e->n_released++] = i;
    }
    for (int i = 0; i < s->count[e->rank]; i++) {
        const PpAction *a = &s->actions[e->rank][i];
        switch (a->kind) {
        case PP_FORWARD: run_forward(e, a->stage, a->microbatch); break;
        case PP_BACKWARD:
        case PP_BACKWARD_INPUT:
        case PP_BACKWARD_WEIGHT: run_backward(e, a->stage, a->microbatch, a->kind); break;
        default: run_comm(e, a); break;
        }
    }
    // The step ends with every send gone: the next one reuses the regions from scratch.
    for (int i = 0; i < e->n_regions; i++) region_drain(&e->regions[i]);
}
