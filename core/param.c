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
    *p = (Param){.ndim = ndim, .numel = 1, .offset = t->numel, .init = init,
                 .init_std = init_std, .init_cutoff = 2.0};
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    CHECK(len > 0 && len < PARAM_NAME_MAX);
    for (int d = 0; d < ndim; d++) {
        p->shape[d] = shape[d];
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

void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena) {
    t->data = arena_floats(data_arena, t->numel);
    t->grad = arena_floats(grad_arena, t->numel);
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->data = t->data ? t->data + p->offset : NULL;
        p->grad = t->grad ? t->grad + p->offset : NULL;
    }
}

void params_initialize(ParamTable *t, uint64_t seed) {
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        uint64_t key = rng_key(seed, p->name);
        switch (p->init) {
        case INIT_ONES:
            for (size_t j = 0; j < p->numel; j++) p->data[j] = 1.0f;
            break;
        case INIT_NORMAL:
            rng_fill_trunc_normal(p->data, p->numel, key, 0, 0.0, p->init_std, -INFINITY,
                                  INFINITY);
            break;
        case INIT_TRUNC_NORMAL:
            rng_fill_trunc_normal(p->data, p->numel, key, 0, 0.0, p->init_std, -p->init_cutoff,
                                  p->init_cutoff);
            break;
        }
    }
}
