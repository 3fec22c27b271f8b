// kernels_traced: a KernelOps table that times each op of a backend's table for the profiler
// (core/profiler.h). The trainer runs on it (train/setup.c) whenever
// profiling.enable_profiling is set; outside the profiled steps an op costs one more call and
// the test of a flag.
//
// Each op is one wrapper with the op's own parameters that calls the backend's op with them.
// The C preprocessor cannot take the types off a parameter list, so the Makefile writes the list
// of wrappers (build/.../gen/kernels/ops_traced.h) from kernels/ops.def with
// kernels/ops_traced.awk: KERNEL_OP_TRACED(ret, name, (params), (args)), or _VOID without ret.
#include "core/errors.h"
#include "core/profiler.h"
#include "kernels/kernels.h"

static const KernelOps *wrapped;  // the backend's table

// In a profiled step the queue is drained before the op starts and after it ends, so that its
// event holds its own run time on any backend (cuda's ops are asynchronous): -1 otherwise.
static double traced_start(void) {
    if (!profiler_recording()) return -1;
    wrapped->synchronize();
    return profiler_now();
}

static void traced_end(const char *op, double start) {
    if (start < 0) return;
    wrapped->synchronize();
    profiler_op(op, start);
}

#define KERNEL_OP_TRACED(ret, op, params, args)     \
    static ret traced_##op params {                 \
        double traced_began = traced_start();       \
        ret traced_result = wrapped->op args;       \
        traced_end(#op, traced_began);              \
        return traced_result;                       \
    }
#define KERNEL_OP_TRACED_VOID(op, params, args) \
    static void traced_##op params {            \
        double traced_began = traced_start();   \
        wrapped->op args;                       \
        traced_end(#op, traced_began);          \
    }
#include "kernels/ops_traced.h"

const KernelOps *kernels_traced(const KernelOps *backend) {
    static KernelOps table = {
#define KERNEL_OP(ret, op, params) .op = traced_##op,
#include "kernels/ops.def"
    };
    CHECK(!wrapped || wrapped == backend);  // one backend per process
    wrapped = backend;
    table.name = backend->name;
    table.host_memory = backend->host_memory;
    table.deterministic = backend->deterministic;
    return &table;
}
