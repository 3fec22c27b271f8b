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

// Every parameter's offsets follow the ones before it, in table order, in both forms.
static void table_layout(ParamTable *t) {
    t->numel = t->shard_numel = 0;
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->offset = t->numel;
        p->shard_offset = t->shard_numel;
        t->numel += p->numel;
        t->shard_numel += p->shard_numel;
    }
}

int params_add(ParamTable *t, ParamInit init, double init_std, int ndim, const int64_t *shape,
               const char *fmt, ...) {
    CHECK(t->count < t->capacity && ndim >= 1 && ndim <= PARAM_MAX_DIMS);
    Param *p = &t->items[t->count];
    *p = (Param){.ndim = ndim, .numel = 1, .init = init, .init_std = init_std,
                 .init_cutoff = 2.0};
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    CHECK(len > 0 && len < PARAM_NAME_MAX);
    for (int d = 0; d < ndim; d++) {
        CHECK(shape[d] >= 1);
        p->global_shape[d] = p->shape[d] = shape[d];
        p->numel *= (size_t)shape[d];
    }
    p->shard_numel = p->numel;
    t->count++;
    table_layout(t);
    return t->count - 1;
}

Param *params_find(ParamTable *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->items[i].name, name) == 0) return &t->items[i];
    return NULL;
}

int64_t placement_slice(const Placement *pl, int64_t n, int rank, int64_t *start) {
    switch (pl->kind) {
    case PLACE_REPLICATE:
        *start = 0;
        return n;
    case PLACE_SHARD:
        *start = rank * (n / pl->size);
        return n / pl->size;
    case PLACE_SHARD_PADDED: {
        int64_t per = (n + pl->size - 1) / pl->size;
        *start = rank * per < n ? rank * per : n;
        return (*start + per < n ? *start + per : n) - *start;
    }
    case PLACE_OWNED:
        *start = 0;
        return rank == pl->owner ? n : 0;
    }
    return 0;
}

ParamBox param_box(const Param *p, bool shard) {
    ParamBox b = {.ndim = p->ndim};
    for (int d = 0; d < p->ndim; d++) b.count[d] = p->global_shape[d];
    for (int i = 0; i < p->n_placements; i++) {
        const Placement *pl = &p->placements[i];
        if (pl->kind == PLACE_REPLICATE || (!shard && pl->kind == PLACE_SHARD_PADDED)) continue;
        int64_t start;
        b.count[pl->dim] = placement_slice(pl, b.count[pl->dim], pl->rank, &start);
        b.start[pl->dim] += start;
    }
    return b;
}

size_t box_numel(const ParamBox *b) {
    size_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= (size_t)b->count[d];
    return n;
}

// The shard's length in storage: the compute box with each padded dim rounded up to a
// multiple of its group (every rank stores the same number of floats).
static size_t shard_stored_numel(const Param *p) {
    int64_t len[PARAM_MAX_DIMS];
    for (int d = 0; d < p->ndim; d++) len[d] = p->shape[d];
    for (int i = 0; i < p->n_placements; i++) {
        const Placement *pl = &p->placements[i];
        if (pl->kind == PLACE_SHARD_PADDED) len[pl->dim] = (len[pl->dim] + pl->size - 1) / pl->size;
    }
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)len[d];
    return n;
}

void params_place(ParamTable *t, Param *p, Placement pl) {
    CHECK(pl.size >= 1 && pl.rank >= 0 && pl.rank < pl.size);
    if (pl.size == 1) return;
    CHECK(p->n_placements < PARAM_MAX_PLACEMENTS && param_placement_on(p, pl.group) == NULL);
    if (pl.kind != PLACE_REPLICATE) CHECK(pl.dim >= 0 && pl.dim < p->ndim);
    if (pl.kind == PLACE_SHARD) CHECK(p->shape[pl.dim] % pl.size == 0);
    if (pl.kind == PLACE_OWNED) CHECK(pl.dim == 0 && pl.owner >= 0 && pl.owner < pl.size);
    bool cuts_compute = pl.kind == PLACE_SHARD || pl.kind == PLACE_OWNED;
    for (int i = 0; i < p->n_placements && cuts_compute; i++)
        CHECK(p->placements[i].kind != PLACE_SHARD_PADDED);
    p->placements[p->n_placements++] = pl;
    ParamBox b = param_box(p, false);
    p->numel = box_numel(&b);
    for (int d = 0; d < p->ndim; d++) p->shape[d] = b.count[d];
    p->shard_numel = shard_stored_numel(p);
    table_layout(t);
}

const Placement *param_placement_on(const Param *p, int group) {
    for (int i = 0; i < p->n_placements; i++)
        if (p->placements[i].group == group) return &p->placements[i];
    return NULL;
}

bool param_is_primary_replica(const Param *p) {
    for (int i = 0; i < p->n_placements; i++)
        if (p->placements[i].kind == PLACE_REPLICATE && p->placements[i].rank != 0) return false;
    return true;
}

size_t param_global_numel(const Param *p) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->global_shape[d];
    return n;
}

size_t param_global_index(const Param *p, size_t i) {
    ParamBox b = param_box(p, false);
    size_t global = 0, stride = 1;
    for (int d = p->ndim - 1; d >= 0; d--) {
        size_t at = i % (size_t)b.count[d];
        i /= (size_t)b.count[d];
        global += ((size_t)b.start[d] + at) * stride;
        stride *= (size_t)p->global_shape[d];
    }
    return global;
}

// The innermost dim the box does not cover whole splits it into runs: for each index of the
// dims before it, that dim's range times everything after it is one contiguous run.
void param_box_runs(const Param *p, const ParamBox *b,
                    void (*fn)(size_t global_first, size_t local_first, size_t count, void *arg),
                    void *arg) {
    size_t n = box_numel(b);
    if (n == 0) return;
    int cut = -1;
    for (int d = 0; d < p->ndim; d++)
        if (b->count[d] != p->global_shape[d]) cut = d;
    size_t run = 1;
    for (int d = cut < 0 ? 0 : cut; d < p->ndim; d++) run *= (size_t)b->count[d];
    for (size_t local = 0; local < n; local += run) {
        size_t outer = local / run, global = 0, stride = 1;
        for (int d = p->ndim - 1; d >= 0; d--) {
            size_t at = 0;
            if (d < cut) {
                at = outer % (size_t)b->count[d];
                outer /= (size_t)b->count[d];
            }
            global += ((size_t)b->start[d] + at) * stride;
            stride *= (size_t)p->global_shape[d];
        }
        fn(global, local, run, arg);
    }
}

void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena) {
    CHECK(t->shard_numel == t->numel);  // a padded placement's owner places the shards
    t->data = t->shard_data = arena_floats(data_arena, t->numel);
    t->grad = t->shard_grad = arena_floats(grad_arena, t->numel);
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->data = t->data ? t->data + p->offset : NULL;
        p->grad = t->grad ? t->grad + p->offset : NULL;
    }
}

void params_view(ParamTable *view, const ParamTable *t, float *shard_data) {
    *view = *t;
    view->items = xmalloc((size_t)t->count * sizeof(Param));
    memcpy(view->items, t->items, (size_t)t->count * sizeof(Param));
    view->capacity = t->count;
    bool whole = t->shard_numel == t->numel;  // no padded placement: shards are the tensors
    view->shard_data = shard_data;
    view->data = whole ? shard_data : NULL;
    view->grad = view->shard_grad = NULL;
    for (int i = 0; i < t->count; i++) {
        Param *p = &view->items[i];
        p->data = whole ? shard_data + p->shard_offset : NULL;
        p->grad = NULL;
    }
}

void params_global_view(ParamTable *global, const ParamTable *t) {
    params_init(global, t->count);
    for (int i = 0; i < t->count; i++) {
        Param *p = &global->items[i];
        *p = t->items[i];
        p->n_placements = 0;
        p->numel = param_global_numel(p);
        p->shard_numel = p->numel;
        for (int d = 0; d < p->ndim; d++) p->shape[d] = p->global_shape[d];
    }
    global->count = t->count;
    table_layout(global);
    float *data = xcalloc(global->numel + 1, sizeof(float));  // + 1: never a zero-byte request
    global->data = global->shard_data = data;
    global->grad = global->shard_grad = NULL;
    for (int i = 0; i < t->count; i++) {
        Param *p = &global->items[i];
        p->data = data + p->offset;
        p->grad = NULL;
    }
}

typedef struct {
    const float *from;
    float *to;
} CopyRun;

static void copy_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    const CopyRun *c = arg;
    memcpy(c->to + local_first, c->from + global_first, count * sizeof(float));
}

void params_shards_from_global(ParamTable *t, const ParamTable *global) {
    CHECK(global->count == t->count);
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        ParamBox b = param_box(p, true);
        CopyRun c = {global->items[i].data, t->shard_data + p->shard_offset};
        size_t n = box_numel(&b);
        memset(c.to + n, 0, (p->shard_numel - n) * sizeof(float));
        param_box_runs(p, &b, copy_run, &c);
    }
}

void param_fill(const Param *p, uint64_t seed, size_t first, size_t count, float *dst) {
    CHECK(first + count <= param_global_numel(p));
    uint64_t key = rng_key(seed, p->name);
    switch (p->init) {
    case INIT_ONES:
        for (size_t j = 0; j < count; j++) dst[j] = 1.0f;
        break;
    case INIT_ZEROS:
        for (size_t j = 0; j < count; j++) dst[j] = 0.0f;
        break;
    case INIT_NORMAL:
        rng_fill_trunc_normal(dst, count, key, first, 0.0, p->init_std, -INFINITY, INFINITY);
        break;
    case INIT_TRUNC_NORMAL:
        rng_fill_trunc_normal(dst, count, key, first, 0.0, p->init_std, -p->init_cutoff,
                              p->init_cutoff);
        break;
    case INIT_XAVIER_UNIFORM: {
        CHECK(p->ndim == 2);
        double a = sqrt(6.0 / (double)(p->global_shape[0] + p->global_shape[1]));
#pragma omp parallel for schedule(static) if (count >= 65536)
        for (size_t j = 0; j < count; j++)
            dst[j] = (float)(a * (2 * rng_uniform(key, first + j) - 1));
        break;
    }
    }
}

typedef struct {
    const Param *p;
    uint64_t seed;
    float *dst;
} FillRun;

static void fill_run(size_t global_first, size_t local_first, size_t count, void *arg) {
    const FillRun *f = arg;
    param_fill(f->p, f->seed, global_first, count, f->dst + local_first);
}

void params_initialize(ParamTable *t, uint64_t seed) {
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        ParamBox b = param_box(p, true);
        FillRun f = {p, seed, t->shard_data + p->shard_offset};
        size_t n = box_numel(&b);
        memset(f.dst + n, 0, (p->shard_numel - n) * sizeof(float));  // FSDP's padding
        param_box_runs(p, &b, fill_run, &f);
    }
}
