#include "parallel/p2p_check.h"

#include <inttypes.h>
#include <stdlib.h>

#include "core/errors.h"

int p2p_add(P2pProgram *p, P2pStep step) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 64;
        p->steps = realloc(p->steps, (size_t)p->cap * sizeof *p->steps);
        if (!p->steps) die_internal(__FILE__, __LINE__, "out of memory");
    }
    p->steps[p->n] = step;
    return p->n++;
}

void p2p_program_free(P2pProgram *p) {
    free(p->steps);
    *p = (P2pProgram){0};
}

int p2p_stream(P2pStreams policy, int peer, bool send) {
    if (policy == P2P_ONE_STREAM) return 0;
    CHECK(2 * peer + 1 < P2P_MAX_STREAMS);
    return 2 * peer + (send ? 0 : 1);
}

static bool is_op(const P2pStep *s) { return s->kind == P2P_SEND || s->kind == P2P_RECV; }

// Per rank, what the play needs beside the program.
typedef struct {
    int *place;       // (n) an operation's place on its stream (0: the stream's first)
    int *match_rank;  // (n) the peer whose operation it meets
    int *match_step;  // (n) that operation's step index there
    bool *done;       // (n)
    int *finished;    // (P2P_MAX_STREAMS) operations finished on each stream
    int pc;           // the host's next step: the operations before it are posted
} RankPlay;

// Pairs the k-th send from a to b with b's k-th receive from a, for every pair.
static bool match_all(const P2pProgram *progs, RankPlay *play, int ranks, char *err, size_t n) {
    for (int a = 0; a < ranks; a++)
        for (int b = 0; b < ranks; b++) {
            const P2pProgram *pa = &progs[a], *pb = &progs[b];
            int j = 0;  // b's next receive from a
            for (int i = 0; i < pa->n; i++) {
                const P2pStep *s = &pa->steps[i];
                if (s->kind != P2P_SEND || s->peer != b) continue;
                while (j < pb->n && !(pb->steps[j].kind == P2P_RECV && pb->steps[j].peer == a))
                    j++;
                if (j == pb->n)
                    return error_set(err, n, "rank %d's send %d (message %" PRId64 ") to rank %d "
                                     "is never received", a, i, s->message, b);
                if (pb->steps[j].message != s->message)
                    return error_set(err, n, "rank %d's step %d receives message %" PRId64
                                     " from rank %d, which sends message %" PRId64 " first "
                                     "(NCCL matches a pair's operations in issue order)", b, j,
                                     pb->steps[j].message, a, s->message);
                play[a].match_rank[i] = b, play[a].match_step[i] = j;
                play[b].match_rank[j] = a, play[b].match_step[j] = i;
                j++;
            }
        }
    for (int b = 0; b < ranks; b++)
        for (int j = 0; j < progs[b].n; j++) {
            const P2pStep *s = &progs[b].steps[j];
            if (s->kind == P2P_RECV && play[b].match_rank[j] < 0)
                return error_set(err, n, "rank %d's receive %d (message %" PRId64 ") from rank "
                                 "%d has no send", b, j, s->message, s->peer);
        }
    return true;
}

// Whether rank q's operation at step i has started: posted, and every earlier one on its
// stream finished.
static bool started(const P2pProgram *p, const RankPlay *q, int i) {
    return i < q->pc && q->finished[p->steps[i].stream] == q->place[i];
}

// One round: each host runs until a wait for an unfinished operation; each started operation
// whose match has started finishes, with it.
static bool advance(const P2pProgram *progs, RankPlay *play, int ranks) {
    bool moved = false;
    for (int r = 0; r < ranks; r++) {
        RankPlay *me = &play[r];
        const P2pProgram *p = &progs[r];
        while (me->pc < p->n &&
               !(p->steps[me->pc].kind == P2P_WAIT && !me->done[p->steps[me->pc].op])) {
            me->pc++;
            moved = true;
        }
    }
    for (int r = 0; r < ranks; r++) {
        RankPlay *me = &play[r];
        const P2pProgram *p = &progs[r];
        for (int i = 0; i < me->pc; i++) {
            if (!is_op(&p->steps[i]) || me->done[i] || !started(p, me, i)) continue;
            int q = me->match_rank[i], j = me->match_step[i];
            if (!started(&progs[q], &play[q], j)) continue;
            me->done[i] = play[q].done[j] = true;
            me->finished[p->steps[i].stream]++;
            play[q].finished[progs[q].steps[j].stream]++;
            moved = true;
        }
    }
    return moved;
}

static bool stuck_line(const P2pProgram *progs, const RankPlay *play, int ranks, char *err,
                       size_t n) {
    int stuck = 0, first = -1;
    for (int r = 0; r < ranks; r++) {
        bool all = play[r].pc == progs[r].n;
        for (int i = 0; all && i < progs[r].n; i++)
            all = !is_op(&progs[r].steps[i]) || play[r].done[i];
        if (!all && first < 0) first = r;
        stuck += !all;
    }
    if (first < 0) return true;
    const P2pProgram *p = &progs[first];
    const RankPlay *me = &play[first];
    int i = me->pc < p->n ? p->steps[me->pc].op : 0;  // what its host waits for
    while (me->pc == p->n && (!is_op(&p->steps[i]) || me->done[i])) i++;
    const P2pStep *s = &p->steps[i];
    int q = me->match_rank[i], j = me->match_step[i];
    const char *why = !started(p, me, i) ? "queued behind unfinished operations on its stream"
                      : j >= play[q].pc ? "whose match that rank has not posted yet"
                                        : "whose match is queued behind unfinished operations";
    return error_set(err, n, "deadlock on NCCL: rank %d waits for its %s %s rank %d (message %"
                     PRId64 ", step %d), %s (%d of %d ranks stuck)", first,
                     s->kind == P2P_SEND ? "send" : "receive", s->kind == P2P_SEND ? "to" : "from",
                     s->peer, s->message, i, why, stuck, ranks);
}

bool p2p_check_nccl(const P2pProgram *progs, int ranks, char *err, size_t n) {
    RankPlay *play = xcalloc((size_t)ranks, sizeof *play);
    for (int r = 0; r < ranks; r++) {
        const P2pProgram *p = &progs[r];
        RankPlay *me = &play[r];
        me->place = xcalloc((size_t)p->n + 1, sizeof(int));
        me->match_rank = xcalloc((size_t)p->n + 1, sizeof(int));
        me->match_step = xcalloc((size_t)p->n + 1, sizeof(int));
        me->done = xcalloc((size_t)p->n + 1, sizeof(bool));
        me->finished = xcalloc(P2P_MAX_STREAMS, sizeof(int));
        int *count = xcalloc(P2P_MAX_STREAMS, sizeof(int));
        for (int i = 0; i < p->n; i++) {
            const P2pStep *s = &p->steps[i];
            me->match_rank[i] = -1;
            CHECK(s->kind != P2P_WAIT || (s->op >= 0 && s->op < i && is_op(&p->steps[s->op])));
            if (!is_op(s)) continue;
            CHECK(s->peer >= 0 && s->peer < ranks && s->peer != r);
            CHECK(s->stream >= 0 && s->stream < P2P_MAX_STREAMS);
            me->place[i] = count[s->stream]++;
        }
        free(count);
    }
    bool ok = match_all(progs, play, ranks, err, n);
    while (ok && advance(progs, play, ranks)) {}
    ok = ok && stuck_line(progs, play, ranks, err, n);
    for (int r = 0; r < ranks; r++) {
        free(play[r].place), free(play[r].match_rank), free(play[r].match_step);
        free(play[r].done), free(play[r].finished);
    }
    free(play);
    return ok;
}
