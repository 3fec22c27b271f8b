// The training loop, torchtitan's recipe: each step's microbatches through the model (or the
// pipeline), the loss and grad norm reduced over the mesh, clipping, the optimizer step and the
// MoE balance update; around it the metrics, validation, checkpoints, the profiler and the
// agreement on preemption and on a failed write.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"
#include "train/train.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// A fresh step context for one batch of the split (the activation arena starts empty).
static StepCtx step_ctx(Trainer *t, const Split *sp, const void *input) {
    arena_release(&t->act_arena, 0);
    return (StepCtx){.k = t->k, .act = &t->act_arena, .B = sp->B, .T = sp->step_T,
                     .input = input};
}

// torchtitan's validator: the mean loss over validation.steps batches (-1: one pass over the
// validation set) from its start, forward only. Under a loss mask, the mean over the targets
// that count in all of them, on every rank (torchtitan's global_valid_tokens): each batch's
// mean over this rank's, weighed by their count.
static double validate(Trainer *t) {
    debug_server_phase("validation");
    Split *v = &t->val;
    int64_t batches = t->cfg.validation.steps;
    if (batches < 0) batches = token_stream_num_windows(&v->stream, v->T) / v->B;
    if (batches < 1) batches = 1;
    loader_set_position(&v->loader, 0);
    double loss = 0, counted = 0;
    for (int64_t i = 0; i < batches; i++) {
        trainer_split_next(t, v);
        double batch;
        if (t->pipeline) {
            batch = trainer_pipeline_eval(t);
        } else {
            StepCtx s = step_ctx(t, v, &v->batch);
            s.loss_tokens = v->targets_counted;  // 0 without a mask: B*T
            batch = model_forward(&t->model, &s);
        }
        loss += v->loss_mask ? batch * v->targets_counted : batch / batches;
        counted += v->targets_counted;
    }
    if (t->pipeline) loss = comm_all_reduce_double(t->mesh.group[MESH_PP], loss, COMM_SUM);
    if (!v->loss_mask) return comm_all_reduce_double(t->mesh.loss, loss, COMM_AVG);
    counted = comm_all_reduce_double(t->mesh.loss, counted, COMM_SUM);
    return counted > 0 ? comm_all_reduce_double(t->mesh.loss, loss, COMM_SUM) / counted : 0;
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

// LoRA's dropout seed of microbatch mb of step: odd (never 0, which is no dropout), a function
// of the run's seed, the step and the microbatch alone.
static uint64_t dropout_seed(const Trainer *t, int step, int mb) {
    uint64_t key = rng_key((uint64_t)t->cfg.training.seed, "lora dropout");
    return (key ^ ((uint64_t)step << 20 | (uint64_t)mb)) | 1;
}

// One optimizer step over `accum` microbatches: sets m's loss, grad norm, lr and expert load.
static void train_step(Trainer *t, int step, StepMetrics *m) {
    ParamTable *params = &t->model.params;
    debug_server_phase("forward_backward");
    t->k->zero(params->shard_grad, params->shard_grad_numel * sizeof(float));
    double loss = 0, aux = 0;
    trainer_count_targets(t);
    for (int mb = 0; mb < t->accum; mb++) {
        const void *input = trainer_next_batch(t);
        t->dropout_seed = dropout_seed(t, step, mb);
        if (t->pipeline) {
            double stage_aux;
            loss += trainer_pipeline_step(t, input, &stage_aux) / t->accum;
            aux += stage_aux / t->accum;
            continue;
        }
        StepCtx s = step_ctx(t, &t->train, input);
        s.loss_scale = 1.0f / t->accum;
        s.loss_tokens = t->loss_tokens;
        s.dropout_seed = t->dropout_seed;
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
        trainer_wait_checkpoint(t);  // a save in flight completes: the message names it
        char kept[4400] = "no checkpoint was saved";
        int64_t latest = ckpt_latest_step(t->ckpt_folder);
        if (latest >= 0) {
            char path[4200];
            ckpt_path_for_step(path, sizeof path, t->ckpt_folder, latest);
            snprintf(kept, sizeof kept, "the latest checkpoint, %s, is intact", path);
        }
        die_user("step %d: loss is %s; stopped before updating the weights (%s)", step,
                 isnan(loss) ? "NaN" : "infinite", kept);
    }
    if (t->fsdp_on) fsdp_finish_step(&t->fsdp);
    if (t->ddp_on && !t->opt.outer.on) ddp_finish_step(params, t->mesh.group[MESH_DP_REPLICATE]);
    CommGroup *tp = t->tp_on ? t->tp.group : NULL, *fsdp = t->fsdp_on ? t->mesh.fsdp : NULL;
    grads_reduce_replicated(params, tp);
    grads_sum_copies(t->k, params, t->pp_tied);
    m->loss = loss;
    m->grad_norm = sqrt(grads_sum_squares(t->k, params, fsdp, tp, pp));
    grad_clip_to_norm(t->k, params->shard_grad, params->shard_grad_numel, m->grad_norm,
                      t->cfg.training.max_norm);
    m->lr = t->opt.lr * lr_schedule_factor(&t->schedule, step - t->lr_origin);
    balance_experts(t, m);
    adamw_step(&t->opt, t->k, params, m->lr);
    if (t->opt.outer.on) semi_sync_after_step(&t->semi_sync, t->k, params, &t->opt, step);
}

// A write the disk refused on some rank (core/errors.h's deferred error: a metrics record,
// TensorBoard event or trace): every rank stops here together, a save in flight completed, and
// the lowest such rank prints its line before any exits (a rank that exits first may have the
// launcher stop the others).
__attribute__((noreturn)) static void stop_on_failed_write(Trainer *t) {
    trainer_wait_checkpoint(t);
    int rank = t->mesh.world_rank, ranks = t->mesh.layout.world_size;
    const char *line = deferred_user_error();
    // The least failing rank, as the greatest of the negated ranks (comm has no minimum).
    double first = -comm_all_reduce_double(comm_world(), line ? -rank : -ranks, COMM_MAX);
    if (rank == (int)first) log_user_error("%s", line);
    comm_barrier(comm_world());
    exit(EXIT_USER_ERROR);
}

// Whether any rank has had a SIGTERM (core/preempt.h), the run to be saved and stopped; and whether
// any rank's disk refused a write: one all-reduce of one double over the world per step, so that
// every rank stops after the same step, to join the same save or to end the run
// (stop_on_failed_write).
static bool agree_to_stop(Trainer *t) {
    double mine = deferred_user_error() ? 2 : preempt_requested() ? 1 : 0;
    double all = comm_all_reduce_double(comm_world(), mine, COMM_MAX);
    if (all >= 2) stop_on_failed_write(t);
    return all > 0;
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

// The metrics logs (metrics.*): rank 0's, or every rank's with save_for_all_ranks.
static void open_metrics(const Trainer *t, MetricsLog *log) {
    const Config *c = &t->cfg;
    int rank = t->mesh.world_rank;
    *log = (MetricsLog){.color = metrics_use_color(c->metrics.disable_color_printing, comm_launched())};
    if (rank == 0 || c->metrics.save_for_all_ranks) {
        metrics_open(log, c->job.dump_folder, rank, t->progress.step);
        if (c->metrics.enable_tensorboard)
            metrics_open_tensorboard(log, c, rank, t->progress.step);
    }
}

// The steps since the last metrics line, whose throughput the next line reports.
typedef struct {
    double tokens_per_step;  // tokens per device of one step
    double peak_flops;       // the device's, for MFU (0: unknown)
    double start;            // when the first of them began
    int steps;
    bool said_above_peak;    // an MFU above 100% has been explained
    bool measured_again;     // the cpu's peak has been measured again, after an MFU above 100%
} Interval;

double trainer_tokens_per_device(const Trainer *t) {
    const int *size = t->mesh.layout.size;
    return (double)t->accum * t->train.B * t->train.step_T / (size[MESH_TP] * size[MESH_PP]);
}

static Interval interval_start(const Trainer *t) {
    const Config *c = &t->cfg;
    double tokens_per_step = trainer_tokens_per_device(t);
    // The peak first: the cpu measures its own, which the interval must not time.
    double peak = c->metrics.peak_flops > 0 ? c->metrics.peak_flops : t->k->peak_flops(false);
    return (Interval){.tokens_per_step = tokens_per_step, .peak_flops = peak,
                      .start = now_seconds()};
}

// The step's metrics with the interval's throughput, to the logs and the debug server; the
// next interval starts.
static void log_step(const Trainer *t, Interval *in, MetricsLog *log, StepMetrics *m) {
    double elapsed = now_seconds() - in->start;
    m->tokens_per_s = in->steps * in->tokens_per_step / elapsed;
    const ModelData *data = t->args.spec->data;  // an image is one example of T tokens
    m->images_per_s = data && data->images ? m->tokens_per_s / t->train.T : 0;
    m->tflops = m->tokens_per_s * t->model.flops_per_token / 1e12;
    m->mfu = in->peak_flops > 0 ? 100 * m->tflops * 1e12 / in->peak_flops : NAN;
    bool given = t->cfg.metrics.peak_flops > 0, measured = !given && t->k->host_memory;
    if (m->mfu > 100 && measured && !in->measured_again) {
        // the cpu was busy while its peak was measured: once more, now that the run outpaces
        // it (outside the interval's time: the next one starts after this)
        in->measured_again = true;
        double before = in->peak_flops;
        in->peak_flops = t->k->peak_flops(true);
        m->mfu = 100 * m->tflops * 1e12 / in->peak_flops;
        log_info("MFU: the run's %.1f GFLOP/s outpaced the GEMM peak measured at start, %.1f "
                 "GFLOP/s; measured again: %.1f GFLOP/s", m->tflops * 1e3, before / 1e9,
                 in->peak_flops / 1e9);
    }
    if (m->mfu > 100 && !in->said_above_peak) {  // the peak is wrong: say which and why, once
        in->said_above_peak = true;
        log_warn("MFU %.0f%% is above 100%%: its peak, %.1f GFLOP/s (%s), is below this run's "
                 "%.1f GFLOP/s of model FLOPs%s", m->mfu, in->peak_flops / 1e9,
                 given      ? "metrics.peak_flops"
                 : measured ? "measured at start and again when the run outpaced it"
                            : "the data sheet's",
                 m->tflops * 1e3,
                 measured ? "; the cpu is busy with other work: metrics.peak_flops sets a fixed "
                            "one"
                          : "");
    }
    m->peak_memory_gib = (double)t->k->memory_peak() / (1u << 30);
    metrics_write(log, m);
    debug_server_metrics(m);
    in->start = now_seconds();
    in->steps = 0;
}

// After the last step (or the preempted one): the last save completes, then the run's
// summary: time waiting on collectives, cp traffic, comm counters, run_summary.json.
static void finish(Trainer *t, MetricsLog *log, bool preempted, double started,
                   double waited_before) {
    profiler_finish();
    debug_server_phase("done");
    if (t->opt.outer.on) semi_sync_wait(&t->semi_sync);  // a fragment's sync left in flight
    trainer_close_checkpoint(t);  // the last save, if still in the background, completes
    if (preempted) log_preemption(t, (int)t->progress.step);
    metrics_close(log);
    (void)agree_to_stop(t);  // the last flush or trace may have failed; a SIGTERM is too late
    double elapsed = now_seconds() - started, waited = comm_wait_seconds() - waited_before;
    log_info("comm: %.2f s of %.2f s of training waiting on collectives (%.1f%%)", waited, elapsed,
             elapsed > 0 ? 100 * waited / elapsed : 0.0);
    if (t->cp_on) trainer_log_cp_traffic(t, elapsed);
    if (t->mesh.layout.world_size > 1) comm_report();  // one rank talks to no one
    if (t->mesh.world_rank == 0) trainer_write_run_summary(t);
}

void trainer_train(Trainer *t) {
    const Config *c = &t->cfg;
    start_profiler(t);
    double started = now_seconds(), waited_before = comm_wait_seconds();
    MetricsLog log;
    open_metrics(t, &log);
    Interval interval = interval_start(t);
    if (c->metrics.peak_flops <= 0 && t->k->host_memory && interval.peak_flops > 0)
        log_info("MFU is against this rank's measured GEMM peak in %s: %.1f GFLOP/s "
                 "(metrics.peak_flops sets another)", dtype_name(t->precision.param),
                 interval.peak_flops / 1e9);
    int first_step = (int)t->progress.step + 1;
    bool preempted = false;
    for (int step = first_step; step <= c->training.steps; step++) {
        StepMetrics m = {.step = step, .aux_loss = NAN, .precision = dtype_name(t->precision.param),
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
        interval.steps++;
        if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps)
            log_step(t, &interval, &log, &m);
        if (c->validation.enable && step % c->validation.freq == 0)
            metrics_write_validation(&log, step, validate(t));
        preempted = agree_to_stop(t) && step < c->training.steps;
        if (c->checkpoint.enable) trainer_maybe_checkpoint(t, step, preempted);
        profiler_step_end(step);
        if (preempted) break;
    }
    finish(t, &log, preempted, started, waited_before);
}
