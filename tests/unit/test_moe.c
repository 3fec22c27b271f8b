// The MoE layer (models/moe) alone, on the cpu backend, against independent references: its
// forward against a naive double-precision loop over each token's chosen experts (router,
// top-k with the bias, route norm and scale, capacity drops in slot order, shared experts,
// the sequence-wise balance loss), its backward against central finite differences of the
// layer's own forward (loss = sum(y * r) + the balance loss, for a fixed r) for x and every
// parameter; the expert-load counts (none in a recompute); an expert no token chooses; the
// auxiliary-loss-free bias update; AdamW leaving the bias (a Param.buffer) alone.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "models/moe/balance.h"
#include "optim/optim.h"

#include "moe_support.h"

#define SEQS 2
#define SEQ_LEN 4
#define ROWS (SEQS * SEQ_LEN)
#define DIM 6
#define HIDDEN 5
#define EXPERTS 4
#define TOPK 2
#define SHARED 3

typedef struct {
    MoeBare moe;
    float load[EXPERTS];
    float x[ROWS * DIM], y[ROWS * DIM], r[ROWS * DIM], dx[ROWS * DIM];
    int counts[EXPERTS];  // of the last forward
    double aux;           // its balance loss
} Layer;

static double uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / (double)(1ull << 53) * 2 - 1;
}

// A layer with random weights (moe_bare_init's), random x and r.
static void layer_make(Layer *L, MoeScoreFunc score, bool route_norm, int shared,
                       double capacity_factor, double aux_alpha) {
    memset(L, 0, sizeof *L);
    L->moe.args = (MoeArgs){.dim = DIM, .hidden = HIDDEN, .shared_hidden = shared,
                            .capacity_factor = capacity_factor, .load_balance_coeff = 1e-3,
                            .aux_loss_alpha = aux_alpha,
                            .router = {.n_experts = EXPERTS, .top_k = TOPK, .score_func = score,
                                       .route_norm = route_norm, .route_scale = 1.5f}};
    moe_bare_init(&L->moe);
    moe_bare_allocate(&L->moe);
    params_initialize(&L->moe.t, 11);
    uint64_t s = 5;
    for (int i = 0; i < ROWS * DIM; i++) L->x[i] = (float)uniform(&s), L->r[i] = (float)uniform(&s);
}

static StepCtx step(Layer *L) {
    return (StepCtx){.k = kernels_backend("cpu"), .act = &L->moe.act, .B = SEQS, .T = SEQ_LEN,
                     .loss_scale = 1, .expert_load = L->load};
}

// y = MoE(x); with backward, dx and the parameter grads (zeroed first) of sum(y * r).
static void layer_run(Layer *L, bool backward, bool recompute) {
    StepCtx s = step(L);
    s.recompute = recompute;
    MoeSaved sv;
    memset(L->y, 0, sizeof L->y);
    moe_forward(&L->moe.m, &s, &sv, L->x, L->y, ROWS);
    memcpy(L->counts, sv.counts, sizeof L->counts);
    L->aux = s.aux_loss;
    if (backward) {
        memset(L->dx, 0, sizeof L->dx);
        memset(L->moe.t.grad, 0, L->moe.t.numel * sizeof(float));
        moe_backward(&L->moe.m, &s, &sv, L->x, L->r, L->dx, ROWS);
    }
    arena_release(&L->moe.act, 0);
}

// ---- the naive reference -----------------------------------------------------------------

static double silu(double g) { return g / (1 + exp(-g)); }

// Token t's chosen experts (descending by score + bias, ties to the lower id), weights and
// scores normalised to sum 1 (normed).
static void ref_route(const Layer *L, int t, int *chosen, double *weight, double *normed) {
    const float *x = L->x + t * DIM, *g = L->moe.m.gate->data, *bias = L->moe.m.expert_bias->data;
    double sc[EXPERTS], mx = -INFINITY, sum = 0;
    for (int e = 0; e < EXPERTS; e++) {
        sc[e] = 0;
        for (int i = 0; i < DIM; i++) sc[e] += (double)g[e * DIM + i] * x[i];
        mx = fmax(mx, sc[e]);
    }
    for (int e = 0; e < EXPERTS; e++) {
        if (L->moe.args.router.score_func == MOE_SCORE_SIGMOID) {
            sc[e] = 1 / (1 + exp(-sc[e]));
        } else {
            sc[e] = exp(sc[e] - mx);
            sum += sc[e];
        }
    }
    if (L->moe.args.router.score_func == MOE_SCORE_SOFTMAX)
        for (int e = 0; e < EXPERTS; e++) sc[e] /= sum;
    double total = 0;
    for (int e = 0; e < EXPERTS; e++) total += sc[e];
    for (int e = 0; e < EXPERTS; e++) normed[e] = sc[e] / total;
    bool taken[EXPERTS] = {false};
    double norm = 0;
    for (int j = 0; j < TOPK; j++) {
        int best = -1;
        for (int e = 0; e < EXPERTS; e++)
            if (!taken[e] && (best < 0 || sc[e] + bias[e] > sc[best] + bias[best])) best = e;
        taken[best] = true;
        chosen[j] = best;
        weight[j] = sc[best];
        norm += sc[best];
    }
    for (int j = 0; j < TOPK; j++) {
        if (L->moe.args.router.route_norm) weight[j] /= norm + 1e-20;
        weight[j] *= L->moe.args.router.route_scale;
    }
}

// y (DIM) += weight * the SwiGLU FFN of x (DIM): w1, w3 (F, DIM), w2 (DIM, F).
static void ref_ffn(double *y, const float *x, const float *w1, const float *w3,
                    const float *w2, int F, double weight) {
    double act[HIDDEN > SHARED ? HIDDEN : SHARED];
    for (int f = 0; f < F; f++) {
        double g = 0, u = 0;
        for (int i = 0; i < DIM; i++) g += (double)w1[f * DIM + i] * x[i];
        for (int i = 0; i < DIM; i++) u += (double)w3[f * DIM + i] * x[i];
        act[f] = silu(g) * u;
    }
    for (int i = 0; i < DIM; i++) {
        double o = 0;
        for (int f = 0; f < F; f++) o += (double)w2[i * F + f] * act[f];
        y[i] += weight * o;
    }
}

// y (ROWS, DIM), the counts of the routed slots per expert (slots dropped in slot order past
// the capacity) and the balance loss: alpha * the mean over sequences of sum_i f_i P_i.
static void ref_forward(const Layer *L, double *y, int *counts, double *aux) {
    const MoeLayer *m = &L->moe.m;
    int cap = L->moe.args.capacity_factor > 0
                  ? (int)ceil(L->moe.args.capacity_factor * ROWS * TOPK / EXPERTS) : ROWS * TOPK;
    int kept[EXPERTS] = {0};
    memset(counts, 0, EXPERTS * sizeof(int));
    memset(y, 0, ROWS * DIM * sizeof(double));
    size_t ef = (size_t)HIDDEN * DIM;
    double f[SEQS][EXPERTS] = {{0}}, P[SEQS][EXPERTS] = {{0}};
    for (int t = 0; t < ROWS; t++) {
        int chosen[TOPK];
        double weight[TOPK], normed[EXPERTS];
        ref_route(L, t, chosen, weight, normed);
        for (int e = 0; e < EXPERTS; e++) P[t / SEQ_LEN][e] += normed[e] / SEQ_LEN;
        for (int j = 0; j < TOPK; j++)
            f[t / SEQ_LEN][chosen[j]] += (double)EXPERTS / (TOPK * SEQ_LEN);
        const float *x = L->x + t * DIM;
        for (int j = 0; j < TOPK; j++) {
            int e = chosen[j];
            counts[e]++;
            if (kept[e]++ >= cap) continue;
            ref_ffn(y + t * DIM, x, m->w1->data + e * ef, m->w3->data + e * ef,
                    m->w2->data + e * ef, HIDDEN, weight[j]);
        }
        if (L->moe.args.shared_hidden)
            ref_ffn(y + t * DIM, x, m->shared_w1->data, m->shared_w3->data, m->shared_w2->data,
                    SHARED, 1);
    }
    *aux = 0;
    for (int b = 0; b < SEQS; b++)
        for (int e = 0; e < EXPERTS; e++)
            *aux += L->moe.args.aux_loss_alpha * f[b][e] * P[b][e] / SEQS;
}

static void check_forward(Layer *L) {
    double want[ROWS * DIM];
    int counts[EXPERTS];
    double aux;
    ref_forward(L, want, counts, &aux);
    memset(L->load, 0, sizeof L->load);
    layer_run(L, false, false);
    double scale = 0;
    for (int i = 0; i < ROWS * DIM; i++) scale = fmax(scale, fabs(want[i]));
    assert_true(scale > 0.1);
    for (int i = 0; i < ROWS * DIM; i++) assert_true(fabs(L->y[i] - want[i]) <= 1e-5 * scale);
    assert_true(fabs(L->aux - aux) <= 1e-6 * fmax(aux, 1e-3));
    for (int e = 0; e < EXPERTS; e++) {
        assert_int_equal(L->counts[e], counts[e]);
        assert_true(L->load[e] == (float)counts[e]);
    }
}

// ---- gradients against central differences of the layer itself ---------------------------

static double objective(Layer *L) {
    layer_run(L, false, false);
    double o = L->aux;
    for (int i = 0; i < ROWS * DIM; i++) o += (double)L->y[i] * L->r[i];
    return o;
}

// Every element of v (n) against the analytic grad (n), copied before the probing runs.
static void check_grad(Layer *L, float *v, const float *grad, size_t n, const char *what) {
    float *g = malloc(n * sizeof(float));
    memcpy(g, grad, n * sizeof(float));
    double gmax = 0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
    assert_true(gmax > 1e-3);
    const float h = 1e-2f;
    for (size_t i = 0; i < n; i++) {
        float v0 = v[i];
        v[i] = v0 + h;
        double up = objective(L);
        v[i] = v0 - h;
        double down = objective(L);
        v[i] = v0;
        double fd = (up - down) / (2 * h);
        if (fabs(fd - g[i]) > 2e-3 * gmax + 2e-3 * fabs(fd))
            fail_msg("%s[%zu]: analytic %g, finite difference %g", what, i, g[i], fd);
    }
    free(g);
}

static void check_backward(Layer *L) {
    layer_run(L, true, false);
    float dx[ROWS * DIM];
    memcpy(dx, L->dx, sizeof dx);
    check_grad(L, L->x, dx, ROWS * DIM, "x");  // the probing runs leave the grads as they are
    for (int i = 0; i < L->moe.t.count; i++) {
        Param *p = &L->moe.t.items[i];
        if (p->buffer) {  // the expert bias steers the choice only: no gradient
            for (size_t j = 0; j < p->numel; j++) assert_true(p->grad[j] == 0);
            continue;
        }
        check_grad(L, p->data, p->grad, p->numel, p->name);
    }
}

static void run_case(MoeScoreFunc score, bool route_norm, int shared, double capacity,
                     double aux_alpha) {
    Layer *L = malloc(sizeof *L);
    layer_make(L, score, route_norm, shared, capacity, aux_alpha);
    moe_bare_commit_act(&L->moe, step(L), ROWS);
    check_forward(L);
    check_backward(L);
    moe_bare_free(&L->moe);
    free(L);
}

static void test_softmax_route_norm(void **state) {
    (void)state;
    run_case(MOE_SCORE_SOFTMAX, true, 0, 0, 0);
}

static void test_sigmoid_shared_experts(void **state) {
    (void)state;
    run_case(MOE_SCORE_SIGMOID, false, SHARED, 0, 0);
}

// The balance loss (alpha 0.5, large enough that its gradient shows in every router grad),
// with softmax and with sigmoid scores.
static void test_aux_loss(void **state) {
    (void)state;
    run_case(MOE_SCORE_SOFTMAX, true, 0, 0, 0.5);
    run_case(MOE_SCORE_SIGMOID, true, 0, 0, 0.5);
}

// A capacity of ceil(0.5 * 8 * 2 / 4) = 2 slots per expert: some tokens lose an expert.
static void test_capacity_drops(void **state) {
    (void)state;
    Layer *L = malloc(sizeof *L);
    layer_make(L, MOE_SCORE_SOFTMAX, true, 0, 0.5, 0);
    moe_bare_commit_act(&L->moe, step(L), ROWS);
    check_forward(L);
    int most = 0;
    for (int e = 0; e < EXPERTS; e++) most = L->counts[e] > most ? L->counts[e] : most;
    assert_true(most > 2);
    check_backward(L);
    moe_bare_free(&L->moe);
    free(L);
}

// The bias keeps expert 3 out of every choice: no rows, zero grads, and the rest still right.
static void test_expert_without_tokens(void **state) {
    (void)state;
    Layer *L = malloc(sizeof *L);
    layer_make(L, MOE_SCORE_SOFTMAX, true, 0, 0, 0);
    L->moe.m.expert_bias->data[3] = -10;
    moe_bare_commit_act(&L->moe, step(L), ROWS);
    check_forward(L);
    assert_int_equal(L->counts[3], 0);
    layer_run(L, true, false);
    size_t ef = (size_t)HIDDEN * DIM;
    for (size_t i = 3 * ef; i < 4 * ef; i++) {
        const MoeLayer *m = &L->moe.m;
        assert_true(m->w1->grad[i] == 0 && m->w2->grad[i] == 0 && m->w3->grad[i] == 0);
    }
    check_backward(L);
    moe_bare_free(&L->moe);
    free(L);
}

// A recompute (activation checkpointing) routes the same tokens again: not counted twice.
static void test_recompute_not_counted(void **state) {
    (void)state;
    Layer *L = malloc(sizeof *L);
    layer_make(L, MOE_SCORE_SOFTMAX, true, 0, 0, 0);
    moe_bare_commit_act(&L->moe, step(L), ROWS);
    memset(L->load, 0, sizeof L->load);
    layer_run(L, false, false);
    layer_run(L, false, true);
    float total = 0;
    for (int e = 0; e < EXPERTS; e++) total += L->load[e];
    assert_true(total == ROWS * TOPK);
    moe_bare_free(&L->moe);
    free(L);
}

// torchtitan's rule: coeff * sign(mean - load), re-centred.
static void test_balance_step(void **state) {
    (void)state;
    float step[4];
    moe_balance_step(step, (const float[]){10, 2, 4, 4}, 4, 0.1);  // mean 5: -, +, +, +
    const float want[4] = {-0.15f, 0.05f, 0.05f, 0.05f};
    for (int e = 0; e < 4; e++) assert_true(fabsf(step[e] - want[e]) < 1e-7f);
    moe_balance_step(step, (const float[]){3, 3, 3, 3}, 4, 0.1);
    for (int e = 0; e < 4; e++) assert_true(step[e] == 0);
}

// Two layers' biases (buffers) between trained parameters: the update moves each by its
// layer's step, reports the load, restarts the count; AdamW with weight decay leaves them.
static void test_balance_update_and_optimizer(void **state) {
    (void)state;
    const KernelOps *k = kernels_backend("cpu");
    ParamTable t;
    params_init(&t, 4);
    int64_t n = 4;
    MoeBalance b;
    moe_balance_init(&b, 2, 4, 0.1, false);
    params_add(&t, INIT_ONES, 0, 1, &n, "w0");
    for (int l = 0; l < 2; l++) {
        int i = params_add(&t, INIT_ZEROS, 0, 1, &n, "layers.%d.moe.expert_bias_E", l);
        b.bias[l] = &t.items[i];
        b.bias[l]->buffer = true;
    }
    params_add(&t, INIT_ONES, 0, 1, &n, "w1");
    Arena data, grads, opt_state;
    arena_init_sizing(&data, "data");
    arena_init_sizing(&grads, "grads");
    params_allocate(&t, &data, &grads);
    arena_commit(&data, NULL);
    arena_commit(&grads, NULL);
    params_allocate(&t, &data, &grads);
    params_initialize(&t, 1);
    moe_balance_place(&b, k);
    const float load[8] = {10, 2, 4, 4, 5, 5, 5, 5};
    memcpy(b.load, load, sizeof load);
    moe_balance_load(&b, k);  // one rank: the sum over ranks is the load itself
    MoeLoadStats st = moe_balance_update(&b, k, &t);
    assert_true(fabs(st.max - 2.0) < 1e-12 && fabs(st.mean - 1.5) < 1e-12);
    const float want[4] = {-0.15f, 0.05f, 0.05f, 0.05f};
    for (int e = 0; e < 4; e++) {
        assert_true(fabsf(b.bias[0]->data[e] - want[e]) < 1e-7f);
        assert_true(b.bias[1]->data[e] == 0);
        assert_true(b.load[e] == 0 && b.load[4 + e] == 0);
    }
    for (size_t i = 0; i < t.numel; i++) t.grad[i] = 0.5f;  // as if a gradient reached all
    AdamW opt = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    arena_init_sizing(&opt_state, "opt");
    adamw_allocate(&opt, &t, &opt_state);
    arena_commit(&opt_state, NULL);
    adamw_allocate(&opt, &t, &opt_state);
    adamw_step(&opt, k, &t, opt.lr);
    for (int e = 0; e < 4; e++) {
        assert_true(fabsf(b.bias[0]->data[e] - want[e]) < 1e-7f);
        assert_true(t.items[0].data[e] < 0.9f && t.items[3].data[e] < 0.9f);  // trained
    }
    moe_balance_free(&b, k);
    params_free(&t);
    arena_free(&data);
    arena_free(&grads);
    arena_free(&opt_state);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_route_norm),
        cmocka_unit_test(test_sigmoid_shared_experts),
        cmocka_unit_test(test_capacity_drops),
        cmocka_unit_test(test_aux_loss),
        cmocka_unit_test(test_expert_without_tokens),
        cmocka_unit_test(test_recompute_not_counted),
        cmocka_unit_test(test_balance_step),
        cmocka_unit_test(test_balance_update_and_optimizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
