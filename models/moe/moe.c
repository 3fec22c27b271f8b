#include "models/moe/moe.h"

#include <math.h>
#include <stdlib.h>

#include "core/errors.h"
#include "models/lora.h"

// The host scratch (moe_layer_init's): counts (E), offsets (E + 1), the exchanged counts (E),
// the rows kept per expert (E), send and receive rows (2 ep <= 2E), local offsets (E + 1).
#define HOST_INTS(E) (7 * (size_t)(E) + 2)

static Param *add_param(ParamTable *t, ParamInit init, double std, int ndim, int64_t d0,
                        int64_t d1, int64_t d2, const char *prefix, const char *name) {
    int64_t shape[3] = {d0, d1, d2};
    return &t->items[params_add(t, init, std, ndim, shape, "%s%s", prefix, name)];
}

void moe_args_from_config(MoeArgs *a, const ModelSection *c) {
    a->load_balance_coeff = isnan(c->moe_load_balance_coeff) ? 0 : c->moe_load_balance_coeff;
    a->aux_loss_alpha = c->moe_aux_loss_alpha;
    a->capacity_factor = isnan(c->moe_capacity_factor) ? 0 : c->moe_capacity_factor;
}

int moe_param_count(const MoeArgs *args) {
    return 4 + (args->shared_hidden > 0 ? 3 : 0) + (args->load_balance_coeff > 0 ? 1 : 0);
}

void moe_layer_init(MoeLayer *m, const MoeArgs *args, int index, ParamTable *t,
                    const char *prefix, const MoeInit *init, const LoraSection *lora) {
    int64_t E = args->router.n_experts, D = args->dim, F = args->hidden;
    int64_t Fs = args->shared_hidden;
    ParamInit k = init->kind;
    *m = (MoeLayer){.args = args, .index = index};
    m->gate = lora_add_linear(t, lora, k, init->gate, E, D, prefix, "moe.router.gate");
    m->w1 = add_param(t, k, init->w1, 3, E, F, D, prefix,
                      "moe.routed_experts.inner_experts.w1_EFD");
    m->w2 = add_param(t, k, init->w2, 3, E, D, F, prefix,
                      "moe.routed_experts.inner_experts.w2_EDF");
    m->w3 = add_param(t, k, init->w3, 3, E, F, D, prefix,
                      "moe.routed_experts.inner_experts.w3_EFD");
    m->w1->expert = m->w2->expert = m->w3->expert = true;
    if (Fs > 0) {
        m->shared_w1 =
            lora_add_linear(t, lora, k, init->w1, Fs, D, prefix, "moe.shared_experts.w1");
        m->shared_w2 =
            lora_add_linear(t, lora, k, init->w2, D, Fs, prefix, "moe.shared_experts.w2");
        m->shared_w3 =
            lora_add_linear(t, lora, k, init->w3, Fs, D, prefix, "moe.shared_experts.w3");
        m->linear.shared_w1 = linear_of(m->shared_w1);
        m->linear.shared_w2 = linear_of(m->shared_w2);
        m->linear.shared_w3 = linear_of(m->shared_w3);
    }
    m->linear.gate = linear_of(m->gate);
    m->linear.w1 = linear_of(m->w1);
    m->linear.w2 = linear_of(m->w2);
    m->linear.w3 = linear_of(m->w3);
    if (args->load_balance_coeff > 0) {
        m->expert_bias = add_param(t, INIT_ZEROS, 0, 1, E, 0, 0, prefix, "moe.expert_bias_E");
        m->expert_bias->buffer = true;
    }
    m->host_counts = xcalloc(HOST_INTS(E), sizeof(int));
}

int moe_layer_params(const MoeLayer *m, Param *out[MOE_MAX_PARAMS]) {
    Param *all[] = {m->gate,      m->w1,        m->w2,        m->w3,
                    m->shared_w1, m->shared_w2, m->shared_w3, m->expert_bias};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) out[n++] = all[i];
    return n;
}

int moe_layer_linears(MoeLayer *m, Linear *out[MOE_MAX_LINEARS]) {
    Linear *all[] = {&m->linear.gate,      &m->linear.w1,        &m->linear.w2,
                     &m->linear.w3,        &m->linear.shared_w1, &m->linear.shared_w2,
                     &m->linear.shared_w3};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->weight) out[n++] = all[i];
    return n;
}

void moe_layer_free(MoeLayer *m) {
    free(m->host_counts);
    m->host_counts = NULL;
}

typedef struct {
    int rows, D, F, Fs, E, k;
    size_t R;  // rows * k: the bound of the expert-sorted rows
    // The experts this rank runs (E, or E / ep under expert parallel) and the bound of the rows
    // they run on (R, or what ExpertHooks.recv_rows_bound says this rank can receive).
    int El;
    size_t Rl;
    int n_counts;  // ints of MoeSaved.counts: 2E + 1, and E more under expert parallel
} MoeDims;

static MoeDims moe_dims(const MoeLayer *m, const StepCtx *s, int rows) {
    const MoeArgs *a = m->args;
    int k = a->router.top_k, E = a->router.n_experts;
    MoeDims d = {rows, a->dim, a->hidden, a->shared_hidden, E, k, (size_t)rows * k, E,
                 (size_t)rows * k, 2 * E + 1};
    if (s->ep) {
        d.El = E / s->ep->size;
        d.Rl = (size_t)s->ep->recv_rows_bound(s->ep, rows, k, E, a->capacity_factor);
        d.n_counts += E;
    }
    return d;
}

// Room for the scratch of the layer's linears (linear_reserve), after a phase's other buffers:
// the router and the shared experts on the rows, the experts on the rows they run on.
static void linears_reserve(const MoeLayer *m, const StepCtx *s, MoeDims d) {
    const Linear *dense[] = {&m->linear.gate, &m->linear.shared_w1, &m->linear.shared_w2,
                             &m->linear.shared_w3};
    const Linear *experts[] = {&m->linear.w1, &m->linear.w2, &m->linear.w3};
    linear_reserve(s, dense, d.Fs > 0 ? 4 : 1, d.rows, DTYPE_FP32);
    linear_reserve(s, experts, 3, (int)d.Rl, DTYPE_FP32);
}

// Slots an expert keeps: ceil(factor * rows * k / E) (GShard's capacity); 0: all of them.
static int moe_capacity(const MoeArgs *a, int rows) {
    if (a->capacity_factor <= 0) return 0;
    double c = ceil(a->capacity_factor * rows * a->router.top_k / a->router.n_experts);
    return c < 1 ? 1 : (int)c;
}

// The offsets (E + 1, host) of the expert-sorted rows, read back from forward's sort (with,
// under expert parallel, the exchanged counts forward kept beside them): the grouped GEMMs and
// the all-to-alls need them on the host. Read again in backward: the host scratch is shared by
// every microbatch in flight.
static const int *host_offsets(MoeLayer *m, const StepCtx *s, const MoeSaved *sv, MoeDims d) {
    s->k->download(m->host_counts, sv->counts, (size_t)d.n_counts * sizeof(int));
    return m->host_counts + d.E;
}

// Each expert's routed slots (dropped ones too, as torchtitan counts them) into the step's
// load, once per training forward: an activation-checkpointing recompute routes the same
// tokens again and must not count them twice.
static void count_load(const MoeLayer *m, const StepCtx *s, int E) {
    if (!s->expert_load || s->recompute) return;
    float *load = s->expert_load + (size_t)m->index * E;
    for (int e = 0; e < E; e++) load[e] += (float)m->host_counts[e];
}

// ---- DeepSeek V3's sequence-wise balance loss -------------------------------------------------

// sv->frac's f and P of the microbatch's B whole sequences (partial sums over the tp ranks'
// rows, summed); adds alpha * mean over sequences of sum_i f_i P_i to s->aux_loss. dot: one
// float of scratch.
static void aux_forward(const MoeLayer *m, StepCtx *s, const MoeSaved *sv, MoeDims d,
                        float *dot) {
    const KernelOps *K = s->k;
    size_t n = (size_t)s->B * d.E;
    CHECK(!s->attn);  // context parallel splits the sequences over ranks the layer cannot reach
    K->zero(sv->frac, 2 * n * sizeof(float));
    K->moe_aux_stats(sv->frac, sv->frac + n, sv->scores, sv->experts, &m->args->router, d.rows,
                     step_first_row(s), s->T);
    if (s->tp) s->tp->all_reduce_sum(s->tp, sv->frac, 2 * n);
    K->matmul(dot, sv->frac, sv->frac + n, DTYPE_FP32, 1, 1, (int)n, false, true, 0);
    float host;
    K->download(&host, dot, sizeof host);
    if (!s->recompute) s->aux_loss += m->args->aux_loss_alpha * host / s->B;
}

static void aux_backward(const MoeLayer *m, const StepCtx *s, const MoeSaved *sv, MoeDims d,
                         float *dlogits) {
    float dloss = (float)(s->loss_scale * m->args->aux_loss_alpha / s->B);
    s->k->moe_aux_backward(dlogits, sv->frac, sv->scores, &m->args->router, d.rows,
                           step_first_row(s), s->T, dloss);
}

// ---- forward ---------------------------------------------------------------------------------

// logits: (rows, E) scratch.
static void route(MoeLayer *m, StepCtx *s, MoeSaved *sv, MoeDims d, const float *x,
                  float *logits) {
    const KernelOps *K = s->k;
    linear_forward(&m->linear.gate, s, logits, linear_fp32(x), d.rows, 0);
    const float *bias = m->expert_bias ? m->expert_bias->data : NULL;
    K->moe_router_forward(sv->weight, sv->experts, sv->scores, logits, bias,
                          &m->args->router, d.rows);
    K->moe_sort(sv->counts, sv->counts + d.E, sv->row_of_slot, sv->experts, (int)d.R, d.E,
                moe_capacity(m->args, d.rows));
}

// Where the experts run: on one device on the expert-sorted slots themselves; under expert
// parallel (StepCtx.ep, parallel/ep) on the rows each rank sent for this rank's E / ep experts
// (its Shard(0) slices of the weights), regrouped by local expert. Host memory, from the
// offsets of the sort and the exchanged counts.
typedef struct {
    int n_experts;              // E or E / ep
    const int *offs;            // (n_experts + 1) the experts' rows
    // expert parallel only:
    int size;                   // ep
    const int *recv;            // (size, E / size) rows from each rank for each local expert
    int *send_rows, *recv_rows;  // (size) x2: rows to and from each rank
} ExpertRows;

// ExpertRows from the host offsets (and, under expert parallel, the exchanged counts).
static ExpertRows expert_rows(MoeLayer *m, const StepCtx *s, MoeDims d, const int *offs) {
    if (!s->ep) return (ExpertRows){.n_experts = d.E, .offs = offs};
    int *h = m->host_counts, size = s->ep->size, local = d.El;
    ExpertRows r = {.n_experts = local, .size = size, .recv = h + 2 * d.E + 1};
    r.send_rows = h + 4 * d.E + 1;
    r.recv_rows = r.send_rows + size;
    int *loffs = r.recv_rows + size;
    for (int q = 0; q < size; q++) {
        r.send_rows[q] = offs[(q + 1) * local] - offs[q * local];
        r.recv_rows[q] = 0;
        for (int e = 0; e < local; e++) r.recv_rows[q] += r.recv[q * local + e];
    }
    loffs[0] = 0;
    for (int e = 0; e < local; e++) {
        loffs[e + 1] = loffs[e];
        for (int q = 0; q < size; q++) loffs[e + 1] += r.recv[q * local + e];
    }
    CHECK((size_t)loffs[local] <= d.Rl);  // ExpertHooks.recv_rows_bound holds
    r.offs = loffs;
    return r;
}

// The counts exchange of a forward: each rank learns the rows every rank has for its experts
// (the kept ones: a capacity drops the rest before they travel); kept in sv->counts for the
// backward, which moves the same rows.
static void exchange_counts(MoeLayer *m, const StepCtx *s, const MoeSaved *sv, MoeDims d) {
    int *offs = m->host_counts + d.E, *recv = offs + d.E + 1, *kept = recv + d.E;
    for (int e = 0; e < d.E; e++) kept[e] = offs[e + 1] - offs[e];
    s->ep->exchange_counts(s->ep, kept, recv, d.E);
    s->k->upload(sv->counts + 2 * d.E + 1, recv, (size_t)d.E * sizeof(int));
}

// Copies the received rows (D floats each) between the order they arrive in, (source rank,
// local expert), and the order the grouped GEMMs take, (local expert, source rank).
static void regroup(const StepCtx *s, const ExpertRows *r, MoeDims d, float *arrived,
                    float *grouped, bool to_grouped) {
    size_t at = 0, row = (size_t)d.D;
    for (int e = 0; e < r->n_experts; e++)
        for (int q = 0; q < r->size; q++) {
            size_t from = 0, n = (size_t)r->recv[q * r->n_experts + e];
            for (int p = 0; p < q; p++) from += (size_t)r->recv_rows[p];
            for (int f = 0; f < e; f++) from += (size_t)r->recv[q * r->n_experts + f];
            float *a = arrived + from * row, *g = grouped + at * row;
            s->k->copy(to_grouped ? g : a, to_grouped ? a : g, n * row * sizeof(float));
            at += n;
        }
}

// The sorted rows (R, D) of this rank's slots to the experts' rows (Rl, D) of the ranks that
// hold them (back = false), or the experts' rows back to their slots' ranks (back = true, the
// combine's exchange, and the dispatch's in backward). arrived: (Rl, D) scratch. Under no
// expert parallel the two are the same rows.
static void exchange_rows(const StepCtx *s, const ExpertRows *r, MoeDims d, float *sorted,
                          float *arrived, float *grouped, bool back) {
    if (!s->ep) return;
    if (back) {
        regroup(s, r, d, arrived, grouped, false);
        s->ep->all_to_all(s->ep, sorted, r->send_rows, arrived, r->recv_rows, d.D);
    } else {
        s->ep->all_to_all(s->ep, arrived, r->recv_rows, sorted, r->send_rows, d.D);
        regroup(s, r, d, arrived, grouped, true);
    }
}

// The dispatch and the combine: the permutation of the tokens' slots into expert order and its
// weighted inverse (torchtitan's token dispatcher), the rows' exchange between.
static void dispatch(const StepCtx *s, const MoeSaved *sv, MoeDims d, const ExpertRows *r,
                     const float *x, float *sorted, float *arrived) {
    s->k->moe_permute(s->ep ? sorted : sv->xs, x, NULL, sv->row_of_slot, d.rows, d.k, d.D);
    exchange_rows(s, r, d, sorted, arrived, sv->xs, false);
}

// expert_out: (Rl, D) the experts' outputs in their order (sv->out itself on one device).
static void combine(const StepCtx *s, const MoeSaved *sv, MoeDims d, const ExpertRows *r,
                    float *expert_out, float *arrived, float *y) {
    exchange_rows(s, r, d, sv->out, arrived, expert_out, true);
    s->k->moe_unpermute(y, sv->out, sv->weight, sv->row_of_slot, d.rows, d.k, d.D);
}

// dx += the dispatched rows' grads summed back onto their tokens: dgrouped (Rl, D) in the
// experts' order, sent home into dsorted (R, D) under expert parallel (dsorted == dgrouped on
// one device).
static void dispatch_backward(const StepCtx *s, const MoeSaved *sv, MoeDims d,
                              const ExpertRows *r, float *dsorted, float *arrived,
                              float *dgrouped, float *dx) {
    exchange_rows(s, r, d, dsorted, arrived, dgrouped, true);
    s->k->moe_unpermute(dx, dsorted, NULL, sv->row_of_slot, d.rows, d.k, d.D);
}

// out (Rl, D) = (silu(xs W1_e^T) * (xs W3_e^T)) W2_e^T on each expert e's rows (this rank's).
static void experts_forward(const MoeLayer *m, const StepCtx *s, const MoeSaved *sv, MoeDims d,
                            const ExpertRows *r, float *out) {
    const int *offs = r->offs;
    linear_grouped_forward(&m->linear.w1, s, sv->gate, sv->xs, offs, 0);
    linear_grouped_forward(&m->linear.w3, s, sv->up, sv->xs, offs, 0);
    s->k->swiglu_forward(sv->act, DTYPE_FP32, sv->gate, sv->up,
                         (size_t)offs[r->n_experts] * d.F);
    linear_grouped_forward(&m->linear.w2, s, out, sv->act, offs, 0);
}

// y += (silu(x Ws1^T) * (x Ws3^T)) Ws2^T.
static void shared_forward(const MoeLayer *m, const StepCtx *s, const MoeSaved *sv, MoeDims d,
                           const float *x, float *y) {
    linear_forward(&m->linear.shared_w1, s, sv->sgate, linear_fp32(x), d.rows, 0);
    linear_forward(&m->linear.shared_w3, s, sv->sup, linear_fp32(x), d.rows, 0);
    s->k->swiglu_forward(sv->sact, DTYPE_FP32, sv->sgate, sv->sup, (size_t)d.rows * d.Fs);
    linear_forward(&m->linear.shared_w2, s, y, linear_fp32(sv->sact), d.rows, 1);
}

void moe_forward(MoeLayer *m, StepCtx *s, MoeSaved *sv, const float *x, float *y, int rows) {
    MoeDims d = moe_dims(m, s, rows);
    Arena *A = s->act;
    sv->scores = arena_floats(A, (size_t)rows * d.E);
    sv->weight = arena_floats(A, d.R);
    sv->experts = arena_tensor(A, d.R, DTYPE_INT32);
    sv->counts = arena_tensor(A, (size_t)d.n_counts, DTYPE_INT32);
    sv->row_of_slot = arena_tensor(A, d.R, DTYPE_INT32);
    sv->xs = arena_floats(A, d.Rl * d.D);
    sv->gate = arena_floats(A, d.Rl * d.F);
    sv->up = arena_floats(A, d.Rl * d.F);
    sv->act = arena_floats(A, d.Rl * d.F);
    sv->out = arena_floats(A, d.R * d.D);
    bool shared = d.Fs > 0;
    sv->sgate = shared ? arena_floats(A, (size_t)rows * d.Fs) : NULL;
    sv->sup = shared ? arena_floats(A, (size_t)rows * d.Fs) : NULL;
    sv->sact = shared ? arena_floats(A, (size_t)rows * d.Fs) : NULL;
    bool aux = m->args->aux_loss_alpha > 0;
    sv->frac = aux ? arena_floats(A, 2 * (size_t)s->B * d.E) : NULL;
    size_t saved_end = arena_mark(A);  // scratch from here
    float *logits = arena_floats(A, (size_t)rows * d.E);
    float *dot = aux ? arena_floats(A, 1) : NULL;
    // Under expert parallel: the sorted rows before they travel, what arrives, and the experts'
    // outputs in their order.
    float *sorted = s->ep ? arena_floats(A, d.R * d.D) : NULL;
    float *arrived = s->ep ? arena_floats(A, d.Rl * d.D) : NULL;
    float *expert_out = s->ep ? arena_floats(A, d.Rl * d.D) : sv->out;
    linears_reserve(m, s, d);
    if (!step_sizing(s)) {
        route(m, s, sv, d, x, logits);
        const int *offs = host_offsets(m, s, sv, d);
        count_load(m, s, d.E);
        if (s->ep) exchange_counts(m, s, sv, d);
        ExpertRows r = expert_rows(m, s, d, offs);
        dispatch(s, sv, d, &r, x, sorted, arrived);
        experts_forward(m, s, sv, d, &r, expert_out);
        combine(s, sv, d, &r, expert_out, arrived, y);
        if (shared) shared_forward(m, s, sv, d, x, y);
        if (aux) aux_forward(m, s, sv, d, dot);
    }
    arena_release(A, saved_end);
}

// ---- backward --------------------------------------------------------------------------------

typedef struct {
    float *drows;             // (R, D) the slots' output grads, then the dispatched rows'
    // (Rl, D) x2 under expert parallel (else drows and NULL): the experts' output grads, then
    // their input rows' grads, in the experts' order; the rows as they arrive
    float *dgrouped, *arrived;
    float *dact, *dgate, *dup;  // (Rl, F) x3
    float *dweight;           // (rows * k) the combine weights' grads
    float *dlogits;           // (rows, E)
    float *dshared;           // (3 rows Fs) the shared experts' dact, dgate, dup (NULL without)
} MoeGrads;

static MoeGrads grads_carve(Arena *A, MoeDims d, bool ep) {
    MoeGrads g = {.drows = arena_floats(A, d.R * d.D)};
    g.dgrouped = ep ? arena_floats(A, d.Rl * d.D) : g.drows;
    g.arrived = ep ? arena_floats(A, d.Rl * d.D) : NULL;
    g.dact = arena_floats(A, d.Rl * d.F);
    g.dgate = arena_floats(A, 2 * d.Rl * d.F);
    g.dup = g.dgate ? g.dgate + d.Rl * d.F : NULL;
    g.dweight = arena_floats(A, d.R);
    g.dlogits = arena_floats(A, (size_t)d.rows * d.E);
    g.dshared = d.Fs > 0 ? arena_floats(A, 3 * (size_t)d.rows * d.Fs) : NULL;
    return g;
}

// Through the weighted combine: the experts' output rows get dy of their token times their
// weight, the weights get dot(dy, out).
static void combine_backward(const StepCtx *s, const MoeSaved *sv, const MoeGrads *g, MoeDims d,
                             const float *dy) {
    s->k->moe_permute(g->drows, dy, sv->weight, sv->row_of_slot, d.rows, d.k, d.D);
    s->k->zero(g->dweight, d.R * sizeof(float));
    s->k->moe_weight_grad(g->dweight, dy, sv->out, sv->row_of_slot, d.rows, d.k, d.D);
}

// From g->dgrouped, the experts' output grads, to g->dgrouped, their input rows' grads, with
// the experts' weight grads (this rank's experts).
static void experts_backward(MoeLayer *m, const StepCtx *s, const MoeSaved *sv,
                             const MoeGrads *g, MoeDims d, const ExpertRows *r) {
    const KernelOps *K = s->k;
    const int *offs = r->offs;
    int n = r->n_experts;
    float *dr = g->dgrouped;
    size_t kept = (size_t)offs[n] * d.F;
    linear_grouped_backward_input(&m->linear.w2, s, g->dact, dr, offs, 0);
    linear_grouped_backward_weight(&m->linear.w2, s, dr, sv->act, offs);
    K->swiglu_backward(g->dgate, g->dup, NULL, DTYPE_FP32, g->dact, sv->gate, sv->up, kept);
    linear_grouped_backward_input(&m->linear.w1, s, dr, g->dgate, offs, 0);
    linear_grouped_backward_input(&m->linear.w3, s, dr, g->dup, offs, 1);
    linear_grouped_backward_weight(&m->linear.w1, s, g->dgate, sv->xs, offs);
    linear_grouped_backward_weight(&m->linear.w3, s, g->dup, sv->xs, offs);
}

// The router's logits from the combine weights' grads (and the balance loss's), then the
// gate's grad and x's share.
static void route_backward(MoeLayer *m, const StepCtx *s, const MoeSaved *sv, const MoeGrads *g,
                           MoeDims d, const float *x, float *dx) {
    const KernelOps *K = s->k;
    K->zero(g->dlogits, (size_t)d.rows * d.E * sizeof(float));
    K->moe_router_backward(g->dlogits, g->dweight, sv->scores, sv->experts, &m->args->router,
                           d.rows);
    if (sv->frac) aux_backward(m, s, sv, d, g->dlogits);
    linear_backward_weight(&m->linear.gate, s, linear_fp32(g->dlogits), linear_fp32(x),
                           d.rows);
    linear_backward_input(&m->linear.gate, s, dx, linear_fp32(g->dlogits), d.rows, 1);
}

static void shared_backward(MoeLayer *m, const StepCtx *s, const MoeSaved *sv, const MoeGrads *g,
                            MoeDims d, const float *x, const float *dy, float *dx) {
    const KernelOps *K = s->k;
    size_t n = (size_t)d.rows * d.Fs;
    float *dact = g->dshared, *dgate = dact + n, *dup = dgate + n;
    linear_backward_input(&m->linear.shared_w2, s, dact, linear_fp32(dy), d.rows, 0);
    linear_backward_weight(&m->linear.shared_w2, s, linear_fp32(dy), linear_fp32(sv->sact),
                           d.rows);
    K->swiglu_backward(dgate, dup, NULL, DTYPE_FP32, dact, sv->sgate, sv->sup, n);
    linear_backward_input(&m->linear.shared_w1, s, dx, linear_fp32(dgate), d.rows, 1);
    linear_backward_input(&m->linear.shared_w3, s, dx, linear_fp32(dup), d.rows, 1);
    linear_backward_weight(&m->linear.shared_w1, s, linear_fp32(dgate), linear_fp32(x),
                           d.rows);
    linear_backward_weight(&m->linear.shared_w3, s, linear_fp32(dup), linear_fp32(x),
                           d.rows);
}

void moe_backward(MoeLayer *m, StepCtx *s, const MoeSaved *sv, const float *x, const float *dy,
                  float *dx, int rows) {
    MoeDims d = moe_dims(m, s, rows);
    size_t mark = arena_mark(s->act);
    MoeGrads g = grads_carve(s->act, d, s->ep != NULL);
    linears_reserve(m, s, d);
    if (!step_sizing(s)) {
        ExpertRows r = expert_rows(m, s, d, host_offsets(m, s, sv, d));
        combine_backward(s, sv, &g, d, dy);
        exchange_rows(s, &r, d, g.drows, g.arrived, g.dgrouped, false);
        experts_backward(m, s, sv, &g, d, &r);
        dispatch_backward(s, sv, d, &r, g.drows, g.arrived, g.dgrouped, dx);
        route_backward(m, s, sv, &g, d, x, dx);
        if (d.Fs > 0) shared_backward(m, s, sv, &g, d, x, dy, dx);
    }
    arena_release(s->act, mark);
}
