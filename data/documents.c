#include "data/documents.h"

#include <stddef.h>

void document_ids(const int *tokens, int rows, int T, int eos, int *doc) {
    for (int r = 0; r < rows; r++) {
        const int *row = tokens + (size_t)r * T;
        int *ids = doc + (size_t)r * T;
        int id = 0;
        for (int t = 0; t < T; t++) {
            ids[t] = id;
            if (row[t] == eos) id++;
        }
    }
}
