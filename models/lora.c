#include "models/lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint.h"
#include "core/errors.h"
#include "core/nf4.h"
#include "parallel/mesh.h"
#include "parallel/tp.h"

// PEFT's check_target_module_exists for a string entry: the whole name, or its end after a dot.
static bool entry_matches(const char *entry, const char *module) {
    size_t n = strlen(module), e = strlen(entry);
    if (e > n) return false;
    return !strcmp(module + n - e, entry) && (e == n || module[n - e - 1] == '.');
}

bool lora_targets(const LoraSection *lora, const char *module) {
    if (lora->target_modules.count == 0) return true;
    for (int i = 0; i < lora->target_modules.count; i++)
        if (entry_matches(lora->target_modules.items[i], module)) return true;
    return false;
}

int lora_add_adapters(ParamTable *t, const LoraSection *lora, const char *module, int64_t out,
                      int64_t in) {
    if (!lora || !lora_targets(lora, module)) return 0;
    int64_t a[2] = {lora->rank, in}, b[2] = {out, lora->rank};
    params_add(t, INIT_KAIMING_UNIFORM, 0, 2, a, "%s.lora_a.weight", module);
    params_add(t, INIT_ZEROS, 0, 2, b, "%s.lora_b.weight", module);
    return 2;
}

Param *lora_add_linear(ParamTable *t, const LoraSection *lora, ParamInit init, double std,
                       int64_t out, int64_t in, const char *prefix, const char *module) {
    int64_t shape[2] = {out, in};
    Param *w = &t->items[params_add(t, init, std, 2, shape, "%s%s.weight", prefix, module)];
    char name[PARAM_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", prefix, module);
    lora_add_adapters(t, lora, name, out, in);
    return w;
}

bool lora_adapter_of(const char *name, char *module, size_t n, char *which) {
    size_t len = strlen(name), suffix = strlen(".lora_a.weight");
    if (len <= suffix || (strcmp(name + len - suffix, ".lora_a.weight") &&
                          strcmp(name + len - suffix, ".lora_b.weight")))
        return false;
    if (which) *which = name[len - suffix + strlen(".lora_")];
    if (module) snprintf(module, n, "%.*s.weight", (int)(len - suffix), name);
    return true;
}

// The adapter `which` ("lora_a") of module, NULL if the build added none.
static Param *adapter_of(Model *m, const char *module, const char *which) {
    char name[PARAM_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.%s.weight", module, which);
    return params_find(&m->params, name);
}

// MFU's FLOPs with the base frozen: its weights' GEMMs lose the weight gradient's share (4 of
// the build's 6 FLOPs per weight per token remain), the adapters keep all 6. A block's GEMM
// FLOPs were 6 (frozen + adapters); they become 4 frozen + 6 adapters.
static void count_flops(Model *m) {
    m->flops_per_token = 0;
    for (int b = 0, param = 0; b < m->n_blocks; b++) {
        double adapters = 0;
        for (int j = 0; j < m->blocks[b].n_params; j++, param++)
            if (lora_adapter_of(m->params.items[param].name, NULL, 0, NULL))
                adapters += (double)param_global_numel(&m->params.items[param]);
        BlockFlops *f = &m->block_flops[b];
        f->gemm = f->gemm * 2 / 3 + 2 * adapters;
        f->gemm_done = f->gemm_done * 2 / 3 + 2 * adapters;
        m->flops_per_token += f->gemm + f->attention;
    }
}

void model_convert_lora(Model *m, const Config *c) {
    const LoraSection *lora = &c->lora;
    char origin[512];
    int adapted = 0;
    for (int i = 0; i < m->n_linears; i++) {
        ModelLinear *e = &m->linears[i];
        Param *a = adapter_of(m, e->module, "lora_a"), *b = adapter_of(m, e->module, "lora_b");
        CHECK(!a == !b && (!a || lora_targets(lora, e->module)));
        if (!a) continue;
        if (strcmp(e->linear->weight->name, "output.weight") && !strcmp(e->module, "output")) {
            CHECK(config_key_origin(c, "lora.target_modules", origin, sizeof origin));
            die_user("%s: lora.target_modules adapts output, which is the embedding's transpose "
                     "in this tied model %s %s: its adapter could be neither merged nor "
                     "exported; name the modules to adapt without it", origin, c->model.name,
                     c->model.flavor);
        }
        e->linear->lora_a = a;
        e->linear->lora_b = b;
        e->linear->lora_scale = (float)(lora->alpha / (double)lora->rank);
        e->linear->lora_dropout = (float)lora->dropout;
        e->linear->lora_id = (uint32_t)i;
        adapted++;
    }
    for (int k = 0; k < lora->target_modules.count; k++) {
        const char *entry = lora->target_modules.items[k];
        bool named = false;
        for (int i = 0; i < m->n_linears && !named; i++)
            named = m->linears[i].linear->lora_a && entry_matches(entry, m->linears[i].module);
        if (named) continue;
        CHECK(config_key_origin(c, "lora.target_modules", origin, sizeof origin));
        die_user("%s: lora.target_modules entry %s names no Linear of model %s %s", origin,
                 entry, c->model.name, c->model.flavor);
    }
    CHECK(adapted > 0);  // the spec says its build adds them (ModelSpec.lora)
    for (int i = 0; i < m->params.count; i++) {
        Param *p = &m->params.items[i];
        p->frozen = !lora_adapter_of(p->name, NULL, 0, NULL) && !p->buffer;
    }
    params_layout_grads(&m->params);  // the frozen take no shard grads
    for (int i = 0; i < m->n_linears && lora->quantize_base; i++)
        if (m->linears[i].linear->lora_a)
            params_make_nf4(&m->params,
                            &m->params.items[m->linears[i].linear->weight - m->params.items]);
    count_flops(m);
}

// The tensor-parallel dim of an adapter of a weight placed pl over tp: `cut` (the dim of the
// weight this adapter shares: 0 for B, 1 for A) when the weight is cut along it, else
// replicated, its gradient a partial sum unless the weight's is whole on every rank.
static int adapter_dim(const Placement *pl, int cut) {
    if (pl->kind == PLACE_SHARD) return pl->dim == cut ? cut : TP_REPLICATE;
    CHECK(pl->kind == PLACE_REPLICATE);
    return pl->grad_partial ? TP_REPLICATE : TP_REDUNDANT;
}

void lora_parallelize_tp(Model *m, const Tp *tp) {
    for (int i = 0; i < m->n_linears; i++) {
        const ModelLinear *e = &m->linears[i];
        if (!e->linear->lora_a) continue;
        const Placement *pl = param_placement_on(e->linear->weight, MESH_TP);
        CHECK(pl && pl->n_blocks == 0);
        tp_shard(tp, &m->params, adapter_of(m, e->module, "lora_a"), adapter_dim(pl, 1));
        tp_shard(tp, &m->params, adapter_of(m, e->module, "lora_b"), adapter_dim(pl, 0));
    }
}

void lora_log(const Model *m, const LoraSection *lora) {
    char modules[2048];
    int n = model_linears_describe(m, LINEARS_LORA, modules, sizeof modules);
    size_t trained = 0, total = 0;
    for (int i = 0; i < m->params.count; i++) {
        const Param *p = &m->params.items[i];
        if (p->copy || p->buffer) continue;
        total += param_global_numel(p);
        if (!p->frozen) trained += param_global_numel(p);
    }
    log_info("lora: rank %lld, alpha %g on %d linears (%s); %zu of %zu parameters trained "
             "(%.3f%%), the rest frozen", (long long)lora->rank, lora->alpha, n, modules, trained,
             total, 100.0 * (double)trained / (double)total);
    if (!lora->quantize_base) return;
    size_t quantized = 0, bytes = 0;
    for (int i = 0; i < m->params.count; i++) {
        const Param *p = &m->params.items[i];
        if (!p->nf4) continue;
        quantized += param_global_numel(p);
        bytes += nf4_bytes(param_global_numel(p));
    }
    log_info("lora: quantize_base: the %d adapted weights (%zu parameters) held as NF4, %.1f "
             "MiB in place of %.1f MiB in fp32", n, quantized, (double)bytes / 1048576.0,
             quantized * 4.0 / 1048576.0);
}

int lora_merge(const char *path, const Config *c, ParamTable *t, const char *group) {
    if (!config_converts(c, "lora")) return 0;
    char a_path[PARAM_NAME_MAX + 64], b_path[PARAM_NAME_MAX + 64];
    snprintf(a_path, sizeof a_path, "%soutput.lora_a.weight", group);
    if (!params_find(t, "output.weight") && ckpt_has(path, a_path))
        die_user("checkpoint %s adapts the output projection, which is the embedding's "
                 "transpose (tied): merging it would change the embedding too", path);
    double scale = c->lora.alpha / (double)c->lora.rank;
    int merged = 0;
    for (int i = 0; i < t->count; i++) {
        Param *w = &t->items[i];
        int module = (int)strlen(w->name) - (int)strlen(".weight");
        if (w->ndim != 2 || w->copy || module <= 0 || strcmp(w->name + module, ".weight"))
            continue;
        snprintf(a_path, sizeof a_path, "%s%.*s.lora_a.weight", group, module, w->name);
        snprintf(b_path, sizeof b_path, "%s%.*s.lora_b.weight", group, module, w->name);
        if (!ckpt_has(path, a_path)) continue;
        int64_t out = w->global_shape[0], in = w->global_shape[1], r = c->lora.rank;
        int64_t a_shape[2] = {r, in}, b_shape[2] = {out, r};
        float *a = xmalloc((size_t)(r * in) * sizeof(float));     // (r, in)
        float *b = xmalloc((size_t)(out * r) * sizeof(float));    // (out, r)
        CkptTensor adapters[2] = {{.path = a_path, .ndim = 2, .shape = a_shape, .data = a},
                                  {.path = b_path, .ndim = 2, .shape = b_shape, .data = b}};
        ckpt_load(path, adapters, 2);
        CHECK(w->numel == (size_t)(out * in));  // a whole tensor
#pragma omp parallel for
        for (int64_t o = 0; o < out; o++)
            for (int64_t j = 0; j < in; j++) {
                double sum = 0;
                for (int64_t k = 0; k < r; k++) sum += (double)b[o * r + k] * a[k * in + j];
                w->data[o * in + j] += (float)(scale * sum);
            }
        free(a);
        free(b);
        merged++;
    }
    return merged;
}
