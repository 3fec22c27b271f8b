// Schedule generators and torchtitan's CSV format. Generators emit each rank's compute order;
// pp_add_comms then puts a recv right before each compute that needs another rank's data and
// a send right after each compute another rank waits for. Sends never block (buffered), so a
// compute order that respects the dependencies cannot deadlock; the checker proves it anyway.
#include "parallel/pp/schedule.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

static void sched_init(PpSchedule *s, int ranks, int stages, int m) {
    *s = (PpSchedule){.ranks = ranks, .stages = stages, .microbatches = m};
    s->stage_rank = xcalloc((size_t)stages, sizeof(int));
    s->count = xcalloc((size_t)ranks, sizeof(int));
    s->capacity = xcalloc((size_t)ranks, sizeof(int));
    s->actions = xcalloc((size_t)ranks, sizeof(PpAction *));
}

void pp_schedule_free(PpSchedule *s) {
    for (int r = 0; r < s->ranks && s->actions; r++) free(s->actions[r]);
    free(s->actions);
    free(s->count);
    free(s->capacity);
    free(s->stage_rank);
    *s = (PpSchedule){0};
}

static void push(PpSchedule *s, int r, PpActionKind kind, int stage, int mb, int peer) {
    if (s->count[r] == s->capacity[r]) {
        s->capacity[r] = s->capacity[r] ? 2 * s->capacity[r] : 64;
        s->actions[r] = realloc(s->actions[r], (size_t)s->capacity[r] * sizeof(PpAction));
        if (!s->actions[r]) die_internal(__FILE__, __LINE__, "out of memory");
    }
    s->actions[r][s->count[r]++] = (PpAction){kind, stage, mb, peer};
}

static bool is_comm(PpActionKind k) { return k >= PP_SEND_ACT; }
static bool is_send(PpActionKind k) { return k == PP_SEND_ACT || k == PP_SEND_GRAD; }

bool pp_sends_message(const PpAction *send, const PpAction *recv) {
    if (send->kind == PP_SEND_ACT)
        return recv->kind == PP_RECV_ACT && recv->stage == send->stage + 1 &&
               recv->microbatch == send->microbatch;
    return send->kind == PP_SEND_GRAD && recv->kind == PP_RECV_GRAD &&
           recv->stage == send->stage - 1 && recv->microbatch == send->microbatch;
}

bool pp_rank_splits_backward(const PpSchedule *s, int rank) {
    for (int i = 0; i < s->count[rank]; i++)
        if (s->actions[rank][i].kind == PP_BACKWARD_INPUT) return true;
    return false;
}

// NCCL has no tags: a pair's sends and receives match in the order they are issued. So each
// rank receives from a peer in the order the peer sends: a receive needed later is posted
// early, right before the one it was sent ahead of. Never later than before, so no rank waits
// longer; the checker then proves the result again.
static void order_receives(PpSchedule *s) {
    for (int r = 0; r < s->ranks; r++) {
        PpAction *old = s->actions[r];
        int n = s->count[r];
        bool *posted = xcalloc((size_t)n + 1, 1);
        s->actions[r] = NULL;
        s->count[r] = s->capacity[r] = 0;
        for (int i = 0; i < n; i++) {
            if (posted[i]) continue;
            if (!is_comm(old[i].kind) || is_send(old[i].kind)) {
                push(s, r, old[i].kind, old[i].stage, old[i].microbatch, old[i].peer);
                continue;
            }
            // The peer's sends to r in its order (only receives move, so its list is final):
            // each one's receive, up to this one.
            int from = old[i].peer;
            const PpAction *sends = s->actions[from];
            for (int j = 0; j < s->count[from] && !posted[i]; j++) {
                if (!is_send(sends[j].kind) || sends[j].peer != r) continue;
                for (int k = i; k < n; k++)
                    if (!posted[k] && old[k].peer == from && pp_sends_message(&sends[j], &old[k])) {
                        push(s, r, old[k].kind, old[k].stage, old[k].microbatch, from);
                        posted[k] = true;
                        break;
                    }
            }
            if (!posted[i])  // nobody sends it: left where it was, for the checker to name
                push(s, r, old[i].kind, old[i].stage, old[i].microbatch, from);
        }
        free(posted);
        free(old);
    }
}

// Recv before, send after: each compute action's data from and to other ranks, each rank
// receiving from a peer in the order the peer sends (order_receives).
static void pp_add_comms(PpSchedule *s) {
    for (int r = 0; r < s->ranks; r++) {
        PpAction *compute = s->actions[r];
        int n = s->count[r];
        s->actions[r] = NULL;
        s->count[r] = s->capacity[r] = 0;
        for (int i = 0; i < n; i++) {
            PpAction a = compute[i];
            int prev = a.stage > 0 ? s->stage_rank[a.stage - 1] : r;
            int next = a.stage < s->stages - 1 ? s->stage_rank[a.stage + 1] : r;
            bool fwd = a.kind == PP_FORWARD;
            bool bwd = a.kind == PP_BACKWARD || a.kind == PP_BACKWARD_INPUT;
            if (fwd && prev != r) push(s, r, PP_RECV_ACT, a.stage, a.microbatch, prev);
            if (bwd && next != r) push(s, r, PP_RECV_GRAD, a.stage, a.microbatch, next);
            push(s, r, a.kind, a.stage, a.microbatch, -1);
            if (fwd && next != r) push(s, r, PP_SEND_ACT, a.stage, a.microbatch, next);
            if (bwd && prev != r) push(s, r, PP_SEND_GRAD, a.stage, a.microbatch, prev);
        }
        free(compute);
    }
    order_receives(s);
}

// Loop placement: stage j*pp + r on rank r. V placement: rank r holds r and 2pp-1-r, so the
// first and last stage share rank 0 and the turn of the V needs no communication.
static void place(PpSchedule *s, bool v_shape) {
    int pp = s->ranks;
    for (int st = 0; st < s->stages; st++)
        s->stage_rank[st] = v_shape && st >= pp ? 2 * pp - 1 - st : st % pp;
}

// GPipe (v = 1) and LoopedBFS: every microbatch forward through each local stage in turn,
// then every backward in reverse stage order.
static void gen_looped_bfs(PpSchedule *s, int v) {
    int pp = s->ranks, m = s->microbatches;
    for (int r = 0; r < pp; r++) {
        for (int j = 0; j < v; j++)
            for (int mb = 0; mb < m; mb++) push(s, r, PP_FORWARD, j * pp + r, mb, -1);
        for (int j = v - 1; j >= 0; j--)
            for (int mb = 0; mb < m; mb++) push(s, r, PP_BACKWARD, j * pp + r, mb, -1);
    }
}

// The k-th forward (or backward) of rank r under Megatron's interleaving (Narayanan et al.
// 2021): microbatches go in groups of pp through one local stage after another.
static void interleaved_op(int pp, int v, int r, int k, bool backward, int *stage, int *mb) {
    int group = k / (pp * v), within = k % (pp * v), chunk = within / pp;
    if (backward) chunk = v - 1 - chunk;
    *stage = chunk * pp + r;
    *mb = group * pp + within % pp;
}

// 1F1B (v = 1: warmup pp-1-r forwards) and Interleaved1F1B (warmup (v-1)pp + 2(pp-1-r)):
// warmup forwards, then one forward and one backward in turn, then the remaining backwards.
static void gen_1f1b(PpSchedule *s, int v) {
    int pp = s->ranks, total = v * s->microbatches;
    for (int r = 0; r < pp; r++) {
        int warmup = v == 1 ? pp - 1 - r : (v - 1) * pp + 2 * (pp - 1 - r);
        if (warmup > total) warmup = total;
        int f = 0, b = 0, st, mb;
        for (; f < warmup; f++) {
            interleaved_op(pp, v, r, f, false, &st, &mb);
            push(s, r, PP_FORWARD, st, mb, -1);
        }
        while (b < total) {
            if (f < total) {
                interleaved_op(pp, v, r, f++, false, &st, &mb);
                push(s, r, PP_FORWARD, st, mb, -1);
            }
            interleaved_op(pp, v, r, b++, true, &st, &mb);
            push(s, r, PP_BACKWARD, st, mb, -1);
        }
    }
}

// Zero-bubble schedules (Qi et al. 2023) as a list schedule in unit time (F = I = W = 1):
// whenever a rank is free it runs a ready I (the gradient the previous stage waits for), else
// a ready F, else the oldest deferred W, so weight gradients fill what would be bubbles. A
// rank takes a new microbatch in (F of its first stage, stage r under both placements) only
// while it holds fewer than `stages` live activations (forwarded, W not yet run): 1F1B's bound
// on rank 0, so deferred Ws cannot pile up with the microbatch count. Used with loop placement
// (InterleavedZeroBubble) and V placement (ZBVZeroBubble).
typedef struct {
    int64_t *f_end, *i_end, *w_end;  // (stages*m) finish time, -1 until scheduled
} ZbState;

static bool zb_ready(int64_t end, int64_t t) { return end >= 0 && end <= t; }

static bool zb_pick(const PpSchedule *s, const ZbState *z, int r, int64_t t, PpActionKind *kind,
                    int *stage, int *mb) {
    int S = s->stages, m = s->microbatches, live = 0;
    for (int i = 0; i < S * m; i++)
        live += s->stage_rank[i / m] == r && z->f_end[i] >= 0 && z->w_end[i] < 0;
    for (int k = 0; k < 2; k++)  // k = 0: I; k = 1: F; ties go to the later stage
        for (int b = 0; b < m; b++)
            for (int st = S - 1; st >= 0; st--) {
                if (s->stage_rank[st] != r) continue;
                int i = st * m + b;
                bool ok = k == 0 ? z->i_end[i] < 0 && zb_ready(z->f_end[i], t) &&
                                       (st == S - 1 || zb_ready(z->i_end[i + m], t))
                                 : z->f_end[i] < 0 && (st == 0 || zb_ready(z->f_end[i - m], t)) &&
                                       (st != r || live < S);
                if (ok) {
                    *kind = k == 0 ? PP_BACKWARD_INPUT : PP_FORWARD;
                    *stage = st, *mb = b;
                    return true;
                }
            }
    int64_t oldest = -1;
    for (int i = 0; i < S * m; i++)
        if (s->stage_rank[i / m] == r && z->w_end[i] < 0 && zb_ready(z->i_end[i], t) &&
            (oldest < 0 || z->i_end[i] < z->i_end[oldest]))
            oldest = i;
    if (oldest < 0) return false;
    *kind = PP_BACKWARD_WEIGHT, *stage = (int)(oldest / m), *mb = (int)(oldest % m);
    return true;
}

static void gen_zero_bubble(PpSchedule *s) {
    int S = s->stages, m = s->microbatches, left = 3 * S * m;
    ZbState z = {xcalloc((size_t)(S * m), 8), xcalloc((size_t)(S * m), 8),
                 xcalloc((size_t)(S * m), 8)};
    for (int i = 0; i < S * m; i++) z.f_end[i] = z.i_end[i] = z.w_end[i] = -1;
    for (int64_t t = 0; left > 0; t++) {
        if (t > 3 * (int64_t)S * m) die_internal(__FILE__, __LINE__, "zero-bubble list stalls");
        for (int r = 0; r < s->ranks; r++) {
            PpActionKind kind;
            int st, mb;
            if (!zb_pick(s, &z, r, t, &kind, &st, &mb)) continue;
            int64_t *end = kind == PP_FORWARD ? z.f_end
                           : kind == PP_BACKWARD_INPUT ? z.i_end : z.w_end;
            end[st * m + mb] = t + 1;
            push(s, r, kind, st, mb, -1);
            left--;
        }
    }
    free(z.f_end), free(z.i_end), free(z.w_end);
}

// DualPipeV: DeepSeek-V3's DualPipe (arXiv 2412.19437) cut in half onto the V placement, in
// the per-rank order torch.distributed.pipelining's ScheduleDualPipeV gives. Each rank runs its
// own fixed list (no list scheduling): the steady state pairs a forward of one leg of the V
// with a full backward of the other, so that on a GPU one's communication hides behind the
// other's compute; warmup and cooldown split backwards into I and W so the deferred Ws fill
// the bubbles at both ends.
enum { DV_DOWN, DV_UP };  // a rank's two stages: r on the V's way down, 2pp-1-r on its way up

typedef struct {
    PpSchedule *s;
    int rank;
    int stage[2];             // (DV_DOWN, DV_UP) the rank's stages
    int next_f[2], next_b[2]; // the microbatch each stage forwards, backwards next
    int *deferred;            // (2m) Ws still to run, oldest first, as leg * m + microbatch
    int head, tail;
} DualRank;

static void dv_forward(DualRank *d, int leg) {
    push(d->s, d->rank, PP_FORWARD, d->stage[leg], d->next_f[leg]++, -1);
}

// split: only I now, its W queued for later (zero-bubble style); else a full B.
static void dv_backward(DualRank *d, int leg, bool split) {
    int mb = d->next_b[leg]++;
    push(d->s, d->rank, split ? PP_BACKWARD_INPUT : PP_BACKWARD, d->stage[leg], mb, -1);
    if (split) d->deferred[d->tail++] = leg * d->s->microbatches + mb;
}

// The oldest deferred W, if any.
static void dv_weight(DualRank *d) {
    if (d->head == d->tail) return;
    int k = d->deferred[d->head++], m = d->s->microbatches;
    push(d->s, d->rank, PP_BACKWARD_WEIGHT, d->stage[k / m], k % m, -1);
}

// PyTorch's OVERLAP_F_B: one leg's forward overlapped with the other leg's full backward.
// titan has no fused action; the executor runs the two back to back, forward first, the
// order PyTorch's runtime performs the pair's sub-actions in.
static void dv_overlapped(DualRank *d, int forward_leg) {
    dv_forward(d, forward_leg);
    dv_backward(d, !forward_leg, false);
}

// Rank r first fills the V: 2(pp-1-r) forwards down, then r+1 down-up pairs (the up leg's
// first microbatches come back from rank r+1 in time), then pp-1-r rounds of I, W, F up.
static void dv_warmup(DualRank *d, int pp) {
    int r = d->rank;
    for (int i = 0; i < 2 * (pp - 1 - r); i++) dv_forward(d, DV_DOWN);
    for (int i = 0; i <= r; i++) dv_forward(d, DV_DOWN), dv_forward(d, DV_UP);
    for (int i = 0; i < pp - 1 - r; i++) {
        dv_backward(d, DV_UP, true);
        dv_weight(d);
        dv_forward(d, DV_UP);
    }
}

// Steady state: F down + B up, F up + B down, m - 2pp + r + 1 times (PyTorch leaves the last
// rank's first F down, B up pair unoverlapped; the order is the same); then pp-1-r rounds of
// B up, F up + B down while the up leg's last forwards drain.
static void dv_steady(DualRank *d, int pp) {
    int r = d->rank, m = d->s->microbatches;
    for (int i = 0; i < m - 2 * pp + r + 1; i++)
        dv_overlapped(d, DV_DOWN), dv_overlapped(d, DV_UP);
    for (int i = 0; i < pp - 1 - r; i++) dv_backward(d, DV_UP, false), dv_overlapped(d, DV_UP);
}

// Cooldown: r+1 backward pairs (up, then down), of whose 2(r+1) backwards the second half are
// split; then pp-1-r rounds of a deferred W and an I down; then the remaining Ws.
static void dv_cooldown(DualRank *d, int pp) {
    int r = d->rank;
    for (int j = 0; j < 2 * (r + 1); j++) dv_backward(d, j % 2 ? DV_DOWN : DV_UP, j > r);
    for (int i = 0; i < pp - 1 - r; i++) dv_weight(d), dv_backward(d, DV_DOWN, true);
    while (d->head < d->tail) dv_weight(d);
}

static void gen_dualpipev(PpSchedule *s) {
    int pp = s->ranks;
    for (int r = 0; r < pp; r++) {
        DualRank d = {.s = s, .rank = r,
                      .deferred = xcalloc(2 * (size_t)s->microbatches, sizeof(int))};
        for (int st = 0; st < s->stages; st++)  // the two stages place() gave rank r
            if (s->stage_rank[st] == r) d.stage[st < pp ? DV_DOWN : DV_UP] = st;
        dv_warmup(&d, pp);
        dv_steady(&d, pp);
        dv_cooldown(&d, pp);
        free(d.deferred);
    }
}

// Evaluation's order, a list schedule in unit time as the zero-bubble one: whenever a rank is
// free it runs a ready forward, the latest stage first (its output then leaves the rank, and
// its region with it), the oldest microbatch first. Microbatches overlap across the stages of
// interleaved and V placements instead of each crossing the whole pipeline alone.
void pp_schedule_forward_only(PpSchedule *s, const PpSchedule *train, int m) {
    sched_init(s, train->ranks, train->stages, m);
    s->forward_only = true;
    int S = s->stages, left = S * m;
    for (int st = 0; st < S; st++) s->stage_rank[st] = train->stage_rank[st];
    int64_t *end = xcalloc((size_t)S * m, sizeof(int64_t));  // finish time; -1: not yet run
    for (int i = 0; i < S * m; i++) end[i] = -1;
    for (int64_t t = 0; left > 0; t++)
        for (int r = 0; r < s->ranks; r++) {
            int pick = -1;
            for (int st = S - 1; st >= 0 && pick < 0; st--)
                for (int mb = 0; mb < m && pick < 0 && s->stage_rank[st] == r; mb++)
                    if (end[st * m + mb] < 0 &&
                        (st == 0 || zb_ready(end[(st - 1) * m + mb], t)))
                        pick = st * m + mb;
            if (pick < 0) continue;
            end[pick] = t + 1;
            push(s, r, PP_FORWARD, pick / m, pick % m, -1);
            left--;
        }
    free(end);
    pp_add_comms(s);
}

bool pp_schedule_generate(PpSchedule *s, const char *name, int pp, int m, int v, char *err,
                          size_t n) {
    if (pp < 1 || m < 1)
        return error_set(err, n, "a pipeline needs at least 1 rank and 1 microbatch (got pp=%d, "
                         "%d microbatches)", pp, m);
    bool gpipe = !strcmp(name, "GPipe"), one = !strcmp(name, "1F1B"),
         interleaved = !strcmp(name, "Interleaved1F1B"), bfs = !strcmp(name, "LoopedBFS"),
         zb = !strcmp(name, "InterleavedZeroBubble"), zbv = !strcmp(name, "ZBVZeroBubble"),
         dual = !strcmp(name, "DualPipeV");
    if (!(gpipe || one || interleaved || bfs || zb || zbv || dual))
        return error_set(err, n, "unknown pipeline schedule '%s'", name);
    // Rank 0 forwards 2pp-1 microbatches down the V before its first backward and runs its
    // steady state m-2pp+1 times; PyTorch refuses fewer microbatches than stages.
    if (dual && m < 2 * pp)
        return error_set(err, n, "DualPipeV needs at least as many microbatches (%d) as stages "
                         "(2 x pipeline_parallel_degree = %d)", m, 2 * pp);
    // Megatron's interleaving sends microbatches through each local stage in groups of pp.
    if (interleaved && m % pp != 0)
        return error_set(err, n, "Interleaved1F1B needs the microbatch count (%d) to be a "
                         "multiple of pipeline_parallel_degree (%d)", m, pp);
    bool single = gpipe || one, v_shape = zbv || dual;
    int want = single ? 1 : 2;
    if (v == 0) v = want;
    if ((single || v_shape) ? v != want : v < 2)
        return error_set(err, n, "pipeline schedule %s runs %s%d stages per rank, not %d", name,
                         single || v_shape ? "" : "at least ", want, v);
    sched_init(s, pp, v * pp, m);
    place(s, zbv || dual);
    if (gpipe || bfs) gen_looped_bfs(s, v);
    else if (one || interleaved) gen_1f1b(s, v);
    else if (dual) gen_dualpipev(s);
    else gen_zero_bubble(s);
    pp_add_comms(s);
    return true;
}

static const char *const KIND_NAMES[] = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B",
                                         "RECV_B"};

const char *pp_action_name(const PpAction *a, char *buf, size_t n) {
    snprintf(buf, n, "%s%d.%d", KIND_NAMES[a->kind], a->stage, a->microbatch);
    return buf;
}

// torchtitan's CSV (torch.distributed.pipelining's _Action strings): row r is rank r's list;
// a cell is <stage><type><microbatch>. UNSHARD and RESHARD are FSDP hints, not pipeline
// order: accepted and skipped.
#define CSV_MAX_STAGES 4096
#define CSV_MAX_MICROBATCHES (1 << 20)

static bool csv_cell(PpSchedule *s, int r, const char *cell, size_t len, int *stage_rank,
                     const char *where, char *err, size_t n) {
    static const char *const TYPES[] = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B",
                                        "RECV_B"};
    // The longest action: a 4-digit stage, RECV_B, a 7-digit microbatch. A longer cell is
    // refused whole, not cut to its start.
    char buf[64], q[96];
    if (len >= sizeof buf) {
        memcpy(buf, cell, sizeof buf - 1), buf[sizeof buf - 1] = 0;
        return error_set(err, n, "%s: a cell of %zu characters (%s...) is not an action like "
                         "0F1 or 1SEND_B0", where, len, error_quote(q, sizeof q, buf));
    }
    memcpy(buf, cell, len), buf[len] = 0;
    char *p = buf, *end;
    long st = strtol(p, &end, 10);
    size_t tl = strspn(end, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
    if (end == p || tl == 0)
        return error_set(err, n, "%s: %s is not an action like 0F1 or 1SEND_B0", where,
                         error_quote(q, sizeof q, buf));
    // torch's _Action: <stage>UNSHARD or <stage>RESHARD, a microbatch index optional.
    bool fsdp_hint = tl == 7 && (!strncmp(end, "UNSHARD", 7) || !strncmp(end, "RESHARD", 7));
    if (fsdp_hint && strspn(end + tl, "0123456789") == strlen(end + tl)) return true;
    int kind = -1;
    for (int k = 0; k < 8; k++)
        if (strlen(TYPES[k]) == tl && !strncmp(end, TYPES[k], tl)) kind = k;
    long mb = strtol(end + tl, &p, 10);
    if (kind < 0 || p == end + tl || *p || st < 0 || st >= CSV_MAX_STAGES || mb < 0 ||
        mb >= CSV_MAX_MICROBATCHES)
        return error_set(err, n, "%s: %s is not an action like 0F1 or 1SEND_B0", where,
                         error_quote(q, sizeof q, buf));
    if (stage_rank[st] >= 0 && stage_rank[st] != r)
        return error_set(err, n, "%s: stage %ld is on rank %d and rank %d", where, st,
                         stage_rank[st], r);
    stage_rank[st] = r;
    if (st >= s->stages) s->stages = (int)st + 1;
    if (mb >= s->microbatches) s->microbatches = (int)mb + 1;
    push(s, r, (PpActionKind)kind, (int)st, (int)mb, -1);
    return true;
}

// One row per line; a last line without its newline counts too.
static int csv_rows(const char *text) {
    int rows = 0;
    for (const char *p = text; *p; p++) rows += *p == '\n';
    size_t len = strlen(text);
    return rows + (len > 0 && text[len - 1] != '\n');
}

static bool csv_parse(PpSchedule *s, const char *text, const char *path, int *stage_rank,
                      char *err, size_t n) {
    const char *p = text;
    for (int line = 1; line <= s->ranks; line++) {
        size_t row = strcspn(p, "\n");
        for (size_t c = 0; c <= row;) {
            size_t len = strcspn(p + c, ",\n"), lead = strspn(p + c, " \t\r");
            size_t l = lead < len ? len - lead : 0;
            while (l && strchr(" \t\r", p[c + lead + l - 1])) l--;
            char where[1100];
            snprintf(where, sizeof where, "%s:%d:%zu", path, line, c + lead + 1);
            if (l && !csv_cell(s, line - 1, p + c + lead, l, stage_rank, where, err, n))
                return false;
            c += len + 1;
        }
        p += row + (p[row] == '\n');
    }
    return true;
}

static void csv_peers(PpSchedule *s) {
    for (int r = 0; r < s->ranks; r++)
        for (int i = 0; i < s->count[r]; i++) {
            PpAction *a = &s->actions[r][i];
            if (!is_comm(a->kind)) continue;
            int other = (a->kind == PP_SEND_ACT || a->kind == PP_RECV_GRAD) ? a->stage + 1
                                                                            : a->stage - 1;
            a->peer = other >= 0 && other < s->stages ? s->stage_rank[other] : -1;
        }
}

bool pp_schedule_load_csv(PpSchedule *s, const char *text, const char *path, char *err,
                          size_t n) {
    int rows = csv_rows(text);
    if (rows == 0) return error_set(err, n, "%s: the schedule has no rows (one per rank)", path);
    int *stage_rank = xcalloc(CSV_MAX_STAGES, sizeof(int));
    for (int i = 0; i < CSV_MAX_STAGES; i++) stage_rank[i] = -1;
    sched_init(s, rows, 0, 0);
    bool ok = csv_parse(s, text, path, stage_rank, err, n);
    for (int st = 0; ok && st < s->stages; st++)
        if (stage_rank[st] < 0)
            ok = error_set(err, n, "%s: stage %d appears on no rank (stages go 0..%d)", path, st,
                           s->stages - 1);
    if (ok && s->stages == 0) ok = error_set(err, n, "%s: the schedule has no actions", path);
    if (ok) {
        s->stage_rank = realloc(s->stage_rank, (size_t)s->stages * sizeof(int));
        if (!s->stage_rank) die_internal(__FILE__, __LINE__, "out of memory");
        memcpy(s->stage_rank, stage_rank, (size_t)s->stages * sizeof(int));
        bool comms = false;
        for (int r = 0; r < s->ranks; r++)
            for (int i = 0; i < s->count[r]; i++) comms |= is_comm(s->actions[r][i].kind);
        if (comms) csv_peers(s);
        else pp_add_comms(s);
    }
    free(stage_rank);
    if (!ok) pp_schedule_free(s);
    return ok;
}

// A legend, then one row per time unit of the cost model; a cell names the compute action that
// starts then, "~" its second unit (a full B), "." an idle rank. Sends and recvs take no time: not shown.
void pp_schedule_print(const PpSchedule *s, const PpReport *r, FILE *out) {
    int T = (int)r->makespan;
    int *cell = xcalloc((size_t)T * (size_t)s->ranks, sizeof(int));  // (T, ranks) action or -1
    for (int i = 0; i < T * s->ranks; i++) cell[i] = -1;
    for (int q = 0; q < s->ranks; q++)
        for (int i = 0; i < s->count[q]; i++)
            for (int64_t t = r->start[q][i];
                 t < r->start[q][i] + pp_action_cost(s->actions[q][i].kind); t++)
                cell[t * s->ranks + q] = i;
    fprintf(out, "legend: Fs.m forward of stage s, microbatch m; B backward (2 units); I, W its "
            "input and weight halves; ~ a B's second unit; . idle\n");
    fprintf(out, "step");
    for (int q = 0; q < s->ranks; q++)
        fprintf(out, q + 1 < s->ranks ? "  rank %-3d" : "  rank %d", q);
    fprintf(out, "\n");
    for (int t = 0; t < T; t++) {
        fprintf(out, "%4d", t);
        for (int q = 0; q < s->ranks; q++) {
            int i = cell[t * s->ranks + q];
            char name[48] = ".";
            if (i >= 0 && r->start[q][i] == t) pp_action_name(&s->actions[q][i], name, sizeof name);
            else if (i >= 0) snprintf(name, sizeof name, "~");
            fprintf(out, q + 1 < s->ranks ? "  %-8s" : "  %s", name);
        }
        fprintf(out, "\n");
    }
    free(cell);
    fprintf(out, "ok: deadlock-free; each of %d stages x %d microbatches runs F and B (or I and W) "
            "once in dependency order; every send is received\n", s->stages, s->microbatches);
    fprintf(out, "bubble: %.4f (idle %lld of %d ranks x %lld time units; F=1 I=1 W=1 B=2)\n",
            r->bubble, (long long)r->idle, s->ranks, (long long)r->makespan);
    fprintf(out, "peak live activations per rank:");
    for (int q = 0; q < s->ranks; q++) fprintf(out, " %d", r->peak_live[q]);
    fprintf(out, "\n");
}
