// Step metrics: one console line per log step on rank 0 and the same figures, at full
// precision, as one JSON object per line in <dump_folder>/metrics.jsonl (rank 0), and, under
// metrics.save_for_all_ranks, in <dump_folder>/metrics_rank<r>.jsonl for every other rank r;
// with metrics.enable_tensorboard, as TensorBoard scalars too (core/tensorboard.h).
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/config.h"
#include "core/tensorboard.h"

typedef struct {
    int step;
    double loss, grad_norm, lr;
    double tokens_per_s;      // per device
    double images_per_s;      // per device, for a model of images (FLUX); 0: left out
    double tflops;            // achieved model TFLOP/s per device
    double mfu;               // tflops / peak, in percent; NAN when the peak is unknown
    double peak_memory_gib;   // the kernels' memory_peak: host RSS (cpu), device memory (cuda)
    // MoE (models/moe/balance.h): the step's busiest expert's load over its layer's mean (1:
    // balanced), in the worst MoE layer and averaged over them, from the global counts; 0: the
    // model has no MoE layers (and the fields are left out).
    double expert_load_max, expert_load_mean;
    double aux_loss;          // MoE: the balance loss (in the objective, not in loss); NAN: none
    // The compute dtype the step ran in (training.mixed_precision_param: "bf16" or "fp32",
    // core/dtype.h's names); NULL: left out.
    const char *precision;
    // The float8 recipe the step's float8 Linears ran (models/linear.h); NULL: every GEMM ran
    // at the backend's precision (the field is left out).
    const char *float8;
} StepMetrics;

typedef struct {
    FILE *jsonl;      // NULL on ranks that do not write a file
    char jsonl_path[4096];
    bool color;       // the console line in ANSI colors, as torchtitan's (a terminal, not disabled)
    TbWriter tb;      // tb.file NULL: no TensorBoard events
    char lr_tag[64];  // torchtitan's "lr/<optimizer>"
} MetricsLog;

// Opens rank's file in dump_folder. A run resumed at step `resumed_step` keeps the file's
// rows of steps up to it (the history before the checkpoint) and drops those after it, which
// the run writes again; resumed_step 0 (a fresh run) starts an empty file.
// Whether the console line is coloured: never with metrics.disable_color_printing
// (`disabled`) or NO_COLOR set and non-empty (no-color.org); otherwise when stdout is a
// terminal, except under an MPI launcher (`launched`: comm_launched), whose ranks' stdout may
// be a pty however mpirun's own output is redirected: there only with FORCE_COLOR set and
// non-empty (force-color.org).
bool metrics_use_color(bool disabled, bool launched);
void metrics_open(MetricsLog *log, const char *dump_folder, int rank, int64_t resumed_step);
// The same figures as TensorBoard scalars, under torchtitan's tags, in an events file of
// <dump_folder>/<metrics.save_tb_folder> (in its rank_<r> subfolder for every rank under
// metrics.save_for_all_ranks); from step resumed_step + 1 on, hiding the folder's events of
// the steps this run logs again (tb_open).
void metrics_open_tensorboard(MetricsLog *log, const Config *c, int rank, int64_t resumed_step);
void metrics_write(MetricsLog *log, const StepMetrics *m);
// The validation loss after `step` (torchtitan's "validate step" line).
void metrics_write_validation(MetricsLog *log, int step, double loss);
void metrics_close(MetricsLog *log);
