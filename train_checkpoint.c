#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

// The trained state (every parameter's shard and its AdamW moments) as host memory, which
// initialisation and checkpoints read and write: the tensors themselves on the cpu backend;
// on a device, host copies, downloaded to be saved or uploaded once loaded or initialised.
typedef struct {
    ParamTable params;
    AdamW opt;
    bool staged;  // copies (else params and opt are the trainer's own)
} HostState;

static HostState host_state_open(Trainer *t, bool download) {
    HostState h = {.params = t->model.params, .opt = t->opt};
    if (t->k->host_memory) return h;
    size_t n = t->model.params.shard_numel, bytes = n * sizeof(float);
    h.staged = true;
    params_view(&h.params, &t->model.params, xcalloc(n, sizeof(float)));
    h.opt.exp_avg = xcalloc(n, sizeof(float));
    h.opt.exp_avg_sq = xcalloc(n, sizeof(float));
    if (download) {
        t->k->download(h.params.shard_data, t->model.params.shard_data, bytes);
        t->k->download(h.opt.exp_avg, t->opt.exp_avg, bytes);
        t->k->download(h.opt.exp_avg_sq, t->opt.exp_avg_sq, bytes);
    }
    return h;
}

// upload: the host state changed (load, initialisation): the trainer takes it, its optimizer
// step count included.
static void host_state_close(Trainer *t, HostState *h, bool upload) {
    if (upload) t->opt.step = h->opt.step;  // h->opt is a copy even when not staged
    if (!h->staged) return;
    if (upload) {
        size_t bytes = t->model.params.shard_numel * sizeof(float);
        t->k->upload(t->model.params.shard_data, h->params.shard_data, bytes);
        t->k->upload(t->opt.exp_avg, h->opt.exp_avg, bytes);
        t->k->upload(t->opt.exp_avg_sq, h->opt.exp_avg_sq, bytes);
    }
    free(h->params.shard_data);
    free(h->opt.exp_avg);
    free(h->opt.exp_avg_sq);
    params_free(&h->params);
}

static void save_checkpoint(Trainer *t, const char *path, bool with_optimizer) {
    if (t->train.B > 0) t->progress.windows_consumed = loader_position(&t->train.loader);
    CkptAttr attrs[LLAMA3_N_ATTRS];
    int n = llama3_describe(&t->args, attrs);
    char *yaml = config_to_yaml(&t->cfg);
    HostState h = host_state_open(t, true);
    train_state_save(path, &h.params, with_optimizer ? &h.opt : NULL, t->progress,
                     (uint64_t)t->cfg.training.seed, yaml, attrs, n);
    host_state_close(t, &h, false);
    free(yaml);
    log_info("checkpoint: saved %s", path);
}

// torchtitan's last_save_in_hf: the last, model-only save as a Hugging Face folder
// <folder>/step-<N>-hf (model.safetensors in checkpoint.export_dtype, config.json) in place of
// step-<N>.h5; the name keeps it apart from the step files that resuming reads.
static void save_hf(Trainer *t, int step) {
    char dir[4096 + 64];
    snprintf(dir, sizeof dir, "%s/step-%d-hf", t->ckpt_folder, step);
    const char *dtype = t->cfg.checkpoint.export_dtype;
    HostState h = host_state_open(t, true);
    llama3_save_hf(dir, &t->args, &h.params,
                   strcmp(dtype, "bfloat16") ? SAFETENSORS_F32 : SAFETENSORS_BF16);
    host_state_close(t, &h, false);
    log_info("checkpoint: saved %s (Hugging Face, %s)", dir, dtype);
}

// torchtitan's order: resume from this run's own checkpoint folder (checkpoint.load_step, or
// the latest step), else start from checkpoint.initial_load_path, else initialise from seed.
void trainer_load_or_initialize(Trainer *t) {
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
    HostState h = host_state_open(t, false);
    if (step >= 0) {
        train_state_load(path, &h.params, &h.opt, &t->progress);
        loader_set_position(&t->train.loader, t->progress.windows_consumed);
        log_info("checkpoint: resumed from %s at step %lld", path, (long long)t->progress.step);
    } else if (ck->initial_load_path && ck->initial_load_in_hf) {
        llama3_load_hf(ck->initial_load_path, &t->args, &h.params);
        log_info("checkpoint: initial weights from Hugging Face %s", ck->initial_load_path);
    } else if (ck->initial_load_path) {
        train_state_load(ck->initial_load_path, &h.params, NULL, NULL);
        log_info("checkpoint: initial weights from %s", ck->initial_load_path);
    } else {
        params_initialize(&h.params, (uint64_t)t->cfg.training.seed);
    }
    host_state_close(t, &h, true);
}

// torchtitan's policy: every `interval` steps, after step 1 if asked, and at the last step
// (model only under last_save_model_only); a preempted run's final step whatever the interval
// (full: the run is to be resumed); then only the keep_latest_k newest are kept.
void trainer_maybe_checkpoint(Trainer *t, int step, bool preempted) {
    const CheckpointSection *ck = &t->cfg.checkpoint;
    bool last = step == t->cfg.training.steps;
    if (!(preempted || step % ck->interval == 0 || last ||
          (step == 1 && ck->enable_first_step_checkpoint)))
        return;
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, step);
    if (last && ck->last_save_in_hf) save_hf(t, step);
    else save_checkpoint(t, path, !(last && ck->last_save_model_only));
    if (ck->keep_latest_k > 0) ckpt_keep_latest(t->ckpt_folder, (int)ck->keep_latest_k);
}

void trainer_create_seed_checkpoint(Trainer *t) {
    char path[4096 + 64];
    make_dirs(t->ckpt_folder);
    ckpt_path_for_step(path, sizeof path, t->ckpt_folder, 0);
    save_checkpoint(t, path, false);
}
