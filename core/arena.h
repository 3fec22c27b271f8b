// Arenas: every byte titan uses is carved from a few arenas sized before training starts.
//
// An arena is used in two passes by the same code. In the sizing pass (arena_init_sizing) it
// has no memory: a carve returns NULL and only counts bytes, so a plan can be sized (and
// `titan --estimate` can print it) without allocating. arena_commit then allocates exactly the
// counted peak once, and the allocating pass runs the same code again. Inside the step loop an
// arena is used as a stack: arena_mark / arena_release give back what a phase pushed.
//
// Every carve names the dtype of its elements (core/dtype.h), and the arena counts its bytes by
// dtype, so the peak it commits is also known split by dtype (what --estimate and the startup
// memory line print). A mark keeps that split for its release to restore, so marks nest: one
// is held until it is released (a mark released can be released again until the next mark is
// taken) or a release below it drops it, and at most ARENA_MARKS are held at once: a loop that
// keeps what it carves takes no mark.
#pragma once

#include <stddef.h>

#include "core/dtype.h"

#define ARENA_ALIGN 64  // a cache line, and enough for AVX-512 loads and GPU vector loads
#define ARENA_MARKS 16  // marks held at once (phases nest: model, block, linear, ...)

// Where a committed arena's bytes come from: a kernels backend's tensor memory (device memory
// on cuda; kernels.h's alloc and free), so the same sizing and carving code places tensors
// on any backend. NULL: host memory.
typedef struct {
    void *(*alloc)(size_t bytes);  // zeroed; NULL when there is no room
    void (*free)(void *p);
} ArenaMemory;

// Bytes split by the dtype carved, each carve rounded up to ARENA_ALIGN: total is the sum of
// the parts.
typedef struct {
    size_t total;
    size_t by[DTYPE_COUNT];
} ArenaBytes;

typedef struct {
    const char *name;
    const ArenaMemory *memory;  // set by arena_commit (NULL: host)
    char *base;       // NULL while sizing
    size_t size;      // committed capacity in bytes (0 while sizing)
    ArenaBytes used;  // handed out so far
    ArenaBytes peak;  // used when its total was highest: what arena_commit allocates
    ArenaBytes high;  // used when its total was highest since arena_high_reset: a step's peak
    // used at each mark held, outermost first (the mark is its total): marks[0 .. n_marks).
    // The last one released, marks[n_marks], can be released again while again_ok.
    ArenaBytes marks[ARENA_MARKS];
    int n_marks;
    int again_ok;
} Arena;

void arena_init_sizing(Arena *a, const char *name);
// Allocates a->peak.total bytes (zeroed) from memory (NULL: host) and restarts at offset 0.
void arena_commit(Arena *a, const ArenaMemory *memory);
void arena_free(Arena *a);
// count elements of dtype t, ARENA_ALIGN-aligned; NULL while sizing.
void *arena_tensor(Arena *a, size_t count, Dtype t);
float *arena_floats(Arena *a, size_t count);  // arena_tensor's fp32 form
void *arena_alloc(Arena *a, size_t bytes);    // raw bytes whose layout the caller defines
// The arena's peak becomes need when need is larger: a sizing pass run on another arena (the
// activations of the largest batch, or of a pipeline's regions) sizes this one.
void arena_reserve(Arena *a, ArenaBytes need);
// The offset carving has reached, to release back to; 0 is the empty arena's (releasing to 0
// needs no mark).
size_t arena_mark(Arena *a);
void arena_release(Arena *a, size_t mark);
// high becomes what is used now, so that it then tells the peak of what follows (a step's:
// the memory snapshot, core/profiler.h).
void arena_high_reset(Arena *a);
// "fp32 12.5, bf16 3.0": b's nonzero parts in bytes / unit with `decimals` digits, in dtype
// order ("" when b is empty).
void arena_bytes_format(ArenaBytes b, double unit, int decimals, char *out, size_t len);
