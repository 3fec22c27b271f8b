// Parameters: one table of named, shaped tensors drives allocation, gradients, optimizer state
// and checkpoints by offset arithmetic (llm.c's ParameterTensors, made data instead of code).
//
// A parameter is a DTensor in C (docs/design.md "Parameters carry their layout"): its torchtitan /
// Hugging Face-convertible fully-qualified name ("layers.3.attention.wq.weight"), a global shape,
// and the placements the parallelisms gave it, one per mesh group it is laid over, in the order
// they were applied (tensor parallel first, then FSDP), each cutting the box of the global
// tensor that the ones before it left this rank. A group of one rank is no placement.
//
// Every parameter has two local forms, each a box of the global tensor (ParamBox: along each
// dim one range of global indices, or several when a blocked Shard cut that dim):
// - the compute tensor (shape, numel, data, grad): what the model's blocks compute with, cut
//   by the compute placements (Replicate, Shard) only;
// - the shard (shard_numel floats at shard_offset in ParamTable.shard_data / shard_grad): what
//   this rank stores, updates in the optimizer and checkpoints, also cut by FSDP's padded
//   Shard, which is gathered before compute. Without one the shard is the compute tensor.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"

#define PARAM_NAME_MAX 96
#define PARAM_MAX_DIMS 3
#define PARAM_MAX_PLACEMENTS 4
#define PARAM_MAX_BLOCKS 4  // a blocked Shard's parts: FLUX's fused [q; k; v; mlp_in]
#define PARAM_MAX_RANGES 8  // of a box along one dim (ParamRanges)

// How a parameter is initialised (torchtitan's init_weights): a (truncated) normal, ones or
// zeros, torch.nn.init.xavier_uniform_ of an (out, in) matrix: uniform on [-a, a], a =
// sqrt(6 / (in + out)) (FLUX's linears), or nn.Linear's own reset_parameters: uniform on
// [-a, a], a = 1 / sqrt(in) (a module torchtitan gives no init of its own).
typedef enum {
    INIT_ONES, INIT_ZEROS, INIT_NORMAL, INIT_TRUNC_NORMAL, INIT_XAVIER_UNIFORM,
    INIT_KAIMING_UNIFORM
} ParamInit;

typedef enum {
    PLACE_REPLICATE,     // Replicate(): every rank of the group holds the whole box
    // Shard(dim): `size` equal slices of the box along dim. Blocked (n_blocks > 0): the box's
    // extent along dim is n_blocks parts of blocks[k] elements one after another, and each
    // part is cut into `size` equal slices; rank r holds slice r of every part, part after
    // part. That is Megatron's column-parallel cut of a fused Linear (FLUX's qkv weight
    // (3D, D) = [q; k; v], blocks {D, D, D}): rank r's rows are r's rows of q, then of k, then
    // of v, the weight a tensor-parallel fused Linear computes with, which is no single box of
    // the global tensor but one range per part along dim (along dim 1: a row-parallel Linear
    // whose input is such parts side by side). A plain Shard is one block.
    PLACE_SHARD,
    // FSDP's Shard(dim): ceil(n / size) along dim per rank, the last ranks fewer (possibly
    // none), padded to the same length in storage and gathered before compute. Padding is
    // never part of the box (nor of a checkpoint). It cuts the local extent the compute
    // placements left, so after a blocked Shard of that dim a rank's slice may hold pieces of
    // several parts (some of them cut).
    PLACE_SHARD_PADDED,
    // The whole box on one rank of the group (`owner`), nothing (an empty box) on the others:
    // a pipeline stage's parameters, held by the pp rank that runs the stage.
    PLACE_OWNED,
} PlacementKind;

typedef struct {
    PlacementKind kind;
    int dim;         // the tensor dim a shard cuts (PLACE_OWNED: 0, emptied off the owner)
    int group;       // which mesh group (parallel/mesh.h's MeshGroup; opaque here)
    int size, rank;  // the group's size and this rank's index in it
    int owner;       // PLACE_OWNED: the rank that holds the tensor
    // PLACE_SHARD blocked: the parts' lengths along dim, summing to the extent it cuts (the
    // global tensor's, for the first placement), each a multiple of size; 0: a plain Shard.
    int n_blocks;
    int64_t blocks[PARAM_MAX_BLOCKS];
    // PLACE_REPLICATE over tensor parallel: each rank's gradient is a partial sum (DTensor's
    // Partial), its rows' share under sequence parallel or its heads' share of a per-head
    // weight, which the step sums over the group (parallel/grads.h); false: every rank
    // computes the same whole gradient (the parameter's math runs redundantly on each).
    bool grad_partial;
} Placement;

// The global indices a box holds along one dim: n ranges [start[k], start[k] + count[k]),
// increasing, laid out one after another along that dim of the local tensor (none: empty).
typedef struct {
    int n;
    int64_t start[PARAM_MAX_RANGES], count[PARAM_MAX_RANGES];
} ParamRanges;

// The elements of the global tensor a rank holds: every combination of an index from each
// dim's ranges, in row-major order of the local tensor, whose shape is count. Because each
// dim's ranges increase, that is also their order in the global tensor: a set of elements
// HDF5 selects as a union of hyperslabs.
typedef struct {
    int ndim;
    int64_t count[PARAM_MAX_DIMS];      // the local extent along each dim: its ranges' total
    ParamRanges ranges[PARAM_MAX_DIMS];
} ParamBox;

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;
    int64_t global_shape[PARAM_MAX_DIMS];
    int n_placements;
    Placement placements[PARAM_MAX_PLACEMENTS];  // in the order applied
    int64_t shape[PARAM_MAX_DIMS];  // the compute tensor's (its box's counts)
    size_t numel;
    size_t offset;        // in floats, into ParamTable.data / grad
    size_t shard_numel;   // floats this rank stores, padding included
    size_t shard_offset;  // in floats, into ParamTable.shard_data and the optimizer's moments
    // In floats, into ParamTable.shard_grad, which holds the trained parameters' shard grads
    // only, one after another in table order: a frozen one takes none (SIZE_MAX).
    size_t shard_grad_offset;
    // A routed expert's weight, (E, out, in) stacked over the E experts: expert parallel
    // shards dim 0 over the ep group and FSDP the rest over efsdp (parallel/ep).
    bool expert;
    // A persistent buffer (torchtitan's register_buffer(persistent=True), e.g. the MoE expert
    // bias): placed, gathered, checkpointed and resharded as a parameter, but not trained: no
    // gradient reaches it and the optimizer leaves it (its owner updates it).
    bool buffer;
    // A copy of the earlier parameter of the same name, kept equal to it: a weight two blocks
    // use that FSDP units or pipeline stages would otherwise split (Megatron's shared
    // embedding between its first and last stage). It starts from the same numbers (the name
    // seeds the init, a checkpoint's tensor of that name loads both), its gradient and the
    // original's are summed each step (grads_sum_copies) and counted once in the norm, so the
    // two take the same optimizer steps; checkpoints and exports hold the original only.
    bool copy;
    // A pretrained weight fine-tuning leaves as it is (LoRA's base, models/lora.h): no
    // gradient is taken for it (its grad is NULL: a Linear skips its weight-gradient GEMM, a
    // norm its weight's sum, the embedding its backward), nor stored (no shard grad): the
    // optimizer, the grad norm, FSDP's reduce-scatter and the checkpoints' optimizer state
    // skip it.
    bool frozen;
    // QLoRA's base (lora.quantize_base, models/lora.h): a frozen weight held as NF4 (core/nf4.h)
    // instead of fp32: the blob of its whole global tensor (param_nf4_bytes; none off its
    // pipeline stage), which the Linear reads at nf4_data and dequantizes at each GEMM (a
    // tensor-parallel rank its part: the compute tensor's box). It has no floats in the table's
    // buffers (data NULL; offset and shard_offset SIZE_MAX). This rank stores bytes
    // [nf4_shard_rank * nf4_shard_bytes, + that) of the blob at nf4_offset in ParamTable.nf4
    // (nf4_shard), zero past its end: the whole blob (nf4_shard == nf4_data), or under FSDP one
    // of nf4_shards equal chunks, which FSDP gathers into nf4_data before the weight computes
    // (params_shard_nf4).
    bool nf4;
    size_t nf4_offset;
    size_t nf4_shard_bytes;
    int nf4_shards, nf4_shard_rank;
    uint8_t *nf4_shard;
    uint8_t *nf4_data;
    ParamInit init;
    double init_std;      // for the normal inits
    double init_cutoff;   // truncation bound |x| <= cutoff (absolute, as torch's a/b)
    float *data;          // (shape) fp32 weights the model computes with
    float *grad;          // (shape)
    // FSDP's float8 all-gather (float8.enable_fsdp_float8_all_gather, torchao's
    // WeightWithDynamicFloat8CastTensor): the trainer marks the weights of tensorwise float8
    // Linears, which FSDP then casts shard by shard with the scale of the whole weight's amax
    // and gathers as e4m3fn bytes. float8_data (shape) and float8_scale_inv (1) hold them
    // while the weight is gathered, where the Linear reads them instead of data (which FSDP
    // leaves stale); NULL when not gathered in float8.
    bool gather_float8;
    uint8_t *float8_data;
    float *float8_scale_inv;
} Param;

typedef struct {
    Param *items;
    int count, capacity;
    size_t numel;        // total floats of the compute tensors
    size_t shard_numel;  // total floats of the shards
    float *data, *grad;  // (numel) the flat buffers the compute pointers point into
    // (shard_numel) the fp32 masters and (shard_grad_numel) the trained ones' grads: data and
    // grad themselves unless a padded placement (FSDP) keeps them elsewhere.
    float *shard_data, *shard_grad;
    size_t shard_grad_numel;  // shard_numel less the frozen parameters'
    uint8_t *nf4;             // (nf4_bytes) the NF4 parameters' stored blobs (Param.nf4_shard)
    size_t nf4_bytes;
} ParamTable;

void params_init(ParamTable *t, int capacity);
void params_free(ParamTable *t);
// Appends a parameter; name is printf-formatted. Returns its index.
__attribute__((format(printf, 6, 7))) int params_add(ParamTable *t, ParamInit init,
                                                      double init_std, int ndim,
                                                      const int64_t *shape, const char *fmt, ...);
Param *params_find(const ParamTable *t, const char *name);
// Appends a copy of parameter `of` (Param.copy): its name, shape and init. Returns its index.
int params_add_copy(ParamTable *t, int of);
// Appends placement pl to p (nothing for a group of one rank); the local shapes and every
// offset of the table follow. Before params_allocate. A Shard must divide its dim (each of
// its blocks) evenly; a compute placement cannot follow a padded one (FSDP shards what the
// others left).
void params_place(ParamTable *t, Param *p, Placement pl);
// Drops p's Replicate placement over mesh group `group` (none: nothing to do), for a group
// whose ranks a later placement gives other parts of p (expert parallel takes tp's).
void params_unplace(Param *p, int group);
// p's placement over mesh group `group`, NULL if it has none.
const Placement *param_placement_on(const Param *p, int group);
// The count of n elements (along pl's dim) that rank holds under pl, starting at *start; pl
// holds one range per rank (not a blocked Shard).
int64_t placement_slice(const Placement *pl, int64_t n, int rank, int64_t *start);
// This rank's box of the global tensor: the compute tensor's (shard false) or the shard's.
ParamBox param_box(const Param *p, bool shard);
size_t box_numel(const ParamBox *b);
// The first global index b holds along dim d, which must be one range there (0 if empty).
int64_t box_start(const ParamBox *b, int d);
// Whether this rank writes p's shard when the replicas write once: it is replica 0 of every
// Replicate placement (and p no copy: the original is written).
bool param_is_primary_replica(const Param *p);
// The same within one replica of mesh group `group`: replica 0 of every other Replicate.
bool param_is_primary_replica_within(const Param *p, int group);
size_t param_global_numel(const Param *p);
// The global flattened (row-major) index of element i (row-major) of p's box b.
size_t param_global_index(const Param *p, const ParamBox *b, size_t i);
// Lays the shard grads out again after Param.frozen changed (models/lora.c).
void params_layout_grads(ParamTable *t);
// Makes the frozen weight p an NF4 parameter (Param.nf4), before params_allocate.
void params_make_nf4(ParamTable *t, Param *p);
// FSDP's shard of NF4 parameter p: rank's of `size` equal chunks of its blob, whole 4-byte
// words (checkpoints store the blob as float32 words).
void params_shard_nf4(ParamTable *t, Param *p, int size, int rank);
// The bytes of p's blob: 0 when its compute tensor is empty (another stage's).
size_t param_nf4_bytes(const Param *p);
// Whether this rank writes NF4 parameter p's shard: tensor-parallel ranks hold the same blob,
// so their rank 0 writes it, as the primary replica writes a replicated one.
bool param_nf4_writes(const Param *p);
// The bytes of p's blob this rank's shard holds (the rest of Param.nf4_shard_bytes is padding).
size_t param_nf4_held(const Param *p);
// Points every NF4 parameter's nf4_shard into nf4 (t->nf4_bytes), and its nf4_data too when its
// shard is the whole blob (t->nf4 = nf4).
void params_point_nf4(ParamTable *t, uint8_t *nf4);
// NF4 parameter p's shard (padding zero) from x, its whole tensor (on its stage), quantized.
void param_nf4_store(const Param *p, const float *x);
// Carves the compute data (numel floats), the NF4 blobs (nf4_bytes) and the grad
// (shard_grad_numel) buffers from the arenas and sets every pointer (a frozen parameter's grad
// NULL); the shard buffers are the same ones unless the caller (FSDP) places them.
void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena);
// view = t's parameters with their shards over other storage: shard_data (t->shard_numel
// floats) and nf4 (t->nf4_bytes), e.g. host copies of what lives on a device; the compute
// tensors point there too when no padded placement sets them apart (else NULL), grads NULL.
// Free it with params_free.
void params_view(ParamTable *view, const ParamTable *t, float *shard_data, uint8_t *nf4);
// sub = the parameters of t for which keep(p) holds, in t's order, over t's storage (the same
// offsets and pointers): a table to load part of a model through. Free it with params_free.
void params_select(ParamTable *sub, const ParamTable *t, bool (*keep)(const Param *p));
// global = t's parameters as whole global fp32 tensors (no placements, no NF4) over new
// zeroed host storage (global->data), e.g. a model read from a file of whole tensors; a copy
// shares its original's tensor. Free global->data, then params_free.
void params_global_view(ParamTable *global, const ParamTable *t);
// Copies every parameter's shard box out of global (params_global_view's layout) into t's
// shard storage (padding zero); an NF4 parameter's is quantized into its blob.
void params_shards_from_global(ParamTable *t, const ParamTable *global);
// Fills every parameter's shard (padding zero) from (seed, name, global index) as its init
// says: the same numbers on every layout (an NF4 parameter's quantized).
void params_initialize(ParamTable *t, uint64_t seed);
// dst (count) = elements [first, first + count) of p's initial value (row-major, global
// indices): the same numbers params_initialize writes there, so a piece is filled alone.
void param_fill(const Param *p, uint64_t seed, size_t first, size_t count, float *dst);
// Calls fn(global_first, local_first, count, arg) for each run of box b that is contiguous
// in both the global row-major tensor of p and the box (local indices row-major within the
// box), in local order: one per range of the innermost dim the box does not hold whole, for
// each index of the dims before it.
void param_box_runs(const Param *p, const ParamBox *b,
                    void (*fn)(size_t global_first, size_t local_first, size_t count, void *arg),
                    void *arg);
