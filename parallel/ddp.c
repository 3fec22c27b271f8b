#include "parallel/ddp.h"

#include "parallel/mesh.h"

void ddp_place(ParamTable *t, int size, int rank) {
    for (int i = 0; i < t->count; i++)
        params_place(t, &t->items[i], (Placement){.kind = PLACE_REPLICATE,
                                                  .group = MESH_DP_REPLICATE, .size = size,
                                                  .rank = rank});
}

size_t ddp_bytes_per_step(const ParamTable *t) { return t->shard_grad_numel * sizeof(float); }

void ddp_finish_step(const ParamTable *t, CommGroup *replicate) {
    comm_all_reduce(replicate, t->shard_grad, t->shard_grad_numel, COMM_AVG);
}
