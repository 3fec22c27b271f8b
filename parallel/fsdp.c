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
    return (Placement){PLACE_SHARD_PADDED, 0, group, part_size(f, part), rank, 0};
}

// The rows [*first, *first + count) of p's compute tensor that rank k of its part's group
// holds (the last ranks hold fewer, possibly none: the rest of their shard is padding).
static int64_t rank_rows(const Fsdp *f, const Param *p, int k, int64_t *first) {
    Placement pl = fsdp_placement(f, part_of(f, p), k);
    return placement_slice(&pl, p->shape[0], k, first);
}

// Where part starts in u's packed shard (the dense parameters' shards, then the experts') and
// in its rank-major buffers (every rank's dense part, then every rank's experts' part).
static size_t packed_start(const FsdpUnit *u, int part) {
    return part == PART_EXPERTS ? u->part_numel[PART_DENSE] : 0;
}

static size_t rank_major_start(const Fsdp *f, const FsdpUnit *u, int part) {
    return part == PART_EXPERTS ? (size_t)f->config.size * u->part_numel[PART_DENSE] : 0;
}

static size_t rank_major_numel(const Fsdp *f, const FsdpUnit *u) {
    return rank_major_start(f, u, PART_EXPERTS) +
           (size_t)f->config.expert_size * u->part_numel[PART_EXPERTS];
}

// Where parameter j of unit u starts in the unit's packed shard.
static size_t packed_offset(const Fsdp *f, const FsdpUnit *u, int j) {
    const Param *items = f->params->items;
    int part = part_of(f, &items[j]);
    size_t at = packed_start(u, part);
    for (int i = u->first_param; i < j; i++)
        if (part_of(f, &items[i]) == part) at += items[i].shard_numel;
    return at;
}

// Floats per dim-0 row of p's compute tensor (which may have no rows: another stage's).
static size_t row_numel(const Param *p) {
    size_t n = 1;
    for (int d = 1; d < p->ndim; d++) n *= (size_t)p->shape[d];
    return n;
}

static void plan_unit(Fsdp *f, FsdpUnit *u) {
    ParamTable *t = f->params;
    u->table_offset = u->first_param < t->count ? t->items[u->first_param].offset : t->numel;
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        Param *p = &t->items[j];
        CHECK(p->offset == u->table_offset + u->full_numel);  // a block's params are contiguous
        int part = part_of(f, p);
        int rank = part == PART_EXPERTS ? f->config.expert_rank : f->config.rank;
        params_place(t, p, fsdp_placement(f, part, rank));
        params_place(t, p, (Placement){PLACE_REPLICATE, 0, MESH_DP_REPLICATE,
                                       f->config.replicate_size, f->config.replicate_rank, 0});
        u->full_numel += p->numel;
    }
}

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
        u->shard_offset = u->first_param < t->count ? t->items[u->first_param].shard_offset
                                                    : t->shard_numel;
        u->shard_numel = (end < t->count ? t->items[end].shard_offset : t->shard_numel) -
                         u->shard_offset;
        for (int j = u->first_param; j < end; j++)
            u->part_numel[part_of(f, &t->items[j])] += t->items[j].shard_numel;
        CHECK(u->part_numel[PART_DENSE] + u->part_numel[PART_EXPERTS] == u->shard_numel);
        f->experts_apart |= u->part_numel[PART_EXPERTS] > 0;
        f->max_rank_major = max_size(f->max_rank_major, rank_major_numel(f, u));
        f->rank_major_total += rank_major_numel(f, u);
        f->max_shard_numel = max_size(f->max_shard_numel, u->shard_numel);
        f->max_full_numel = max_size(f->max_full_numel, u->full_numel);
        u->grad_offset = f->grad_numel;
        if (config->reduce_once_per_step) f->grad_numel += u->full_numel;
    }
    if (!config->reduce_once_per_step) f->grad_numel = f->max_full_numel;
    f->numel = f->params->shard_numel;
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

// Where unit i's full params live in full_params (i == n_units: the floats needed). Units that
// reshard after forward take turns in one slot, sized by the largest of them (a prefetched
// unit waits in gather_buf until its turn); every kept unit has a slot of its own.
static size_t slot_offset(const Fsdp *f, int i) {
    size_t rotating = 0, kept = 0;
    for (int j = 0; j < f->n_units; j++)
        if (!keeps_after_forward(f, j)) rotating = max_size(rotating, f->units[j].full_numel);
    for (int j = 0; j < i; j++)
        if (keeps_after_forward(f, j)) kept += f->units[j].full_numel;
    return i < f->n_units && !keeps_after_forward(f, i) ? 0 : rotating + kept;
}

// The model's parameters point into the full buffers: its blocks compute as if unsharded.
static void point_params(Fsdp *f) {
    for (int i = 0; i < f->n_units; i++) {
        FsdpUnit *u = &f->units[i];
        u->full = f->full_params + slot_offset(f, i);
        for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
            Param *p = &f->params->items[j];
            p->data = u->full + (p->offset - u->table_offset);
            p->grad = f->full_grad + u->grad_offset + (p->offset - u->table_offset);
        }
    }
}

void fsdp_allocate(Fsdp *f, Arena *params, Arena *grads, Arena *comm) {
    size_t rank_major = f->max_rank_major;
    f->data = arena_floats(params, f->numel);
    f->full_params = arena_floats(params, slot_offset(f, f->n_units));
    f->grad = arena_floats(grads, f->numel);
    f->full_grad = arena_floats(grads, f->grad_numel);
    f->gather_buf = arena_floats(comm, rank_major);
    f->scatter_send = arena_floats(comm, rank_major);
    f->scatter_recv = arena_floats(comm, f->max_shard_numel);
    if (f->experts_apart) f->packed = arena_floats(comm, f->max_shard_numel);
    if (f->config.bf16_params) {
        f->gather_send16 = arena_tensor(comm, f->max_shard_numel, DTYPE_BF16);
        f->gather_recv16 = arena_tensor(comm, rank_major, DTYPE_BF16);
    }
    if (f->config.bf16_reduce) {
        f->scatter_send16 = arena_tensor(comm, rank_major, DTYPE_BF16);
        f->scatter_recv16 = arena_tensor(comm, f->max_shard_numel, DTYPE_BF16);
    }
    if (!f->data) return;
    ParamTable *t = f->params;
    t->shard_data = f->data;
    t->shard_grad = f->grad;
    t->data = t->grad = NULL;  // the compute tensors live in the units' full buffers
    point_params(f);
}

FsdpEstimate fsdp_estimate(const Fsdp *f) {
    Fsdp sized = *f;
    Arena params, grads, comm;
    arena_init_sizing(&params, "params");
    arena_init_sizing(&grads, "grads");
    arena_init_sizing(&comm, "comm");
    fsdp_allocate(&sized, &params, &grads, &comm);
    uint64_t gathered = f->config.bf16_params ? 2 : 4, reduced = f->config.bf16_reduce ? 2 : 4;
    FsdpVolume v[N_PARTS] = {{0}};
    for (int i = 0; i < f->n_units; i++) {
        for (int q = 0; q < N_PARTS; q++) {
            uint64_t n = f->units[i].part_numel[q];
            v[q].all_gather_forward += n * gathered;
            if (!keeps_after_forward(f, i)) v[q].all_gather_backward += n * gathered;
            v[q].reduce_scatter += (uint64_t)part_size(f, q) * n * reduced;
        }
    }
    return (FsdpEstimate){
        .param_bytes = params.peak.total, .grad_bytes = grads.peak.total,
        .comm_bytes = comm.peak.total,
        .fsdp = v[PART_DENSE], .efsdp = v[PART_EXPERTS],
        .replicate_all_reduce = f->config.replicate_size > 1 ? f->numel * sizeof(float) : 0};
}

void fsdp_free(Fsdp *f) {
    free(f->units);
    *f = (Fsdp){0};
}

// Copies between a unit's parameters laid out as the model sees them (full: unpadded, one
// after another) and rank-major (every rank's shard in rank order: the all-gather's output
// and the reduce-scatter's input, padding rows zero).
static void unit_copy(const Fsdp *f, const FsdpUnit *u, float *full, float *rank_major,
                      bool to_full) {
    const KernelOps *k_ = f->config.k;
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        int q = part_of(f, p);
        float *block = rank_major + rank_major_start(f, u, q) +
                       (packed_offset(f, u, j) - packed_start(u, q));
        for (int k = 0; k < part_size(f, q); k++) {
            int64_t first, rows = rank_rows(f, p, k, &first);
            float *part = block + (size_t)k * u->part_numel[q];
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
}

// Between u's shard (the table's order) and its packed shard: a copy of the parameters
// (to_packed), or the packed gradient added into the shard grads.
static void unit_pack(const Fsdp *f, const FsdpUnit *u, float *shard, float *packed,
                      bool to_packed) {
    const KernelOps *k = f->config.k;
    for (int j = u->first_param; j < u->first_param + u->n_params; j++) {
        const Param *p = &f->params->items[j];
        float *mine = shard + (p->shard_offset - u->shard_offset);
        float *in_packed = packed + packed_offset(f, u, j);
        if (to_packed) k->copy(in_packed, mine, p->shard_numel * sizeof(float));
        else k->add(mine, in_packed, p->shard_numel);
    }
}

// ---- all-gather: the wrapped block's parameters before it runs --------------------------

// Starts the all-gather of each part of u's shard (the experts' only when it has some) into
// gather_buf, or gather_recv16 (bf16).
static void parts_gather_start(Fsdp *f, FsdpUnit *u, bool bf16) {
    const float *shard = f->data + u->shard_offset;
    if (u->part_numel[PART_EXPERTS] > 0) {
        unit_pack(f, u, f->data + u->shard_offset, f->packed, true);
        shard = f->packed;
    }
    for (int q = 0; q < N_PARTS; q++) {
        size_t n = u->part_numel[q], at = packed_start(u, q), out = rank_major_start(f, u, q);
        if (q == PART_EXPERTS && n == 0) continue;
        if (bf16) {
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
    parts_gather_start(f, u, f->config.bf16_params);
    f->gathering = u->index;
}

// Completes the outstanding all-gather into its unit's slot, which it takes from whichever
// unit had it.
static void gather_finish(Fsdp *f) {
    if (f->gathering < 0) return;
    FsdpUnit *u = &f->units[f->gathering];
    parts_wait(f->gather);
    f->gathering = -1;
    for (int j = 0; j < f->n_units; j++)
        if (f->units[j].full == u->full) f->units[j].gathered = false;
    if (f->config.bf16_params)
        f->config.k->from_bf16(f->gather_buf, f->gather_recv16, rank_major_numel(f, u));
    unit_copy(f, u, u->full, f->gather_buf, true);
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
    if (f->units[i].full_numel == 0) return;  // another pipeline stage's: nothing here
    gather_start(f, &f->units[i]);
}

// The shards are about to change (optimizer step, initialisation, load): no full copy is
// current any more.
static void reshard_all(Fsdp *f) {
    gather_finish(f);
    for (int i = 0; i < f->n_units; i++) f->units[i].gathered = false;
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
    if (f->config.bf16_reduce) {  // a bf16 sum: the average is taken in fp32
        k->from_bf16(f->scatter_recv, f->scatter_recv16, u->shard_numel);
        k->scale(f->scatter_recv, u->shard_numel, divide);
    } else if (u->part_numel[PART_EXPERTS] > 0) {
        k->scale(f->scatter_recv + packed_start(u, PART_EXPERTS), u->part_numel[PART_EXPERTS],
                 divide);
    }
    if (u->part_numel[PART_EXPERTS] > 0)
        unit_pack(f, u, f->grad + u->shard_offset, f->scatter_recv, false);
    else
        k->add(f->grad + u->shard_offset, f->scatter_recv, u->shard_numel);
}

static void scatter_start(Fsdp *f, FsdpUnit *u) {
    scatter_finish(f);  // it overlapped this unit's backward; its buffers are needed now
    unit_copy(f, u, f->full_grad + u->grad_offset, f->scatter_send, false);
    if (f->config.bf16_reduce)
        f->config.k->to_bf16(f->scatter_send16, f->scatter_send, rank_major_numel(f, u));
    for (int q = 0; q < N_PARTS; q++) {
        size_t n = u->part_numel[q], at = packed_start(u, q), in = rank_major_start(f, u, q);
        if (q == PART_EXPERTS && n == 0) continue;
        if (f->config.bf16_reduce) {
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
    if (f->config.replicate_size > 1) comm_all_reduce(f->replicate, f->grad, f->numel, COMM_AVG);
    reshard_all(f);
}

