// Pipeline parallel in the trainer: the checked schedule, the blocks each stage runs, the
// placement of each stage's parameters on its pp rank, and the executor's callbacks into the
// model (parallel/pp/ knows no model; the model knows no pipeline).
#include <stdlib.h>

#include "parallel/pp/executor.h"
#include "parallel/pp/stage.h"
#include "train.h"

struct Pipeline {
    PpStageFns fns;          // first: the callbacks find the Pipeline from their pointer
    Trainer *t;
    PpSchedule schedule;
    PpReport report;
    int rank;                // this rank's pp coordinate
    int *first;              // (stages + 1) stage s runs blocks [first[s], first[s + 1])
    int m, rows;             // microbatches per step and rows (batch entries) of each
    float loss_scale;        // 1 / (m x gradient accumulation steps)
    int n_regions;
    ModelSlots *slots;       // (n_regions) one microbatch's blocks' slots per region
    StepCtx *ctx;            // (n_regions) its step context
    double *loss;            // (m) the last stage's loss per microbatch
    const int *tokens, *targets;  // the step's batch (B*T each), the backend's copies
    PpExecutor *exec;
};

static float *stage_forward(const PpStageFns *f, int stage, int mb, int region, Arena *act,
                            const float *x) {
    Pipeline *p = (Pipeline *)f;
    Trainer *t = p->t;
    int T = t->train.T;
    size_t first_row = (size_t)mb * p->rows * T;
    StepCtx *s = &p->ctx[region];
    *s = (StepCtx){.k = t->k, .act = act, .B = p->rows, .T = T, .pos = t->step_pos,
                   .tokens = p->tokens ? p->tokens + first_row : NULL,
                   .targets = p->targets ? p->targets + first_row : NULL,
                   .loss_scale = p->loss_scale};
    int last = p->first[stage + 1];
    float *y = model_forward_blocks(&t->model, s, &p->slots[region], p->first[stage], last, x);
    if (last == t->model.n_blocks && !step_sizing(s)) p->loss[mb] = s->loss;
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
    const PpSchedule *s = &p->schedule;
    int param = 0;
    for (int st = 0; st < s->stages; st++)
        for (int b = p->first[st]; b < p->first[st + 1]; b++)
            for (int j = 0; j < m->blocks[b].n_params; j++, param++) {
                Placement pl = {PLACE_OWNED, 0, MESH_PP, layout->size[MESH_PP], p->rank,
                                s->stage_rank[st]};
                params_place(&m->params, &m->params.items[param], pl);
            }
    CHECK(param == m->params.count);
}

void trainer_pipeline_plan(Trainer *t) {
    const Config *c = &t->cfg;
    const ParallelismSection *ps = &c->parallelism;
    Pipeline *p = xcalloc(1, sizeof *p);
    t->pipeline = p;
    p->t = t;
    p->fns = (PpStageFns){stage_forward, stage_backward};
    p->rank = t->mesh.coord[MESH_PP];
    p->m = trainer_schedule_microbatches(c);
    p->rows = (int)ps->pipeline_parallel_microbatch_size;
    p->loss_scale = 1.0f / ((float)p->m * (float)t->accum);
    if (t->args.tie_word_embeddings)
        die_user("model.tie_word_embeddings cannot be trained with pipeline parallel: the tied "
                 "weight would belong to the first and the last stage");
    if (c->validation.enable)
        die_user("validation.enable is not implemented with pipeline_parallel_degree %d yet",
                 t->mesh.layout.size[MESH_PP]);
    trainer_load_schedule(c, p->m, &p->schedule, &p->report);
    const PpSchedule *s = &p->schedule;
    char err[512];
    // NCCL runs every point-to-point operation of a rank on one stream, so a send waiting for
    // its receiver blocks the receive queued behind it, which 1F1B's crossing activations and
    // gradients need: the executor waits for per-direction channels there (not yet built).
    if (!t->k->host_memory)
        die_user("parallelism.pipeline_parallel_degree %d on training.device %s is not "
                 "implemented yet (its NCCL point-to-point channels are the missing part)",
                 s->ranks, c->training.device);
    int first_less = (int)ps->pipeline_parallel_first_stage_less_layers;
    int last_less = (int)ps->pipeline_parallel_last_stage_less_layers;
    int stages = s->stages;
    p->first = xcalloc((size_t)stages + 1, sizeof(int));
    if (!pp_split_blocks(t->args.n_layers, stages, first_less, last_less, p->first, err,
                         sizeof err))
        die_user("%s", err);
    place_stages(p, &t->model, &t->mesh.layout);
    p->loss = xcalloc((size_t)p->m, sizeof(double));
    int *regions = xcalloc((size_t)s->ranks, sizeof(int));
    pp_region_counts(s, &p->report, regions);
    p->n_regions = regions[p->rank];
    free(regions);
}

// Floats of one activation (or its gradient) between stages: a microbatch's rows x seq_len / tp
// tokens (sequence parallel cuts the sequence over tp) of dim each.
static size_t activation_width(const Trainer *t) {
    const Pipeline *p = t->pipeline;
    return (size_t)p->rows * t->train.T / t->mesh.layout.size[MESH_TP] * t->args.dim;
}

// Each region carved from the activation arena is rounded up to its alignment.
static size_t region_bytes(Trainer *t) {
    Pipeline *p = t->pipeline;
    if (!p->slots) {
        p->slots = xcalloc((size_t)p->n_regions, sizeof(ModelSlots));
        p->ctx = xcalloc((size_t)p->n_regions, sizeof(StepCtx));
        for (int i = 0; i < p->n_regions; i++) model_slots_init(&p->slots[i], &t->model);
    }
    size_t bytes = pp_region_bytes(&p->schedule, p->rank, activation_width(t), &p->fns);
    return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

size_t trainer_pipeline_activation_bytes(Trainer *t) {
    return region_bytes(t) * (size_t)t->pipeline->n_regions;
}

PipelineRankPlan trainer_pipeline_rank_plan(Trainer *t) {
    Pipeline *p = t->pipeline;
    const PpSchedule *s = &p->schedule;
    const char *csv = t->cfg.parallelism.pipeline_parallel_schedule_csv;
    PipelineRankPlan plan = {
        .schedule = csv && *csv ? csv : t->cfg.parallelism.pipeline_parallel_schedule,
        .microbatches = p->m, .stages = s->stages, .rank = p->rank, .stage_rank = s->stage_rank,
        .first = p->first, .bubble = p->report.bubble, .peak_live = p->report.peak_live[p->rank],
        .regions = p->n_regions, .region_bytes = region_bytes(t)};
    uint64_t bytes = activation_width(t) * sizeof(float);
    for (int i = 0; i < s->count[p->rank]; i++) {
        PpActionKind kind = s->actions[p->rank][i].kind;
        if (kind == PP_SEND_ACT) plan.act_bytes_sent += bytes;
        if (kind == PP_SEND_GRAD) plan.grad_bytes_sent += bytes;
    }
    return plan;
}

void trainer_pipeline_start(Trainer *t) {
    Pipeline *p = t->pipeline;
    arena_release(&t->act_arena, 0);
    const Mesh *mesh = &t->mesh;
    p->exec = pp_executor_create(&p->schedule, &p->report, p->rank, mesh->pp_prev, mesh->pp_next,
                                 mesh->group[MESH_PP], activation_width(t), t->k, &p->fns,
                                 &t->act_arena);
}

double trainer_pipeline_step(Trainer *t) {
    Pipeline *p = t->pipeline;
    p->tokens = t->train.step_tokens;
    p->targets = t->train.step_targets;
    for (int mb = 0; mb < p->m; mb++) p->loss[mb] = 0;
    pp_executor_step(p->exec);
    double loss = 0;  // the mean over microbatches, on the last stage's rank; 0 elsewhere
    for (int mb = 0; mb < p->m; mb++) loss += p->loss[mb] / p->m;
    return loss;
}
