#include "parallel/semi_sync.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/errors.h"

// The parameters of blocks [first, end): [*p0, *p1) of the table.
static void params_of_blocks(const int *block_params, int first, int end, int *p0, int *p1) {
    int at = 0;
    for (int b = 0; b < first; b++) at += block_params[b];
    *p0 = at;
    for (int b = first; b < end; b++) at += block_params[b];
    *p1 = at;
}

bool semi_sync_plan(SemiSync *s, const SemiSyncConfig *config, const ParamTable *t,
                    const int *block_params, int n_blocks, char *err, size_t errlen) {
    int f = config->fragments, blocks = n_blocks;
    if (blocks % f) {
        snprintf(err, errlen, "semi_sync.num_fragments %d does not divide the model's %d blocks "
                 "(its %d layers, the embedding and the head, which torchtitan's fragments "
                 "count as a layer each): each fragment syncs an equal run of them", f, blocks,
                 blocks - 2);
        return false;
    }
    *s = (SemiSync){.config = *config, .period = config->sync_steps / f,
                    .first = xcalloc((size_t)f + 1, sizeof(size_t)),
                    .runs = xcalloc((size_t)t->count, sizeof(SemiSyncRun)),
                    .first_run = xcalloc((size_t)f + 1, sizeof(int)),
                    .first_param = xcalloc((size_t)f + 1, sizeof(int)), .pending_fragment = -1};
    int *fragment_of = xcalloc((size_t)t->count, sizeof(int)), n_runs = 0;
    for (int i = 0; i < f; i++) {
        int b0 = i * blocks / f, b1 = (i + 1) * blocks / f, p0, p1;
        params_of_blocks(block_params, b0, b1, &p0, &p1);
        s->first[i] = p0 < t->count ? t->items[p0].shard_offset : t->shard_numel;
        s->first_run[i] = n_runs;
        s->first_param[i] = p0;
        for (int j = p0; j < p1; j++) {
            const Param *p = &t->items[j];
            fragment_of[j] = i;
            if (p->buffer || p->frozen || !p->shard_numel) continue;
            SemiSyncRun *last = n_runs > s->first_run[i] ? &s->runs[n_runs - 1] : NULL;
            if (last && last->first + last->count == p->shard_offset) last->count += p->shard_numel;
            else s->runs[n_runs++] = (SemiSyncRun){p->shard_offset, p->shard_numel};
        }
    }
    s->first[f] = t->shard_numel;
    s->first_run[f] = n_runs;
    s->first_param[f] = t->count;
    for (int j = 0; j < t->count; j++) {
        const Param *p = &t->items[j];
        if (!p->copy || fragment_of[j] == fragment_of[params_find(t, p->name) - t->items]) continue;
        snprintf(err, errlen, "semi_sync.num_fragments %d puts %s's two copies (the model's "
                 "tied uses of one weight) in different fragments, which would sync them at "
                 "different steps: use 1 fragment", f, p->name);
        free(fragment_of);
        return false;
    }
    free(fragment_of);
    return true;
}

// The fragment whose sync completes after step `sync_step` (a multiple of the period).
static int fragment_at(const SemiSync *s, int sync_step) {
    return (sync_step / s->period - 1) % s->config.fragments;
}

bool semi_sync_window(const SemiSync *s, int step, int *from, int *to) {
    int into = step % s->period, opens = s->period - s->config.delay;
    if (s->config.delay == 0 || into < opens) return false;
    int f = fragment_at(s, step - into + s->period);
    *from = s->first_param[f], *to = s->first_param[f + 1];
    return true;
}

// delta = outer - local over fragment f's floats, its average over the replica groups started.
static void prepare(SemiSync *s, const KernelOps *k, const ParamTable *params, AdamW *opt,
                    int f) {
    size_t at = s->first[f], n = s->first[f + 1] - at;
    float *delta = opt->outer.delta + at;
    k->copy(delta, params->shard_data + at, n * sizeof(float));
    k->scale(delta, n, -1.0f);
    k->add(delta, opt->outer.weights + at, n);
    s->pending = comm_all_reduce_start(s->replicate, delta, n, COMM_AVG);
    s->pending_fragment = f;
    opt->outer.delta_from = s->first_param[f], opt->outer.delta_to = s->first_param[f + 1];
}

void semi_sync_wait(SemiSync *s) {
    if (s->pending_fragment >= 0) comm_wait(&s->pending);
}

// The outer step of fragment f on its averaged delta, run by run of trained parameters.
static void perform(SemiSync *s, const KernelOps *k, ParamTable *params, AdamW *opt, int f) {
    CHECK(s->pending_fragment == f);
    comm_wait(&s->pending);
    const SemiSyncConfig *c = &s->config;
    for (int r = s->first_run[f]; r < s->first_run[f + 1]; r++) {
        size_t at = s->runs[r].first;
        k->outer_sgd_update(opt->outer.weights + at, opt->outer.momentum + at,
                            params->shard_data + at, opt->outer.delta + at, s->runs[r].count,
                            (float)c->lr, (float)c->momentum, c->nesterov, (float)c->alpha);
    }
    s->pending_fragment = -1;
    opt->outer.delta_from = opt->outer.delta_to = 0;
}

void semi_sync_start(SemiSync *s, const KernelOps *k, const ParamTable *params, AdamW *opt,
                     CommGroup *replicate, int step, bool loaded_outer) {
    s->replicate = replicate;
    if (!loaded_outer)
        k->copy(opt->outer.weights, params->shard_data, params->shard_numel * sizeof(float));
    int from, to;
    if (!semi_sync_window(s, step, &from, &to)) return;
    int f = fragment_at(s, step - step % s->period + s->period);
    if (loaded_outer && opt->outer.delta_from == from && opt->outer.delta_to == to) {
        s->pending = (CommHandle){0};  // the checkpoint's delta is the average itself
        s->pending_fragment = f;
    } else {
        prepare(s, k, params, opt, f);
    }
}

void semi_sync_after_step(SemiSync *s, const KernelOps *k, ParamTable *params, AdamW *opt,
                          int step) {
    int into = step % s->period;
    if (into == (s->period - s->config.delay) % s->period)
        prepare(s, k, params, opt, fragment_at(s, step - into + (into ? s->period : 0)));
    if (into == 0) perform(s, k, params, opt, fragment_at(s, step));
}

size_t semi_sync_floats(const SemiSync *s, int steps) {
    size_t floats = 0;  // each sync whose all-reduce starts within the steps
    for (int step = s->period; step - s->config.delay <= steps; step += s->period) {
        int f = fragment_at(s, step);
        floats += s->first[f + 1] - s->first[f];
    }
    return floats;
}
