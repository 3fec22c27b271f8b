#include "core/arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

static size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

void arena_init_sizing(Arena *a, const char *name) {
    *a = (Arena){.name = name};
}

void arena_commit(Arena *a, const ArenaMemory *memory) {
    CHECK(a->base == NULL);
    a->size = align_up(a->peak.total);
    a->memory = memory;
    if (a->size > 0) {
        a->base = memory ? memory->alloc(a->size) : aligned_alloc(ARENA_ALIGN, a->size);
        if (!a->base)
            die_user("cannot allocate the %s arena (%zu bytes = %.2f GiB)%s", a->name, a->size,
                     a->size / (1024.0 * 1024 * 1024), memory ? " in device memory" : "");
        if (!memory) memset(a->base, 0, a->size);
    }
    arena_release(a, 0);
}

void arena_free(Arena *a) {
    if (a->memory)
        a->memory->free(a->base);
    else
        free(a->base);
    *a = (Arena){.name = a->name};
}

void *arena_tensor(Arena *a, size_t count, Dtype t) {
    CHECK(t < DTYPE_COUNT);
    size_t offset = a->used.total, bytes = align_up(count * dtype_size(t));
    a->used.total += bytes;
    a->used.by[t] += bytes;
    if (a->used.total > a->peak.total) a->peak = a->used;
    if (a->used.total > a->high.total) a->high = a->used;
    if (!a->base) return NULL;
    if (a->used.total > a->size)
        die_internal(__FILE__, __LINE__, "%s arena overflow: %zu of %zu bytes", a->name,
                     a->used.total, a->size);
    return a->base + offset;
}

float *arena_floats(Arena *a, size_t count) { return arena_tensor(a, count, DTYPE_FP32); }

void *arena_alloc(Arena *a, size_t bytes) { return arena_tensor(a, bytes, DTYPE_BYTES); }

void arena_reserve(Arena *a, ArenaBytes need) {
    if (need.total > a->peak.total) a->peak = need;
}

void arena_high_reset(Arena *a) { a->high = a->used; }

size_t arena_mark(Arena *a) {
    if (a->n_marks == ARENA_MARKS)
        die_internal(__FILE__, __LINE__, "%s arena: more than %d marks held", a->name,
                     ARENA_MARKS);
    a->marks[a->n_marks++] = a->used;
    a->again_ok = 0;
    return a->used.total;
}

// The innermost mark held (or the last released, while it may be released again) at offset
// `mark` becomes the top: what was carved above it is given back, split by dtype as it was.
void arena_release(Arena *a, size_t mark) {
    CHECK(mark <= a->used.total);
    if (mark == 0) {
        a->used = (ArenaBytes){0};
        a->n_marks = a->again_ok = 0;
        return;
    }
    int i = a->n_marks - !a->again_ok;
    while (i >= 0 && a->marks[i].total != mark) i--;
    if (i < 0)
        die_internal(__FILE__, __LINE__, "%s arena: released to %zu, where no mark is held",
                     a->name, mark);
    a->used = a->marks[i];
    a->n_marks = i;
    a->again_ok = 1;
}

void arena_bytes_format(ArenaBytes b, double unit, int decimals, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    for (int t = 0; t < DTYPE_COUNT; t++) {
        if (b.by[t] == 0 || n >= len) continue;
        n += (size_t)snprintf(out + n, len - n, "%s%s %.*f", n ? ", " : "", dtype_name(t),
                              decimals, b.by[t] / unit);
    }
}
