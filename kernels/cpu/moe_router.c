// The token-choice top-k router (torchtitan's TokenChoiceTopKRouter), one token per iteration:
// every output row has one owner, and each row's sums run in expert or choice order.
#include <math.h>

#include "kernels/cpu/cpu.h"

// scores (E) = softmax or sigmoid of logits (E), in fp32 as torchtitan computes them.
static void router_scores(float *scores, const float *logits, MoeScoreFunc func, int E) {
    if (func == MOE_SCORE_SIGMOID) {
        for (int e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + cpu_expf(-logits[e]));
        return;
    }
    float mx = cpu_max_floats(logits, E), sum = 0.0f;
    for (int e = 0; e < E; e++) {
        scores[e] = cpu_expf(logits[e] - mx);
        sum += scores[e];
    }
    for (int e = 0; e < E; e++) scores[e] /= sum;
}

// The index of the largest sel[i] not yet taken, the lowest index on ties; -inf counts (a
// masked group's expert is still chosen when too few remain, as torch.topk would).
static int router_argmax(const float *sel, const bool *taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || sel[i] > sel[best])) best = i;
    return best;
}

// Group-limited routing (DeepSeek V3): a group's score is the sum of its top-2 selection
// scores; all but the limited_groups best groups (ties to the lower group) get -inf.
static void router_limit_groups(float *sel, const MoeRouter *r) {
    int G = r->n_groups, per = r->n_experts / G;
    float group_score[G];
    bool keep[G];
    for (int g = 0; g < G; g++) {
        const float *s = sel + (size_t)g * per;
        float first = -INFINITY, second = -INFINITY;
        for (int i = 0; i < per; i++) {
            if (s[i] > first) second = first, first = s[i];
            else if (s[i] > second) second = s[i];
        }
        group_score[g] = first + second;
        keep[g] = false;
    }
    for (int j = 0; j < r->limited_groups; j++) keep[router_argmax(group_score, keep, G)] = true;
    for (int g = 0; g < G; g++)
        if (!keep[g])
            for (int i = 0; i < per; i++) sel[(size_t)g * per + i] = -INFINITY;
}

// One token: its k experts by repeated argmax of the selection scores, and their weights.
static void router_choose(float *weight, int *experts, const float *scores, const float *bias,
                          const MoeRouter *r) {
    int E = r->n_experts, k = r->top_k;
    float sel[E];
    bool taken[E];
    for (int e = 0; e < E; e++) sel[e] = scores[e] + (bias ? bias[e] : 0.0f), taken[e] = false;
    if (r->n_groups > 1) router_limit_groups(sel, r);
    float sum = 0.0f;
    for (int j = 0; j < k; j++) {
        int e = router_argmax(sel, taken, E);
        taken[e] = true;
        experts[j] = e;
        weight[j] = scores[e];
        sum += scores[e];
    }
    for (int j = 0; j < k; j++) {  // in torch's order: divide by the sum, then scale
        if (r->route_norm) weight[j] /= sum + 1e-20f;
        weight[j] *= r->route_scale;
    }
}

void cpu_moe_router_forward(float *weight, int *experts, float *scores, const float *logits,
                            const float *bias, const MoeRouter *r, int n) {
    CHECK(r->top_k >= 1 && r->top_k <= r->n_experts);
    CHECK(r->n_groups <= 1 || (r->n_experts % r->n_groups == 0 &&
                               r->limited_groups >= 1 && r->limited_groups <= r->n_groups));
    int E = r->n_experts, k = r->top_k;
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        float *s = scores + (size_t)i * E;
        router_scores(s, logits + (size_t)i * E, r->score_func, E);
        router_choose(weight + (size_t)i * k, experts + (size_t)i * k, s, bias, r);
    }
}

// dscores of one token's chosen experts from dweight: weight_j = c * s_j / D with D = sum_i s_i
// + 1e-20 under route_norm (so dweight reaches every chosen score through D), else c * s_j.
static void router_dscores(float *ds, const float *dweight, const float *scores,
                           const int *experts, const MoeRouter *r) {
    int k = r->top_k;
    if (!r->route_norm) {
        for (int j = 0; j < k; j++) ds[experts[j]] = r->route_scale * dweight[j];
        return;
    }
    float sum = 0.0f, dot = 0.0f;
    for (int j = 0; j < k; j++) sum += scores[experts[j]];
    float D = sum + 1e-20f;
    for (int j = 0; j < k; j++) dot += dweight[j] * scores[experts[j]];
    for (int j = 0; j < k; j++) ds[experts[j]] = r->route_scale * (dweight[j] - dot / D) / D;
}

void cpu_moe_router_backward(float *dlogits, const float *dweight, const float *scores,
                             const int *experts, const MoeRouter *r, int n) {
    int E = r->n_experts, k = r->top_k;
#pragma omp parallel for
    for (int i = 0; i < n; i++) {
        const float *s = scores + (size_t)i * E;
        float *dl = dlogits + (size_t)i * E;
        float ds[E];
        for (int e = 0; e < E; e++) ds[e] = 0.0f;
        router_dscores(ds, dweight + (size_t)i * k, s, experts + (size_t)i * k, r);
        if (r->score_func == MOE_SCORE_SIGMOID) {
            for (int e = 0; e < E; e++) dl[e] += ds[e] * s[e] * (1.0f - s[e]);
            continue;
        }
        float dot = 0.0f;  // softmax: dlogit_e = s_e (ds_e - sum_f ds_f s_f)
        for (int e = 0; e < E; e++) dot += ds[e] * s[e];
        for (int e = 0; e < E; e++) dl[e] += s[e] * (ds[e] - dot);
    }
}
