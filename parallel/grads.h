// The step's gradient as the parallelisms leave it on this rank, made whole: the grads of the
// replicated parameters whose placement says they are partial summed over tp (under sequence
// parallel each rank's rows' share; those computed redundantly are whole already), and the global L2 norm for clipping counted exactly once per element of the
// unsharded model (docs/design.md "Parameters carry their layout").
//
// A frozen parameter (Param.frozen) has none: these skip it.
// A parameter's gradient is its shard's (ParamTable.shard_grad at Param.shard_offset): FSDP's
// shard when FSDP placed it, else its compute tensor's. fsdp / tp NULL: no such group.
#pragma once

#include "core/param.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"

// Floats grads_reduce_replicated all-reduces over tp per step (for --estimate).
size_t grads_replicated_floats(const ParamTable *t);
// After the last microbatch's backward (and fsdp_finish_step): sums the partial ones.
void grads_reduce_replicated(const ParamTable *t, CommGroup *tp);
// After those: each copy's gradient (Param.copy) and its original's summed, into both. Where
// the pipeline puts them on two ranks, the two all-reduce over `ends`, the group of the
// stages' ranks holding them (both on one rank: a local add; ends NULL then).
void grads_sum_copies(const KernelOps *k, const ParamTable *t, CommGroup *ends);
// Floats grads_sum_copies all-reduces over `ends` per step on this rank (for --estimate).
size_t grads_copies_floats(const ParamTable *t);
// Sum over every element of the whole model's gradient of its square: this rank's shards,
// summed over the fsdp and tp groups, each parameter divided by its replica count over them
// (a tp-replicated norm weight, once in total; a copy not at all: its original is the
// gradient), and over pp (each stage's parameters are on one pp rank, empty on the others);
// data-parallel replicas (HSDP, DDP) hold identical grads and are not summed.
double grads_sum_squares(const KernelOps *k, const ParamTable *t, CommGroup *fsdp, CommGroup *tp,
                         CommGroup *pp);
