// Parameters: one table of named, shaped tensors drives allocation, gradients, optimizer state
// and checkpoints by offset arithmetic (llm.c's ParameterTensors, made data instead of code).
//
// A parameter's name is its torchtitan / Hugging Face-convertible fully-qualified name
// ("layers.3.attention.wq.weight") and its shape is the global shape. Later, parallel/ adds a
// placement per mesh dim; the data pointers then hold this rank's shard.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"

#define PARAM_NAME_MAX 96
#define PARAM_MAX_DIMS 2

// How a parameter is initialised (torchtitan's init_weights): a (truncated) normal or ones.
typedef enum { INIT_ONES, INIT_NORMAL, INIT_TRUNC_NORMAL } ParamInit;

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;
    int64_t shape[PARAM_MAX_DIMS];
    size_t numel;
    size_t offset;        // in floats, into every per-parameter buffer below
    ParamInit init;
    double init_std;      // for the normal inits
    double init_cutoff;   // truncation bound |x| <= cutoff (absolute, as torch's a/b)
    float *data;          // (shape) fp32 master weights
    float *grad;          // (shape)
} Param;

typedef struct {
    Param *items;
    int count, capacity;
    size_t numel;  // total floats over all parameters
    float *data, *grad;  // the flat buffers the per-parameter pointers point into
} ParamTable;

void params_init(ParamTable *t, int capacity);
void params_free(ParamTable *t);
// Appends a parameter; name is printf-formatted. Returns its index.
__attribute__((format(printf, 6, 7))) int params_add(ParamTable *t, ParamInit init,
                                                      double init_std, int ndim,
                                                      const int64_t *shape, const char *fmt, ...);
Param *params_find(ParamTable *t, const char *name);
// Carves data and grad buffers (numel floats each) from the arenas and sets every pointer.
void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena);
// Fills every parameter from (seed, name) as its init says.
void params_initialize(ParamTable *t, uint64_t seed);
