// The pipeline executor: runs one rank's action list of a checked schedule (schedule.h) for one
// optimizer step, whatever schedule produced it. Compute calls back into the stages (the
// trainer runs the model's blocks); activations and gradients move between ranks with
// non-blocking sends and receives, posted where the list says and waited for only when the
// compute that needs them starts, so communication overlaps compute.
//
// Memory: every (stage, microbatch) in flight has its own activation arena, a region, from
// its input's arrival (or its forward) until its backward (B, or W after I) is done; a region
// given back is reused, oldest first, once the sends made from it have been received. The
// region count per rank starts at the checker's peak live activations and grows until the
// checker, playing this very policy, proves the run cannot deadlock (pp_region_counts), so
// the activation memory of 1F1B stays flat in the microbatch count while GPipe's grows. A stage's
// input and its output gradient always live in its own region (copied when the neighbouring
// stage is on this rank), so no region is read after it is released.
#pragma once

#include <stddef.h>

#include "core/arena.h"
#include "kernels/kernels.h"
#include "parallel/comm.h"
#include "parallel/pp/schedule.h"
#include "protocols/block.h"

// What the executor calls to compute. region: the index of the (stage, microbatch)'s region,
// whose arena is act (the microbatch's StepCtx.act); it stays the same from forward to the end
// of backward.
typedef struct PpStageFns PpStageFns;
struct PpStageFns {
    // Stage `stage` forward of microbatch mb: x (rows, dim) its input, NULL on stage 0.
    // Returns its output (rows, dim) carved from act, NULL on the last stage.
    float *(*forward)(const PpStageFns *f, int stage, int mb, int region, Arena *act,
                      const float *x);
    // Its backward (phase BACKWARD, BACKWARD_INPUT or BACKWARD_WEIGHT): dy (rows, dim) the
    // output's gradient, NULL on the last stage and for the weight part. Returns the input's
    // gradient (rows, dim) carved from act, NULL on stage 0 and for the weight part.
    float *(*backward)(const PpStageFns *f, int stage, int mb, int region, Arena *act,
                       BlockPhase phase, const float *dy);
};

typedef struct PpExecutor PpExecutor;

// Bytes (by dtype) of one region on rank `rank`: the most any of its stages' microbatches
// needs, input and gradient buffers included, counted by running each once on a sizing arena
// (no MPI, no compute: also what --estimate reports).
ArenaBytes pp_region_bytes(const PpSchedule *s, int rank, size_t width, const PpStageFns *fns);
// regions (s->ranks): the fewest regions per rank, from the peak live activations up, with
// which the checker proves the executor neither deadlocks nor runs out (each rank reuses the
// oldest region given back, once its sends were received: pp_schedule_check_regions).
void pp_region_counts(const PpSchedule *s, const PpReport *r, int *regions);

// An executor for rank `rank` of schedule s (checked; r its report) over the pp group (rank
// `rank` in it, its neighbours prev and next: every send and recv of its list must be with one
// of them), moving activations of `width` floats of backend k; its regions are
// pp_region_counts' of pp_region_bytes each.
PpExecutor *pp_executor_create(const PpSchedule *s, const PpReport *r, int rank, int prev,
                               int next, CommGroup *group, size_t width, const KernelOps *k,
                               const PpStageFns *fns);
// Runs this rank's actions once: every microbatch forward (and backward) through its stages,
// the regions carved anew from acts (committed with room for them; executors of several
// schedules, training's and evaluation's, take turns in it).
void pp_executor_step(PpExecutor *e, Arena *acts);
void pp_executor_free(PpExecutor *e);
