// Checkpoints in the trainer, torchtitan's policy over checkpoint/train_state.h: what a run
// starts from (its own latest checkpoint, checkpoint.initial_load_path, or the seed), when it
// saves and which it keeps, the background saves of async_mode async, HF exports, and the
// seed checkpoint (checkpoint.create_seed_checkpoint).
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint/async.h"
#include "convert/convert.h"
#include "train/train.h"

// The trained state (every parameter's shard, its AdamW moments, its average and the outer
// state of semi-synchronous training when kept) as host memory, which initialisation and checkpoints read and write: the tensors themselves
// on the cpu backend; on a device, host copies, downloaded to be saved or uploaded once loaded
// or initialised.
typedef struct {
    ParamTable params;
    AdamW opt;
    bool staged;      // copies (else params and opt are the trainer's own)
    bool ema_loaded;  // a load filled opt.ema (else it starts from the weights)
} HostState;

// Host copies of the trainer's state, sized by its shards; filled by host_state_download.
static HostState host_state_alloc(const Trainer *t) {
    size_t n = t->model.params.shard_numel;
    HostState h = {.opt = t->opt, .staged = true};
    size_t nf4 = t->model.params.nf4_bytes;
    params_view(&h.params, &t->model.params, xcalloc(n, sizeof(float)),
                nf4 ? xmalloc(nf4) : NULL);
    h.opt.exp_avg = xcalloc(t->opt.first_numel, sizeof(float));
    h.opt.exp_avg_sq = xcalloc(t->opt.second_numel, sizeof(float));
    h.opt.ema = t->opt.ema ? xcalloc(n, sizeof(float)) : NULL;
    OuterState *o = &h.opt.outer;
    o->weights = o->on ? xcalloc(n, sizeof(float)) : NULL;
    o->momentum = o->on ? xcalloc(n, sizeof(float)) : NULL;
    o->delta = o->on ? xcalloc(n, sizeof(float)) : NULL;
    return h;
}

// The outer state's three tensors, the trainer's (t) and h's, for copying between them.
static int outer_tensors(const Trainer *t, const HostState *h, float *theirs[3], float *ours[3]) {
    if (!t->opt.outer.on) return 0;
    const OuterState *a = &t->opt.outer, *b = &h->opt.outer;
    theirs[0] = a->weights, theirs[1] = a->momentum, theirs[2] = a->delta;
    ours[0] = b->weights, ours[1] = b->momentum, ours[2] = b->delta;
    return 3;
}

// The trainer's state now into h's copies (a memcpy on the cpu backend), its step count included.
static void host_state_download(const Trainer *t, HostState *h) {
    size_t bytes = t->model.params.shard_numel * sizeof(float);
    t->k->download(h->params.shard_data, t->model.params.shard_data, bytes);
    t->k->download(h->params.nf4, t->model.params.nf4, t->model.params.nf4_bytes);
    t->k->download(h->opt.exp_avg, t->opt.exp_avg, t->opt.first_numel * sizeof(float));
    t->k->download(h->opt.exp_avg_sq, t->opt.exp_avg_sq, t->opt.second_numel * sizeof(float));
    if (h->opt.ema) t->k->download(h->opt.ema, t->opt.ema, bytes);
    float *theirs[3], *ours[3];
    for (int i = 0, n = outer_tensors(t, h, theirs, ours); i < n; i++)
        t->k->download(ours[i], theirs[i], bytes);
    h->opt.step = t->opt.step;
    h->opt.outer.delta_from = t->opt.outer.delta_from, h->opt.outer.delta_to = t->opt.outer.delta_to;
}

static HostState host_state_open(Trainer *t, bool download) {
    if (t->k->host_memory) return (HostState){.params = t->model.params, .opt = t->opt};
    HostState h = host_state_alloc(t);
    if (download) host_state_download(t, &h);
    return h;
}

// upload: the host state changed (load, initialisation): the trainer takes it, its optimizer
// step count included.
static void host_state_close(Trainer *t, HostState *h, bool upload) {
    if (upload) t->opt.step = h->opt.step;  // h->opt is a copy even when not staged
    if (upload) {  // what the load found of the outer state
        OuterState *o = &t->opt.outer;
        o->loaded = h->opt.outer.loaded;
        o->delta_from = h->opt.outer.delta_from, o->delta_to = h->opt.outer.delta_to;
    }
    if (!h->staged) return;
    float *theirs[3], *ours[3];
    int n_outer = outer_tensors(t, h, theirs, ours);
    if (upload) {
        size_t bytes = t->model.params.shard_numel * sizeof(float);
        t->k->upload(t->model.params.shard_data, h->params.shard_data, bytes);
        t->k->upload(t->model.params.nf4, h->params.nf4, t->model.params.nf4_bytes);
        t->k->upload(t->opt.exp_avg, h->opt.exp_avg, t->opt.first_numel * sizeof(float));
        t->k->upload(t->opt.exp_avg_sq, h->opt.exp_avg_sq, t->opt.second_numel * sizeof(float));
        if (h->opt.ema) t->k->upload(t->opt.ema, h->opt.ema, bytes);
        for (int i = 0; i < n_outer; i++) t->k->upload(theirs[i], ours[i], bytes);
    }
    for (int i = 0; i < n_outer; i++) free(ours[i]);
    free(h->params.shard_data);
    free(h->params.nf4);
    free(h->opt.exp_avg);
    free(h->opt.exp_avg_sq);
    free(h->opt.ema);
    params_free(&h->params);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// The attributes a checkpoint records about the run: the architecture (what a resume must
// match), the sequence length (the unit of the data position) and the mesh (for the reader).
#define RUN_N_ATTRS (MODEL_MAX_ATTRS + 1 + MESH_NDIMS)

static int model_attrs(const Trainer *t, CkptAttr out[MODEL_MAX_ATTRS]) {
    int n = t->args.spec->describe(&t->args, out);
    CHECK(n <= MODEL_MAX_ATTRS);
    return n;
}

static int run_attrs(const Trainer *t, CkptAttr out[RUN_N_ATTRS]) {
    static char mesh_names[MESH_NDIMS][32];
    int n = model_attrs(t, out);
    out[n++] = (CkptAttr){.name = "training.seq_len", .type = CKPT_INT, .i = t->train.T};
    for (int d = 0; d < MESH_NDIMS; d++) {
        snprintf(mesh_names[d], sizeof mesh_names[d], "mesh.%s", MESH_DIM_NAMES[d]);
        out[n++] = (CkptAttr){.name = mesh_names[d], .type = CKPT_INT,
                              .i = t->mesh.layout.size[d]};
    }
    return n;
}

// A checkpoint of another model (flavor, tied embeddings, RoPE scaling) or, when resuming, of
// another sequence length is refused in one line before a tensor is read. require: every
// attribute must be there (titan's own step files); else those present are compared (a file
// from elsewhere for initial_load_path).
static void run_attrs_check(const Trainer *t, const char *path, bool require, bool with_data) {
    CkptAttr want[RUN_N_ATTRS];
    int n = with_data ? run_attrs(t, want) : model_attrs(t, want);
    for (int i = 0; i < n; i++) {
        const CkptAttr *a = &want[i];
        if (strncmp(a->name, "mesh.", 5) == 0) continue;  // any layout loads
        if (!require && !ckpt_has_attr(path, a->name)) continue;
        bool same = a->type == CKPT_INT ? ckpt_read_int(path, a->name) == a->i
                                        : ckpt_read_double(path, a->name) == a->d;
        if (same) continue;
        char have[64], this_run[64];
        if (a->type == CKPT_INT) {
            snprintf(have, sizeof have, "%lld", (long long)ckpt_read_int(path, a->name));
            snprintf(this_run, sizeof this_run, "%lld", (long long)a->i);
        } else {
            snprintf(have, sizeof have, "%.17g", ckpt_read_double(path, a->name));
            snprintf(this_run, sizeof this_run, "%.17g", a->d);
        }
        die_user("checkpoint %s was written with %s %s, this run has %s (%s)", path, a->name, have,
                 this_run, strncmp(a->name, "model.", 6) == 0
                               ? "another model: use the model.* settings it was trained with"
                               : "the data position counts windows of seq_len + 1 tokens");
    }
}

// One checkpoint write: everything it reads, so that it can run on another thread while the
// trainer goes on (checkpoint.async_mode async) as well as on the trainer's own.
typedef struct {
    HostState state;            // the trainer's tensors (sync) or copies staged at the step
    char path[4096 + 64];
    bool with_optimizer;
    TrainProgress progress;
    uint64_t seed;
    char *yaml;                 // the resolved config
    CkptAttr attrs[RUN_N_ATTRS];
    int n_attrs;
    const char *prune_folder;   // non-NULL: then only the keep_latest newest step files stay
    int keep_latest;
    bool failed;                // the write failed (a full disk), agreed by every rank
    char err[2048];             // then its line (ckpt_try_save)
} SaveJob;

// The parts of a save that do not depend on the step: the run's description.
static void save_job_describe(Trainer *t, SaveJob *j) {
    j->n_attrs = run_attrs(t, j->attrs);
    j->seed = (uint64_t)t->cfg.training.seed;
    j->yaml = config_to_yaml(&t->cfg);
}

// The step's part; retention (checkpoint.keep_latest_k) is rank 0's alone, after the write.
static void save_job_prepare(Trainer *t, SaveJob *j, const char *path, bool with_optimizer,
                             bool prune) {
    if (t->train.B > 0) t->progress.windows_consumed = trainer_data_position(t);
    snprintf(j->path, sizeof j->path, "%s", path);
    j->with_optimizer = with_optimizer;
    j->progress = t->progress;
    bool deletes = prune && t->cfg.checkpoint.keep_latest_k > 0;
    j->prune_folder = deletes ? t->ckpt_folder : NULL;
    j->keep_latest = (int)t->cfg.checkpoint.keep_latest_k;
    j->failed = false;
}

static void save_job_write(void *arg, MPI_Comm comm) {
    SaveJob *j = arg;
    // A model-only save keeps the average: it is the model's weights too, the ones to export.
    AdamW ema_only = {.ema = j->state.opt.ema};
    const AdamW *opt = j->with_optimizer ? &j->state.opt : ema_only.ema ? &ema_only : NULL;
    j->failed = !train_state_try_save(j->path, &j->state.params, opt, j->progress, j->seed,
                                      j->yaml, j->attrs, j->n_attrs, comm, j->err, sizeof j->err);
    if (!j->failed && j->prune_folder) ckpt_keep_latest(j->prune_folder, j->keep_latest);
}

static void save_checkpoint(Trainer *t, const char *path, bool with_optimizer, bool prune) {
    double started = now_ms();
    SaveJob j;
    save_job_describe(t, &j);
    save_job_prepare(t, &j, path, with_optimizer, prune);
    j.state = host_state_open(t, true);
    save_job_write(&j, MPI_COMM_WORLD);
    if (j.failed) ckpt_save_fail(j.err, MPI_COMM_WORLD);
    host_state_close(t, &j.state, false);
    free(j.yaml);
    log_info("checkpoint: saved %s in %.1f ms", path, now_ms() - started);
}

// checkpoint.async_mode async: the job of the save in flight, its state staged in copies
// allocated once; the writer thread (checkpoint/async.h) owns it until it is waited for.
struct AsyncSave {
    CkptAsync writer;
    SaveJob job;
    int step;
    double staged_ms, step_ms;  // the checkpointing step's stall, and a step without one
};

static bool async_on(const Trainer *t) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    return ck->enable && strcmp(ck->async_mode, "async") == 0 && !ck->create_seed_checkpoint;
}

size_t trainer_checkpoint_staging_bytes(const Trainer *t) {
    // host_state_alloc's: params (QLoRA's blobs too), moments, the average, the outer state's
    // three
    const ParamTable *p = &t->model.params;
    size_t shards = 1 + (t->opt.ema_decay > 0) + 3 * t->opt.outer.on;
    size_t floats = shards * p->shard_numel + t->opt.first_numel + t->opt.second_numel;
    return async_on(t) ? floats * sizeof(float) + p->nf4_bytes : 0;
}

// Made after the load: from here on the writer is the only thread that calls HDF5.
static void async_save_open(Trainer *t) {
    AsyncSave *a = t->async_save = xcalloc(1, sizeof(AsyncSave));
    ckpt_async_init(&a->writer);
    save_job_describe(t, &a->job);
    a->job.state = host_state_alloc(t);
    host_state_download(t, &a->job.state);  // touched now: the first save's stall is a copy's
}

// Waits for the save in flight, if any, and reports what it cost the training thread. A failed
// save (its line agreed by every rank's writer) stops the run only where every rank waits
// (agreed: a save's start, the run's end), since ranks see a write finish at different steps.
static void async_save_wait(Trainer *t, bool agreed) {
    AsyncSave *a = t->async_save;
    double started = now_ms();
    bool waited = a && ckpt_async_wait(&a->writer);
    if (a && agreed && a->job.failed) ckpt_save_fail(a->job.err, a->writer.comm);
    if (!waited || a->job.failed) return;
    log_info("checkpoint: saved %s: step %d staged in %.1f ms (a step takes %.1f ms), written "
             "in the background in %.1f ms (training waited %.1f ms for it)", a->job.path,
             a->step, a->staged_ms, a->step_ms, a->writer.write_seconds * 1e3,
             now_ms() - started);
}

void trainer_wait_checkpoint(Trainer *t) { async_save_wait(t, true); }

static void async_save_start(Trainer *t, const char *path, bool with_optimizer, int step) {
    AsyncSave *a = t->async_save;
    trainer_wait_checkpoint(t);  // at most one in flight: its job and staging are reused
    double started = now_ms();
    save_job_prepare(t, &a->job, path, with_optimizer, true);
    host_state_download(t, &a->job.state);
    a->staged_ms = now_ms() - started;
    a->step_ms = t->step_seconds * 1e3;
    a->step = step;
    ckpt_async_start(&a->writer, save_job_write, &a->job);
}

void trainer_close_checkpoint(Trainer *t) {
    AsyncSave *a = t->async_save;
    if (!a) return;
    trainer_wait_checkpoint(t);
    ckpt_async_free(&a->writer);
    host_state_close(t, &a->job.state, false);
    free(a->job.yaml);
    free(a);
    t->async_save = NULL;
}

static bool not_adapter(const Param *p) { return !lora_adapter_of(p->name, NULL, 0, NULL); }

// torchtitan's last_save_in_hf: the last, model-only save as a Hugging Face folder
// <folder>/step-<N>-hf (model.safetensors in checkpoint.export_dtype, config.json, the run's
// tokenizer: convert_hf_tokenizer) in place of step-<N>.h5; the name keeps it apart from the
// step files that resuming reads. HF files hold whole tensors, which no one rank has: every
// rank saves its shards into the step file as usual, then rank 0 reads the whole tensors back
// from it, writes the folder and removes it.
static void save_hf(Trainer *t, int step, const char *path) {
    save_checkpoint(t, path, false, false);
    if (t->mesh.world_rank != 0) return;
    char dir[4096 + 64];
    snprintf(dir, sizeof dir, "%s/step-%d-hf", t->ckpt_folder, step);
    const char *dtype = t->cfg.checkpoint.export_dtype;
    ParamTable base, global;  // LoRA's adapters merged into their weights, as convert --to hf
    params_select(&base, &t->model.params, not_adapter);
    params_global_view(&global, &base);
    params_free(&base);
    train_state_load(path, &global, NULL, NULL);
    lora_merge(path, &t->cfg, &global, "/model/");
    HfExport how = {.dtype = strcmp(dtype, "bfloat16") ? SAFETENSORS_F32 : SAFETENSORS_BF16};
    t->args.spec->save_hf(dir, &t->args, &global, how);
    SYS_CHECK(unlink(path));
    free(global.data);
    params_free(&global);
    char note[1024];
    convert_hf_tokenizer(t->cfg.model.tokenizer_path, dir, note, sizeof note);
    log_info("checkpoint: saved %s (Hugging Face, %s) with %s", dir, dtype, note);
}

// checkpoint.exclude_from_loading names torchtitan's state keys; titan's state has these.
static bool excluded(const Trainer *t, const char *state) {
    const StringList *l = &t->cfg.checkpoint.exclude_from_loading;
    for (int i = 0; i < l->count; i++) {
        const char *name = l->items[i];
        if (strcmp(name, "optimizer") && strcmp(name, "dataloader") && strcmp(name, "lr_scheduler"))
            die_user("checkpoint.exclude_from_loading: '%s' is not a state titan saves (optimizer, "
                     "lr_scheduler, dataloader)", name);
    }
    for (int i = 0; i < l->count; i++)
        if (strcmp(l->items[i], state) == 0) return true;
    return false;
}

// The full training state of path: model, optimizer (unless excluded; a file without it is a
// model-only save, resumed only with consent), progress, data position (unless excluded) and
// the LR schedule's clock (restarted when excluded).
// The optimizer state of path is this run's optimizer's: the same optimizer.name and, under
// Muon, the same matrices (Muon keeps its momentum where AdamW keeps exp_avg).
static void optimizer_check(const Trainer *t, const char *path) {
    Config saved;
    model_spec_of_checkpoint(path, &saved);
    const OptimizerSection *a = &saved.optimizer, *b = &t->cfg.optimizer;
    const char *key = NULL, *had = NULL, *has = NULL;
    if (strcmp(a->name, b->name))
        key = "optimizer.name", had = a->name, has = b->name;
    else if (!strcmp(b->name, "Muon") && strcmp(a->muon_pattern, b->muon_pattern))
        key = "optimizer.muon_pattern", had = a->muon_pattern, has = b->muon_pattern;
    if (key)
        die_user("checkpoint %s holds the state of %s %s, this run has %s: resume with the "
                 "same, or add optimizer to checkpoint.exclude_from_loading to start this "
                 "optimizer afresh", path, key, had, has);
    config_free(&saved);
}

// Semi-synchronous state in path (parallel/semi_sync.h), which comes with the optimizer's:
// its fragments' schedule must be this run's (their syncs in flight and the delta saved depend
// on it); a run without semi-sync, or one that excludes the optimizer, takes replica group 0's
// weights and says what it leaves.
static void semi_sync_check(Trainer *t, HostState *h, const char *path, int64_t step,
                            bool optimizer) {
    if (!ckpt_has(path, "/semi_sync")) return;
    if (!t->opt.outer.on || !optimizer) {
        log_info("checkpoint: %s was saved under semi-synchronous training: this run (%s) takes "
                 "replica group 0's weights%s, not the outer state or the other groups'", path,
                 t->opt.outer.on ? "checkpoint.exclude_from_loading optimizer"
                                 : "semi_sync.method none",
                 optimizer ? " and optimizer state" : "");
        return;
    }
    Config saved;
    model_spec_of_checkpoint(path, &saved);
    static const char *const KEYS[] = {"semi_sync.sync_steps", "semi_sync.num_fragments",
                                       "semi_sync.fragment_sync_delay"};
    const SemiSyncSection *a = &saved.semi_sync, *b = &t->cfg.semi_sync;
    const int64_t had[] = {a->sync_steps, a->num_fragments, a->fragment_sync_delay},
                  has[] = {b->sync_steps, b->num_fragments, b->fragment_sync_delay};
    for (int i = 0; i < 3; i++)
        if (had[i] != has[i])
            die_user("checkpoint %s was saved with %s %lld, this run has %lld: the fragments' "
                     "syncs in flight follow it; resume with the same", path, KEYS[i],
                     (long long)had[i], (long long)has[i]);
    config_free(&saved);
    OuterState *o = &h->opt.outer;  // the delta the file should hold, if any
    if (!semi_sync_window(&t->semi_sync, (int)step, &o->delta_from, &o->delta_to))
        o->delta_from = o->delta_to = 0;
}

static void load_full(Trainer *t, HostState *h, const char *path) {
    bool optimizer = !excluded(t, "optimizer");
    int64_t step = ckpt_read_int_in(path, "step", 0, INT_MAX);
    if (optimizer && step > 0 && !train_state_has_optimizer(path))
        die_user("checkpoint %s holds the model only (a last_save_model_only save): resuming it "
                 "at step %lld would restart AdamW from zero moments; add optimizer to "
                 "checkpoint.exclude_from_loading to accept that", path, (long long)step);
    optimizer = optimizer && train_state_has_optimizer(path);
    if (optimizer) optimizer_check(t, path);
    semi_sync_check(t, h, path, step, optimizer);
    h->ema_loaded = train_state_load(path, &h->params, optimizer ? &h->opt : NULL, &t->progress);
    if (excluded(t, "dataloader")) t->progress.windows_consumed = 0;
    if (excluded(t, "lr_scheduler")) t->lr_origin = (int)t->progress.step;
    trainer_data_set_position(t, t->progress.windows_consumed);
}

// Resuming this run's own step file: it must be the checkpoint its name says.
static void resume(Trainer *t, HostState *h, const char *path, int64_t step) {
    run_attrs_check(t, path, true, true);
    // A model with a data module of its own (FLUX) draws its data order and noise from the
    // seed at each position, so a new seed resumed at a position is another run's stream,
    // which only a restarted data position may take. (Token batches use it only to initialise.)
    int64_t seed = ckpt_read_int(path, "seed");
    if (t->args.spec->data && seed != t->cfg.training.seed && !excluded(t, "dataloader"))
        die_user("checkpoint %s was written with training.seed %lld, this run has %lld: use the "
                 "seed it was trained with, or add dataloader to "
                 "checkpoint.exclude_from_loading to start a new data order", path,
                 (long long)seed, (long long)t->cfg.training.seed);
    int64_t saved = ckpt_read_int_in(path, "step", 0, INT_MAX);
    if (saved != step)
        die_user("checkpoint %s records step %lld, not the %lld of its name (a renamed or "
                 "damaged file)", path, (long long)saved, (long long)step);
    double started = now_ms();
    load_full(t, h, path);
    log_info("checkpoint: resumed from %s at step %lld in %.1f ms", path,
             (long long)t->progress.step, now_ms() - started);
}

// checkpoint.initial_load_in_hf: the folder's config.json, read as `convert --to titan` reads
// it, must describe this run's model: the model.* attributes a titan checkpoint is checked on,
// but for those HF has no key for (MoE's expert bias, a training buffer titan adds) and RoPE
// scaling's factors where neither scales. A lone .safetensors file is checked against the
// config.json beside it, when there is one.
static void hf_config_check(const Trainer *t, const char *path) {
    char dir[4096], config[4096 + 16];
    snprintf(dir, sizeof dir, "%s", path);
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode)) {
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
        snprintf(config, sizeof config, "%s/config.json", dir);
        if (access(config, F_OK) != 0) return;
    }
    ModelArgs hf;
    char why[1024];
    if (!t->args.spec->try_args_from_hf(dir, &hf, why, sizeof why)) die_user("%s", why);
    CkptAttr want[MODEL_MAX_ATTRS], have[MODEL_MAX_ATTRS];
    int n = t->args.spec->describe(&t->args, want), m = t->args.spec->describe(&hf, have);
    bool scaled = false;
    for (int i = 0; i < n; i++) {
        const CkptAttr *a = &want[i], *b = NULL;
        for (int j = 0; j < m && !b; j++)
            if (!strcmp(have[j].name, a->name)) b = &have[j];
        if (!strcmp(a->name, "model.rope_scaling")) scaled = a->i || (b && b->i);
        if (!strcmp(a->name, "model.moe_expert_bias") ||
            (!scaled && !strncmp(a->name, "model.rope_", 11) && strcmp(a->name, "model.rope_theta")))
            continue;
        if (b && (a->type == CKPT_INT ? a->i == b->i : a->d == b->d)) continue;
        char there[64] = "nothing", here[64];
        if (a->type == CKPT_INT) snprintf(here, sizeof here, "%lld", (long long)a->i);
        else snprintf(here, sizeof here, "%.10g", a->d);
        if (b && b->type == CKPT_INT) snprintf(there, sizeof there, "%lld", (long long)b->i);
        else if (b) snprintf(there, sizeof there, "%.10g", b->d);
        die_user("checkpoint.initial_load_path %s/config.json describes another model: %s %s "
                 "there, %s in this run (use the model.* settings it was trained with)", dir,
                 a->name, there, here);
    }
}

// The base model's parameters under LoRA: all but the adapters (the frozen weights and the
// buffers).
static bool lora_base(const Param *p) { return p->frozen || p->buffer; }

// Under LoRA a file without the adapters (a pre-training run's checkpoint, Hugging Face
// weights) is the base model's: its weights are loaded, and nothing else (its optimizer state
// and step are another run's); the adapters start from their init.
// A file with some of the run's adapters but not all is another LoRA run's: refused.
static bool base_only(const Trainer *t, const char *path) {
    if (!t->args.lora) return false;
    if (t->cfg.checkpoint.initial_load_in_hf) return true;
    char name[PARAM_NAME_MAX + 16], missing[PARAM_NAME_MAX] = "";
    int has = 0, adapters = 0;
    for (int i = 0; i < t->model.params.count; i++) {
        const Param *p = &t->model.params.items[i];
        if (lora_base(p)) continue;
        snprintf(name, sizeof name, "/model/%s", p->name);
        adapters++;
        if (ckpt_has(path, name)) has++;
        else if (!missing[0]) snprintf(missing, sizeof missing, "%s", p->name);
    }
    if (has > 0 && has < adapters)
        die_user("checkpoint %s has %d of this run's %d LoRA adapters but not %s: another LoRA "
                 "run's (set lora.target_modules as it did)", path, has, adapters, missing);
    return has == 0;
}

static void initial_load(Trainer *t, HostState *h) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    const char *path = ck->initial_load_path;
    ParamTable all = h->params;
    bool base = base_only(t, path);
    if (base) {  // the adapters' init, then the base's weights over the rest
        params_initialize(&all, (uint64_t)t->cfg.training.seed);
        params_select(&h->params, &all, lora_base);
    }
    if (ck->initial_load_in_hf) {  // whole tensors: each rank keeps its shards of them
        hf_config_check(t, path);
        ParamTable global;
        params_global_view(&global, &h->params);
        t->args.spec->load_hf(path, &t->args, &global);
        params_shards_from_global(&h->params, &global);
        free(global.data);
        params_free(&global);
        log_info("checkpoint: initial weights from Hugging Face %s%s", path,
                 base ? "; LoRA adapters initialised" : "");
    } else if (base) {
        run_attrs_check(t, path, false, false);
        train_state_load(path, &h->params, NULL, NULL);
        log_info("checkpoint: base weights from %s; LoRA adapters initialised", path);
    }
    if (base) params_free(&h->params);
    h->params = all;
    if (base || ck->initial_load_in_hf) return;
    run_attrs_check(t, path, false, !ck->initial_load_model_only);
    if (ck->initial_load_model_only) {
        train_state_load(path, &h->params, NULL, NULL);
        log_info("checkpoint: initial weights from %s", path);
    } else {
        load_full(t, h, path);
        log_info("checkpoint: initial state from %s at step %lld", path,
                 (long long)t->progress.step);
    }
}

static void checkpoint_folder_set(Trainer *t) {
    snprintf(t->ckpt_folder, sizeof t->ckpt_folder, "%s/%s", t->cfg.job.dump_folder,
             t->cfg.checkpoint.folder);
}

// A save killed mid-write (a SIGKILL, a crash) leaves its step-N.h5.tmp; each can be as large as
// a checkpoint. None can be this run's own: its first save, async or not, starts after step 1.
static void remove_unfinished_saves(Trainer *t) {
    char names[1024];
    int n = ckpt_remove_unfinished(t->ckpt_folder, names, sizeof names);
    if (n > 0)
        log_info("checkpoint: removed %d unfinished save%s left by an earlier run: %s", n,
                 n > 1 ? "s" : "", names);
}

// torchtitan's order: resume from this run's own checkpoint folder (checkpoint.load_step, or
// the latest step), else start from checkpoint.initial_load_path, else initialise from seed.
// Each rank reads its own shards, whatever layout saved them.
void trainer_load_or_initialize(Trainer *t) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    checkpoint_folder_set(t);
    if (ck->enable) remove_unfinished_saves(t);
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
    excluded(t, "");  // its names are checked whether or not there is anything to load
    if (ck->load_step < 0 && step >= t->cfg.training.steps && !ck->create_seed_checkpoint) {
        run_attrs_check(t, path, true, true);  // this run's own checkpoint, not another job's
        log_info("checkpoint: %s is at training.steps %lld: this run has finished, nothing to "
                 "train", path, (long long)t->cfg.training.steps);
        t->finished = true;
        return;
    }
    if (async_on(t) && !comm_threads_concurrent())
        die_user("checkpoint.async_mode async: this MPI library does not grant "
                 "MPI_THREAD_MULTIPLE, which the background writer needs; use disabled");
    HostState h = host_state_open(t, false);
    if (step >= 0) resume(t, &h, path, step);
    else if (ck->initial_load_path) initial_load(t, &h);
    else params_initialize(&h.params, (uint64_t)t->cfg.training.seed);
    // The average starts from the weights it first sees (torch's AveragedModel copies them).
    if (h.opt.ema && !h.ema_loaded)
        memcpy(h.opt.ema, h.params.shard_data, t->model.params.shard_numel * sizeof(float));
    host_state_close(t, &h, true);
    if (t->opt.outer.on)
        semi_sync_start(&t->semi_sync, t->k, &t->model.params, &t->opt,
                        t->mesh.group[MESH_DP_REPLICATE], (int)t->progress.step,
                        t->opt.outer.loaded);
    if (async_on(t)) async_save_open(t);
}

// torchtitan's policy: every `interval` steps, after step 1 if asked, and at the last step
// (model only under last_save_model_only); a preempted run's final step whatever the interval
// (full: the run is to be resumed); then only the keep_latest_k newest are kept. Under
// async_mode async the save is staged here and written in the background; a finished
// background save is reported at the first step boundary after it.
void trainer_maybe_checkpoint(Trainer *t, int step, bool preempted) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    if (t->async_save && ckpt_async_finished(&t->async_save->writer)) async_save_wait(t, false);
    bool last = step == t->cfg.training.steps;
    if (!(preempted || step % ck->interval == 0 || last ||
          (step == 1 && ck->enable_first_step_checkpoint)))
        return;
    debug_server_phase("checkpoint");
    if (t->opt.outer.on) semi_sync_wait(&t->semi_sync);  // its delta is saved averaged
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
    bool with_optimizer = !(last && ck->last_save_model_only);
    if (last && ck->last_save_in_hf) {
        trainer_wait_checkpoint(t);  // retention follows every earlier save
        save_hf(t, step, path);
        if (ck->keep_latest_k > 0) ckpt_keep_latest(t->ckpt_folder, (int)ck->keep_latest_k);
    } else if (t->async_save) {
        async_save_start(t, path, with_optimizer, step);
    } else {
        save_checkpoint(t, path, with_optimizer, true);
    }
}

void trainer_create_seed_checkpoint(Trainer *t) {
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, 0);
    save_checkpoint(t, path, false, false);
}
