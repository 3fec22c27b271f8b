#include "parallel/cp/layout.h"

#include "core/errors.h"

const char *cp_layout_check(const char *key, int T, int cp, char *err, size_t n) {
    if (T % (2 * cp) == 0) return NULL;
    error_set(err, n, "%s %d is not a multiple of 2 x parallelism.context_parallel_degree %d = "
              "%d: context parallel cuts each sequence into 2 x cp chunks", key, T, cp, 2 * cp);
    return err;
}

void cp_chunks(int T, int cp, int rank, int *head_start, int *tail_start, int *chunk_len) {
    CHECK(T % (2 * cp) == 0 && rank >= 0 && rank < cp);
    *chunk_len = T / (2 * cp);
    *head_start = rank * *chunk_len;
    *tail_start = (2 * cp - 1 - rank) * *chunk_len;
}

void cp_positions(int T, int cp, int rank, int *pos) {
    int head, tail, len;
    cp_chunks(T, cp, rank, &head, &tail, &len);
    for (int i = 0; i < len; i++) {
        pos[i] = head + i;
        pos[len + i] = tail + i;
    }
}

void cp_select(const int *full, int rows, int T, const int *pos, int local_T, int *local) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < local_T; i++)
            local[(size_t)r * local_T + i] = full[(size_t)r * T + pos[i]];
}
