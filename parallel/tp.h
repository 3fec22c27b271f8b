// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with sequence parallel (Korthikanti et
// al. 2022) and loss parallel: the mechanisms over the tp group. Which weight is sharded how
// is the model's own plan (models/decoder/parallelize.c); this file knows no model.
//
// A Tp provides the TpHooks the model calls (models/model.h): all-gather and reduce-scatter
// of rows over the group, an all-gather of columns, and all-reduces for the loss statistics.
// Applying it, in torchtitan's order: TP (the model's plan: tp_shard on each parameter, then
// Model.tp = &tp->hooks), before activation checkpointing, before FSDP (which then shards the
// local tensors); then allocation and params_initialize. After each step's backward,
// grads_reduce_replicated (parallel/grads.h) sums the grads of the replicated parameters that
// the plan marked partial (TP_REPLICATE) over the group.
#pragma once

#include <stdbool.h>

#include "core/param.h"
#include "kernels/kernels.h"
#include "protocols/block.h"
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
// Replicate whose gradient each rank holds a partial sum of (the decoder's norms under
// sequence parallel; a per-head weight applied to the rank's heads): summed over the group.
#define TP_REPLICATE (-1)
// Replicate computed redundantly: every rank runs its math on the same replicated inputs, so
// each holds the whole gradient, which must not be summed (Megatron without sequence parallel).
#define TP_REDUNDANT (-2)
// Places p on the group (mesh group MESH_TP) as Shard(dim), this rank's slice `rank`, or
// Replicate (dim TP_REPLICATE or TP_REDUNDANT). Before params_allocate.
void tp_shard(const Tp *tp, ParamTable *t, Param *p, int dim);
// Shard(dim) of a fused weight: its extent along dim is n_blocks parts of blocks[k] (each a
// multiple of the group's size), each cut over the group (core/param.h's blocked Shard).
void tp_shard_blocked(const Tp *tp, ParamTable *t, Param *p, int dim, int n_blocks,
                      const int64_t *blocks);
