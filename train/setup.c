// The trainer's setup, torchtitan's order: the kernels backend, the mesh, the batches and the
// tokenizer, the model (built, converted, then parallelized: PP's stages, TP, CP, EP,
// activation checkpointing, FSDP or DDP), the optimizer and the lr schedule, and every arena
// sized, checked against the device's memory, then allocated. --estimate runs the same code
// up to the sizing.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train.h"

static DecayType decay_type_of(const char *name) {
    return strcmp(name, "cosine") == 0 ? DECAY_COSINE
           : strcmp(name, "sqrt") == 0 ? DECAY_SQRT
                                       : DECAY_LINEAR;
}

// Context parallel: each sequence split over the cp ranks, attention through parallel/cp.
static void setup_context_parallel(Trainer *t) {
    const ParallelismSection *p = &t->cfg.parallelism;
    int cp = t->mesh.layout.size[MESH_CP];
    CpRotate rotate;
    if (!cp_rotate_parse(p->context_parallel_rotate_method, &rotate))
        die_internal(__FILE__, __LINE__, "config let rotate method '%s' through",
                     p->context_parallel_rotate_method);
    if (t->estimate_world_size) cp_plan(&t->cp, 0, cp, rotate);
    else cp_init(&t->cp, t->mesh.group[MESH_CP], t->mesh.cp_prev, t->mesh.cp_next, rotate);
    t->model.attn = &t->cp.hooks;
    if (t->args.spec->parallelize_cp)
        t->args.spec->parallelize_cp(&t->model, t->cp.rank, cp);
}

// Expert parallel: the routed experts Shard(0) over ep (before FSDP shards the rest of them
// over efsdp), and the MoE layers' dispatch through the ep group.
static void setup_expert_parallel(Trainer *t) {
    const MeshLayout *l = &t->mesh.layout;
    char why[512];
    if (!ep_check(&t->model.params, l->ep, why, sizeof why)) die_user("%s", why);
    if (t->estimate_world_size) ep_plan(&t->ep, mesh_sparse_index(l, t->mesh.coord) % l->ep, l->ep);
    else ep_init(&t->ep, t->mesh.ep);
    ep_place(&t->model.params, t->ep.size, t->ep.rank);
    t->model.ep = &t->ep.hooks;
}

// The model.moe_* keys act on MoE layers (models/moe) only: given to a model without any, or
// asking for what the layout cannot give (the balance loss sums over whole sequences, which
// context parallel splits over ranks the layers cannot reach), they are refused by name.
static void check_moe_keys(const Trainer *t) {
    static const char *const KEYS[] = {"model.moe_load_balance_coeff", "model.moe_aux_loss_alpha",
                                       "model.moe_capacity_factor"};
    const Config *c = &t->cfg;
    char origin[512];
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0] && !t->model.moe; i++) {
        CHECK(config_key_origin(c, KEYS[i], origin, sizeof origin));
        if (strcmp(origin, "default") != 0)
            die_user("%s: %s does nothing: model %s %s has no MoE layers", origin, KEYS[i],
                     c->model.name, c->model.flavor);
    }
    if (t->model.moe && t->model.moe->aux_loss && t->mesh.layout.size[MESH_CP] > 1) {
        CHECK(config_key_origin(c, "model.moe_aux_loss_alpha", origin, sizeof origin));
        die_user("%s: model.moe_aux_loss_alpha needs whole sequences on each tensor-parallel "
                 "group, not context_parallel_degree %d", origin, t->mesh.layout.size[MESH_CP]);
    }
}

// The model.mtp_* keys act on multi-token prediction modules only (DeepSeek-V3's), which need
// whole sequences of one document each (no context parallel, no document masking): refused by
// name otherwise.
static void check_mtp_keys(const Trainer *t) {
    const Config *c = &t->cfg;
    char origin[512];
    if (model_shape(&t->args).mtp_layers == 0) {
        CHECK(config_key_origin(c, "model.mtp_layers", origin, sizeof origin));
        if (c->model.mtp_layers > 0)
            die_user("%s: model.mtp_layers = %d: model %s has no multi-token prediction "
                     "(deepseek_v3 has)", origin, (int)c->model.mtp_layers, c->model.name);
        CHECK(config_key_origin(c, "model.mtp_loss_weight", origin, sizeof origin));
        if (strcmp(origin, "default") != 0)
            die_user("%s: model.mtp_loss_weight does nothing: model %s %s has no multi-token "
                     "prediction modules", origin, c->model.name, c->model.flavor);
        return;
    }
    CHECK(config_key_origin(c, "model.mtp_layers", origin, sizeof origin));
    int shortest = t->val.T > 0 && t->val.T < t->train.T ? t->val.T : t->train.T;
    if (shortest <= c->model.mtp_layers)
        die_user("%s: model.mtp_layers %d predicts more tokens ahead than a sequence of %d has",
                 origin, (int)c->model.mtp_layers, shortest);
    const int *size = t->mesh.layout.size;
    if (size[MESH_CP] > 1 || c->training.document_masking)
        die_user("%s: model.mtp_layers %d needs whole sequences of one document each: not "
                 "context_parallel_degree %d or training.document_masking", origin,
                 (int)c->model.mtp_layers, size[MESH_CP]);
}

// The config's model: its args set by the run (as torchtitan's update_from_config: the
// tokenizer sets the vocabulary, the sequence length the RoPE tables; or its own data's
// shapes), checked against the layout, built, then converted (float8).
static void build_model(Trainer *t) {
    const Config *c = &t->cfg;
    trainer_model_args(c, &t->args);
    t->args.lora = config_converts(c, "lora") ? &c->lora : NULL;
    const ModelSpec *spec = t->args.spec;
    char why[512];
    if (t->args.lora && !spec->lora) {
        CHECK(config_key_origin(c, "model.converters", why, sizeof why));
        die_user("%s: model.converters has lora, but model %s adds no LoRA adapters (the "
                 "decoders' Linears take them)", why, spec->name);
    }
    spec->update_from_config(&t->args, &c->model,
                             t->tokenizer ? tokenizer_vocab_size(t->tokenizer) : 0,
                             t->train.T > t->val.T ? t->train.T : t->val.T);
    trainer_open_model_data(t);
    const CheckpointSection *ck = &c->checkpoint;
    if (ck->initial_load_in_hf || ck->last_save_in_hf)
        model_spec_require_hf(spec, ck->initial_load_in_hf ? "checkpoint.initial_load_in_hf"
                                                           : "checkpoint.last_save_in_hf");
    int tp = t->mesh.layout.size[MESH_TP];
    if (spec->tp_check(&t->args, tp, t->train.B, t->train.step_T, why, sizeof why) ||
        (t->val.B > 0 && spec->tp_check(&t->args, tp, t->val.B, t->val.step_T, why, sizeof why)))
        die_user("%s", why);
    spec->build(&t->model, &t->args, false);
    t->model.precision = t->precision;  // bf16 mixed precision stores bf16 activations
    if (config_converts(c, "float8")) trainer_convert_float8(t);
    if (t->args.lora) model_convert_lora(&t->model, c);
    check_moe_keys(t);
    check_mtp_keys(t);
}

// torchtitan's parallelize, in its order: the pipeline's stages, then TP (and CP, EP), then
// activation checkpointing, then FSDP (whose hooks go on when the arenas are carved) or DDP.
static void parallelize_model(Trainer *t) {
    const Config *c = &t->cfg;
    const ModelSpec *spec = t->args.spec;
    int tp = t->mesh.layout.size[MESH_TP];
    if (t->mesh.layout.size[MESH_PP] > 1) trainer_pipeline_plan(t);
    if (t->tp_on) {
        bool loss_parallel = !c->parallelism.disable_loss_parallel;
        if (t->estimate_world_size) tp_plan(&t->tp, 0, tp, loss_parallel);
        else tp_init(&t->tp, t->mesh.group[MESH_TP], t->k, loss_parallel);
        spec->parallelize_tp(&t->model, &t->tp);
        if (t->args.lora) lora_parallelize_tp(&t->model, &t->tp);
    }
    if (t->cp_on) setup_context_parallel(t);
    if (t->mesh.layout.ep > 1) setup_expert_parallel(t);
    model_set_checkpointing(&t->model, c->activation_checkpoint.mode,
                      c->activation_checkpoint.selective_ac_option);
    if (t->fsdp_on && model_shape(&t->args).tie_word_embeddings)
        die_user("model.tie_word_embeddings cannot be trained with FSDP (fsdp group of %d ranks): "
                 "the tied weight would belong to two FSDP units, the embedding and the head",
                 t->mesh.layout.size[MESH_DP_SHARD] * t->mesh.layout.size[MESH_CP]);
    if (t->ddp_on)
        ddp_place(&t->model.params, t->mesh.layout.size[MESH_DP_REPLICATE],
                  t->mesh.coord[MESH_DP_REPLICATE]);
}

// FSDP's shards, full-parameter slots and communication buffers: the sizing pass plans and
// counts them (commit false); the commit pass allocates what it counted and carves it with the
// same code; then FSDP's hooks go around the model's block calls.
static void allocate_fsdp(Trainer *t, ArenaBytes act_bytes, bool commit) {
    Fsdp *f = &t->fsdp;
    Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->comm_arena, &t->act_arena};
    if (!commit) {
        const ParallelismSection *p = &t->cfg.parallelism;
        const int *size = t->mesh.layout.size;
        FsdpConfig config = {.size = size[MESH_DP_SHARD] * size[MESH_CP],
                             .rank = t->mesh.fsdp ? comm_rank(t->mesh.fsdp) : 0,
                             .replicate_size = size[MESH_DP_REPLICATE],
                             .replicate_rank = t->mesh.coord[MESH_DP_REPLICATE],
                             .replicas_step_alone = t->opt.outer.on,
                             .reshard = fsdp_reshard_parse(p->fsdp_reshard_after_forward),
                             .k = t->k};
        const MeshLayout *l = &t->mesh.layout;
        if (l->ep > 1) {
            config.expert_size = mesh_sparse_size(l) / l->ep;
            config.expert_rank = mesh_sparse_index(l, t->mesh.coord) / l->ep;
        }
        config.precision = t->precision;  // torchtitan's MixedPrecisionPolicy, on every backend
        config.reduce_once_per_step = t->pipeline != NULL;
        config.float8_precompute = t->cfg.float8.precompute_float8_dynamic_scale_for_fsdp;
        fsdp_plan(f, &t->model.params, t->model.blocks, t->model.n_blocks, &config);
        const char *names[] = {"params", "grads", "comm", "activations"};
        for (int i = 0; i < 4; i++) arena_init_sizing(arenas[i], names[i]);
        fsdp_allocate(f, &t->param_arena, &t->grad_arena, &t->comm_arena);
        arena_reserve(&t->act_arena, act_bytes);
        return;
    }
    for (int i = 0; i < 4; i++) arena_commit(arenas[i], &t->memory);
    fsdp_allocate(f, &t->param_arena, &t->grad_arena, &t->comm_arena);
    CommGroup *replicate =
        f->config.replicate_size > 1 ? t->mesh.group[MESH_DP_REPLICATE] : NULL;
    t->model.hooks = fsdp_attach(f, t->mesh.fsdp, t->mesh.efsdp, replicate);
}

// The activation arena one step needs: a microbatch through the whole model, or the pipeline
// stages' regions.
static ArenaBytes train_activation_bytes(Trainer *t) {
    if (t->pipeline) return trainer_pipeline_activation_bytes(t);
    return model_activation_bytes(&t->model, t->k, t->train.B, t->train.step_T);
}

// Once every placement is made (FSDP's last): the matrices FSDP or tensor parallel cut are
// gathered whole for Muon (parallel/muon_shards.h).
static void plan_muon_shards(Trainer *t) {
    Muon *m = &t->opt.muon;
    size_t most = 0;
    char err[1024];
    for (int i = 0; m->is_muon && i < t->model.params.count; i++) {
        size_t floats;
        if (!m->is_muon[i]) continue;
        if (!muon_dist_plan(&t->model.params.items[i], &floats, err, sizeof err))
            die_user("%s", err);
        most = floats > most ? floats : most;
    }
    muon_dist_init(&t->muon_dist, &t->mesh, t->k, most);
    m->shards = most ? &t->muon_dist.hooks : NULL;
}

// semi_sync's fragments of the model, once every shard is placed.
static void plan_semi_sync(Trainer *t) {
    const SemiSyncSection *c = &t->cfg.semi_sync;
    SemiSyncConfig config = {.sync_steps = (int)c->sync_steps, .fragments = (int)c->num_fragments,
                             .delay = (int)c->fragment_sync_delay, .lr = c->outer_lr,
                             .momentum = c->outer_momentum, .alpha = c->fragment_update_alpha,
                             .nesterov = c->outer_nesterov};
    const Model *m = &t->model;
    int *block_params = xcalloc((size_t)m->n_blocks, sizeof(int));
    for (int b = 0; b < m->n_blocks; b++) block_params[b] = m->blocks[b].n_params;
    char err[1024];
    bool planned = semi_sync_plan(&t->semi_sync, &config, &m->params, block_params, m->n_blocks,
                                  err, sizeof err);
    free(block_params);
    if (!planned) die_user("%s", err);
}

// Sizes every arena with the same calls that then carve it (core/arena.h; commit false: all
// that --estimate and the memory check need), or allocates what that pass sized and carves it
// (commit true, after a sizing pass).
static void allocate_arenas(Trainer *t, bool commit) {
    Model *m = &t->model;
    if (commit) {
        if (t->fsdp_on)
            allocate_fsdp(t, t->act_arena.peak, true);
        else
            model_allocate(m, t->act_arena.peak, &t->param_arena, &t->grad_arena, &t->act_arena,
                           &t->memory);
        arena_commit(&t->optim_arena, &t->memory);
        adamw_allocate(&t->opt, &m->params, &t->optim_arena);
        if (t->pipeline) trainer_pipeline_start(t);
        return;
    }
    const ActivationCheckpointSection *ac = &t->cfg.activation_checkpoint;
    for (int i = 0; i < 3; i++) {
        model_set_checkpointing(m, AC_MODES[i], ac->selective_ac_option);
        t->act_bytes_ac[i] = train_activation_bytes(t).total;
    }
    model_set_checkpointing(m, ac->mode, ac->selective_ac_option);
    ArenaBytes act_bytes = train_activation_bytes(t);
    if (t->val.B > 0 && !t->pipeline) {  // a pipeline's counts its validation runs
        ArenaBytes val_bytes = model_activation_bytes(m, t->k, t->val.B, t->val.step_T);
        if (val_bytes.total > act_bytes.total) act_bytes = val_bytes;
    }
    if (t->fsdp_on) {
        allocate_fsdp(t, act_bytes, false);
    } else {
        model_size(m, act_bytes, &t->param_arena, &t->grad_arena, &t->act_arena);
    }
    plan_muon_shards(t);
    if (t->opt.outer.on) plan_semi_sync(t);
    arena_init_sizing(&t->optim_arena, "optimizer");
    adamw_allocate(&t->opt, &m->params, &t->optim_arena);
}

// "name 10.0 MiB (bf16 8.00, fp32 2.00)": an arena's size, split by the dtypes it holds at its
// peak, in MiB.
static void format_arena(char *buf, size_t n, const char *name, const Arena *a) {
    const double MiB = 1024.0 * 1024.0;
    char dtypes[160];
    arena_bytes_format(a->peak, MiB, 2, dtypes, sizeof dtypes);
    snprintf(buf, n, "%s %.1f MiB%s%s%s", name, a->size / MiB, *dtypes ? " (" : "", dtypes,
             *dtypes ? ")" : "");
}

// Each arena, split by dtype, on lines of at most ~120 characters: params (under FSDP also
// split into this rank's shards and the units' unsharded slots), grads and optimizer, comm,
// activations, then the activations' size under each activation_checkpoint mode (selective
// with the configured selective_ac_option):
//   memory per rank: params 17.0 MiB (fp32 17.01): shards 4.25 MiB, unsharded 12.76 MiB
//   memory per rank: grads 15.0 MiB (fp32 15.01), optimizer 23.5 MiB (fp32 23.51)
//   memory per rank: comm 10.6 MiB (fp32 8.13, bf16 2.44)
//   memory per rank: activations 101.6 MiB (fp32 94.43, bf16 6.88, bytes 0.25)
//   memory per rank: activations by activation_checkpoint: none 114.1 MiB, selective op
//   101.6 MiB, full 47.2 MiB
static void log_memory(const Trainer *t) {
    const double MiB = 1024.0 * 1024.0;
    char one[200], two[200];
    format_arena(one, sizeof one, "params", &t->param_arena);
    if (t->fsdp_on) {
        FsdpEstimate e = fsdp_estimate(&t->fsdp);
        log_info("memory per rank: %s: shards %.2f MiB, unsharded %.2f MiB", one,
                 e.param_shards.total / MiB, e.param_unsharded.total / MiB);
    } else {
        log_info("memory per rank: %s", one);
    }
    format_arena(one, sizeof one, "grads", &t->grad_arena);
    format_arena(two, sizeof two, "optimizer", &t->optim_arena);
    log_info("memory per rank: %s, %s", one, two);
    format_arena(one, sizeof one, "comm", &t->comm_arena);
    log_info("memory per rank: %s", one);
    format_arena(one, sizeof one, "activations", &t->act_arena);
    log_info("memory per rank: %s", one);
    log_info("memory per rank: activations by activation_checkpoint: none %.1f MiB, selective %s "
             "%.1f MiB, full %.1f MiB", t->act_bytes_ac[0] / MiB,
             t->cfg.activation_checkpoint.selective_ac_option, t->act_bytes_ac[1] / MiB,
             t->act_bytes_ac[2] / MiB);
}

// The backend's description, one "kernels:" line per part: the parts are separated by "; "
// outside parentheses (kernels/ops.def).
static void log_kernels(const KernelOps *k) {
    char text[512];
    k->describe(text, sizeof text);
    int depth = 0;
    char *part = text;
    for (char *c = text; *c; c++) {
        depth += (*c == '(') - (*c == ')');
        if (depth == 0 && c[0] == ';' && c[1] == ' ') {
            *c = '\0';
            log_info("kernels: %s", part);
            part = c + 2;
        }
    }
    log_info("kernels: %s", part);
}

static bool layout_plan(MeshLayout *layout, const int degrees[MESH_NDIMS], int ep, int world,
                        char *err, size_t n) {
    return mesh_plan(layout, degrees, world, err, n) && mesh_plan_experts(layout, ep, err, n);
}

// The fewest ranks the layout plans on, 0 if none: the product of its given degrees, times
// at most ep when dp_shard (-1) is inferred and must hold the experts' ep.
static int layout_world_needed(const int degrees[MESH_NDIMS], int ep) {
    int64_t fixed = 1;
    for (int d = 0; d < MESH_NDIMS; d++) fixed *= degrees[d] > 0 ? degrees[d] : 1;
    for (int64_t k = 1; k <= ep && fixed * k <= INT32_MAX; k++) {
        MeshLayout layout;
        char err[512];
        if (layout_plan(&layout, degrees, ep, (int)(fixed * k), err, sizeof err))
            return (int)(fixed * k);
    }
    return 0;
}

// The mesh from the parallelism degrees, checked before anything is allocated. --estimate
// plans 1 rank unless told otherwise: a layout that needs more names the --world-size it takes.
static void setup_mesh(Trainer *t) {
    const Config *c = &t->cfg;
    const ParallelismSection *p = &c->parallelism;
    int degrees[MESH_NDIMS] = {(int)p->pipeline_parallel_degree,
                               (int)p->data_parallel_replicate_degree,
                               (int)p->data_parallel_shard_degree,
                               (int)p->context_parallel_degree, (int)p->tensor_parallel_degree};
    int ep = (int)p->expert_parallel_degree;
    MeshLayout layout;
    char err[512];
    int world = t->estimate_world_size ? t->estimate_world_size : comm_size(comm_world());
    if (!layout_plan(&layout, degrees, ep, world, err, sizeof err)) {
        int needed = t->estimate_world_size ? layout_world_needed(degrees, ep) : 0;
        if (needed && needed != world)
            die_user("%s; try --estimate --world-size %d", err, needed);
        die_user("%s", err);
    }
    if (t->estimate_world_size) {
        t->mesh = (Mesh){.layout = layout, .coord[MESH_PP] = t->estimate_pp_rank};  // no groups
    } else {
        mesh_build(&t->mesh, &layout);
        const CommSection *cs = &c->comm;
        if (layout.size[MESH_DP_REPLICATE] > 1)
            comm_simulate_link(t->mesh.group[MESH_DP_REPLICATE],
                               cs->dp_replicate_link_latency_ms / 1e3,
                               cs->dp_replicate_link_gbps * 1e9 / 8);
    }
    t->tp_on = layout.size[MESH_TP] > 1;
    t->cp_on = layout.size[MESH_CP] > 1;
    // Experts replicated over efsdp ranks (ep short of dp_shard x cp x tp) are FSDP's to shard
    // and reduce, even on an fsdp group of one.
    t->fsdp_on = layout.size[MESH_DP_SHARD] * layout.size[MESH_CP] > 1 ||
                 mesh_sparse_size(&layout) / layout.ep > 1;
    t->ddp_on = !t->fsdp_on && layout.size[MESH_DP_REPLICATE] > 1;
}

// torchtitan's batch: global_batch_size -1 is local_batch_size x dp; larger ones accumulate
// gradients over global / (local x dp) microbatches.
static int accumulation_steps(const TrainingSection *tr, int dp) {
    int64_t per_microbatch = tr->local_batch_size * dp;
    int64_t global = tr->global_batch_size < 0 ? per_microbatch : tr->global_batch_size;
    if (global % per_microbatch != 0)
        die_user("training.global_batch_size %lld is not a multiple of local_batch_size %lld x "
                 "dp %d", (long long)global, (long long)tr->local_batch_size, dp);
    return (int)(global / per_microbatch);
}

// torchtitan's MixedPrecisionPolicy from training.mixed_precision_param and
// mixed_precision_reduce ("bfloat16" or "float32", which the config checks).
static MixedPrecisionPolicy mixed_precision(const TrainingSection *tr) {
    return (MixedPrecisionPolicy){
        .param = strcmp(tr->mixed_precision_param, "bfloat16") == 0 ? DTYPE_BF16 : DTYPE_FP32,
        .reduce = strcmp(tr->mixed_precision_reduce, "bfloat16") == 0 ? DTYPE_BF16 : DTYPE_FP32};
}

int trainer_ranks_per_device(const KernelOps *k) {
    char id[64];
    k->device_id(id, sizeof id);
    return comm_local_count_equal(id);
}

// The device backend's collectives (comm.backend): NCCL, one rank per GPU; or MPI through host
// buffers, which lets several ranks share one (how a machine with one GPU runs any layout).
static void select_comm(Trainer *t) {
    const char *backend = t->cfg.comm.backend;
    if (strcmp(backend, "mpi") == 0) {
        comm_use_staged(t->k->upload, t->k->download);
        return;
    }
    int sharing = trainer_ranks_per_device(t->k);
    sharing = (int)comm_all_reduce_double(comm_world(), sharing, COMM_MAX);
    if (sharing > 1)
        die_user("training.device %s: %d ranks share a GPU here, which NCCL refuses; set "
                 "comm.backend: mpi (host-staged MPI, any ranks per GPU) or run one rank per GPU",
                 t->cfg.training.device, sharing);
    comm_use_nccl(t->k->queue());
}

// training.device's backend, started on this rank's device; device memory brings NCCL (or
// host-staged MPI) in as the collective library. --estimate sizes with the cpu backend and
// starts nothing.
static void setup_backend(Trainer *t) {
    const TrainingSection *tr = &t->cfg.training;
    t->k = kernels_backend(t->estimate_world_size ? "cpu" : tr->device);
    if (!t->k)
        die_user("training.device %s: this titan was built without it (build with `make CUDA=1`)",
                 tr->device);
    if (strcmp(t->cfg.comm.backend, "nccl") == 0 && t->k->host_memory && !t->estimate_world_size)
        die_user("comm.backend nccl needs training.device cuda (NCCL moves device memory); "
                 "training.device %s runs MPI (comm.backend auto or mpi)", tr->device);
    if (tr->deterministic && !t->k->deterministic)
        die_user("training.deterministic: not implemented on training.device %s (its embedding "
                 "and attention backward add with atomics); the cpu backend is always "
                 "deterministic", tr->device);
    // A profiled step's trace times every op (core/profiler.h): the backend's ops through the
    // timing table whenever profiling is on.
    if (t->cfg.profiling.enable_profiling && !t->estimate_world_size)
        t->k = kernels_traced(t->k);
    t->memory = (ArenaMemory){t->k->alloc, t->k->free};
    if (t->estimate_world_size) return;
    KernelInit init = {.local_rank = comm_local_rank(), .precision = t->precision};
    char why[512];
    if (!t->k->init(&init, why, sizeof why)) die_user("training.device %s: %s", tr->device, why);
    if (!t->k->host_memory) select_comm(t);
}

// A warmup longer than the run is cut to the run (lr_schedule_make, as torchtitan, which warns
// too): one line, naming both keys and their origins.
static void warn_warmup_cut(const Config *c) {
    char warmup[512], steps[512];
    CHECK(config_key_origin(c, "lr_scheduler.warmup_steps", warmup, sizeof warmup));
    CHECK(config_key_origin(c, "training.steps", steps, sizeof steps));
    log_warn("lr_scheduler.warmup_steps = %lld (%s) is more than training.steps = %lld (%s): "
             "the warmup is cut to %lld step%s", (long long)c->lr_scheduler.warmup_steps, warmup,
             (long long)c->training.steps, steps, (long long)c->training.steps,
             c->training.steps == 1 ? "" : "s");
}

// Muon's matrices: optimizer.muon_pattern's.
static void setup_muon(Trainer *t) {
    const Config *c = &t->cfg;
    char origin[1024], err[1536];
    config_key_origin(c, "optimizer.muon_pattern", origin, sizeof origin);
    Muon *m = &t->opt.muon;
    *m = (Muon){.momentum = c->optimizer.momentum, .nesterov = c->optimizer.nesterov,
                .ns_steps = (int)c->optimizer.ns_steps,
                .match_rms_adamw = !strcmp(c->optimizer.adjust_lr_fn, "match_rms_adamw")};
    if (!muon_select(m, &t->model.params, c->optimizer.muon_pattern, origin, err, sizeof err))
        die_user("%s", err);
}

// The optimizer (AdamW, or Muon for the matrices with AdamW for the rest; the parameters'
// average under training.ema_decay) and its lr schedule.
static void setup_optimizer(Trainer *t) {
    const Config *c = &t->cfg;
    t->opt = (AdamW){.lr = c->optimizer.lr, .beta1 = c->optimizer.beta1,
                     .beta2 = c->optimizer.beta2, .eps = c->optimizer.eps,
                     .weight_decay = c->optimizer.weight_decay,
                     .ema_decay = c->training.ema_decay};
    if (strcmp(c->semi_sync.method, "none") != 0)
        t->opt.outer = (OuterState){.on = true, .replica = t->mesh.coord[MESH_DP_REPLICATE],
                                    .replicas = t->mesh.layout.size[MESH_DP_REPLICATE],
                                    .group = MESH_DP_REPLICATE};
    if (!strcmp(c->optimizer.name, "Muon")) {
        setup_muon(t);
    } else {  // Muon's keys do nothing to another optimizer: set, they are refused by name
        static const char *const MUON_KEYS[] = {"optimizer.muon_pattern", "optimizer.momentum",
                                                "optimizer.nesterov", "optimizer.ns_steps",
                                                "optimizer.adjust_lr_fn"};
        char origin[1024];
        for (size_t i = 0; i < sizeof MUON_KEYS / sizeof MUON_KEYS[0]; i++) {
            CHECK(config_key_origin(c, MUON_KEYS[i], origin, sizeof origin));
            if (strcmp(origin, "default") != 0)
                die_user("%s: %s acts on optimizer.name Muon only; this run's optimizer is %s",
                         origin, MUON_KEYS[i], c->optimizer.name);
        }
    }
    double decay_ratio = isnan(c->lr_scheduler.decay_ratio) ? -1 : c->lr_scheduler.decay_ratio;
    t->schedule = lr_schedule_make((int)c->training.steps, (int)c->lr_scheduler.warmup_steps,
                                   decay_ratio, decay_type_of(c->lr_scheduler.decay_type),
                                   c->lr_scheduler.min_lr_factor);
}

// What the run set up, a line each: the model and mesh, the precision, float8, the experts,
// the pipeline, the tokenizer, the threads, the kernels, the memory.
static void log_setup(Trainer *t) {
    const Config *c = &t->cfg;
    const int *size = t->mesh.layout.size;
    ModelShape shape = model_shape(&t->args);
    char vocab[32] = "";  // a model without a vocabulary (FLUX) has none to name
    if (shape.vocab_size > 0) snprintf(vocab, sizeof vocab, ", vocab %d", shape.vocab_size);
    // A step is `accum` batches per rank; pp splits each batch into microbatches (below).
    log_info("model: %s %s, %d layers, dim %d%s; batch %d x %d tokens per rank, %d gradient "
             "accumulation step%s; mesh pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d",
             t->args.spec->name, c->model.flavor, shape.n_layers, shape.dim, vocab, t->train.B,
             t->train.T, t->accum, t->accum == 1 ? "" : "s", size[MESH_PP],
             size[MESH_DP_REPLICATE], size[MESH_DP_SHARD], size[MESH_CP], size[MESH_TP]);
    log_info("precision: %s compute (training.mixed_precision_param %s), fp32 master weights and "
             "optimizer state", dtype_name(t->precision.param), c->training.mixed_precision_param);
    if (config_converts(c, "float8")) trainer_log_float8(t);
    if (t->args.lora) lora_log(&t->model, &c->lora);
    if (t->mesh.layout.ep > 1)
        log_info("experts: ep %d x efsdp %d over dp_shard x cp x tp", t->mesh.layout.ep,
                 size[MESH_DP_SHARD] * size[MESH_CP] * size[MESH_TP] / t->mesh.layout.ep);
    if (t->pipeline) {
        const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
        long long rows = (long long)c->parallelism.pipeline_parallel_microbatch_size;
        log_info("pipeline: %s, each batch of %d rows in %d microbatches of %lld row%s",
                 csv && *csv ? csv : c->parallelism.pipeline_parallel_schedule, t->train.B,
                 trainer_schedule_microbatches(c), rows, rows == 1 ? "" : "s");
    }
    if (t->tokenizer)
        log_info("tokenizer: %s (%s, %d ids)", c->model.tokenizer_path,
                 tokenizer_format(t->tokenizer), tokenizer_vocab_size(t->tokenizer));
    trainer_log_threads(t);
    log_kernels(t->k);
    log_memory(t);
}

void trainer_setup(Trainer *t) {
    const Config *c = &t->cfg;
    t->precision = mixed_precision(&c->training);  // read by the kernels, the model and FSDP
    if (!t->estimate_world_size) trainer_plan_threads(t);  // before the backend's first region
    setup_backend(t);
    setup_mesh(t);
    trainer_shape_batches(t);
    t->accum = accumulation_steps(&c->training, mesh_dp_size(&t->mesh.layout));
    trainer_load_tokenizer(t);
    build_model(t);
    parallelize_model(t);
    // Microbatches add up in the grads themselves, not through FSDP's reduce-scatter after each
    // (which takes them fresh) or a pipeline schedule's own accumulation.
    t->model.accumulates_grads = t->accum > 1 && !t->fsdp_on && !t->pipeline;
    setup_optimizer(t);
    if (t->estimate_world_size) {
        allocate_arenas(t, false);
        return;
    }
    model_place_buffers(&t->model, t->k);
    if (!c->checkpoint.create_seed_checkpoint) {
        if (!t->data) trainer_open_data(t);
        trainer_allocate_inputs(t);
    }
    // What is already loaded (data, inputs) counts as used when the memory check measures.
    allocate_arenas(t, false);
    trainer_check_memory(t);
    allocate_arenas(t, true);
    trainer_load_or_initialize(t);
    log_setup(t);
    // After every setup error, which stays a run's one line of stderr.
    if (c->lr_scheduler.warmup_steps > c->training.steps && c->training.steps > 0 &&
        t->mesh.world_rank == 0)
        warn_warmup_cut(c);
}

void trainer_model_args(const Config *c, ModelArgs *args) {
    char origin[1024], quoted[160];
    config_key_origin(c, "model.name", origin, sizeof origin);
    const ModelSpec *spec = model_spec_require(c->model.name, origin);
    if (spec->flavor(c->model.flavor, args)) return;
    config_key_origin(c, "model.flavor", origin, sizeof origin);
    die_user("%s: model.flavor %s is not a %s flavor (known: %s)", origin,
             error_quote(quoted, sizeof quoted, c->model.flavor), spec->name,
             spec->flavor_names());
}
