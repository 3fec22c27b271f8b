#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"

void loader_open(DataLoader *l, const TokenStream *stream, int seq_len, int dp_rank, int dp_size,
                 int rows) {
    CHECK(seq_len > 0 && rows > 0 && dp_size > 0 && dp_rank >= 0 && dp_rank < dp_size);
    token_stream_num_windows(stream, seq_len);
    *l = (DataLoader){.stream = stream, .seq_len = seq_len, .dp_rank = dp_rank,
                      .dp_size = dp_size, .rows = rows,
                      .window = xmalloc(((size_t)seq_len + 1) * sizeof(int32_t))};
}

void loader_close(DataLoader *l) {
    free(l->window);
    *l = (DataLoader){0};
}

void loader_next(DataLoader *l, int32_t *inputs, int32_t *targets, int32_t *loss_mask,
                 int32_t *doc_ends) {
    size_t T = (size_t)l->seq_len;
    int64_t first = l->position + (int64_t)l->dp_rank * l->rows;
    for (int r = 0; r < l->rows; r++) {
        token_stream_window(l->stream, first + r, l->seq_len, l->window);
        memcpy(inputs + (size_t)r * T, l->window, T * sizeof(int32_t));
        memcpy(targets + (size_t)r * T, l->window + 1, T * sizeof(int32_t));
        if (loss_mask)
            token_stream_window_mask(l->stream, first + r, l->seq_len, loss_mask + r * T);
        if (doc_ends)
            token_stream_window_ends(l->stream, first + r, l->seq_len, doc_ends + r * T);
    }
    l->position += (int64_t)l->dp_size * l->rows;
}

int64_t loader_position(const DataLoader *l) { return l->position; }

void loader_set_position(DataLoader *l, int64_t position) {
    CHECK(position >= 0);
    l->position = position;
}
