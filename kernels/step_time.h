// A rank's step time predicted from what the step does (its FLOPs by kind, the bytes its
// elementwise ops and optimizer move, the ops it issues, each group's collective bytes) against
// a device's rates (kernels/device.h): what `titan --estimate` prints and scripts/bench_gpu.sh
// compares with a measured step. Pure arithmetic, checked against hand computations in
// tests/unit/test_step_time.c; the step's figures come from the plan (train/report.c).
//
// The model, each term's seconds:
//   GEMM: FLOPs / the device's GEMM rate in their precision (float8 falls back to bf16's where
//     the device has none, as a run without float8 GEMMs would);
//   attention: the FLOPs its kernels do / the device's attention rate;
//   elementwise, float8 casts and optimizer: bytes / the device's rate for each;
//   ops: ops issued x the device's issue cost;
//   compute: their sum, times the ranks that share the device;
//   communication: each group's bytes / the link it crosses (the network when the group spans
//     more devices than a node holds); tensor and expert parallel's block the compute
//     (blocking), the rest (FSDP's gathers and reduce-scatters, data parallel's reduction,
//     context parallel's ring, the pipeline's sends) are overlapped with it and only what
//     exceeds it is exposed;
//   step: (compute + blocking + exposed) / (1 - the pipeline's bubble).
#pragma once

#include <stdbool.h>

#include "kernels/device.h"

enum { STEP_MAX_GROUPS = 8 };

typedef struct {
    const char *group;  // "fsdp", "tp", ...
    double bytes;       // this rank's bytes per step
    bool blocking;      // the compute waits for it (tp, ep, the loss)
    int span;           // consecutive ranks the group spans (the mesh's stride x size)
} GroupWork;

typedef struct {
    double gemm_flops[GEMM_PRECISIONS];  // this rank's, per step, by operand precision
    double attention_flops;              // done by its kernels, per step
    double elementwise_bytes, cast_bytes, optimizer_bytes;
    double ops;  // ops issued per step
    GroupWork groups[STEP_MAX_GROUPS];
    int n_groups;
    double bubble;  // the pipeline's idle fraction; 0 without one
    int sharing;    // ranks on the device (its compute shared by them)
} StepWork;

typedef struct {
    double gemm, attention, elementwise, casts, optimizer, ops;  // seconds each, for one rank
    double compute;     // their sum x sharing
    double blocking;    // blocking collectives' seconds
    double overlapped;  // overlapped collectives' seconds
    double exposed;     // of those, what the compute does not hide
    double step;        // the predicted step time
} StepTime;

StepTime predict_step_time(const StepWork *w, const DeviceTable *d);
