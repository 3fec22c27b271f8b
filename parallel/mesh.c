#include "parallel/mesh.h"

#include "core/errors.h"

const char *const MESH_DIM_NAMES[MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

bool mesh_plan(MeshLayout *out, const int degrees[MESH_NDIMS], int world_size, char *err,
               size_t errlen) {
    *out = (MeshLayout){.world_size = world_size, .ep = 1};
    int known = 1;
    for (int d = 0; d < MESH_NDIMS; d++) {
        int v = degrees[d];
        if (d == MESH_DP_SHARD && v == -1) continue;
        if (v < 1)
            return error_set(err, errlen, "parallelism: the %s degree must be >= 1, got %d",
                             MESH_DIM_NAMES[d], v);
        out->size[d] = v;
        known *= v;
    }
    if (degrees[MESH_DP_SHARD] == -1) {
        if (world_size % known != 0)
            return error_set(err, errlen,
                             "parallelism: %d ranks cannot be split into pp x dp_replicate x cp "
                             "x tp = %d groups to infer data_parallel_shard_degree",
                             world_size, known);
        out->size[MESH_DP_SHARD] = world_size / known;
        known = world_size;
    }
    if (known != world_size)
        return error_set(err, errlen,
                         "parallelism: pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d = "
                         "%d ranks, but the job has %d",
                         out->size[MESH_PP], out->size[MESH_DP_REPLICATE],
                         out->size[MESH_DP_SHARD], out->size[MESH_CP], out->size[MESH_TP],
                         known, world_size);
    return true;
}

bool mesh_plan_experts(MeshLayout *layout, int ep, char *err, size_t errlen) {
    const int *size = layout->size;
    if (ep < 1 || mesh_sparse_size(layout) % ep != 0)
        return error_set(err, errlen,
                         "parallelism.expert_parallel_degree = %d must divide dp_shard %d x cp "
                         "%d x tp %d = %d: the experts are sharded over ep and FSDP-sharded over "
                         "the rest",
                         ep, size[MESH_DP_SHARD], size[MESH_CP], size[MESH_TP],
                         mesh_sparse_size(layout));
    layout->ep = ep;
    return true;
}

int mesh_sparse_index(const MeshLayout *l, const int coord[MESH_NDIMS]) {
    return (coord[MESH_DP_SHARD] * l->size[MESH_CP] + coord[MESH_CP]) * l->size[MESH_TP] +
           coord[MESH_TP];
}

// The rank's coordinate along dims, row-major with tp fastest.
static void coord_of(const MeshLayout *l, int rank, int coord[MESH_NDIMS]) {
    for (int d = MESH_NDIMS - 1; d >= 0; d--) {
        coord[d] = rank % l->size[d];
        rank /= l->size[d];
    }
}

// The group of ranks that differ from this one only along the dims in `along` (a bit set):
// color = the coordinate on the other dims, key = the coordinate on these.
static CommGroup *group_along(Mesh *m, unsigned along, const char *name) {
    int color = 0, key = 0;
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (along & (1u << d)) key = key * m->layout.size[d] + m->coord[d];
        else color = color * m->layout.size[d] + m->coord[d];
    }
    return comm_split(m->world, color, key, name);
}

// The sparse mesh (pp, dp_replicate, efsdp, ep): ep groups the ranks that share pp,
// dp_replicate and the efsdp index, efsdp those that share the ep index.
static void build_sparse(Mesh *m) {
    const MeshLayout *l = &m->layout;
    if (l->ep == 1) return;
    int outer = m->coord[MESH_PP] * l->size[MESH_DP_REPLICATE] + m->coord[MESH_DP_REPLICATE];
    int efsdp = mesh_sparse_size(l) / l->ep, index = mesh_sparse_index(l, m->coord);
    m->ep = comm_split(m->world, outer * efsdp + index / l->ep, index % l->ep, "ep");
    m->efsdp = comm_split(m->world, outer * l->ep + index % l->ep, index / l->ep, "efsdp");
}

// The ranks before and after this one in dim d's group, which is ordered by the coordinate,
// wrapping around.
static void ring_neighbours(const Mesh *m, MeshDim d, int *prev, int *next) {
    int n = m->layout.size[d], r = m->coord[d];
    CHECK(comm_rank(m->group[d]) == r);
    *prev = (r + n - 1) % n;
    *next = (r + 1) % n;
}

void mesh_build(Mesh *m, const MeshLayout *layout) {
    *m = (Mesh){.layout = *layout, .world = comm_world()};
    m->world_rank = comm_rank(m->world);
    CHECK(comm_size(m->world) == layout->world_size);
    coord_of(layout, m->world_rank, m->coord);
    for (int d = 0; d < MESH_NDIMS; d++) m->group[d] = group_along(m, 1u << d, MESH_DIM_NAMES[d]);
    unsigned dp = 1u << MESH_DP_REPLICATE | 1u << MESH_DP_SHARD;
    m->dp = group_along(m, dp, "dp");
    m->fsdp = group_along(m, 1u << MESH_DP_SHARD | 1u << MESH_CP, "fsdp");
    m->loss = group_along(m, dp | 1u << MESH_CP, "loss");
    build_sparse(m);
    ring_neighbours(m, MESH_PP, &m->pp_prev, &m->pp_next);
    ring_neighbours(m, MESH_CP, &m->cp_prev, &m->cp_next);
}

int mesh_dp_rank(const Mesh *m) {
    return m->coord[MESH_DP_REPLICATE] * m->layout.size[MESH_DP_SHARD] + m->coord[MESH_DP_SHARD];
}
