// The cpu backend's mixture-of-experts ops (router, sort, permute and combine, grouped GEMM)
// against references written plainly here: selection by a full sort of the experts, a stable
// counting of slots per expert, and GEMMs as triple loops; every backward against central
// finite differences. Cases include experts with no tokens (first, middle, last), capacity
// drops, group-limited routing and ties.
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/unit/kernel_check.h"

static const KernelOps *ops;

#define MAX_E 16  // experts (and groups) in the cases below

// ---- router reference ----------------------------------------------------------------------

static void router_ref_scores(double *s, const double *logits, const MoeRouter *r) {
    int E = r->n_experts;
    double mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++) {
        s[e] = r->score_func == MOE_SCORE_SIGMOID ? 1.0 / (1.0 + exp(-logits[e]))
                                                  : exp(logits[e] - mx);
        sum += s[e];
    }
    if (r->score_func == MOE_SCORE_SOFTMAX)
        for (int e = 0; e < E; e++) s[e] /= sum;
}

// order (n) = indices of key (n) by descending key, ties by ascending index (insertion sort).
static void sort_descending(int *order, const double *key, int n) {
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && key[order[j - 1]] < key[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

// The chosen experts (k) of one token: group scores from each group's two best selection
// scores, the limited groups kept, then the k best of what remains.
static void router_ref_select(int *experts, const double *scores, const float *bias,
                              const MoeRouter *r) {
    int E = r->n_experts, order[MAX_E];
    double sel[MAX_E];
    for (int e = 0; e < E; e++) sel[e] = scores[e] + (bias ? bias[e] : 0.0);
    if (r->n_groups > 1) {
        int G = r->n_groups, per = E / G, group_order[MAX_E];
        double group_score[MAX_E];
        for (int g = 0; g < G; g++) {
            sort_descending(order, sel + g * per, per);
            group_score[g] = sel[g * per + order[0]] + sel[g * per + order[1]];
        }
        sort_descending(group_order, group_score, G);
        for (int i = r->limited_groups; i < G; i++)
            for (int e = 0; e < per; e++) sel[group_order[i] * per + e] = -INFINITY;
    }
    sort_descending(order, sel, E);
    for (int j = 0; j < r->top_k; j++) experts[j] = order[j];
}

static void router_ref_weights(double *weight, const double *scores, const int *experts,
                               const MoeRouter *r) {
    double sum = 0.0;
    for (int j = 0; j < r->top_k; j++) sum += scores[experts[j]];
    for (int j = 0; j < r->top_k; j++)
        weight[j] = scores[experts[j]] / (r->route_norm ? sum + 1e-20 : 1.0) * r->route_scale;
}

typedef struct RouterCase {
    MoeRouter r;
    int n;
    double *logits;        // (n, E)
    const int *experts;    // (n, k): the selection, which the loss holds fixed
    const float *dweight;  // (n, k): the loss weights
} RouterCase;

static double router_loss(const void *ctx) {
    const RouterCase *c = ctx;
    int E = c->r.n_experts, k = c->r.top_k;
    double loss = 0.0, s[MAX_E], w[MAX_E];
    for (int i = 0; i < c->n; i++) {
        router_ref_scores(s, c->logits + i * E, &c->r);
        router_ref_weights(w, s, c->experts + i * k, &c->r);
        for (int j = 0; j < k; j++) loss += w[j] * c->dweight[i * k + j];
    }
    return loss;
}

// Forward against the reference; then, with finite differences on, backward.
static void router_check(const MoeRouter *r, const float *logits, const float *bias, int n,
                         bool with_fd) {
    int E = r->n_experts, k = r->top_k;
    float *weight = floats_random((size_t)n * k, 1.0), *scores = floats_random((size_t)n * E, 1.0);
    int *experts = calloc((size_t)n * k, sizeof *experts);
    ops->moe_router_forward(weight, experts, scores, logits, bias, r, n);
    double *want_s = doubles_zero((size_t)n * E), *want_w = doubles_zero((size_t)n * k);
    double *dlogits = doubles_from(logits, (size_t)n * E);
    for (int i = 0; i < n; i++) {
        int want_e[MAX_E];
        router_ref_scores(want_s + i * E, dlogits + i * E, r);
        router_ref_select(want_e, want_s + i * E, bias, r);
        for (int j = 0; j < k; j++) assert_int_equal(experts[i * k + j], want_e[j]);
        router_ref_weights(want_w + i * k, want_s + i * E, want_e, r);
    }
    assert_close("router scores", scores, want_s, (size_t)n * E, FWD_TOL);
    assert_close("router weight", weight, want_w, (size_t)n * k, FWD_TOL);
    if (with_fd) {
        float *dweight = floats_random((size_t)n * k, 1.0);
        float *prefill = floats_random((size_t)n * E, 1.0);
        float *got = floats_copy(prefill, (size_t)n * E);
        ops->moe_router_backward(got, dweight, scores, experts, r, n);
        RouterCase c = {*r, n, dlogits, experts, dweight};
        double *fd = fd_gradient(dlogits, (size_t)n * E, router_loss, &c);
        double *want = doubles_sum(prefill, fd, (size_t)n * E);
        assert_close("router dlogits", got, want, (size_t)n * E, FD_TOL);
        free(dweight), free(prefill), free(got), free(fd), free(want);
    }
    free(weight), free(scores), free(experts), free(want_s), free(want_w), free(dlogits);
}

static void test_moe_router(void **state) {
    (void)state;
    rng_seed(41);
    int n = 11;
    float *logits = floats_random((size_t)n * 8, 2.0), *bias = floats_random(8, 0.3);
    for (int func = 0; func < 2; func++)
        for (int norm = 0; norm < 2; norm++) {
            MoeRouter r = {.n_experts = 8, .top_k = 3, .score_func = (MoeScoreFunc)func,
                           .route_norm = norm, .route_scale = norm ? 2.5f : 1.0f};
            router_check(&r, logits, NULL, n, true);
            router_check(&r, logits, bias, n, true);
        }
    free(logits), free(bias);
}

// Four groups of four, two kept: the case is only meaningful if limiting changes some choice.
static void test_moe_router_groups(void **state) {
    (void)state;
    rng_seed(42);
    int n = 16, E = 16;
    float *logits = floats_random((size_t)n * E, 2.0), *bias = floats_random(E, 0.2);
    MoeRouter r = {.n_experts = E, .top_k = 4, .score_func = MOE_SCORE_SIGMOID, .n_groups = 4,
                   .limited_groups = 2, .route_norm = true, .route_scale = 1.5f};
    MoeRouter open = r;
    open.n_groups = 0;
    bool differs = false;
    for (int i = 0; i < n; i++) {
        double s[MAX_E], l[MAX_E];
        int limited[MAX_E], all[MAX_E];
        for (int e = 0; e < E; e++) l[e] = logits[i * E + e];
        router_ref_scores(s, l, &r);
        router_ref_select(limited, s, bias, &r);
        router_ref_select(all, s, bias, &open);
        for (int j = 0; j < r.top_k; j++) differs |= limited[j] != all[j];
    }
    assert_true(differs);
    router_check(&r, logits, bias, n, true);
    r.score_func = MOE_SCORE_SOFTMAX;
    router_check(&r, logits, NULL, n, true);
    free(logits), free(bias);
}

// Equal logits give bit-equal scores, so ties are exact: they go to the lower expert (and group).
static void test_moe_router_ties(void **state) {
    (void)state;
    float logits[3 * 8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f,  // all tied
                           0.1f, 0.9f, 0.2f, 0.9f, 0.3f, 0.3f, 0.9f, 0.0f,  // a triple, a pair
                           1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1.0f, 0.0f, 1.0f}; // tied groups
    int want[3][3] = {{0, 1, 2}, {1, 3, 6}, {0, 2, 5}};
    for (int func = 0; func < 2; func++) {
        MoeRouter r = {.n_experts = 8, .top_k = 3, .score_func = (MoeScoreFunc)func,
                       .route_scale = 1.0f};
        router_check(&r, logits, NULL, 3, false);
        r.n_groups = 4, r.limited_groups = 2;
        router_check(&r, logits, NULL, 3, false);
        float weight[9], scores[24];
        int experts[9];
        r.n_groups = 0;
        ops->moe_router_forward(weight, experts, scores, logits, NULL, &r, 3);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) assert_int_equal(experts[i * 3 + j], want[i][j]);
    }
}

// ---- sort ----------------------------------------------------------------------------------

// Experts 0, 3 and 5 (first, middle, last) receive nothing; 2 and 4 overflow a capacity of 3.
static const int sort_experts[14] = {2, 1, 4, 2, 2, 1, 4, 4, 2, 1, 2, 4, 1, 2};
#define SORT_E 6

static void sort_ref(int *counts, int *offsets, int *row_of_slot, const int *experts, int n,
                     int E, int capacity) {
    int row = 0;
    offsets[0] = 0;
    for (int e = 0; e < E; e++) {
        counts[e] = 0;
        for (int s = 0; s < n; s++) {
            if (experts[s] != e) continue;
            counts[e]++;
            row_of_slot[s] = capacity == 0 || counts[e] <= capacity ? row++ : -1;
        }
        offsets[e + 1] = row;
    }
}

static void test_moe_sort(void **state) {
    (void)state;
    int n = 14;
    for (int capacity = 0; capacity <= 3; capacity += 3) {
        int counts[SORT_E], offsets[SORT_E + 1], rows[14], want_c[SORT_E], want_o[SORT_E + 1],
            want_r[14];
        ops->moe_sort(counts, offsets, rows, sort_experts, n, SORT_E, capacity);
        sort_ref(want_c, want_o, want_r, sort_experts, n, SORT_E, capacity);
        assert_memory_equal(counts, want_c, sizeof counts);
        assert_memory_equal(offsets, want_o, sizeof offsets);
        assert_memory_equal(rows, want_r, sizeof rows);
    }
    int counts[SORT_E], offsets[SORT_E + 1], rows[14];
    ops->moe_sort(counts, offsets, rows, sort_experts, n, SORT_E, 3);
    assert_int_equal(counts[2], 6);      // counts are before the capacity
    assert_int_equal(offsets[SORT_E], 9);  // 3 + 3 + 3 kept, 5 dropped
}

// ---- permute, combine and the combine's weight gradient ------------------------------------

typedef struct DispatchCase {
    int n, k, dim, n_rows;
    const int *row_of_slot;  // (n*k)
    double *x;               // (n, dim) tokens, for the dispatch
    double *rows, *weight;   // (n_rows, dim), (n*k), for the combine
    const float *g;          // the loss weights of the output
} DispatchCase;

// The combine y (n, dim) = sum over kept slots of weight * rows (into y, which starts at 0).
static void combine_ref(double *y, const DispatchCase *c) {
    for (int s = 0; s < c->n * c->k; s++) {
        int r = c->row_of_slot[s];
        if (r < 0) continue;
        for (int d = 0; d < c->dim; d++)
            y[(s / c->k) * c->dim + d] += c->weight[s] * c->rows[r * c->dim + d];
    }
}

// The dispatch out (n_rows, dim): each kept slot's token row.
static void dispatch_ref(double *out, const DispatchCase *c) {
    for (int s = 0; s < c->n * c->k; s++)
        if (c->row_of_slot[s] >= 0)
            for (int d = 0; d < c->dim; d++)
                out[c->row_of_slot[s] * c->dim + d] = c->x[(s / c->k) * c->dim + d];
}

static double combine_loss(const void *ctx) {
    const DispatchCase *c = ctx;
    double *y = doubles_zero((size_t)c->n * c->dim);
    combine_ref(y, c);
    double l = dot_weights(y, c->g, (size_t)c->n * c->dim);
    free(y);
    return l;
}

static double dispatch_loss(const void *ctx) {
    const DispatchCase *c = ctx;
    double *out = doubles_zero((size_t)c->n_rows * c->dim);
    dispatch_ref(out, c);
    double l = dot_weights(out, c->g, (size_t)c->n_rows * c->dim);
    free(out);
    return l;
}

// 7 tokens, k = 2, over the sort case's experts, capacity 3: dropped slots and empty experts.
static void test_moe_permute_combine(void **state) {
    (void)state;
    rng_seed(43);
    int n = 7, k = 2, dim = 5, counts[SORT_E], offsets[SORT_E + 1], row_of_slot[14];
    ops->moe_sort(counts, offsets, row_of_slot, sort_experts, n * k, SORT_E, 3);
    int n_rows = offsets[SORT_E];
    size_t xs = (size_t)n * dim, rs = (size_t)n_rows * dim;
    float *x = floats_random(xs, 1.0), *rows = floats_random(rs, 1.0);
    float *weight = floats_random((size_t)n * k, 1.0), *gy = floats_random(xs, 1.0);
    float *gout = floats_random(rs, 1.0);
    DispatchCase c = {n, k, dim, n_rows, row_of_slot, doubles_from(x, xs), doubles_from(rows, rs),
                      doubles_from(weight, (size_t)n * k), gy};

    // combine forward: y accumulates
    float *y = floats_random(xs, 1.0);
    double *y_ref = doubles_zero(xs);
    combine_ref(y_ref, &c);
    double *want = doubles_sum(y, y_ref, xs);
    ops->moe_unpermute(y, rows, weight, row_of_slot, n, k, dim);
    assert_close("combine", y, want, xs, FWD_TOL);
    free(want);

    // combine backward: drows by the weighted permute, dweight by weight_grad
    float *drows = floats_random(rs, 1.0);
    ops->moe_permute(drows, gy, weight, row_of_slot, n, k, dim);
    double *fd = fd_gradient(c.rows, rs, combine_loss, &c);
    assert_close("combine drows", drows, fd, rs, FD_TOL);
    free(fd);
    float *dweight = floats_random((size_t)n * k, 1.0), *dw_prefill = floats_copy(dweight, n * k);
    ops->moe_weight_grad(dweight, gy, rows, row_of_slot, n, k, dim);
    fd = fd_gradient(c.weight, (size_t)n * k, combine_loss, &c);
    want = doubles_sum(dw_prefill, fd, (size_t)n * k);
    assert_close("combine dweight", dweight, want, (size_t)n * k, FD_TOL);
    free(fd), free(want);

    // dispatch forward, and its backward by the unweighted combine
    float *out = floats_random(rs, 1.0);
    double *out_ref = doubles_zero(rs);
    dispatch_ref(out_ref, &c);
    ops->moe_permute(out, x, NULL, row_of_slot, n, k, dim);
    assert_close("dispatch", out, out_ref, rs, FWD_TOL);
    c.g = gout;
    float *dx = floats_random(xs, 1.0), *dx_prefill = floats_copy(dx, xs);
    ops->moe_unpermute(dx, gout, NULL, row_of_slot, n, k, dim);
    fd = fd_gradient(c.x, xs, dispatch_loss, &c);
    want = doubles_sum(dx_prefill, fd, xs);
    assert_close("dispatch dx", dx, want, xs, FD_TOL);
    free(fd), free(want);

    free(x), free(rows), free(weight), free(gy), free(gout), free(c.x), free(c.rows),
        free(c.weight), free(y), free(y_ref), free(drows), free(dweight), free(dw_prefill),
        free(out), free(out_ref), free(dx), free(dx_prefill);
}

// ---- grouped GEMM --------------------------------------------------------------------------

// Groups 0, 2 and 4 (first, middle, last) have no rows.
#define GM_GROUPS 5
static const int gm_offsets[GM_GROUPS + 1] = {0, 0, 3, 3, 7, 7};

// The contract's three forms as plain loops, in double; c starts as beta * c.
static void grouped_ref(double *c, const float *a, const float *b, int n, int k, bool ta,
                        bool tb) {
    for (int g = 0; g < GM_GROUPS; g++)
        for (int r = gm_offsets[g]; r < gm_offsets[g + 1]; r++)
            for (int i = 0; i < (ta ? k : 1); i++)
                for (int j = 0; j < n; j++) {
                    double s = 0.0;
                    if (ta)  // c_g[i][j] += a[r][i] b[r][j]
                        s = (double)a[r * k + i] * b[r * n + j];
                    else
                        for (int p = 0; p < k; p++)
                            s += (double)a[r * k + p] *
                                 (tb ? b[(g * n + j) * k + p] : b[(g * k + p) * n + j]);
                    c[ta ? (g * k + i) * n + j : r * n + j] += s;
                }
}

static void grouped_check(int n, int k, bool ta, bool tb, float beta) {
    int rows = gm_offsets[GM_GROUPS];
    size_t as = (size_t)rows * k, bs = ta ? (size_t)rows * n : (size_t)GM_GROUPS * n * k;
    size_t cs = ta ? (size_t)GM_GROUPS * k * n : (size_t)rows * n;
    float *a = floats_random(as, 1.0), *b = floats_random(bs, 1.0), *c = floats_random(cs, 1.0);
    double *want = doubles_zero(cs);
    for (size_t i = 0; i < cs; i++) want[i] = beta * (double)c[i];
    if (beta == 0.0f)
        for (size_t i = 0; i < cs; i++) c[i] = NAN;  // beta == 0 must not read c
    grouped_ref(want, a, b, n, k, ta, tb);
    ops->grouped_matmul(c, a, b, gm_offsets, GM_GROUPS, n, k, ta, tb, beta);
    char what[64];
    snprintf(what, sizeof what, "grouped_matmul n %d k %d ta %d tb %d beta %g", n, k, ta, tb,
             beta);
    assert_close(what, c, want, cs, FWD_TOL);
    free(a), free(b), free(c), free(want);
}

static void test_grouped_matmul(void **state) {
    (void)state;
    rng_seed(44);
    for (int beta = 0; beta < 2; beta++) {
        grouped_check(6, 5, false, true, (float)beta);
        grouped_check(6, 5, false, false, (float)beta);
        grouped_check(6, 5, true, false, (float)beta);
    }
}

typedef struct GroupedCase {
    int n, k;
    double *a, *w;   // (rows, k), (groups, n, k)
    const float *g;  // (rows, n): the loss weights of c = a W_g^T
} GroupedCase;

static double grouped_loss(const void *ctx) {
    const GroupedCase *c = ctx;
    double l = 0.0;
    for (int g = 0; g < GM_GROUPS; g++)
        for (int r = gm_offsets[g]; r < gm_offsets[g + 1]; r++)
            for (int j = 0; j < c->n; j++)
                for (int p = 0; p < c->k; p++)
                    l += c->g[r * c->n + j] * c->a[r * c->k + p] * c->w[(g * c->n + j) * c->k + p];
    return l;
}

// The forward's gradients as the MoE layer takes them: dA = dC W_g (trans_b false), dW_g =
// dC[R_g]^T A[R_g] (trans_a), both accumulating (beta 1); empty groups' dW_g keep the prefill.
static void test_grouped_matmul_gradients(void **state) {
    (void)state;
    rng_seed(45);
    int n = 6, k = 5, rows = gm_offsets[GM_GROUPS];
    size_t as = (size_t)rows * k, ws = (size_t)GM_GROUPS * n * k;
    float *a = floats_random(as, 1.0), *w = floats_random(ws, 1.0);
    float *g = floats_random((size_t)rows * n, 1.0);
    float *da = floats_random(as, 1.0), *da0 = floats_copy(da, as);
    float *dw = floats_random(ws, 1.0), *dw0 = floats_copy(dw, ws);
    ops->grouped_matmul(da, g, w, gm_offsets, GM_GROUPS, k, n, false, false, 1.0f);
    ops->grouped_matmul(dw, g, a, gm_offsets, GM_GROUPS, k, n, true, false, 1.0f);
    GroupedCase c = {n, k, doubles_from(a, as), doubles_from(w, ws), g};
    double *fd = fd_gradient(c.a, as, grouped_loss, &c), *want = doubles_sum(da0, fd, as);
    assert_close("grouped_matmul da", da, want, as, FD_TOL);
    free(fd), free(want);
    fd = fd_gradient(c.w, ws, grouped_loss, &c), want = doubles_sum(dw0, fd, ws);
    assert_close("grouped_matmul dw", dw, want, ws, FD_TOL);
    free(fd), free(want);
    free(a), free(w), free(g), free(da), free(da0), free(dw), free(dw0), free(c.a), free(c.w);
}

static int setup_backend(void **state) {
    (void)state;
    ops = kernels_backend("cpu");
    return ops ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_router),
        cmocka_unit_test(test_moe_router_groups),
        cmocka_unit_test(test_moe_router_ties),
        cmocka_unit_test(test_moe_sort),
        cmocka_unit_test(test_moe_permute_combine),
        cmocka_unit_test(test_grouped_matmul),
        cmocka_unit_test(test_grouped_matmul_gradients),
    };
    return cmocka_run_group_tests(tests, setup_backend, NULL);
}
