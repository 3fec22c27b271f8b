// Per-rank Chrome traces of chosen steps, and per-step memory snapshots (the profiling.* keys,
// torchtitan's; docs/design.md "Observability").
//
// Traces (profiling.enable_profiling): torchtitan's schedule. With profile_freq F and
// profiler_active A, the A steps that end at each multiple of F are recorded, and after step
// s = k F the trace of those steps is written to <trace_folder>/iteration_<s>/rank<r>_trace.json
// (a run that ends inside a window writes what it recorded, as torch.profiler does on exit).
// profiler_warmup only has to fit (F >= warmup + A, torchtitan's check): this recorder starts
// in no time and needs no warm-up steps.
//
// A trace is Chrome's trace event format, JSON object form, which Perfetto and chrome://tracing
// open: "X" (complete) events with ts and dur in microseconds of CLOCK_MONOTONIC (ranks on one
// machine line up), pid the world rank, and:
// - on the thread that runs the step (tid 0; other threads that record get 1, 2, ...): each
//   step ("ProfilerStep#N", as torch.profiler names it; the whole loop iteration, validation
//   and checkpointing included), each block call ("<block> <phase>", models/model.c: the FSDP
//   hooks around it included), each kernels op (kernels/traced.c; on cuda each profiled op
//   synchronizes the stream before and after, so its duration is its device time plus the
//   launch, and the profiled steps run slower), and each wait on a collective ("wait <op>",
//   from the wait's start to the completion this rank saw);
// - on one track per communication group (tid 100 g + lane: a collective started while another
//   of its group is in flight takes the next lane, since the events of one track must nest):
//   each collective, from its start to the moment this rank saw it complete (a test or a
//   wait), with args op, group, bytes (what parallel/comm.h's comm_bytes counts), seq (the
//   flight recorder's), complete, and for a send, a receive or a broadcast its peer (the
//   root); one still in flight when the trace is written ends there, complete false.
// otherData holds the steps and, per group, the comm counters' bytes and ops over them (read
// at the window's start and end): the trace's collectives sum to them.
//
// Memory snapshots (profiling.enable_memory_snapshot): after each step s = k F (torchtitan's
// memory_snapshot_freq defaults to profile_freq), <snapshot_folder>/iteration_<s>/
// rank<r>_memory_snapshot.json holds each arena's committed bytes, the bytes used at the end
// of the step, and the most used during the step, each split by dtype (core/arena.h).
//
// Only profiled steps record, into a heap buffer that grows as they need (the one allocation
// in a step, and only in those); otherwise each hook costs one test of a flag. Events may come
// from any thread (a mutex orders them); the step loop's calls come from one.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "core/arena.h"

// One communication group's counters (parallel/comm.h's comm_bytes and comm_ops).
typedef struct {
    const char *name;
    uint64_t bytes, ops;
} ProfilerCounter;

typedef struct {
    int rank;                     // the world rank: the trace's pid and the files' names
    int freq;                     // profiling.profile_freq
    int active;                   // profiling.profiler_active; 0: no traces
    const char *trace_folder;     // <dump_folder>/<save_traces_folder>
    const char *snapshot_folder;  // <dump_folder>/<save_memory_snapshot_folder>; NULL: none
    Arena *const *arenas;         // (n_arenas) what a snapshot reports
    int n_arenas;
    // Fills out (max) with every group's counters; returns how many groups there are.
    int (*counters)(ProfilerCounter *out, int max);
} ProfilerConfig;

// The calling thread becomes the step's (tid 0). Strings and arenas must outlive the run.
void profiler_configure(const ProfilerConfig *config);
// Around each training step, the whole loop iteration: a step of a trace window starts (or
// continues) recording; the window's last writes the trace; snapshots are taken at step_end.
void profiler_step_begin(int step);
void profiler_step_end(int step);
// Writes the trace of a window the run ended inside (nothing when none is open).
void profiler_finish(void);

// Whether a profiled step is recording: the event calls below do nothing otherwise.
bool profiler_recording(void);
// Now, on the trace's clock (microseconds).
double profiler_now(void);
// An op of the kernels table that ran from start until now.
void profiler_op(const char *name, double start);
// A block call from start until now: label names the block ("transformer.3"), phase the call
// ("forward", "recompute", "backward", "backward_input", "backward_weight"), index its place.
void profiler_block(const char *label, const char *phase, int index, double start);
// A collective starting now: its id for profiler_collective_end (0 when not recording).
int64_t profiler_collective_begin(const char *op, const char *group, uint64_t bytes, int64_t seq,
                                  int peer);
// The collective of id (0, or one from an earlier window: ignored) is complete now.
void profiler_collective_end(int64_t id);
// A wait on the collective op of group (flight-recorder seq) from start until now.
void profiler_wait(const char *op, const char *group, int64_t seq, double start);
