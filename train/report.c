// What the trainer reports about its plan and its run: `titan --estimate` (each pp rank's
// memory, FLOPs and traffic per step), the memory check before the arenas are allocated, the
// context-parallel K/V traffic line and <dump_folder>/run_summary.json after a run.
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/nf4.h"
#include "kernels/device.h"
#include "kernels/step_time.h"
#include "train/train.h"

// <dump_folder>/run_summary.json: what this run allocated and sent (rank 0's view), in the
// terms `titan --estimate` predicts, so the two can be compared.
void trainer_write_run_summary(Trainer *t) {
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/run_summary.json", t->cfg.job.dump_folder);
    FILE *f = fopen(path, "w");
    if (!f) die_user("cannot write %s: %s", path, strerror(errno));
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                             &t->comm_arena};
    const char *names[] = {"params", "grads", "optimizer", "activations", "comm"};
    fprintf(f, "{\"world_size\": %d, \"steps\": %lld, \"arena_bytes\": {",
            t->mesh.layout.world_size, (long long)t->progress.step);
    for (int i = 0; i < 5; i++) fprintf(f, "%s\"%s\": %zu", i ? ", " : "", names[i], arenas[i]->size);
    CommGroup *groups[] = {t->mesh.fsdp, t->mesh.group[MESH_DP_REPLICATE], t->mesh.group[MESH_TP],
                           t->mesh.group[MESH_CP], t->mesh.group[MESH_PP], t->mesh.loss,
                           t->mesh.efsdp, t->mesh.ep};
    fprintf(f, "}, \"comm_bytes\": {");
    // The sparse mesh's groups with ep; a group of one moves nothing (comm_report).
    for (int i = 0; i < (t->mesh.layout.ep > 1 ? 8 : 6); i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", comm_name(groups[i]),
                (unsigned long long)(comm_size(groups[i]) > 1 ? comm_bytes(groups[i]) : 0));
    fprintf(f, "}}\n");
    if (fclose(f) != 0) die_user("cannot write %s: %s", path, strerror(errno));
}

// What one rank hands to each group's collectives per step (comm.h's accounting), from the
// plans of FSDP, TP and CP: the analytic volume that a real run's comm report must equal.
typedef struct {
    const char *group;
    uint64_t bytes;
} GroupBytes;
enum { MAX_GROUPS = 9 };  // fsdp, efsdp, dp_replicate, tp, cp, pp, pp_tied, ep, loss

// Of blocks [first, last), the transformer layers (blocks 1 .. n_blocks - 2), or only those
// whose forward runs twice (recomputed: activation checkpointing re-runs it in backward); moe:
// only those with a MoE layer, the head's MTP modules' among them (never recomputed).
static int layers_in(const Trainer *t, int first, int last, bool recomputed, bool moe) {
    const Model *m = &t->model;
    ModelShape shape = model_shape(&t->args);
    int layers = 0;
    for (int b = first; b < last; b++) {
        bool layer = b > 0 && b < m->n_blocks - 1 && (!recomputed || m->blocks[b].checkpointed);
        layers += layer && (!moe || (shape.moe && b - 1 >= shape.dense_layers));
        layers += moe && shape.moe && !recomputed && b == m->n_blocks - 1 ? shape.mtp_layers : 0;
    }
    return layers;
}

// The transformer layers this rank runs, all or its stages' (or the recomputed of them; moe:
// those with a MoE layer).
static int rank_layers(Trainer *t, bool recomputed, bool moe) {
    if (!t->pipeline) return layers_in(t, 0, t->model.n_blocks, recomputed, moe);
    PipelineRankPlan pl = trainer_pipeline_rank_plan(t);
    int layers = 0;
    for (int s = 0; s < pl.stages; s++)
        if (pl.stage_rank[s] == pl.rank)
            layers += layers_in(t, pl.first[s], pl.first[s + 1], recomputed, moe);
    return layers;
}

// Every layer's attention, per step: forward, recompute under activation checkpointing, and
// backward, on this rank's K and V of all its microbatches' rows (the bytes are linear in them).
static uint64_t cp_bytes_per_step(Trainer *t) {
    const int *size = t->mesh.layout.size;
    uint64_t kv_floats = (uint64_t)t->train.B * t->train.step_T *
                         (model_shape(&t->args).kv_dim / size[MESH_TP]);
    uint64_t forward = cp_attention_bytes(&t->cp, kv_floats, false);
    uint64_t backward = cp_attention_bytes(&t->cp, kv_floats, true);
    uint64_t forwards = (uint64_t)rank_layers(t, false, false) + (uint64_t)rank_layers(t, true, false);
    return t->accum * (forwards * forward + rank_layers(t, false, false) * backward);
}

// Expert parallel's all-to-alls (ep_estimate's, per MoE layer and microbatch) over every MoE
// layer this rank runs and every microbatch of a step: expected_bytes with balanced routing
// (what a step sends is data-dependent), bound_bytes at the receive bound.
static EpEstimate ep_per_step(Trainer *t) {
    const MoeArgs *a = model_shape(&t->args).moe;
    int64_t micro_rows = t->pipeline ? t->cfg.parallelism.pipeline_parallel_microbatch_size
                                     : t->train.B;
    int64_t rows = micro_rows * t->train.step_T / t->mesh.layout.size[MESH_TP];
    uint64_t passes =
        (uint64_t)t->accum * (t->pipeline ? trainer_schedule_microbatches(&t->cfg) : 1);
    uint64_t again = (uint64_t)rank_layers(t, true, true), once = rank_layers(t, false, true) - again;
    EpEstimate e[2];
    for (int recompute = 0; recompute < 2; recompute++)
        e[recompute] = ep_estimate(t->mesh.layout.ep, rows, a->router.top_k, a->router.n_experts,
                                   a->dim, a->capacity_factor, recompute);
    e[0].expected_bytes = passes * (once * e[0].expected_bytes + again * e[1].expected_bytes);
    e[0].bound_bytes = passes * (once * e[0].bound_bytes + again * e[1].bound_bytes);
    return e[0];
}

static bool ep_on(Trainer *t) { return t->mesh.layout.ep > 1 && model_shape(&t->args).moe; }

// Muon's gathers and broadcasts of its matrices over group (parallel/muon_shards.h) a step.
static uint64_t muon_bytes(const Trainer *t, int group) {
    uint64_t bytes = 0;
    for (int i = 0; t->opt.muon.is_muon && i < t->model.params.count; i++)
        if (t->opt.muon.is_muon[i]) bytes += muon_dist_bytes(&t->model.params.items[i], group);
    return bytes;
}

static int comm_per_step(Trainer *t, GroupBytes out[MAX_GROUPS]) {
    int n = 0;
    const int *size = t->mesh.layout.size;
    // A MoE balance loss is averaged as the loss is (one more double for the loss group and
    // the pipeline); the expert load's sum goes over the world, which is not reported.
    uint64_t aux = t->model.moe && t->model.moe->aux_loss ? sizeof(double) : 0;
    PipelineRankPlan pl = t->pipeline ? trainer_pipeline_rank_plan(t) : (PipelineRankPlan){0};
    // FSDP gathers each block once per microbatch, a pipeline's too, and reduce-scatters its
    // gradient as often, or once per step under a pipeline (reduce_once_per_step).
    int passes = t->accum * (t->pipeline ? trainer_schedule_microbatches(&t->cfg) : 1);
    if (t->fsdp_on) {
        FsdpEstimate e = fsdp_estimate(&t->fsdp);
        const FsdpVolume *v[2] = {&e.fsdp, &e.efsdp};
        const char *names[2] = {"fsdp", "efsdp"};
        // Over fsdp (dp_shard x cp ranks) and the experts' efsdp (dp_shard x cp x tp / ep):
        // a group of one moves nothing (a pipeline's stages without dp_shard, ep = dp_shard).
        const MeshLayout *l = &t->mesh.layout;
        int ranks[2] = {size[MESH_DP_SHARD] * size[MESH_CP],
                        l->ep > 1 ? mesh_sparse_size(l) / l->ep : 1};
        for (int g = 0; g < (l->ep > 1 ? 2 : 1); g++) {
            if (ranks[g] == 1) continue;
            uint64_t gathers = passes * (v[g]->all_gather_forward + v[g]->all_gather_backward +
                                         v[g]->float8_amax);
            uint64_t reduces = (t->pipeline ? 1 : passes) * v[g]->reduce_scatter;
            uint64_t norm = g == 0 ? sizeof(double) : 0;  // the grad norm's sum goes over fsdp
            uint64_t precompute = g == 0 ? e.float8_precompute : 0;
            uint64_t muon = g == 0 ? muon_bytes(t, MESH_GROUP_FSDP) : 0;
            out[n++] = (GroupBytes){names[g], gathers + reduces + norm + precompute + muon};
        }
        if (size[MESH_DP_REPLICATE] > 1 && !t->opt.outer.on)
            out[n++] = (GroupBytes){"dp_replicate", e.replicate_all_reduce};
    }
    if (t->ddp_on && !t->opt.outer.on)
        out[n++] = (GroupBytes){"dp_replicate", ddp_bytes_per_step(&t->model.params)};
    if (t->opt.outer.on) {  // the fragments' syncs over the run, a mean per step
        int steps = (int)t->cfg.training.steps;
        size_t floats = semi_sync_floats(&t->semi_sync, steps);
        out[n++] = (GroupBytes){"dp_replicate", steps > 0 ? 4 * floats / steps : 0};
    }
    if (t->tp_on) {
        uint64_t micro = 0;  // this rank's blocks: all, or its pipeline stages'
        for (int s = 0; s < (t->pipeline ? pl.stages : 1); s++) {
            if (t->pipeline && pl.stage_rank[s] != pl.rank) continue;
            int first = t->pipeline ? pl.first[s] : 0;
            int last = t->pipeline ? pl.first[s + 1] : t->model.n_blocks;
            micro += t->args.spec->tp_bytes_per_microbatch(&t->args, size[MESH_TP], t->train.B,
                                                           t->train.step_T,
                                                           layers_in(t, first, last, true, false),
                                                           t->tp.hooks.loss_parallel, first, last);
        }
        size_t replicated = grads_replicated_floats(&t->model.params);
        out[n++] = (GroupBytes){"tp", t->accum * micro + 4 * replicated + sizeof(double) +
                                          muon_bytes(t, MESH_TP)};
    }
    if (t->cp_on) out[n++] = (GroupBytes){"cp", cp_bytes_per_step(t)};
    if (t->pipeline) {  // the sends, then the step's loss and grad norm summed over the stages
        uint64_t sent = pl.act_bytes_sent + pl.grad_bytes_sent;
        out[n++] = (GroupBytes){"pp", t->accum * sent + 2 * sizeof(double) + aux};
        size_t tied = grads_copies_floats(&t->model.params);  // the first and last stages'
        if (tied) out[n++] = (GroupBytes){"pp_tied", 4 * tied};
    }
    if (ep_on(t)) out[n++] = (GroupBytes){"ep", ep_per_step(t).expected_bytes};
    // The step's mean loss, over the data ranks (dp x cp): none when they are one.
    if (mesh_dp_size(&t->mesh.layout) * size[MESH_CP] > 1)
        out[n++] = (GroupBytes){"loss", sizeof(double) + aux};
    return n;
}

// What context parallel's K/V traffic cost this rank over a run of `elapsed` seconds
// (parallel/cp/cp.h's counts): the time blocked on it is what compute did not hide.
void trainer_log_cp_traffic(const Trainer *t, double elapsed) {
    const Cp *cp = &t->cp;
    log_info("cp: %lld K/V transfers (%s), %.2f MiB sent, %.2f s blocked on them (%.1f%% of "
             "training)", (long long)cp->transfers,
             cp->rotate == CP_ALLTOALL ? "alltoall ring" : "allgather", cp->bytes_sent / 1048576.0,
             cp->wait_seconds, elapsed > 0 ? 100 * cp->wait_seconds / elapsed : 0.0);
}

// The FLOPs per token of the blocks this rank runs: the whole model's, or its stages' share.
static BlockFlops rank_flops_per_token(Trainer *t) {
    PipelineRankPlan pl = t->pipeline ? trainer_pipeline_rank_plan(t) : (PipelineRankPlan){0};
    BlockFlops sum = {0};
    for (int b = 0; b < t->model.n_blocks; b++) {
        bool mine = !t->pipeline;
        for (int s = 0; s < pl.stages && !mine; s++)
            mine = pl.stage_rank[s] == pl.rank && b >= pl.first[s] && b < pl.first[s + 1];
        if (!mine) continue;
        const BlockFlops *f = &t->model.block_flops[b];
        sum.gemm += f->gemm, sum.gemm_done += f->gemm_done;
        sum.attention += f->attention, sum.attention_done += f->attention_done;
    }
    return sum;
}

// This rank's tokens of a step (tensor parallel's ranks compute on each token's share).
static double rank_tokens_per_step(const Trainer *t) {
    return (double)t->accum * t->train.B * t->train.step_T / t->mesh.layout.size[MESH_TP];
}

// "  params      17835520   0.017  fp32 17835520": a row of the arena table, its name indented
// further for a part of the row above.
static void print_bytes_row(const char *indent, const char *name, ArenaBytes b) {
    char dtypes[160];
    arena_bytes_format(b, 1, 0, dtypes, sizeof dtypes);
    printf("  %s%-*s %16zu %12.3f  %s\n", indent, 12 - (int)strlen(indent), name, b.total,
           b.total / (1024.0 * 1024.0 * 1024.0), dtypes);
}

// One rank's arenas (each split by the dtypes it holds at its peak; under FSDP the params
// also into shards and unsharded slots), FLOPs and per-group bytes per step.
static void print_rank_plan(Trainer *t) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                             &t->comm_arena};
    ArenaBytes total = {0};
    printf("  %-12s %16s %12s  %s\n", "arena", "bytes per rank", "GiB", "bytes by dtype");
    for (int i = 0; i < 5; i++) {
        ArenaBytes peak = arenas[i]->peak;
        print_bytes_row("", arenas[i]->name ? arenas[i]->name : "comm", peak);
        if (i == 0 && t->fsdp_on) {  // FSDP's params: the rank's shards, the gathered units
            FsdpEstimate e = fsdp_estimate(&t->fsdp);
            print_bytes_row("  ", "shards", e.param_shards);
            print_bytes_row("  ", "unsharded", e.param_unsharded);
        }
        total.total += peak.total;
        for (int d = 0; d < DTYPE_COUNT; d++) total.by[d] += peak.by[d];
    }
    print_bytes_row("", "total", total);
    printf("  activation_checkpoint none: %zu, selective %s: %zu, full: %zu bytes of a training "
           "step's activations\n", t->act_bytes_ac[0],
           t->cfg.activation_checkpoint.selective_ac_option, t->act_bytes_ac[1],
           t->act_bytes_ac[2]);
    double tokens = rank_tokens_per_step(t);
    BlockFlops flops = rank_flops_per_token(t);
    double per_token = flops.gemm + flops.attention;
    printf("  FLOPs per step per rank: %.12g (%.6g per token, %storchtitan's 6N + 6 L H (Q + V) T, head widths Q and V)\n",
           tokens * per_token, per_token, t->pipeline ? "its blocks' share of " : "");
    GroupBytes groups[MAX_GROUPS];
    int n = comm_per_step(t, groups);
    printf("  %-12s %16s %12s\n", "group", "bytes per step", "GiB");
    for (int i = 0; i < n; i++)
        printf("  %-12s %16llu %12.3f\n", groups[i].group, (unsigned long long)groups[i].bytes,
               groups[i].bytes / GiB);
    if (ep_on(t)) {
        EpEstimate e = ep_per_step(t);
        printf("  ep all-to-all: the ep row routes evenly; at most %llu bytes per step, a MoE "
               "layer receiving at most %lld rows per microbatch\n",
               (unsigned long long)e.bound_bytes, (long long)e.recv_rows_bound);
    }
}

// ---- the predicted step time (kernels/step_time.h) -----------------------------------------

// Ops a block issues per microbatch, forward and backward: about 60 per decoder layer (its
// GEMMs and their casts, norms, RoPE, attention, SwiGLU, adds, zeroing) in a profiled step of
// the debug model. What a GPU's launch latency multiplies.
static const double OPS_PER_BLOCK = 60;
// The bytes elementwise ops move per byte of activation a block keeps: written in the forward,
// read in the backward, its gradient written and read. A recomputed activation is written once
// more.
static const double ELEMENTWISE_PASSES = 4;
// Bytes per parameter of a step beside the blocks: AdamW reads the weight, its gradient and the
// two moments and writes three of them (28), the gradient norm reads the gradient (4), zeroing
// writes it (4); the average (training.ema_decay) reads two and writes one more (12).
static const double OPTIMIZER_BYTES = 36, EMA_BYTES = 12;
// A float8 cast reads its operand twice (amax, then quantize) and writes a byte: 9 bytes per
// element of each GEMM operand.
static const double FLOAT8_CAST_BYTES = 9;

// Each group's consecutive ranks (its span in the mesh, tp innermost) and whether the compute
// waits for it (kernels/step_time.h).
static GroupWork group_work(const Trainer *t, GroupBytes g) {
    const int *size = t->mesh.layout.size;
    int tp = size[MESH_TP], cp = size[MESH_CP] * tp, shard = size[MESH_DP_SHARD] * cp;
    int world = t->mesh.layout.world_size, data = world / size[MESH_PP];
    static const char *const BLOCKING[] = {"tp", "ep", "loss"};
    GroupWork w = {.group = g.group, .bytes = (double)g.bytes};
    for (size_t i = 0; i < sizeof BLOCKING / sizeof BLOCKING[0]; i++)
        w.blocking |= strcmp(g.group, BLOCKING[i]) == 0;
    w.span = !strcmp(g.group, "tp")     ? tp
             : !strcmp(g.group, "cp")   ? cp
             : !strcmp(g.group, "pp")   ? world
             : !strcmp(g.group, "loss") || !strcmp(g.group, "dp_replicate") ? data
                                                                           : shard;
    return w;
}

// The bytes the whole model's float8 casts move per microbatch of `rows` rows: each float8
// Linear's input and output-gradient operands (twice each: rowwise casts each along two axes)
// and its weight three times (forward, and each backward GEMM); a routed expert sees top_k / E
// of the rows. Also the float8 Linears' share of the GEMM weights (`share`).
static double float8_cast_bytes(const Trainer *t, double rows, double *share) {
    const MoeArgs *moe = model_shape(&t->args).moe;
    double bytes = 0, f8 = 0, all = 0;
    for (int i = 0; i < t->model.n_linears; i++) {
        const Linear *l = t->model.linears[i].linear;
        const Param *p = l->weight;
        double active = p->expert ? (double)moe->router.top_k / moe->router.n_experts : 1;
        all += (double)p->numel * active;
        if (l->precision == LINEAR_BACKEND) continue;
        f8 += (double)p->numel * active;
        double in = (double)p->shape[p->ndim - 1], out = (double)p->shape[p->ndim - 2];
        double experts = p->expert ? (double)p->shape[0] : 1;
        bytes += FLOAT8_CAST_BYTES * (3 * (double)p->numel + 2 * rows * active * experts * (in + out));
    }
    *share = all > 0 ? f8 / all : 0;
    return bytes;
}

// Muon's Newton-Schulz GEMMs on this rank a step: its whole matrices', and a 1/n share of
// those n ranks cut (each is one rank's in turn).
static double muon_gemm_flops(const Trainer *t) {
    const Muon *m = &t->opt.muon;
    double flops = 0;
    for (int i = 0; m->is_muon && i < t->model.params.count; i++) {
        const Param *p = &t->model.params.items[i];
        if (!m->is_muon[i] || !p->shard_numel) continue;
        int n = muon_dist_members(p);
        flops += n > 1 ? muon_flops(m, p, param_global_numel(p)) / n
                       : muon_flops(m, p, p->shard_numel);
    }
    return flops;
}

// Rows of one microbatch: the local batch's, or a pipeline microbatch's.
static double microbatch_rows(const Trainer *t) {
    return (double)t->train.step_T *
           (double)(t->pipeline ? t->cfg.parallelism.pipeline_parallel_microbatch_size : t->train.B);
}

// What this rank's step does, in kernels/step_time.h's terms, from the plan.
static StepWork step_work(Trainer *t, int sharing) {
    StepWork w = {.sharing = sharing};
    PipelineRankPlan pl = t->pipeline ? trainer_pipeline_rank_plan(t) : (PipelineRankPlan){0};
    int micro = t->accum * (t->pipeline ? trainer_schedule_microbatches(&t->cfg) : 1);
    double tokens = rank_tokens_per_step(t), f8_share, model_gemm = 0;
    BlockFlops flops = rank_flops_per_token(t);
    for (int b = 0; b < t->model.n_blocks; b++) model_gemm += t->model.block_flops[b].gemm;
    // The model's casts, this rank's share of them (its stages' GEMMs).
    double f8_bytes = float8_cast_bytes(t, microbatch_rows(t), &f8_share) *
                      (model_gemm > 0 ? flops.gemm / model_gemm : 1);
    GemmPrecision compute = gemm_precision_of(t->precision.param);
    w.gemm_flops[GEMM_FLOAT8] = tokens * flops.gemm_done * f8_share;
    w.gemm_flops[compute] = tokens * flops.gemm_done * (1 - f8_share) + muon_gemm_flops(t);
    w.attention_flops = tokens * flops.attention_done;
    // A pipeline's arena holds its peak live microbatches' regions: one microbatch's is a region.
    double per_micro = t->pipeline && pl.regions > 0 ? 1.0 / pl.regions : 1;
    double kept = (double)t->act_bytes_ac[0] * per_micro;
    double recomputed = kept - (double)t->act_arena.peak.total * per_micro;
    w.elementwise_bytes = micro * (ELEMENTWISE_PASSES * kept + (recomputed > 0 ? recomputed : 0));
    w.cast_bytes = micro * f8_bytes;
    const ParamTable *params = &t->model.params;
    double trained = 0;  // AdamW and the gradient norm pass over the trained parameters
    for (int i = 0; i < params->count; i++)
        if (!params->items[i].frozen) trained += (double)params->items[i].shard_numel;
    double ema = t->cfg.training.ema_decay > 0 ? EMA_BYTES * (double)params->shard_numel : 0;
    w.optimizer_bytes = trained * OPTIMIZER_BYTES + ema;
    // the head's MTP modules each issue a layer's and a loss's
    int blocks = 0, head = t->model.n_blocks, mtp = model_shape(&t->args).mtp_layers;
    for (int s = 0; s < pl.stages; s++)
        if (pl.stage_rank[s] == pl.rank)
            blocks += pl.first[s + 1] - pl.first[s] + (pl.first[s + 1] == head ? mtp : 0);
    w.ops = OPS_PER_BLOCK * micro * (t->pipeline ? blocks : head + mtp);
    GroupBytes groups[MAX_GROUPS];
    w.n_groups = comm_per_step(t, groups);
    for (int g = 0; g < w.n_groups; g++) w.groups[g] = group_work(t, groups[g]);
    w.bubble = t->pipeline ? pl.bubble : 0;
    return w;
}

// The device row the prediction runs on: --device-table's, by default cpu's probed now and
// cuda's H100's. A probe starts training.device's backend (the estimate's sizing ran on the
// cpu's, which starts nothing): on the planning machine, which is what it measures.
static DeviceTable estimate_device(Trainer *t) {
    const char *device = t->cfg.training.device;
    bool cpu = strcmp(device, "cpu") == 0;
    const char *name = t->estimate_device_table ? t->estimate_device_table : cpu ? "probe" : "H100";
    if (strcmp(name, "probe") != 0) return *device_table_named(name);
    const KernelOps *k = kernels_backend(device);
    if (!k)
        die_user("--device-table probe: training.device %s: this titan was built without it "
                 "(build with `make CUDA=1`)", device);
    KernelInit init = {.precision = t->precision};
    char why[512];
    if (!k->init(&init, why, sizeof why))
        die_user("--device-table probe: training.device %s: %s", device, why);
    ModelShape shape = model_shape(&t->args);
    double rows = microbatch_rows(t);
    ProbeShape probe = {.compute = t->precision.param, .rows = rows < 1 << 30 ? (int)rows : 1 << 30,
                        .dim = shape.dim, .head_dim = shape.head_dim, .seq_len = t->train.T,
                        .float8 = t->float8_recipe != NULL};
    return device_probe(k, &probe, cpu ? 0.3 : 4);
}

// "device: H100 SXM (data sheet ...): GEMM bf16 740 TFLOP/s, ..."
static void print_device(const DeviceTable *d) {
    static const char *const PRECISIONS[] = {"fp32", "bf16", "float8"};
    printf("device: %s (%s): GEMM", d->name, d->source);
    for (int p = 0; p < GEMM_PRECISIONS; p++)
        if (d->gemm[p] > 0) printf(" %s %.4g TFLOP/s", PRECISIONS[p], d->gemm[p] / 1e12);
    printf(", attention %.4g TFLOP/s (head_dim %d), elementwise %.4g GB/s, optimizer %.4g GB/s",
           d->attention / 1e12, d->attention_head_dim, d->memory / 1e9, d->optimizer / 1e9);
    if (d->cast > 0) printf(", float8 casts %.4g GB/s", d->cast / 1e9);
    printf(", %.3g us per op", d->op * 1e6);
    if (d->devices_per_node)
        printf(", links %.4g GB/s in a node of %d, %.4g GB/s between nodes", d->link_node / 1e9,
               d->devices_per_node, d->link_network / 1e9);
    printf("\n");
}

// "  step time 0.35 s: GEMM 0.07 s, ...": one pp rank's prediction, term by term.
static void print_step_time(const StepTime *s, double bubble) {
    printf("  step time %.4g s: GEMM %.4g s, attention %.4g s, elementwise %.4g s, ", s->step,
           s->gemm, s->attention, s->elementwise);
    if (s->casts > 0) printf("float8 casts %.4g s, ", s->casts);
    printf("optimizer %.4g s, op issue %.4g s; collectives %.4g s blocking, %.4g s overlapped "
           "(%.4g s exposed)", s->optimizer, s->ops, s->blocking, s->overlapped, s->exposed);
    if (bubble > 0) printf("; pipeline bubble %.3f", bubble);
    printf("\n");
}

// "step time: 0.35 s predicted, 2900 tokens/s per device, MFU 21% ...": the slowest pp rank's
// step (a pipeline's step is its slowest rank's), in the step line's terms.
// On cpu a run's MFU is against its rank's own GEMM peak: the host's, shared by `sharing` ranks.
static void print_prediction(const Trainer *t, const DeviceTable *d, double step, int pp_rank,
                             int sharing) {
    double tokens = trainer_tokens_per_device(t);
    double peak = t->cfg.metrics.peak_flops > 0 ? t->cfg.metrics.peak_flops
                                                : d->peak[gemm_precision_of(t->precision.param)];
    if (t->cfg.metrics.peak_flops <= 0 && strcmp(t->cfg.training.device, "cpu") == 0)
        peak /= sharing;
    char mfu[96] = "MFU n/a";
    if (peak > 0)
        snprintf(mfu, sizeof mfu, "MFU %.1f%% of %.4g TFLOP/s", 100 * tokens / step *
                 t->model.flops_per_token / peak, peak / 1e12);
    char who[48] = "";
    if (pp_rank >= 0) snprintf(who, sizeof who, " (pp rank %d, the slowest)", pp_rank);
    printf("step time: %.4g s predicted%s, %.0f tokens/s per device, %s\n", step, who,
           tokens / step, mfu);
}

// "0 (blocks 0-3: embed, layers.0-2)": a stage and its blocks, named as docs/design.md's block list
// (embed, layers.0 .. layers.{L-1}, head).
static void print_stage(int stage, int first, int last, int n_blocks) {
    printf("%d (blocks %d-%d:", stage, first, last - 1);
    const char *sep = " ";
    if (first == 0) printf("%sembed", sep), sep = ", ";
    int lo = first > 1 ? first - 1 : 0, hi = (last < n_blocks - 1 ? last : n_blocks - 1) - 2;
    if (lo < hi) printf("%slayers.%d-%d", sep, lo, hi), sep = ", ";
    if (lo == hi) printf("%slayers.%d", sep, lo), sep = ", ";
    if (last == n_blocks) printf("%shead", sep);
    printf(")");
}

// The pipeline's line (its schedule and the checker's bubble), then one rank's heading: its
// stages, the checker's peak live microbatches that size its activations, and its sends.
static void print_pipeline_rank(Trainer *t) {
    PipelineRankPlan pl = trainer_pipeline_rank_plan(t);
    if (pl.rank == 0)
        printf("  pipeline %s: %d stages, %d microbatches, bubble %.4f (the checker's cost "
               "model, as --print-schedule)\n", pl.schedule, pl.stages, pl.microbatches,
               pl.bubble);
    printf("pp rank %d: stage%s", pl.rank, pl.stages > t->mesh.layout.size[MESH_PP] ? "s" : "");
    const char *sep = " ";
    for (int s = 0; s < pl.stages; s++)
        if (pl.stage_rank[s] == pl.rank) {
            printf("%s", sep);
            print_stage(s, pl.first[s], pl.first[s + 1], t->model.n_blocks);
            sep = ", ";
        }
    printf("\n  peak live %d microbatches: activations in %d regions x %zu bytes", pl.peak_live,
           pl.regions, pl.region_bytes);
    if (pl.eval_regions)  // validation's take turns with training's in the same arena
        printf("; validation: %d x %zu", pl.eval_regions, pl.eval_region_bytes);
    printf("\n");
    printf("  p2p per pipeline step: %llu bytes of activations sent forward, %llu of gradients "
           "backward\n", (unsigned long long)pl.act_bytes_sent,
           (unsigned long long)pl.grad_bytes_sent);
}

// The closest change that makes the run fit in `room` bytes per rank: activation checkpointing
// when it is off and would be enough, a smaller batch when activations are most of the need
// (a batch of one row: fewer tokens per rank, by context parallel or a shorter sequence), else
// more ranks to shard the weights, gradients and optimizer state over (FSDP).
static void memory_fix(const Trainer *t, double need, double room, char *out, size_t len) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    double act = (double)t->act_arena.peak.total, act_ac = (double)t->act_bytes_ac[2];
    if (strcmp(t->cfg.activation_checkpoint.mode, "full") && need - act + act_ac <= room)
        snprintf(out, len, "activation_checkpoint.mode full (activations %.2f GiB -> %.2f GiB)",
                 act / GiB, act_ac / GiB);
    else if (act > need / 2 && t->cfg.training.local_batch_size > 1)
        snprintf(out, len, "a smaller training.local_batch_size (activations are %.2f GiB)",
                 act / GiB);
    else if (act > need / 2)
        snprintf(out, len, "a larger parallelism.context_parallel_degree or a shorter "
                 "training.seq_len (activations are %.2f GiB)", act / GiB);
    else
        snprintf(out, len, "more ranks with FSDP (parallelism.data_parallel_shard_degree: "
                 "params, grads and optimizer are %.2f GiB)", (need - act) / GiB);
}

// What the memory check adds to the arenas: a 5% margin for what lives outside them
// (libraries, thread stacks, a synchronous save's staging on a device).
static const double MEMORY_MARGIN = 1.05;

// The bytes per rank the memory check compares: every arena's peak, and an async checkpoint's
// host staging copies where the arenas are host memory too.
static double memory_need(const Trainer *t, bool host_memory) {
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                             &t->comm_arena};
    double need = host_memory ? (double)trainer_checkpoint_staging_bytes(t) : 0;
    for (int i = 0; i < 5; i++) need += (double)arenas[i]->peak.total;
    return need;
}

// How many ranks share one device's memory (`--ranks-per-device`, checked against the plan):
// one unless named, except on cuda under comm.backend mpi, whose purpose is every rank on one
// GPU. NCCL refuses two ranks on a GPU, so a run would: the estimate refuses it too.
static int estimate_ranks_per_device(const Trainer *t) {
    const char *device = t->cfg.training.device, *backend = t->cfg.comm.backend;
    bool cuda = strcmp(device, "cpu") != 0, staged = strcmp(backend, "mpi") == 0;
    int world = t->mesh.layout.world_size, sharing = t->estimate_ranks_per_device;
    if (!sharing) return cuda && staged ? world : 1;
    if (sharing > world)
        die_user("--ranks-per-device %d: more than the %d ranks planned (--world-size)", sharing,
                 world);
    if (cuda && !staged && sharing > 1)
        die_user("--ranks-per-device %d: NCCL (comm.backend %s) refuses ranks that share a GPU; "
                 "set comm.backend: mpi (host-staged MPI, any ranks per GPU)", sharing, backend);
    return sharing;
}

// Under a shared device, what its ranks share: its memory (the verdict divides it) and its
// compute; on a GPU under comm.backend mpi, every collective also crosses the bus twice.
static void print_sharing(const Trainer *t, int sharing) {
    if (sharing == 1) return;
    if (strcmp(t->cfg.training.device, "cpu") == 0) {
        printf("shared host: %d ranks on each node share its memory and its cores\n", sharing);
        return;
    }
    printf("shared GPU (comm.backend mpi): %d ranks on each GPU share its memory and its compute, "
           "and every collective goes through host memory (each group's bytes per step below "
           "copied from the GPU and back, in host buffers outside the arenas)\n", sharing);
}

// `--device-memory`: whether the memory check would pass on a device with `device` bytes free,
// shared by `sharing` ranks, judged on the rank that needs most (pp ranks differ), with the
// closest fix if not.
static void print_verdict(const Trainer *ranks, int n, double device, int sharing) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    double room = device / sharing;
    bool host = strcmp(ranks[0].cfg.training.device, "cpu") == 0;
    int worst = 0;
    for (int r = 1; r < n; r++)
        if (memory_need(&ranks[r], host) > memory_need(&ranks[worst], host)) worst = r;
    double need = memory_need(&ranks[worst], host);
    // which rank, and what the arenas' total row does not show
    double staging = host ? (double)trainer_checkpoint_staging_bytes(&ranks[worst]) : 0;
    char rank[32] = "", staged[64] = "", where[128] = "";
    if (n > 1) snprintf(rank, sizeof rank, "pp rank %d", worst);
    if (staging > 0)
        snprintf(staged, sizeof staged, "async checkpoint staging %.2f GiB included",
                 staging / GiB);
    if (*rank || *staged)
        snprintf(where, sizeof where, " (%s%s%s)", rank, *rank && *staged ? ", " : "", staged);
    char shared[96] = "";
    if (sharing > 1)
        snprintf(shared, sizeof shared, " (%.4g GiB shared by %d ranks)", device / GiB, sharing);
    if (need * MEMORY_MARGIN <= room) {
        printf("fits: peak %.2f GiB per rank%s of %.4g GiB%s (%.0f%%; %.0f%% with the memory "
               "check's 5%% margin)\n", need / GiB, where, room / GiB, shared, 100 * need / room,
               100 * MEMORY_MARGIN * need / room);
        return;
    }
    char fix[256];
    memory_fix(&ranks[worst], need, room / MEMORY_MARGIN, fix, sizeof fix);
    printf("does not fit: peak %.2f GiB per rank%s plus the memory check's 5%% margin > %.4g "
           "GiB%s; try %s\n", need / GiB, where, room / GiB, shared, fix);
}

// A checkpoint's bytes: the parameters this rank writes (its boxes where it is the primary
// replica: the plan's rank, every coordinate but pp 0, writes most), and all of them.
typedef struct {
    double rank, all;
} StateBytes;

// Which parameters' bytes: the fp32 ones (every kind of state has them), those with optimizer
// state (not frozen), or QLoRA's NF4 blobs (the model's only: no average, one per run).
typedef enum { STATE_FP32, STATE_TRAINED, STATE_NF4 } StateParams;

// Every pp rank's table lists the whole model's parameters (another stage's with empty boxes).
static StateBytes params_bytes(const Trainer *t, StateParams which) {
    StateBytes b = {0};
    for (int i = 0; i < t->model.params.count; i++) {
        const Param *p = &t->model.params.items[i];
        // a copy is saved as its original; the frozen have no moments; NF4 blobs count apart
        if (p->copy || (which == STATE_TRAINED && p->frozen) || p->nf4 != (which == STATE_NF4))
            continue;
        ParamBox box = param_box(p, true);
        double all = which == STATE_NF4 ? (double)nf4_bytes(param_global_numel(p))
                                        : 4.0 * (double)param_global_numel(p);
        if (which == STATE_NF4 ? param_nf4_writes(p) : param_is_primary_replica(p))
            b.rank += which == STATE_NF4 ? (double)param_nf4_held(p) : 4.0 * box_numel(&box);
        b.all += all;
    }
    return b;
}

// What a save writes, per rank (the rank that writes most) and in all: the full state
// (parameters, AdamW's two moments of the trained ones and the average under
// training.ema_decay; under semi_sync each replica group's own, and the trained ones' outer
// weights, outer momentum and at most a whole model's delta in flight; QLoRA's NF4 blobs once)
// and the model only (the parameters and the average); with --checkpoint-bandwidth, how long
// each takes at that rate (the storage's, shared by every rank).
static void print_checkpoint_plan(const Trainer *ranks, int n, double bandwidth) {
    StateBytes params = params_bytes(&ranks[0], STATE_FP32);
    StateBytes trained = params_bytes(&ranks[0], STATE_TRAINED);
    StateBytes nf4 = params_bytes(&ranks[0], STATE_NF4);
    int most = 0;
    for (int r = 1; r < n; r++) {
        StateBytes b = params_bytes(&ranks[r], STATE_FP32), q = params_bytes(&ranks[r], STATE_NF4);
        if (b.rank + q.rank > params.rank + nf4.rank)
            params.rank = b.rank, trained.rank = params_bytes(&ranks[r], STATE_TRAINED).rank,
            nf4.rank = q.rank, most = r;
    }
    const OuterState *outer = &ranks[0].opt.outer;
    int ema = ranks[0].cfg.training.ema_decay > 0, groups = outer->on ? outer->replicas : 1;
    int outer_kinds = outer->on ? 3 : 0;
    double model = (1 + ema) * params.all + nf4.all;
    double model_rank = (1 + ema) * params.rank + nf4.rank;
    double full = groups * (model - nf4.all + 2 * trained.all) + nf4.all +
                  outer_kinds * trained.all;
    // a rank writes its own group's state
    double rank_full = model_rank + (2 + outer_kinds) * trained.rank;
    char who[32] = "";
    if (n > 1) snprintf(who, sizeof who, " (pp rank %d)", most);
    printf("checkpoint: full state %.0f bytes (%.3f GB: parameters, AdamW's two moments%s%s), "
           "%.3f GB per rank at most%s; model only %.0f bytes (%.3f GB), %.3f GB per rank\n",
           full, full / 1e9, ema ? ", the average" : "",
           outer->on ? ", each replica group's; the outer state" : "", rank_full / 1e9, who,
           model, model / 1e9, model_rank / 1e9);
    if (bandwidth > 0)
        printf("checkpoint at %.4g GB/s: a full save takes %.3g s, a model-only save %.3g s\n",
               bandwidth / 1e9, full / bandwidth, model / bandwidth);
}

// `titan --estimate`: every arena per rank, FLOPs and communication per step, for any flavor
// and layout, from the sizing passes of the real allocation (nothing is allocated); under
// pipeline parallel, for each pp rank (ranks[r] plans pp rank r), whose stages differ.
void trainer_print_estimate(Trainer *ranks, int n) {
    const Trainer *t = &ranks[0];
    const int *size = t->mesh.layout.size;
    int sharing = estimate_ranks_per_device(t);  // refused before anything is printed
    printf("estimate: %s %s on %d ranks (pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d), "
           "batch %d x %d x %d microbatches per rank, activation_checkpoint %s\n",
           t->args.spec->name, t->cfg.model.flavor, t->mesh.layout.world_size, size[MESH_PP],
           size[MESH_DP_REPLICATE], size[MESH_DP_SHARD], size[MESH_CP], size[MESH_TP],
           t->train.B, t->train.T, t->accum, t->cfg.activation_checkpoint.mode);
    print_sharing(t, sharing);
    DeviceTable device = estimate_device(&ranks[0]);
    print_device(&device);
    double step = 0;
    int slowest = 0;
    for (int r = 0; r < n; r++) {
        if (ranks[r].pipeline) print_pipeline_rank(&ranks[r]);
        print_rank_plan(&ranks[r]);
        StepWork work = step_work(&ranks[r], sharing);
        StepTime time = predict_step_time(&work, &device);
        print_step_time(&time, work.bubble);
        if (time.step > step) step = time.step, slowest = r;
    }
    print_prediction(t, &device, step, n > 1 ? slowest : -1, sharing);
    print_checkpoint_plan(ranks, n, t->estimate_checkpoint_bandwidth);
    if (t->estimate_device_memory > 0)
        print_verdict(ranks, n, t->estimate_device_memory, sharing);
}

// Over-committed memory is granted page by page, so a run whose arenas cannot fit would otherwise
// be killed by the kernel mid-setup (exit 137, not a word). Before allocating, the arenas' bytes
// are compared with what the backend says this rank can still get: host memory is the node's,
// shared by its ranks (each gets 1 / ranks-on-this-node of it); device memory is its GPU's, shared
// by the node's ranks on that GPU (comm.backend mpi runs several on one). The data and the step's
// inputs are already loaded, so they count as used, and so do an async checkpoint's host staging
// copies when host memory is the arenas'. A 5% margin covers what lives outside the arenas
// (libraries, thread stacks, a synchronous save's staging on a device). Every rank decides on the
// worst rank's figures, so all refuse together.
void trainer_check_memory(Trainer *t) {
    const double GiB = 1024.0 * 1024.0 * 1024.0, margin = MEMORY_MARGIN;
    double need = memory_need(t, t->k->host_memory);
    double staging = t->k->host_memory ? (double)trainer_checkpoint_staging_bytes(t) : 0;
    int sharing = trainer_ranks_per_device(t->k);
    size_t free_bytes = t->k->memory_free();
    double room = free_bytes == SIZE_MAX ? INFINITY : (double)free_bytes / sharing;
    need = comm_all_reduce_double(comm_world(), need, COMM_MAX);
    room = -comm_all_reduce_double(comm_world(), -room, COMM_MAX);
    const char *where = t->k->host_memory ? "host memory" : "device memory";
    const char *ranks = sharing == 1 ? "rank" : "ranks";
    if (need * margin <= room) {
        log_info("memory check: %.2f GiB of arenas per rank fit the %.2f GiB of %s free per "
                 "rank (%d %s on this node)", need / GiB, room / GiB, where, sharing, ranks);
        return;
    }
    char fix[256], staged[64] = "";
    memory_fix(t, need, room / margin, fix, sizeof fix);
    if (staging > 0)
        snprintf(staged, sizeof staged, ", async checkpoint staging %.2f", staging / GiB);
    die_user("out of memory: this run needs %.2f GiB per rank (params %.2f, grads %.2f, "
             "optimizer %.2f, activations %.2f, comm %.2f%s GiB) plus a 5%% margin, but %.2f GiB "
             "of %s is free per rank (%d %s on this node); try %s",
             need / GiB, t->param_arena.peak.total / GiB, t->grad_arena.peak.total / GiB,
             t->optim_arena.peak.total / GiB, t->act_arena.peak.total / GiB,
             t->comm_arena.peak.total / GiB,
             staged, room / GiB, where, sharing, ranks, fix);
}
