// Context parallel (docs/design.md "Parallelisms"; Liu et al. 2023's ring attention, torchtitan's
// context_parallel): each sequence is split over the cp group in the head-tail layout
// (parallel/cp/layout.h), and attention, the one op that mixes positions, runs as AttnHooks
// that bring every other rank's keys and values to this rank's queries:
//   allgather: one all-gather of K/V, then this rank's query chunks against every key chunk;
//              backward reduce-scatters dK/dV back to their owners.
//   alltoall:  K/V passed around the ring with non-blocking send/recv while the chunk in hand
//              is computed (torchtitan's name for the ring rotation); backward passes the
//              dK/dV accumulated so far along with them, so each arrives home summed.
// This file moves the K/V; the chunk pairs' math (merged by log-sum-exp) is
// parallel/cp/attention.h's.
// Every other layer is per token: the model needs only this rank's tokens, their global
// RoPE positions (cp_positions) and the loss averaged over the loss group (dp x cp); FSDP's
// group spans dp_shard x cp (parallel/mesh.h), so the gradients average over cp too.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "protocols/block.h"
#include "parallel/comm.h"
#include "parallel/p2p_check.h"

typedef enum { CP_ALLGATHER, CP_ALLTOALL } CpRotate;

typedef struct {
    AttnHooks hooks;  // first: the hooks' implementations find the Cp from the pointer
    CommGroup *group;
    int rank, size;
    int prev, next;  // the ring's neighbours, ranks of group (the mesh's cp_prev / cp_next)
    CpRotate rotate;
    // What the K/V traffic cost, summed over calls since cp_init: the time spent blocked on it
    // (what compute did not hide), and the calls' transfers (ring steps, or gathers and
    // reduce-scatters) and their bytes sent from this rank.
    double wait_seconds;
    int64_t transfers;
    uint64_t bytes_sent;
} Cp;

// parallelism.context_parallel_rotate_method's value, or false when it names neither.
bool cp_rotate_parse(const char *name, CpRotate *out);
// Hooks over group (the mesh's cp group), whose ring runs from prev to this rank to next.
void cp_init(Cp *cp, CommGroup *group, int prev, int next, CpRotate rotate);
// The same for rank of size ranks without a group (MPI-free planning: --estimate); only
// workspace_bytes may be called.
void cp_plan(Cp *cp, int rank, int size, CpRotate rotate);
// The alltoall ring's sends, receives and waits of one layer's forward and backward on rank of
// size ranks, as cp.c posts them, appended to p under the given streams (ring_order.c): what
// tests/unit/test_p2p_check.c proves deadlock-free on NCCL.
void cp_ring_program(int rank, int size, P2pStreams streams, P2pProgram *p);
// Bytes this rank hands to the cp group (comm.h's accounting) in one attention call of a layer
// whose local K and V are kv_floats floats each: a forward (also what activation checkpointing's
// recompute sends), or a backward, which brings K/V again and sends dK/dV home. `titan
// --estimate` sizes the cp group's traffic with it.
uint64_t cp_attention_bytes(const Cp *cp, uint64_t kv_floats, bool backward);
