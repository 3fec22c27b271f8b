// Muon under FSDP and tensor parallel (optim/optim.h's MuonShards; torchtitan's DistMuon): each
// of Muon's matrices is orthogonalized whole, once, by one rank of the ranks that shard it,
// in turn over them (the k-th matrix sharded over n ranks by the (k mod n)-th).
//
// A matrix's update is gathered whole on every rank of its shard groups (an all-gather over
// FSDP's group, then over tp's, of the ranks' shards, laid out by each rank's box), the owner
// orthogonalizes it, and broadcasts the result over tp then FSDP, each rank keeping its box.
// Replicated placements (dp_replicate, a tp-replicated weight) hold the same shard and take
// part as one; a stacked expert weight must be whole on its rank (ep's Shard(0), no efsdp).
#pragma once

#include "optim/optim.h"
#include "parallel/mesh.h"

typedef struct {
    MuonShards hooks;  // first: the hooks find this from their pointer; its buffer holds the
                       // all-gathers' output (every member's shard)
    const Mesh *mesh;
    const KernelOps *k;
} MuonDist;

// Whether p (one of Muon's) is cut over ranks and what the gathers need for it, in floats
// (0: whole here); false and the reason in err for a cut it cannot make whole (efsdp's, a
// blocked Shard).
bool muon_dist_plan(const Param *p, size_t *floats, char *err, size_t errlen);
// The hooks over mesh's groups, their buffer sized by muon_dist_plan's largest: carved by
// muon_allocate with Muon's scratch (MuonShards.floats).
void muon_dist_init(MuonDist *d, const Mesh *mesh, const KernelOps *k, size_t floats);
// How many ranks cut p (1: whole here), among which its matrices are orthogonalized in turn.
int muon_dist_members(const Param *p);
// The bytes one step's gathers and broadcasts move over group `group` (MESH_TP or
// MESH_GROUP_FSDP) for p on this rank, as the comm counters count them (for --estimate).
uint64_t muon_dist_bytes(const Param *p, int group);
