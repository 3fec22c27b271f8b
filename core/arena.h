// Arenas: every byte titan uses is carved from a few arenas sized before training starts.
//
// An arena is used in two passes by the same code. In the sizing pass (arena_init_sizing) it
// has no memory: arena_alloc returns NULL and only counts bytes, so a plan can be sized (and
// `titan --estimate` can print it) without allocating. arena_commit then allocates exactly the
// counted peak once, and the allocating pass runs the same code again. Inside the step loop an
// arena is used as a stack: arena_mark / arena_release give back what a phase pushed.
#pragma once

#include <stddef.h>

#define ARENA_ALIGN 64  // a cache line, and enough for AVX-512 loads and GPU vector loads

// Where a committed arena's bytes come from: a kernels backend's tensor memory (device memory
// on cuda; kernels.h's alloc and free), so the same sizing and carving code places tensors
// on any backend. NULL: host memory.
typedef struct {
    void *(*alloc)(size_t bytes);  // zeroed; NULL when there is no room
    void (*free)(void *p);
} ArenaMemory;

typedef struct {
    const char *name;
    const ArenaMemory *memory;  // set by arena_commit (NULL: host)
    char *base;   // NULL while sizing
    size_t size;  // committed capacity in bytes (0 while sizing)
    size_t used;  // bytes handed out so far
    size_t peak;  // high-water mark of used
} Arena;

void arena_init_sizing(Arena *a, const char *name);
// Allocates a->peak bytes (zeroed) from memory (NULL: host) and restarts at offset 0.
void arena_commit(Arena *a, const ArenaMemory *memory);
void arena_free(Arena *a);
void *arena_alloc(Arena *a, size_t bytes);  // ARENA_ALIGN-aligned; NULL while sizing
float *arena_floats(Arena *a, size_t count);
size_t arena_mark(const Arena *a);
void arena_release(Arena *a, size_t mark);
