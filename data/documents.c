#include "data/documents.h"

#include <stddef.h>

void document_ids(const int *tokens, const int *ends, int rows, int T, int eos, int *doc) {
    for (int r = 0; r < rows; r++) {
        size_t row = (size_t)r * T;
        int *ids = doc + row;
        int id = 0;
        for (int t = 0; t < T; t++) {
            ids[t] = id;
            if (ends ? ends[row + t] : tokens[row + t] == eos) id++;
        }
    }
}
