#include "core/arena.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

static size_t align_up(size_t n) { return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

void arena_init_sizing(Arena *a, const char *name) {
    *a = (Arena){.name = name};
}

void arena_commit(Arena *a, const ArenaMemory *memory) {
    CHECK(a->base == NULL);
    a->size = align_up(a->peak);
    a->memory = memory;
    if (a->size > 0) {
        a->base = memory ? memory->alloc(a->size) : aligned_alloc(ARENA_ALIGN, a->size);
        if (!a->base)
            die_user("cannot allocate the %s arena (%zu bytes = %.2f GiB)%s", a->name, a->size,
                     a->size / (1024.0 * 1024 * 1024), memory ? " in device memory" : "");
        if (!memory) memset(a->base, 0, a->size);
    }
    a->used = 0;
}

void arena_free(Arena *a) {
    if (a->memory)
        a->memory->free(a->base);
    else
        free(a->base);
    *a = (Arena){.name = a->name};
}

void *arena_alloc(Arena *a, size_t bytes) {
    size_t offset = a->used;
    a->used += align_up(bytes);
    if (a->used > a->peak) a->peak = a->used;
    if (!a->base) return NULL;
    if (a->used > a->size)
        die_internal(__FILE__, __LINE__, "%s arena overflow: %zu of %zu bytes", a->name, a->used,
                     a->size);
    return a->base + offset;
}

float *arena_floats(Arena *a, size_t count) { return arena_alloc(a, count * sizeof(float)); }

size_t arena_mark(const Arena *a) { return a->used; }

void arena_release(Arena *a, size_t mark) {
    CHECK(mark <= a->used);
    a->used = mark;
}
