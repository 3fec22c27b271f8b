#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "train.h"

// <dump_folder>/run_summary.json: what this run allocated and sent (rank 0's view), in the
// terms `titan --estimate` predicts, so the two can be compared.
void trainer_write_run_summary(Trainer *t) {
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/run_summary.json", t->cfg.job.dump_folder);
    FILE *f = fopen(path, "w");
    if (!f) die_user("cannot write %s: %s", path, strerror(errno));
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                             &t->comm_arena};
    const char *names[] = {"params", "grads", "optimizer", "activations", "comm"};
    fprintf(f, "{\"world_size\": %d, \"steps\": %lld, \"arena_bytes\": {",
            t->mesh.layout.world_size, (long long)t->progress.step);
    for (int i = 0; i < 5; i++) fprintf(f, "%s\"%s\": %zu", i ? ", " : "", names[i], arenas[i]->size);
    CommGroup *groups[] = {t->mesh.fsdp, t->mesh.group[MESH_DP_REPLICATE], t->mesh.group[MESH_TP],
                           t->mesh.loss};
    fprintf(f, "}, \"comm_bytes\": {");
    for (int i = 0; i < 4; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", comm_name(groups[i]),
                (unsigned long long)comm_bytes(groups[i]));
    fprintf(f, "}}\n");
    if (fclose(f) != 0) die_user("cannot write %s: %s", path, strerror(errno));
}

// What one rank hands to each group's collectives per step (comm.h's accounting), from the
// plans of FSDP and TP: the analytic volume that a real run's comm report must equal.
typedef struct {
    const char *group;
    uint64_t bytes;
} GroupBytes;

static int comm_per_step(Trainer *t, GroupBytes out[4]) {
    int n = 0;
    const int *size = t->mesh.layout.size;
    bool ac = t->model.blocks[1].checkpointed;
    if (t->fsdp_on) {
        FsdpEstimate e = fsdp_estimate(&t->fsdp);
        uint64_t micro = e.all_gather_forward + e.all_gather_backward + e.reduce_scatter;
        out[n++] = (GroupBytes){"fsdp", t->accum * micro + sizeof(double)};  // + the grad norm
        if (size[MESH_DP_REPLICATE] > 1) out[n++] = (GroupBytes){"dp_replicate", e.replicate_all_reduce};
    }
    if (t->tp_on) {
        uint64_t micro = llama3_tp_bytes_per_microbatch(&t->args, size[MESH_TP], t->train.B,
                                                        t->train.T, ac, t->tp.hooks.loss_parallel);
        size_t replicated = grads_replicated_floats(&t->model.params, t->fsdp_on ? &t->fsdp : NULL);
        out[n++] = (GroupBytes){"tp", t->accum * micro + 4 * replicated + sizeof(double)};
    }
    out[n++] = (GroupBytes){"loss", sizeof(double)};  // the step's mean loss
    return n;
}

// `titan --estimate`: every arena per rank, FLOPs and communication per step, for any flavor
// and layout, from the sizing passes of the real allocation (nothing is allocated).
void trainer_print_estimate(Trainer *t) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    const int *size = t->mesh.layout.size;
    printf("estimate: llama3 %s on %d ranks (pp %d, dp_replicate %d, dp_shard %d, cp %d, tp %d), "
           "batch %d x %d x %d microbatches per rank, activation_checkpoint %s\n",
           t->cfg.model.flavor, t->mesh.layout.world_size, size[MESH_PP],
           size[MESH_DP_REPLICATE], size[MESH_DP_SHARD], size[MESH_CP], size[MESH_TP],
           t->train.B, t->train.T, t->accum, t->cfg.activation_checkpoint.mode);
    const Arena *arenas[] = {&t->param_arena, &t->grad_arena, &t->optim_arena, &t->act_arena,
                             &t->comm_arena};
    size_t total = 0;
    printf("  %-12s %16s %12s\n", "arena", "bytes per rank", "GiB");
    for (int i = 0; i < 5; i++) {
        printf("  %-12s %16zu %12.3f\n", arenas[i]->name ? arenas[i]->name : "comm",
               arenas[i]->peak, arenas[i]->peak / GiB);
        total += arenas[i]->peak;
    }
    printf("  %-12s %16zu %12.3f\n", "total", total, total / GiB);
    double tokens = (double)t->accum * t->train.B * t->train.T / size[MESH_TP];
    printf("  FLOPs per step per rank: %.4g (%.4g per token, torchtitan's 6N + 12 L H Q T)\n",
           tokens * t->model.flops_per_token, t->model.flops_per_token);
    GroupBytes groups[4];
    int n = comm_per_step(t, groups);
    printf("  %-12s %16s %12s\n", "group", "bytes per step", "GiB");
    for (int i = 0; i < n; i++)
        printf("  %-12s %16llu %12.3f\n", groups[i].group, (unsigned long long)groups[i].bytes,
               groups[i].bytes / GiB);
}
