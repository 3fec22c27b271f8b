// Context parallel's sequence layout (docs/design.md "Parallelisms", torchtitan's head-tail load
// balancing): a sequence of T tokens is cut into 2 * cp chunks of T / (2 cp); cp rank r holds
// chunk r and its mirror 2cp - 1 - r, so under a causal mask every rank does the same work
// (an early chunk sees few keys, its mirror many). Pure host code.
#pragma once

#include <stdbool.h>
#include <stddef.h>

// Why T, the value of config key `key`, cannot be split over cp ranks (one line into err), or
// NULL when it can: 2 * cp must divide T.
const char *cp_layout_check(const char *key, int T, int cp, char *err, size_t n);
// pos (T / cp): the global sequence positions of rank `rank`'s tokens, in its local order
// (its head chunk, then its tail chunk).
void cp_positions(int T, int cp, int rank, int *pos);
// The global position of the first token of each of rank `rank`'s two chunks, and their length.
void cp_chunks(int T, int cp, int rank, int *head_start, int *tail_start, int *chunk_len);
// local (rows, T / cp) = the columns pos of full (rows, T): one rank's share of a batch.
void cp_select(const int *full, int rows, int T, const int *pos, int local_T, int *local);
