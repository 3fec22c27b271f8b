// Pipeline parallel in the trainer: the checked schedule, the blocks each stage runs, the
// placement of each stage's parameters on its pp rank, and the executor's callbacks into the
// model (parallel/pp/ knows no model; the model knows no pipeline).
#include <stdlib.h>

#include "parallel/pp/executor.h"
#include "parallel/pp/stage.h"
#include "train/train.h"

// One schedule the pipeline runs: training's, or evaluation's (forward only, validation).
typedef struct {
    PpSchedule schedule;
    PpReport report;
    const Split *split;      // the batches it runs
    int m;                   // microbatches per batch; 0: no such run
    int n_regions;           // this rank's activation regions (pp_region_counts)
    PpExecutor *exec;
} PipelineRun;

struct Pipeline {
    PpStageFns fns;          // first: the callbacks find the Pipeline from their pointer
    Trainer *t;
    PipelineRun train, eval;
    PipelineRun *running;    // the run whose callbacks are being called
    int rank;                // this rank's pp coordinate
    int *first;              // (stages + 1) stage s runs blocks [first[s], first[s + 1])
    int rows;                // rows (batch entries) of a microbatch
    float loss_scale;        // 1 / (training microbatches x gradient accumulation steps)
    int n_slots;             // regions of the larger run
    ModelSlots *slots;       // (n_slots) one microbatch's blocks' slots per region
    StepCtx *ctx;            // (n_slots) its step context
    const void *batch;       // the batch being run: the split's TokenBatch, or the model's
    size_t input_bytes;      // one microbatch's input (a TokenBatch, or the model's)
    char *inputs;            // (n_slots, input_bytes) its microbatch's rows of the batch
    double *loss;            // (the larger m) the last stage's loss per microbatch
    double aux_loss;         // the MoE balance loss of this rank's stages, summed over a batch
};

static float *stage_forward(const PpStageFns *f, int stage, int mb, int region, Arena *act,
                            const float *x) {
    Pipeline *p = (Pipeline *)f;
    Trainer *t = p->t;
    const Split *sp = p->running->split;
    StepCtx *s = &p->ctx[region];
    void *input = p->inputs + (size_t)region * p->input_bytes;
    if (!p->batch)  // sizing the model's own inputs: it reads none
        input = NULL;
    else if (t->data)
        t->args.spec->data->input_rows(t->data, p->batch, mb * p->rows, p->rows, input);
    else
        *(TokenBatch *)input = token_batch_rows(p->batch, mb * p->rows, sp->step_T, sp->T);
    // a loss mask's count, of the step's batches (training) or of this batch (evaluation),
    // shared by the batch's microbatches
    double targets = p->running == &p->train ? t->loss_tokens : sp->targets_counted;
    bool training = p->running == &p->train;
    *s = (StepCtx){.k = t->k, .act = act, .B = p->rows, .T = sp->step_T, .input = input,
                   .loss_scale = p->loss_scale, .loss_tokens = targets / p->running->m,
                   .dropout_seed = training ? t->dropout_seed + 2 * (uint64_t)mb : 0};
    if (p->running == &p->train && t->model.moe) s->expert_load = t->model.moe->load;
    int last = p->first[stage + 1];
    float *y = model_forward_blocks(&t->model, s, &p->slots[region], p->first[stage], last, x);
    if (last == t->model.n_blocks && !step_sizing(s)) p->loss[mb] = s->loss;
    if (!step_sizing(s)) p->aux_loss += s->aux_loss;
    return y;
}

static float *stage_backward(const PpStageFns *f, int stage, int mb, int region, Arena *act,
                             BlockPhase phase, const float *dy) {
    (void)mb;
    Pipeline *p = (Pipeline *)f;
    StepCtx *s = &p->ctx[region];
    CHECK(s->act == act);
    return model_backward_blocks(&p->t->model, s, &p->slots[region], p->first[stage],
                                 p->first[stage + 1], phase, dy);
}

// Each block's parameters live on the pp rank of the stage that runs it.
static void place_stages(Pipeline *p, Model *m, const MeshLayout *layout) {
    const PpSchedule *s = &p->train.schedule;
    int param = 0;
    for (int st = 0; st < s->stages; st++)
        for (int b = p->first[st]; b < p->first[st + 1]; b++)
            for (int j = 0; j < m->blocks[b].n_params; j++, param++) {
                Placement pl = {.kind = PLACE_OWNED, .group = MESH_PP,
                                .size = layout->size[MESH_PP], .rank = p->rank,
                                .owner = s->stage_rank[st]};
                params_place(&m->params, &m->params.items[param], pl);
            }
    CHECK(param == m->params.count);
}

// The regions of run u on this rank. On NCCL (a device backend, comm.backend not mpi) the
// executor's order with them must run with a channel per peer and direction too
// (parallel/p2p_check.h): generated schedules always do (test_pp_schedule), a CSV schedule is
// refused when it would not.
static void plan_regions(const Trainer *t, Pipeline *p, PipelineRun *u) {
    int *regions = xcalloc((size_t)u->schedule.ranks, sizeof(int));
    pp_region_counts(&u->schedule, &u->report, regions);
    char err[512];
    bool nccl = !t->k->host_memory && strcmp(t->cfg.comm.backend, "mpi") != 0;
    if (nccl && !pp_schedule_check_nccl(&u->schedule, regions, P2P_CHANNELS, err, sizeof err))
        die_user("parallelism.pipeline_parallel_schedule_csv: the schedule would hang on "
                 "training.device %s: %s", t->cfg.training.device, err);
    u->n_regions = regions[p->rank];
    free(regions);
}

// Validation runs the training schedule's placement forward only, on the validation split's
// batches in microbatches of the same rows.
static void plan_eval(Pipeline *p, Trainer *t) {
    PipelineRun *u = &p->eval;
    if (t->val.B % p->rows != 0)
        die_user("validation.local_batch_size %d is not a multiple of "
                 "parallelism.pipeline_parallel_microbatch_size %d", t->val.B, p->rows);
    u->split = &t->val;
    u->m = t->val.B / p->rows;
    pp_schedule_forward_only(&u->schedule, &p->train.schedule, u->m);
    char err[512];
    if (!pp_schedule_check(&u->schedule, &u->report, err, sizeof err))
        die_internal(__FILE__, __LINE__, "the evaluation schedule fails its check: %s", err);
    plan_regions(t, p, u);
}

void trainer_pipeline_plan(Trainer *t) {
    const Config *c = &t->cfg;
    const ParallelismSection *ps = &c->parallelism;
    Pipeline *p = xcalloc(1, sizeof *p);
    t->pipeline = p;
    p->t = t;
    p->fns = (PpStageFns){stage_forward, stage_backward};
    p->rank = t->mesh.coord[MESH_PP];
    p->rows = (int)ps->pipeline_parallel_microbatch_size;
    PipelineRun *u = &p->train;
    u->split = &t->train;
    u->m = trainer_schedule_microbatches(c);
    p->loss_scale = 1.0f / ((float)u->m * (float)t->accum);
    if (model_shape(&t->args).tie_word_embeddings)
        die_user("model.tie_word_embeddings cannot be trained with pipeline parallel: the tied "
                 "weight would belong to the first and the last stage");
    trainer_load_schedule(c, u->m, &u->schedule, &u->report);
    const PpSchedule *s = &u->schedule;
    char err[512];
    int first_less = (int)ps->pipeline_parallel_first_stage_less_layers;
    int last_less = (int)ps->pipeline_parallel_last_stage_less_layers;
    p->first = xcalloc((size_t)s->stages + 1, sizeof(int));
    if (!pp_split_blocks(model_shape(&t->args).n_layers, s->stages, first_less, last_less,
                         p->first, err, sizeof err))
        die_user("%s", err);
    place_stages(p, &t->model, &t->mesh.layout);
    plan_regions(t, p, u);
    if (c->validation.enable) plan_eval(p, t);
    p->n_slots = u->n_regions > p->eval.n_regions ? u->n_regions : p->eval.n_regions;
    p->slots = xcalloc((size_t)p->n_slots, sizeof(ModelSlots));
    p->ctx = xcalloc((size_t)p->n_slots, sizeof(StepCtx));
    p->input_bytes = t->data ? t->args.spec->data->input_bytes : sizeof(TokenBatch);
    p->inputs = xcalloc((size_t)p->n_slots, p->input_bytes);
    for (int i = 0; i < p->n_slots; i++) model_slots_init(&p->slots[i], &t->model);
    p->loss = xcalloc((size_t)(u->m > p->eval.m ? u->m : p->eval.m), sizeof(double));
}

// Floats of one activation (or its gradient) between stages of run u: a microbatch's rows x
// seq_len / cp / tp tokens (context parallel cuts the sequence over cp, sequence parallel this
// rank's share over tp, unless the model's plan keeps the rows whole) of dim each.
static size_t activation_width(const Trainer *t, const PipelineRun *u) {
    const Pipeline *p = t->pipeline;
    int tp = t->model.tp_whole_rows ? 1 : t->mesh.layout.size[MESH_TP];
    return (size_t)p->rows * u->split->step_T / tp * t->model.dim;
}

// One region of run u, by dtype (a multiple of the arena's alignment, as every carve is).
static ArenaBytes region_bytes(Trainer *t, PipelineRun *u) {
    Pipeline *p = t->pipeline;
    p->running = u;
    p->batch = t->data ? NULL : &u->split->batch;  // the token pipeline's is always there
    return pp_region_bytes(&u->schedule, p->rank, activation_width(t, u), &p->fns);
}

// Run u's regions, each holding region_bytes' dtypes.
static ArenaBytes regions_bytes(Trainer *t, PipelineRun *u) {
    ArenaBytes one = region_bytes(t, u), all = {.total = one.total * (size_t)u->n_regions};
    for (int d = 0; d < DTYPE_COUNT; d++) all.by[d] = one.by[d] * (size_t)u->n_regions;
    return all;
}

// Training and validation take turns in the activation arena: it holds the larger.
ArenaBytes trainer_pipeline_activation_bytes(Trainer *t) {
    Pipeline *p = t->pipeline;
    ArenaBytes train = regions_bytes(t, &p->train);
    ArenaBytes eval = p->eval.m ? regions_bytes(t, &p->eval) : (ArenaBytes){0};
    return train.total >= eval.total ? train : eval;
}

PipelineRankPlan trainer_pipeline_rank_plan(Trainer *t) {
    Pipeline *p = t->pipeline;
    PipelineRun *u = &p->train;
    const PpSchedule *s = &u->schedule;
    const char *csv = t->cfg.parallelism.pipeline_parallel_schedule_csv;
    PipelineRankPlan plan = {
        .schedule = csv && *csv ? csv : t->cfg.parallelism.pipeline_parallel_schedule,
        .microbatches = u->m, .stages = s->stages, .rank = p->rank, .stage_rank = s->stage_rank,
        .first = p->first, .bubble = u->report.bubble, .peak_live = u->report.peak_live[p->rank],
        .regions = u->n_regions, .region_bytes = region_bytes(t, u).total,
        .eval_regions = p->eval.m ? p->eval.n_regions : 0,
        .eval_region_bytes = p->eval.m ? region_bytes(t, &p->eval).total : 0};
    uint64_t bytes = activation_width(t, u) * sizeof(float);
    for (int i = 0; i < s->count[p->rank]; i++) {
        PpActionKind kind = s->actions[p->rank][i].kind;
        if (kind == PP_SEND_ACT) plan.act_bytes_sent += bytes;
        if (kind == PP_SEND_GRAD) plan.grad_bytes_sent += bytes;
    }
    return plan;
}

static void start_run(Trainer *t, PipelineRun *u) {
    const Mesh *mesh = &t->mesh;
    Pipeline *p = t->pipeline;
    p->running = u;  // the executor sizes its regions through the callbacks
    p->batch = t->data ? NULL : &u->split->batch;
    u->exec = pp_executor_create(&u->schedule, &u->report, p->rank, mesh->pp_prev, mesh->pp_next,
                                 mesh->group[MESH_PP], activation_width(t, u), t->k, &p->fns);
}

// The pp ranks of the stages holding a copy (Param.copy: the decoder's head's of the
// embedding table under multi-token prediction) and its original, where they are two.
static void split_tied_group(Trainer *t) {
    const ParamTable *params = &t->model.params;
    int ends[2] = {-1, -1};
    for (int i = 0; i < params->count; i++) {
        const Param *p = &params->items[i];
        if (!p->copy) continue;
        const Param *o = params_find(params, p->name);
        int a = param_placement_on(o, MESH_PP)->owner, b = param_placement_on(p, MESH_PP)->owner;
        CHECK(ends[0] < 0 || (ends[0] == a && ends[1] == b));  // one pair of stages
        ends[0] = a, ends[1] = b;
    }
    if (ends[0] == ends[1]) return;  // none, or both on one rank
    int rank = t->pipeline->rank;
    bool end = rank == ends[0] || rank == ends[1];
    CommGroup *g = comm_split(t->mesh.group[MESH_PP], end ? 0 : 1 + rank, rank, "pp_tied");
    t->pp_tied = end ? g : NULL;
}

void trainer_pipeline_start(Trainer *t) {
    Pipeline *p = t->pipeline;
    split_tied_group(t);
    start_run(t, &p->train);
    if (p->eval.m) start_run(t, &p->eval);
}

// One batch (the step's input, StepCtx.input's type) of run u's split through this rank's
// stages: the mean loss over its microbatches on the last stage's rank, 0 on the others;
// *aux_loss the mean over them of its stages' MoE balance loss.
static double run_batch(Trainer *t, PipelineRun *u, const void *batch, double *aux_loss) {
    Pipeline *p = t->pipeline;
    p->running = u;
    p->batch = batch;
    p->aux_loss = 0;
    for (int mb = 0; mb < u->m; mb++) p->loss[mb] = 0;
    pp_executor_step(u->exec, &t->act_arena);
    double loss = 0;
    for (int mb = 0; mb < u->m; mb++) loss += p->loss[mb] / u->m;
    *aux_loss = p->aux_loss / u->m;
    return loss;
}

double trainer_pipeline_step(Trainer *t, const void *batch, double *aux_loss) {
    return run_batch(t, &t->pipeline->train, batch, aux_loss);
}

double trainer_pipeline_eval(Trainer *t) {
    double aux_loss;
    return run_batch(t, &t->pipeline->eval, &t->val.batch, &aux_loss);
}
