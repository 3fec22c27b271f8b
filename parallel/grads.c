#include "parallel/grads.h"

#include "core/errors.h"
#include "parallel/mesh.h"

// (An expert weight under expert parallel is not: ep_place drops its tp placement, ep taking
// tp's ranks first, and what ep leaves of tp is in efsdp, whose FSDP reduction sums the grad.)
static bool tp_replicated(const Param *p) {
    const Placement *pl = param_placement_on(p, MESH_TP);
    return pl && pl->kind == PLACE_REPLICATE;
}

// Replicated with each rank's gradient a partial sum (the plan's TP_REPLICATE, not
// TP_REDUNDANT, whose grads are already whole on every rank), and trained.
static bool tp_partial(const Param *p) {
    return !p->frozen && tp_replicated(p) && param_placement_on(p, MESH_TP)->grad_partial;
}

size_t grads_replicated_floats(const ParamTable *t) {
    size_t n = 0;
    for (int i = 0; i < t->count; i++)
        if (tp_partial(&t->items[i])) n += t->items[i].shard_numel;
    return n;
}

void grads_reduce_replicated(const ParamTable *t, CommGroup *tp) {
    if (!tp) return;
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        if (tp_partial(p))
            comm_all_reduce(tp, t->shard_grad + p->shard_grad_offset, p->shard_numel, COMM_SUM);
    }
}

void grads_sum_copies(const KernelOps *k, const ParamTable *t, CommGroup *ends) {
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        if (!p->copy || p->frozen) continue;
        const Param *o = params_find(t, p->name);
        float *g = t->shard_grad + p->shard_grad_offset;
        float *go = t->shard_grad + o->shard_grad_offset;
        if (p->shard_numel && o->shard_numel) {  // both here: the same boxes
            k->add(go, g, o->shard_numel);
            k->copy(g, go, p->shard_numel * sizeof(float));
        } else if (p->shard_numel || o->shard_numel) {  // one each on the two ends' ranks
            CHECK(ends && comm_size(ends) == 2);
            comm_all_reduce(ends, p->shard_numel ? g : go, p->shard_numel + o->shard_numel,
                            COMM_SUM);
        }
    }
}

size_t grads_copies_floats(const ParamTable *t) {
    size_t n = 0;
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        if (!p->copy || p->frozen) continue;
        const Param *o = params_find(t, p->name);
        if (!p->shard_numel != !o->shard_numel) n += p->shard_numel + o->shard_numel;
    }
    return n;
}

double grads_sum_squares(const KernelOps *k, const ParamTable *t, CommGroup *fsdp, CommGroup *tp,
                         CommGroup *pp) {
    double local = 0;
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        // a copy's is its original's gradient, counted there; a frozen one has none
        if (p->copy || p->frozen) continue;
        double weight = tp && tp_replicated(p) ? 1.0 / comm_size(tp) : 1.0;
        local += weight * k->sum_squares(t->shard_grad + p->shard_grad_offset, p->shard_numel);
    }
    if (fsdp) local = comm_all_reduce_double(fsdp, local, COMM_SUM);
    if (tp) local = comm_all_reduce_double(tp, local, COMM_SUM);
    if (pp) local = comm_all_reduce_double(pp, local, COMM_SUM);
    return local;
}
