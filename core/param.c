#include "core/param.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/nf4.h"
#include "core/rng.h"

void params_init(ParamTable *t, int capacity) {
    *t = (ParamTable){.items = xcalloc((size_t)capacity, sizeof(Param)), .capacity = capacity};
}

void params_free(ParamTable *t) {
    free(t->items);
    *t = (ParamTable){0};
}

void params_layout_grads(ParamTable *t) {
    t->shard_grad_numel = 0;
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->shard_grad_offset = p->frozen ? SIZE_MAX : t->shard_grad_numel;
        if (!p->frozen) t->shard_grad_numel += p->shard_numel;
    }
}

size_t param_nf4_bytes(const Param *p) {
    return p->numel ? nf4_bytes(param_global_numel(p)) : 0;
}

bool param_nf4_writes(const Param *p) {
    for (int i = 0; i < p->n_placements; i++)
        if (p->placements[i].kind == PLACE_SHARD && p->placements[i].rank != 0) return false;
    return p->numel > 0 && param_is_primary_replica(p);
}

size_t param_nf4_held(const Param *p) {
    size_t first = (size_t)p->nf4_shard_rank * p->nf4_shard_bytes, all = param_nf4_bytes(p);
    size_t rest = all > first ? all - first : 0;
    return rest < p->nf4_shard_bytes ? rest : p->nf4_shard_bytes;
}

// Every parameter's offsets follow the ones before it, in table order, in every form; an NF4
// one's blob follows the ones before it in the NF4 buffer.
static void table_layout(ParamTable *t) {
    t->numel = t->shard_numel = t->nf4_bytes = 0;
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        if (p->nf4) {
            p->offset = p->shard_offset = SIZE_MAX;
            if (p->nf4_shards == 1) p->nf4_shard_bytes = param_nf4_bytes(p);
            p->nf4_offset = t->nf4_bytes;
            t->nf4_bytes += p->nf4_shard_bytes;
            continue;
        }
        p->offset = t->numel;
        p->shard_offset = t->shard_numel;
        t->numel += p->numel;
        t->shard_numel += p->shard_numel;
    }
    params_layout_grads(t);
}

void params_make_nf4(ParamTable *t, Param *p) {
    CHECK(p->frozen && !p->copy && !p->buffer && !p->expert && p->ndim == 2 && !t->data);
    p->nf4 = true;
    p->nf4_shards = 1;
    table_layout(t);
}

void params_shard_nf4(ParamTable *t, Param *p, int size, int rank) {
    CHECK(p->nf4 && p->nf4_shards == 1 && rank >= 0 && rank < size && !t->nf4);
    size_t words = param_nf4_bytes(p) / 4;
    p->nf4_shards = size, p->nf4_shard_rank = rank;
    p->nf4_shard_bytes = (words + (size_t)size - 1) / (size_t)size * 4;
    table_layout(t);
}

void params_point_nf4(ParamTable *t, uint8_t *nf4) {
    t->nf4 = nf4;
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        if (!p->nf4) continue;
        p->nf4_shard = nf4 ? nf4 + p->nf4_offset : NULL;
        if (p->nf4_shards == 1) p->nf4_data = p->nf4_shard;
    }
}

// p's shard of the whole blob `blob` (param_nf4_bytes) into p->nf4_shard, padding zero.
static void nf4_shard_from(const Param *p, const uint8_t *blob) {
    size_t held = param_nf4_held(p);
    memcpy(p->nf4_shard, blob + (size_t)p->nf4_shard_rank * p->nf4_shard_bytes, held);
    memset(p->nf4_shard + held, 0, p->nf4_shard_bytes - held);
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
    // Laid out after the others (table_layout's order), in constant time: a table is built
    // one parameter at a time.
    p->offset = t->numel, p->shard_offset = t->shard_numel;
    p->shard_grad_offset = t->shard_grad_numel;
    t->numel += p->numel, t->shard_numel += p->shard_numel;
    t->shard_grad_numel += p->shard_numel;
    return t->count++;
}

Param *params_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->items[i].name, name) == 0) return &t->items[i];
    return NULL;
}

int params_add_copy(ParamTable *t, int of) {
    const Param *o = &t->items[of];
    CHECK(of < t->count && !o->copy);
    int i = params_add(t, o->init, o->init_std, o->ndim, o->global_shape, "%s", o->name);
    t->items[i].init_cutoff = t->items[of].init_cutoff;
    t->items[i].copy = true;
    return i;
}

int64_t placement_slice(const Placement *pl, int64_t n, int rank, int64_t *start) {
    switch (pl->kind) {
    case PLACE_REPLICATE:
        *start = 0;
        return n;
    case PLACE_SHARD:
        CHECK(pl->n_blocks == 0);
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

// The local positions [first[j], first[j] + len[j]) of an extent n along pl's dim that pl's
// rank keeps, increasing (PARAM_MAX_BLOCKS at most); returns how many.
static int placement_cuts(const Placement *pl, int64_t n, int64_t *first, int64_t *len) {
    if (pl->kind != PLACE_SHARD || pl->n_blocks == 0) {
        len[0] = placement_slice(pl, n, pl->rank, &first[0]);
        return 1;
    }
    int64_t at = 0;
    for (int k = 0; k < pl->n_blocks; k++) {
        len[k] = pl->blocks[k] / pl->size;
        first[k] = at + pl->rank * len[k];
        at += pl->blocks[k];
    }
    return pl->n_blocks;
}

// r keeps only its local positions [first[j], first[j] + len[j]) (increasing), still one after
// another; returns the new extent.
static int64_t ranges_cut(ParamRanges *r, int n_cuts, const int64_t *first, const int64_t *len) {
    ParamRanges out = {0};
    int64_t extent = 0;
    for (int j = 0; j < n_cuts; j++) {
        int64_t at = 0;  // the local position of range k's first element
        for (int k = 0; k < r->n; at += r->count[k++]) {
            int64_t lo = first[j] > at ? first[j] : at;
            int64_t hi = first[j] + len[j] < at + r->count[k] ? first[j] + len[j]
                                                              : at + r->count[k];
            if (lo >= hi) continue;
            CHECK(out.n < PARAM_MAX_RANGES);
            out.start[out.n] = r->start[k] + (lo - at);
            out.count[out.n++] = hi - lo;
            extent += hi - lo;
        }
    }
    *r = out;
    return extent;
}

ParamBox param_box(const Param *p, bool shard) {
    ParamBox b = {.ndim = p->ndim};
    for (int d = 0; d < p->ndim; d++) {
        b.count[d] = p->global_shape[d];
        b.ranges[d] = (ParamRanges){.n = 1, .count = {p->global_shape[d]}};
    }
    for (int i = 0; i < p->n_placements; i++) {
        const Placement *pl = &p->placements[i];
        if (pl->kind == PLACE_REPLICATE || (!shard && pl->kind == PLACE_SHARD_PADDED)) continue;
        int64_t first[PARAM_MAX_BLOCKS], len[PARAM_MAX_BLOCKS];
        int n_cuts = placement_cuts(pl, b.count[pl->dim], first, len);
        b.count[pl->dim] = ranges_cut(&b.ranges[pl->dim], n_cuts, first, len);
    }
    return b;
}

size_t box_numel(const ParamBox *b) {
    size_t n = 1;
    for (int d = 0; d < b->ndim; d++) n *= (size_t)b->count[d];
    return n;
}

int64_t box_start(const ParamBox *b, int d) {
    CHECK(d >= 0 && d < b->ndim && b->ranges[d].n <= 1);
    return b->ranges[d].n ? b->ranges[d].start[0] : 0;
}

// The global index of local position at along one dim held as ranges r.
static int64_t ranges_global(const ParamRanges *r, int64_t at) {
    for (int k = 0; k < r->n; at -= r->count[k++])
        if (at < r->count[k]) return r->start[k] + at;
    CHECK(false);
    return 0;
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

// Whether Shard pl cuts an extent n into equal slices: n itself, or each of its blocks. An
// extent of 0 (another pipeline stage's parameter, emptied by PLACE_OWNED) stays empty.
static bool shard_divides(const Placement *pl, int64_t n) {
    if (pl->n_blocks == 0) return n % pl->size == 0;
    if (pl->n_blocks < 0 || pl->n_blocks > PARAM_MAX_BLOCKS) return false;
    int64_t sum = 0;
    for (int k = 0; k < pl->n_blocks; k++) {
        if (pl->blocks[k] < 1 || pl->blocks[k] % pl->size != 0) return false;
        sum += pl->blocks[k];
    }
    return sum == n || n == 0;
}

void params_place(ParamTable *t, Param *p, Placement pl) {
    CHECK(pl.size >= 1 && pl.rank >= 0 && pl.rank < pl.size);
    if (pl.size == 1) return;
    CHECK(p->n_placements < PARAM_MAX_PLACEMENTS && param_placement_on(p, pl.group) == NULL);
    if (pl.kind != PLACE_REPLICATE) CHECK(pl.dim >= 0 && pl.dim < p->ndim);
    if (pl.kind == PLACE_SHARD) CHECK(shard_divides(&pl, p->shape[pl.dim]));
    else CHECK(pl.n_blocks == 0);
    CHECK(!pl.grad_partial || pl.kind == PLACE_REPLICATE);
    if (pl.kind == PLACE_OWNED) CHECK(pl.dim == 0 && pl.owner >= 0 && pl.owner < pl.size);
    // a whole blob: a stage's, or every tensor-parallel rank's (each computing with its part)
    CHECK(!p->nf4 || pl.kind == PLACE_REPLICATE || pl.kind == PLACE_OWNED ||
          (pl.kind == PLACE_SHARD && pl.n_blocks == 0));
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

void params_unplace(Param *p, int group) {
    for (int i = 0; i < p->n_placements; i++) {
        if (p->placements[i].group != group) continue;
        CHECK(p->placements[i].kind == PLACE_REPLICATE);  // the box is the same without it
        memmove(&p->placements[i], &p->placements[i + 1],
                (size_t)(--p->n_placements - i) * sizeof p->placements[0]);
        return;
    }
}

const Placement *param_placement_on(const Param *p, int group) {
    for (int i = 0; i < p->n_placements; i++)
        if (p->placements[i].group == group) return &p->placements[i];
    return NULL;
}

bool param_is_primary_replica_within(const Param *p, int group) {
    if (p->copy) return false;
    for (int i = 0; i < p->n_placements; i++) {
        const Placement *pl = &p->placements[i];
        if (pl->kind == PLACE_REPLICATE && pl->group != group && pl->rank != 0) return false;
    }
    return true;
}

bool param_is_primary_replica(const Param *p) { return param_is_primary_replica_within(p, -1); }

size_t param_global_numel(const Param *p) {
    size_t n = 1;
    for (int d = 0; d < p->ndim; d++) n *= (size_t)p->global_shape[d];
    return n;
}

size_t param_global_index(const Param *p, const ParamBox *b, size_t i) {
    size_t global = 0, stride = 1;
    for (int d = p->ndim - 1; d >= 0; d--) {
        int64_t at = (int64_t)(i % (size_t)b->count[d]);
        i /= (size_t)b->count[d];
        global += (size_t)ranges_global(&b->ranges[d], at) * stride;
        stride *= (size_t)p->global_shape[d];
    }
    return global;
}

// The innermost dim the box does not hold whole (cut) splits it into runs: for each index of
// the dims before it, each of cut's ranges times everything after it is one contiguous run.
void param_box_runs(const Param *p, const ParamBox *b,
                    void (*fn)(size_t global_first, size_t local_first, size_t count, void *arg),
                    void *arg) {
    size_t n = box_numel(b);
    if (n == 0) return;
    int cut = -1;
    for (int d = 0; d < p->ndim; d++)
        if (b->count[d] != p->global_shape[d]) cut = d;
    if (cut < 0) {
        fn(0, 0, n, arg);
        return;
    }
    size_t stride[PARAM_MAX_DIMS];  // the global tensor's, per dim
    size_t inner = 1;               // floats per index of dim cut, in both tensors
    for (int d = p->ndim - 1; d >= 0; d--) {
        stride[d] = d == p->ndim - 1 ? 1 : stride[d + 1] * (size_t)p->global_shape[d + 1];
        if (d > cut) inner *= (size_t)b->count[d];
    }
    const ParamRanges *r = &b->ranges[cut];
    size_t local = 0;
    for (size_t outer = 0; local < n; outer++) {
        size_t global = 0, rest = outer;
        for (int d = cut - 1; d >= 0; d--) {
            global += (size_t)ranges_global(&b->ranges[d], (int64_t)(rest % (size_t)b->count[d])) *
                      stride[d];
            rest /= (size_t)b->count[d];
        }
        for (int k = 0; k < r->n; k++) {
            size_t count = (size_t)r->count[k] * inner;
            fn(global + (size_t)r->start[k] * stride[cut], local, count, arg);
            local += count;
        }
    }
}

void params_allocate(ParamTable *t, Arena *data_arena, Arena *grad_arena) {
    CHECK(t->shard_numel == t->numel);  // a padded placement's owner places the shards
    t->data = t->shard_data = arena_floats(data_arena, t->numel);
    params_point_nf4(t, t->nf4_bytes ? arena_alloc(data_arena, t->nf4_bytes) : NULL);
    t->grad = t->shard_grad = arena_floats(grad_arena, t->shard_grad_numel);
    for (int i = 0; i < t->count; i++) {
        Param *p = &t->items[i];
        p->data = t->data && !p->nf4 ? t->data + p->offset : NULL;
        p->grad = t->grad && !p->frozen ? t->grad + p->shard_grad_offset : NULL;
    }
}

void params_view(ParamTable *view, const ParamTable *t, float *shard_data, uint8_t *nf4) {
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
        p->data = whole && !p->nf4 ? shard_data + p->shard_offset : NULL;
        p->nf4_data = NULL;  // a gathered blob is the device's
        p->grad = NULL;
    }
    params_point_nf4(view, nf4);
}

void params_select(ParamTable *sub, const ParamTable *t, bool (*keep)(const Param *p)) {
    *sub = *t;
    sub->items = xcalloc((size_t)(t->count ? t->count : 1), sizeof(Param));
    sub->count = 0;
    sub->capacity = t->count;
    for (int i = 0; i < t->count; i++)
        if (keep(&t->items[i])) sub->items[sub->count++] = t->items[i];
}

void params_global_view(ParamTable *global, const ParamTable *t) {
    params_init(global, t->count);
    for (int i = 0; i < t->count; i++) {
        Param *p = &global->items[i];
        *p = t->items[i];
        p->n_placements = 0;
        p->nf4 = false;
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
        if (p->copy) {  // one tensor: whatever fills the original fills the copy
            const Param *o = params_find(global, p->name);
            p->offset = o->offset, p->shard_offset = o->shard_offset;
        }
        p->data = data + p->offset;
        p->nf4_data = p->nf4_shard = NULL;
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

void param_nf4_store(const Param *p, const float *x) {
    if (!p->numel) return;
    size_t n = param_global_numel(p);
    if (p->nf4_shards == 1) {
        nf4_quantize(p->nf4_shard, x, n);
        return;
    }
    uint8_t *blob = xmalloc(param_nf4_bytes(p));
    nf4_quantize(blob, x, n);
    nf4_shard_from(p, blob);
    free(blob);
}

void params_shards_from_global(ParamTable *t, const ParamTable *global) {
    CHECK(global->count == t->count);
    for (int i = 0; i < t->count; i++) {
        const Param *p = &t->items[i];
        if (p->nf4) {
            param_nf4_store(p, global->items[i].data);
            continue;
        }
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
    case INIT_XAVIER_UNIFORM:
    case INIT_KAIMING_UNIFORM: {
        CHECK(p->ndim == 2);
        double a = p->init == INIT_XAVIER_UNIFORM
                       ? sqrt(6.0 / (double)(p->global_shape[0] + p->global_shape[1]))
                       : 1 / sqrt((double)p->global_shape[1]);
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
        if (p->nf4) {  // one whole weight in fp32 at a time
            size_t n = p->numel ? param_global_numel(p) : 0;
            float *x = xmalloc((n ? n : 1) * sizeof(float));
            param_fill(p, seed, 0, n, x);
            param_nf4_store(p, x);
            free(x);
            continue;
        }
        ParamBox b = param_box(p, true);
        FillRun f = {p, seed, t->shard_data + p->shard_offset};
        size_t n = box_numel(&b);
        memset(f.dst + n, 0, (p->shard_numel - n) * sizeof(float));  // FSDP's padding
        param_box_runs(p, &b, fill_run, &f);
    }
}
