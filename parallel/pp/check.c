// The schedule checker: every rank's action list runs as a process. Compute and sends never
// block (a send is buffered until its recv takes it); a recv blocks until its matching send
// was made. Ranks run round-robin until each is done or blocked; when none can move, the
// blocked ones are deadlocked. Times follow the cost model (cost.c) with free
// communication: a recv finishes at max(its rank's clock, the send's time).
//
// With a region count per rank it also plays the executor's memory (executor.h): a (stage,
// microbatch) takes an activation region at its RECV_F (or its F when it receives nothing)
// and gives it back after its B (or W); a rank reuses the oldest region given back, once the
// sends made from it have been received (the worst case of MPI, whose large sends complete
// only when received). The executor blocks on exactly these events, so a schedule that runs
// to the end here cannot deadlock or run out of regions on the ranks.
#include <stdlib.h>

#include "core/errors.h"
#include "parallel/pp/schedule.h"

typedef struct {
    const PpSchedule *s;
    // (stages*m) per (stage, microbatch): what has run, what arrived
    bool *f, *i, *w, *b, *act_in, *grad_in, *act_sent, *grad_sent;
    int64_t *act_time, *grad_time;  // when the send was made (-1: not yet, or taken)
    int *live;                      // (ranks) current live activations
    int *peak_live;                 // (ranks) the most, the report's
    int64_t *clock;                 // (ranks)
    // The region pool (regions NULL: not played): per rank a FIFO of given-back regions, each
    // the (stage * m + microbatch) that last held it (-1: never used); held per (stage, mb).
    const int *regions;             // (ranks) regions of each rank
    int **pool, *pool_len;          // (ranks)(regions[r]), (ranks)
    bool *held;                     // (stages*m)
    int *waits_for;                 // (ranks) the holder whose sends a blocked rank waits for
                                    // before reusing its region; -1: none
} Sim;

typedef enum { STEP_DONE, STEP_BLOCKED, STEP_ERROR } Step;

#define FAIL(...) (error_set(err, n, __VA_ARGS__), STEP_ERROR)

// Whether stage st's input (forward) or output gradient (backward) is on rank r: made there
// by the neighbouring stage, or received.
static bool input_ready(const Sim *z, int r, int st, int mb, bool backward) {
    const PpSchedule *s = z->s;
    int nb = backward ? st + 1 : st - 1, m = s->microbatches;
    if (nb < 0 || nb >= s->stages) return true;
    if (s->stage_rank[nb] != r) return backward ? z->grad_in[st * m + mb] : z->act_in[st * m + mb];
    return backward ? z->i[nb * m + mb] || z->b[nb * m + mb] : z->f[nb * m + mb];
}

// Whether what (stage, mb) = k sent from its region has been received.
static bool sends_received(const Sim *z, int k) {
    int m = z->s->microbatches;
    if (z->act_sent[k] && !z->act_in[k + m]) return false;
    if (z->grad_sent[k] && !z->grad_in[k - m]) return false;
    return true;
}

// k takes rank r's oldest given-back region, when its sends have left.
static Step region_take(Sim *z, int r, int k, const char *at, char *err, size_t n) {
    if (!z->regions || z->held[k]) return STEP_DONE;
    if (z->pool_len[r] == 0)
        return FAIL("%s: rank %d needs more than %d activation regions", at, r, z->regions[r]);
    int last = z->pool[r][0];
    if (last >= 0 && !sends_received(z, last)) {
        z->waits_for[r] = last;
        return STEP_BLOCKED;
    }
    z->waits_for[r] = -1;
    for (int j = 1; j < z->pool_len[r]; j++) z->pool[r][j - 1] = z->pool[r][j];
    z->pool_len[r]--;
    z->held[k] = true;
    return STEP_DONE;
}

static void region_give_back(Sim *z, int r, int k) {
    if (!z->regions) return;
    z->held[k] = false;
    z->pool[r][z->pool_len[r]++] = k;
}

// Evaluation keeps nothing for backward: a forward's region is given back once its output has
// left it, sent (the next stage on another rank, or none) or copied into the next stage's
// region by that stage's forward here.
static void forward_done(Sim *z, int r, int st, int mb) {
    const PpSchedule *s = z->s;
    int m = s->microbatches;
    if (st > 0 && s->stage_rank[st - 1] == r) {
        region_give_back(z, r, (st - 1) * m + mb);
        z->live[r]--;
    }
    if (st + 1 == s->stages || s->stage_rank[st + 1] != r) {
        region_give_back(z, r, st * m + mb);
        z->live[r]--;
    }
}

static Step run_compute(Sim *z, int r, const PpAction *a, const char *at, char *err, size_t n) {
    int k = a->stage * z->s->microbatches + a->microbatch;
    bool backward = a->kind != PP_FORWARD;
    bool dup = a->kind == PP_FORWARD           ? z->f[k]
               : a->kind == PP_BACKWARD_WEIGHT ? z->w[k] || z->b[k]
                                               : z->i[k] || z->b[k];
    if (dup) return FAIL("%s: runs a second time", at);
    if (backward && z->s->forward_only) return FAIL("%s: a backward in evaluation", at);
    if (backward && !z->f[k]) return FAIL("%s: runs before its forward", at);
    if (a->kind == PP_BACKWARD_WEIGHT && !z->i[k])
        return FAIL("%s: runs before its backward-input (I)", at);
    if (a->kind != PP_BACKWARD_WEIGHT && !input_ready(z, r, a->stage, a->microbatch, backward))
        return FAIL("%s: runs before its %s arrives (no matching %s before it)", at,
                    backward ? "output gradient" : "input activation",
                    backward ? "RECV_B or backward of the next stage"
                             : "RECV_F or forward of the previous stage");
    if (a->kind == PP_FORWARD) {
        Step taken = region_take(z, r, k, at, err, n);
        if (taken != STEP_DONE) return taken;
    }
    bool *flag = a->kind == PP_FORWARD ? z->f : a->kind == PP_BACKWARD_INPUT ? z->i
                 : a->kind == PP_BACKWARD_WEIGHT ? z->w : z->b;
    flag[k] = true;
    if (a->kind == PP_BACKWARD || a->kind == PP_BACKWARD_WEIGHT) region_give_back(z, r, k);
    z->live[r] += a->kind == PP_FORWARD ? 1 : a->kind == PP_BACKWARD_INPUT ? 0 : -1;
    if (z->live[r] > z->peak_live[r]) z->peak_live[r] = z->live[r];
    if (a->kind == PP_FORWARD && z->s->forward_only) forward_done(z, r, a->stage, a->microbatch);
    z->clock[r] += pp_action_cost(a->kind);
    return STEP_DONE;
}

static Step run_comm(Sim *z, int r, const PpAction *a, const char *at, char *err, size_t n) {
    const PpSchedule *s = z->s;
    bool act = a->kind == PP_SEND_ACT || a->kind == PP_RECV_ACT;
    bool send = a->kind == PP_SEND_ACT || a->kind == PP_SEND_GRAD;
    // A send goes to the neighbour stage the data is for; a recv names its own stage.
    int other = act == send ? a->stage + 1 : a->stage - 1;
    if (other < 0 || other >= s->stages)
        return FAIL("%s: stage %d has no %s stage", at, a->stage, other < 0 ? "previous" : "next");
    if (a->peer != s->stage_rank[other] || a->peer == r)
        return FAIL("%s: peer rank %d does not hold stage %d (rank %d does)", at, a->peer, other,
                    s->stage_rank[other]);
    int m = s->microbatches, k = a->stage * m + a->microbatch;
    if (send) {
        bool made = act ? z->f[k] : z->i[k] || z->b[k];
        bool *sent = act ? z->act_sent : z->grad_sent;
        if (!made) return FAIL("%s: sends before its %s runs", at, act ? "forward" : "backward");
        if (sent[k]) return FAIL("%s: sends a second time", at);
        sent[k] = true;
        int to = other * m + a->microbatch;  // kept under the receiving stage's index
        (act ? z->act_time : z->grad_time)[to] = z->clock[r];
        return STEP_DONE;
    }
    int64_t *t = act ? z->act_time : z->grad_time;
    bool *in = act ? z->act_in : z->grad_in;
    if (in[k]) return FAIL("%s: receives a second time", at);
    if (act) {  // the executor receives a stage's input into the region it runs in
        Step taken = region_take(z, r, k, at, err, n);
        if (taken != STEP_DONE) return taken;
    }
    if (t[k] < 0) return STEP_BLOCKED;
    if (t[k] > z->clock[r]) z->clock[r] = t[k];
    t[k] = -1;
    in[k] = true;
    return STEP_DONE;
}

static Step run_action(Sim *z, int r, int idx, const PpAction *a, char *err, size_t n) {
    const PpSchedule *s = z->s;
    char name[48], at[96];
    snprintf(at, sizeof at, "rank %d, action %d (%s)", r, idx,
             pp_action_name(a, name, sizeof name));
    if (a->stage < 0 || a->stage >= s->stages || a->microbatch < 0 ||
        a->microbatch >= s->microbatches)
        return FAIL("%s: no such stage or microbatch (%d stages, %d microbatches)", at, s->stages,
                    s->microbatches);
    if (s->stage_rank[a->stage] != r)
        return FAIL("%s: stage %d is on rank %d", at, a->stage, s->stage_rank[a->stage]);
    return a->kind >= PP_SEND_ACT ? run_comm(z, r, a, at, err, n)
                                  : run_compute(z, r, a, at, err, n);
}

// After every rank finished: every send was received, and each (stage, microbatch) ran F and
// B (or I and W).
static bool check_complete(const Sim *z, char *err, size_t n) {
    const PpSchedule *s = z->s;
    int m = s->microbatches;
    for (int st = 0; st < s->stages; st++)
        for (int mb = 0; mb < m; mb++) {
            int k = st * m + mb, r = s->stage_rank[st];
            if (!z->f[k]) return error_set(err, n, "rank %d never runs F%d.%d", r, st, mb);
            if (z->act_sent[k] && !z->act_in[k + m])
                return error_set(err, n, "rank %d's SEND_F%d.%d is never received by rank %d", r,
                                 st, mb, s->stage_rank[st + 1]);
            if (z->grad_sent[k] && !z->grad_in[k - m])
                return error_set(err, n, "rank %d's SEND_B%d.%d is never received by rank %d", r,
                                 st, mb, s->stage_rank[st - 1]);
            if (!z->b[k] && !z->i[k] && !s->forward_only)
                return error_set(err, n, "rank %d never runs the backward (B or I) of %d.%d", r,
                                 st, mb);
            if (z->i[k] && !z->w[k])
                return error_set(err, n, "rank %d never runs W%d.%d", r, st, mb);
        }
    return true;
}

static bool simulate(Sim *z, PpReport *rep, int *pc, char *err, size_t n) {
    const PpSchedule *s = z->s;
    for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < s->ranks; r++)
            while (pc[r] < s->count[r]) {
                const PpAction *a = &s->actions[r][pc[r]];
                int64_t before = z->clock[r];
                Step st = run_action(z, r, pc[r], a, err, n);
                if (st == STEP_ERROR) return false;
                if (st == STEP_BLOCKED) break;
                rep->start[r][pc[r]++] = a->kind >= PP_SEND_ACT ? z->clock[r] : before;
                moved = true;
            }
    }
    for (int r = 0; r < s->ranks; r++)
        if (pc[r] < s->count[r]) {
            char name[48];
            int stuck = 0;
            for (int q = 0; q < s->ranks; q++) stuck += pc[q] < s->count[q];
            int last = z->waits_for[r], m = s->microbatches;
            if (last >= 0)
                return error_set(err, n, "deadlock: rank %d is stuck at action %d (%s), waiting "
                                 "for its oldest free activation region of %d, whose sends of "
                                 "%d.%d are never received (%d of %d ranks blocked)", r, pc[r],
                                 pp_action_name(&s->actions[r][pc[r]], name, sizeof name),
                                 z->regions[r], last / m, last % m, stuck, s->ranks);
            return error_set(err, n, "deadlock: rank %d is stuck at action %d (%s), waiting for "
                             "a send that never comes (%d of %d ranks blocked)", r, pc[r],
                             pp_action_name(&s->actions[r][pc[r]], name, sizeof name), stuck,
                             s->ranks);
        }
    return check_complete(z, err, n);
}

static bool check_run(const PpSchedule *s, const int *regions, PpReport *rep, char *err,
                      size_t n) {
    size_t cells = (size_t)s->stages * (size_t)s->microbatches;
    Sim z = {.s = s, .regions = regions};
    bool **flags[] = {&z.f, &z.i, &z.w, &z.b, &z.act_in, &z.grad_in, &z.act_sent, &z.grad_sent,
                      &z.held};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (!(*flags[i] = calloc(cells, 1))) die_internal(__FILE__, __LINE__, "out of memory");
    z.act_time = malloc(cells * sizeof(int64_t));
    z.grad_time = malloc(cells * sizeof(int64_t));
    z.live = calloc((size_t)s->ranks, sizeof(int));
    z.clock = calloc((size_t)s->ranks, sizeof(int64_t));
    z.pool = xcalloc((size_t)s->ranks, sizeof(int *));
    z.pool_len = xcalloc((size_t)s->ranks, sizeof(int));
    z.waits_for = xcalloc((size_t)s->ranks, sizeof(int));
    for (int r = 0; r < s->ranks; r++) z.waits_for[r] = -1;
    for (int r = 0; r < s->ranks && regions; r++) {
        z.pool[r] = xcalloc((size_t)regions[r] + 1, sizeof(int));
        for (int j = 0; j < regions[r]; j++) z.pool[r][z.pool_len[r]++] = -1;
    }
    int *pc = calloc((size_t)s->ranks, sizeof(int));
    *rep = (PpReport){.ranks = s->ranks,
                      .peak_live = calloc((size_t)s->ranks, sizeof(int)),
                      .start = calloc((size_t)s->ranks, sizeof(int64_t *))};
    if (!z.act_time || !z.grad_time || !z.live || !z.clock || !pc || !rep->peak_live ||
        !rep->start)
        die_internal(__FILE__, __LINE__, "out of memory");
    z.peak_live = rep->peak_live;
    for (size_t i = 0; i < cells; i++) z.act_time[i] = z.grad_time[i] = -1;
    for (int r = 0; r < s->ranks; r++) {
        rep->start[r] = calloc((size_t)s->count[r] + 1, sizeof(int64_t));
        if (!rep->start[r]) die_internal(__FILE__, __LINE__, "out of memory");
    }
    bool ok = simulate(&z, rep, pc, err, n);
    for (int r = 0; r < s->ranks; r++) {
        int64_t busy = 0;
        for (int i = 0; i < s->count[r]; i++) busy += pp_action_cost(s->actions[r][i].kind);
        rep->busy += busy;
        if (z.clock[r] > rep->makespan) rep->makespan = z.clock[r];
    }
    rep->idle = (int64_t)s->ranks * rep->makespan - rep->busy;
    rep->bubble = rep->makespan ? (double)rep->idle / ((double)s->ranks * rep->makespan) : 0;
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) free(*flags[i]);
    for (int r = 0; r < s->ranks; r++) free(z.pool[r]);
    free(z.pool), free(z.pool_len), free(z.waits_for);
    free(z.act_time), free(z.grad_time), free(z.live), free(z.clock), free(pc);
    if (!ok) pp_report_free(rep);
    return ok;
}

bool pp_schedule_check(const PpSchedule *s, PpReport *rep, char *err, size_t n) {
    return check_run(s, NULL, rep, err, n);
}

bool pp_schedule_check_regions(const PpSchedule *s, const int *regions, char *err, size_t n) {
    PpReport rep;
    bool ok = check_run(s, regions, &rep, err, n);
    if (ok) pp_report_free(&rep);
    return ok;
}



void pp_report_free(PpReport *r) {
    for (int i = 0; r->start && i < r->ranks; i++) free(r->start[i]);
    free(r->peak_live);
    free(r->start);
    *r = (PpReport){0};
}

bool pp_schedule_channels_in_order(const PpSchedule *s, char *err, size_t n) {
    for (int b = 0; b < s->ranks; b++)
        for (int a = 0; a < s->ranks; a++) {
            if (a == b) continue;
            int j = 0;  // the next of a's sends to b
            for (int i = 0; i < s->count[b]; i++) {
                const PpAction *recv = &s->actions[b][i];
                if (recv->peer != a || (recv->kind != PP_RECV_ACT && recv->kind != PP_RECV_GRAD))
                    continue;
                while (j < s->count[a] && !((s->actions[a][j].kind == PP_SEND_ACT ||
                                             s->actions[a][j].kind == PP_SEND_GRAD) &&
                                            s->actions[a][j].peer == b))
                    j++;
                if (j == s->count[a]) break;  // unmatched: pp_schedule_check names it
                if (!pp_sends_message(&s->actions[a][j], recv)) {
                    char got[48], sent[48];
                    return error_set(err, n, "rank %d, action %d (%s): rank %d sends %s first, "
                                     "and NCCL matches a pair's messages in order", b, i,
                                     pp_action_name(recv, got, sizeof got), a,
                                     pp_action_name(&s->actions[a][j], sent, sizeof sent));
                }
                j++;
            }
        }
    return true;
}
