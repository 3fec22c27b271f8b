// The step's gradient as the parallelisms leave it on this rank, made whole: the replicated
// parameters' grads summed over tp (each rank's are partial: its rows' share under sequence
// parallel), and the global L2 norm for clipping counted exactly once per element of the
// unsharded model (DESIGN.md "Parameters carry their layout").
//
// A parameter's gradient lives in its FSDP shard when FSDP is applied (f != NULL), else in its
// (TP-local) tensor; tp == NULL: no tensor parallel.
#pragma once

#include "core/param.h"
#include "kernels/kernels.h"
#include "parallel/fsdp.h"
#include "parallel/tp.h"

// Floats grads_reduce_replicated all-reduces over tp per step (for --estimate).
size_t grads_replicated_floats(const ParamTable *t, const Fsdp *f);
// After the last microbatch's backward (and fsdp_finish_step).
void grads_reduce_replicated(const ParamTable *t, const Fsdp *f, const Tp *tp);
// Sum over every element of the whole model's gradient of its square: each piece weighted by
// tp_norm_weight (a replica once in total), summed over the fsdp group (shards) and the tp
// group; data-parallel replicas (HSDP) hold identical grads and are not summed.
double grads_sum_squares(const KernelOps *k, const ParamTable *t, const Fsdp *f, const Tp *tp);
