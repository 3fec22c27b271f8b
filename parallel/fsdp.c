#include "parallel/fsdp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

FsdpReshard fsdp_reshard_parse(const char *mode) {
    if (strcmp(mode, "default") == 0) return FSDP_RESHARD_DEFAULT;
    if (strcmp(mode, "always") == 0) return FSDP_RESHARD_ALWAYS;
    if (strcmp(mode, "never") == 0) return FSDP_RESHARD_NEVER;
    die_user("parallelism.fsdp_reshard_after_forward must be default, always or never, not '%s'",
             mode);
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

// A unit's two parts: its dense parameters, sharded over the fsdp group, and its routed
// experts, over efsdp (config.expert_size > 0).
enum { PART_DENSE, PART_EXPERTS, N_PARTS };

static int part_of(const Fsdp *f, const Param *p) {
    return f->config.expert_size > 0 && p->expert ? PART_EXPERTS : PART_DENSE;
}

static int part_size(const Fsdp *f, int part) {
    return part == PART_EXPERTS ? f->config.expert_size : f->config.size;
}

static CommGroup *part_group(const Fsdp *f, int part) {
    return part == PART_EXPERTS ? f->expert_group : f->group;
}

// FSDP's placement of a parameter of `part` for rank `rank` of the part's group.
static Placement fsdp_placement(const Fsdp *f, int part, int rank) {
    int group = part == PART_EXPERTS ? MESH_GROUP_EFSDP : MESH_GROUP_FSDP;
    return (Placement){.kind = PLACE_SHARD_PADDED, .group = group, .size = part_size(f, part),
                       .rank = rank};
}

// The rows [*first, *first + count) of p's compute tensor that rank k of its part's group
// holds (the last ranks hold fewer, possibly none: the rest of their shard is padding).
static int64_t rank_rows(const Fsdp *f, const Param *p, int k, int64_t *first) {
    Placement pl = fsdp_placement(f, part_of(f, p), k);
    return placement_slice(&pl, p->shape[0], k, first);
}

// The gradients' layouts leave the frozen parameters out (Param.frozen: LoRA's base), which
// take no gradient: grads selects them, the parameters' layouts being the same with all but
// the NF4 weights (QLoRA's base), which travel as bytes of their own.
static bool in_layout(const Param *p, bool grads) { return !p->nf4 && !(grads && p->frozen); }

static const size_t *part_sizes(const FsdpUnit *u, bool grads) {
    return grads ? u->grad_part_numel : u->part_numel;
}

// Where part starts in u's packed shard (the dense parameters' shards, then the experts') and
// in its rank-major buffers (every rank's dense part, then every rank's experts' part).
static size_t packed_start(const FsdpUnit *u, int part, bool grads) {
    return part == PART_EXPERTS ? part_sizes(u, grads)[PART_DENSE] : 0;
}

static size_t rank_major_start(const Fsdp *f, const FsdpUnit *u, int part, bool grads) {
    return part == PART_EXPERTS ? (size_t)f->config.size * part_sizes(u, grads)[PART_DENSE] : 0;
}

static size_t rank_major_numel(const Fsdp *f, const FsdpUnit *u, bool grads) {
    return rank_major_start(f, u, PART_EXPERTS, grads) +
           (size_t)f->config.expert_size * part_sizes(u, grads)[PART_EXPERTS];
}

// Where parameter j of unit u starts in the unit's packed shard.
static size_t packed_offset(const Fsdp *f, const FsdpUnit *u, int j, bool grads) {
    const Param *items = f->params->items;
    int part = part_of(f, &items[j]);
    size_t at = packed_start(u, part, grads);
    for (int i = u->first_param; i < j; i++)
        if (part_of(f, &items[i]) == part && in_layout(&items[i], grads))
            at += items[i].shard_numel;
    return at;
}

// Floats per dim-0 row of p's compute tensor (which may have no rows: another stage's).
static size_t row_numel(const Param *p) {
    size_t n = 1;
    for (int d = 1; d < p->ndim; d++) n *= (size_t)p->shape[d];
    return n;
}

// The mixed-precision policy's two choices (FsdpConfig.precision): the compute weights
// all-gathered in bf16, the grads reduce-scattered in bf16.
static bool gathers_bf16(const Fsdp *f) { return f->config.precision.param == DTYPE_BF16; }
static bool reduces_bf16(const Fsdp *f) { return f->config.precision.reduce == DTYPE_BF16; }

// The bytes per element p travels in on a unit's wire (FsdpUnit.wire_bytes).
static size_t wire_size(const Fsdp *f, const Param *p) {
    return p->gather_float8 ? 1 : gathers_bf16(f) ? 2 : 4;
}

// u's float8 weights and its dense part's bytes on the wire (once the shards are placed).
static void plan_float8(Fsdp *f, FsdpUnit *u) {
    u->first_float8 = f->n_float8;
    size_t wire = 0;
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        if (part_of(f, p) != PART_DENSE || !in_layout(p, false)) continue;
        wire += p->shard_numel * wire_size(f, p);
        if (!p->gather_float8) continue;
        CHECK(p->ndim == 2 && p->shard_numel % row_numel(p) == 0);
        // an e4m3 shard of whole rows of a multiple of 16 columns keeps the wire's bf16 and
        // fp32 shards after it aligned to their element
        CHECK(row_numel(p) % 16 == 0);
        u->n_float8++;
        u->float8_numel += p->numel;
    }
    f->n_float8 += u->n_float8;
    if (u->n_float8 == 0) return;
    u->wire_bytes = wire;
    f->max_wire_bytes = max_size(f->max_wire_bytes, wire);
}

// The first fp32 offset (Param.offset, or shard_offset) at or after parameter j: NF4 ones have
// none (SIZE_MAX); the table's end if none follows.
static size_t offset_from(const ParamTable *t, int j, bool shard) {
    for (; j < t->count; j++)
        if (!t->items[j].nf4) return shard ? t->items[j].shard_offset : t->items[j].offset;
    return shard ? t->shard_numel : t->numel;
}

static void plan_unit(Fsdp *f, FsdpUnit *u) {
    ParamTable *t = f->params;
    u->table_offset = offset_from(t, u->first_param, false);
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        Param *p = &t->items[j];
        int part = part_of(f, p);
        int rank = part == PART_EXPERTS ? f->config.expert_rank : f->config.rank;
        if (p->nf4) params_shard_nf4(t, p, f->config.size, f->config.rank);
        else params_place(t, p, fsdp_placement(f, part, rank));
        params_place(t, p, (Placement){.kind = PLACE_REPLICATE, .group = MESH_DP_REPLICATE,
                                       .size = f->config.replicate_size,
                                       .rank = f->config.replicate_rank});
        if (p->nf4) {
            u->nf4_full_bytes += param_nf4_bytes(p);
            continue;
        }
        CHECK(p->offset == u->table_offset + u->full_numel);  // a block's params are contiguous
        u->full_numel += p->numel;
    }
}

// Whether unit u has nothing on this rank (another pipeline stage's).
static bool unit_empty(const FsdpUnit *u) { return u->full_numel == 0 && u->nf4_full_bytes == 0; }

void fsdp_plan(Fsdp *f, ParamTable *params, const Block *blocks, int n_blocks,
               const FsdpConfig *config) {
    CHECK(config->size >= 1 && config->rank >= 0 && config->rank < config->size);
    CHECK(config->replicate_size >= 1 && config->replicate_rank >= 0 &&
          config->replicate_rank < config->replicate_size);
    CHECK(config->expert_size == 0 ||
          (config->expert_rank >= 0 && config->expert_rank < config->expert_size));
    *f = (Fsdp){.config = *config, .params = params, .n_units = n_blocks, .gathering = -1,
                .scattering = -1};
    f->units = xcalloc((size_t)f->n_units, sizeof(FsdpUnit));
    int first = 0;
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        *u = (FsdpUnit){.fsdp = f, .index = i, .first_param = first,
                        .n_params = blocks[i].n_params};
        plan_unit(f, u);
        first += u->n_params;
    }
    CHECK(first == params->count);
    // The shard offsets are final once every parameter is placed.
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        const ParamTable *t = f->params;
        int end = u->first_param + u->n_params;
        u->shard_offset = offset_from(t, u->first_param, true);
        u->shard_numel = offset_from(t, end, true) - u->shard_offset;
        u->nf4_offset = SIZE_MAX;
        for (int j = u->first_param; j < end; j++) {
            const Param *p = &t->items[j];
            if (p->nf4) {  // its chunks are one run of the table's NF4 buffer
                if (u->nf4_offset == SIZE_MAX) u->nf4_offset = p->nf4_offset;
                CHECK(p->nf4_offset == u->nf4_offset + u->nf4_shard_bytes);
                u->nf4_shard_bytes += p->nf4_shard_bytes;
                continue;
            }
            u->part_numel[part_of(f, p)] += p->shard_numel;
            if (!p->frozen) u->grad_part_numel[part_of(f, p)] += p->shard_numel;
        }
        f->max_nf4_shard_bytes = max_size(f->max_nf4_shard_bytes, u->nf4_shard_bytes);
        CHECK(u->part_numel[PART_DENSE] + u->part_numel[PART_EXPERTS] == u->shard_numel);
        f->experts_apart |= u->part_numel[PART_EXPERTS] > 0;
        f->max_rank_major = max_size(f->max_rank_major, rank_major_numel(f, u, false));
        f->rank_major_total += rank_major_numel(f, u, false);
        f->max_shard_numel = max_size(f->max_shard_numel, u->shard_numel);
        f->max_full_numel = max_size(f->max_full_numel, u->full_numel);
        u->grad_offset = f->grad_numel;
        if (config->reduce_once_per_step) f->grad_numel += u->full_numel;
        plan_float8(f, u);
    }
    if (!config->reduce_once_per_step) f->grad_numel = f->max_full_numel;
    f->numel = f->params->shard_numel;
    // The shard grads, the trained parameters' only in table order (core/param.h): a unit's
    // are one run, its reduce-scatter's dense layout.
    params_layout_grads(f->params);
    f->grad_shard_numel = f->params->shard_grad_numel;
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        u->shard_grad_offset = i > 0 ? f->units[i - 1].shard_grad_offset +
                                           f->units[i - 1].grad_part_numel[PART_DENSE] +
                                           f->units[i - 1].grad_part_numel[PART_EXPERTS]
                                     : 0;
    }
}

// Whether unit i stays gathered from its forward to its backward. torchtitan's default keeps
// the last unit (norm + output): backward needs it first, so resharding it would only make
// backward gather it again at once.
static bool keeps_after_forward(const Fsdp *f, int i) {
    switch (f->config.reshard) {
    case FSDP_RESHARD_NEVER: return true;
    case FSDP_RESHARD_ALWAYS: return false;
    case FSDP_RESHARD_DEFAULT: return i == f->n_units - 1;
    }
    return false;
}

// What a unit gathers into a slot: its full parameters (floats), its float8 weights' bytes,
// its NF4 weights' blobs (bytes).
typedef enum { SLOT_FULL, SLOT_FLOAT8, SLOT_NF4 } SlotKind;

static size_t slot_numel(const FsdpUnit *u, SlotKind kind) {
    return kind == SLOT_FLOAT8 ? u->float8_numel : kind == SLOT_NF4 ? u->nf4_full_bytes
                                                                     : u->full_numel;
}

// Where unit i's slot of `kind` lives in full_params, full8_params or full_nf4_params (i ==
// n_units: the elements needed). Units that reshard after forward take turns in one slot,
// sized by the largest of them (a prefetched unit waits in gather_buf, wire_recv or nf4_recv
// until its turn); every kept unit has a slot of its own.
static size_t slot_offset(const Fsdp *f, int i, SlotKind kind) {
    size_t rotating = 0, kept = 0;
    for (int j = 0; j < f->n_units; j++)
        if (!keeps_after_forward(f, j))
            rotating = max_size(rotating, slot_numel(&f->units[j], kind));
    for (int j = 0; j < i; j++)
        if (keeps_after_forward(f, j)) kept += slot_numel(&f->units[j], kind);
    return i < f->n_units && !keeps_after_forward(f, i) ? 0 : rotating + kept;
}

// The model's parameters point into the full buffers: its blocks compute as if unsharded.
// The float8 weights' bytes and scales likewise.
static void point_params(Fsdp *f) {
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        u->full = f->full_params + slot_offset(f, i, SLOT_FULL);
        u->full8 = f->full8_params ? f->full8_params + slot_offset(f, i, SLOT_FLOAT8) : NULL;
        u->full_nf4 = f->full_nf4_params ? f->full_nf4_params + slot_offset(f, i, SLOT_NF4) : NULL;
        size_t float8_at = 0, nf4_at = 0;
        int float8_index = u->first_float8;
        for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
            Param *p = &f->params->items[j];
            if (p->nf4) {
                p->nf4_data = u->full_nf4 + nf4_at;
                nf4_at += param_nf4_bytes(p);
                continue;
            }
            p->data = u->full + (p->offset - u->table_offset);
            p->grad = p->frozen ? NULL
                                : f->full_grad + u->grad_offset + (p->offset - u->table_offset);
            if (!p->gather_float8) continue;
            p->float8_data = u->full8 + float8_at;
            p->float8_scale_inv = f->float8_scale_inv + float8_index++;
            float8_at += p->numel;
        }
    }
}

// The params arena's two parts: this rank's shards (the optimizer's master weights) and the
// unsharded slots the units are gathered into (fsdp_estimate sizes them apart).
static void carve_params(Fsdp *f, Arena *shards, Arena *unsharded) {
    f->data = arena_floats(shards, f->numel);
    f->full_params = arena_floats(unsharded, slot_offset(f, f->n_units, SLOT_FULL));
    if (f->n_float8 > 0) {
        f->full8_params = arena_alloc(unsharded, slot_offset(f, f->n_units, SLOT_FLOAT8));
        f->float8_scale_inv = arena_floats(unsharded, (size_t)f->n_float8);
    }
    if (f->params->nf4_bytes > 0) {
        f->nf4 = arena_alloc(shards, f->params->nf4_bytes);
        f->full_nf4_params = arena_alloc(unsharded, slot_offset(f, f->n_units, SLOT_NF4));
    }
}

void fsdp_allocate(Fsdp *f, Arena *params, Arena *grads, Arena *comm) {
    size_t rank_major = f->max_rank_major;
    carve_params(f, params, params);
    f->grad = arena_floats(grads, f->grad_shard_numel);
    f->full_grad = arena_floats(grads, f->grad_numel);
    f->gather_buf = arena_floats(comm, rank_major);
    f->scatter_send = arena_floats(comm, rank_major);
    f->scatter_recv = arena_floats(comm, f->max_shard_numel);
    if (f->experts_apart) f->packed = arena_floats(comm, f->max_shard_numel);
    if (gathers_bf16(f)) {
        f->gather_send16 = arena_tensor(comm, f->max_shard_numel, DTYPE_BF16);
        f->gather_recv16 = arena_tensor(comm, rank_major, DTYPE_BF16);
    }
    if (reduces_bf16(f)) {
        f->scatter_send16 = arena_tensor(comm, rank_major, DTYPE_BF16);
        f->scatter_recv16 = arena_tensor(comm, f->max_shard_numel, DTYPE_BF16);
    }
    if (f->n_float8 > 0) {
        f->float8_amax = arena_floats(comm, (size_t)f->n_float8);
        f->wire_send = arena_alloc(comm, f->max_wire_bytes);
        f->wire_recv = arena_alloc(comm, (size_t)f->config.size * f->max_wire_bytes);
    }
    if (f->max_nf4_shard_bytes > 0)
        f->nf4_recv = arena_alloc(comm, (size_t)f->config.size * f->max_nf4_shard_bytes);
    if (!f->data) return;
    ParamTable *t = f->params;
    t->shard_data = f->data;
    t->shard_grad = f->grad;
    t->data = t->grad = NULL;  // the compute tensors live in the units' full buffers
    params_point_nf4(t, f->nf4);
    point_params(f);
}

FsdpEstimate fsdp_estimate(const Fsdp *f) {
    Fsdp sized = *f;
    Arena params, grads, comm;
    arena_init_sizing(&params, "params");
    arena_init_sizing(&grads, "grads");
    arena_init_sizing(&comm, "comm");
    fsdp_allocate(&sized, &params, &grads, &comm);
    Arena shards, unsharded;
    arena_init_sizing(&shards, "params");
    arena_init_sizing(&unsharded, "params");
    carve_params(&sized, &shards, &unsharded);
    uint64_t gathered = gathers_bf16(f) ? 2 : 4, reduced = reduces_bf16(f) ? 2 : 4;
    FsdpVolume v[N_PARTS] = {{0}};
    for (int i = 0; i < f->n_units; i++) {
        const FsdpUnit *u = &f->units[i];
        int gathers = keeps_after_forward(f, i) ? 1 : 2;
        for (int q = 0; q < N_PARTS; q++) {
            uint64_t n = u->part_numel[q];
            uint64_t sent = q == PART_DENSE && u->wire_bytes ? u->wire_bytes : n * gathered;
            v[q].all_gather_forward += sent;
            if (gathers == 2) v[q].all_gather_backward += sent;
            v[q].reduce_scatter += (uint64_t)part_size(f, q) * u->grad_part_numel[q] * reduced;
        }
        v[PART_DENSE].all_gather_forward += u->nf4_shard_bytes;
        if (gathers == 2) v[PART_DENSE].all_gather_backward += u->nf4_shard_bytes;
        if (!f->config.float8_precompute && u->full_numel > 0)  // not another stage's
            v[PART_DENSE].float8_amax += (uint64_t)gathers * u->n_float8 * sizeof(float);
    }
    return (FsdpEstimate){
        .param_bytes = params.peak.total, .param_shards = shards.peak,
        .param_unsharded = unsharded.peak, .grad_bytes = grads.peak.total,
        .comm_bytes = comm.peak.total,
        .fsdp = v[PART_DENSE], .efsdp = v[PART_EXPERTS],
        .replicate_all_reduce = f->config.replicate_size > 1 && !f->config.replicas_step_alone
                                    ? f->grad_shard_numel * sizeof(float) : 0,
        .float8_precompute = f->config.float8_precompute ? f->n_float8 * sizeof(float) : 0};
}

void fsdp_free(Fsdp *f) {
    free(f->units);
    *f = (Fsdp){0};
}

// Copies parameter j of unit u between its place as the model sees it (full: the unit's
// parameters unpadded, one after another) and rank-major (every rank's shard in rank order:
// the all-gather's output (to_full), and the reduce-scatter's input in the gradients' layout,
// padding rows zero).
static void param_copy(const Fsdp *f, const FsdpUnit *u, int j, float *full, float *rank_major,
                       bool to_full) {
    const KernelOps *k_ = f->config.k;
    const Param *p = &f->params->items[j];
    int q = part_of(f, p);
    bool grads = !to_full;
    float *block = rank_major + rank_major_start(f, u, q, grads) +
                   (packed_offset(f, u, j, grads) - packed_start(u, q, grads));
    for (int k = 0; k < part_size(f, q); k++) {
        int64_t first, rows = rank_rows(f, p, k, &first);
        float *part = block + (size_t)k * part_sizes(u, grads)[q];
        float *whole = full + (p->offset - u->table_offset) + (size_t)first * row_numel(p);
        size_t n = (size_t)rows * row_numel(p);
        if (to_full) {
            k_->copy(whole, part, n * sizeof(float));
        } else {
            k_->copy(part, whole, n * sizeof(float));
            k_->zero(part + n, (p->shard_numel - n) * sizeof(float));
        }
    }
}

static void unit_copy(const Fsdp *f, const FsdpUnit *u, float *full, float *rank_major,
                      bool to_full) {
    for (int j = u->first_param; j < u->first_param + u->n_params; j++)
        if (in_layout(&f->params->items[j], !to_full))
            param_copy(f, u, j, full, rank_major, to_full);
}

// Between u's shard (the table's order) and its packed shard: a copy of the parameters
// (to_packed), or the packed gradient (the gradients' layout) added into the shard grads.
static void unit_pack(const Fsdp *f, const FsdpUnit *u, float *packed, bool to_packed) {
    const KernelOps *k = f->config.k;
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        if (!in_layout(p, !to_packed)) continue;
        float *mine = to_packed ? f->data + p->shard_offset : f->grad + p->shard_grad_offset;
        float *in_packed = packed + packed_offset(f, u, j, !to_packed);
        if (to_packed) k->copy(in_packed, mine, p->shard_numel * sizeof(float));
        else k->add(mine, in_packed, p->shard_numel);
    }
}

// ---- the float8 all-gather (FsdpUnit.wire_bytes) ----------------------------------------

// torchao's tensorwise weight cast: e4m3fn, one scale for the whole (out, in) weight.
static const Float8Cast WEIGHT_CAST = {FLOAT8_E4M3FN, false, false, false};

// The shard of float8 weight p as (rows, cols) for the float8 ops: whole rows of its compute
// tensor, padding rows (zero) included.
static int float8_cols(const Param *p) { return (int)row_numel(p); }
static int float8_rows(const Param *p) { return (int)(p->shard_numel / row_numel(p)); }

// The index of u's float8 weight j in Fsdp.float8_amax / float8_scale_inv.
static int float8_index(const Fsdp *f, const FsdpUnit *u, int j) {
    int index = u->first_float8;
    for (int i = u->first_param; i < j; i++) index += f->params->items[i].gather_float8;
    return index;
}

// torchao's precompute_float8_dynamic_scale_for_fsdp: every float8 weight's amax in one
// all-reduce (max), once after each change of the shards (the optimizer step, a load).
static void float8_amax_precompute(Fsdp *f) {
    if (f->amax_current) return;
    const KernelOps *k = f->config.k;
    for (int i = 0; i < f->n_units; i++) {
        const FsdpUnit *u = &f->units[i];
        for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
            const Param *p = &f->params->items[j];
            if (!p->gather_float8) continue;
            k->float8_amax(f->float8_amax + float8_index(f, u, j), f->data + p->shard_offset,
                           float8_rows(p), float8_cols(p), &WEIGHT_CAST);
        }
    }
    comm_all_reduce(f->group, f->float8_amax, (size_t)f->n_float8, COMM_MAX);
    f->amax_current = true;
}

// Casts float8 weight j's shard into out with the scale of the whole weight's amax, the max
// of every rank's (torchao's fsdp_pre_all_gather: its amax all-reduced over the group, weight
// by weight, unless precomputed), so that the bytes equal a cast of the unsharded weight and
// every rank writes the same scale_inv.
static void float8_shard_cast(Fsdp *f, const FsdpUnit *u, int j, const float *shard,
                              uint8_t *out) {
    const KernelOps *k = f->config.k;
    const Param *p = &f->params->items[j];
    int at = float8_index(f, u, j), rows = float8_rows(p), cols = float8_cols(p);
    float *amax = f->float8_amax + at;
    if (!f->config.float8_precompute) {
        k->float8_amax(amax, shard, rows, cols, &WEIGHT_CAST);
        comm_all_reduce(f->group, amax, 1, COMM_MAX);
    }
    k->float8_quantize(out, f->float8_scale_inv + at, amax, shard, rows, cols, &WEIGHT_CAST);
}

// Where dense parameter j starts in u's wire shard, in bytes.
static size_t wire_offset(const Fsdp *f, const FsdpUnit *u, int j) {
    size_t at = 0;
    for (int i = u->first_param; i < j; i++) {
        const Param *p = &f->params->items[i];
        if (part_of(f, p) == PART_DENSE) at += p->shard_numel * wire_size(f, p);
    }
    return at;
}

// Starts the byte all-gather of u's dense part, shard (packed) cast parameter by parameter.
static void wire_gather_start(Fsdp *f, FsdpUnit *u, const float *shard) {
    const KernelOps *k = f->config.k;
    if (f->config.float8_precompute) float8_amax_precompute(f);
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        if (part_of(f, p) != PART_DENSE) continue;
        const float *mine = shard + packed_offset(f, u, j, false);
        uint8_t *out = f->wire_send + wire_offset(f, u, j);
        if (p->gather_float8) float8_shard_cast(f, u, j, mine, out);
        else if (gathers_bf16(f)) k->to_bf16((uint16_t *)out, mine, p->shard_numel);
        else k->copy(out, mine, p->shard_numel * sizeof(float));
    }
    f->gather[PART_DENSE] =
        comm_all_gather_bytes_start(f->group, f->wire_send, f->wire_recv, u->wire_bytes);
}

// Dense parameter j of u from every rank's wire shard to where the model reads it: a float8
// weight's codes to Param.float8_data, the others decoded into the full buffer.
static void param_unwire(const Fsdp *f, const FsdpUnit *u, int j) {
    const KernelOps *k_ = f->config.k;
    const Param *p = &f->params->items[j];
    size_t at = wire_offset(f, u, j), row = row_numel(p);
    for (int k = 0; k < f->config.size; k++) {
        int64_t first, rows = rank_rows(f, p, k, &first);
        const uint8_t *wire = f->wire_recv + (size_t)k * u->wire_bytes + at;
        size_t n = (size_t)rows * row, skip = (size_t)first * row;
        float *whole = u->full + (p->offset - u->table_offset) + skip;
        if (p->gather_float8) k_->copy(p->float8_data + skip, wire, n);
        else if (gathers_bf16(f)) k_->from_bf16(whole, (const uint16_t *)wire, n);
        else k_->copy(whole, wire, n * sizeof(float));
    }
}

// ---- all-gather: the wrapped block's parameters before it runs --------------------------

// Starts the all-gather of each part of u's shard (the experts' only when it has some) into
// gather_buf, or gather_recv16 (bf16), or for the compute weights of a unit with float8
// weights, its dense part into wire_recv. compute false: fp32 masters (fsdp_gather_full).
static void parts_gather_start(Fsdp *f, FsdpUnit *u, bool compute) {
    bool bf16 = compute && gathers_bf16(f);
    const float *shard = f->data + u->shard_offset;
    if (u->part_numel[PART_EXPERTS] > 0) {
        unit_pack(f, u, f->packed, true);
        shard = f->packed;
    }
    for (int q = 0; q < N_PARTS; q++) {
        size_t n = u->part_numel[q], at = packed_start(u, q, false);
        size_t out = rank_major_start(f, u, q, false);
        if (q == PART_EXPERTS && n == 0) continue;
        if (q == PART_DENSE && compute && u->wire_bytes) {
            wire_gather_start(f, u, shard);
        } else if (bf16) {
            f->config.k->to_bf16(f->gather_send16 + at, shard + at, n);
            f->gather[q] = comm_all_gather_bf16_start(part_group(f, q), f->gather_send16 + at,
                                                      f->gather_recv16 + out, n);
        } else {
            f->gather[q] =
                comm_all_gather_start(part_group(f, q), shard + at, f->gather_buf + out, n);
        }
    }
}

static void parts_wait(CommHandle handles[N_PARTS]) {
    for (int q = 0; q < N_PARTS; q++) comm_wait(&handles[q]);
}

static void gather_start(Fsdp *f, FsdpUnit *u) {
    parts_gather_start(f, u, true);
    if (u->nf4_shard_bytes)
        f->gather_nf4 = comm_all_gather_bytes_start(f->group, f->nf4 + u->nf4_offset,
                                                    f->nf4_recv, u->nf4_shard_bytes);
    f->gathering = u->index;
}

// u's NF4 weights from every rank's chunks (nf4_recv, rank-major) to their blobs.
static void nf4_unpack(const Fsdp *f, const FsdpUnit *u) {
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        if (!p->nf4) continue;
        size_t all = param_nf4_bytes(p), chunk = p->nf4_shard_bytes;
        for (size_t k = 0, at = 0; at < all; k++, at += chunk) {
            const uint8_t *from = f->nf4_recv + k * u->nf4_shard_bytes +
                                  (p->nf4_offset - u->nf4_offset);
            f->config.k->copy(p->nf4_data + at, from, all - at < chunk ? all - at : chunk);
        }
    }
}

// Completes the outstanding all-gather into its unit's slot, which it takes from whichever
// unit had it.
static void gather_finish(Fsdp *f) {
    if (f->gathering < 0) return;
    FsdpUnit *u = &f->units[f->gathering];
    parts_wait(f->gather);
    comm_wait(&f->gather_nf4);
    f->gathering = -1;
    for (int j = 0; j < f->n_units; j++)
        if (f->units[j].full == u->full) f->units[j].gathered = false;
    size_t wired = u->wire_bytes ? rank_major_start(f, u, PART_EXPERTS, false) : 0;  // not bf16
    if (gathers_bf16(f))
        f->config.k->from_bf16(f->gather_buf + wired, f->gather_recv16 + wired,
                               rank_major_numel(f, u, false) - wired);
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        if (!in_layout(&f->params->items[j], false)) continue;
        if (u->wire_bytes && part_of(f, &f->params->items[j]) == PART_DENSE)
            param_unwire(f, u, j);
        else
            param_copy(f, u, j, u->full, f->gather_buf, true);
    }
    if (u->nf4_shard_bytes) nf4_unpack(f, u);
    u->gathered = true;
}

static void unit_gather(Fsdp *f, FsdpUnit *u) {
    if (u->gathered) return;
    if (f->gathering != u->index) {
        gather_finish(f);  // a prefetch nobody claimed: finish it to free gather_buf
        gather_start(f, u);
    }
    gather_finish(f);
}

// Starts unit i's all-gather so that it overlaps the current block's compute.
static void gather_prefetch(Fsdp *f, int i) {
    if (i < 0 || i >= f->n_units || f->units[i].gathered || f->gathering >= 0) return;
    if (unit_empty(&f->units[i])) return;  // another pipeline stage's: nothing here
    gather_start(f, &f->units[i]);
}

// The shards are about to change (optimizer step, initialisation, load): no full copy is
// current any more.
static void reshard_all(Fsdp *f) {
    gather_finish(f);
    for (int i = 0; i < f->n_units; i++) f->units[i].gathered = false;
    f->amax_current = false;
}

// ---- reduce-scatter: the wrapped block's gradients after its backward --------------------

// Completes the outstanding reduce-scatter: its average over the group (the experts' sum
// divided by the fsdp size) is this microbatch's contribution to the unit's shard grads.
static void scatter_finish(Fsdp *f) {
    if (f->scattering < 0) return;
    FsdpUnit *u = &f->units[f->scattering];
    const KernelOps *k = f->config.k;
    parts_wait(f->scatter);
    f->scattering = -1;
    float divide = 1.0f / (float)f->config.size;
    size_t experts = u->grad_part_numel[PART_EXPERTS];
    size_t n = u->grad_part_numel[PART_DENSE] + experts;
    if (reduces_bf16(f)) {  // a bf16 sum: the average is taken in fp32
        k->from_bf16(f->scatter_recv, f->scatter_recv16, n);
        k->scale(f->scatter_recv, n, divide);
    } else if (experts > 0) {
        k->scale(f->scatter_recv + packed_start(u, PART_EXPERTS, true), experts, divide);
    }
    if (experts > 0) unit_pack(f, u, f->scatter_recv, false);
    else k->add(f->grad + u->shard_grad_offset, f->scatter_recv, n);  // the same layout
}

// Starts the reduce-scatter of u's gradients, those of its trained parameters only (a unit
// whose parameters are all frozen has none to send).
static void scatter_start(Fsdp *f, FsdpUnit *u) {
    scatter_finish(f);  // it overlapped this unit's backward; its buffers are needed now
    if (u->grad_part_numel[PART_DENSE] + u->grad_part_numel[PART_EXPERTS] == 0) return;
    unit_copy(f, u, f->full_grad + u->grad_offset, f->scatter_send, false);
    if (reduces_bf16(f))
        f->config.k->to_bf16(f->scatter_send16, f->scatter_send, rank_major_numel(f, u, true));
    for (int q = 0; q < N_PARTS; q++) {
        size_t n = u->grad_part_numel[q], at = packed_start(u, q, true);
        size_t in = rank_major_start(f, u, q, true);
        if (n == 0) continue;
        if (reduces_bf16(f)) {
            f->scatter[q] = comm_reduce_scatter_bf16_start(
                part_group(f, q), f->scatter_send16 + in, f->scatter_recv16 + at, n);
        } else {
            CommOp op = q == PART_EXPERTS ? COMM_SUM : COMM_AVG;
            f->scatter[q] = comm_reduce_scatter_start(part_group(f, q), f->scatter_send + in,
                                                      f->scatter_recv + at, n, op);
        }
    }
    f->scattering = u->index;
}

// ---- the hooks around each block call ---------------------------------------------------

// Forward runs the units in order; a recompute belongs to backward, which runs them in reverse.
// The weight part of a split backward needs no parameters (a weight's gradient is dy^T x).
static void unit_before(const BlockHooks *h, int block, BlockPhase phase) {
    Fsdp *f = (Fsdp *)h;
    FsdpUnit *u = &f->units[block];
    bool once = f->config.reduce_once_per_step;
    CHECK(once || phase == BLOCK_FORWARD || phase == BLOCK_RECOMPUTE || phase == BLOCK_BACKWARD);
    if (phase == BLOCK_BACKWARD_WEIGHT) return;
    unit_gather(f, u);
    gather_prefetch(f, phase == BLOCK_FORWARD ? block + 1 : block - 1);
    if (phase == BLOCK_BACKWARD && !once)
        f->config.k->zero(f->full_grad, u->full_numel * sizeof(float));
}

static void unit_after(const BlockHooks *h, int block, BlockPhase phase) {
    Fsdp *f = (Fsdp *)h;
    FsdpUnit *u = &f->units[block];
    if (phase == BLOCK_FORWARD && !keeps_after_forward(f, block)) u->gathered = false;
    if (phase != BLOCK_BACKWARD && phase != BLOCK_BACKWARD_INPUT) return;
    if (!f->config.reduce_once_per_step) scatter_start(f, u);
    u->gathered = false;
}

const BlockHooks *fsdp_attach(Fsdp *f, CommGroup *group, CommGroup *experts,
                              CommGroup *replicate) {
    CHECK(comm_size(group) == f->config.size && comm_rank(group) == f->config.rank);
    CHECK(f->config.expert_size == 0 || (comm_size(experts) == f->config.expert_size &&
                                         comm_rank(experts) == f->config.expert_rank));
    f->expert_group = experts;
    CHECK((replicate ? comm_size(replicate) : 1) == f->config.replicate_size);
    f->group = group;
    f->replicate = replicate;
    f->hooks = (BlockHooks){unit_before, unit_after};
    return &f->hooks;
}

// ---- checkpoints, the end of a step -------------------------------------------------------

void fsdp_gather_full(Fsdp *f, float *full) {
    gather_finish(f);
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        parts_gather_start(f, u, false);
        parts_wait(f->gather);
        unit_copy(f, u, full + u->table_offset, f->gather_buf, true);
    }
}

void fsdp_finish_step(Fsdp *f) {
    for (int i = 0; i < f->n_units && f->config.reduce_once_per_step; i++) {
        FsdpUnit *u = &f->units[i];
        if (u->full_numel == 0) continue;  // another pipeline stage's
        scatter_start(f, u);
        f->config.k->zero(f->full_grad + u->grad_offset, u->full_numel * sizeof(float));
    }
    scatter_finish(f);
    if (f->config.replicate_size > 1 && !f->config.replicas_step_alone)
        comm_all_reduce(f->replicate, f->grad, f->grad_shard_numel, COMM_AVG);
    reshard_all(f);
}

