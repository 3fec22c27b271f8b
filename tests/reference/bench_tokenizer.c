// Encode throughput of a tokenizer on a text file, for scripts/bench_tokenize.sh:
//   bench_tokenizer TOKENIZER FILE THREADS CHUNKS
// The file is cut into CHUNKS pieces at line ends, encoded by THREADS OpenMP threads (best of
// three runs), and the ids are checked against a single-threaded encode of the same chunks.
// Prints one line: "titan MB/s: X (THREADS threads, N tokens, ids match)"; exit 1 on a mismatch.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "data/tokenizer.h"

#define RUNS 3

typedef struct {
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n, cap;
} Chunk;

static char *file_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) die_user("bench_tokenizer: cannot read %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    char *text = xmalloc(*len);
    CHECK(fread(text, 1, *len, f) == *len);
    fclose(f);
    return text;
}

// n chunks of about len / n bytes, each ending just after a newline (or at the end).
static Chunk *chunks_cut(const char *text, size_t len, int n) {
    Chunk *c = xcalloc((size_t)n, sizeof(Chunk));
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t end = len * (size_t)(i + 1) / (size_t)n;
        if (end < at) end = at;
        const char *nl = end < len ? memchr(text + end, '\n', len - end) : NULL;
        end = nl ? (size_t)(nl - text) + 1 : len;
        c[i] = (Chunk){.text = text + at, .len = end - at};
        at = end;
    }
    return c;
}

static double chunks_encode(const Tokenizer *t, Chunk *c, int n, int threads) {
    double start = omp_get_wtime();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int i = 0; i < n; i++)
        c[i].n = tokenizer_encode(t, c[i].text, c[i].len, &c[i].ids, &c[i].cap);
    return omp_get_wtime() - start;
}

int main(int argc, char **argv) {
    if (argc != 5) die_user("usage: bench_tokenizer TOKENIZER FILE THREADS CHUNKS");
    int threads = atoi(argv[3]), n = atoi(argv[4]);
    if (threads < 1 || n < 1) die_user("bench_tokenizer: THREADS and CHUNKS must be positive");
    Tokenizer *t = tokenizer_load(argv[1]);
    size_t len;
    char *text = file_read(argv[2], &len);
    Chunk *serial = chunks_cut(text, len, n), *parallel = chunks_cut(text, len, n);
    chunks_encode(t, serial, n, 1);
    double best = 1e30;
    for (int run = 0; run < RUNS; run++) {
        double s = chunks_encode(t, parallel, n, threads);
        if (s < best) best = s;
    }
    size_t tokens = 0;
    bool match = true;
    for (int i = 0; i < n; i++) {
        tokens += serial[i].n;
        match &= serial[i].n == parallel[i].n &&
                 memcmp(serial[i].ids, parallel[i].ids, serial[i].n * sizeof(int32_t)) == 0;
        free(serial[i].ids), free(parallel[i].ids);
    }
    printf("titan MB/s: %.2f (%d threads, %zu tokens, ids %s)\n", (double)len / best / 1e6,
           threads, tokens, match ? "match" : "DIFFER");
    free(serial), free(parallel), free(text);
    tokenizer_free(t);
    return match ? 0 : 1;
}
