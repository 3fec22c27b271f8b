#include "parallel/ep/ep.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"
#include "parallel/mesh.h"

static const Ep *ep_of(const ExpertHooks *h) { return (const Ep *)h; }

// Rank r holds experts [r * E / size, (r + 1) * E / size): block r of send_counts is what goes
// to it, exactly MPI_Alltoall's blocks.
static void ep_exchange_counts(const ExpertHooks *h, const int *send_counts, int *recv_counts,
                               int n_experts) {
    const Ep *ep = ep_of(h);
    CHECK(n_experts % ep->size == 0);
    comm_all_to_all_ints(ep->group, send_counts, recv_counts, n_experts / ep->size);
}

// counts (size) floats and their displacements from rows (size) of dim floats each.
static void rows_to_floats(const int *rows, int dim, int size, int *counts, int *displs) {
    int64_t at = 0;
    for (int r = 0; r < size; r++) {
        int64_t n = (int64_t)rows[r] * dim;
        CHECK(rows[r] >= 0 && n <= INT32_MAX && at <= INT32_MAX);  // MPI counts are ints
        counts[r] = (int)n;
        displs[r] = (int)at;
        at += n;
    }
    CHECK(at <= INT32_MAX);
}

static void ep_all_to_all(const ExpertHooks *h, float *dst, const int *recv_rows,
                          const float *src, const int *send_rows, int dim) {
    const Ep *ep = ep_of(h);
    rows_to_floats(send_rows, dim, ep->size, ep->send_counts, ep->send_displs);
    rows_to_floats(recv_rows, dim, ep->size, ep->recv_counts, ep->recv_displs);
    CommHandle c = comm_all_to_allv_start(ep->group, src, ep->send_counts, ep->send_displs, dst,
                                          ep->recv_counts, ep->recv_displs);
    comm_wait(&c);
}

static int64_t ep_hooks_recv_rows_bound(const ExpertHooks *h, int64_t rows, int k,
                                        int n_experts, double capacity_factor) {
    return ep_recv_rows_bound(h->size, rows, k, n_experts, capacity_factor);
}

void ep_plan(Ep *ep, int rank, int size) {
    *ep = (Ep){.rank = rank, .size = size};
    ep->hooks = (ExpertHooks){.size = size, .exchange_counts = ep_exchange_counts,
                              .all_to_all = ep_all_to_all,
                              .recv_rows_bound = ep_hooks_recv_rows_bound};
}

void ep_init(Ep *ep, CommGroup *group) {
    ep_plan(ep, comm_rank(group), comm_size(group));
    ep->group = group;
    size_t n = (size_t)ep->size;
    ep->send_counts = xcalloc(n, sizeof(int));
    ep->send_displs = xcalloc(n, sizeof(int));
    ep->recv_counts = xcalloc(n, sizeof(int));
    ep->recv_displs = xcalloc(n, sizeof(int));
}

void ep_free(Ep *ep) {
    free(ep->send_counts), free(ep->send_displs), free(ep->recv_counts), free(ep->recv_displs);
    *ep = (Ep){0};
}

bool ep_check(const ParamTable *t, int ep, char *err, size_t errlen) {
    const Param *first = NULL;
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        if (!p->expert) continue;
        if (!first) first = p;
        if (p->global_shape[0] % ep != 0)
            return error_set(err, errlen,
                             "parallelism.expert_parallel_degree = %d must divide the model's "
                             "%lld experts (%s)",
                             ep, (long long)p->global_shape[0], p->name);
    }
    if (!first && ep > 1)
        return error_set(err, errlen,
                         "parallelism.expert_parallel_degree = %d: the model has no routed "
                         "experts to shard",
                         ep);
    return true;
}

void ep_place(ParamTable *t, int size, int rank) {
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        if (!p->expert) continue;
        // ep takes tp's ranks first (what it leaves of them is efsdp's): the stacked experts
        // are no longer a replica over tp, for the gradient sum nor for the checkpoint's writers
        params_unplace(p, MESH_TP);
        params_place(t, p, (Placement){.kind = PLACE_SHARD, .group = MESH_GROUP_EP, .size = size,
                                       .rank = rank});
    }
}

int64_t ep_recv_rows_bound(int ep, int64_t rows, int k, int n_experts, double capacity_factor) {
    int local = n_experts / ep;
    int64_t per_source = rows * (k < local ? k : local);
    if (capacity_factor > 0) {
        int64_t capacity = (int64_t)ceil(capacity_factor * (double)(rows * k) / n_experts);
        if (capacity * local < per_source) per_source = capacity * local;
    }
    return (int64_t)ep * per_source;
}

// A forward sends its slots (dispatch) and what it received (combine); the backward sends the
// same two amounts the other way round.
EpEstimate ep_estimate(int ep, int64_t rows, int k, int n_experts, int dim,
                       double capacity_factor, bool recompute) {
    int64_t bound = ep_recv_rows_bound(ep, rows, k, n_experts, capacity_factor);
    int64_t sent = rows * k, expected = sent < bound ? sent : bound;
    uint64_t counts = sizeof(int) * (uint64_t)n_experts, row = sizeof(float) * (uint64_t)dim;
    uint64_t forwards = recompute ? 2 : 1;
    return (EpEstimate){
        .recv_rows_bound = bound,
        .expected_bytes = forwards * counts + (forwards + 1) * (uint64_t)(sent + expected) * row,
        .bound_bytes = forwards * counts + (forwards + 1) * (uint64_t)(sent + bound) * row};
}
