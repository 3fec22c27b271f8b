// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with sequence parallel (Korthikanti et
// al. 2022) and loss parallel: the mechanisms over the tp group. Which weight is sharded how
// is the model's own plan (models/decoder/parallelize.c); this file knows no model.
//
// A Tp provides the TpHooks the model calls (models/model.h): all-gather and reduce-scatter
// of rows over the group, an all-gather of columns, and all-reduces for the loss statistics.
// Applying it, in torchtitan's order: TP (the model's plan: tp_shard on each parameter, then
// Model.tp = &tp->hooks), before activation checkpointing, before FSDP (which then shards the
// local tensors); then allocation and params_initialize. After each step's backward,
// grads_reduce_replicated (parallel/grads.h) sums the replicated parameters' grads (partial
// over each rank's rows) over the group.
#pragma once

#include <stdbool.h>

#include "core/param.h"
#include "kernels/kernels.h"
#include "core/block.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

typedef struct Tp {
    TpHooks hooks;  // first: the hooks' implementations find the Tp from the pointer
    CommGroup *group;
    const KernelOps *k;  // moves the gathered columns into place
    int rank, size;
} Tp;

// Hooks over group (the mesh's tp group), moving tensors of backend k.
// loss_parallel: !parallelism.disable_loss_parallel.
void tp_init(Tp *tp, CommGroup *group, const KernelOps *k, bool loss_parallel);
// The same placement for rank of size ranks without a group (MPI-free planning: --estimate);
// its hooks must not be called.
void tp_plan(Tp *tp, int rank, int size, bool loss_parallel);
#define TP_REPLICATE (-1)
// Places p on the group (mesh group MESH_TP) as Shard(dim), this rank's slice `rank`, or
// Replicate (dim TP_REPLICATE). Before params_allocate.
void tp_shard(const Tp *tp, ParamTable *t, Param *p, int dim);
