// Expert parallel (docs/design.md "Parallelisms"; torchtitan's ExpertParallel and
// AllToAllTokenDispatcher): a MoE layer's E routed experts are split over the ep group of the
// sparse mesh (parallel/mesh.h), E / ep consecutive experts to a rank, and the tokens' slots
// travel to the rank that holds their expert and back with all-to-all-v.
//
// Placement: a routed expert's stacked weight (Param.expert, (E, out, in)) is Shard(0) over
// ep; FSDP then shards what is left over efsdp (= dp_shard x cp x tp / ep) instead of its fsdp
// group. Every other parameter keeps the dense placements.
//
// A rank's MoE layer sorts its slots by global expert, exchanges the counts (ExpertHooks.
// exchange_counts), sends each rank its experts' rows (all_to_all), regroups what arrived from
// (source rank, local expert) to (local expert, source rank), runs its E / ep experts as one
// grouped GEMM and sends the outputs back the same way (the backward runs the duals).
//
// Memory bound (docs/design.md "Memory": data-dependent sizes need a stated bound): a token sends
// one slot to each of its k distinct experts, so at most min(k, E / ep) to one rank; a rank
// then receives at most ep * rows * min(k, E / ep) rows, rows the tokens a rank routes per
// microbatch (step_rows). With a capacity factor c each source keeps at most
// ceil(c * rows * k / E) slots per expert, so at most ep * (E / ep) * that.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/param.h"
#include "parallel/comm.h"
#include "protocols/block.h"

typedef struct Ep {
    ExpertHooks hooks;  // first: the hooks' implementations find the Ep from the pointer
    CommGroup *group;
    int rank, size;
    // (size) host scratch of the all-to-all-v: its float counts and displacements, each way.
    int *send_counts, *send_displs, *recv_counts, *recv_displs;
} Ep;

// Hooks over group (the mesh's ep group). Allocates its host scratch (setup, not the step).
void ep_init(Ep *ep, CommGroup *group);
// The same for rank of size ranks without a group (MPI-free planning: --estimate, where the
// step only sizes its buffers); of its hooks only recv_rows_bound may be called.
void ep_plan(Ep *ep, int rank, int size);
void ep_free(Ep *ep);
// Whether the model of parameters t can split its routed experts over ep ranks: it must have
// some (Param.expert), and each stack's E must be a multiple of ep. The reason in err if not.
bool ep_check(const ParamTable *t, int ep, char *err, size_t errlen);
// Places every expert weight of t as Shard(0) over the ep group (mesh group MESH_GROUP_EP), this
// rank's slice `rank` of size. Before FSDP and params_allocate.
void ep_place(ParamTable *t, int size, int rank);
// The most rows one rank receives in a MoE layer's dispatch (and sends back in its combine):
// ep ranks routing rows tokens each to k of E experts, each expert keeping at most
// ceil(capacity_factor * rows * k / E) slots per source (capacity_factor 0: no limit).
int64_t ep_recv_rows_bound(int ep, int64_t rows, int k, int n_experts, double capacity_factor);

// What one rank hands the ep group (comm_bytes' units: an all-to-all counts its whole send
// buffer) for one MoE layer of one microbatch: forward (the counts exchange, the dispatch of
// its rows * k slots (at most: a capacity drops some), the combine of what it received),
// again when activation checkpointing recomputes it, and backward (the combine's dual sends
// the slots' gradients back to the experts, the dispatch's dual the experts' input gradients
// home; the counts are kept). expected: balanced routing (a rank receives rows * k slots);
// bound: ep_recv_rows_bound's.
typedef struct {
    int64_t recv_rows_bound;
    uint64_t expected_bytes, bound_bytes;
} EpEstimate;

EpEstimate ep_estimate(int ep, int64_t rows, int k, int n_experts, int dim,
                       double capacity_factor, bool recompute);
