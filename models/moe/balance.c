#include "models/moe/balance.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

void moe_balance_init(MoeBalance *b, int n_layers, int n_experts, double coeff, bool aux_loss) {
    *b = (MoeBalance){.n_layers = n_layers, .n_experts = n_experts, .coeff = coeff,
                      .aux_loss = aux_loss};
    b->load = xcalloc((size_t)n_layers * n_experts, sizeof(float));
    b->bias = xcalloc((size_t)n_layers, sizeof(Param *));
    b->step = xcalloc((size_t)n_experts, sizeof(float));
}

void moe_balance_place(MoeBalance *b, const KernelOps *k) {
    b->scratch = k->alloc((size_t)b->n_layers * b->n_experts * sizeof(float));
    CHECK(b->scratch != NULL);
}

void moe_balance_free(MoeBalance *b, const KernelOps *k) {
    if (b->scratch) k->free(b->scratch);
    free(b->load);
    free(b->bias);
    free(b->step);
    *b = (MoeBalance){0};
}

float *moe_balance_load(MoeBalance *b, const KernelOps *k) {
    k->upload(b->scratch, b->load, (size_t)b->n_layers * b->n_experts * sizeof(float));
    return b->scratch;
}

void moe_balance_step(float *step, const float *load, int n_experts, double coeff) {
    double mean = 0, step_mean = 0;
    for (int e = 0; e < n_experts; e++) mean += load[e];
    mean /= n_experts;
    for (int e = 0; e < n_experts; e++) {
        double d = mean - load[e];
        step[e] = (float)(coeff * (d > 0 ? 1 : d < 0 ? -1 : 0));
        step_mean += step[e];
    }
    step_mean /= n_experts;
    for (int e = 0; e < n_experts; e++) step[e] = (float)(step[e] - step_mean);
}

static MoeLoadStats load_stats(const MoeBalance *b) {
    MoeLoadStats st = {0, 0};
    int E = b->n_experts;
    for (int l = 0; l < b->n_layers; l++) {
        const float *load = b->load + (size_t)l * E;
        double sum = 0, most = 0;
        for (int e = 0; e < E; e++) {
            sum += load[e];
            most = load[e] > most ? load[e] : most;
        }
        double ratio = sum > 0 ? most * E / sum : 0;
        st.max = ratio > st.max ? ratio : st.max;
        st.mean += ratio / b->n_layers;
    }
    return st;
}

// bias shard += the part of step (E, the whole vector's) that this rank's box of it holds.
static void bias_add(const KernelOps *k, ParamTable *t, const Param *p, float *dev_step,
                     const float *step) {
    ParamBox box = param_box(p, true);
    size_t n = box_numel(&box);
    if (n == 0) return;  // another pipeline stage's layer
    k->upload(dev_step, step + box_start(&box, 0), n * sizeof(float));
    k->add(t->shard_data + p->shard_offset, dev_step, n);
}

MoeLoadStats moe_balance_update(MoeBalance *b, const KernelOps *k, ParamTable *t) {
    int E = b->n_experts;
    size_t n = (size_t)b->n_layers * E;
    k->download(b->load, b->scratch, n * sizeof(float));
    MoeLoadStats st = load_stats(b);
    for (int l = 0; l < b->n_layers && b->coeff > 0; l++) {
        moe_balance_step(b->step, b->load + (size_t)l * E, E, b->coeff);
        bias_add(k, t, b->bias[l], b->scratch + (size_t)l * E, b->step);
    }
    memset(b->load, 0, n * sizeof(float));
    return st;
}
