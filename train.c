// titan: config -> model -> optimizer -> data -> training loop (DESIGN.md "Layout").
//
//   titan --config configs/debug_model.yaml [--section.key value ...] [--print-config]
//   titan tokenize --tokenizer bytes --out OUT.bin FILE...
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint/train_state.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/metrics.h"
#include "data/shard.h"
#include "data/tokenize.h"
#include "models/llama3/llama3.h"
#include "optim/optim.h"

typedef struct {
    Config cfg;
    const KernelOps *k;
    LlamaArgs args;
    Model model;
    Arena param_arena, grad_arena, optim_arena, act_arena;
    size_t act_bytes_other_mode;  // activation arena size under the other AC mode
    AdamW opt;
    LrSchedule schedule;
    TokenStream data;
    int B, T, accum;              // microbatch rows, sequence length, microbatches per step
    int32_t *window;              // (T + 1) one window being read
    int *tokens, *targets, *pos;  // (B*T), (B*T), (T)
    TrainProgress progress;
    char ckpt_folder[4096];
} Trainer;

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

static void setup_model(Trainer *t) {
    const Config *c = &t->cfg;
    if (!llama3_flavor(c->model.flavor, &t->args))
        die_user("model.flavor '%s' is not a llama3 flavor (known: %s)", c->model.flavor,
                 llama3_flavor_names());
    t->args.max_seq_len = (int)c->training.seq_len;  // as torchtitan's update_from_config
    t->args.tie_word_embeddings = c->model.tie_word_embeddings;
    t->args.rope_scaling = c->model.rope_scaling;
    bool full_ac = strcmp(c->activation_checkpoint.mode, "full") == 0;
    llama3_build(&t->model, &t->args, full_ac);
}

static void set_checkpointing(Model *m, bool on) {
    for (int i = 1; i + 1 < m->n_blocks; i++) m->blocks[i].checkpointed = on;
}

// Sizes every arena with the same calls that then carve it (core/arena.h), then allocates.
static void allocate_arenas(Trainer *t) {
    Model *m = &t->model;
    bool full_ac = m->blocks[1].checkpointed;
    set_checkpointing(m, !full_ac);
    t->act_bytes_other_mode = model_activation_bytes(m, t->k, t->B, t->T);
    set_checkpointing(m, full_ac);
    model_allocate(m, t->k, t->B, t->T, &t->param_arena, &t->grad_arena, &t->act_arena);
    arena_init_sizing(&t->optim_arena, "optimizer");
    adamw_allocate(&t->opt, m->params.numel, &t->optim_arena);
    arena_commit(&t->optim_arena);
    adamw_allocate(&t->opt, m->params.numel, &t->optim_arena);
}

static void log_memory(const Trainer *t) {
    const double MiB = 1024.0 * 1024.0;
    bool full_ac = t->model.blocks[1].checkpointed;
    size_t with_ac = full_ac ? t->act_arena.size : t->act_bytes_other_mode;
    size_t without_ac = full_ac ? t->act_bytes_other_mode : t->act_arena.size;
    log_info("memory: params %.1f MiB, grads %.1f MiB, optimizer %.1f MiB, activations %.1f MiB "
             "(activation_checkpoint full: %.1f MiB, none: %.1f MiB)",
             t->param_arena.size / MiB, t->grad_arena.size / MiB, t->optim_arena.size / MiB,
             t->act_arena.size / MiB, with_ac / MiB, without_ac / MiB);
}

static void setup_data(Trainer *t) {
    const Config *c = &t->cfg;
    if (!c->training.dataset_path)
        die_user("training.dataset_path is not set (a token shard file or directory; make one "
                 "with `titan tokenize`)");
    token_stream_open(&t->data, c->training.dataset_path);
    token_stream_num_windows(&t->data, t->T);
    t->window = xmalloc(((size_t)t->T + 1) * sizeof(int32_t));
    t->tokens = xmalloc((size_t)t->B * t->T * sizeof(int));
    t->targets = xmalloc((size_t)t->B * t->T * sizeof(int));
    t->pos = xmalloc((size_t)t->T * sizeof(int));
    for (int i = 0; i < t->T; i++) t->pos[i] = i;
}

// The next B windows of the stream become one microbatch (inputs and shifted targets).
static void next_microbatch(Trainer *t) {
    for (int r = 0; r < t->B; r++) {
        int64_t w = t->progress.windows_consumed++;
        token_stream_window(&t->data, w, t->T, t->window);
        for (int i = 0; i <= t->T; i++)
            if (t->window[i] < 0 || t->window[i] >= t->args.vocab_size)
                die_user("%s: token id %d in window %lld is outside the vocabulary of %s (%d)",
                         t->cfg.training.dataset_path, t->window[i], (long long)w,
                         t->cfg.model.flavor, t->args.vocab_size);
        memcpy(t->tokens + (size_t)r * t->T, t->window, (size_t)t->T * sizeof(int));
        memcpy(t->targets + (size_t)r * t->T, t->window + 1, (size_t)t->T * sizeof(int));
    }
}

static void save_checkpoint(Trainer *t, const char *path, bool with_optimizer) {
    CkptAttr attrs[LLAMA3_N_ATTRS];
    int n = llama3_describe(&t->args, attrs);
    char *yaml = config_to_yaml(&t->cfg);
    train_state_save(path, &t->model.params, with_optimizer ? &t->opt : NULL, t->progress,
                     (uint64_t)t->cfg.training.seed, yaml, attrs, n);
    free(yaml);
    log_info("checkpoint: saved %s", path);
}

// torchtitan's order: resume from this run's own checkpoint folder (checkpoint.load_step, or
// the latest step), else start from checkpoint.initial_load_path, else initialise from seed.
static void load_or_initialize(Trainer *t) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    snprintf(t->ckpt_folder, sizeof t->ckpt_folder, "%s/%s", t->cfg.job.dump_folder, ck->folder);
    char path[4096 + 64];
    int64_t step = -1;
    if (ck->enable && ck->load_step >= 0) {
        step = ck->load_step;
        ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
        FILE *f = fopen(path, "rb");
        if (!f) die_user("checkpoint.load_step %lld: no checkpoint %s", (long long)step, path);
        fclose(f);
    } else if (ck->enable) {
        step = ckpt_latest_step(t->ckpt_folder);
        ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
    }
    if (step >= 0) {
        train_state_load(path, &t->model.params, &t->opt, &t->progress);
        log_info("checkpoint: resumed from %s at step %lld", path, (long long)t->progress.step);
    } else if (ck->initial_load_path) {
        train_state_load(ck->initial_load_path, &t->model.params, NULL, NULL);
        log_info("checkpoint: initial weights from %s", ck->initial_load_path);
    } else {
        params_initialize(&t->model.params, (uint64_t)t->cfg.training.seed);
    }
}

static void setup(Trainer *t) {
    const Config *c = &t->cfg;
    t->k = kernels_backend("cpu");
    t->B = (int)c->training.local_batch_size;
    t->T = (int)c->training.seq_len;
    t->accum = c->training.global_batch_size < 0
                   ? 1
                   : (int)(c->training.global_batch_size / c->training.local_batch_size);
    setup_model(t);
    t->opt = (AdamW){.lr = c->optimizer.lr, .beta1 = c->optimizer.beta1,
                     .beta2 = c->optimizer.beta2, .eps = c->optimizer.eps,
                     .weight_decay = c->optimizer.weight_decay};
    double decay_ratio = isnan(c->lr_scheduler.decay_ratio) ? -1 : c->lr_scheduler.decay_ratio;
    t->schedule = lr_schedule_make((int)c->training.steps, (int)c->lr_scheduler.warmup_steps,
                                   decay_ratio, decay_type_of(c->lr_scheduler.decay_type),
                                   c->lr_scheduler.min_lr_factor);
    if (!c->checkpoint.create_seed_checkpoint) setup_data(t);
    allocate_arenas(t);
    load_or_initialize(t);
    log_info("model: llama3 %s, %zu parameters, %d layers, dim %d; batch %d x %d tokens x %d "
             "microbatches", c->model.flavor, t->model.params.numel, t->args.n_layers,
             t->args.dim, t->B, t->T, t->accum);
    char backend[256];
    t->k->describe(backend, sizeof backend);
    log_info("kernels: %s", backend);
    log_memory(t);
}

// One optimizer step over `accum` microbatches; returns the mean loss and sets *grad_norm.
static double train_step(Trainer *t, int step, double *grad_norm, double *lr) {
    memset(t->model.params.grad, 0, t->model.params.numel * sizeof(float));
    double loss = 0;
    for (int m = 0; m < t->accum; m++) {
        next_microbatch(t);
        arena_release(&t->act_arena, 0);
        StepCtx s = {.k = t->k, .act = &t->act_arena, .B = t->B, .T = t->T,
                     .tokens = t->tokens, .targets = t->targets, .pos = t->pos,
                     .loss_scale = 1.0f / t->accum};
        loss += model_forward_backward(&t->model, &s) / t->accum;
    }
    if (!isfinite(loss))
        die_user("step %d: loss is %s; stopped before updating the weights (checkpoints in %s "
                 "are intact)", step, isnan(loss) ? "NaN" : "infinite", t->ckpt_folder);
    *grad_norm = grad_clip_by_norm(t->k, &t->model.params, t->cfg.training.max_norm);
    *lr = t->opt.lr * lr_schedule_factor(&t->schedule, step);
    adamw_step(&t->opt, t->k, &t->model.params, *lr);
    return loss;
}

// torchtitan's policy: every `interval` steps, after step 1 if asked, and at the last step
// (model only under last_save_model_only); then only the keep_latest_k newest are kept.
static void maybe_checkpoint(Trainer *t, int step) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    bool last = step == t->cfg.training.steps;
    if (!(step % ck->interval == 0 || last || (step == 1 && ck->enable_first_step_checkpoint)))
        return;
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
    save_checkpoint(t, path, !(last && ck->last_save_model_only));
    if (ck->keep_latest_k > 0) ckpt_keep_latest(t->ckpt_folder, (int)ck->keep_latest_k);
}

static void train(Trainer *t) {
    const Config *c = &t->cfg;
    MetricsLog log;
    metrics_open(&log, c->job.dump_folder);
    double interval_start = now_seconds();
    int interval_steps = 0;
    for (int step = (int)t->progress.step + 1; step <= c->training.steps; step++) {
        StepMetrics m = {.step = step};
        m.loss = train_step(t, step, &m.grad_norm, &m.lr);
        t->progress.step = step;
        interval_steps++;
        if (step == 1 || step % c->metrics.log_freq == 0 || step == c->training.steps) {
            double elapsed = now_seconds() - interval_start;
            double tokens = (double)interval_steps * t->accum * t->B * t->T;
            m.tokens_per_s = tokens / elapsed;
            m.tflops = m.tokens_per_s * t->model.flops_per_token / 1e12;
            m.mfu = c->metrics.peak_flops > 0 ? 100 * m.tflops * 1e12 / c->metrics.peak_flops : NAN;
            m.peak_memory_gib = metrics_peak_rss_gib();
            metrics_write(&log, &m);
            interval_start = now_seconds();
            interval_steps = 0;
        }
        if (c->checkpoint.enable) maybe_checkpoint(t, step);
    }
    metrics_close(&log);
}

static void create_seed_checkpoint(Trainer *t) {
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, 0);
    save_checkpoint(t, path, false);
}

static void save_config(const Config *c, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
    config_print_yaml(c, f);
    if (fclose(f) != 0) die_user("job.save_config_file: cannot write %s: %s", path, strerror(errno));
}

// `--print-config` is the short form of `--job.print_config`.
static void expand_short_flags(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--print-config") == 0) argv[i] = "--job.print_config";
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "tokenize") == 0) return tokenize_main(argc - 1, argv + 1);
    expand_short_flags(argc, argv);
    Trainer *t = xcalloc(1, sizeof(Trainer));
    config_load_or_die(&t->cfg, argc, argv);
    if (t->cfg.job.print_config) {
        config_print_yaml(&t->cfg, stdout);
        return 0;
    }
    if (t->cfg.job.save_config_file) save_config(&t->cfg, t->cfg.job.save_config_file);
    setup(t);
    if (t->cfg.checkpoint.create_seed_checkpoint)
        create_seed_checkpoint(t);
    else
        train(t);
    return 0;
}
