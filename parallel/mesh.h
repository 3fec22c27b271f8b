// The device mesh (docs/design.md "The mesh"): dims pp, dp_replicate, dp_shard, cp, tp, outermost
// first (torchtitan's order: tp varies fastest, so a tp group shares a node). The world size
// must equal the product; data_parallel_shard_degree -1 takes what is left. Every dim and the
// flattened groups dp = dp_replicate x dp_shard, fsdp = dp_shard x cp, loss = dp x cp have a
// communicator, built once here.
//
// Expert parallel (torchtitan's sparse mesh, parallel_dims.py): routed experts are sharded over
// ep ranks carved out of the sparse region dp_shard x cp x tp, flattened with tp fastest and
// unflattened into (efsdp, ep), ep fastest; FSDP shards the experts over the rest, efsdp =
// dp_shard x cp x tp / ep. ep must divide dp_shard x cp x tp.
#pragma once

#include <stdbool.h>
#include <stddef.h>

#include "parallel/comm.h"

typedef enum { MESH_PP, MESH_DP_REPLICATE, MESH_DP_SHARD, MESH_CP, MESH_TP, MESH_NDIMS } MeshDim;

// The groups a parameter is placed over (core/param.h's Placement.group): a mesh dim, or
// FSDP's flattened dp_shard x cp, or the sparse mesh's ep and efsdp.
enum { MESH_GROUP_FSDP = MESH_NDIMS, MESH_GROUP_EP, MESH_GROUP_EFSDP };

typedef struct {
    int size[MESH_NDIMS];
    int world_size;
    int ep;  // expert parallel degree (1: off), a divisor of dp_shard x cp x tp
} MeshLayout;

typedef struct {
    MeshLayout layout;
    int coord[MESH_NDIMS];  // this rank's coordinate
    int world_rank;
    CommGroup *group[MESH_NDIMS];
    CommGroup *dp, *fsdp, *loss, *world;
    // The sparse mesh's groups when layout.ep > 1 (else NULL): ep holds this rank's experts'
    // peers, efsdp the ranks that shard the same experts.
    CommGroup *ep, *efsdp;
    // This rank's pipeline neighbours, ranks of group[MESH_PP] (whose rank is the pp
    // coordinate): the stage after this rank's on pp_next, before on pp_prev, wrapping around
    // (loop placement sends the last rank's stage on to rank 0's next one).
    int pp_prev, pp_next;
    // This rank's context-parallel ring neighbours, ranks of group[MESH_CP] (whose rank is the
    // cp coordinate): K/V goes to cp_next and comes from cp_prev.
    int cp_prev, cp_next;
} Mesh;

extern const char *const MESH_DIM_NAMES[MESH_NDIMS];

// The layout for degrees (pp, dp_replicate, dp_shard (-1: inferred), cp, tp) on world_size
// ranks; false with the reason when it is impossible. Needs no MPI (so --estimate can plan
// any world size).
bool mesh_plan(MeshLayout *out, const int degrees[MESH_NDIMS], int world_size, char *err,
               size_t errlen);
// Sets layout->ep (parallelism.expert_parallel_degree) once mesh_plan has sized the dims; false
// with the reason when ep does not divide dp_shard x cp x tp.
bool mesh_plan_experts(MeshLayout *layout, int ep, char *err, size_t errlen);
// The sparse region's size, ep x efsdp.
static inline int mesh_sparse_size(const MeshLayout *l) {
    return l->size[MESH_DP_SHARD] * l->size[MESH_CP] * l->size[MESH_TP];
}
// This rank's index in the sparse region (dp_shard major, tp fastest), which splits into its
// ep rank (index % ep) and efsdp rank (index / ep).
int mesh_sparse_index(const MeshLayout *l, const int coord[MESH_NDIMS]);
// This rank's coordinate and every group (collective over the world).
void mesh_build(Mesh *m, const MeshLayout *layout);
static inline int mesh_dp_size(const MeshLayout *l) {
    return l->size[MESH_DP_REPLICATE] * l->size[MESH_DP_SHARD];
}
// This rank's index in the flattened dp group (dp_replicate major).
int mesh_dp_rank(const Mesh *m);
