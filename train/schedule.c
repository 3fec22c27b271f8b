// The pipeline schedule the trainer runs: generated from parallelism.pipeline_parallel_schedule
// or read from its CSV file, checked (parallel/pp/check.c); and `titan --print-schedule
// [--microbatches N]`, which prints it without training.
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/files.h"
#include "parallel/pp/executor.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/stage.h"
#include "train/train.h"

// The microbatch count a pipeline step runs: training.local_batch_size rows in microbatches of
// pipeline_parallel_microbatch_size (or `--microbatches N`).
static int schedule_microbatches(const Config *c, int flag) {
    if (flag) return flag;
    int64_t b = c->training.local_batch_size, mb = c->parallelism.pipeline_parallel_microbatch_size;
    if (b % mb != 0 || b / mb > INT32_MAX)
        die_user("training.local_batch_size %lld is not a multiple of "
                 "parallelism.pipeline_parallel_microbatch_size %lld", (long long)b, (long long)mb);
    return (int)(b / mb);
}

// A schedule's CSV: rows of actions, far below the cap (8 ranks x 64 microbatches of
// 1F1B take 20 KB).
#define SCHEDULE_CSV_MAX_BYTES (64u << 20)

static char *read_text(const char *path) {
    char *text, why[256];
    size_t len;
    FileReadResult r = file_read_all(path, SCHEDULE_CSV_MAX_BYTES, &text, &len);
    if (r != FILE_READ_OK)
        die_user("parallelism.pipeline_parallel_schedule_csv %s %s", path,
                 file_read_why(r, SCHEDULE_CSV_MAX_BYTES, "a schedule", why, sizeof why));
    if (strlen(text) != len)
        die_user("parallelism.pipeline_parallel_schedule_csv %s has a NUL byte at byte %zu",
                 path, strlen(text));
    return text;
}

// The stages per rank pipeline_parallel_layers_per_stage asks for, with the flavor's layers;
// 0 when it is null (the schedule's own count).
static int stages_per_rank(const Config *c) {
    const ParallelismSection *p = &c->parallelism;
    if (p->pipeline_parallel_layers_per_stage == CONFIG_INT_UNSET) return 0;
    ModelArgs args;
    trainer_model_args(c, &args);
    char err[512];
    int v = pp_stages_per_rank(model_shape(&args).n_layers, (int)p->pipeline_parallel_degree,
                               (int)p->pipeline_parallel_layers_per_stage,
                               (int)p->pipeline_parallel_first_stage_less_layers,
                               (int)p->pipeline_parallel_last_stage_less_layers, err, sizeof err);
    if (v < 0) die_user("%s", err);
    return v;
}

// The schedule the config names (or its CSV) for m microbatches, proved by the checker: exits
// 2 with one line naming the rank and action when it is not sound.
void trainer_load_schedule(const Config *c, int m, PpSchedule *s, PpReport *r) {
    const ParallelismSection *p = &c->parallelism;
    int pp = (int)p->pipeline_parallel_degree, v = stages_per_rank(c);
    const char *csv = p->pipeline_parallel_schedule_csv;
    char err[1200];
    if (csv && *csv) {
        char *text = read_text(csv);
        if (!pp_schedule_load_csv(s, text, csv, err, sizeof err)) die_user("%s", err);
        free(text);
        if (s->ranks != pp || s->microbatches != m)
            die_user("%s: the schedule has %d ranks and %d microbatches; the config runs %d ranks "
                     "(pipeline_parallel_degree) and %d microbatches", csv, s->ranks,
                     s->microbatches, pp, m);
        if (v && s->stages != v * pp)
            die_user("%s: the schedule has %d stages; pipeline_parallel_layers_per_stage %lld "
                     "makes %d", csv, s->stages, (long long)p->pipeline_parallel_layers_per_stage,
                     v * pp);
    } else if (!pp_schedule_generate(s, p->pipeline_parallel_schedule, pp, m, v, err,
                                     sizeof err)) {
        if (v)
            die_user("parallelism.pipeline_parallel_layers_per_stage %lld makes %d stages per "
                     "rank: %s", (long long)p->pipeline_parallel_layers_per_stage, v, err);
        die_user("parallelism.pipeline_parallel_schedule: %s", err);
    }
    if (!pp_schedule_check(s, r, err, sizeof err))
        die_user("%s: %s", csv && *csv ? csv : p->pipeline_parallel_schedule, err);
    // Ranks exchange activations with their mesh neighbours only (Mesh.pp_prev, pp_next): what
    // the loop and V placements give, and what a CSV must keep to.
    for (int q = 0; q < s->ranks; q++)
        for (int i = 0; i < s->count[q]; i++) {
            const PpAction *a = &s->actions[q][i];
            if (a->peer < 0 || a->peer == (q + 1) % pp || a->peer == (q + pp - 1) % pp) continue;
            char name[48];
            die_user("%s: rank %d, action %d (%s): rank %d is not a pipeline neighbour of rank %d",
                     csv, q, i, pp_action_name(a, name, sizeof name), a->peer, q);
        }
}

int trainer_schedule_microbatches(const Config *c) { return schedule_microbatches(c, 0); }

// `titan --print-schedule`: the checked schedule as a table.
void trainer_print_schedule(const Config *c, int microbatches_flag) {
    const ParallelismSection *p = &c->parallelism;
    int m = schedule_microbatches(c, microbatches_flag);
    const char *csv = p->pipeline_parallel_schedule_csv;
    PpSchedule s;
    PpReport r;
    trainer_load_schedule(c, m, &s, &r);
    printf("schedule %s: %d ranks, %d stages, %d microbatches\n",
           csv && *csv ? csv : p->pipeline_parallel_schedule, s.ranks, s.stages, m);
    pp_schedule_print(&s, &r, stdout);
    int *regions = xcalloc((size_t)s.ranks, sizeof(int));
    pp_region_counts(&s, &r, regions);
    printf("activation regions per rank (training):");
    for (int q = 0; q < s.ranks; q++) printf(" %d", regions[q]);
    printf("\n");
    char order[512];
    bool in_order = pp_schedule_channels_in_order(&s, order, sizeof order);
    printf("receives in send order (what NCCL needs): %s\n", in_order ? "yes" : order);
    bool runs = in_order && pp_schedule_check_nccl(&s, regions, P2P_CHANNELS, order, sizeof order);
    printf("runs on NCCL (a stream per peer and direction): %s\n", runs ? "yes" : order);
    free(regions);
    pp_report_free(&r);
    pp_schedule_free(&s);
}
