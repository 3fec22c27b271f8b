// Data parallel without sharding (PyTorch DDP, Li et al. 2020; torchtitan's `replicate`): when
// the fsdp group is one rank but dp_replicate is not, every rank holds the whole (TP-local)
// model, Replicate over dp_replicate, and after the last microbatch's backward the gradients
// are averaged over the group in one all-reduce. No FSDP machinery runs on a group of one.
#pragma once

#include "core/param.h"
#include "parallel/comm.h"

// Places every parameter Replicate over dp_replicate (size ranks, this one `rank`).
void ddp_place(ParamTable *t, int size, int rank);
// Bytes one rank hands to the all-reduce per step (comm.h's accounting).
size_t ddp_bytes_per_step(const ParamTable *t);
// After the last microbatch's backward: every grad averaged over the replicas.
void ddp_finish_step(const ParamTable *t, CommGroup *replicate);
