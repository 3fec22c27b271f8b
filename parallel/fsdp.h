// FSDP (ZeRO-3) and HSDP over the blocks of a model (docs/design.md "Parallelisms", "Memory").
//
// Placement: every parameter gets FSDP's padded Shard(0) over the fsdp group (dp_shard x cp)
// of n ranks (core/param.h's PLACE_SHARD_PADDED, after tensor parallel's placements): its
// local rows are padded up to a multiple of n, never dropped, and rank k owns rows
// [k * R/n, (k+1) * R/n) of the padded tensor. Padding rows are zero and stay zero (their
// gradient is zero, and AdamW maps a zero weight with a zero gradient to zero), so they add
// nothing to a norm or a sum. Every rank holds the same number of floats. HSDP adds
// Replicate over dp_replicate. The shards are the ParamTable's shard buffers (shard_data,
// shard_grad), which the optimizer, initialisation and checkpoints use as on one rank.
//
// One FSDP unit per block (Zhao et al. 2023, "PyTorch FSDP"). This rank's fp32 master shards
// of all units are one flat buffer (and their grads another), which the optimizer updates
// directly; within a unit the shard is laid out parameter after parameter, so one all-gather
// of it yields every rank's shard in rank order, copied out into the unit's full buffer where
// the model's Param.data point. The code that runs the blocks (models/model.c) calls FSDP's
// BlockHooks around every block call, naming the block and the phase (forward, recompute,
// backward): FSDP gathers before, prefetching the unit the phase runs next, and reduce-scatters
// after a backward, overlapping the next unit's backward, and the blocks know nothing of it.
//
// Gradients are those of the global-batch mean loss: each rank's loss is the mean over its
// own tokens, so the reduce-scatter averages over the fsdp group and HSDP then averages the
// shard grads over dp_replicate. Each microbatch's reduce-scatter is added (+=) to the shard
// grads, which the caller zeroes once per step. Frozen parameters (Param.frozen, LoRA's base)
// take no gradient: the reduce-scatter moves the unit's trained parameters' only, packed
// without them (FsdpUnit.grad_part_numel), and their shard grads stay zero.
//
// float8 (FsdpConfig.float8_precompute, Param.gather_float8): a unit holding weights of
// tensorwise float8 Linears gathers its dense part as bytes, those weights' shards cast to e4m3
// with the whole weight's scale (its amax all-reduced over the group), the rest in the gather
// dtype: the float8 layers move half of bf16's bytes, and the model reads them as cast.
//
// QLoRA's NF4 weights (Param.nf4) are sharded as bytes: each rank stores one of the group's
// equal chunks of each blob (params_shard_nf4), a unit's chunks one run of ParamTable.nf4,
// which one byte all-gather per unit brings whole into the unit's NF4 slot beside its full
// buffer (FsdpUnit.nf4_shard_bytes), where the Linears read the blobs. Frozen, they have no
// gradients to reduce.
//
// Expert parallel (parallel/ep): the routed experts' weights, already Shard(0) over ep, are
// sharded over the efsdp group instead (torchtitan's sparse mesh). A unit's shard is then two
// parts, each gathered and reduce-scattered over its own group: its dense parameters' shards
// and its experts', packed in that order (the table's order within each). An expert's gradient
// holds every ep rank's tokens already (the all-to-all brought them), so the reduce-scatter
// sums it over efsdp, which with ep makes the whole dp_shard x cp x tp region, and divides by
// the fsdp size (torchtitan's gradient_divide_factor): each fsdp rank's tokens counted once,
// as the dense parameters' average counts them.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/param.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "protocols/block.h"

// parallelism.fsdp_reshard_after_forward. ALWAYS frees a unit's full params after its
// forward (and gathers them again for backward); NEVER keeps every unit gathered from forward
// to backward; DEFAULT is torchtitan's: all but the last unit, which backward needs first.
typedef enum { FSDP_RESHARD_DEFAULT, FSDP_RESHARD_ALWAYS, FSDP_RESHARD_NEVER } FsdpReshard;

// "default", "always" or "never"; anything else is a user error.
FsdpReshard fsdp_reshard_parse(const char *mode);

typedef struct {
    int size, rank;            // the fsdp group (dp_shard x cp) and this rank's index in it
    int replicate_size;        // dp_replicate: > 1 is HSDP
    int replicate_rank;        // this rank's index in it
    // Semi-synchronous training (parallel/semi_sync.h): each replica group steps alone, its
    // gradients never averaged over dp_replicate (the weights are, every few steps).
    bool replicas_step_alone;
    FsdpReshard reshard;
    // The run's mixed precision (torchtitan's MixedPrecisionPolicy): param bf16 all-gathers
    // the compute weights in bf16 (the model then computes with bf16-rounded weights; the
    // masters stay fp32), reduce bf16 reduce-scatters the grads in bf16 instead of fp32. The
    // HSDP all-reduce stays fp32.
    MixedPrecisionPolicy precision;
    // Pipeline parallel: a stage's microbatches interleave with the other stages' and their
    // backward may come in two parts (input, then weight), so every unit keeps its own full
    // gradient, summed over the step's microbatches, and reduce-scatters it once, in
    // fsdp_finish_step. Otherwise one buffer serves the unit in backward, reduce-scattered
    // after each microbatch's backward (overlapping the next unit's).
    bool reduce_once_per_step;
    // The efsdp group's size and this rank's index in it; expert_size 0: the experts (if any)
    // are parameters like the others.
    int expert_size, expert_rank;
    // FSDP's float8 all-gather (the parameters marked Param.gather_float8): each weight's amax
    // is all-reduced (max) over the group before its shard is cast, one weight at a time as
    // torchao's fsdp_pre_all_gather; float8_precompute takes every float8 weight's amax in one
    // all-reduce once the shards have changed (torchao's precompute_float8_dynamic_scale_for_fsdp
    // after the optimizer step), which every gather until the next change casts with.
    bool float8_precompute;
    const KernelOps *k;
} FsdpConfig;

typedef struct Fsdp Fsdp;

typedef struct {
    Fsdp *fsdp;
    int index;
    int first_param, n_params;
    size_t shard_offset;       // in floats, into Fsdp.data / Fsdp.grad
    size_t shard_numel;        // this rank's floats of the unit (the same on every rank)
    size_t part_numel[2];      // of which its dense parameters' and its experts'
    // Those of its trained parameters: its gradients' parts, what the reduce-scatter moves
    // (a frozen parameter, LoRA's base, takes no gradient: Param.frozen).
    size_t grad_part_numel[2];
    size_t shard_grad_offset;  // in floats, into Fsdp.grad: where its trained shards' start
    size_t full_numel;         // floats of the unit's (unpadded) parameters
    size_t table_offset;       // in floats: where they start in ParamTable's layout
    size_t grad_offset;        // in floats, into Fsdp.full_grad (reduce_once_per_step; else 0)
    float *full;               // (full_numel) where the unit's Param.data point
    bool gathered;             // full holds the current parameters
    // Its weights gathered in float8 (Param.gather_float8, dense only): then the dense part
    // travels as one byte all-gather of wire_bytes per rank, those weights' shards as e4m3fn
    // codes and the other parameters' in the gather dtype (bf16 or fp32), one after another in
    // the table's order (FSDP2 packs its all-gather inputs into one uint8 buffer the same way).
    int first_float8, n_float8;    // into Fsdp.float8_amax / float8_scale_inv
    size_t float8_numel;           // elements of those weights (unpadded)
    size_t wire_bytes;             // 0: the dense part travels as floats (no float8 weight)
    uint8_t *full8;                // (float8_numel) where their Param.float8_data point
    // Its NF4 weights: their chunks (nf4_shard_bytes from nf4_offset in ParamTable.nf4, the
    // same on every rank), gathered into full_nf4 (nf4_full_bytes: the blobs one after
    // another) where their Param.nf4_data point.
    size_t nf4_offset, nf4_shard_bytes, nf4_full_bytes;
    uint8_t *full_nf4;
} FsdpUnit;

struct Fsdp {
    BlockHooks hooks;               // first: the hooks find the Fsdp from their pointer
    FsdpConfig config;
    CommGroup *group, *replicate;   // NULL until fsdp_attach (planning needs no MPI)
    CommGroup *expert_group;        // efsdp (config.expert_size > 0)
    ParamTable *params;
    int n_units;
    FsdpUnit *units;                // (n_units) one per block
    size_t numel;                   // this rank's shard floats: params->shard_numel
    size_t max_shard_numel, max_full_numel;
    size_t max_rank_major;          // the largest unit's floats gathered: size x its dense part
                                    // + expert_size x its experts' part
    size_t rank_major_total;        // the same summed over the units
    bool experts_apart;             // some unit has experts' shards (packed apart)
    size_t grad_numel;              // floats of full_grad
    float *data;                    // (numel) the params' shard_data
    float *grad;                    // (grad_shard_numel) their shard_grad: the trained ones'
    size_t grad_shard_numel;
    float *full_params;             // one slot shared by the resharded units, or one per unit
    float *full_grad;               // (max_full_numel) the grads of the unit in backward; or
                                    // every unit's (reduce_once_per_step)
    float *gather_buf;              // (max_rank_major) all-gather output, rank-major per part
    float *scatter_send;            // (max_rank_major) reduce-scatter input, rank-major per part
    float *scatter_recv;            // (max_shard_numel) reduce-scatter output, packed
    float *packed;                  // (max_shard_numel) a unit's shard packed by part
                                    // (experts_apart; else NULL)
    // bf16 copies of the shard sent and the rank-major buffer received (param bf16), and of
    // the reduce-scatter's input and output (reduce bf16); NULL otherwise.
    uint16_t *gather_send16, *gather_recv16, *scatter_send16, *scatter_recv16;
    int n_float8;                   // weights gathered in float8, over all units
    size_t max_wire_bytes;          // the largest unit's wire_bytes
    float *float8_amax;             // (n_float8) each one's amax, all-reduced over the group
    float *float8_scale_inv;        // (n_float8) where their Param.float8_scale_inv point
    uint8_t *full8_params;          // their bytes' slots, as full_params' (float8 elements)
    uint8_t *wire_send, *wire_recv; // (max_wire_bytes), (size x max_wire_bytes)
    uint8_t *nf4;                   // (params->nf4_bytes) the NF4 chunks: ParamTable.nf4
    uint8_t *full_nf4_params;       // the units' NF4 slots, as full_params'
    uint8_t *nf4_recv;              // (size x max_nf4_shard_bytes) the NF4 all-gather's output
    size_t max_nf4_shard_bytes;
    CommHandle gather_nf4;
    bool amax_current;              // float8_precompute: float8_amax is the shards' now
    int gathering, scattering;      // the unit of the outstanding operation, -1: none
    CommHandle gather[2], scatter[2];  // per part: dense, experts
};

// The bytes this rank hands to one group's collectives per microbatch (in comm_bytes' units:
// an all-gather counts its shard, a reduce-scatter its padded full input).
typedef struct {
    uint64_t all_gather_forward;
    uint64_t all_gather_backward;  // re-gathers of resharded units
    uint64_t reduce_scatter;
    uint64_t float8_amax;          // the amaxes all-reduced per gather (without precompute)
} FsdpVolume;

// Per-rank bytes fsdp_allocate carves, and what this rank sends.
typedef struct {
    size_t param_bytes, grad_bytes, comm_bytes;
    // param_bytes' two parts: this rank's shards, and the slots the units' full (unsharded)
    // parameters are gathered into, float8 bytes and their scales included
    ArenaBytes param_shards, param_unsharded;
    FsdpVolume fsdp;                // the fsdp group's: the dense parameters
    FsdpVolume efsdp;               // the efsdp group's: the experts (zero without)
    uint64_t replicate_all_reduce;  // per step, dp_replicate group (HSDP; 0 when the
                                    // replicas step alone)
    uint64_t float8_precompute;     // per step, fsdp group: every float8 amax, all-reduced once
} FsdpEstimate;

// Places the parameters of blocks (n_blocks, their params the table's in order) and plans one
// unit per block (no MPI, no allocation). A weight shared by two blocks (tied embeddings)
// cannot be an FSDP unit's own: the caller refuses it.
void fsdp_plan(Fsdp *f, ParamTable *params, const Block *blocks, int n_blocks,
               const FsdpConfig *config);
FsdpEstimate fsdp_estimate(const Fsdp *f);
// Carves the shards and the full buffers from the arenas, in two passes (core/arena.h): on
// committed arenas also makes them the table's shard buffers and points every Param.data /
// Param.grad into the full buffers.
void fsdp_allocate(Fsdp *f, Arena *params, Arena *grads, Arena *comm);
// Starts communicating over group (the fsdp group, of config.size ranks), experts (efsdp, of
// config.expert_size ranks; NULL when 0) and replicate (dp_replicate; NULL: no HSDP); returns
// the hooks the blocks' runner calls (Model.hooks).
const BlockHooks *fsdp_attach(Fsdp *f, CommGroup *group, CommGroup *experts,
                              CommGroup *replicate);
void fsdp_free(Fsdp *f);

// full (params->numel, laid out by Param.offset) = every parameter's compute tensor, gathered
// from the shards (collective over the fsdp group: every rank gets them).
void fsdp_gather_full(Fsdp *f, float *full);

// After the last microbatch's backward: reduce-scatters every unit's gradient if that waited
// for the step's end, waits for every reduce-scatter, then averages the shard grads over
// dp_replicate.
void fsdp_finish_step(Fsdp *f);
