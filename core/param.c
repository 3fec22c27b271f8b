#include "core/param.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/rng.h"

void params_init(ParamTable *t, int capacity) {
    *t = (ParamTable){.items = xcalloc((size_t)capacity, sizeof(Param)), .capacity = capacity};
}

void params_free(ParamTable *t) {
    free(t->items);
    *t = (ParamTable){0};
}

int params_add(ParamTable *t, ParamInit init, double init_std, int ndim, const int64_t *shape,
               const char *fmt, ...) {
    CHECK(t->count < t->capacity && ndim >= 1 && ndim <= PARAM_MAX_DIMS);
    Param *p = &t->items[t->count];
    *p = (Param){.ndim = ndim, .tp = {TP_REPLICATE, 0, 1}, .numel = 1, .offset = t->numel,
                 .init = init, .init_std = init_std, .init_cutoff = 2.0};
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    CHECK(len > 0 && len < PARAM_NAME_MAX);
    for (int d = 0; d < ndim; d++) {
        p->global_shape[d] = p->shape[d] = shape[d];
        p->numel *= (size_t)shape[d];
    }
    t->numel += p->numel;
    return t->count++;
}

Param *params_find(ParamTable *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->items[i].name, name) == 0) return &t->items[i];
    return NULL;
}

void params_place_tp(ParamTable *t, Param *p, TpPlacement tp) {
    CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size && tp.dim < p->ndim);
    CHECK(tp.dim == TP_REPLICATE || p->global_shape[tp.dim] % tp.size == 0);
    p->tp = tp;
    p->numel = 1;
    for (int d = 0; d < p->ndim; d++) {
        p->shape[d] = p->global_shape[d] / (d == tp.dim ? tp.size : 1);
        p->numel *= (size_t)p->shape[d];
    }
    t->numel = 0;
    for (int i = 0; i < t->count; i++) {
        t->items[i].offset = t->numel;
        t->numel += t->items[i].numel;
    }
}

size_t param_global_numel(const Param *p) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->global_shape[d];
    return n;
}

// Shard(0) and Replicate shards are one contiguous run of the global tensor; a Shard(1)
// shard's local (row, col) is the global (row, col + rank * local columns).
size_t param_global_index(const Param *p, size_t i) {
    if (p->tp.dim != 1) return i + (p->tp.dim == 0 ? (size_t)p->tp.rank * p->numel : 0);
    size_t cols = (size_t)p->shape[1];
    return i / cols * (size_t)p->global_shape[1] + (size_t)p->tp.rank * cols + i % cols;
}

void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena) {
    t->data = arena_floats(data_arena, t->numel);
    t->grad = arena_floats(grad_arena, t->numel);
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->data = t->data ? t->data + p->offset : NULL;
        p->grad = t->grad ? t->grad + p->offset : NULL;
    }
}

void params_view(ParamTable *view, const ParamTable *t, float *data) {
    *view = *t;
    view->items = xmalloc((size_t)t->count * sizeof(Param));
    memcpy(view->items, t->items, (size_t)t->count * sizeof(Param));
    view->capacity = t->count;
    view->data = data;
    view->grad = NULL;
    for (int i = 0; i < t->count; i++) {
        view->items[i].data = data + view->items[i].offset;
        view->items[i].grad = NULL;
    }
}

void param_fill(const Param *p, uint64_t seed, size_t first, size_t count, float *dst) {
    CHECK(first + count <= param_global_numel(p));
    uint64_t key = rng_key(seed, p->name);
    switch (p->init) {
    case INIT_ONES:
        for (size_t j = 0; j < count; j++) dst[j] = 1.0f;
        break;
    case INIT_NORMAL:
        rng_fill_trunc_normal(dst, count, key, first, 0.0, p->init_std, -INFINITY, INFINITY);
        break;
    case INIT_TRUNC_NORMAL:
        rng_fill_trunc_normal(dst, count, key, first, 0.0, p->init_std, -p->init_cutoff,
                              p->init_cutoff);
        break;
    }
}

void param_fill_local(const Param *p, uint64_t seed, size_t first, size_t count, float *dst) {
    if (count == 0) return;  // an FSDP shard of padding only
    // Contiguous in both the shard and the global tensor: a local row when the columns are
    // split (Shard(1)), else the whole range.
    size_t run = p->tp.dim == 1 ? (size_t)p->shape[1] : count;
    CHECK(first + count <= p->numel);
    CHECK(p->tp.dim != 1 || (first % run == 0 && count % run == 0));
    for (size_t j = 0; j < count; j += run)
        param_fill(p, seed, param_global_index(p, first + j), run, dst + j);
}

void params_initialize(ParamTable *t, uint64_t seed) {
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        param_fill_local(p, seed, 0, p->numel, p->data);
    }
}
