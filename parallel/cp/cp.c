#include "parallel/cp/cp.h"

#include <string.h>
#include <time.h>

#include "core/errors.h"
#include "parallel/cp/layout.h"

// MPI matches the ring's two kinds of message by tag (NCCL, which ignores tags, is not used
// for the ring: see train.c).
enum { TAG_KV = 1, TAG_DKV = 2 };

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// One call's sizes and its workspace, carved in one order for sizing and for use. A "unit" is
// what travels: one rank's K and V in chunk-major order [k head | k tail | v head | v tail],
// each chunk (B, c, n_kv_heads, head_dim).
typedef struct {
    int B, c, nh, nkv, hd;
    size_t qn, kvn, ln, unit;  // floats: a query chunk, a K (or V) chunk, an lse chunk, a unit
    AttnMask mask;
    size_t bytes;              // the whole workspace
    // Chunk-major (2, B, c, ...) copies of the local tensors, the slot index the chunk's.
    float *q, *out, *lse, *dout, *dq;
    float *part_out, *part_lse;  // one chunk pair's attention before it is merged
    float *kv;                   // allgather: (size, unit) every rank's; ring: (2, unit)
    float *dkv;                  // allgather: (size + 1, unit); ring: (3, unit)
    int *doc;                    // (2 size, B, c) every chunk's document ids
    void *kernel_workspace;      // the kernel's, for one chunk pair
} Work;

static AttnShape chunk_shape(const Work *w) {
    return (AttnShape){.B = w->B, .Tq = w->c, .Tk = w->c, .n_heads = w->nh,
                       .n_kv_heads = w->nkv, .head_dim = w->hd, .mask = w->mask};
}

// Carves base (NULL: only sizes) in one fixed order.
static Work work_carve(const Cp *cp, const StepCtx *s, const AttnShape *local, void *base) {
    CHECK(local->Tq == local->Tk && local->Tq % 2 == 0);
    Work w = {.B = local->B, .c = local->Tq / 2, .nh = local->n_heads,
              .nkv = local->n_kv_heads, .hd = local->head_dim, .mask = local->mask};
    w.qn = (size_t)w.B * w.c * w.nh * w.hd;
    w.kvn = (size_t)w.B * w.c * w.nkv * w.hd;
    w.ln = (size_t)w.B * w.nh * w.c;
    w.unit = 4 * w.kvn;
    char *p = base;
    size_t at = 0;
#define CARVE(field, type, count)                                      \
    do {                                                               \
        w.field = base ? (type *)(p + at) : NULL;                      \
        at += ((count) * sizeof(type) + 255) / 256 * 256;              \
    } while (0)
    bool ring = cp->rotate == CP_ALLTOALL;
    CARVE(q, float, 2 * w.qn);
    CARVE(out, float, 2 * w.qn);
    CARVE(lse, float, 2 * w.ln);
    CARVE(dout, float, 2 * w.qn);
    CARVE(dq, float, 2 * w.qn);
    CARVE(part_out, float, w.qn);
    CARVE(part_lse, float, w.ln);
    CARVE(kv, float, (ring ? 2 : (size_t)cp->size) * w.unit);
    CARVE(dkv, float, (ring ? 3 : (size_t)cp->size + 1) * w.unit);
    CARVE(doc, int, (size_t)2 * cp->size * w.B * w.c);
#undef CARVE
    AttnShape pair = chunk_shape(&w);
    w.kernel_workspace = base ? p + at : NULL;
    at += s->k->attention_workspace_bytes(&pair);
    w.bytes = at;
    return w;
}

// The global position of the first token of rank j's chunk `slot` (0: head, 1: tail).
static int chunk_start(const Cp *cp, const Work *w, int j, int slot) {
    int head, tail, len;
    cp_chunks(2 * cp->size * w->c, cp->size, j, &head, &tail, &len);
    return slot == 0 ? head : tail;
}

// chunks (2, B, c, width) <-> x (B, 2c, width): a rank's tokens, head chunk then tail chunk.
static void to_chunks(const KernelOps *k, float *chunks, const float *x, int B, int c,
                      size_t width) {
    size_t row = (size_t)c * width * sizeof(float);
    for (int slot = 0; slot < 2; slot++)
        k->copy_rows(chunks + slot * (size_t)B * c * width, row, x + slot * (size_t)c * width,
                     2 * row, row, B);
}
static void from_chunks(const KernelOps *k, float *x, const float *chunks, int B, int c,
                        size_t width) {
    size_t row = (size_t)c * width * sizeof(float);
    for (int slot = 0; slot < 2; slot++)
        k->copy_rows(x + slot * (size_t)c * width, 2 * row, chunks + slot * (size_t)B * c * width,
                     row, row, B);
}
// The same for lse, laid out (B, n_heads, T): its chunks are (B * n_heads) rows of c.
static void lse_to_chunks(const KernelOps *k, float *chunks, const float *lse, const Work *w) {
    to_chunks(k, chunks, lse, w->B * w->nh, w->c, 1);
}
static void lse_from_chunks(const KernelOps *k, float *lse, const float *chunks, const Work *w) {
    from_chunks(k, lse, chunks, w->B * w->nh, w->c, 1);
}

// The unit of this rank's k and v (B, 2c, n_kv_heads, head_dim) each, and back (the
// gradients).
static void pack_unit(const KernelOps *k, float *unit, const float *kk, const float *v,
                      const Work *w) {
    size_t width = (size_t)w->nkv * w->hd;
    to_chunks(k, unit, kk, w->B, w->c, width);
    to_chunks(k, unit + 2 * w->kvn, v, w->B, w->c, width);
}
static void unpack_unit(const KernelOps *k, float *kk, float *v, const float *unit,
                        const Work *w) {
    size_t width = (size_t)w->nkv * w->hd;
    from_chunks(k, kk, unit, w->B, w->c, width);
    from_chunks(k, v, unit + 2 * w->kvn, w->B, w->c, width);
}

// Every chunk's document ids (B, c), chunk (j, slot) at index 2j + slot, from the step's
// (B, T) ids of the whole sequences.
static void gather_documents(const Cp *cp, const StepCtx *s, const Work *w) {
    size_t T = (size_t)2 * cp->size * w->c, row = (size_t)w->c * sizeof(int);
    for (int j = 0; j < cp->size; j++)
        for (int slot = 0; slot < 2; slot++)
            s->k->copy_rows(w->doc + (size_t)(2 * j + slot) * w->B * w->c, row,
                            s->doc + chunk_start(cp, w, j, slot), T * sizeof(int), row, w->B);
}

// The attention of this rank's query chunk q_slot against rank j's key chunk kv_slot, or false
// when the mask hides every key from every query (the key chunk lies in the queries' future).
static bool pair_shape(const Cp *cp, const Work *w, int q_slot, int j, int kv_slot,
                       AttnShape *out) {
    *out = chunk_shape(w);
    out->q_start = chunk_start(cp, w, cp->rank, q_slot);
    out->kv_start = chunk_start(cp, w, j, kv_slot);
    if (w->mask != ATTN_NONE && out->kv_start >= out->q_start + w->c) return false;
    // Every key in the queries' past: no mask to apply (the kernels' cheaper path).
    if (w->mask == ATTN_CAUSAL && out->kv_start + w->c <= out->q_start) out->mask = ATTN_NONE;
    if (w->mask == ATTN_DOCUMENT) {
        out->q_doc = w->doc + (size_t)(2 * cp->rank + q_slot) * w->B * w->c;
        out->kv_doc = w->doc + (size_t)(2 * j + kv_slot) * w->B * w->c;
    }
    return true;
}

// Waits for h, counting the time blocked as exposed K/V traffic.
static void traffic_wait(Cp *cp, CommHandle *h) {
    double t0 = now_seconds();
    comm_wait(h);
    cp->wait_seconds += now_seconds() - t0;
}

// The rank whose unit this rank holds at ring step i: its own first, then the previous one's.
// The ring's transfers in flight while a unit is computed (none for allgather): tested between
// chunk pairs, so that MPI, which moves a large message only inside its calls, moves them
// meanwhile. The tests' time counts as blocked: it is the copy.
typedef struct {
    CommHandle *h[4];
    int n;
} InFlight;

static void in_flight_progress(Cp *cp, const InFlight *f) {
    if (!f) return;
    double t0 = now_seconds();
    for (int i = 0; i < f->n; i++) comm_test(f->h[i]);
    cp->wait_seconds += now_seconds() - t0;
}

// Merges the attention of both query chunks against rank j's unit into w->out and w->lse; the
// first pair a query chunk sees writes them (filled), later ones are merged in.
static void forward_unit(Cp *cp, const KernelOps *k, const Work *w, int j, const float *unit,
                         bool filled[2], const InFlight *in_flight) {
    for (int kv_slot = 0; kv_slot < 2; kv_slot++)
        for (int q_slot = 0; q_slot < 2; q_slot++) {
            AttnShape pair;
            if (!pair_shape(cp, w, q_slot, j, kv_slot, &pair)) continue;
            float *out = w->out + q_slot * w->qn, *lse = w->lse + q_slot * w->ln;
            const float *kc = unit + kv_slot * w->kvn, *vc = unit + (2 + kv_slot) * w->kvn;
            const float *q = w->q + q_slot * w->qn;
            if (!filled[q_slot]) {
                k->attention_forward(out, lse, q, kc, vc, &pair, w->kernel_workspace);
                filled[q_slot] = true;
            } else {
                k->attention_forward(w->part_out, w->part_lse, q, kc, vc, &pair,
                                     w->kernel_workspace);
                k->attention_merge(out, lse, w->part_out, w->part_lse, w->B, w->c, w->nh, w->hd);
            }
            in_flight_progress(cp, in_flight);
        }
}

// dq (w->dq) and dunit += both query chunks' gradients through rank j's unit.
static void backward_unit(Cp *cp, const KernelOps *k, const Work *w, int j, const float *unit,
                          float *dunit, const InFlight *in_flight) {
    for (int kv_slot = 0; kv_slot < 2; kv_slot++)
        for (int q_slot = 0; q_slot < 2; q_slot++) {
            AttnShape pair;
            if (!pair_shape(cp, w, q_slot, j, kv_slot, &pair)) continue;
            size_t qo = q_slot * w->qn, lo = q_slot * w->ln;
            k->attention_backward(w->dq + qo, dunit + kv_slot * w->kvn,
                                  dunit + (2 + kv_slot) * w->kvn, w->dout + qo, w->q + qo,
                                  unit + kv_slot * w->kvn, unit + (2 + kv_slot) * w->kvn,
                                  w->out + qo, w->lse + lo, &pair, w->kernel_workspace);
            in_flight_progress(cp, in_flight);
        }
}

static int ring_owner(const Cp *cp, int i) { return (cp->rank - i + cp->size) % cp->size; }

static void forward_ring(Cp *cp, const KernelOps *k, const Work *w, bool filled[2]) {
    float *cur = w->kv, *next = w->kv + w->unit;
    for (int i = 0; i < cp->size; i++) {
        CommHandle send = {0}, recv = {0};
        if (i + 1 < cp->size) {  // the next unit travels while this one is computed
            send = comm_send_start(cp->group, cur, w->unit, cp->next, TAG_KV);
            recv = comm_recv_start(cp->group, next, w->unit, cp->prev, TAG_KV);
            cp->transfers++;
            cp->bytes_sent += w->unit * sizeof(float);
        }
        InFlight in_flight = {{&send, &recv}, 2};
        forward_unit(cp, k, w, ring_owner(cp, i), cur, filled, &in_flight);
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
static void backward_ring(Cp *cp, const KernelOps *k, const Work *w, float *dunit_home) {
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
        InFlight in_flight = {{&drecv, &send, &recv, &dsend[(i + 1) % 2]}, 4};
        backward_unit(cp, k, w, ring_owner(cp, i), cur, d, &in_flight);
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
static void gather_units(Cp *cp, const KernelOps *k, const Work *w, const float *kk,
                         const float *v) {
    float *own = w->kv + (size_t)cp->rank * w->unit;
    pack_unit(k, own, kk, v, w);
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
    Work w = work_carve(cp, s, local, workspace);
    to_chunks(k, w.q, q, w.B, w.c, (size_t)w.nh * w.hd);
    if (w.mask == ATTN_DOCUMENT) gather_documents(cp, s, &w);
    bool filled[2] = {false, false};
    if (cp->rotate == CP_ALLTOALL) {
        pack_unit(k, w.kv, kk, v, &w);
        forward_ring(cp, k, &w, filled);
    } else {
        gather_units(cp, k, &w, kk, v);
        for (int i = 0; i < cp->size; i++) {
            int j = ring_owner(cp, i);  // the same order as the ring: the same sums
            forward_unit(cp, k, &w, j, w.kv + (size_t)j * w.unit, filled, NULL);
        }
    }
    // Every query chunk sees at least its own positions: both were written.
    CHECK(filled[0] && filled[1]);
    from_chunks(k, out, w.out, w.B, w.c, (size_t)w.nh * w.hd);
    lse_from_chunks(k, lse, w.lse, &w);
}

static void cp_backward(const AttnHooks *h, const StepCtx *s, float *dq, float *dk, float *dv,
                        const float *dout, const float *q, const float *kk, const float *v,
                        const float *out, const float *lse, const AttnShape *local,
                        void *workspace) {
    Cp *cp = (Cp *)h;
    const KernelOps *k = s->k;
    Work w = work_carve(cp, s, local, workspace);
    size_t width = (size_t)w.nh * w.hd;
    to_chunks(k, w.q, q, w.B, w.c, width);
    to_chunks(k, w.dout, dout, w.B, w.c, width);
    to_chunks(k, w.out, out, w.B, w.c, width);
    lse_to_chunks(k, w.lse, lse, &w);
    k->zero(w.dq, 2 * w.qn * sizeof(float));
    if (w.mask == ATTN_DOCUMENT) gather_documents(cp, s, &w);
    float *dunit = w.dkv + (size_t)(cp->rotate == CP_ALLTOALL ? 2 : cp->size) * w.unit;
    if (cp->rotate == CP_ALLTOALL) {
        pack_unit(k, w.kv, kk, v, &w);
        backward_ring(cp, k, &w, dunit);
    } else {
        gather_units(cp, k, &w, kk, v);
        k->zero(w.dkv, (size_t)cp->size * w.unit * sizeof(float));
        for (int i = 0; i < cp->size; i++) {
            int j = ring_owner(cp, i);
            backward_unit(cp, k, &w, j, w.kv + (size_t)j * w.unit, w.dkv + (size_t)j * w.unit,
                          NULL);
        }
        CommHandle rs = comm_reduce_scatter_start(cp->group, w.dkv, dunit, w.unit, COMM_SUM);
        traffic_wait(cp, &rs);
        cp->transfers++;
        cp->bytes_sent += (uint64_t)cp->size * w.unit * sizeof(float);
    }
    from_chunks(k, dq, w.dq, w.B, w.c, width);
    unpack_unit(k, dk, dv, dunit, &w);
}

static size_t cp_workspace_bytes(const AttnHooks *h, const StepCtx *s, const AttnShape *local) {
    return work_carve((const Cp *)h, s, local, NULL).bytes;
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
