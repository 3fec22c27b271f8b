// Parameters: one table of named, shaped tensors drives allocation, gradients, optimizer state
// and checkpoints by offset arithmetic (llm.c's ParameterTensors, made data instead of code).
//
// A parameter's name is its torchtitan / Hugging Face-convertible fully-qualified name
// ("layers.3.attention.wq.weight"). It records its global shape, its placement over the
// tensor-parallel group and the local shape that placement leaves this rank (a DTensor in C):
// shape, numel and the data pointers are the local shard's, so FSDP, the optimizer and every
// per-parameter buffer see local tensors.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"

#define PARAM_NAME_MAX 96
#define PARAM_MAX_DIMS 2

// How a parameter is initialised (torchtitan's init_weights): a (truncated) normal or ones.
typedef enum { INIT_ONES, INIT_NORMAL, INIT_TRUNC_NORMAL } ParamInit;

// Over the tp group (DTensor's Shard(dim) / Replicate): the global tensor is cut into `size`
// equal slices along dim of which this rank holds slice `rank`; dim TP_REPLICATE: every rank
// holds all of it.
#define TP_REPLICATE (-1)
typedef struct {
    int dim, rank, size;
} TpPlacement;

typedef struct {
    char name[PARAM_NAME_MAX];
    int ndim;
    int64_t global_shape[PARAM_MAX_DIMS];
    TpPlacement tp;
    int64_t shape[PARAM_MAX_DIMS];  // local: global_shape / tp.size along tp.dim
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
// view = t's parameters over other storage: data (t->numel floats; grads NULL), e.g. a host
// copy of tensors that live on a device. Free it with params_free.
void params_view(ParamTable *view, const ParamTable *t, float *data);
// Makes p's placement `tp` (parameters start replicated on a group of 1): its local shape,
// numel and every offset of the table follow. Before params_allocate.
void params_place_tp(ParamTable *t, Param *p, TpPlacement tp);
size_t param_global_numel(const Param *p);
// The global flattened (row-major) index of p's local element i.
size_t param_global_index(const Param *p, size_t i);
// Fills every parameter (its local shard) from (seed, name) as its init says.
void params_initialize(ParamTable *t, uint64_t seed);
// dst (count) = elements [first, first + count) of p's initial value (row-major, global
// indices): the same numbers params_initialize writes there, so a shard is filled alone.
void param_fill(const Param *p, uint64_t seed, size_t first, size_t count, float *dst);
// dst (count) = p's local elements [first, first + count) (row-major in its tp shard; whole
// local rows when the columns are split): what params_initialize writes there, so an FSDP
// shard of the local tensor is filled alone.
void param_fill_local(const Param *p, uint64_t seed, size_t first, size_t count, float *dst);
