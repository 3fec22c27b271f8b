// A binary min-heap in an array, shared by the BPE trainer's pair counts (data/bpe_train.c)
// and the encoder's merge candidates (data/tokenizer_encode.c): HEAP_DEFINE(name, T, before)
// defines name_push(T *heap, size_t *n, T item) and name_pop(T *heap, size_t *n), the first
// by before(a, b) (a comes out before b) on top. A macro, so that the comparison inlines in
// the loops that push and pop once per merge. The caller keeps room for one more item.
#pragma once

#include <stddef.h>

#define HEAP_DEFINE(name, T, before)                                                           \
    static inline void name##_push(T *heap, size_t *n, T item) {                              \
        size_t i = (*n)++;                                                                     \
        for (; i > 0 && before(item, heap[(i - 1) / 2]); i = (i - 1) / 2)                      \
            heap[i] = heap[(i - 1) / 2];                                                       \
        heap[i] = item;                                                                        \
    }                                                                                          \
    static inline T name##_pop(T *heap, size_t *n) {                                           \
        T top = heap[0], last = heap[--*n];                                                    \
        size_t i = 0;                                                                          \
        for (size_t child; (child = 2 * i + 1) < *n; i = child) {                              \
            if (child + 1 < *n && before(heap[child + 1], heap[child])) child++;               \
            if (!before(heap[child], last)) break;                                             \
            heap[i] = heap[child];                                                             \
        }                                                                                      \
        heap[i] = last; /* when the heap is now empty, into the slot just taken */             \
        return top;                                                                            \
    }
