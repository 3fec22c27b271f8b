// titan: config -> model -> optimizer -> data -> training loop (DESIGN.md "Layout").
//
//   titan --config configs/debug_model.yaml [--section.key value ...] [--print-config]
//   titan tokenize --tokenizer T --out DIR FILE...
//   titan tokenizer train --vocab-size N --out FILE.tiktoken FILE...
//   titan generate --checkpoint C [--tokenizer T] --prompt "..."
//   titan convert --to hf|titan FROM TO
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "convert/convert.h"
#include "data/bpe_train.h"
#include "data/documents.h"
#include "data/tokenize.h"
#include "infer/generate.h"
#include "parallel/cp/layout.h"
#include "train/train.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static DecayType decay_type_of(const char *name) {
    return strcmp(name, "cosine") == 0 ? DECAY_COSINE
           : strcmp(name, "sqrt") == 0 ? DECAY_SQRT
                                       : DECAY_LINEAR;
}

// Activation checkpointing of the transformer blocks under `mode`, torchtitan's: full re-runs
// each one's forward in backward; selective with an integer n does so for every n-th (as its
// count of blocks from 1), with `op` has each keep only its GEMMs' and attention's outputs.
static void set_checkpointing(Model *m, const char *mode, const char *selective_option) {
    bool selective = !strcmp(mode, "selective"), op = !strcmp(selective_option, "op");
    int every = !strcmp(mode, "full") ? 1 : selective && !op ? atoi(selective_option) : 0;
    for (int i = 1; i + 1 < m->n_blocks; i++) {
        m->blocks[i].checkpointed = every > 0 && i % every == 0;
        m->blocks[i].recompute_cheap = selective && op;
    }
}

// Context parallel: each sequence split over the cp ranks, attention through parallel/cp.
static void setup_context_parallel(Trainer *t) {
    const ParallelismSection *p = &t->cfg.parallelism;
    int cp = t->mesh.layout.size[MESH_CP];
    CpRotate rotate;
    if (!cp_rotate_parse(p->context_parallel_rotate_method, &rotate))
        die_internal(__FILE__, __LINE__, "config let rotate method '%s' through",
                     p->context_parallel_rotate_method);
    // The ring's sends and receives to two peers would meet on NCCL's one stream in an order
    // that deadlocks (each rank's send waits for its next's receive, queued after that rank's
    // own send), as the pipeline's would.
    if (rotate == CP_ALLTOALL && !t->k->host_memory)
        die_user("parallelism.context_parallel_rotate_method alltoall is not implemented on "
                 "training.device %s yet (NCCL point-to-point on one stream); use allgather",
                 t->cfg.training.device);
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

// float8.moe_fqns_prototype asks for the experts' grouped GEMMs in float8: refused by name
// when it converts none (torchao asserts on experts' dims that are not multiples of 16).
static void check_float8_experts(const Trainer *t) {
    const Config *c = &t->cfg;
    if (c->float8.moe_fqns_prototype.count == 0) return;
    const ModelLinear *stacked = NULL;
    bool named = false;
    for (int i = 0; i < t->model.n_linears; i++) {
        const ModelLinear *e = &t->model.linears[i];
        if (e->linear->weight->ndim != 3) continue;
        if (e->linear->precision != LINEAR_BACKEND) return;
        stacked = stacked ? stacked : e;
        named = named || linear_moe_fqns_match(e->module, &c->float8);
    }
    char origin[512], value[512];
    CHECK(config_key_origin(c, "float8.moe_fqns_prototype", origin, sizeof origin));
    CHECK(config_value_text(c, "float8.moe_fqns_prototype", value, sizeof value));
    if (!stacked)
        die_user("%s: float8.moe_fqns_prototype does nothing: model %s %s has no MoE layers",
                 origin, c->model.name, c->model.flavor);
    const Param *w = stacked->linear->weight;
    if (named)
        die_user("%s: float8.moe_fqns_prototype: the routed experts' (%lld, %lld) weights need "
                 "both dims multiples of 16 for float8 grouped GEMMs", origin,
                 (long long)w->global_shape[1], (long long)w->global_shape[2]);
    int module = (int)(strrchr(stacked->module, '.') - stacked->module);
    die_user("%s: float8.moe_fqns_prototype = %s names no routed experts' module (%.*s)", origin,
             value, module, stacked->module);
}

// torchtitan's float8 converter (model.converters: [float8]): after the build, before the
// parallelisms, each Linear's precision by its module name and shape.
static void convert_float8(Trainer *t) {
    const Float8Section *f = &t->cfg.float8;
    model_convert_float8(&t->model, f);
    check_float8_experts(t);
    char none[8];
    int dense = model_linears_describe(&t->model, LINEARS_FLOAT8, none, sizeof none);
    if (!dense && !model_linears_describe(&t->model, LINEARS_FLOAT8_EXPERTS, none, sizeof none))
        return;
    // The recipe the metrics name: the Linears', or the experts' own when only they run float8.
    t->float8_recipe = !dense ? "rowwise" : f->recipe_name ? f->recipe_name : "tensorwise";
    // cuBLASLt's float8 GEMMs reduce over multiples of 16, the weight gradient's over the
    // microbatch's tokens (the grouped GEMMs pad each expert's tokens themselves).
    const Split *splits[] = {&t->train, &t->val};
    for (int i = 0; i < 2 && dense; i++) {
        int tokens = splits[i]->B * splits[i]->step_T;
        if (!strcmp(t->cfg.training.device, "cuda") && splits[i]->B > 0 && tokens % 16 != 0)
            die_user("float8 on training.device cuda needs a multiple of 16 tokens per "
                     "microbatch and rank, not %s's %d x %d", i ? "validation" : "training",
                     splits[i]->B, splits[i]->step_T);
    }
}

// Which Linears run float8 and which keep the backend's precision, by module; the experts'
// clause when any run float8.
static void log_float8(const Trainer *t) {
    const Float8Section *f = &t->cfg.float8;
    char on[2048], experts[2048], off[2048];
    int n_on = model_linears_describe(&t->model, LINEARS_FLOAT8, on, sizeof on);
    int n_experts = model_linears_describe(&t->model, LINEARS_FLOAT8_EXPERTS, experts,
                                           sizeof experts);
    int n_off = model_linears_describe(&t->model, LINEARS_BACKEND, off, sizeof off);
    const char *recipe = !n_on ? "no" : f->recipe_name ? f->recipe_name : "tensorwise";
    if (!n_experts)
        log_info("float8: %s recipe on %d linears (%s); %d at the backend's precision (%s)",
                 recipe, n_on, on, n_off, off);
    else
        log_info("float8: %s recipe on %d linears (%s); rowwise grouped GEMMs on %d expert "
                 "weights (%s); %d at the backend's precision (%s)",
                 recipe, n_on, on, n_experts, experts, n_off, off);
}

// float8.enable_fsdp_float8_all_gather (torchao's WeightWithDynamicFloat8CastTensor): FSDP
// gathers the weights of the tensorwise float8 Linears as float8 (Param.gather_float8).
// torchtitan ignores the key without FSDP; here it would do nothing, so it is refused.
static void mark_float8_gather(Trainer *t) {
    if (!t->fsdp_on) {
        char origin[512];
        CHECK(config_key_origin(&t->cfg, "float8.enable_fsdp_float8_all_gather", origin,
                                sizeof origin));
        die_user("%s: float8.enable_fsdp_float8_all_gather does nothing without FSDP (an fsdp "
                 "group of dp_shard %d x cp %d ranks)", origin,
                 t->mesh.layout.size[MESH_DP_SHARD], t->mesh.layout.size[MESH_CP]);
    }
    for (int i = 0; i < t->model.n_linears; i++) {
        const Linear *l = t->model.linears[i].linear;
        if (l->precision == LINEAR_FLOAT8_TENSORWISE)
            params_find(&t->model.params, l->weight->name)->gather_float8 = true;
    }
}

// An architecture that reads its own inputs (its spec's ModelData) is checked against the
// run and opens them, which sets the data's shapes in the args (--estimate reads no files: the
// flavor's shapes stand); a sample's rows are then the model's whole sequence (its share under
// context parallel). The token pipeline's data keys are refused by name when the architecture
// reads token batches.
static void setup_model_data(Trainer *t) {
    const Config *c = &t->cfg;
    const ModelData *d = t->args.spec->data;
    char why[512];
    if (!d) {
        CHECK(config_key_origin(c, "training.classifier_free_guidance_prob", why, sizeof why));
        if (strcmp(why, "default") != 0)
            die_user("%s: training.classifier_free_guidance_prob does nothing: model %s reads "
                     "token batches", why, c->model.name);
        return;
    }
    if (d->check(c, why, sizeof why)) die_user("%s", why);
    if (!t->estimate_world_size)
        t->data = d->open(c, &t->args, mesh_dp_rank(&t->mesh), mesh_dp_size(&t->mesh.layout),
                          t->train.B);
    t->train.T = model_shape(&t->args).max_seq_len;
    t->train.step_T = d->example_rows(&t->args, t->mesh.layout.size[MESH_CP]);
}

static void setup_model(Trainer *t) {
    const Config *c = &t->cfg;
    trainer_model_args(c, &t->args);
    const ModelSpec *spec = t->args.spec;
    // As torchtitan's update_from_config: the tokenizer sets the vocabulary, the sequence
    // length the RoPE tables.
    spec->update_from_config(&t->args, &c->model,
                             t->tokenizer ? tokenizer_vocab_size(t->tokenizer) : 0,
                             t->train.T > t->val.T ? t->train.T : t->val.T);
    setup_model_data(t);
    const CheckpointSection *ck = &c->checkpoint;
    if (ck->initial_load_in_hf || ck->last_save_in_hf)
        model_spec_require_hf(spec, ck->initial_load_in_hf ? "checkpoint.initial_load_in_hf"
                                                           : "checkpoint.last_save_in_hf");
    char why[256];
    int tp = t->mesh.layout.size[MESH_TP];
    if (spec->tp_check(&t->args, tp, t->train.B, t->train.step_T, why, sizeof why) ||
        (t->val.B > 0 && spec->tp_check(&t->args, tp, t->val.B, t->val.step_T, why, sizeof why)))
        die_user("%s", why);
    // torchtitan's parallelize order: TP, then activation checkpointing, then FSDP.
    spec->build(&t->model, &t->args, false);
    t->model.act_dtype = t->precision;  // bf16 mixed precision stores bf16 activations
    if (config_converts(c, "float8")) convert_float8(t);
    if (c->float8.enable_fsdp_float8_all_gather) mark_float8_gather(t);
    check_moe_keys(t);
    if (t->mesh.layout.size[MESH_PP] > 1) trainer_pipeline_plan(t);
    if (t->tp_on) {
        bool loss_parallel = !c->parallelism.disable_loss_parallel;
        if (t->estimate_world_size) tp_plan(&t->tp, 0, tp, loss_parallel);
        else tp_init(&t->tp, t->mesh.group[MESH_TP], t->k, loss_parallel);
        spec->parallelize_tp(&t->model, &t->tp);
    }
    if (t->cp_on) setup_context_parallel(t);
    if (t->mesh.layout.ep > 1) setup_expert_parallel(t);
    set_checkpointing(&t->model, c->activation_checkpoint.mode,
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
                             .reshard = fsdp_reshard_parse(p->fsdp_reshard_after_forward),
                             .k = t->k};
        const MeshLayout *l = &t->mesh.layout;
        if (l->ep > 1) {
            config.expert_size = mesh_sparse_size(l) / l->ep;
            config.expert_rank = mesh_sparse_index(l, t->mesh.coord) / l->ep;
        }
        // torchtitan's MixedPrecisionPolicy, on every backend
        config.bf16_params = t->precision == DTYPE_BF16;
        config.bf16_reduce = strcmp(t->cfg.training.mixed_precision_reduce, "bfloat16") == 0;
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
        adamw_allocate(&t->opt, m->params.shard_numel, &t->optim_arena);
        if (t->pipeline) trainer_pipeline_start(t);
        return;
    }
    const ActivationCheckpointSection *ac = &t->cfg.activation_checkpoint;
    for (int i = 0; i < 3; i++) {
        set_checkpointing(m, AC_MODES[i], ac->selective_ac_option);
        t->act_bytes_ac[i] = train_activation_bytes(t).total;
    }
    set_checkpointing(m, ac->mode, ac->selective_ac_option);
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
    arena_init_sizing(&t->optim_arena, "optimizer");
    adamw_allocate(&t->opt, m->params.shard_numel, &t->optim_arena);
}

// "memory per rank: params 10.0 MiB (fp32 10.00), ..., activations 12.0 MiB (bf16 8.00,
// fp32 4.00; activation_checkpoint none: 12.0 MiB, selective op: 9.0 MiB, full: 6.0 MiB)":
// each arena, split by the dtypes it holds at its peak.
static void log_memory(const Trainer *t) {
    const double MiB = 1024.0 * 1024.0;
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->comm_arena};
    const char *names[] = {"params", "grads", "optimizer", "comm"};
    char line[1024], dtypes[160];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        arena_bytes_format(arenas[i]->peak, MiB, 2, dtypes, sizeof dtypes);
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %.1f MiB%s%s%s, ", names[i],
                      arenas[i]->size / MiB, *dtypes ? " (" : "", dtypes, *dtypes ? ")" : "");
    }
    // The activations' parentheses also hold their size under each activation_checkpoint mode
    // (selective with the configured selective_ac_option).
    arena_bytes_format(t->act_arena.peak, MiB, 2, dtypes, sizeof dtypes);
    log_info("memory per rank: %sactivations %.1f MiB (%s%sactivation_checkpoint none: %.1f MiB, "
             "selective %s: %.1f MiB, full: %.1f MiB)", line, t->act_arena.size / MiB, dtypes,
             *dtypes ? "; " : "", t->act_bytes_ac[0] / MiB,
             t->cfg.activation_checkpoint.selective_ac_option, t->act_bytes_ac[1] / MiB,
             t->act_bytes_ac[2] / MiB);
}

// A text dataset needs a tokenizer; a pre-tokenized one (token shards) is read as it is.
static void split_open(Split *sp, const char *key, const char *path, const Tokenizer *tok,
                       const Mesh *mesh, int doc_eos) {
    if (!path) die_user("%s is not set (a text, JSONL or R data file or folder, or token shards)",
                        key);
    if (access(path, R_OK) != 0)
        die_user("%s %s: %s", key, path, strerror(errno));
    if (!tok && !dataset_is_tokenized(path))
        die_user("%s %s is text: set model.tokenizer_path to tokenize it", key, path);
    sp->path = path;
    token_stream_from_dataset(&sp->stream, path, tok);
    log_info("data: %s, %lld tokens", path, (long long)token_stream_num_tokens(&sp->stream));
    loader_open(&sp->loader, &sp->stream, sp->T, mesh_dp_rank(mesh), mesh_dp_size(&mesh->layout),
                sp->B);
    sp->tokens = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    sp->targets = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    if (sp->step_T != sp->T) sp->local = xmalloc((size_t)sp->B * sp->step_T * sizeof(int));
    if (doc_eos >= 0) sp->doc = xmalloc((size_t)sp->B * sp->T * sizeof(int));
    // Positions 0, 1, ..., or under context parallel this rank's chunks' (head-tail).
    sp->pos = xmalloc((size_t)sp->step_T * sizeof(int));
    int cp = mesh->layout.size[MESH_CP];
    for (int i = 0; i < sp->step_T; i++) sp->pos[i] = i;
    if (cp > 1) cp_positions(sp->T, cp, mesh->coord[MESH_CP], sp->pos);
}

static void setup_data(Trainer *t) {
    const Config *c = &t->cfg;
    split_open(&t->train, "training.dataset_path", c->training.dataset_path, t->tokenizer,
               &t->mesh, t->doc_eos);
    if (c->validation.enable)
        split_open(&t->val, "validation.dataset_path", c->validation.dataset_path, t->tokenizer,
                   &t->mesh, t->doc_eos);
}

// The step's inputs in the backend's memory: each split's token ids and targets, and their
// positions (uploaded once).
static void allocate_inputs(Trainer *t) {
    Arena *a = &t->input_arena;
    Split *splits[] = {&t->train, &t->val};
    arena_init_sizing(a, "inputs");
    for (int pass = 0; pass < 2; pass++) {  // sizing, then carving the committed arena
        if (pass == 1) arena_commit(a, &t->memory);
        if (t->data) {
            t->args.spec->data->carve(t->data, a);
            continue;
        }
        for (int i = 0; i < 2; i++) {
            Split *sp = splits[i];
            size_t ids = (size_t)sp->B * sp->step_T;
            sp->step_tokens = arena_tensor(a, ids, DTYPE_INT32);
            sp->step_targets = arena_tensor(a, ids, DTYPE_INT32);
            sp->step_pos = arena_tensor(a, (size_t)sp->step_T, DTYPE_INT32);
            if (t->doc_eos >= 0)
                sp->step_doc = arena_tensor(a, (size_t)sp->B * sp->T, DTYPE_INT32);
        }
    }
    for (int i = 0; i < 2 && !t->data; i++) {
        Split *sp = splits[i];
        sp->batch = (TokenBatch){.tokens = sp->step_tokens, .targets = sp->step_targets,
                                 .pos = sp->step_pos, .doc = sp->step_doc};
        if (sp->B > 0) t->k->upload(sp->step_pos, sp->pos, sp->step_T * sizeof(int));
    }
}

// This rank's columns of a batch (B, T) of the split, handed to the backend at dst.
static void upload_columns(const KernelOps *k, Split *sp, int *dst, const int *full) {
    const int *src = full;
    if (sp->step_T != sp->T) {
        cp_select(full, sp->B, sp->T, sp->pos, sp->step_T, sp->local);
        src = sp->local;
    }
    k->upload(dst, src, (size_t)sp->B * sp->step_T * sizeof(int));
}

// The split's next batch, checked against the vocabulary (a shard may come from another one),
// then this rank's columns handed to the backend, and the documents of the whole sequences
// when attention is masked by document (doc_eos >= 0).
static void split_next(const KernelOps *k, Split *sp, int vocab_size, int doc_eos) {
    loader_next(&sp->loader, sp->tokens, sp->targets);
    size_t n = (size_t)sp->B * sp->T;
    for (size_t i = 0; i < n; i++) {
        int bad = sp->tokens[i] < 0 || sp->tokens[i] >= vocab_size     ? sp->tokens[i]
                  : sp->targets[i] < 0 || sp->targets[i] >= vocab_size ? sp->targets[i]
                                                                       : 0;
        if (bad != 0)
            die_user("%s: token id %d is outside the model's vocabulary of %d", sp->path, bad,
                     vocab_size);
    }
    upload_columns(k, sp, sp->step_tokens, sp->tokens);
    upload_columns(k, sp, sp->step_targets, sp->targets);
    if (doc_eos < 0) return;
    document_ids(sp->tokens, sp->B, sp->T, doc_eos, sp->doc);
    k->upload(sp->step_doc, sp->doc, n * sizeof(int));
}

// The mesh from the parallelism degrees, checked before anything is allocated.
static void setup_mesh(Trainer *t) {
    const Config *c = &t->cfg;
    const ParallelismSection *p = &c->parallelism;
    int degrees[MESH_NDIMS] = {(int)p->pipeline_parallel_degree,
                               (int)p->data_parallel_replicate_degree,
                               (int)p->data_parallel_shard_degree,
                               (int)p->context_parallel_degree, (int)p->tensor_parallel_degree};
    MeshLayout layout;
    char err[512];
    int world = t->estimate_world_size ? t->estimate_world_size : comm_size(comm_world());
    if (!mesh_plan(&layout, degrees, world, err, sizeof err) ||
        !mesh_plan_experts(&layout, (int)p->expert_parallel_degree, err, sizeof err))
        die_user("%s", err);
    if (t->estimate_world_size) {
        t->mesh = (Mesh){.layout = layout, .coord[MESH_PP] = t->estimate_pp_rank};  // no groups
    } else {
        mesh_build(&t->mesh, &layout);
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

// training.device's backend, started on this rank's device; device memory brings NCCL in as
// the collective library. --estimate sizes with the cpu backend and starts nothing.
static void setup_backend(Trainer *t) {
    const TrainingSection *tr = &t->cfg.training;
    t->precision = strcmp(tr->mixed_precision_param, "bfloat16") == 0 ? DTYPE_BF16 : DTYPE_FP32;
    t->k = kernels_backend(t->estimate_world_size ? "cpu" : tr->device);
    if (!t->k)
        die_user("training.device %s: this titan was built without it (build with `make CUDA=1`)",
                 tr->device);
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
    KernelInit init = {.local_rank = comm_local_rank(),
                       .bf16_compute = t->precision == DTYPE_BF16};
    char why[512];
    if (!t->k->init(&init, why, sizeof why)) die_user("training.device %s: %s", tr->device, why);
    if (!t->k->host_memory) comm_use_nccl(t->k->queue());
}

static void setup(Trainer *t) {
    const Config *c = &t->cfg;
    setup_backend(t);
    setup_mesh(t);
    t->train.B = (int)c->training.local_batch_size;
    t->train.T = (int)c->training.seq_len;
    if (c->validation.enable) {
        t->val.B = (int)c->validation.local_batch_size;
        t->val.T = (int)c->validation.seq_len;
    }
    // Each cp rank holds 1/cp of every sequence, in chunks (parallel/cp/layout.h).
    int cp = t->mesh.layout.size[MESH_CP];
    char why[256];
    if (cp > 1 && (cp_layout_check("training.seq_len", t->train.T, cp, why, sizeof why) ||
                   (t->val.B > 0 &&
                    cp_layout_check("validation.seq_len", t->val.T, cp, why, sizeof why))))
        die_user("%s", why);
    t->train.step_T = t->train.T / cp;
    t->val.step_T = t->val.T / cp;
    t->accum = accumulation_steps(&c->training, mesh_dp_size(&t->mesh.layout));
    // --estimate plans with the flavor's vocabulary: it reads no files.
    if (c->model.tokenizer_path && !t->estimate_world_size)
        t->tokenizer = tokenizer_load(c->model.tokenizer_path);
    t->doc_eos = -1;
    if (c->training.document_masking && !t->estimate_world_size) {
        t->doc_eos = t->tokenizer ? tokenizer_eos_id(t->tokenizer) : -1;
        if (t->doc_eos < 0)
            die_user("training.document_masking: documents end at the tokenizer's end-of-text "
                     "token, and %s", t->tokenizer ? "model.tokenizer_path's vocabulary has none"
                                                   : "model.tokenizer_path is not set");
    }
    setup_model(t);
    // Microbatches add up in the grads themselves, not through FSDP's reduce-scatter after each
    // (which takes them fresh) or a pipeline schedule's own accumulation.
    t->model.accumulates_grads = t->accum > 1 && !t->fsdp_on && !t->pipeline;
    t->opt = (AdamW){.lr = c->optimizer.lr, .beta1 = c->optimizer.beta1,
                     .beta2 = c->optimizer.beta2, .eps = c->optimizer.eps,
                     .weight_decay = c->optimizer.weight_decay,
                     .ema_decay = c->training.ema_decay};
    double decay_ratio = isnan(c->lr_scheduler.decay_ratio) ? -1 : c->lr_scheduler.decay_ratio;
    t->schedule = lr_schedule_make((int)c->training.steps, (int)c->lr_scheduler.warmup_steps,
                                   decay_ratio, decay_type_of(c->lr_scheduler.decay_type),
                                   c->lr_scheduler.min_lr_factor);
    if (t->estimate_world_size) {
        allocate_arenas(t, false);
        return;
    }
    model_place_buffers(&t->model, t->k);
    if (!c->checkpoint.create_seed_checkpoint) {
        if (!t->data) setup_data(t);
        allocate_inputs(t);
    }
    // What is already loaded (data, inputs) counts as used when the memory check measures.
    allocate_arenas(t, false);
    trainer_check_memory(t);
    allocate_arenas(t, true);
    trainer_load_or_initialize(t);
    const int *size = t->mesh.layout.size;
    ModelShape shape = model_shape(&t->args);
    log_info("model: %s %s, %d layers, dim %d, vocab %d; batch %d x %d tokens x %d "
             "microbatches per rank; mesh pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d",
             t->args.spec->name, c->model.flavor, shape.n_layers, shape.dim, shape.vocab_size,
             t->train.B, t->train.T, t->accum, size[MESH_PP], size[MESH_DP_REPLICATE],
             size[MESH_DP_SHARD], size[MESH_CP], size[MESH_TP]);
    log_info("precision: %s compute (training.mixed_precision_param %s), fp32 master weights and "
             "optimizer state", dtype_name(t->precision), c->training.mixed_precision_param);
    if (config_converts(c, "float8")) log_float8(t);
    if (t->mesh.layout.ep > 1)
        log_info("experts: ep %d x efsdp %d over dp_shard x cp x tp", t->mesh.layout.ep,
                 size[MESH_DP_SHARD] * size[MESH_CP] * size[MESH_TP] / t->mesh.layout.ep);
    if (t->pipeline) {
        const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
        log_info("pipeline: %s, %d microbatches of %lld rows per batch",
                 csv && *csv ? csv : c->parallelism.pipeline_parallel_schedule,
                 trainer_schedule_microbatches(c),
                 (long long)c->parallelism.pipeline_parallel_microbatch_size);
    }
    if (t->tokenizer)
        log_info("tokenizer: %s (%s, %d ids)", c->model.tokenizer_path,
                 tokenizer_format(t->tokenizer), tokenizer_vocab_size(t->tokenizer));
    char backend[512];
    t->k->describe(backend, sizeof backend);
    log_info("kernels: %s", backend);
    log_memory(t);
}

// A fresh step context for one batch of the split (the activation arena starts empty).
static StepCtx step_ctx(Trainer *t, const Split *sp, const void *input) {
    arena_release(&t->act_arena, 0);
    return (StepCtx){.k = t->k, .act = &t->act_arena, .B = sp->B, .T = sp->step_T,
                     .input = input};
}

// The next training microbatch, as the model reads it (StepCtx.input).
static const void *train_next(Trainer *t) {
    if (t->data) return t->args.spec->data->next(t->data, t->k);
    split_next(t->k, &t->train, model_shape(&t->args).vocab_size, t->doc_eos);
    return &t->train.batch;
}

int64_t trainer_data_position(const Trainer *t) {
    return t->data ? t->args.spec->data->position(t->data) : loader_position(&t->train.loader);
}

void trainer_data_set_position(Trainer *t, int64_t position) {
    if (t->data) t->args.spec->data->set_position(t->data, position);
    else loader_set_position(&t->train.loader, position);
}

// torchtitan's validator: the mean loss over validation.steps batches (-1: one pass over the
// validation set) from its start, forward only.
static double validate(Trainer *t) {
    debug_server_phase("validation");
    Split *v = &t->val;
    int64_t batches = t->cfg.validation.steps;
    if (batches < 0) batches = token_stream_num_windows(&v->stream, v->T) / v->B;
    if (batches < 1) batches = 1;
    loader_set_position(&v->loader, 0);
    double loss = 0;
    for (int64_t i = 0; i < batches; i++) {
        split_next(t->k, v, model_shape(&t->args).vocab_size, t->doc_eos);
        if (t->pipeline) {
            loss += trainer_pipeline_eval(t) / batches;
            continue;
        }
        StepCtx s = step_ctx(t, v, &v->batch);
        loss += model_forward(&t->model, &s) / batches;
    }
    if (t->pipeline) loss = comm_all_reduce_double(t->mesh.group[MESH_PP], loss, COMM_SUM);
    return comm_all_reduce_double(t->mesh.loss, loss, COMM_AVG);
}

// torchtitan's MoE pre-step hook: the step's expert load summed over every rank (each holds
// other tokens or other layers), then the aux-loss-free bias update; the load's figures go
// to the metrics.
static void balance_experts(Trainer *t, StepMetrics *m) {
    MoeBalance *b = t->model.moe;
    if (!b) return;
    float *load = moe_balance_load(b, t->k);
    comm_all_reduce(comm_world(), load, (size_t)b->n_layers * b->n_experts, COMM_SUM);
    MoeLoadStats st = moe_balance_update(b, t->k, &t->model.params);
    m->expert_load_max = st.max;
    m->expert_load_mean = st.mean;
}

// One optimizer step over `accum` microbatches: sets m's loss, grad norm, lr and expert load.
static void train_step(Trainer *t, int step, StepMetrics *m) {
    ParamTable *params = &t->model.params;
    debug_server_phase("forward_backward");
    t->k->zero(params->shard_grad, params->shard_numel * sizeof(float));
    double loss = 0, aux = 0;
    for (int mb = 0; mb < t->accum; mb++) {
        const void *input = train_next(t);
        if (t->pipeline) {
            double stage_aux;
            loss += trainer_pipeline_step(t, input, &stage_aux) / t->accum;
            aux += stage_aux / t->accum;
            continue;
        }
        StepCtx s = step_ctx(t, &t->train, input);
        s.loss_scale = 1.0f / t->accum;
        s.grads_hold_sum = t->model.accumulates_grads && mb > 0;
        s.expert_load = t->model.moe ? t->model.moe->load : NULL;
        loss += model_forward_backward(&t->model, &s) / t->accum;
        aux += s.aux_loss / t->accum;
    }
    CommGroup *pp = t->pipeline ? t->mesh.group[MESH_PP] : NULL;
    if (pp) loss = comm_all_reduce_double(pp, loss, COMM_SUM);  // the last stage's, everywhere
    loss = comm_all_reduce_double(t->mesh.loss, loss, COMM_AVG);  // the global batch's mean
    if (t->model.moe && t->model.moe->aux_loss) {  // each stage's layers', then the mean
        if (pp) aux = comm_all_reduce_double(pp, aux, COMM_SUM);
        m->aux_loss = comm_all_reduce_double(t->mesh.loss, aux, COMM_AVG);
    }
    debug_server_phase("optimizer");
    if (!isfinite(loss)) {
        trainer_wait_checkpoint(t);  // a save in flight completes: the message promises it
        die_user("step %d: loss is %s; stopped before updating the weights (checkpoints in %s "
                 "are intact)", step, isnan(loss) ? "NaN" : "infinite", t->ckpt_folder);
    }
    if (t->fsdp_on) fsdp_finish_step(&t->fsdp);
    if (t->ddp_on) ddp_finish_step(params, t->mesh.group[MESH_DP_REPLICATE]);
    CommGroup *tp = t->tp_on ? t->tp.group : NULL, *fsdp = t->fsdp_on ? t->mesh.fsdp : NULL;
    grads_reduce_replicated(params, tp);
    m->loss = loss;
    m->grad_norm = sqrt(grads_sum_squares(t->k, params, fsdp, tp, pp));
    grad_clip_to_norm(t->k, params->shard_grad, params->shard_numel, m->grad_norm,
                      t->cfg.training.max_norm);
    m->lr = t->opt.lr * lr_schedule_factor(&t->schedule, step - t->lr_origin);
    balance_experts(t, m);
    adamw_step(&t->opt, t->k, params, m->lr);
}

// Whether any rank has had a SIGTERM (core/preempt.h): one all-reduce of one double over the
// world per step, so that every rank stops after the same step and joins the same save.
static bool preemption_agreed(void) {
    return comm_all_reduce_double(comm_world(), preempt_requested() ? 1 : 0, COMM_MAX) > 0;
}

static void log_preemption(const Trainer *t, int step) {
    if (!t->cfg.checkpoint.enable) {
        log_info("preempted at step %d: checkpoint.enable is off, nothing saved", step);
        return;
    }
    char path[4096 + 64];
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
    log_info("preempted at step %d: checkpoint saved to %s", step, path);
}

// profiling.*: the traces of the profiled steps and the memory snapshots (core/profiler.h), in
// <dump_folder>/<save_traces_folder> and <dump_folder>/<save_memory_snapshot_folder>.
static void start_profiler(Trainer *t) {
    const ProfilingSection *p = &t->cfg.profiling;
    static char traces[8192], snapshots[8192];
    snprintf(traces, sizeof traces, "%s/%s", t->cfg.job.dump_folder, p->save_traces_folder);
    snprintf(snapshots, sizeof snapshots, "%s/%s", t->cfg.job.dump_folder,
             p->save_memory_snapshot_folder);
    static Arena *arenas[6];
    Arena *all[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                    &t->comm_arena, &t->input_arena};
    memcpy(arenas, all, sizeof all);
    profiler_configure(&(ProfilerConfig){
        .rank = t->mesh.world_rank, .freq = (int)p->profile_freq,
        .active = p->enable_profiling ? (int)p->profiler_active : 0, .trace_folder = traces,
        .snapshot_folder = p->enable_memory_snapshot ? snapshots : NULL, .arenas = arenas,
        .n_arenas = 6, .counters = comm_counters});
}

static void train(Trainer *t) {
    const Config *c = &t->cfg;
    start_profiler(t);
    double started = now_seconds(), waited_before = comm_wait_seconds();
    int rank = t->mesh.world_rank;
    MetricsLog log = {.color = !c->metrics.disable_color_printing && isatty(STDOUT_FILENO)};
    if (rank == 0 || c->metrics.save_for_all_ranks) {
        metrics_open(&log, c->job.dump_folder, rank, t->progress.step);
        if (c->metrics.enable_tensorboard)
            metrics_open_tensorboard(&log, c, rank, t->progress.step);
    }
    // Tokens per device, as torchtitan: the ranks of a tp group, and of a pipeline, share
    // their tokens; a cp rank holds 1/cp of each sequence.
    const int *size = t->mesh.layout.size;
    double tokens_per_step =
        (double)t->accum * t->train.B * t->train.step_T / (size[MESH_TP] * size[MESH_PP]);
    double interval_start = now_seconds();
    int interval_steps = 0;
    double peak_flops = c->metrics.peak_flops > 0 ? c->metrics.peak_flops : t->k->peak_flops();
    int first_step = (int)t->progress.step + 1;
    bool preempted = false;
    for (int step = first_step; step <= c->training.steps; step++) {
        StepMetrics m = {.step = step, .aux_loss = NAN, .precision = dtype_name(t->precision),
                         .float8 = t->float8_recipe};
        profiler_step_begin(step);
        debug_server_step(step);
        double step_started = now_seconds();
        train_step(t, step, &m);
        t->step_seconds = now_seconds() - step_started;
        debug_server_phase("metrics");
        // torchtitan: comm.init_timeout_seconds covers setup and the first step, whose
        // collectives wait for the slowest rank's setup; then comm.train_timeout_seconds.
        if (step == first_step) comm_set_timeout((int)c->comm.train_timeout_seconds);
        t->progress.step = step;
        interval_steps++;
        if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps) {
            double elapsed = now_seconds() - interval_start;
            m.tokens_per_s = interval_steps * tokens_per_step / elapsed;
            m.tflops = m.tokens_per_s * t->model.flops_per_token / 1e12;
            m.mfu = peak_flops > 0 ? 100 * m.tflops * 1e12 / peak_flops : NAN;
            m.peak_memory_gib = (double)t->k->memory_peak() / (1u << 30);
            metrics_write(&log, &m);
            debug_server_metrics(&m);
            interval_start = now_seconds();
            interval_steps = 0;
        }
        if (c->validation.enable && step % c->validation.freq == 0)
            metrics_write_validation(&log, step, validate(t));
        preempted = step < c->training.steps && preemption_agreed();
        if (c->checkpoint.enable) trainer_maybe_checkpoint(t, step, preempted);
        profiler_step_end(step);
        if (preempted) break;
    }
    profiler_finish();
    debug_server_phase("done");
    trainer_close_checkpoint(t);  // the last save, if still in the background, completes
    if (preempted) log_preemption(t, (int)t->progress.step);
    metrics_close(&log);
    double elapsed = now_seconds() - started, waited = comm_wait_seconds() - waited_before;
    log_info("comm: %.2f s of %.2f s of training waiting on collectives (%.1f%%)", waited, elapsed,
             elapsed > 0 ? 100 * waited / elapsed : 0.0);
    if (t->cp_on) trainer_log_cp_traffic(t, elapsed);
    comm_report();
    if (t->mesh.world_rank == 0) trainer_write_run_summary(t);
}

static void save_config(const Config *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
    config_print_yaml(c, f);
    if (fclose(f) != 0) die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
}

// The usage of every command; each subcommand's own --help prints its line in full.
static const char USAGE[] =
    "usage: titan --config FILE.yaml [--section.key VALUE ...]   train a model\n"
    "       titan tokenize --tokenizer T --out DIR [--shard-tokens N] DATASET...\n"
    "       titan tokenizer train --vocab-size N --out FILE.tiktoken [--threads T] FILE...\n"
    "       titan generate --checkpoint C [--tokenizer T] --prompt TEXT [...]\n"
    "       titan convert --to hf [--dtype float32|bfloat16] CHECKPOINT.h5 OUT_DIR\n"
    "       titan convert --to titan HF_DIR OUT.h5\n"
    "       mpirun -np N titan --config FILE.yaml ...      train on N ranks\n"
    "\n"
    "Training flags:\n"
    "  --config FILE          torchtitan's job config in YAML; see configs/ (debug_model.yaml,\n"
    "                         llama3_8b.yaml, llama3_70b.yaml, llama3_405b.yaml)\n"
    "  --section.key VALUE    override one config key, e.g. --training.steps 100\n"
    "  --print-config         print the resolved config as YAML and exit\n"
    "  --device cpu|cuda      short for --training.device\n"
    "  --estimate [--world-size N]  print each rank's memory and FLOPs plan and exit\n"
    "  --print-schedule [--microbatches N]  check the pipeline schedule, print it and exit\n"
    "  --help-config          list every config key: type, default, meaning\n"
    "  -h, --help             this text; `titan COMMAND --help` for a command's\n"
    "\n"
    "Exit status: 0 done, 2 a problem with your input (one line says which), 3 a bug in titan.\n"
    "More in README.md.";

// titan's own flags, removed from argv before the config parses the rest: `--estimate
// [--world-size N]`; `--print-schedule [--microbatches N]`; and the short forms
// `--print-config` (`--job.print_config`) and `--device D` (`--training.device D`).
// `--help-config` prints the config keys and exits.
static int parse_titan_flags(int argc, char **argv, Trainer *t) {
    int kept = 1;
    bool estimate = false;
    int world = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help-config") == 0) {
            config_print_help(stdout);
            exit(0);
        } else if (strcmp(argv[i], "--estimate") == 0) {
            estimate = true;
        } else if (strcmp(argv[i], "--print-schedule") == 0) {
            t->print_schedule = true;
        } else if (strcmp(argv[i], "--world-size") == 0 ||
                   strcmp(argv[i], "--microbatches") == 0) {
            char *end = NULL, quoted[160];
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || *end || v < 1 || v > INT32_MAX)  // ranks and microbatches are ints
                die_user("%s expects an integer in [1, %d], got %s", argv[i], INT32_MAX,
                         i + 1 < argc ? error_quote(quoted, sizeof quoted, argv[i + 1]) : "none");
            *(strcmp(argv[i], "--world-size") == 0 ? &world : &t->schedule_microbatches) = (int)v;
            i++;
        } else {
            argv[kept++] = strcmp(argv[i], "--print-config") == 0 ? "--job.print_config"
                           : strcmp(argv[i], "--device") == 0       ? "--training.device"
                                                                    : argv[i];
        }
    }
    if (world && !estimate) die_user("--world-size is only for --estimate");
    if (t->schedule_microbatches && !t->print_schedule)
        die_user("--microbatches is only for --print-schedule");
    if (estimate) t->estimate_world_size = world ? world : 1;
    return kept;
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

// The config, with the choices core/config.c cannot know (the registry's models and their
// flavors) checked as soon as it is read: before --print-config prints it and before anything
// starts.
static void config_load(Config *c, int argc, char **argv) {
    config_load_or_die(c, argc, argv);
    ModelArgs args;
    trainer_model_args(c, &args);
}

int main(int argc, char **argv) {
    if (argc == 1) {  // no config: say what titan takes rather than train the defaults
        fprintf(stderr, "%s\n", USAGE);
        return EXIT_USER_ERROR;
    }
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0) return tokenize_main(argc - 1, argv + 1);
    if (argc > 2 && strcmp(argv[1], "tokenizer") == 0 && strcmp(argv[2], "train") == 0)
        return tokenizer_train_main(argc - 2, argv + 2);
    if (argc > 1 && strcmp(argv[1], "generate") == 0) return generate_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "convert") == 0) return convert_main(argc - 1, argv + 1);
    help_exit_if_asked(argc, argv, USAGE);
    // The trainer lives as long as the process: static, so nothing it holds is lost when a
    // path below returns from main.
    static Trainer trainer;
    Trainer *t = &trainer;
    argc = parse_titan_flags(argc, argv, t);
    if (t->print_schedule) {  // like --estimate: no MPI, nothing allocated but the schedule
        // Parsed but not checked against what training implements: planning a pipeline that
        // training refuses today (pipeline_parallel_degree > 1) is the point.
        char err[1024];
        config_defaults(&t->cfg);
        if (!config_parse_args(&t->cfg, argc, argv, err, sizeof err)) die_user("%s", err);
        trainer_print_schedule(&t->cfg, t->schedule_microbatches);
        return 0;
    }
    if (t->estimate_world_size) {  // planning only: no MPI, no files, no allocation
        config_load(&t->cfg, argc, argv);
        // One plan per pp rank, each holding only its stages' blocks; the other coordinates
        // are 0 (their ranks hold the same amounts).
        int pp = (int)t->cfg.parallelism.pipeline_parallel_degree;
        Trainer *ranks = xcalloc((size_t)pp, sizeof(Trainer));
        for (int r = 0; r < pp; r++) {
            ranks[r] = (Trainer){.cfg = t->cfg, .estimate_world_size = t->estimate_world_size,
                                 .estimate_pp_rank = r};
            setup(&ranks[r]);
        }
        trainer_print_estimate(ranks, pp);
        return 0;
    }
    comm_init(&argc, &argv);
    preempt_install();  // from here a SIGTERM, even during setup, stops after the next step
    log_set_rank(comm_rank(comm_world()));
    die_user_collective(true);  // every rank reads the same config and plans the same mesh
    config_load(&t->cfg, argc, argv);
    const CommSection *cs = &t->cfg.comm;
    char traces[8192];  // torchtitan's <dump_folder>/<save_traces_folder>
    snprintf(traces, sizeof traces, "%s/%s", t->cfg.job.dump_folder, cs->save_traces_folder);
    comm_configure(&(CommConfig){.timeout_seconds = (int)cs->init_timeout_seconds,
                                 .trace_buf_size = (int)cs->trace_buf_size,
                                 .trace_folder = traces});
    if (t->cfg.job.print_config) {
        config_print_yaml(&t->cfg, stdout);
        return 0;
    }
    if (t->cfg.job.save_config_file) save_config(&t->cfg, t->cfg.job.save_config_file);
    trainer_start_debug_server(&t->cfg);
    setup(t);
    die_user_collective(false);
    if (t->cfg.checkpoint.create_seed_checkpoint)
        trainer_create_seed_checkpoint(t);
    else
        train(t);
    debug_server_stop();
    comm_finalize();
    return 0;
}
